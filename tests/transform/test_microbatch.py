"""The ``microbatch`` derivation (issue 22.2): copies on whole samples,
weights once, gradient accumulation, one update per parameter, the recipe
and its forgery check, and both compositions with data parallelism."""

from __future__ import annotations

import math

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import attach, derive, rebuild
from celeritas_cli.transform.microbatch import microbatch_graph, microbatch_step
from celeritas_cli.transform.replicate import data_parallel_graph
from celeritas_cli.transform.split_cost import COPY_BANDWIDTH_BPS

from ..pipelining.pipeline_graphs import layer_chain


def ids(g: Graph) -> list[str]:
    return [g.ids[v] for v in range(g.n)]


def node(g: Graph, nid: str) -> dict:
    return g.to_dict()["nodes"][g.index[nid]]


def test_structure_of_a_micro_batched_chain():
    g = layer_chain(2, act=400, params=10, grad=8, batch=4)
    d = microbatch_graph(g, 2, overhead_s=0.0)
    assert ids(d) == ["x/mb0", "x/mb1", "f0/weights", "f0/mb0", "f0/mb1", "f1/weights", "f1/mb0", "f1/mb1",
                      "b1/mb0", "b1/mb1", "b1/accum1", "b0/mb0", "b0/mb1", "b0/accum1", "u0", "u1"]
    # copies: half the time and activation, no parameters; the weights node holds them once, resident
    f0 = node(d, "f0/mb1")
    assert (f0["compute_s"], f0["memory_bytes"], f0["resident_bytes"], f0["microbatch"], f0["origin"]) == \
        (2.0, 200, 0, 1, "f0")
    assert "colocation" not in f0 and node(d, "f0/weights")["colocation"] == "w0"
    w = node(d, "f0/weights")
    assert (w["memory_bytes"], w["resident_bytes"], w["pass"]) == (10, 10, "forward")
    # the gradient buffer: the first partial and each running sum hold it (the time rule sees one live)
    assert node(d, "b0/mb0")["memory_bytes"] == 8 and node(d, "b0/mb1")["memory_bytes"] == 0
    acc = node(d, "b0/accum1")
    assert (acc["op"], acc["memory_bytes"], acc["pass"], acc["microbatch"]) == ("accumulate_grad", 8, "backward", 1)
    assert acc["compute_s"] == pytest.approx(3 * 8 / COPY_BANDWIDTH_BPS)
    # the update reads the accumulated gradient, whole, under its name; once
    e = next(e for e in range(d.m) if d.ids[d.edge_dst[e]] == "u0")
    assert (d.ids[d.edge_src[e]], d.edge_bytes[e], d.tensor_name[d.edge_tensor[e]]) == ("b0/accum1", 8, "g")
    # activations between copies of one micro-batch are halved
    e = next(e for e in range(d.m) if (d.ids[d.edge_src[e]], d.ids[d.edge_dst[e]]) == ("f0/mb1", "f1/mb1"))
    assert d.edge_bytes[e] == 200


def test_weights_are_read_through_one_tensor_so_they_cross_once():
    g = layer_chain(2, params=1000, batch=4)
    d = microbatch_graph(g, 4)
    t = next(t for t in range(len(d.tensor_src)) if d.ids[d.tensor_src[t]] == "f0/weights")
    assert sorted(d.ids[x] for x in d.tensor_consumers()[t]) == [f"f0/mb{i}" for i in range(4)]
    assert d.tensor_bytes[t] == 1000


def test_totals_work_gradient_bytes_and_updates():
    g = layer_chain(3, tf=4.0, tb=8.0, tu=1.0, act=400, params=10, grad=8, batch=8)
    d = microbatch_graph(g, 4, overhead_s=0.0)
    acc = [v for v in range(d.n) if d.op[v] == "accumulate_grad"]
    # linear model, no overhead: the copies do exactly the original work; + (m-1) adds per gradient
    work = math.fsum(d.compute[v] for v in range(d.n) if v not in acc)
    assert work == pytest.approx(g.total_compute())
    assert len(acc) == 3 * 3 and math.fsum(d.compute[v] for v in acc) == pytest.approx(9 * 3 * 8 / 9e11)
    # one update per parameter, each reading the whole gradient once
    assert sorted(d.ids[v] for v in range(d.n) if d.op[v] == "optim.sgd") == ["u0", "u1", "u2"]
    into_updates = sum(d.edge_bytes[e] for e in range(d.m) if d.op[d.edge_dst[e]] == "optim.sgd")
    assert into_updates == 3 * 8 == d.meta["microbatch"]["gradient_bytes"]
    assert d.meta["microbatch"]["micro_batches"] == [2, 2, 2, 2]
    # activations are shared out, parameters held once: the static sum grows only by the m-1 running sums
    assert d.total_memory() == g.total_memory() + 3 * 3 * 8


