"""Tests of the CP-SAT placement (Moirai III-D): the solver's proven optimum
against brute force through the simulator, heterogeneity, memory,
congestion, replay of the solver's schedule, and the never-worse-than-hint
guarantee."""

from __future__ import annotations

import itertools
import random

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.placers.milp import (
    auto_resolution,
    build_model,
    identical_classes,
    solve,
)
from celeritas_cli.errors import Infeasible, InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.sim.simulator import run_schedule, simulate

pytest.importorskip("ortools")

EPS = 1e-9


def run(g, c, **kw):
    kw.setdefault("time_limit", 20)
    kw.setdefault("workers", 1)
    kw.setdefault("seed", 0)
    kw.setdefault("hint", "none")
    kw.setdefault("quiet", True)
    return solve(g, c, **kw)


def brute(g, c, congestion="channel"):
    """Best simulated makespan over every assignment (colocation and memory
    respected) and every strict order per device."""
    best = float("inf")
    groups = list(g.colocation_groups().values())
    for dev in itertools.product(range(c.k), repeat=g.n):
        if any(len({dev[v] for v in mem}) > 1 for mem in groups):
            continue
        loads = [0] * c.k
        for v, d in enumerate(dev):
            loads[d] += g.memory[v]
        if any(loads[d] > c.devices[d].memory for d in range(c.k)):
            continue
        per = [[v for v in range(g.n) if dev[v] == d] for d in range(c.k)]
        for order in itertools.product(*[itertools.permutations(p) for p in per]):
            try:
                ms = run_schedule(g, c, dev, [list(o) for o in order], congestion=congestion).makespan
            except InvalidInput:  # the order contradicts the dependencies
                continue
            best = min(best, ms)
    return best


def rand_graph(seed, n, p=0.4):
    rng = random.Random(seed)
    nodes = [{"id": f"n{i}", "compute_s": rng.choice([0.5, 1, 1.5, 2, 3]), "memory_bytes": 0} for i in range(n)]
    edges = [{"src": f"n{i}", "dst": f"n{j}", "bytes": rng.choice([50, 100, 150, 200])}
             for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    return build(f"r{seed}", nodes, edges)


def node(i, c, mem=0, **kw):
    return {"id": i, "compute_s": c, "memory_bytes": mem, **kw}


def diamond():
    # a -> b, a -> c, b -> d, c -> d; 1 s transfers on a 100 B/s link
    return build("diamond", [node("a", 1), node("b", 3), node("c", 3), node("d", 1)],
                 [{"src": s, "dst": d, "bytes": 100} for s, d in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))])


# ------------------------------------------------------------------ optimum
def test_registered():
    e = registry.get("milp")
    assert e.paper == "Moirai" and "Eq. 4-8" in e.section
    assert e.quick_params == {"time_limit": 5}
    assert e.params["congestion"].choices == ("channel", "port", "none")


def test_diamond_hand_computed_optimum():
    # one device: 1+3+3+1 = 8; split: a, b on gpu0 (b 1..4), c on gpu1 (input at 2, runs 2..5),
    # b's output reaches gpu1 at 5, d runs there 5..6
    g, c = diamond(), uniform(2, bandwidth=100.0, latency=0.0)
    p = run(g, c)
    assert p.estimate["status"] == "OPTIMAL"
    assert p.estimate["objective_s"] == pytest.approx(6.0, abs=EPS) == brute(g, c)
    assert p.estimate["gap"] == pytest.approx(0.0, abs=EPS)
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(6.0, abs=EPS)
    assert p.assignment["b"] != p.assignment["c"]
    assert p.order is not None and sum(len(s) for s in p.order.values()) == 4


@pytest.mark.parametrize("seed", [0, 3, 7, 11])
@pytest.mark.parametrize("congestion", ["channel", "none", "port"])
def test_matches_brute_force(seed, congestion):
    c = uniform(2, bandwidth=100.0, latency=0.0)
    g = rand_graph(seed, 5)
    best = brute(g, c, congestion)
    p = run(g, c, congestion=congestion)
    assert p.estimate["status"] == "OPTIMAL"
    assert p.estimate["objective_s"] == pytest.approx(best, abs=EPS)
    assert p.estimate["best_bound_s"] == pytest.approx(best, abs=EPS)
    assert simulate(g, c, p, congestion=congestion)["makespan_s"] == pytest.approx(best, abs=EPS)


