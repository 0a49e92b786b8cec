"""Operation splitting (FastT Algorithm 2's SplitOperation), checked as a
graph transformation and through the simulator."""

from __future__ import annotations

import math

import pytest

from celeritas_cli.coarsening.contract import contract
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.scheduling.splitting import COPY_BANDWIDTH_BPS, split_operation
from celeritas_cli.sim.simulator import simulate

from .conftest import edge, node


def conv_graph(meta=None):
    """x(1) -> conv(8, 1000 B state + 400 B activation) -> y(1), and x -> y."""
    return build("conv", [node("x", 1.0, 0), node("conv", 8.0, 1400, splittable=["batch", "channel"],
                                                   colocation="w:conv"),
                          node("upd", 0.5, 0, colocation="w:conv"), node("y", 1.0, 0)],
                 [edge("x", "conv", 200, tensor="out"), edge("x", "y", 200, tensor="out"),
                  edge("conv", "y", 400, tensor="out"), edge("conv", "upd", 400, tensor="out")],
                 meta=meta or {})


def _edges(g: Graph, src: str, dst: str) -> list[int]:
    return [e for e in range(g.m) if g.ids[g.edge_src[e]] == src and g.ids[g.edge_dst[e]] == dst]


def test_batch_split_structure_and_cost_model():
    g = conv_graph()
    s = split_operation(g, "conv", "batch", 2, overhead_s=0.25)
    assert s.topo_order() and len(s.topo_order()) == s.n  # acyclic, validated
    assert "conv" not in s.index
    for nid in ("conv/weights", "conv/split0", "conv/part0", "conv/part1", "conv/concat0"):
        assert nid in s.index
    p0, p1 = s.index["conv/part0"], s.index["conv/part1"]
    assert s.compute[p0] == s.compute[p1] == 8.0 / 2 + 0.25
    # activation = largest output tensor (400); state = 1000 replicated; activation halved
    assert s.memory[p0] == 1000 + 200
    assert s.colocation[p0] is None and s.splittable[p0] is None
    assert s.colocation[s.index["conv/weights"]] == "w:conv"
    # input: x -> split keeps x's tensor 'out' (shared with x -> y); slices to parts
    (e,) = _edges(s, "x", "conv/split0")
    (e2,) = _edges(s, "x", "y")
    assert s.edge_tensor[e] == s.edge_tensor[e2]
    assert [s.edge_bytes[e] for e in _edges(s, "conv/split0", "conv/part0")] == [100]
    assert [s.edge_bytes[e] for e in _edges(s, "conv/part1", "conv/concat0")] == [200]
    # output: concat sends the whole tensor, once, to y and upd
    (ey,), (eu,) = _edges(s, "conv/concat0", "y"), _edges(s, "conv/concat0", "upd")
    assert s.edge_bytes[ey] == 400 and s.edge_tensor[ey] == s.edge_tensor[eu]
    # parameters: the same tensor to both parts (a broadcast); not training: all of the state
    ws = _edges(s, "conv/weights", "conv/part0") + _edges(s, "conv/weights", "conv/part1")
    assert [s.edge_bytes[e] for e in ws] == [1000, 1000] and s.edge_tensor[ws[0]] == s.edge_tensor[ws[1]]
    assert math.isclose(s.compute[s.index["conv/split0"]], 2 * 200 / COPY_BANDWIDTH_BPS)
    assert s.meta["split_from"] == "conv"
    assert s.meta["splits"] == [{"node": "conv", "dim": "batch", "n": 2, "parts": ["conv/part0", "conv/part1"],
                                 "members": ["conv"]}]
    # total compute grows only by the overheads and the copies
    assert s.total_compute() > g.total_compute()


def test_channel_split_divides_state_and_broadcasts_input():
    g = conv_graph(meta={"phase": "training"})
    s = split_operation(g, "conv", "channel", 4, overhead_s=0.0)
    parts = [s.index[f"conv/part{i}"] for i in range(4)]
    assert all(s.memory[p] == 250 + 100 for p in parts)
    assert "conv/split0" not in s.index
    ins = [e for p in parts for e in s.in_edges[p] if s.ids[s.edge_src[e]] == "x"]
    assert len(ins) == 4 and len({s.edge_tensor[e] for e in ins}) == 1 and s.edge_bytes[ins[0]] == 200
    # training graph: parameters are a quarter of the state, sliced per part
    ws = [e for p in parts for e in s.in_edges[p] if s.ids[s.edge_src[e]] == "conv/weights"]
    assert [s.edge_bytes[e] for e in ws] == [63] * 4 and len({s.edge_tensor[e] for e in ws}) == 4


def test_split_rejects_bad_requests():
    g = conv_graph()
    with pytest.raises(InvalidInput, match="cannot be split along 'height'"):
        split_operation(g, "conv", "height", 2)
    with pytest.raises(InvalidInput, match="'x' cannot be split"):
        split_operation(g, "x", "batch", 2)
    with pytest.raises(InvalidInput, match="at least 2"):
        split_operation(g, "conv", "batch", 1)
    with pytest.raises(InvalidInput, match="no node 'nope'"):
        split_operation(g, "nope", "batch", 2)


def test_simulate_accepts_a_placement_on_the_split_graph():
    g = build("one", [node("a", 1.0), node("c", 8.0, splittable=["batch"]), node("z", 1.0)],
              [edge("a", "c", 100, tensor="out"), edge("c", "z", 100, tensor="out")])
    s = split_operation(g, "c", "batch", 2, overhead_s=0.0)
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    dev = [1 if s.ids[v] == "c/part1" else 0 for v in range(s.n)]
    p = Placement.from_indices(s, cl, dev, algorithm="test")
    p.split_graph = s.to_dict()
    rep = simulate(g, cl, p)  # the original graph is given; the split graph is simulated
    copy = 2 * 100 / COPY_BANDWIDTH_BPS
    # a 0-1, split (copy), part0 || part1 (slice of 50 B = 0.5 s to gpu1), 4 s each, back 0.5 s, concat, z
    expected = 1 + copy + 0.5 + 4 + 0.5 + copy + 1
    assert rep["makespan_s"] == pytest.approx(expected)
    assert rep["status"] == "OK"
    assert set(p.assignment) == set(s.ids)


def test_coarse_graph_keeps_members_of_unsplit_nodes():
    g = build("g", [node("a", 1), node("b", 1), node("c", 6, splittable=["batch"]), node("d", 1)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    cg = contract(g, [0, 0, 1, 2], method="test")
    s = split_operation(cg, "c", "batch", 2)
    assert s.members[s.index["a"]] == ["a", "b"]
    assert s.members[s.index["c/part0"]] is None
    assert s.meta["splits"][0]["members"] == ["c"] and s.meta["coarsened_from"] == "g"
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = Placement.from_indices(s, cl, [0] * s.n, algorithm="test")
    p.split_graph = s.to_dict()
    assert {"a", "b", "c/part0", "c/part1", "d"} <= set(p.assignment)
    assert simulate(cg, cl, p)["makespan_s"] > 0


def test_split_twice_appends_records():
    g = build("g", [node("a", 1), node("c", 6, splittable=["batch"]), node("e", 6, splittable=["batch"])],
              [edge("a", "c"), edge("c", "e")])
    s = split_operation(split_operation(g, "c", "batch", 2), "e", "batch", 3)
    assert s.meta["split_from"] == "g"
    assert [r["node"] for r in s.meta["splits"]] == ["c", "e"]
    assert s.n == 1 + (1 + 2 + 1) + (1 + 3)  # a, c: split/2 parts/concat, e: split/3 parts (sink)
