"""Operation splitting (FastT Algorithm 2's SplitOperation), checked as a
graph transformation and through the simulator."""

from __future__ import annotations

import copy
import math

import pytest

from celeritas_cli.transform.contract import contract
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.transform.derivation import attach, split_step
from celeritas_cli.transform.split_cost import splittable_dims
from celeritas_cli.transform.splitting import COPY_BANDWIDTH_BPS, split_operation
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node


def conv_graph(meta=None):
    """x(1) -> conv(8; 1000 B batch-independent, 250 B of parameters, 400 B activation) -> y(1), and x -> y."""
    return build("conv", [node("x", 1.0, 0),
                          node("conv", 8.0, 1400, splittable=["batch", "channel"], colocation="w:conv",
                               batch_independent={"memory_bytes": 1000, "state_bytes": 250}),
                          node("y", 1.0, 0)],
                 [edge("x", "conv", 200, tensor="out"), edge("x", "y", 200, tensor="out"),
                  edge("conv", "y", 400, tensor="out")],
                 meta={"batch_size": 8, **(meta or {})})


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
    assert s.compute[p0] == s.compute[p1] == 8.0 / 2 + 0.25  # no line, no roofline: linear + one launch
    # parts hold half the activation; the batch-independent 1000 B is held once, by the weights node
    assert s.memory[p0] == s.memory[p1] == 200
    w = s.index["conv/weights"]
    assert s.memory[w] == 1000 and s.colocation[w] == "w:conv"
    assert s.colocation[p0] is None and s.splittable[p0] is None
    assert s.node_extra[p1] == {"split_of": "conv", "part": 1}
    # input: x -> split keeps x's tensor 'out' (shared with x -> y); slices to parts
    (e,) = _edges(s, "x", "conv/split0")
    (e2,) = _edges(s, "x", "y")
    assert s.edge_tensor[e] == s.edge_tensor[e2]
    assert [s.edge_bytes[e] for e in _edges(s, "conv/split0", "conv/part0")] == [100]
    assert [s.edge_bytes[e] for e in _edges(s, "conv/part1", "conv/concat0")] == [200]
    (ey,) = _edges(s, "conv/concat0", "y")
    assert s.edge_bytes[ey] == 400
    # parameters: the same tensor to both parts (a broadcast) of state_bytes
    ws = _edges(s, "conv/weights", "conv/part0") + _edges(s, "conv/weights", "conv/part1")
    assert [s.edge_bytes[e] for e in ws] == [250, 250] and s.edge_tensor[ws[0]] == s.edge_tensor[ws[1]]
    assert math.isclose(s.compute[s.index["conv/split0"]], 2 * 200 / COPY_BANDWIDTH_BPS)
    assert s.meta["split_from"] == "conv"
    assert s.meta["splits"] == [{"node": "conv", "dim": "batch", "n": 2, "parts": ["conv/part0", "conv/part1"],
                                 "members": ["conv"]}]
    assert s.total_memory() == g.total_memory()
    assert s.total_compute() > g.total_compute()


def test_channel_split_divides_state_and_broadcasts_input():
    g = conv_graph(meta={"phase": "training"})
    s = split_operation(g, "conv", "channel", 4, overhead_s=0.0)
    parts = [s.index[f"conv/part{i}"] for i in range(4)]
    assert all(s.memory[p] == 250 + 100 for p in parts)
    assert s.memory[s.index["conv/weights"]] == 0
    assert "conv/split0" not in s.index
    ins = [e for p in parts for e in s.in_edges[p] if s.ids[s.edge_src[e]] == "x"]
    assert len(ins) == 4 and len({s.edge_tensor[e] for e in ins}) == 1 and s.edge_bytes[ins[0]] == 200
    # parameters sliced per part: ceil(250 / 4)
    ws = [e for p in parts for e in s.in_edges[p] if s.ids[s.edge_src[e]] == "conv/weights"]
    assert [s.edge_bytes[e] for e in ws] == [63] * 4 and len({s.edge_tensor[e] for e in ws}) == 4


def backward_graph(fields: bool = True):
    """The shape of inception_v3's convolution_backward_89: its weight
    gradient (552,960 B) goes to Adam; it reads the weight from its owner
    (a parameter read) and an 8,000-byte output gradient, and sends an
    8,000-byte input gradient on."""
    bi = {"batch_independent": {"memory_bytes": 552960}} if fields else {}
    wbi = {"batch_independent": {"memory_bytes": 552960, "state_bytes": 552960, "state_tensors": ["w:weight"]}}
    return build("bw", [node("x", 0.1), node("w", 0.1, 552960 + 8000, colocation="p", **wbi),
                        node("cb", 0.1, 552960, op="aten.convolution_backward", splittable=["batch", "channel"], **bi),
                        node("dx", 0.1), node("adam", 0.01, 1105920, op="optim.adam", colocation="p")],
                 [edge("x", "w", 8000, tensor="x:0"), edge("w", "cb", 552960, tensor="w:weight"),
                  edge("w", "cb", 8000, tensor="w:0"),
                  edge("cb", "dx", 8000, tensor="cb:0"), edge("cb", "adam", 552960, tensor="cb:1")],
                 meta={"phase": "training", "batch_size": 8})


