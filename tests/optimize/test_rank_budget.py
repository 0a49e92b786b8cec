"""auto ranks its whole-step members by a cheap estimate before spending
(issue 33.3): a member estimated near the best is judged at least once,
whatever its share of the counted budget.  On GPT 1.3B over 8xA100-nvswitch
the fixed order spent the data-parallel share on data-parallel and left
fsdp out "over its share of the budget", 10 % slower than fsdp alone.
Counted evaluations only, never the clock (``time_limit=0``)."""

from __future__ import annotations

import math

from celeritas_cli import registry
from celeritas_cli.algorithms.ranking import Ranking
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.optimize.portfolio import (
    DP_SHARE,
    OVER_BUDGET,
    OVER_SHARE,
    RANK_COST,
    RANK_MARGIN,
    Spec,
    contenders,
    plan,
)
from celeritas_cli.optimize.search import Search

FSDP, DP, PIPE = Spec("fsdp"), Spec("data-parallel"), Spec("pipeline")
#: the counted budget of the cases below (fsdp over its share of it, the whole of it paying for the contender)
BUDGET = 60


def problem():
    """60 layers over 8 roomy devices: fsdp's sharded replica (per-layer units) is about 1.7x data parallelism's,
    so fsdp costs about 20 evaluations against data-parallel's 12 (both judged one replica of each kind) -
    over DP_SHARE of a 60-evaluation budget once data-parallel ran."""
    return layered(60, seed=1), uniform(8, memory=2**40)


def fsdp_first(spec: Spec) -> float | None:
    """A stand-in ranking: fsdp estimated best, data-parallel and the pipeline far behind."""
    return {FSDP: 1.0, DP: 1.5, PIPE: 1.6}.get(spec)


def test_the_old_rule_leaves_the_member_out_over_its_share():
    g, c = problem()
    notes: list[tuple[str, str]] = []
    specs = plan(g, c, BUDGET, skipped=notes)
    assert FSDP not in [s for s, _ in specs]
    assert any(name == "fsdp" and why.startswith(OVER_SHARE) for name, why in notes)


def test_a_member_near_the_best_estimate_is_planned_first_whatever_its_share():
    g, c = problem()
    near: dict[Spec, float] = {}
    specs = plan(g, c, BUDGET, estimate=fsdp_first, near=near, spent_before=RANK_COST)
    assert near == {FSDP: 1.0}
    assert specs[0][0] == Spec("metis")  # a fraction of a simulation: an answer whatever the contender costs
    spec, charge = specs[1]
    assert spec == FSDP and charge + 1 > DP_SHARE * BUDGET  # over the share the old rule held it to
    # the members far from the best follow under the shares, within what the contender leaves of the part
    rest = sum(ch + 1 for s, ch in specs[:1] + specs[2:])
    assert RANK_COST + charge + 1 + rest <= BUDGET


def test_contenders_run_best_estimate_first_and_the_margin_decides():
    g, c = problem()
    inside = 1 + 0.9 * RANK_MARGIN
    est = {FSDP: 1.0, DP: inside, PIPE: 1 + 1.1 * RANK_MARGIN}.get
    offers = [[(s, 1.0)] for s in (Spec("metis"), DP, FSDP, PIPE)]
    assert contenders(offers, est) == {FSDP: 1.0, DP: inside}
    specs = plan(g, c, 4000, estimate=est)
    assert [s for s, _ in specs[:3]] == [Spec("metis"), FSDP, DP]  # metis, then the contenders
    # a member the model says cannot fit (inf) is never near; nothing known: the fixed order
    assert contenders(offers, {FSDP: math.inf, DP: 2.0}.get) == {DP: 2.0}
    assert contenders(offers, lambda s: None) == {}


