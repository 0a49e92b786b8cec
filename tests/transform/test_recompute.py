"""Activation recomputation (issue 22.4): clones in the backward, the
trade of memory for time on a hand example, the recipe and its checks."""

from __future__ import annotations

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.pipelining.builder import staged_plan
from celeritas_cli.sim.simulator import run_schedule, simulate
from celeritas_cli.transform.derivation import rebuild
from celeritas_cli.transform.microbatch import microbatch_graph
from celeritas_cli.transform.recompute import recompute_graph

from ..pipelining.pipeline_graphs import layer_chain
from ..pipelining.time_rule import peaks


def two_layers():
    """x -> f1 -> f2 -> b2 -> b1 (b1 also reads f1's output); f 2 s, b 4 s and 100 B kept each, batch 2."""
    nd = lambda i, c, mem, p: {"id": i, "compute_s": c, "memory_bytes": mem, "pass": p, "resident_bytes": 0}
    return build("two", [nd("x", 0.0, 0, "forward"), nd("f1", 2.0, 100, "forward"), nd("f2", 2.0, 100, "forward"),
                         nd("b2", 4.0, 0, "backward"), nd("b1", 4.0, 0, "backward")],
                 [{"src": "x", "dst": "f1", "bytes": 100}, {"src": "f1", "dst": "f2", "bytes": 100, "tensor": "y"},
                  {"src": "f1", "dst": "b1", "bytes": 100, "tensor": "y"}, {"src": "f2", "dst": "b2", "bytes": 100},
                  {"src": "b2", "dst": "b1", "bytes": 100}], meta={"phase": "training", "batch_size": 2})


def plan(recompute):
    g = two_layers()
    c = uniform(1)
    return g, c, staged_plan(g, c, [0] * g.n, [0], 2, "gpipe", recompute=recompute, overhead_s=0.0)


def test_recomputation_trades_memory_for_time_by_hand():
    # GPipe on one device, 2 micro-batches (f = 1 s, b = 2 s, 50 B kept per node and micro-batch):
    # without: 2 * (1 + 1 + 2 + 2) = 12 s, and after both forwards all four activations live = 200 B;
    # recomputing f1 and f2: + 2 * (1 + 1) = 16 s, and at most one micro-batch's two activations = 100 B
    results = {}
    for rc in (None, ["f1", "f2"]):
        g, c, p = plan(rc)
        d = rebuild(g, p.derivation, None)
        dev, order = p.resolve(d, c)
        sched = run_schedule(d, c, dev, order)
        results[bool(rc)] = (sched.makespan, peaks(d, sched, 1)[0])
    assert results == {False: (pytest.approx(12.0), 200), True: (pytest.approx(16.0), 100)}


def test_recomputation_by_hand_under_the_judge():
    peaks_by = {}
    for rc in (None, ["f1", "f2"]):
        g, c, p = plan(rc)
        report = simulate(g, c, p)
        assert report["memory_rule"] == "time"
        peaks_by[bool(rc)] = (report["makespan_s"], report["devices"][0]["memory_bytes"])
    assert peaks_by == {False: (pytest.approx(12.0), 200), True: (pytest.approx(16.0), 100)}


def test_clones_run_at_the_start_of_the_backward_of_their_micro_batch():
    _, _, p = plan(["f1", "f2"])
    assert p.order["gpu0"] == ["x/mb0", "f1/mb0", "f2/mb0", "x/mb1", "f1/mb1", "f2/mb1",
                               "f1/mb0/recompute", "f2/mb0/recompute", "b2/mb0", "b1/mb0",
                               "f1/mb1/recompute", "f2/mb1/recompute", "b2/mb1", "b1/mb1"]


def test_structure_of_a_clone():
    g = microbatch_graph(two_layers(), 2)
    r = recompute_graph(g, ["f1"])  # the origin names both copies
    clones = [r.ids[v] for v in range(r.n) if "recompute_of" in (r.node_extra[v] or {})]
    assert clones == ["f1/mb0/recompute", "f1/mb1/recompute"]
    doc = r.to_dict()["nodes"][r.index["f1/mb1/recompute"]]
    assert (doc["recompute_of"], doc["microbatch"], doc["origin"], doc["memory_bytes"], doc["resident_bytes"]) == \
        ("f1/mb1", 1, "f1", 50, 0)
    # f1 still feeds f2; b1 now reads the clone, which reads what f1 reads
    pairs = {(r.ids[r.edge_src[e]], r.ids[r.edge_dst[e]]) for e in range(r.m)}
    assert {("f1/mb1", "f2/mb1"), ("f1/mb1/recompute", "b1/mb1"), ("x/mb1", "f1/mb1/recompute")} <= pairs
    assert ("f1/mb1", "b1/mb1") not in pairs
    assert r.meta["recompute"] == ["f1/mb0", "f1/mb1"]


def test_a_plain_graph_clone_keeps_its_parameters_device():
    g = layer_chain(2, params=10)
    r = recompute_graph(g, ["f0"])
    v = r.index["f0/recompute"]
    assert r.colocation[v] == "w0" and r.memory[v] == 400


def test_refusals():
    g = two_layers()
    with pytest.raises(InvalidInput, match="has no node 'nope'"):
        recompute_graph(g, ["nope"])
    with pytest.raises(InvalidInput, match="'b1' is in the backward pass"):
        recompute_graph(g, ["b1"])
    with pytest.raises(InvalidInput, match="already a recompute clone"):
        recompute_graph(recompute_graph(g, ["f1"]), ["f1/recompute"])
    assert recompute_graph(g, ["x"]).n == g.n  # nothing of x's is read by the backward: left as it is


def test_recipe_is_rebuilt_and_a_forged_one_rejected():
    g, c, p = plan(["f1"])
    assert p.derivation["steps"][1] == {"transform": "recompute", "nodes": ["f1"]}
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(14.0)
    forged = {"steps": [p.derivation["steps"][0], {"transform": "recompute", "nodes": ["f2"]}]}
    with pytest.raises(InvalidInput, match="does not derive from graph 'two'"):
        rebuild(g, forged, rebuild(g, p.derivation, None).to_dict())
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].nodes: must be a list of strings"):
        rebuild(g, {"steps": [{"transform": "recompute", "nodes": "f1"}]}, None)


def test_size_is_counted_before_building():
    from celeritas_cli.transform.recompute import recompute_size

    g = microbatch_graph(layer_chain(3, params=10, grad=8), 2)
    for nodes in (["f0"], ["f0", "f1", "f2"], ["x", "f1/mb0"]):
        r = recompute_graph(g, nodes)
        assert recompute_size(g, nodes) == (r.n, r.m)