@pytest.mark.parametrize("fields", [True, False])
def test_batch_split_backward_sums_full_partial_gradients(fields):
    g = backward_graph(fields)
    s = split_operation(g, "cb", "batch", 4, overhead_s=0.0)
    parts = [f"cb/part{i}" for i in range(4)]
    # every part computes a full-size partial weight gradient and sends all of it to the sum node
    partials = [e for p in parts for e in _edges(s, p, "cb/sum1")]
    assert [s.edge_bytes[e] for e in partials] == [552960] * 4           # not 4 x 138,240
    assert sum(s.edge_bytes[e] for e in partials) == 4 * 552960
    (eu,) = _edges(s, "cb/sum1", "adam")
    assert s.edge_bytes[eu] == 552960 and s.tensor_name[s.edge_tensor[eu]] == "cb:1"
    sm = s.index["cb/sum1"]
    assert s.memory[sm] == 552960                                        # the summed gradient, kept once
    assert math.isclose(s.compute[sm], 5 * 552960 / COPY_BANDWIDTH_BPS)  # read 4 partials, write 1
    assert all(s.memory[s.index[p]] == 0 for p in parts) and "cb/weights" not in s.index
    # the input gradient is sliced and concatenated; the weight is read whole by every part, no split node
    assert [s.edge_bytes[e] for e in _edges(s, "cb/part2", "cb/concat0")] == [2000]
    assert [s.edge_bytes[e] for p in parts for e in _edges(s, "w", p) if s.edge_bytes[e] == 552960] == [552960] * 4
    assert [s.edge_bytes[e] for e in _edges(s, "cb/split0", "cb/part0")] == [2000]
    assert s.total_memory() == g.total_memory()


def test_backward_ops_split_along_the_batch_only():
    g = backward_graph()
    assert splittable_dims(g, g.index["cb"]) == ["batch"]
    with pytest.raises(InvalidInput, match="cannot be split along 'channel': it produces gradients"):
        split_operation(g, "cb", "channel", 2)


def test_parts_sharing_a_device_count_the_weights_once():
    g = conv_graph()
    s = split_operation(g, "conv", "batch", 2, overhead_s=0.0)
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    for where in ({}, {"conv/part1": 1}):
        dev = [where.get(s.ids[v], 0) for v in range(s.n)]
        p = Placement.from_indices(s, cl, dev, algorithm="test")
        attach(p, g, s, [split_step("conv", "batch", 2, 0.0)])
        mem = [d["memory_bytes"] for d in simulate(g, cl, p)["devices"]]
        assert mem == ([1000 + 200 + 200, 0] if not where else [1000 + 200, 200])


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


def _one():
    return build("one", [node("a", 1.0), node("c", 8.0, splittable=["batch"]), node("z", 1.0)],
                 [edge("a", "c", 100, tensor="out"), edge("c", "z", 100, tensor="out")], meta={"batch_size": 8})


def _one_placement(g, cl):
    s = split_operation(g, "c", "batch", 2, overhead_s=0.0)
    dev = [1 if s.ids[v] == "c/part1" else 0 for v in range(s.n)]
    p = Placement.from_indices(s, cl, dev, algorithm="test")
    attach(p, g, s, [split_step("c", "batch", 2, 0.0)])
    p.split_graph = p.to_dict(embed_derived=True)["split_graph"]  # as a file written with --embed-derived
    return p


def test_simulate_accepts_a_placement_on_the_split_graph():
    g = _one()
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = _one_placement(g, cl)
    rep = simulate(g, cl, p)  # the original graph is given; the split graph is rebuilt and simulated
    copy = 2 * 100 / COPY_BANDWIDTH_BPS
    # a 0-1, split (copy), part0 || part1 (slice of 50 B = 0.5 s to gpu1), 4 s each, back 0.5 s, concat, z
    expected = 1 + copy + 0.5 + 4 + 0.5 + copy + 1
    assert rep["makespan_s"] == pytest.approx(expected)
    assert rep["status"] == "OK"
    assert set(p.assignment) == set(Graph.from_dict(p.split_graph).ids)
    p.split_graph = None  # the recipe alone is enough
    assert simulate(g, cl, p)["makespan_s"] == pytest.approx(expected)


