"""The ``fsdp`` derivation (issue 23.3): ZeRO stages 1-3 / PyTorch FSDP as a
graph rewrite - hand-counted communication volumes (ZeRO section 7.2),
resident state per device, makespans and memory peaks of a two-unit chain
on two replicas by hand, units, the issue order, sizes counted before
building, and the recipe's forgery check."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeritas_cli import load_graph
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.memory import judge_memory
from celeritas_cli.sim.simulator import run_schedule, simulate
from celeritas_cli.transform.derivation import attach, derive, rebuild
from celeritas_cli.transform.fsdp import fsdp_graph, fsdp_step
from celeritas_cli.transform.fsdp_units import fsdp_plan, fsdp_size, unit_key
from celeritas_cli.transform.split_cost import COPY_BANDWIDTH_BPS

#: one ring step of the chain below: a 50-byte chunk at 25 B/s
STEP_S = 2.0
EPS = 3 * 50 / COPY_BANDWIDTH_BPS  # the add of a reduce-scatter step


def chain(batch: int = 4) -> Graph:
    """Two layers (units ``l.0``, ``l.1``) of a training step, the fp32 zoo
    layout: a forward op holds its 100 parameter bytes and forwards them to
    its backward op; Adam holds 200 bytes of state; gradients of 100 bytes;
    every op 2 s on the whole batch (1 s on a replica's half)."""
    def nd(i, m=0, r=0, p="forward", **kw):
        return {"id": i, "compute_s": 2.0, "memory_bytes": m, "resident_bytes": r, "pass": p, **kw}

    def holder(i, w):
        return nd(i, 140, 100, colocation=f"param:l.{i[1]}.w",
                  batch_independent={"memory_bytes": 100, "state_bytes": 100, "state_tensors": [w]})

    nodes = [nd("x", 40), holder("f0", "w0"), holder("f1", "w1"),
             nd("b1", 140, 0, "backward", op="aten.mm_backward"), nd("b0", 100, 0, "backward", op="aten.mm_backward"),
             nd("u0", 200, 200, "update", op="optim.adam", colocation="param:l.0.w"),
             nd("u1", 200, 200, "update", op="optim.adam", colocation="param:l.1.w")]

    def e(s, d, b, t):
        return {"src": s, "dst": d, "bytes": b, "tensor": t}

    edges = [e("x", "f0", 40, "out"), e("f0", "f1", 40, "out"), e("f1", "b1", 40, "out"), e("f1", "b1", 100, "w1"),
             e("f0", "b0", 40, "out"), e("f0", "b0", 100, "w0"), e("b1", "b0", 40, "dx"),
             e("b1", "u1", 100, "g1"), e("b0", "u0", 100, "g0")]
    return build("chain", nodes, edges, meta={"batch_size": batch})


def cluster():
    return uniform(2, bandwidth=25.0, latency=0.0)


def sent_by_replica(d: Graph) -> list[int]:
    """Bytes each replica sends: the edges between replicas, by the sender."""
    out = [0] * d.meta["fsdp"]["replicas"]
    for e in range(d.m):
        a, b = (d.node_extra[d.edge_src[e]]["replica"], d.node_extra[d.edge_dst[e]]["replica"])
        if a != b:
            out[a] += d.edge_bytes[e]
    return out


def resident_by_replica(d: Graph) -> list[int]:
    out = [0] * d.meta["fsdp"]["replicas"]
    for v in range(d.n):
        out[d.node_extra[v]["replica"]] += d.node_extra[v]["resident_bytes"]
    return out


@pytest.mark.parametrize("stage,factor", [(1, 2), (2, 2), (3, 3)])
def test_bytes_sent_per_device_are_zero_s_volumes(stage, factor):
    """ZeRO 7.2: stages 1-2 send 2 x the gradient volume (reduce-scatter of
    gradients + all-gather of updated parameters), stage 3 3 x (+ the
    parameters gathered again for the backward), each ``(k-1)/k`` of it per
    device; counted on the graph's edges, in the graph's meta and in the
    simulator's transfers (three independent counts)."""
    g = chain()
    d = fsdp_graph(g, 2, stage, overhead_s=0.0, collectives="ring")
    gradient_volume = 200
    expected = factor * gradient_volume // 2
    assert sent_by_replica(d) == [expected, expected]
    assert d.meta["fsdp"]["bytes_per_device"] == expected
    sched = run_schedule(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)])
    assert [sum(tr.nbytes for tr in sched.transfers if tr.src_dev == q) for q in (0, 1)] == [expected, expected]
    # four replicas: (k-1)/k of the volume
    assert fsdp_graph(g, 4, stage).meta["fsdp"]["bytes_per_device"] == factor * gradient_volume * 3 // 4
    # the nccl form: no edge between replicas, the same volume in the meta
    nccl = fsdp_graph(g, 2, stage, overhead_s=0.0)
    assert sent_by_replica(nccl) == [0, 0] and nccl.meta["fsdp"]["bytes_per_device"] == expected