@pytest.mark.parametrize("seed", [1, 5])
def test_matches_brute_force_heterogeneous_three_devices(seed):
    c = uniform(3, bandwidth=100.0, latency=0.0, speeds=[1.0, 1.0, 2.0])
    g = rand_graph(seed, 4, p=0.5)
    best = brute(g, c)
    p = run(g, c, hint="auto")
    assert p.estimate["status"] == "OPTIMAL"
    assert p.estimate["objective_s"] == pytest.approx(best, abs=EPS)
    assert p.estimate["makespan_s"] == pytest.approx(best, abs=EPS)


def test_heterogeneity_fast_device():
    g = build("one", [node("a", 4.0)], [])
    c = uniform(3, speeds=[1.0, 4.0, 2.0])
    p = run(g, c)
    assert p.assignment == {"a": "gpu1"}
    assert p.estimate["objective_s"] == pytest.approx(1.0, abs=1e-6)


def test_memory_forces_split():
    # a -> b with a 5 s transfer: together is best (3 s) but they do not fit together
    g = build("ab", [node("a", 1, mem=60), node("b", 2, mem=60)], [{"src": "a", "dst": "b", "bytes": 500}])
    c = uniform(2, memory=100, bandwidth=100.0, latency=0.0)
    p = run(g, c)
    assert p.estimate["status"] == "OPTIMAL"
    assert p.assignment["a"] != p.assignment["b"]
    assert p.estimate["objective_s"] == pytest.approx(8.0, abs=EPS) == brute(g, c)
    big = uniform(2, memory=200, bandwidth=100.0, latency=0.0)
    assert run(g, big).estimate["objective_s"] == pytest.approx(3.0, abs=EPS)


