"""Hand-made cases where each baseline's defining rule decides the outcome,
with makespans computed by hand and checked through the simulator.

Unless a test says otherwise: 100-byte tensors over 100 B/s links without
latency, so every transfer takes 1 s per 100 bytes.
"""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.placers.m_sct import (
    greedy_favorites,
    lp_favorite_values,
    round_favorites,
)
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.graph import build
from celeritas_cli.scheduling.memory import DeviceMemory
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node


def _place(graph, cluster, algo, **params):
    p = registry.place(graph, cluster, algo, params=params)
    return p, simulate(graph, cluster, p)


def _two_types(mem=10**9) -> Cluster:
    """gpu0 of type A, gpu1 of type B, 100 B/s both ways."""
    return Cluster.from_dict({
        "schema": "placer.cluster/v1", "name": "AB",
        "devices": [{"id": "gpu0", "type": "A", "memory_bytes": mem}, {"id": "gpu1", "type": "B", "memory_bytes": mem}],
        "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.0}}})


# --------------------------------------------------------------------------- m-TOPO
def test_m_topo_cap_forces_a_move(two_dev):
    """cap = 40 / 2 + 10 = 30 bytes: a, b, c fill gpu0, d must go to gpu1
    although gpu0 has room.  Makespan: 3 s on gpu0, 1 s transfer, d 1 s = 5."""
    g = build("chain4", [node(x, 1, mem=10) for x in "abcd"], [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    p, rep = _place(g, two_dev, "m-topo")
    assert p.assignment == {"a": "gpu0", "b": "gpu0", "c": "gpu0", "d": "gpu1"}
    assert p.estimate["caps"] == [30, 30]
    assert rep["makespan_s"] == pytest.approx(5.0)


def test_m_topo_never_revisits_a_device(three_dev):
    """Kahn order a, b, c; cap = 36 / 3 + 20 = 32.  a (10) on gpu0; b (20) would
    make 30 <= 32 so it stays; c (6) would make 36 > 32: gpu1.  d (0) after c
    stays on gpu1 although gpu0 still has room for it."""
    g = build("g", [node("a", 1, mem=10), node("b", 1, mem=20), node("c", 1, mem=6), node("d", 1, mem=0)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    p, _ = _place(g, three_dev, "m-topo")
    assert [p.assignment[x] for x in "abcd"] == ["gpu0", "gpu0", "gpu1", "gpu1"]


def test_m_topo_best_effort_when_nothing_fits():
    """Devices of 15 bytes, four 10-byte nodes: no crash, status OOM, and the
    simulator agrees."""
    g = build("chain4", [node(x, 1, mem=10) for x in "abcd"], [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    cl = uniform(2, memory=15, bandwidth=100.0, latency=0.0)
    p, rep = _place(g, cl, "m-topo")
    assert p.estimate["status"] == "OOM" and rep["status"] == "OOM"
    assert set(p.assignment) == set("abcd")


def test_m_topo_keeps_colocation_groups(two_dev):
    """a and d share a group, charged 20 when a is placed; cap = 50 / 2 + 20
    = 45.  a's group, b, c reach 40 on gpu0; d follows a without charge; e
    (50 > 45) moves to gpu1."""
    g = build("g", [node("a", 1, mem=10, colocation="w"), node("b", 1, mem=10), node("c", 1, mem=10),
                    node("d", 1, mem=10, colocation="w"), node("e", 1, mem=10)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d"), edge("d", "e")])
    p, _ = _place(g, two_dev, "m-topo")
    assert [p.assignment[x] for x in "abcde"] == ["gpu0"] * 4 + ["gpu1"]
    assert p.estimate["caps"] == [45, 45]


# --------------------------------------------------------------------------- m-ETF
def test_m_etf_starts_a_child_on_the_idle_device(diamond, two_dev):
    """Diamond a(1) -> b(2), c(3) -> d(1).  ETF: a on gpu0 [0,1]; at t=1 gpu0
    takes b (lower topological index) [1,3]; c's input reaches gpu1 at 2, earlier
    than gpu0 frees, so c runs there [2,5]; d: on gpu1 at 5 (b's output arrives
    at 4) beats gpu0 (c's output at 6): [5,6].  Makespan 6 < 7 on one device."""
    p, rep = _place(diamond, two_dev, "m-etf")
    assert p.assignment == {"a": "gpu0", "b": "gpu0", "c": "gpu1", "d": "gpu1"}
    assert p.order == {"gpu0": ["a", "b"], "gpu1": ["c", "d"]}
    assert p.estimate["makespan_s"] == pytest.approx(6.0)
    assert rep["makespan_s"] == pytest.approx(6.0)


def test_m_etf_respects_memory(two_dev):
    """Two independent 6-byte nodes on 10-byte devices: ETF would start both
    at 0 anyway, but memory forces distinct devices even for a chain."""
    g = build("c", [node("a", 1, mem=6), node("b", 1, mem=6)], [edge("a", "b")])
    cl = uniform(2, memory=10, bandwidth=100.0, latency=0.0)
    p, rep = _place(g, cl, "m-etf")
    assert p.assignment == {"a": "gpu0", "b": "gpu1"}
    assert rep["makespan_s"] == pytest.approx(3.0) and p.estimate["status"] == "FEASIBLE"


def test_m_etf_pins_colocation_group(two_dev):
    """b would start earliest on idle gpu1, but its group went to gpu0 with a."""
    g = build("g", [node("a", 2, colocation="w"), node("x", 1), node("b", 1, colocation="w")],
              [edge("x", "b")])
    p, _ = _place(g, two_dev, "m-etf")
    assert p.assignment["a"] == p.assignment["b"]


# --------------------------------------------------------------------------- m-SCT
def _sct_graph():
    """a(1) -> x(5) [300 B] and a -> v(1) [200 B] -> y(10) [100 B].
    x comes first in topological order; v -> y is the critical path."""
    return build("sct", [node("a", 1), node("x", 5), node("v", 1), node("y", 10)],
                 [edge("a", "x", 300), edge("a", "v", 200), edge("v", "y", 100)])


def test_sct_lp_picks_the_critical_child(two_dev):
    """LP optimum w = 12 forces x_av = x_vy = 0 and x_ax = 1."""
    g = _sct_graph()
    pairs, x, w = lp_favorite_values(g, CostModel(g, two_dev))
    assert w == pytest.approx(12.0)
    fav = round_favorites(g.n, pairs, x, 0.5)
    assert [g.ids[f] if f >= 0 else None for f in fav] == ["v", None, "y", None]


def test_sct_keeps_favourite_child_where_etf_moves_it(two_dev):
    """ETF: gpu0 runs x after a [1,6]; v's input reaches gpu1 at 3, v [3,4],
    y [4,14] there: makespan 14.  SCT: gpu0 waits for a's favourite v [1,2]
    (x is not urgent: it could start on gpu1 only at 4), then y [2,12]; x
    runs on gpu1 [4,9]: makespan 12."""
    g = _sct_graph()
    pe, re = _place(g, two_dev, "m-etf")
    ps, rs = _place(g, two_dev, "m-sct")
    assert pe.assignment["v"] == "gpu1" and re["makespan_s"] == pytest.approx(14.0)
    assert ps.assignment == {"a": "gpu0", "v": "gpu0", "y": "gpu0", "x": "gpu1"}
    assert ps.order == {"gpu0": ["a", "v", "y"], "gpu1": ["x"]}
    assert rs["makespan_s"] == pytest.approx(12.0) == ps.estimate["makespan_s"]
    assert ps.estimate["favorites"] == "lp"


def test_sct_threshold_zero_keeps_only_exact_favourites():
    assert round_favorites(3, [(0, 1), (1, 2)], [0.0, 0.3], 0.0) == [1, -1, -1]
    assert round_favorites(3, [(0, 1), (1, 2)], [0.0, 0.3], 0.5) == [1, 2, -1]


def test_sct_greedy_fallback_on_large_graphs(two_dev, capsys):
    g = _sct_graph()
    assert [g.ids[f] if f >= 0 else None for f in greedy_favorites(g)] == ["x", None, "y", None]
    p, rep = _place(g, two_dev, "m-sct", lp_max_nodes=2)
    assert p.estimate["favorites"] == "greedy"
    assert p.estimate["caveat"] == "greedy favourite children (more than lp_max_nodes=2 nodes), not Baechi's LP"
    assert "lp_max_nodes" in capsys.readouterr().err
    assert "caveat" not in _place(g, two_dev, "m-sct")[0].estimate  # the LP: Baechi's m-SCT
    assert rep["makespan_s"] > 0


# --------------------------------------------------------------------------- HEFT
def _gap_graph():
    """p runs fast only on gpu1 (type B), q and r only on gpu0 (type A).
    p -> q (1 s transfer) leaves gpu0 idle in [0, 3); r, scheduled after q by
    rank, fits that gap."""
    return build("gap", [
        {"id": "p", "compute_s": 1, "memory_bytes": 0, "compute_by_type": {"A": 100, "B": 2}},
        {"id": "q", "compute_s": 1, "memory_bytes": 0, "compute_by_type": {"A": 1, "B": 100}},
        {"id": "r", "compute_s": 1, "memory_bytes": 0, "compute_by_type": {"A": 1, "B": 50}}],
        [edge("p", "q")])


def test_heft_insertion_fills_idle_gap():
    """Ranks: p 102.5 > q 50.5 > r 25.5.  p -> gpu1 [0,2]; q -> gpu0 [3,4];
    r -> gpu0's gap [0,1], ordered before q.  Makespan 4."""
    g, cl = _gap_graph(), _two_types()
    p, rep = _place(g, cl, "heft")
    assert p.assignment == {"p": "gpu1", "q": "gpu0", "r": "gpu0"}
    assert p.order == {"gpu0": ["r", "q"], "gpu1": ["p"]}
    assert p.estimate["makespan_s"] == pytest.approx(4.0) == rep["makespan_s"]


def test_heft_without_insertion_appends():
    """Append-only: r after q on gpu0, [4,5]; makespan 5."""
    g, cl = _gap_graph(), _two_types()
    p, rep = _place(g, cl, "heft", insertion=False)
    assert p.order == {"gpu0": ["q", "r"], "gpu1": ["p"]}
    assert rep["makespan_s"] == pytest.approx(5.0)


def test_heft_memory_aware_refuses_full_device():
    """q and r both want gpu0 (1 s vs 100/50 s on gpu1) but gpu0 holds one of
    them; memory-aware HEFT sends r to gpu1 (EFT 50), plain HEFT overfills."""
    g = build("m", [
        {"id": "q", "compute_s": 1, "memory_bytes": 8, "compute_by_type": {"A": 1, "B": 100}},
        {"id": "r", "compute_s": 1, "memory_bytes": 8, "compute_by_type": {"A": 1, "B": 50}}], [])
    cl = _two_types(mem=10)
    p, rep = _place(g, cl, "heft")
    assert p.assignment == {"q": "gpu0", "r": "gpu1"} and rep["status"] == "OK"
    assert rep["makespan_s"] == pytest.approx(50.0)
    p2, rep2 = _place(g, cl, "heft", memory_aware=False)
    assert p2.estimate["status"] == "OOM" and rep2["status"] == "OOM"


# --------------------------------------------------------------------------- METIS / Scotch
def _dumbbell():
    """a =1000B= b -10B- c =1000B= d, equal compute: the balanced min cut is b-c."""
    return build("db", [node(x, 1) for x in "abcd"],
                 [edge("a", "b", 1000), edge("b", "c", 10), edge("c", "d", 1000)])


@pytest.mark.parametrize("algo", ["metis", "scotch"])
def test_partitioners_cut_the_light_edge(algo, two_dev):
    if algo not in registry.names():
        pytest.skip(f"{algo} not registered")
    g = _dumbbell()
    p, rep = _place(g, two_dev, algo)
    assert p.assignment["a"] == p.assignment["b"] != p.assignment["c"] == p.assignment["d"]
    assert p.estimate["edge_cut_bytes"] == 10
    # a, b on one device, c, d on the other: 2 s + 0.1 s transfer + 2 s
    assert rep["makespan_s"] == pytest.approx(4.1)


@pytest.mark.parametrize("algo", ["metis", "scotch"])
def test_partitioners_keep_groups_whole(algo, two_dev):
    """a and d colocated: contracted to one vertex, never split."""
    if algo not in registry.names():
        pytest.skip(f"{algo} not registered")
    g = build("db", [node("a", 1, colocation="g"), node("b", 1), node("c", 1), node("d", 1, colocation="g")],
              [edge("a", "b", 1000), edge("b", "c", 10), edge("c", "d", 1000)])
    p, _ = _place(g, two_dev, algo)
    assert p.assignment["a"] == p.assignment["d"]


def test_metis_memory_weights_balance_memory(two_dev):
    """Four equal-compute nodes, one holding most memory: memory weights put
    it alone on a device."""
    g = build("mw", [node("a", 1, mem=90), node("b", 1, mem=10), node("c", 1, mem=10), node("d", 1, mem=10)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    p, _ = _place(g, two_dev, "metis", weights="memory")
    others = {p.assignment[x] for x in "bcd"}
    assert others == {p.assignment["a"]} ^ {"gpu0", "gpu1"}


# --------------------------------------------------------------------------- shared bookkeeping
def test_device_memory_best_effort_picks_most_free():
    g = build("g", [node("a", 1, mem=8), node("b", 1, mem=8), node("c", 1, mem=8)], [])
    mem = DeviceMemory(g, uniform(2, memory=10))
    mem.place(0, 0)
    mem.place(1, 1)
    mem.load[1] = 9  # gpu1 fuller
    assert not mem.fits(2, 0) and not mem.fits(2, 1)
    assert mem.allowed(2, 0) and not mem.allowed(2, 1)
    assert mem.status() == "FEASIBLE"


def test_scotch_is_deterministic_on_a_large_graph():
    """Scotch 7 maps with threads: without its deterministic context option
    two runs on this 3000-node graph gave different mappings."""
    from pathlib import Path

    from celeritas_cli.model.io import load_cluster, load_graph

    g = load_graph(Path(__file__).resolve().parents[2] / "sample_graphs" / "layered_3000_bigmem.json")
    c = load_cluster("4xV100-pcie")
    runs = [registry.place(g, c, "scotch", seed=3).assignment for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


# --------------------------------------------------------------------------- given
def _given_file(tmp_path, assignment, order=None, estimate=None, name="g.placement.json"):
    from celeritas_cli.model.jsonio import write_json

    doc = {"schema": "placer.placement/v1", "graph": "two", "cluster": "uniform2", "algorithm": "expert",
           "assignment": assignment}
    if order is not None:
        doc["order"] = order
    if estimate is not None:
        doc["estimate"] = estimate
    path = tmp_path / name
    write_json(doc, path)
    return str(path)


def _two_chains():
    """a(1) -> b(2) and c(1) -> d(2), 100-byte tensors."""
    return build("two", [node("a", 1.0, 60), node("b", 2.0, 60), node("c", 1.0), node("d", 2.0)],
                 [edge("a", "b"), edge("c", "d")])


def test_given_refuses_an_order_that_deadlocks(two_dev, tmp_path):
    """Issue 33, D7: gpu0 runs d before a, gpu1 b before c; d waits for c,
    which waits behind b, which waits for a, which waits behind d."""
    from celeritas_cli.errors import InvalidInput

    path = _given_file(tmp_path, {"a": "gpu0", "d": "gpu0", "b": "gpu1", "c": "gpu1"},
                       order={"gpu0": ["d", "a"], "gpu1": ["b", "c"]},
                       estimate={"makespan_s": 3.0, "status": "FEASIBLE", "makespan_by": "simulator"})
    with pytest.raises(InvalidInput, match=r"g\.placement\.json: order of gpu0 cannot be followed: node 'd' needs "
                                           r"'c' \(on gpu1\)"):
        registry.place(_two_chains(), two_dev, "given", params={"file": path})
    # the orders that follow the dependencies are judged: a, d on gpu0 and c, b on gpu1 run in parallel,
    # each chain sending its tensor across (1 s): 1 + 1 + 2 = 4 s
    ok = _given_file(tmp_path, {"a": "gpu0", "d": "gpu0", "b": "gpu1", "c": "gpu1"},
                     order={"gpu0": ["a", "d"], "gpu1": ["c", "b"]}, name="ok.json")
    p = registry.place(_two_chains(), two_dev, "given", params={"file": ok})
    assert p.estimate["makespan_s"] == 4.0 and p.order == {"gpu0": ["a", "d"], "gpu1": ["c", "b"]}


def test_given_cli_refuses_a_deadlock_in_one_line(tmp_path):
    import subprocess
    import sys

    from celeritas_cli.model.jsonio import write_json

    g = tmp_path / "two.json"
    write_json(_two_chains().to_dict(), g)
    path = _given_file(tmp_path, {"a": "gpu0", "d": "gpu0", "b": "gpu1", "c": "gpu1"},
                       order={"gpu0": ["d", "a"], "gpu1": ["b", "c"]})
    run = subprocess.run([sys.executable, "-m", "celeritas_cli", "place", str(g), "--algo", "given",
                          "-p", f"file={path}", "-q"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    lines = [line for line in run.stderr.splitlines() if "no --cluster given" not in line]
    assert len(lines) == 1 and "order of gpu0 cannot be followed: node 'd' needs 'c'" in lines[0]
    assert "Traceback" not in run.stderr


def test_given_never_copies_an_estimate(two_dev, tmp_path):
    """A file that claims 1e-12 s, FEASIBLE, "simulator": the estimate is the
    simulator's (a, b on gpu0, c, d on gpu1, no order: 1 + 2 = 3 s), and a
    device over its capacity is OOM whatever the file says."""
    claim = {"makespan_s": 1e-12, "status": "FEASIBLE", "makespan_by": "simulator", "lower_bound_s": 1e-12}
    path = _given_file(tmp_path, {"a": "gpu0", "b": "gpu0", "c": "gpu1", "d": "gpu1"}, estimate=claim)
    g = _two_chains()
    p = registry.place(g, two_dev, "given", params={"file": path})
    assert p.estimate["makespan_s"] == 3.0 == simulate(g, two_dev, p)["makespan_s"]
    assert p.estimate["makespan_by"] == "simulator" and p.estimate["status"] == "FEASIBLE"
    assert p.estimate["lower_bound_s"] == 3.0 and p.estimate["max_memory_bytes"] == 120
    small = uniform(2, bandwidth=100.0, latency=0.0, memory=100)  # a and b hold 120 bytes on gpu0
    q = registry.place(g, small, "given", params={"file": path})
    assert q.estimate["status"] == "OOM" and q.estimate["oom_devices"] == ["gpu0"]