@pytest.mark.parametrize("stage,resident", [(1, 400), (2, 400), (3, 300)])
def test_resident_state_per_device(stage, resident):
    """Parameters 2 x 100 and Adam state 2 x 200 bytes: stages 1-2 keep the
    parameters whole and shard the optimizer state (200 + 400 / 2); stage 3
    shards everything: 1/k of the 600 bytes of state."""
    d = fsdp_graph(chain(), 2, stage, collectives="ring")
    assert resident_by_replica(d) == [resident, resident]
    assert resident_by_replica(fsdp_graph(chain(), 2, stage)) == [resident, resident]  # nccl: 100 / 2 as well
    whole = sum(chain().node_extra[v]["resident_bytes"] for v in range(7))
    assert whole == 600
    if stage == 3:
        # three ways: each Adam shard ceil(200 / 3) = 67; a unit's flat shard is a ring chunk (34, 33, 33),
        # replica q holding chunk (q + 1) mod 3
        assert resident_by_replica(fsdp_graph(chain(batch=6), 3, 3, collectives="ring")) == \
            [2 * 67 + 2 * 33, 2 * 67 + 2 * 33, 2 * 67 + 2 * 34]
        # nccl: FSDP pads the flat parameter to a multiple of k, every shard ceil(100 / 3) = 34
        assert resident_by_replica(fsdp_graph(chain(batch=6), 3, 3)) == [2 * 67 + 2 * 34] * 3


def test_structure_of_stage_3():
    d = fsdp_graph(chain(), 2, 3, overhead_s=0.0, collectives="ring")
    node = {d.ids[v]: d.to_dict()["nodes"][v] for v in range(d.n)}
    f0, shard, gathered = node["f0/rep1"], node["fsdp/u0/shard/rep1"], node["fsdp/u0/fwd/rep1"]
    # the holder keeps only its activation; its parameters are the unit's shard, gathered before use
    assert (f0["compute_s"], f0["memory_bytes"], f0["resident_bytes"]) == (1.0, 20, 0)
    assert (shard["memory_bytes"], shard["resident_bytes"]) == (50, 50)
    assert (gathered["op"], gathered["memory_bytes"], gathered["resident_bytes"], gathered["pass"]) == \
        ("fsdp.gathered", 100, 0, "forward")
    assert gathered["fsdp"] == {"unit": 0, "name": "l.0", "for": "forward", "phase": "gathered", "bytes": 100}
    u0 = node["u0/rep0"]
    assert (u0["compute_s"], u0["memory_bytes"], u0["resident_bytes"]) == (1.0, 100, 100)
    ins = {(d.ids[d.edge_src[e]], d.tensor_name[d.edge_tensor[e]], d.edge_bytes[e])
           for e in range(d.m) if d.ids[d.edge_dst[e]] == "b0/rep0"}
    assert ("fsdp/u0/bwd/rep0", "f0/w0", 100) in ins  # the backward reads the parameters gathered again
    assert d.meta["fsdp"]["replica_batch"] == 2 and d.meta["batch_size"] == 4
    assert fsdp_plan(chain(), 3).sequence == [("fwd", 0), ("fwd", 1), ("bwd", 1), ("bwd", 0), ("rs", 1), ("rs", 0)]


