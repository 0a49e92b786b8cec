"""auto's budget rule between its phases (issue 23): the refinement keeps
REFINE_SHARE of the evaluations whatever the portfolio and the planners
would spend, a planner gets what the members before it leave of the
portfolio's part, and the starts tied with the best are refined smallest
graph first.  Counted evaluations only, never the clock."""

from __future__ import annotations

import pytest

from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.io import load_cluster
from celeritas_cli.model.placement import Placement
from celeritas_cli.optimize.evaluator import Score
from celeritas_cli.optimize.planners import PLAN_SHARE, PLANNERS
from celeritas_cli.optimize.portfolio import ANCHORS, MEMBER_SHARE, REFINE_SHARE, Candidate, Spec, plan
from celeritas_cli.optimize.search import REFINE_TIE, Search

from .test_planners import tight


def portfolio_spent(graph, cluster, evaluations: int) -> tuple[float, Search]:
    """Evaluations auto's portfolio spent (all of its phases before the refinement), and the search."""
    s = Search(graph, cluster, evaluations=evaluations, time_limit=0.0)
    out = s.run()
    return s.budget.spent - out.refine_spent, s


@pytest.mark.parametrize("n,evaluations,cluster", [pytest.param(60, 300, "moirai-intra-server", marks=pytest.mark.slow),
                                                   (200, 400, "moirai-inter-server")])
def test_refinement_keeps_its_share_when_the_planners_join(n, evaluations, cluster):
    # layered graphs on moirai's servers: the data-parallel members, the pipeline planner and the placers
    # together were planned up to 0.9 of the budget (247.5 of 300 and 284.4 of 400 evaluations before this rule).
    # Since data parallelism's all-reduce is costed by the NCCL formula, on moirai-intra-server the pipeline
    # planner's model gives up beside it on 200 nodes (no plan within 5 %); on moirai-inter-server's slower
    # links the pipeline still runs, beside both data-parallel members
    g, c = layered(n, seed=1), load_cluster(cluster)
    spent, s = portfolio_spent(g, c, evaluations)
    ran = {x.spec.name for x in s.candidates}
    assert any(x.spec.algo in PLANNERS for x in s.candidates) or n == 60  # the pipeline still runs on 200 nodes
    assert n == 60 or {"data-parallel", "data-parallel(shares=proportional)"} <= ran
    # a member starts while one evaluation of the portfolio's part is left: it may overrun by its own estimate
    assert spent <= (1 - REFINE_SHARE) * evaluations + MEMBER_SHARE * evaluations
    assert s.budget.spent - spent > 0  # and the refinement ran on what is left


def test_the_planned_portfolio_stays_out_of_the_refinements_share():
    g, c = tight()
    for cluster in (c, uniform(2, memory=2**40), load_cluster("moirai-intra-server")):
        for budget in (150, 400, 1000, 4000):
            specs = plan(g if cluster is c else layered(200, seed=1), cluster, budget)
            planned = sum(charge + 1 for spec, charge in specs if spec.algo not in ANCHORS)
            assert planned <= (1 - REFINE_SHARE) * budget + 1e-9
            for spec, charge in specs:
                if spec.algo in PLANNERS:
                    assert charge <= PLAN_SHARE * budget - 1


def test_a_planner_gets_what_the_members_before_it_leave():
    # the data-parallel and fsdp members run before the pipeline on roomy devices: on some budgets the pipeline's
    # full share would reach into the refinement's, and it gets what is left of the part
    g, c = layered(200, seed=1), uniform(4)
    squeezed = 0
    for budget in range(50, 1000, 10):
        specs = plan(g, c, budget)
        names = [s.name for s, _ in specs]
        if "pipeline" not in names:  # a small budget: its share pays for no plan
            continue
        i = names.index("pipeline")
        room = (1 - REFINE_SHARE) * budget - sum(charge + 1 for _, charge in specs[:i])
        assert specs[i][1] == pytest.approx(min(PLAN_SHARE * budget, room) - 1)
        squeezed += room < PLAN_SHARE * budget
    assert squeezed > 0


def _candidate(name: str, graph, makespan: float, overflow: int = 0) -> Candidate:
    device = 1 if overflow else 0  # a distinct assignment (starts are distinct)
    return Candidate(Spec(name), Placement(graph.name, "c", name, {}), graph, [device] * graph.n, None,
                     score=Score(overflow, makespan))


def test_tied_starts_are_refined_smallest_graph_first():
    g = layered(60, seed=1)
    big, small = layered(240, seed=1), layered(120, seed=1)
    s = Search(g, uniform(2), evaluations=100, time_limit=0.0)
    best = 1.0
    s.candidates = [
        _candidate("big", big, best),  # the best start, on the largest graph
        _candidate("small", small, best * (1 + REFINE_TIE / 2)),  # tied: refined first
        _candidate("input", g, best * (1 + 2 * REFINE_TIE)),  # not tied, though the smallest
        _candidate("oom", g, 0.5, overflow=1),  # over memory: last, whatever its makespan
    ]
    assert [c.spec.name for c in s.starts()] == ["small", "big", "input", "oom"]


def test_a_planners_charge_is_settled_with_what_it_spent():
    g, c = tight()
    s = Search(g, c, evaluations=100, time_limit=0.0)
    spec = Spec("pipeline")
    s._charges = {spec: 30.0}
    s.budget.charge(30.0)
    s._refund(spec, 12.0)  # spent less: paid back
    assert s.budget.charged == pytest.approx(12.0)
    s._refund(spec, 20.0)  # its first plan cost more than it was charged: charged too
    assert s.budget.charged == pytest.approx(20.0)
