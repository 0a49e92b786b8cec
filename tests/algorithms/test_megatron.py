"""``megatron``: Megatron-LM's hand configuration as a row (issue 35.2-3).

The tiny one-layer GPT of tests/transform/test_tensor_parallel.py (batch 8
here) on 2 servers of 4 A100s: the plan's devices, orders, collective
groups and bytes by hand, the simulator's verdict reproduced by ``placer
simulate`` (symmetric and full), the refusals and the words.
"""

from __future__ import annotations

import json

import pytest

from tests.sim.test_symmetric import _same  # the symmetric judge against the full simulation

from celeritas_cli import registry
from celeritas_cli.algorithms.pipelines.megatron import device_of_rank, layer_checkpoints, megatron, selective_nodes
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.graph import Graph
from celeritas_cli.model.servers import make_doc
from celeritas_cli.sim.describe import Context, describe, describe_placement
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import derive

from ..transform.test_tensor_parallel import R, H, tiny_gpt

REL = 1e-9
BATCH = 8


def gpt8() -> Graph:
    """The tiny GPT costed at a batch of 8 (its costs as they are)."""
    doc = tiny_gpt().to_dict()
    doc["meta"]["batch_size"] = BATCH
    return Graph.from_dict(doc, label="tiny_gpt")


def servers(n: int = 2, gpus: int = 4) -> Cluster:
    return Cluster.from_dict(make_doc(name=f"{n}x{gpus}", servers=n, gpus_per_server=gpus, gpu="A100-80GB",
                                      intra="nvswitch", inter="ib-hdr-200", nics=gpus))


@pytest.fixture(scope="module")
def g():
    return gpt8()


@pytest.fixture(scope="module")
def cl():
    return servers()