def test_uneven_micro_batches_are_whole_samples():
    g = layer_chain(1, tf=10.0, act=1000, batch=10)
    d = microbatch_graph(g, 4, overhead_s=0.0)
    assert d.meta["microbatch"]["micro_batches"] == [3, 3, 2, 2]
    assert [d.compute[d.index[f"f0/mb{i}"]] for i in range(4)] == pytest.approx([3.0, 3.0, 2.0, 2.0])
    assert [d.memory[d.index[f"f0/mb{i}"]] for i in range(4)] == [300, 300, 200, 200]


def test_never_better_than_linear():
    line = {"batch": 8, "compute_s": [4.0, 0.5]}
    g = build("l", [{"id": "a", "compute_s": 8.0, "memory_bytes": 0, "batch_line": line},
                    {"id": "b", "compute_s": 8.0, "memory_bytes": 0}],
              [{"src": "a", "dst": "b", "bytes": 8}], meta={"batch_size": 8})
    d = microbatch_graph(g, 4, overhead_s=1e-3)
    # the Standard Evaluation line: 8 s * (4 + 0.5 * 2) / (4 + 0.5 * 8)
    assert d.compute[d.index["a/mb0"]] == pytest.approx(5.0)
    assert d.compute[d.index["b/mb0"]] == pytest.approx(2.0 + 1e-3)  # linear + one launch
    assert all(d.compute[v] >= 8.0 / 4 for v in range(d.n))


def test_refusals_are_one_line():
    g = layer_chain(1, batch=4)
    with pytest.raises(InvalidInput, match="cannot be split 5 ways"):
        microbatch_graph(g, 5)
    with pytest.raises(InvalidInput, match="m must be a whole number"):
        microbatch_graph(g, 0)
    bare = build("nb", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [])
    with pytest.raises(InvalidInput, match="declares no batch size.*micro-batching"):
        microbatch_graph(bare, 2)
    assert microbatch_graph(bare, 2, assume_batch=2).n == 2
    with pytest.raises(InvalidInput, match="uneven batch shares"):
        microbatch_graph(data_parallel_graph(layer_chain(1, batch=4), 2, shares=[0.25, 0.75]), 2)
    with pytest.raises(InvalidInput, match="replica batch of 2 samples cannot be split 4 ways"):
        microbatch_graph(data_parallel_graph(layer_chain(1, batch=4), 2), 4)


def test_one_micro_batch_is_the_graph_renamed():
    g = layer_chain(2, params=10, grad=8)
    d = microbatch_graph(g, 1)
    assert d.total_compute() == pytest.approx(g.total_compute())
    assert d.total_memory() == g.total_memory()
    assert not any(d.op[v] == "accumulate_grad" for v in range(d.n))


def test_accumulation_inside_data_parallelism():
    # microbatch of the data-parallel graph: each replica accumulates its micro-batches, the ring runs once
    g = layer_chain(2, act=400, params=10, grad=8, batch=8)
    dp = data_parallel_graph(g, 2, overhead_s=0.0)
    d = microbatch_graph(dp, 2, overhead_s=0.0)
    rings = [v for v in range(d.n) if "allreduce" in (d.node_extra[v] or {})]
    assert len(rings) == sum(1 for v in range(dp.n) if "allreduce" in (dp.node_extra[v] or {}))
    first = [v for v in rings if d.node_extra[v]["allreduce"]["phase"] == "all-reduce"]
    assert {d.op[u] for v in first for u in d.pred[v]} == {"accumulate_grad"}
    assert d.meta["microbatch"]["micro_batches"] == [2, 2]  # of one replica's 4 samples