def test_makespan_of_the_chain_by_hand():
    """One ring step is one 50-byte chunk, 2 s; every op 1 s on a replica.

    Stage 3: the collectives run in FSDP's issue order, one after the
    other, and the compute waits for them: fwd gathers of l.0 [0, 2] and
    l.1 [2, 4] (f0 [2, 3], f1 [4, 5]), bwd gathers of l.1 [4, 6] (b1
    [6, 7]) and l.0 [6, 8] (prefetched before l.1's reduce-scatter; b0
    [8, 9]), reduce-scatters of l.1 [8, 10] (u1 [10, 11]) and l.0 [10, 12]
    (u0 [12, 13]): 13 s.  Stages 1-2: x, f0, f1, b1 [3, 4], b0 [4, 5];
    reduce-scatter of l.1 [4, 6] then l.0 [6, 8]; u1 [6, 7], u0 [8, 9];
    all-gathers of the updated l.1 [8, 10] and l.0 [10, 12]: 12 s."""
    g = chain()
    for stage, makespan in ((1, 12.0), (2, 12.0), (3, 13.0)):
        d = fsdp_graph(g, 2, stage, overhead_s=0.0, collectives="ring")
        s = run_schedule(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)])
        assert s.makespan == pytest.approx(makespan + 2 * EPS, abs=1e-12), stage
        start = {d.ids[v]: s.start[v] for v in range(d.n)}
        if stage == 3:
            assert [start[f"{x}/rep0"] for x in ("f0", "f1", "b1", "b0", "u1", "u0")] == \
                pytest.approx([2, 4, 6, 8, 10, 12 + EPS])
    # one replica: the model itself (no collective), every op 2 s in a chain of 7
    one = fsdp_graph(g, 1, 3)
    assert one.n == g.n and run_schedule(one, cluster(), [0] * one.n).makespan == pytest.approx(14.0)


def test_memory_peaks_by_hand():
    """Peaks of replica 0 under the time rule (the schedule above).

    Stage 3 at t = 8: shards 50 + 50, Adam shards 100 + 100; f0's output
    (20, read by b0), b1 (120: its gradient and dx, read by b0), b0 (100),
    the gathered l.0 for the backward (100), l.1's flat gradient in its
    reduce-scatter (100) and the chunk it receives (50): 790 - a gathered
    unit is live at the peak.  Stage 1 keeps the full gradient until the
    update: at t = 6, parameters 200 + Adam shards 200, b1 120 (until u1),
    b0 100 (until u0), l.1's gradient shard 50, l.0's flat gradient 100 and
    its received chunk 50: 820.  Stage 2 frees it after the reduce-scatter:
    790 at t = 4."""
    g = chain()
    for stage, peak, at in ((1, 820, 6.0), (2, 790, 4.0), (3, 790, 8.0)):
        d = fsdp_graph(g, 2, stage, overhead_s=0.0, collectives="ring")
        s = run_schedule(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)])
        prof = judge_memory(d, s, 2)
        assert prof.peak == [peak, peak], stage
        assert prof.peak_at[0] == pytest.approx(at, abs=1e-9)
        if stage == 3:
            assert {"node": "fsdp/u0/bwd/rep0", "bytes": 100, "kind": "activation"} in prof.live[0]
    # the static rule charges every gathered unit for the whole step
    d = fsdp_graph(g, 2, 3, overhead_s=0.0, collectives="ring")
    assert judge_memory(d, run_schedule(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)]), 2,
                        "static").peak[0] > 790