def test_simulate_rejects_a_forged_split_graph():
    """Issue 18.1: every compute time x 0.001 in the carried split graph
    used to simulate to 1/1000 of the honest makespan."""
    g = _one()
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = _one_placement(g, cl)
    honest = simulate(g, cl, p)["makespan_s"]
    forged = copy.deepcopy(p.split_graph)
    for nd in forged["nodes"]:
        nd["compute_s"] *= 0.001
    p.split_graph = forged
    with pytest.raises(InvalidInput, match=r"split_graph node 'a' does not derive from graph 'one': compute_s is "
                                           r"0\.001, the derivation gives 1\.0"):
        simulate(g, cl, p)
    p.split_graph, p.derivation = forged, None  # no recipe: nothing to check it against
    with pytest.raises(InvalidInput, match="carries a split_graph but no derivation"):
        simulate(g, cl, p)
    assert honest == pytest.approx(7.0)


def test_simulate_rejects_a_split_graph_with_a_changed_edge_or_an_extra_node():
    g = _one()
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = _one_placement(g, cl)
    doc = copy.deepcopy(p.split_graph)
    doc["edges"][-1]["bytes"] = 1
    p.split_graph = doc
    with pytest.raises(InvalidInput, match=r"edge c/concat0->z \(#\d+\) does not derive .*bytes is 1"):
        simulate(g, cl, p)
    doc = copy.deepcopy(_one_placement(g, cl).split_graph)
    doc["nodes"].append({"id": "ghost", "compute_s": 0.0, "memory_bytes": 0})
    p.split_graph = doc
    with pytest.raises(InvalidInput, match="node 'ghost' does not derive .*no such node"):
        simulate(g, cl, p)


def test_coarse_graph_keeps_members_of_unsplit_nodes():
    g = build("g", [node("a", 1), node("b", 1), node("c", 6, splittable=["batch"]), node("d", 1)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")], meta={"batch_size": 8})
    cg = contract(g, [0, 0, 1, 2], method="test")
    s = split_operation(cg, "c", "batch", 2)
    assert s.members[s.index["a"]] == ["a", "b"]
    assert s.members[s.index["c/part0"]] is None
    assert s.meta["splits"][0]["members"] == ["c"] and s.meta["coarsened_from"] == "g"
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = Placement.from_indices(s, cl, [0] * s.n, algorithm="test")
    attach(p, cg, s, [split_step("c", "batch", 2, 2e-6)])
    assert p.derivation["base"]["members"] == [["a", "b"], ["c"], ["d"]]
    assert {"a", "b", "c/part0", "c/part1", "d"} <= set(p.assignment)
    # simulated on the coarse graph it was made on, or on the original (the coarse base is rebuilt)
    on_coarse = simulate(cg, cl, p)["makespan_s"]
    assert on_coarse > 0 and simulate(g, cl, p)["makespan_s"] == on_coarse


def test_split_twice_appends_records():
    g = build("g", [node("a", 1), node("c", 6, splittable=["batch"]), node("e", 6, splittable=["batch"])],
              [edge("a", "c"), edge("c", "e")], meta={"batch_size": 6})
    s = split_operation(split_operation(g, "c", "batch", 2), "e", "batch", 3)
    assert s.meta["split_from"] == "g"
    assert [r["node"] for r in s.meta["splits"]] == ["c", "e"]
    assert s.n == 1 + (1 + 2 + 1) + (1 + 3)  # a, c: split/2 parts/concat, e: split/3 parts (sink)


def test_inception_convolution_backward_89_sums_four_full_partials():
    """Issue 18.7 on the real graph: the weight gradient to Adam is 4 full
    552,960 B partials summed, not 4 x 138,240 B slices."""
    from celeritas_cli.model.io import load_graph

    from ..conftest import SAMPLES

    g = load_graph(SAMPLES / "zoo" / "inception_v3.json.gz")
    v = g.index["convolution_backward_89"]
    assert g.splittable[v] == ["batch"] and splittable_dims(g, v) == ["batch"]
    s = split_operation(g, "convolution_backward_89", "batch", 4)
    sums = [nid for nid in s.ids if nid.startswith("convolution_backward_89/sum")]
    (sm,) = sums
    partials = [s.edge_bytes[e] for e in s.in_edges[s.index[sm]]]
    assert partials == [552960] * 4
    (out,) = s.out_edges[s.index[sm]]
    assert s.ids[s.edge_dst[out]] == "adam.stem.5.conv.weight" and s.edge_bytes[out] == 552960
    assert s.memory[s.index[sm]] == 552960 and s.total_memory() == g.total_memory()
