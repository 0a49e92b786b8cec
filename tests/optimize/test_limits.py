"""``auto`` within its time limit and never OOM when something fits (issue
24, N16), and named members that do not run said so (N19): sizing members
before they start, the cheap feasible members first on huge graphs, data
parallelism left out when a replica cannot fit, one account of the budget
on stderr, and the deadline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.algorithms.auto import auto
from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import cost_model
from celeritas_cli.model.generate import layered, layered_doc
from celeritas_cli.model.graph import Graph
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.optimize.evaluator import Budget
from celeritas_cli.optimize.portfolio import (
    ANCHOR_SHARE,
    COST,
    OVER_SHARE,
    Spec,
    member_cost,
    plan,
    replica_memory,
)
from celeritas_cli.optimize.runner import Runner, run_portfolio
from celeritas_cli.optimize.search import Search
from celeritas_cli.sim import symmetric
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import derive

from ..conftest import SAMPLES

G60 = str(SAMPLES / "layered_60.json")
GiB = 2**30


# ------------------------------------------------------------- sizing (N16)
def test_a_tight_budget_runs_the_cheap_partitioners_first_and_within_it():
    # 20 evaluations (the floor, what a 36k-node graph gets at 5 s): METIS does not fit MEMBER_SHARE (2), so
    # the anchors run first, within ANCHOR_SHARE, and everything else is left out with its cost
    g = layered(400, seed=1)
    c = uniform(4, memory=g.total_memory() // 3)  # the model fits the cluster, not one device
    notes: list = []
    specs = plan(g, c, 20, skipped=notes)
    names = [s.name for s, _ in specs]
    assert names[:2] == ["metis", "metis(weights=memory)"] and "m-topo" in names
    assert sum(ch + 1 for _, ch in specs) <= ANCHOR_SHARE * 20
    assert {s.algo for s, _ in specs} <= {"metis", "m-topo"}
    why = dict(notes)
    assert why["heft"].startswith(OVER_SHARE) and "data-parallel" in why and "os-dpos" in why
    # every member is either planned or said
    assert {s.name for s, _ in specs} | set(why) >= {"heft", "dpos", "scotch", "metis", "m-topo"}


def static(n: int, seed: int):
    """A synthetic graph that declares no resident_bytes: judged by the static rule."""
    doc = layered_doc(n, seed)
    for nd in doc["nodes"]:
        nd.pop("resident_bytes", None)
    return Graph.from_dict(doc, doc["name"])


def test_data_parallel_is_left_out_when_a_replica_cannot_fit():
    # N16: the 36k graph's data-parallel member (92 GiB model, 32 GiB devices) took 7 s and came back OOM by
    # 100 GiB.  Under the static rule a replica's memory is known before building it: parameters and optimizer
    # state in full plus a quarter of the activations - cross-checked against the data-parallel graph itself
    g = static(300, seed=2)
    k = 4
    big = uniform(k, memory=2**42)
    dp = registry.place(g, big, "data-parallel")  # the symmetric form: expanded, its derived graph rebuilt
    full = symmetric.expand(g, big, dp)
    built = max(full.device_loads(derive(g, full.derivation, devices=k), big))
    assert replica_memory(g, k) == built
    judged = symmetric.judge(g, big, dp)  # and the one replica the symmetric judge builds holds the same
    assert max(judged.graph.memory_by(judged.device_of, k)) == built
    notes: list = []
    small = uniform(k, memory=replica_memory(g, k) - 1)
    assert not [s for s, _ in plan(g, small, 10**6, skipped=notes) if s.algo == "data-parallel"]
    assert "one replica needs" in dict(notes)["data-parallel"]
    fits = uniform(k, memory=replica_memory(g, k))
    assert [s for s, _ in plan(g, fits, 10**6) if s == Spec("data-parallel")]


def test_budget_sizes_work_by_the_measured_speed_of_simulations():
    b = Budget(100, time.perf_counter() + 10.0, sim_prior_s=0.5, reserve=2.0)
    assert b.sim_time() == 0.5  # the prior, before any simulation
    b.used, b.sim_seconds, b.sim_weight = 4, 2.0, 4.0  # measured: 0.5 s per simulation
    assert b.seconds_for(3) == pytest.approx(2.0)
    assert 8.0 < b.remaining_time() < 9.0  # 10 s less the reserve of two simulations
    assert b.affordable(10) and not b.affordable(20) and b.clock_cut
    past = Budget(100, time.perf_counter() - 1.0)
    assert past.affordable(5)  # nothing measured yet: the first piece of work always runs (an answer needs one)


def test_nothing_starts_past_the_deadline_and_the_answer_is_still_judged():
    # a deadline already past (loading took the whole limit): one member runs, is judged, no refinement
    g = layered(300, seed=3)
    c = uniform(4)
    s = Search(g, c, time_limit=10.0, deadline=time.perf_counter() - 1.0)
    out = s.run()
    assert len(s.candidates) == 1 and out.clock_cut
    assert simulate(g, c, _placement(out, g, c))["makespan_s"] == pytest.approx(out.score.makespan)
    assert any("deadline" in x["why"] for x in out.skipped)


def _placement(out, g, c):
    from celeritas_cli.model.placement import Placement

    return Placement.from_indices(out.graph, c, out.device_of, algorithm="auto", order=out.order)


def test_auto_on_5k_nodes_keeps_a_2_second_limit():
    # the scaled-down N16: a 5,000-node graph, a 2 s limit from the call's start (graph in memory); every
    # member and every refinement step is sized before it starts, so the call ends within the limit plus the
    # allowed 10 % + 1 s even on a loaded machine; the count is never exceeded and the answer is feasible
    # where METIS is
    g = layered(5000, seed=1)
    c = load_cluster("4xV100-pcie")
    t0 = time.perf_counter()
    p = auto(g, c, time_limit=2.0, quiet=True)
    took = time.perf_counter() - t0
    assert took <= 2.0 * 1.1 + 1.0, f"auto took {took:.2f} s for a 2 s limit (load {os.getloadavg()})"
    e = p.estimate
    assert e["evaluations_spent"] <= e["evaluation_budget"]
    metis = simulate(g, c, registry.place(g, c, "metis"))
    if metis["status"] == "OK":
        assert e["status"] == "FEASIBLE"
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(e["makespan_s"])


def test_data_parallel_under_the_time_rule_needs_the_resident_state_to_fit():
    # a graph that declares resident_bytes is judged by memory over time: a replica's peak is at least the
    # model's resident state (held for the whole step by every replica), whatever the batch split - the gate
    # leaves data parallelism out exactly below that, and the judge agrees it is OOM there
    from celeritas_cli.model.residency import resident_list
    from celeritas_cli.optimize.portfolio import dp_misfit

    g = layered(300, seed=2)
    held = sum(resident_list(g))
    below, above = uniform(4, memory=held - 1), uniform(4, memory=held)
    assert "resident state" in dp_misfit(g, below, Spec("data-parallel"))
    assert dp_misfit(g, below, Spec("data-parallel", (("shares", "proportional"),))) is not None
    assert dp_misfit(g, above, Spec("data-parallel")) is None
    assert simulate(g, below, registry.place(g, below, "data-parallel"))["status"] == "OOM"


def test_never_oom_when_a_member_fits():
    # data parallelism (named, so it runs although a replica cannot fit) comes back OOM; METIS fits: the
    # answer is METIS's, feasible
    g = static(300, seed=2)
    c = uniform(4, memory=int(replica_memory(g, 4) * 0.9))
    p = auto(g, c, algos="data-parallel,metis", evaluations=200, quiet=True)
    status = {x["name"]: x["status"] for x in p.estimate["candidates"]}
    assert status["data-parallel"] == "OOM" and status["metis"] == "FEASIBLE"
    assert p.estimate["status"] == "FEASIBLE" and simulate(g, c, p)["status"] == "OK"


def test_stderr_counts_agree():
    # "246 of 785 spent" then "43 evaluations" read as contradictory: both lines now give one account
    r = CliRunner().invoke(main, ["place", G60, "-p", "evaluations=60", "--time-limit", "0.001"],
                           catch_exceptions=False)
    assert r.exit_code == 0
    lines = [ln for ln in r.stderr.splitlines() if "evaluations spent" in ln]
    cut = [ln for ln in lines if "wall clock" in ln]
    final = [ln for ln in lines if "placement, simulated makespan" in ln]
    assert cut and final
    account = cut[0].split("cut the search (")[1].split("), so")[0]
    assert final[0].endswith(account)
    e = orjson.loads(r.stdout)["estimate"]
    assert account.startswith(f"{e['evaluations_spent']:.1f} of {e['evaluation_budget']:.0f} evaluations spent: "
                              f"{e['evaluations']} simulations")


def test_member_costs_are_charged_before_they_start():
    # data parallelism is judged one replica of each kind (sim/symmetric.py): a constant charge whatever k
    # (measured 4.4-11.3 simulations); a member never starts when its estimated time does not fit
    assert member_cost(Spec("data-parallel"), 4) == 12.0 == member_cost(Spec("data-parallel"), 1024)
    assert member_cost(Spec("metis"), 4) == COST["metis"]
    g = layered(200, seed=1)
    c = uniform(4)
    b = Budget(1000, time.perf_counter() + 0.5, sim_prior_s=0.0)
    b.used, b.sim_seconds, b.sim_weight = 1, 0.1, 1.0  # 0.1 s per simulation: 0.5 s pays for 4
    said: list = []
    ran = run_portfolio(Runner(g, c, cost_model(g, c)), [(Spec("heft"), 50.0), (Spec("m-topo"), 0.0)],
                        lambda cand: True, b,
                        on_skip=lambda s, why: said.append((s.name, why)))
    assert [x.spec.name for x in ran] == ["m-topo"]
    assert said and said[0][0] == "heft" and "needs about 5.1 s" in said[0][1]


# ------------------------------------------------------------- named members (N19)
def _place(*args):
    r = CliRunner().invoke(main, ["place", G60, "--no-timings", *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return orjson.loads(r.stdout), r.stderr


def test_algos_milp_runs_milp():
    # N19: -p algos=milp ran only m-topo (1 evaluation, 4x worse) without a word; now milp is the member
    doc, err = _place("-p", "algos=milp", "--time-limit", "4")
    e = doc["estimate"]
    assert [x["name"] for x in e["candidates"]] == ["milp"] and e["winner"] == "milp"
    assert "m-topo" not in err
    g, c = load_graph(G60), load_cluster("4xV100-pcie")
    heft = simulate(g, c, registry.place(g, c, "heft"))
    assert e["makespan_s"] <= heft["makespan_s"] * (1 + 1e-12)  # milp is never worse than its warm start


def test_algos_given_says_why_it_cannot_run():
    doc, err = _place("-p", "algos=given")
    assert "candidate given skipped" in err and "-p file=" in err
    assert "none of given gave a candidate; the answer is metis's" in err
    assert doc["estimate"]["skipped"][0]["name"] == "given"


def test_algos_hierarchical_without_torch_says_so(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    doc, err = _place("-p", "algos=hierarchical,metis", "-p", "evaluations=40")
    assert "candidate hierarchical skipped: needs the 'torch' extra" in err
    assert {x["name"].split("@")[0] for x in doc["estimate"]["candidates"]} == {"metis"}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_algos_hierarchical_runs_it_when_torch_is_there():
    doc, err = _place("-p", "algos=hierarchical", "--time-limit", "6")
    assert [x["name"] for x in doc["estimate"]["candidates"]] == ["hierarchical"]
    assert "skipped" not in err


# ------------------------------------------------------------- the real N16 case
@pytest.mark.slow
@pytest.mark.parametrize("nodes,limit", [(36000, 5.0), (200000, None)])
def test_n16_auto_on_large_synthetic_graphs(tmp_path, nodes, limit):
    """`placer profile --synthetic layered --nodes 36000 --seed 1` then `placer place g --time-limit 5`
    (and 200,000 nodes at the default 10 s): the whole command within S + 10 % + 1 s, feasible where METIS is.
    On 200,000 nodes loading, the cost model, METIS and one simulation take about 8 CPU-seconds that cannot
    be cut short, so that case needs most of a core: skipped when the load average exceeds the cores."""
    if nodes > 100_000 and os.getloadavg()[0] > (os.cpu_count() or 1):
        pytest.skip(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: 8 CPU-seconds of "
                    f"unavoidable work cannot fit a 12 s wall clock")
    g = tmp_path / "g.json"
    run = [sys.executable, "-m", "celeritas_cli"]
    subprocess.run([*run, "profile", "--synthetic", "layered", "--nodes", str(nodes), "--seed", "1", "-o", str(g)],
                   check=True, capture_output=True)
    p = tmp_path / "p.json"
    t0 = time.perf_counter()
    proc = subprocess.run([*run, "place", str(g), *(["--time-limit", str(limit)] if limit else []), "-o", str(p)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    allowed = (limit or 10.0) * 1.1 + 1.0
    assert wall <= allowed, f"{wall:.1f} s > {allowed:.1f} s (load {os.getloadavg()}):\n{proc.stderr}"
    est = orjson.loads(p.read_bytes())["estimate"]
    m = subprocess.run([*run, "place", str(g), "--algo", "metis", "--simulate", "-o", str(tmp_path / "m.json")],
                       capture_output=True, text=True)
    if "(OK)" in m.stderr:
        assert est["status"] == "FEASIBLE"


def test_uneven_shares_are_kept_when_they_can_fit():
    # nmt on moirai-intra-server: equal shares overflow the small device, shares by speed fit; the gate for
    # uneven shares is sound (any split of the batch that fits), so that member stays - and does fit
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.optimize.portfolio import dp_misfit
    from celeritas_cli.transform.split_cost import batch_profile

    g = static(200, seed=3)
    prof = batch_profile(g)
    fixed = sum(g.memory[v] if prof.fixed_node[v] else prof.fixed_memory[v] for v in range(g.n))
    act = g.total_memory() - fixed
    doc = {"schema": "placer.cluster/v1", "name": "uneven",
           "devices": [{"id": "slow", "type": "V100", "memory_bytes": fixed + int(0.3 * act), "speed": 1.0},
                       {"id": "fast", "type": "V100", "memory_bytes": fixed + int(0.8 * act), "speed": 3.0}],
           "links": {"default": {"bandwidth_Bps": 1e10, "latency_s": 1e-5}}}
    c = Cluster.from_dict(doc, "uneven")
    equal, uneven = Spec("data-parallel"), Spec("data-parallel", (("shares", "proportional"),))
    assert dp_misfit(g, c, equal) and dp_misfit(g, c, uneven) is None
    specs = [s for s, _ in plan(g, c, 10**5)]
    assert uneven in specs and equal not in specs
    p = registry.place(g, c, "data-parallel", params={"shares": "proportional"})
    assert p.estimate["status"] == "FEASIBLE"
    assert registry.place(g, c, "data-parallel").estimate["status"] == "OOM"