def test_a_contender_the_whole_budget_cannot_pay_for_is_said():
    g, c = problem()
    notes: list[tuple[str, str]] = []
    specs = plan(g, c, 45, skipped=notes, estimate=fsdp_first, spent_before=RANK_COST)
    assert FSDP not in [s for s, _ in specs]
    assert any(name == "fsdp" and why.startswith(OVER_BUDGET) for name, why in notes)


def test_the_contender_is_judged_and_the_budget_holds():
    """End to end with a counted budget: the contender fsdp is judged (a candidate with a score) where
    the fixed order skipped it, and the search spends at most its budget."""
    g, c = problem()
    old = Search(g, c, evaluations=BUDGET, time_limit=0.0)
    old.run()
    assert "fsdp" not in [x.spec.name for x in old.candidates]
    s = Search(g, c, evaluations=BUDGET, time_limit=0.0, ranking=fsdp_first)
    out = s.run()
    judged = {x.spec.name: x.score for x in s.candidates}
    assert "fsdp" in judged and judged["fsdp"].makespan > 0
    assert s.budget.spent <= BUDGET + 1e-9 and not out.clock_cut
    # the contender is judged first; the refinement gets what the ranking and the members leave (their
    # charges are estimates: what a member did not spend is paid back)
    assert s.candidates[0].spec == FSDP
    assert out.refine_spent <= BUDGET - RANK_COST


def test_no_ranking_on_a_budget_too_small_to_pay_for_it():
    g, c = problem()
    s = Search(g, c, evaluations=int(RANK_COST), time_limit=0.0, ranking=fsdp_first)  # under the whole count
    s.run()
    assert s.near == {} and s.budget.spent <= RANK_COST + 1e-9


def test_on_a_count_under_a_members_share_the_contenders_run_outside_it():
    """RANK_COST is over a member's share of 150 (nmt on 8xA100-nvswitch: 89): the estimates and the
    contenders they name run outside the count, so fsdp is judged once, and nothing of the count is spent on
    it - the other members and the refinement keep what they had without the ranking."""
    g, c = problem()
    s = Search(g, c, evaluations=150, time_limit=0.0, ranking=fsdp_first)
    s.run()
    assert FSDP in s.near
    judged = {cand.spec for cand in s.candidates}
    assert FSDP in judged
    plain = Search(g, c, evaluations=150, time_limit=0.0)
    plain.run()
    assert s.budget.spent == plain.budget.spent  # the contender cost the count nothing
    assert FSDP not in {cand.spec for cand in plain.candidates}  # without the ranking fsdp is over its share


def test_the_estimates_are_near_the_simulated_steps():
    """The cheap models against the judge on a graph they were not tuned on: optimistic or close (they
    leave out contention), never far; both within the margin's reasoning (issue 33.3)."""
    g, c = layered(200, seed=3), uniform(4, memory=2**40)
    r = Ranking(g, c)
    for spec in (DP, FSDP):
        est = r(spec)
        sim = registry.place(g, c, spec.algo).estimate["makespan_s"]
        assert 0.7 * sim <= est <= 1.05 * sim, (spec.name, est, sim)
    assert r(Spec("metis")) is None and r(Spec("data-parallel", (("bucket_mb", 0.0),))) is None
    assert r(PIPE) > 0


def test_the_ranking_is_counted_and_repeatable():
    """The real estimates (no stand-in): charged RANK_COST, and two runs with the same budget and no wall
    clock rank, plan and answer the same (the clock only caps)."""
    g, c = layered(60, seed=1), uniform(4, memory=2**40)
    runs = []
    for _ in range(2):
        s = Search(g, c, evaluations=400, time_limit=0.0, ranking=Ranking(g, c))
        out = s.run()
        runs.append((dict(s.near), [x.spec.name for x in s.candidates], out.device_of, out.score))
        assert s.budget.spent <= 400 + 1e-9
    assert runs[0] == runs[1]
    near, names = runs[0][0], runs[0][1]
    assert names[0] == "metis"  # then every contender judged, best estimate first
    assert near and all(spec.name in names[1:1 + len(near)] for spec in near)