def test_replicated_pipelines_and_the_cross_check_of_both_orders():
    g = layer_chain(2, act=400, params=10, grad=8, batch=8)
    a = microbatch_graph(data_parallel_graph(g, 2, overhead_s=0.0), 2, overhead_s=0.0)
    b = data_parallel_graph(microbatch_graph(g, 2, overhead_s=0.0), 2, overhead_s=0.0)
    # data parallelism of the micro-batched graph reduces the accumulated gradients; accumulation is not shared
    ring_inputs = {b.op[u] for v in range(b.n) if (b.node_extra[v] or {}).get("allreduce", {}).get("phase")
                   == "all-reduce" for u in b.pred[v]}
    assert ring_inputs == {"accumulate_grad"}
    acc = [v for v in range(b.n) if b.op[v] == "accumulate_grad"]
    assert all(b.compute[v] == pytest.approx(3 * 8 / 9e11) and b.memory[v] == 8 for v in acc)
    assert all(b.memory[b.index[f"f{i}/weights/rep{r}"]] == 10 for i in range(2) for r in range(2))
    # two code paths, one step: the same work, the same number of nodes of each kind, the same memory
    assert a.total_compute() == pytest.approx(b.total_compute())
    assert sorted(a.op) == sorted(b.op)
    assert a.total_memory() == b.total_memory()


def source_chain(batch: int = 8) -> Graph:
    """``f0 -> f1`` then ``b1 -> b0`` and the updates, the first layer a
    *source* that holds its parameters (the synthetic generator's and
    ``placer profile``'s first layer reads no graph input): ``f_i`` 4 s,
    400 activation + 10 parameter bytes; ``b_i`` 8 s."""
    d = layer_chain(2, act=400, params=10, grad=8, batch=batch).to_dict()
    d["nodes"] = [nd for nd in d["nodes"] if nd["id"] != "x"]
    d["edges"] = [e for e in d["edges"] if e["src"] != "x"]
    return Graph.from_dict(d, label="source_chain")


def test_data_parallelism_splits_the_micro_batches_of_a_source_layer():
    """Issue 33, D6: after micro-batching, ``f0/mb<i>`` reads its parameters
    from ``f0/weights`` and nothing else; it is still the copy of a source,
    so two strong replicas run half of its micro-batch each: 4 s x 4/8 x
    1/2 = 1 s and 400 x 1/4 = 100 activation bytes (weak scaling: the whole
    micro-batch, 2 s and 200 bytes), and so does everything after it."""
    g = source_chain()
    mb = microbatch_graph(g, 2, overhead_s=0.0)
    assert (mb.compute[mb.index["f0/mb0"]], mb.memory[mb.index["f0/mb0"]]) == (2.0, 200)
    strong = data_parallel_graph(mb, 2, overhead_s=0.0)
    weak = data_parallel_graph(mb, 2, overhead_s=0.0, scaling="weak")
    for nid, whole in (("f0/mb0", 2.0), ("f1/mb1", 2.0), ("b1/mb0", 4.0), ("b0/mb1", 4.0)):
        assert strong.compute[strong.index[f"{nid}/rep1"]] == whole / 2, nid
        assert weak.compute[weak.index[f"{nid}/rep1"]] == whole, nid
    assert strong.memory[strong.index["f0/mb1/rep0"]] == 100 and weak.memory[weak.index["f0/mb1/rep0"]] == 200
    # the parameters stay whole on every replica
    assert strong.memory[strong.index["f0/weights/rep1"]] == 10
    # both orders, one step: replicas of micro-batches = micro-batches of replicas
    other = microbatch_graph(data_parallel_graph(g, 2, overhead_s=0.0), 2, overhead_s=0.0)
    assert strong.total_compute() == pytest.approx(other.total_compute())
    assert strong.total_memory() == other.total_memory()


def test_micro_batches_of_a_split_source_layer_are_copied():
    """The batch split of the source layer ``f0`` reads its parameters from
    ``f0/weights`` and nothing else; its parts are still sources, so
    micro-batching copies them: 4 s x 1/2 x 1/2 = 1 s each."""
    from celeritas_cli.transform.splitting import split_operation

    doc = source_chain().to_dict()
    doc["nodes"][0]["splittable"] = ["batch"]
    s = split_operation(Graph.from_dict(doc, label="splittable"), "f0", "batch", 2, overhead_s=0.0)
    d = microbatch_graph(s, 2, overhead_s=0.0)
    assert [d.compute[d.index[f"f0/part{p}/mb{i}"]] for p in (0, 1) for i in (0, 1)] == [1.0] * 4
    assert "f0/part0" not in d.index and d.op[d.index["f0/weights"]] == "weights"