@pytest.fixture(scope="module")
def plan(g, cl):
    return registry.place(g, cl, "megatron", params={"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 2})


def _full_graph(g: Graph, cl: Cluster, p) -> Graph:
    return derive(g, p.derivation, "test", devices=cl.k, cluster=cl.name)


def _full_assignment(p, cl):
    from celeritas_cli.sim.symmetric import expand
    return expand(None, cl, p)


# ------------------------------------------------------------------ the plan
def test_tp2_pp2_dp2_is_feasible_and_its_recipe(plan):
    est = plan.estimate
    assert est["status"] == "FEASIBLE" and est["makespan_by"] == "simulator"
    assert [s["transform"] for s in plan.derivation["steps"]] == ["tensor-parallel", "microbatch", "data-parallel"]
    tp_step, mb_step, dp_step = plan.derivation["steps"]
    assert tp_step == {"transform": "tensor-parallel", "tp": 2, "sequence_parallel": False}
    # global 8 = micro_batch_size 2 x dp 2 x 2 micro-batches; each micro-batch of 4 split over 2 replicas
    assert mb_step["m"] == 2 and mb_step["micro_batches"] == [4, 4] and mb_step["schedule"] == "1f1b"
    assert dp_step["replicas"] == 2
    assert est["microbatches"] == 2 and (est["tp"], est["pp"], est["dp"]) == (2, 2, 2)
    # replica r of pipeline rank p, tensor rank t on GPU t + 2 (r + 2 p): stage 0 on server 0, stage 1 on server 1
    # the tensor ranks are judged as kinds: the placement lists tensor rank 0 of replica 0, and rank t's GPUs
    assert plan.replicas == {"devices": [["s0gpu0", "s0gpu1", "s1gpu0", "s1gpu1"],
                                         ["s0gpu2", "s0gpu3", "s1gpu2", "s1gpu3"]],
                             "tensor": [["s0gpu0", "s1gpu0"], ["s0gpu1", "s1gpu1"]]}
    assert all("/tp0/" in nid for nid in plan.assignment) and sorted(plan.order) == ["s0gpu0", "s1gpu0"]


def test_device_of_rank_is_megatron_order():
    assert [device_of_rank(t, r, p, 2, 4) for p in range(2) for r in range(4) for t in range(2)] == list(range(16))


def test_tensor_ranks_on_consecutive_gpus_of_one_server(g, cl, plan):
    """Every tensor-parallel group (all replicas expanded) has its `ranks` members on distinct, consecutive GPUs of
    one server, one group per micro-batch and replica; a node of rank t runs on GPU t of its stage's pair."""
    full = _full_graph(g, cl, plan)
    where = _full_assignment(plan, cl).assignment
    groups: dict[str, list[str]] = {}
    for x in range(full.n):
        c = (full.node_extra[x] or {}).get("collective")
        if c is not None and c["group"].startswith("tp:"):
            groups.setdefault(c["group"], []).append(where[full.ids[x]])
    assert groups and all("/mb" in name and "/rep" in name for name in groups)
    for name, devs in groups.items():
        idx = sorted(cl.index[d] for d in devs)
        assert len(idx) == 2 and idx[1] == idx[0] + 1 and idx[0] % 2 == 0, name
        assert len({cl.servers.server_of[i] for i in idx}) == 1
    # 2 micro-batches x 2 replicas of every tensor-parallel collective of the one-layer GPT
    per = full.meta["tensor_parallel"]["collectives"]
    assert len(groups) == sum(per.values()) * 2 * 2
    for x in range(full.n):
        t = (full.node_extra[x] or {}).get("tp_rank")
        if t is not None:
            assert cl.index[where[full.ids[x]]] % 2 == t


def test_collective_bytes_are_the_micro_batch_share(g, cl, plan):
    """The embedding's all-reduce: R x H bf16 for the batch of 8 (64 bytes); a micro-batch of 4 samples split over
    2 replicas carries 2 samples: 16 bytes, in its own group per micro-batch and replica."""
    full = _full_graph(g, cl, plan)
    emb = {full.node_extra[x]["collective"]["group"]: full.node_extra[x]["collective"]
           for x in range(full.n) if full.ids[x].startswith("emb/all-reduce0/")}
    assert sorted(emb) == [f"tp:emb/all-reduce0/mb{i}/rep{r}" for i in range(2) for r in range(2)]
    assert {c["bytes"] for c in emb.values()} == {R * H * 2 // 4} and {c["ranks"] for c in emb.values()} == {2}
    # the gradient all-reduces are over the 2 replicas, one per gradient of each tensor rank
    dpc = [full.node_extra[x]["collective"] for x in range(full.n)
           if (full.node_extra[x] or {}).get("collective", {}).get("group", "tp:").startswith("tp:") is False]
    assert dpc and {c["ranks"] for c in dpc} == {2}


def test_each_tensor_rank_follows_its_stage_order(cl, plan):
    """Both ranks of a stage run the same blocks in the same order (rank 1's order is rank 0's, renamed)."""
    order = _full_assignment(plan, cl).order
    for a, b in (("s0gpu0", "s0gpu1"), ("s1gpu0", "s1gpu1")):
        assert order[a] and [x.replace("/tp0", "/tp1") for x in order[a]] == order[b]


def test_simulate_reproduces_the_estimate_and_full_equals_symmetric(g, cl, plan):
    sym = simulate(g, cl, plan)
    full = simulate(g, cl, plan, full=True)
    assert sym["judge"]["how"] == "symmetric"
    assert sym["makespan_s"] == pytest.approx(plan.estimate["makespan_s"], rel=REL)
    _same(sym, full)


@pytest.mark.parametrize("params", [
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "virtual_stages": 2, "sequence_parallel": True,
     "recompute": "selective"},
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "recompute": "full"},
], ids=["interleaved-sp-selective", "1f1b-full"])
def test_schedules_and_recompute_judged_alike(g, cl, params):
    p = registry.place(g, cl, "megatron", params=params)
    assert p.estimate["status"] == "FEASIBLE"
    full = simulate(g, cl, p, full=True)
    assert full["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
    _same(simulate(g, cl, p), full)


def test_tp_unlike_dp_full_simulation_equals_the_estimate(g, cl):
    p = registry.place(g, cl, "megatron", params={"tp": 2, "pp": 1, "dp": 4, "micro_batch_size": 1})
    assert p.estimate["plan"] == "TP 2 × PP 1 × DP 4, 2 micro-batches"
    full = simulate(g, cl, p, full=True)
    assert full["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)


def test_tp_unlike_dp_symmetric_judge(g, cl):
    # a tensor-parallel group lies inside one replica: the symmetric judge costs it on its own GPUs
    p = registry.place(g, cl, "megatron", params={"tp": 2, "pp": 1, "dp": 4, "micro_batch_size": 1})
    _same(simulate(g, cl, p), simulate(g, cl, p, full=True))


def test_full_recompute_reruns_the_collectives_and_costs_time(g, cl):
    base = {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1}
    none = registry.place(g, cl, "megatron", params=base)
    full = registry.place(g, cl, "megatron", params={**base, "recompute": "full"})
    assert full.estimate["recomputed"] > 0 and none.estimate["recomputed"] == 0
    assert full.estimate["makespan_s"] > none.estimate["makespan_s"]  # the forward runs again
    listed = [x for s in full.derivation["steps"] if s["transform"] == "recompute" for x in s["nodes"]]
    # each layer's input is kept (Megatron-LM's uniform method, one layer): the embedding's all-reduced output here
    assert layer_checkpoints(g) == ["emb"]
    assert "fc/tp0" in listed and "fc2/all-reduce0/tp1" in listed and "ln1/tp0" in listed
    assert not [x for x in listed if x.startswith("emb/")]
    # a node that runs once per step (the tied LM head's cast of the embedding table) is kept, never recomputed
    from celeritas_cli.transform.microbatch import once_nodes
    from celeritas_cli.transform.tensor_parallel import tensor_parallel_graph
    tg = tensor_parallel_graph(g, 2)
    once = once_nodes(tg)
    assert once[tg.index["head_w/tp0"]] and not [x for x in listed if once[tg.index[x]]]
    d = _full_graph(g, cl, full)
    rc = [d.node_extra[x]["collective"]["group"] for x in range(d.n)
          if "recompute_of" in (d.node_extra[x] or {}) and "collective" in d.node_extra[x]]
    assert rc and all(name.endswith("/recompute") or "/recompute/" in name for name in rc)


def test_recompute_segments_keep_every_edge_on_its_rank(g, cl):
    """The recompute steps gate each segment (layer, tensor rank) on its own: no clone waits for a gradient of
    another tensor rank (an edge between ranks would be a transfer Megatron-LM never makes)."""
    p = registry.place(g, cl, "megatron", params={"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1,
                                                  "recompute": "full"})
    steps = [s for s in p.derivation["steps"] if s["transform"] == "recompute"]
    assert steps and all(s.get("segments") is True for s in steps)
    d = _full_graph(g, cl, p)
    rank = [(d.node_extra[x] or {}).get("tp_rank") for x in range(d.n)]
    gates = 0
    for e in range(d.m):
        a, b = rank[d.edge_src[e]], rank[d.edge_dst[e]]
        assert a is None or b is None or a == b, (d.ids[d.edge_src[e]], d.ids[d.edge_dst[e]])
        gates += "recompute_of" in (d.node_extra[d.edge_dst[e]] or {}) and d.node_extra[d.edge_src[e]].get(
            "pass") == "backward"
    assert gates > 0  # the clones do wait for a gradient


@pytest.mark.slow
def test_profiled_gpt_full_recompute_one_layer_at_a_time():
    """The zoo's GPT 1.3B (24 layers, batch 8), TP 2 x PP 2 x DP 2: each layer's input kept, one layer recomputed
    at a time - the peak is below no recomputation's; the simulate of the file is the row's estimate."""
    import gzip
    from pathlib import Path
    with gzip.open(Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo" / "gpt_1.3b.json.gz") as f:
        gpt = Graph.from_dict(json.load(f), label="gpt_1.3b")
    assert len(layer_checkpoints(gpt)) == 24
    cl = servers()
    peak = {}
    for rc in ("none", "full"):
        p = registry.place(gpt, cl, "megatron", params={"tp": 2, "pp": 2, "dp": 2, "recompute": rc})
        rep = simulate(gpt, cl, p)
        assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
        peak[rc] = max(d["memory_bytes"] for d in rep["devices"])
    assert peak["full"] < 0.8 * peak["none"]


def test_selective_recompute_is_the_core_attention(g, cl):
    assert selective_nodes(g) == ["attn"]  # the fused attention between the QKV and output projections
    p = registry.place(g, cl, "megatron", params={"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1,
                                                  "recompute": "selective"})
    steps = [s for s in p.derivation["steps"] if s["transform"] == "recompute"]
    assert [s["nodes"] for s in steps] == [["attn/tp0", "attn/tp1"]]


def test_deterministic(g, cl):
    params = {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "virtual_stages": 2}
    a = registry.place(g, cl, "megatron", params=params).to_dict()
    b = registry.place(g, cl, "megatron", params=params).to_dict()
    for doc in (a, b):  # the wall time of the run is the only field that may differ
        doc["estimate"] = {k: v for k, v in doc["estimate"].items() if not k.endswith("time_s")}
        for k in [k for k in doc if k.endswith("time_s")]:
            del doc[k]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ------------------------------------------------------------------ the transforms' share (shared files)
def _groups(d: Graph) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for x in range(d.n):
        c = (d.node_extra[x] or {}).get("collective")
        if c is not None:
            out.setdefault(c["group"], []).append(c)
    return out


def test_microbatch_replicate_recompute_give_collectives_their_own_groups(g):
    """transform/microbatch.py, replicate.py, recompute.py on a tensor-parallel graph: every copy of a collective is
    a group of its own with ``ranks`` members, its micro-batch's / replica's share of the bytes, seq ordered."""
    from celeritas_cli.transform.microbatch import microbatch_graph
    from celeritas_cli.transform.recompute import recompute_graph
    from celeritas_cli.transform.replicate import data_parallel_graph
    from celeritas_cli.transform.tensor_parallel import tensor_parallel_graph

    tg = tensor_parallel_graph(g, 2)
    base = _groups(tg)["tp:emb/all-reduce0"][0]
    assert base["bytes"] == R * H * 2 and base["seq"] == 0
    mb = microbatch_graph(tg, 2)  # 2 micro-batches of 4 of the 8 samples
    grp = _groups(mb)
    assert all(len(v) == 2 for v in grp.values())  # the 2 tensor ranks, no more
    assert [(c["bytes"], c["seq"]) for c in (grp["tp:emb/all-reduce0/mb0"][0], grp["tp:emb/all-reduce0/mb1"][0])] \
        == [(R * H * 2 // 2, 0), (R * H * 2 // 2, 1)]
    rc = recompute_graph(mb, ["emb/all-reduce0/tp0", "emb/all-reduce0/tp1"])  # an id's micro-batch copies
    clones = {k: v for k, v in _groups(rc).items() if k.endswith("/recompute")}
    assert sorted(clones) == ["tp:emb/all-reduce0/mb0/recompute", "tp:emb/all-reduce0/mb1/recompute"]
    assert all(len(v) == 2 and v[0]["seq"] in (0, 1) for v in clones.values())
    dp = data_parallel_graph(mb, 2)
    grp = _groups(dp)
    assert grp["tp:emb/all-reduce0/mb1/rep1"][0]["bytes"] == R * H * 2 // 4  # 2 of the 8 samples
    assert all(len(v) == v[0]["ranks"] for k, v in grp.items() if k.startswith("tp:"))


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("params,match", [
    ({"tp": 2, "pp": 2, "dp": 1}, r"dp x tp x pp = 1 x 2 x 2 = 4 GPUs, cluster '2x4' has 8"),
    ({"tp": 8, "pp": 1, "dp": 1}, r"tp=8 is more than the 4 GPUs of a server"),
    ({"tp": 4, "pp": 2, "dp": 1}, r"tp=4 does not divide the attention heads \(2\)"),
    ({"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 3}, r"global batch of 8 is not a whole number of micro-batches"),
    ({"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 16}, r"costed at batch 8"),
    ({"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 4, "virtual_stages": 2}, r"interleaved 1F1B schedule needs"),
    ({"tp": 1, "pp": 2, "dp": 4, "sequence_parallel": True}, r"sequence_parallel .* needs tp > 1"),
    ({"tp": 2, "pp": 1, "dp": 4, "recompute": "sometimes"}, r"recompute"),
])
def test_bad_parameters_refused_in_one_line(g, cl, params, match):
    with pytest.raises(InvalidInput, match=match) as exc:
        registry.place(g, cl, "megatron", params=params)
    assert "\n" not in str(exc.value)


def test_tp_not_dividing_a_server_is_refused(g):
    cl = servers(2, 6)
    with pytest.raises(InvalidInput, match=r"tp=4 does not divide the GPUs of every server"):
        megatron(g, cl, tp=4, pp=1, dp=3)


# ------------------------------------------------------------------ words
def test_words(g, cl, plan):
    assert plan.estimate["plan"] == "TP 2 × PP 2 × DP 2, 1F1B, 2 micro-batches"
    assert describe_placement(plan, g, cl) == plan.estimate["plan"]
    p = registry.place(g, cl, "megatron", params={"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1,
                                                  "virtual_stages": 2, "sequence_parallel": True,
                                                  "recompute": "selective"})
    assert p.estimate["plan"] == ("TP 2 × PP 2 × DP 2, 1F1B interleaved ×2, 4 micro-batches, sequence parallel, "
                                  "selective recompute")
    words = describe(plan.derivation, Context("tiny_gpt", g.n))
    assert words.startswith("tensor parallelism: every layer of tiny_gpt split over 2 ranks")
    assert "; 2 micro-batches of 4 samples (global batch 8)" in words and "data parallelism: 2 replicas" in words