def test_colocation_kept():
    # the group ties a and c: the diamond's optimum (6) splits them
    g = build("diamond", [node("a", 1, colocation="w"), node("b", 3), node("c", 3, colocation="w"), node("d", 1)],
              [{"src": s, "dst": d, "bytes": 100} for s, d in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    p = run(g, c)
    assert p.assignment["a"] == p.assignment["c"]
    assert p.estimate["objective_s"] == pytest.approx(brute(g, c), abs=EPS)


def test_infeasible_memory_raises():
    g = build("three", [node("a", 1, mem=60), node("b", 1, mem=60), node("c", 1, mem=60)], [])
    c = uniform(2, memory=100)  # 180 <= 200 bytes in all, but no packing fits
    with pytest.raises(Infeasible, match="memory"):
        run(g, c)
    with pytest.raises(Infeasible, match="node 'x'"):
        run(build("x", [node("x", 1, mem=150)], []), c)  # 150 <= 200 in all, > 100 per device


def test_congestion_changes_optimum():
    # found by brute force: two tensors must cross gpu0 -> gpu1 at once
    g = build("cong", [node("n0", 2.0), node("n1", 2.0), node("n2", 0.5), node("n3", 0.5), node("n4", 1.5)],
              [{"src": s, "dst": d, "bytes": b} for s, d, b in
               (("n0", "n2", 100), ("n0", "n4", 150), ("n1", "n3", 200), ("n1", "n4", 50),
                ("n2", "n4", 100), ("n3", "n4", 150))])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    ch, free = run(g, c, congestion="channel"), run(g, c, congestion="none")
    assert ch.estimate["objective_s"] == pytest.approx(5.5, abs=EPS) == brute(g, c, "channel")
    assert free.estimate["objective_s"] == pytest.approx(5.0, abs=EPS) == brute(g, c, "none")
    assert simulate(g, c, ch, congestion="channel")["makespan_s"] == pytest.approx(5.5, abs=EPS)


def test_replay_equals_objective_within_resolution():
    g = layered(14, seed=2)
    c = uniform(2, bandwidth=2.0e9, latency=1e-5)
    p = run(g, c, hint="auto")
    e = p.estimate
    assert e["status"] == "OPTIMAL"
    sim = simulate(g, c, p)["makespan_s"]
    assert e["makespan_s"] == pytest.approx(sim, abs=EPS)
    # every duration is rounded by at most half a unit; allow one unit per task of the graph
    assert abs(sim - e["objective_s"]) <= e["resolution_s"] * (g.n + len(g.tensor_src))
    assert e["best_bound_s"] <= sim + e["resolution_s"] * g.n


# --------------------------------------------------------- structure / model
def test_identical_classes_and_symmetry_keep_optimum():
    c = uniform(4, bandwidth=100.0, latency=0.0)
    assert identical_classes(diamond(), c) == [[0, 1, 2, 3]]
    assert identical_classes(diamond(), uniform(3, speeds=[1.0, 2.0, 1.0])) == [[0, 2]]
    from ortools.sat.python import cp_model

    g = rand_graph(4, 6)
    vals = []
    for sym in (True, False):
        model, mv = build_model(g, c, resolution=1e-3, symmetry=sym)
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.random_seed = 0
        assert s.solve(model) == cp_model.OPTIMAL
        vals.append(s.objective_value)
    assert vals[0] == vals[1]


def test_auto_resolution_is_power_of_ten():
    assert auto_resolution(10.0) == pytest.approx(1e-4)
    assert auto_resolution(0.0123) == pytest.approx(1e-7)


def test_memory_constraint_alone_rejects_an_over_full_device():
    # Eq. 4c + Eq. 5 only: three 40-byte nodes on two 100-byte devices.  Of the
    # 2^3 = 8 assignments, the 2 that put all three (120 bytes) on one device
    # are over full: exactly 6 solutions remain, none with three on a device.
    from ortools.sat.python import cp_model

    from celeritas_cli.algorithms.placers.milp.data import problem_data
    from celeritas_cli.algorithms.placers.milp.model import assignment, memory_constraints
    from celeritas_cli.model.costs import cost_model

    g = build("three", [node(i, 1, mem=40) for i in "abc"], [{"src": "a", "dst": "b", "bytes": 1}])
    c = uniform(2, memory=100, bandwidth=100.0, latency=0.0)
    pb = problem_data(g, c, 1.0, None, cost_model(g, c))
    assert pb.unit_mem == [40, 40, 40] and pb.allowed == [[True, True]] * 3

    def solutions(with_memory):
        model = cp_model.CpModel()
        x = assignment(model, pb)
        if with_memory:
            memory_constraints(model, pb, x)
        found = []

        class Collect(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self):
                found.append(tuple(next(d for d in range(2) if self.boolean_value(x[u][d])) for u in range(3)))

        s = cp_model.CpSolver()
        s.parameters.enumerate_all_solutions = True
        s.parameters.num_workers = 1
        s.solve(model, Collect())
        return sorted(found)

    assert len(solutions(False)) == 8
    fitting = solutions(True)
    assert len(fitting) == 6 and (0, 0, 0) not in fitting and (1, 1, 1) not in fitting


@pytest.mark.parametrize("congestion, expected", [("channel", 3), ("port", 4), ("none", 3)])
def test_congestion_control_alone_on_a_pinned_fork(congestion, expected):
    # a(1 s) sends two tensors, to b (1 s) and c (1 s), 1 s each (100 B at 100 B/s),
    # a pinned on gpu0, b on gpu1, c on gpu2.  channel (Eq. 8): the transfers use
    # channels 0->1 and 0->2, in parallel: 1 + 1 + 1 = 3 s.  port: both leave by
    # gpu0's uplink, one after the other: c starts at 3, ends at 4.  none: 3 s.
    from ortools.sat.python import cp_model

    g = build("fork", [node("a", 1), node("b", 1), node("c", 1)],
              [{"src": "a", "dst": "b", "bytes": 100, "tensor": "t1"},
               {"src": "a", "dst": "c", "bytes": 100, "tensor": "t2"}])
    c = uniform(3, bandwidth=100.0, latency=0.0)
    model, mv = build_model(g, c, resolution=1.0, congestion=congestion, symmetry=False)
    for v, d in enumerate((0, 1, 2)):
        model.add(mv.x[mv.unit_of[v]][d] == 1)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.solve(model) == cp_model.OPTIMAL
    assert s.objective_value == expected
    # one transfer per (tensor, destination) that may be needed; exactly t1 -> gpu1 and t2 -> gpu2 are
    needed = sorted(key for key, (_, y, _) in mv.transfers.items() if s.boolean_value(y))
    assert len(mv.transfers) == 6 and needed == [(0, 1), (1, 2)]


def test_never_worse_than_hint_and_honest_status():
    # 40 nodes, 4 devices, 2 s: CP-SAT improves on the hint but proves nothing
    g = layered(40, seed=4, bytes_scale=0.05)
    c = uniform(4, bandwidth=1.0e10, latency=1e-5)
    p = run(g, c, hint="auto", time_limit=2)
    e = p.estimate
    assert e["status"] in ("OPTIMAL", "FEASIBLE")
    assert e["makespan_s"] <= e["hint_makespan_s"] + EPS
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(e["makespan_s"], rel=1e-9)
    assert e["best_bound_s"] <= e["objective_s"] + EPS
    assert e["status"] in ("OPTIMAL", "FEASIBLE") and e["solver_status"] in ("OPTIMAL", "FEASIBLE")
    if e["solver_status"] == "FEASIBLE":
        assert e["gap"] > 0 and e["status"] == "FEASIBLE"  # never FEASIBLE called optimal
    else:
        assert e["gap"] == pytest.approx(0.0, abs=1e-9)
    if e["status"] == "OPTIMAL":
        assert e["makespan_s"] <= e["best_bound_s"] + e["resolution_s"] * (g.n + len(g.tensor_src))
    loads = p.device_loads(g, c)
    assert all(ld <= d.memory for ld, d in zip(loads, c.devices))


def test_deterministic_objective():
    g, c = rand_graph(9, 6), uniform(2, bandwidth=100.0, latency=0.0)
    a, b = run(g, c, seed=3), run(g, c, seed=3)
    assert a.estimate["objective_s"] == b.estimate["objective_s"]
    assert a.assignment == b.assignment and a.order == b.order


def test_bad_params():
    g, c = diamond(), uniform(2)
    with pytest.raises(InvalidInput, match="congestion"):
        run(g, c, congestion="bus")
    with pytest.raises(InvalidInput, match="milp"):
        run(g, c, hint="milp")
    with pytest.raises(InvalidInput, match="unknown algorithm"):
        run(g, c, hint="nope")


def test_empty_graph():
    g = build("empty", [], [])
    p = run(g, uniform(2))
    assert p.assignment == {} and p.estimate["status"] == "OPTIMAL"


@pytest.mark.parametrize("congestion", ["channel", "port", "none"])
def test_hint_is_complete_and_feasible(congestion):
    # a heuristic-looking placement on the *last* identical devices: the hint
    # must be permuted into the symmetry-broken form and satisfy every constraint
    from ortools.sat.python import cp_model

    from celeritas_cli.algorithms.placers import milp as M
    from celeritas_cli.model.costs import CostModel

    g, c = layered(40, seed=5), uniform(3, bandwidth=1.0e9, latency=1e-5)
    groups = {}
    device_of = []
    for v in range(g.n):
        key = g.colocation[v] or v
        groups.setdefault(key, 2 - (len(groups) % 2))  # gpu2 / gpu1 alternately
        device_of.append(groups[key])
    costs = CostModel(g, c)
    sched = run_schedule(g, c, device_of, congestion=congestion, costs=costs)
    hint = M.Hint("test", device_of, None, sched.makespan, True, sched)
    res = M.auto_resolution(sched.makespan)
    dur, comm = M.integer_durations(g, c, res, costs)
    replay = M.integer_schedule(g, hint, dur, comm, congestion, c.k)
    model, mv = build_model(g, c, resolution=res, congestion=congestion, horizon=replay[2], costs=costs)
    assert mv.classes == [[0, 1, 2]]
    M.add_hint(model, g, mv, hint, replay, c.k)
    h = model.proto.solution_hint
    assert len(h.vars) == len(model.proto.variables)  # complete
    for var, val in zip(list(h.vars), list(h.values)):
        model.add(model.get_int_var_from_proto_index(var) == val)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.solve(model) == cp_model.OPTIMAL
    assert s.objective_value == replay[2]
    assert abs(replay[2] * res - sched.makespan) <= res * (g.n + len(sched.transfers))


def test_too_large_returns_hint_and_says_coarsen(monkeypatch, capsys):
    from celeritas_cli.algorithms.placers.milp import solver

    monkeypatch.setattr(solver, "TOO_LARGE", 3)
    g, c = diamond(), uniform(2, bandwidth=100.0, latency=0.0)
    p = solve(g, c, time_limit=5, workers=1, hint="auto")
    assert p.estimate["status"] == "UNKNOWN" and p.estimate["source"] == "hint"
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    assert "placer coarsen" in capsys.readouterr().err
    with pytest.raises(Exception, match="coarsen"):
        solve(g, c, time_limit=5, workers=1, hint="none")


# ------------------------------------------------------------------ issue 18: honest status, time, determinism
def coarse_pq():
    """Original: p1(1) -> p2(1), p1 -> q(2), 100-byte tensors (0.5 s at
    200 B/s).  Coarse: P = {p1, p2}, Q = {q}.  On the coarse graph P's
    output leaves after 2 s, so splitting costs 2 + 0.5 + 2 = 4.5 > 4 (one
    device, the coarse optimum); on the original p1's output leaves after
    1 s and the split takes max(2, 1 + 0.5 + 2) = 3.5 < 4."""
    from celeritas_cli.transform.contract import contract

    g = build("pq", [node("p1", 1), node("p2", 1), node("q", 2)],
              [{"src": "p1", "dst": "p2", "bytes": 100, "tensor": "o"},
               {"src": "p1", "dst": "q", "bytes": 100, "tensor": "o"}])
    return g, contract(g, [0, 0, 1], method="test"), uniform(2, bandwidth=200.0, latency=0.0)


def test_status_and_bound_on_a_coarse_graph_say_so():
    g, cg, c = coarse_pq()
    p = run(cg, c)
    e = p.estimate
    assert e.status == "OPTIMAL" and e.graph == "coarse" and e.graph_nodes == 2
    assert e.label() == "OPTIMAL (coarse graph)"
    assert e["best_bound_s"] == pytest.approx(4.0) and e.makespan_s == pytest.approx(4.0)
    # the coarse "bound" is no bound on the original graph: its optimum is
    # 3 s (p1, q on one device, p2 on the other: it splits coarse node P)
    assert brute(g, c) == pytest.approx(3.0)
    assert e["original_makespan_s"] == pytest.approx(simulate(g, c, p)["makespan_s"]) == pytest.approx(4.0)


def test_never_worse_than_its_warm_start_on_the_original_graph():
    # the warm start (METIS: one coarse node per device) is 4.5 s on the
    # coarse graph but 3.5 s on the original; the solver's coarse optimum
    # (one device, 4 s) is worse there, so the warm start is returned
    g, cg, c = coarse_pq()
    p = run(cg, c, hint="metis")
    e = p.estimate
    assert e["source"] == "hint" and e["hint"] == "metis"
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(3.5) == e["original_makespan_s"]
    assert e["solver_original_makespan_s"] == pytest.approx(4.0)
    assert e.makespan_s == pytest.approx(4.5) and e.status == "FEASIBLE" and e.graph == "coarse"
    assert "original graph" in e["note"] and e["caveat"].startswith("the warm start 'metis'")
    # without the original graph the coarse graph is the judge
    cg.origin = None
    q = run(cg, c, hint="metis")
    assert q.estimate["source"] == "solver" and "original_makespan_s" not in q.estimate


def test_two_runs_give_byte_identical_placements():
    # a search the deterministic budget stops (no proof within it): the wall
    # clock (30 s) is far away, so the counted budget decides
    import orjson

    g, c = layered(40, seed=4, bytes_scale=0.05), uniform(4, bandwidth=1.0e10, latency=1e-5)
    docs = []
    for _ in range(2):
        p = registry.place(g, c, "milp", params={"time_limit": 30, "det_time": 0.2})
        assert p.estimate["repeatable"] and p.estimate["det_time_used"] >= 0.2 * 0.99
        docs.append(orjson.dumps(p.to_dict(timings=False)))
    assert docs[0] == docs[1]
    assert p.params["workers"] == 1 and p.params["det_time"] == 0.2


def test_a_model_too_large_for_the_time_limit_is_not_built(capsys):
    g, c = layered(300, seed=1), uniform(4)
    p = solve(g, c, time_limit=1.0, quiet=True)
    assert p.estimate["status"] == "UNKNOWN" and p.estimate["source"] == "hint"
    assert p.estimate["caveat"].endswith("not a solver solution (model too large for the time limit)")
    err = capsys.readouterr().err
    assert "too large to solve within --time-limit 1 s" in err and "placer coarsen" in err
    with pytest.raises(Exception, match="coarsen first"):
        solve(g, c, time_limit=1.0, quiet=True, hint="none")


# ------------------------------------------------- time grid (issue 24, N15)
def slow_link_cluster(k=2, slow=("gpu0", "gpu1"), bandwidth=100.0, latency=0.0):
    """*k* devices on links of *bandwidth* / *latency*, except one directed
    pair *slow* of 1 B/s and 1e12 s latency (the N15 reproducer's link)."""
    from celeritas_cli.model.cluster import Cluster

    doc = uniform(k, bandwidth=bandwidth, latency=latency).to_dict()
    doc["links"]["pairs"] = [{"src": slow[0], "dst": slow[1], "bandwidth_Bps": 1, "latency_s": 1e12}]
    return Cluster.from_dict(doc, label="slow-link")


def test_one_slow_link_keeps_the_grid_fine_hand_computed():
    """a (2 s) and b (2 s) feed c (1 s), 100 B each.  One device: 5 s.  Split
    a on gpu0, b on gpu1: c on gpu0 receives b's output over gpu1->gpu0 (100 B
    at 100 B/s = 1 s, arriving at 3) and ends at 4; c on gpu1 would wait 1e12 s
    for a's output on the slow link gpu0->gpu1.  Optimum 4 s.  Before the fix
    the 1e12 s link made the grid 10 s, every time 0 units: 'OPTIMAL 0 s'."""
    g = build("abc", [node("a", 2), node("b", 2), node("c", 1)],
              [{"src": "a", "dst": "c", "bytes": 100}, {"src": "b", "dst": "c", "bytes": 100}])
    c = slow_link_cluster()
    assert brute(g, c) == pytest.approx(4.0)
    p = run(g, c, hint="auto")
    e = p.estimate
    assert e["resolution_s"] <= 1e-4 and e["time_grid"] == "fine"
    assert e["status"] == "OPTIMAL"
    assert e["objective_s"] == pytest.approx(4.0, abs=1e-6) and e["best_bound_s"] == pytest.approx(4.0, abs=1e-6)
    assert e["makespan_s"] == pytest.approx(4.0, abs=1e-9) == simulate(g, c, p)["makespan_s"]
    assert p.assignment["a"] != p.assignment["b"] and p.assignment["c"] == "gpu0" == p.assignment["a"]


def test_n15_reproducer_cluster_gives_a_real_bound():
    """N15: layered_60 on 4xV100-pcie with one link gpu3->gpu2 of latency
    1e12 s.  Expected as on the plain cluster: a fine grid, status FEASIBLE,
    a bound at least the simulator's lower bound (0.000527 s) and below the
    makespan - never 'OPTIMAL objective 0 s, bound 0 s'."""
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.model.io import bundled_cluster, load_graph

    doc = bundled_cluster("4xV100-pcie").to_dict()
    doc["links"]["pairs"] = [{"src": "gpu3", "dst": "gpu2", "bandwidth_Bps": 1, "latency_s": 1e12}]
    c = Cluster.from_dict(doc, label="one_link_latency_1e12")
    g = load_graph("sample_graphs/layered_60.json")
    e = run(g, c, hint="auto", time_limit=3).estimate
    assert e["resolution_s"] == pytest.approx(1e-9) and e["time_grid"] == "fine"
    assert e["objective_s"] > 0 and e["status"] == "FEASIBLE"
    assert e["lower_bound_s"] == pytest.approx(0.000527368, rel=1e-6)
    assert e["lower_bound_s"] <= e["best_bound_s"] <= e["makespan_s"]
    assert e["rounding_s"] < 1e-6 and e["makespan_s"] < 1.0


def test_a_coarse_user_grid_says_so_and_is_never_optimal():
    """-p resolution=10 on millisecond times: every time
    rounds up to one 10 s unit (never to zero), the solver proves its
    optimum of the rounded model, but the status stays FEASIBLE, time_grid
    is 'coarse', and the bound falls back to the simulator's (1 ms)."""
    g = build("ab", [node("a", 1e-3), node("b", 1e-3)], [{"src": "a", "dst": "b", "bytes": 10}])
    c = uniform(2)
    e = run(g, c, resolution=10.0).estimate
    assert e["solver_status"] == "OPTIMAL" and e["status"] == "FEASIBLE"
    assert e["time_grid"] == "coarse" and "coarse" in e["grid_note"]
    assert e["objective_s"] == pytest.approx(20.0)  # two nodes of one unit each, in sequence
    assert e["best_bound_s"] == pytest.approx(2e-3) == e["lower_bound_s"]
    assert e["makespan_s"] == pytest.approx(2e-3)