def test_strong_and_weak_scaling_differ_after_micro_batching():
    """The D6 reproducer's recipe (layered_60, 4 micro-batches, 2 replicas):
    strong replicas run half of each micro-batch, weak ones all of it."""
    from celeritas_cli.model.io import load_graph

    from ..conftest import SAMPLES

    g = load_graph(str(SAMPLES / "layered_60.json"))
    mb = microbatch_graph(g, 4)
    strong, weak = (data_parallel_graph(mb, 2, scaling=s) for s in ("strong", "weak"))
    first = g.ids[g.topo_order()[0]]
    assert not g.in_edges[g.index[first]] and g.node_extra[g.index[first]]["batch_independent"]["state_bytes"] > 0
    c = mb.compute[mb.index[f"{first}/mb0"]]
    assert strong.compute[strong.index[f"{first}/mb0/rep1"]] == pytest.approx(c / 2 + 2e-6)
    assert weak.compute[weak.index[f"{first}/mb0/rep1"]] == c
    assert strong.total_compute() < 0.9 * weak.total_compute()


def test_recipe_rebuilds_and_tampering_is_rejected():
    g = layer_chain(2, batch=4)
    d = microbatch_graph(g, 2)
    c = uniform(1)
    p = Placement.from_indices(d, c, [0] * d.n, algorithm="test")
    attach(p, g, d, [microbatch_step(2, 4, [2, 2], 2e-6)])
    carried = d.to_dict()  # what a file may carry as split_graph
    assert rebuild(g, p.derivation, carried).n == d.n
    assert simulate(g, c, p)["status"] == "OK"
    bad = {"steps": [{**p.derivation["steps"][0], "m": 4}]}
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].micro_batches: is \[2, 2\], graph 'chain2' "
                                           r"with m=4 gives \[1, 1, 1, 1\]"):
        rebuild(g, bad, carried)
    bad = {"steps": [{**p.derivation["steps"][0], "micro_batches": [3, 1]}]}
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].micro_batches: is \[3, 1\]"):
        rebuild(g, bad, carried)
    doc = dict(carried, nodes=[dict(nd) for nd in carried["nodes"]])
    doc["nodes"][ids(d).index("f0/mb1")]["compute_s"] = 0.0
    with pytest.raises(InvalidInput, match="split_graph node 'f0/mb1' does not derive .*compute_s is 0.0"):
        rebuild(g, p.derivation, doc)
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].m: missing"):
        derive(g, {"steps": [{"transform": "microbatch", "global_batch": 4, "micro_batches": [2, 2]}]})
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].m: must be an integer, got '2'"):
        derive(g, {"steps": [{**p.derivation["steps"][0], "m": "2"}]})


def test_declaring_graphs_stay_declaring():
    g = layer_chain(2, params=10, grad=8)
    d = microbatch_graph(g, 2)
    assert all("resident_bytes" in nd and "pass" in nd for nd in d.to_dict()["nodes"])
    bare = layer_chain(2, params=10, grad=8, passes=False, resident=False)
    d = microbatch_graph(bare, 2)
    assert not any("resident_bytes" in nd or "pass" in nd for nd in d.to_dict()["nodes"])


@pytest.mark.parametrize("make", [lambda: layer_chain(3, params=10, grad=8, batch=8),
                                  lambda: data_parallel_graph(layer_chain(2, params=10, grad=8, batch=8), 2),
                                  lambda: data_parallel_graph(layer_chain(2, grad=8, batch=8), 2, bucket_mb=1.0)])
def test_size_is_counted_before_building(make):
    from celeritas_cli.transform.microbatch import microbatch_size

    g = make()
    for m in (1, 2, 4):
        d = microbatch_graph(g, m)
        assert microbatch_size(g, m) == (d.n, d.m)


def test_size_of_a_zoo_graph():
    from celeritas_cli.model.io import load_graph
    from celeritas_cli.transform.microbatch import microbatch_size

    from ..conftest import SAMPLES

    g = load_graph(SAMPLES / "zoo" / "tensor_holography.json.gz")
    d = microbatch_graph(g, 3)
    assert microbatch_size(g, 3) == (d.n, d.m)