def test_resident_gradient_buffers_are_sharded_from_stage_2():
    """The synthetic generator keeps a layer's parameters, gradient buffer
    and two Adam moments on the layer (4 x its parameters, resident):
    stage 1 shards the moments, stage 2 also the gradient buffer, stage 3
    everything."""
    g = layered(8, seed=1)
    plan = fsdp_plan(g, 1)
    v = g.index["convolution_0"]
    p = plan.params[v]
    assert (plan.params[v], plan.grad_buf[v], plan.optim[v]) == (p, p, 2 * p)
    mem = {s: fsdp_graph(g, 2, s).node_extra for s in (1, 2, 3)}
    res = {s: sum(ex["resident_bytes"] for ex in mem[s]) for s in mem}
    total = sum(ex["resident_bytes"] for ex in g.node_extra)
    assert res[1] > res[2] > res[3] and res[3] <= total + 2 * len(fsdp_plan(g, 3).units)


def test_a_holder_without_inputs_gathers_its_parameters_not_its_batch_shaped_output():
    """The zoo nmt's LSTM ``h0 @ W_hh`` (issue 33, J2): a node with no graph
    inputs that holds W (100 bytes, forwarded as tensor ``W`` to its
    backward) and outputs a 40-byte batch-shaped tensor.  Only W is
    gathered (100 bytes, not 140), and the node runs on its replica's half
    of the batch: 2 s -> 1 s, its output 40 -> 20 bytes."""
    def nd(i, p="forward", **kw):
        return {"id": i, "compute_s": 2.0, "memory_bytes": 0, "resident_bytes": 0, "pass": p, **kw}

    g = build("h0w", [nd("h", memory_bytes=140, resident_bytes=100, colocation="param:l.0.w",
                         batch_independent={"memory_bytes": 140, "state_bytes": 100, "state_tensors": ["W"]}),
                      nd("f", memory_bytes=40), nd("b", "backward", op="aten.mm_backward"),
                      nd("u", "update", op="optim.sgd", colocation="param:l.0.w")],
              [{"src": "h", "dst": "f", "bytes": 40, "tensor": "out"},
               {"src": "h", "dst": "b", "bytes": 100, "tensor": "W"},
               {"src": "f", "dst": "b", "bytes": 40, "tensor": "y"},
               {"src": "b", "dst": "u", "bytes": 100, "tensor": "g"}], meta={"batch_size": 4})
    plan = fsdp_plan(g, 3)
    assert [u.gather_bytes for u in plan.units] == [100] and not plan.source[g.index["h"]]
    d = fsdp_graph(g, 2, 3, overhead_s=0.0, collectives="ring")
    assert d.meta["fsdp"]["gather_bytes"] == 100
    h = d.index["h/rep0"]
    assert d.compute[h] == 1.0
    assert {(d.ids[d.edge_dst[e]], d.edge_bytes[e]) for e in d.out_edges[h]} == {("f/rep0", 20)}
    assert ("fsdp/u0/bwd/rep0", "b/rep0", 100) in {(d.ids[d.edge_src[e]], d.ids[d.edge_dst[e]], d.edge_bytes[e])
                                                  for e in range(d.m)}
    assert sent_by_replica(d) == [3 * 100 // 2] * 2  # forward + backward gathers and the reduce-scatter


def test_buffers_are_neither_sharded_nor_gathered():
    """A BatchNorm holder's ``state_bytes`` (300) are its weight (100, what
    the update's gradient says) and its running statistics (200, buffers):
    FSDP flattens parameters only, so 100 bytes are gathered and sharded and
    the 200 stay whole on every replica."""
    def nd(i, p="forward", **kw):
        return {"id": i, "compute_s": 1.0, "memory_bytes": 0, "resident_bytes": 0, "pass": p, **kw}

    g = build("bn", [nd("x", memory_bytes=40),
                     nd("n", memory_bytes=340, resident_bytes=300, colocation="param:bn.weight",
                        batch_independent={"memory_bytes": 300, "state_bytes": 300, "state_tensors": ["w", "rm"]}),
                     nd("b", "backward", op="aten.native_batch_norm_backward"),
                     nd("u", "update", op="optim.sgd", colocation="param:bn.weight")],
              [{"src": "x", "dst": "n", "bytes": 40}, {"src": "n", "dst": "b", "bytes": 40, "tensor": "y"},
               {"src": "n", "dst": "b", "bytes": 100, "tensor": "w"},
               {"src": "n", "dst": "b", "bytes": 100, "tensor": "rm"},
               {"src": "b", "dst": "u", "bytes": 100, "tensor": "g"}], meta={"batch_size": 4})
    plan = fsdp_plan(g, 3)
    v = g.index["n"]
    assert (plan.params[v], plan.buffers[v], plan.units[0].gather_bytes) == (100, 200, 100)
    d = fsdp_graph(g, 2, 3)
    assert d.node_extra[d.index["n/rep1"]]["resident_bytes"] == 200
    assert resident_by_replica(d) == [250, 250]  # the buffers and half the parameters


ZOO = sorted((Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo").glob("*.json.gz"))


def zoo_name(path: Path) -> str:
    return path.name.removesuffix(".json.gz")

#: zoo graphs whose stage-3 graph the default suite builds (the rest: -m slow)
ZOO_BUILT = ("resnet50", "transformer")


def gathered_parameter_bytes(g: Graph) -> int:
    """The model's parameters in the dtype FSDP gathers them: the profiler's
    ``meta.parameter_bytes`` (fp32 masters), less what each cast of a master
    weight to its half working copy saves (``placer profile --precision
    bf16``: a source ``aten._to_copy`` whose ``output_bytes`` are half its
    ``state_bytes``)."""
    saved = sum(ex["batch_independent"]["state_bytes"] - ex["output_bytes"]
                for v, ex in enumerate(g.node_extra) if g.op[v] == "aten._to_copy" and not g.in_edges[v])
    return g.meta["parameter_bytes"] - saved


@pytest.mark.parametrize("path", ZOO, ids=zoo_name)
def test_fsdp_units_gather_the_parameters_of_every_zoo_graph(path):
    """Issue 33, J2: the units gather exactly the model's parameters (in the
    dtype their readers use) and reduce-scatter exactly their gradients:
    no activation (nmt's ``h0 @ W_hh``, transformer's position embedding
    output) and no buffer (BatchNorm's running statistics) is gathered."""
    g = load_graph(path)
    plan = fsdp_plan(g, 3)
    assert sum(u.gather_bytes for u in plan.units) == gathered_parameter_bytes(g)
    assert sum(u.grad_bytes for u in plan.units) == g.meta["parameter_bytes"]


@pytest.mark.parametrize("path", [p if zoo_name(p) in ZOO_BUILT else pytest.param(p, marks=pytest.mark.slow)
                                  for p in ZOO], ids=zoo_name)
def test_fsdp_sends_the_parameters_twice_per_step_on_every_zoo_graph(path):
    """Stage 3 over two replicas, counted on the derived graph's edges (no
    simulation): the ring all-gathers send each replica's half of the
    parameters, once for the forward and once for the backward (FSDP
    section 3.2.1), so 2 x the parameter bytes cross between the replicas."""
    g = load_graph(path)
    d = fsdp_graph(g, 2, 3, collectives="ring")
    sent = sum(d.edge_bytes[e] for e in range(d.m)
               if d.node_extra[d.edge_src[e]]["replica"] != d.node_extra[d.edge_dst[e]]["replica"]
               and d.node_extra[d.edge_dst[e]].get("fsdp", {}).get("phase") == "all-gather")
    assert sent == 2 * gathered_parameter_bytes(g)


def test_units_by_module_and_by_size():
    assert [unit_key(x) for x in ("param:blocks.0.attn.qkv.weight", "param:encoder.11.ff.w", "param:wte.weight",
                                  "param:ln_f.bias", "w:conv_1", "param:bias")] == \
        ["blocks.0", "encoder.11", "wte", "ln_f", None, "bias"]
    g = chain()
    assert [u.name for u in fsdp_plan(g, 3).units] == ["l.0", "l.1"]
    assert [u.name for u in fsdp_plan(g, 3, unit_mb=1.0).units] == ["unit0"]  # 200 bytes < 1 MiB: one unit
    d = fsdp_graph(g, 2, 3, unit_mb=1e-4)  # 105 bytes: l.0 (100) then l.1 joins it
    assert [u["name"] for u in d.meta["fsdp"]["units"]] == ["unit0"]
    assert d.meta["fsdp"]["bytes_per_device"] == 3 * 200 // 2


def test_a_tied_parameter_stays_gathered_and_the_graph_is_acyclic():
    """The embedding of unit ``e`` is read again at the end of the forward
    (a tied LM head): its forward gather lives until then, and the rate
    limiter does not wait for that late read (it would close a cycle)."""
    def nd(i, p="forward", **kw):
        return {"id": i, "compute_s": 1.0, "memory_bytes": 10, "resident_bytes": 0, "pass": p, **kw}

    nodes = [nd("x"), {**nd("emb", colocation="param:e.w"), "resident_bytes": 10,
                       "batch_independent": {"memory_bytes": 10, "state_bytes": 10, "state_tensors": ["w"]}}]
    edges = [{"src": "x", "dst": "emb", "bytes": 1}]
    prev = "emb"
    for i in range(3):
        nodes.append({**nd(f"h{i}", colocation=f"param:h.{i}.w"), "resident_bytes": 10,
                      "batch_independent": {"memory_bytes": 10, "state_bytes": 10}})
        edges.append({"src": prev, "dst": f"h{i}", "bytes": 1, "tensor": "out"})
        prev = f"h{i}"
    nodes += [nd("head"), nd("dhead", "backward", op="aten.mm_backward"),
              {**nd("u", "update", op="optim.sgd", colocation="param:e.w")}]
    edges += [{"src": prev, "dst": "head", "bytes": 1, "tensor": "out"},
              {"src": "emb", "dst": "head", "bytes": 10, "tensor": "w"},
              {"src": "head", "dst": "dhead", "bytes": 1}, {"src": "emb", "dst": "dhead", "bytes": 10, "tensor": "w"},
              {"src": "dhead", "dst": "u", "bytes": 10, "tensor": "g"}]
    g = build("tied", nodes, edges, meta={"batch_size": 2})
    d = fsdp_graph(g, 2, 3)  # builds: no cycle
    fwd = [d.ids[d.edge_dst[e]] for e in range(d.m) if d.ids[d.edge_src[e]] == "fsdp/u0/fwd/rep0"]
    assert {"emb/rep0", "head/rep0"} <= set(fwd)
    s = run_schedule(d, uniform(2), [d.node_extra[v]["replica"] for v in range(d.n)])
    assert s.makespan > 0


def test_recomputed_forward_reads_the_backward_gather():
    """Activation checkpointing under FSDP: a recompute clone of a layer runs
    in the backward with the parameters gathered for the backward, so the
    forward gather dies with the forward (and the graph stays acyclic)."""
    from celeritas_cli.transform.recompute import recompute_graph

    g = recompute_graph(chain(), ["f0", "f1"])
    d = fsdp_graph(g, 2, 3)
    reads = {(d.ids[d.edge_src[e]], d.ids[d.edge_dst[e]]) for e in range(d.m)}
    assert ("fsdp/u1/bwd/rep0", "f1/recompute/rep0") in reads and ("fsdp/u1/fwd/rep0", "f1/rep0") in reads
    assert not any(src.startswith("fsdp/u1/fwd/rep0") and "recompute" in dst for src, dst in reads)
    s = run_schedule(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)])
    start = {d.ids[v]: s.start[v] for v in range(d.n)}
    assert start["f1/recompute/rep0"] >= s.finish[d.index["fsdp/u1/bwd/rep0"]] > start["f1/rep0"]


def test_whole_samples_and_refusals():
    g = chain(batch=5)
    assert fsdp_graph(g, 2, 3).meta["fsdp"]["replica_batch"] == [3, 2]
    uneven = fsdp_graph(chain(), 2, 3, samples=[1, 3], overhead_s=0.0)
    assert uneven.meta["fsdp"]["replica_batch"] == [1, 3]
    assert [uneven.compute[uneven.index[f"x/rep{r}"]] for r in (0, 1)] == [0.5, 1.5]  # 2 s x 1/4, x 3/4
    with pytest.raises(InvalidInput, match="cannot be split 6 ways"):
        fsdp_graph(g, 6, 3)
    nobatch = Graph.from_dict({**chain().to_dict(), "meta": {}})
    with pytest.raises(InvalidInput, match="declares no batch size"):
        fsdp_graph(nobatch, 2, 3)
    assert fsdp_graph(nobatch, 2, 3, assume_batch=4).meta["batch_size"] == 4
    with pytest.raises(InvalidInput, match="stage must be 1, 2 or 3"):
        fsdp_graph(chain(), 2, 4)
    with pytest.raises(InvalidInput, match="already sharded"):
        fsdp_graph(fsdp_graph(chain(), 2, 3), 2, 3)
    with pytest.raises(InvalidInput, match="unit_mb"):
        fsdp_graph(chain(), 2, 3, unit_mb=-1.0)


@pytest.mark.parametrize("form", ["nccl", "ring"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_size_is_counted_before_building(k, stage, form):
    for g in (chain(batch=6), layered(30, seed=2)):
        d = fsdp_graph(g, k, stage, collectives=form)
        assert fsdp_size(g, fsdp_plan(g, stage), k, form) == (d.n, d.m)
        if form == "nccl":
            one = fsdp_graph(g, k, stage, represent=[k - 1])
            assert fsdp_size(g, fsdp_plan(g, stage), k, form, 1) == (one.n, one.m)


def test_recipe_rebuild_and_forgery():
    g = chain()
    d = fsdp_graph(g, 2, 3, overhead_s=0.0, collectives="ring")
    recipe = {"steps": [fsdp_step(2, 3, 4, 0.0, collectives="ring")]}
    assert derive(g, recipe).to_dict() == d.to_dict()
    doc = d.to_dict()
    assert rebuild(g, recipe, doc).n == d.n
    p = Placement.from_indices(d, cluster(), [d.node_extra[v]["replica"] for v in range(d.n)], algorithm="fsdp")
    attach(p, g, d, recipe["steps"])
    assert simulate(g, cluster(), p)["makespan_s"] == pytest.approx(13.0 + 2 * EPS)
    # a carried graph that claims less memory for the gathered unit is rejected
    forged = d.to_dict()
    forged["nodes"][d.index["fsdp/u0/fwd/rep0"]]["memory_bytes"] = 0
    with pytest.raises(InvalidInput, match="fsdp/u0/fwd/rep0.*memory_bytes is 0"):
        rebuild(g, recipe, forged, "p.json")
    # the carried graph of stage 3 is not what a stage-1 recipe gives
    with pytest.raises(InvalidInput, match="does not derive"):
        rebuild(g, {"steps": [fsdp_step(2, 1, 4, 0.0, collectives="ring")]}, doc, "p.json")
    # the nccl form is another graph: a carried ring graph does not derive from an nccl recipe
    with pytest.raises(InvalidInput, match="does not derive"):
        rebuild(g, {"steps": [fsdp_step(2, 3, 4, 0.0)]}, doc, "p.json")


@pytest.mark.parametrize("change,message", [
    ({"global_batch": 8}, r"field derivation.steps\[0\].global_batch: the placement was made for a batch of 8 "
                          r"samples, graph 'chain' holds costs for 4"),
    ({"stage": 5}, r"field derivation.steps\[0\].stage: must be 1..3, got 5"),
    ({"stage": "3"}, r"stage: must be an integer, got '3'"),
    ({"replicas": 8}, r"field derivation.steps\[0\].replicas: 8 replicas need 8 samples at least"),
    ({"unit_mb": -2.0}, r"unit_mb: must be 0..1048576, got -2"),
    ({"replicas": True}, r"replicas: must be an integer, got True"),
    ({"samples": [3, 3]}, r"samples: must be 2 whole numbers of samples >= 1 summing to the batch of 4"),
    ({"samples": [4, 0]}, r"samples\[1\]: must be an integer of at least 1, got 0"),
    ({"samples": "2,2"}, r"samples: must be a list of integers"),
    ({"bogus": 1}, r"bogus: not a field of a fsdp step"),
    ({"collectives": "tree"}, r"field derivation.steps\[0\].collectives: must be one of"),
])
def test_tampered_recipe_is_refused_in_one_line(change, message):
    step = {**fsdp_step(2, 3, 4, 0.0), **change}
    with pytest.raises(InvalidInput, match=message) as err:
        derive(chain(), {"steps": [step]}, "p.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("p.json: ")


def test_recipe_refused_after_other_rewrites_and_over_the_budget():
    from celeritas_cli.transform.replicate import data_parallel_graph
    from celeritas_cli.transform.size import derived_budget

    dp = {"transform": "data-parallel", "replicas": 2, "global_batch": 4}
    with pytest.raises(InvalidInput, match=r"steps\[1\] \(fsdp\): graph 'chain\+dp2' is already data-parallel"):
        derive(chain(), {"steps": [dp, fsdp_step(2, 3, 4, 0.0)]}, "p.json")
    with pytest.raises(InvalidInput, match=r"steps\[1\] \(data-parallel\).*already data-parallel"):
        derive(chain(), {"steps": [fsdp_step(2, 3, 4, 0.0), dp]}, "p.json")
    mb = {"transform": "microbatch", "m": 2, "global_batch": 4, "micro_batches": [1, 1]}
    with pytest.raises(InvalidInput, match="sharded \\(fsdp\\): gradient accumulation under FSDP is not modelled"):
        derive(chain(), {"steps": [fsdp_step(2, 3, 4, 0.0), mb]}, "p.json")
    with pytest.raises(InvalidInput, match="replicas: 4 is more than the 2 devices"):
        derive(chain(), {"steps": [fsdp_step(4, 3, 4, 0.0)]}, "p.json", devices=2)
    size = fsdp_size(chain(), fsdp_plan(chain(), 3), 2)
    with derived_budget(size[0] - 1), pytest.raises(InvalidInput, match="over the budget.*larger units"):
        derive(chain(), {"steps": [fsdp_step(2, 3, 4, 0.0)]}, "p.json")
    with derived_budget(size[0] - 1), pytest.raises(InvalidInput, match="over the budget"):
        fsdp_graph(chain(), 2, 3)
    assert data_parallel_graph  # imported for the composition above


_VALUES = st.one_of(st.integers(-3, 9), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=3), st.booleans(), st.none(), st.lists(st.integers(-1, 4), max_size=4))
_FIELDS = ("replicas", "stage", "global_batch", "overhead_s", "unit_mb", "samples", "assume_batch", "collectives", "x")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=3), st.booleans())
def test_any_forged_fsdp_step_builds_or_is_refused_in_one_line(change, drop):
    """Whatever a file puts in an fsdp step: a graph, or one line naming the file."""
    step = {**fsdp_step(2, 3, 4, 0.0), **change}
    if drop:
        step.pop("stage", None)
    try:
        d = derive(chain(), {"steps": [step]}, "p.json", devices=4)
    except InvalidInput as exc:
        assert "\n" not in str(exc) and str(exc).startswith("p.json: ")
        return
    assert d.meta["fsdp"]["replicas"] == step["replicas"]
