"""Tensor and sequence parallelism as a derivation (transform/tensor_parallel.py).

A hand-built one-layer GPT (embedding, attention, MLP, tied LM head, cross
entropy, backward and Adam updates, shaped like ``placer profile``'s
captures) with hand-counted collectives, bytes, times and memory per rank;
the zoo's profiled GPT 1.3B for the counts at scale.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.devices import DEVICES, roofline_time
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import attach, derive, rebuild
from celeritas_cli.transform.size import derived_budget
from celeritas_cli.transform.tensor_parallel import (
    find_patterns,
    tensor_parallel_graph,
    tensor_parallel_size,
    tensor_parallel_step,
)

ZOO = Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo"

# the tiny GPT: 1 x 4 tokens (R = 4), hidden 8, 2 heads, MLP 32, vocabulary 16, bf16 activations
R, H, HEADS, FFN, V = 4, 8, 2, 32, 16
MM, EW = 8.0, 1.0   # compute_s of a matmul, of an elementwise / norm op


def _node(nid, op, c, mem, pas, **extra):
    return {"id": nid, "op": op, "compute_s": c, "memory_bytes": mem, "pass": pas, **extra}


def _param(nid, name, state, out):
    """A parameter source: the fp32 master weight cast to bf16 (kept), as the capture has it."""
    return _node(nid, "aten._to_copy", 0.5, state + out, "forward", colocation=f"param:{name}",
                 batch_independent={"memory_bytes": state + out, "state_bytes": state})


def tiny_gpt(V: int = V, training: bool = True) -> Graph:
    """The one-layer GPT (a forward-only copy with *training* False)."""
    a, f4 = R * H * 2, R * H * 4
    nodes = [
        _node("input_0", "placeholder", 0.0, R * 8, "forward"),
        _node("target", "placeholder", 0.0, R * 8, "forward"),
        _node("emb", "aten.embedding", EW, V * H * 4 + a, "forward", colocation="param:wte",
              batch_independent={"memory_bytes": V * H * 4, "state_bytes": V * H * 4, "state_tensors": ["emb:wte"]}),
        _node("ln1", "aten.native_layer_norm", EW, 64 + a, "forward", colocation="param:ln1",
              batch_independent={"memory_bytes": 64, "state_bytes": 64}),
        _param("qkv_w", "qkv", H * 3 * H * 4, H * 3 * H * 2),
        _node("qkv", "aten.mm", MM, R * 3 * H * 2, "forward"),
        _node("attn", "aten._scaled_dot_product_flash_attention_for_cpu", 4.0, a + HEADS * R * 4, "forward"),
        _param("proj_w", "proj", H * H * 4, H * H * 2),
        _node("proj", "aten.mm", MM, a, "forward"),
        _node("drop1", "aten.mul", EW, a, "forward"),
        _node("add1", "aten.add", EW, a, "forward"),
        _node("ln2", "aten.native_layer_norm", EW, 64 + a, "forward", colocation="param:ln2",
              batch_independent={"memory_bytes": 64, "state_bytes": 64}),
        _param("fc_w", "fc", H * FFN * 4, H * FFN * 2),
        _node("fc", "aten.mm", MM, R * FFN * 2, "forward"),
        _node("gelu", "aten.gelu", EW, R * FFN * 2, "forward"),
        _param("fc2_w", "fc2", FFN * H * 4, FFN * H * 2),
        _node("fc2", "aten.mm", MM, a, "forward"),
        _node("drop2", "aten.mul", EW, a, "forward"),
        _node("add2", "aten.add", EW, a, "forward"),
        _node("lnf", "aten.native_layer_norm", EW, 64 + a, "forward", colocation="param:lnf",
              batch_independent={"memory_bytes": 64, "state_bytes": 64}),
        _node("head_w", "aten._to_copy", 0.5, V * H * 2, "forward"),
        _node("head", "aten.mm", MM, R * V * 2, "forward"),
        _node("logsm", "aten._log_softmax", EW, R * V * 2, "forward"),
        _node("nll", "aten.nll_loss_forward", EW, 4, "forward"),
        # backward
        _node("nll_bwd", "aten.nll_loss_backward", EW, 0, "backward"),
        _node("logsm_bwd", "aten._log_softmax_backward_data", EW, 0, "backward"),
        _node("head_dx", "aten.mm", MM, 0, "backward"),
        _node("head_dw", "aten.mm", MM, 0, "backward"),
        _node("lnf_bwd", "aten.native_layer_norm_backward", EW, 64, "backward"),
        _node("drop2_bwd", "aten.mul", EW, 0, "backward"),
        _node("fc2_dx", "aten.mm", MM, 0, "backward"),
        _node("fc2_dw", "aten.mm", MM, FFN * H * 2, "backward"),
        _node("gelu_bwd", "aten.gelu_backward", EW, 0, "backward"),
        _node("fc_dx", "aten.mm", MM, 0, "backward"),
        _node("fc_dw", "aten.mm", MM, H * FFN * 2, "backward"),
        _node("ln2_bwd", "aten.native_layer_norm_backward", EW, 64, "backward"),
        _node("res1", "aten.add", EW, 0, "backward"),
        _node("drop1_bwd", "aten.mul", EW, 0, "backward"),
        _node("proj_dx", "aten.mm", MM, 0, "backward"),
        _node("proj_dw", "aten.mm", MM, H * H * 2, "backward"),
        _node("attn_bwd", "aten._scaled_dot_product_flash_attention_for_cpu_backward", 8.0, 0, "backward"),
        _node("qkv_dx", "aten.mm", MM, 0, "backward"),
        _node("qkv_dw", "aten.mm", MM, H * 3 * H * 2, "backward"),
        _node("ln1_bwd", "aten.native_layer_norm_backward", EW, 64, "backward"),
        _node("res0", "aten.add", EW, 0, "backward"),
        _node("emb_bwd", "aten.embedding_dense_backward", EW, 0, "backward"),
        _node("wte_grad", "aten.add", EW, V * H * 2, "backward"),
    ]
    for name, state in (("wte", V * H * 4), ("ln1", 64), ("qkv", H * 3 * H * 4), ("proj", H * H * 4),
                        ("ln2", 64), ("fc", H * FFN * 4), ("fc2", FFN * H * 4), ("lnf", 64)):
        nodes.append(_node(f"adam.{name}", "optim.adam", 2.0, 2 * state, "update", colocation=f"param:{name}"))
    e = []

    def edge(src, dst, nbytes, k="0"):
        e.append({"src": src, "dst": dst, "bytes": nbytes, "tensor": f"{src}:{k}"})

    edge("input_0", "emb", R * 8)
    edge("emb", "ln1", a)
    edge("emb", "add1", a)
    edge("emb", "head_w", V * H * 4, "wte")
    edge("ln1", "qkv", a)
    edge("qkv_w", "qkv", H * 3 * H * 2)
    edge("qkv", "attn", R * 3 * H * 2)
    edge("proj_w", "proj", H * H * 2)
    edge("attn", "proj", a)
    edge("proj", "drop1", a)
    edge("drop1", "add1", a)
    edge("add1", "ln2", a)
    edge("add1", "add2", a)
    edge("ln2", "fc", a)
    edge("fc_w", "fc", H * FFN * 2)
    edge("fc", "gelu", R * FFN * 2)
    edge("gelu", "fc2", R * FFN * 2)
    edge("fc2_w", "fc2", FFN * H * 2)
    edge("fc2", "drop2", a)
    edge("drop2", "add2", a)
    edge("add2", "lnf", a)
    edge("lnf", "head", a)
    edge("head_w", "head", V * H * 2)
    edge("head", "logsm", R * V * 2)
    edge("logsm", "nll", R * V * 2)
    edge("target", "nll", R * 8)
    # backward
    edge("logsm", "nll_bwd", R * V * 2)
    edge("target", "nll_bwd", R * 8)
    edge("nll", "nll_bwd", 4)
    edge("nll_bwd", "logsm_bwd", R * V * 2)
    edge("logsm", "logsm_bwd", R * V * 2)
    edge("logsm_bwd", "head_dx", R * V * 2)
    edge("head_w", "head_dx", V * H * 2)
    edge("logsm_bwd", "head_dw", R * V * 2)
    edge("lnf", "head_dw", a)
    edge("head_dx", "lnf_bwd", a)
    edge("add2", "lnf_bwd", a)
    edge("lnf_bwd", "drop2_bwd", a)
    edge("lnf_bwd", "res1", a)
    edge("drop2_bwd", "fc2_dx", a)
    edge("fc2_w", "fc2_dx", FFN * H * 2)
    edge("drop2_bwd", "fc2_dw", a)
    edge("gelu", "fc2_dw", R * FFN * 2)
    edge("fc2_dx", "gelu_bwd", R * FFN * 2)
    edge("fc", "gelu_bwd", R * FFN * 2)
    edge("gelu_bwd", "fc_dx", R * FFN * 2)
    edge("fc_w", "fc_dx", H * FFN * 2)
    edge("gelu_bwd", "fc_dw", R * FFN * 2)
    edge("ln2", "fc_dw", a)
    edge("fc_dx", "ln2_bwd", a)
    edge("add1", "ln2_bwd", a)
    edge("ln2_bwd", "res1", a)
    edge("res1", "drop1_bwd", a)
    edge("res1", "res0", a)
    edge("drop1_bwd", "proj_dx", a)
    edge("proj_w", "proj_dx", H * H * 2)
    edge("drop1_bwd", "proj_dw", a)
    edge("attn", "proj_dw", a)
    edge("proj_dx", "attn_bwd", a)
    edge("qkv", "attn_bwd", R * 3 * H * 2)
    edge("attn", "attn_bwd", a)
    edge("attn", "attn_bwd", HEADS * R * 4, "1")
    edge("attn_bwd", "qkv_dx", R * 3 * H * 2)
    edge("qkv_w", "qkv_dx", H * 3 * H * 2)
    edge("attn_bwd", "qkv_dw", R * 3 * H * 2)
    edge("ln1", "qkv_dw", a)
    edge("qkv_dx", "ln1_bwd", a)
    edge("emb", "ln1_bwd", a)
    edge("ln1_bwd", "res0", a)
    edge("res0", "emb_bwd", a)
    edge("input_0", "emb_bwd", R * 8)
    edge("emb_bwd", "wte_grad", V * H * 2)
    edge("head_dw", "wte_grad", V * H * 2)
    # updates
    edge("wte_grad", "adam.wte", V * H * 2)
    for ln in ("ln1", "ln2", "lnf"):
        edge(f"{ln}_bwd", f"adam.{ln}", 64, "1")
    edge("qkv_dw", "adam.qkv", H * 3 * H * 2)
    edge("proj_dw", "adam.proj", H * H * 2)
    edge("fc_dw", "adam.fc", H * FFN * 2)
    edge("fc2_dw", "adam.fc2", FFN * H * 2)
    assert f4 == 2 * a
    if not training:
        nodes = [nd for nd in nodes if nd["pass"] == "forward"]
        keep = {nd["id"] for nd in nodes}
        e = [x for x in e if x["src"] in keep and x["dst"] in keep]
    return build("tiny_gpt", nodes, e, meta={"phase": "training" if training else "inference", "batch_size": 1,
                                            "precision": "bf16"})


def _rank(dg: Graph, r: int) -> list[int]:
    return [v for v in range(dg.n) if (dg.node_extra[v] or {}).get("tp_rank") == r]


def _collectives(dg: Graph, r: int = 0) -> list[dict]:
    out = [dict(dg.node_extra[v]["collective"], id=dg.ids[v], memory=dg.memory[v]) for v in _rank(dg, r)
           if dg.op[v].startswith("collective.")]
    return sorted(out, key=lambda c: c["seq"])


def _fed(dg: Graph, cid: str) -> tuple[str, list[str]]:
    """(origin of the collective's input, origins of its consumers)."""
    v = dg.index[cid]
    src = dg.node_extra[dg.pred[v][0]]["origin"]
    return src, sorted(dg.node_extra[w]["origin"] for w in dg.succ[v])


# ------------------------------------------------------------------ patterns
def test_patterns_of_the_tiny_gpt():
    g = tiny_gpt()
    p = find_patterns(g)
    ids = g.ids
    assert [([ids[a] for a in cols], ids[b]) for cols, b in p.attention] == [(["qkv"], "proj")]
    assert [([ids[a] for a in cols], ids[b]) for cols, b in p.mlp] == [(["fc"], "fc2")]
    assert ([ids[v] for v in p.embeddings], ids[p.head], ids[p.nll]) == (["emb"], "head", "nll")
    # shapes from the operands' bytes; heads from the attention's log-sum-exp output
    assert {k: p.dims[k] for k in ("hidden", "ffn", "vocab", "heads")} == {"hidden": H, "ffn": FFN, "vocab": V,
                                                                          "heads": HEADS}


# ------------------------------------------------------------------ structure and bytes
def test_megatron_all_reduces_tp2():
    g = tiny_gpt()
    dg = tensor_parallel_graph(g, 2)
    assert dg.n == 2 * (g.n + 7)  # every node on both ranks + 7 collectives per rank
    a = R * H * 2  # one bf16 activation b*s*h*2 = 64 bytes
    cs = _collectives(dg)
    assert [c["seq"] for c in cs] == list(range(7))
    got = [(c["kind"], c["bytes"], *_fed(dg, c["id"])) for c in cs]
    assert got == [
        ("all-reduce", a, "emb", ["add1", "ln1", "ln1_bwd"]),        # vocab-parallel embedding (g)
        ("all-reduce", a, "proj", ["drop1"]),                        # g after the row-parallel projection
        ("all-reduce", a, "fc2", ["drop2"]),                         # g after the row-parallel fc2
        ("all-reduce", 3 * 4 * R, "logsm", ["nll"]),                 # vocab-parallel cross entropy statistics
        ("all-reduce", a, "head_dx", ["lnf_bwd"]),                   # f's backward of the LM head
        ("all-reduce", a, "fc_dx", ["ln2_bwd"]),                     # f's backward of fc
        ("all-reduce", a, "qkv_dx", ["ln1_bwd"]),                    # f's backward of QKV
    ]
    assert all(c["ranks"] == 2 and c["memory"] == 0 for c in cs)
    # rank 1 has the same groups, in the same order
    assert [(c["group"], c["seq"]) for c in _collectives(dg, 1)] == [(c["group"], c["seq"]) for c in cs]
    # edges of a split tensor carry half of it; partial sums are whole
    eb = {(dg.ids[dg.edge_src[e]], dg.ids[dg.edge_dst[e]]): dg.edge_bytes[e] for e in range(dg.m)}
    assert eb[("qkv/tp1", "attn/tp1")] == R * 3 * H * 2 // 2
    assert eb[("fc_w/tp0", "fc/tp0")] == H * FFN * 2 // 2
    assert eb[("proj/tp0", "proj/all-reduce0/tp0")] == a
    assert eb[("head/tp0", "logsm/tp0")] == R * V * 2 // 2
    assert dg.meta["tensor_parallel"]["collectives"] == {"all-reduce": 7}


def test_sequence_parallel_replaces_each_all_reduce_by_gather_and_scatter():
    g = tiny_gpt()
    plain = _collectives(tensor_parallel_graph(g, 2))
    dg = tensor_parallel_graph(g, 2, sequence_parallel=True)
    cs = _collectives(dg)
    a = R * H * 2
    rs = sorted((_fed(dg, c["id"])[0], c["bytes"]) for c in cs if c["kind"] == "reduce-scatter")
    ar = sorted((_fed(tensor_parallel_graph(g, 2), c["id"])[0], c["bytes"]) for c in plain
                if c["kind"] == "all-reduce" and c["bytes"] == a)
    assert rs == ar  # every activation all-reduce became a reduce-scatter of the same tensor and bytes
    ag = [(_fed(dg, c["id"])[0], c["bytes"], dg.node_extra[dg.index[c["id"]]]["pass"], c["memory"])
          for c in cs if c["kind"] == "all-gather"]
    # forward: before each column-parallel matmul (f); backward: before each row-parallel backward (g's
    # backward), again for each column-parallel weight gradient, and before the embedding's backward
    assert sorted(ag) == sorted([("ln1", a, "forward", a), ("ln2", a, "forward", a), ("lnf", a, "forward", a),
                                 ("lnf", a, "backward", a), ("drop2_bwd", a, "backward", a),
                                 ("ln2", a, "backward", a), ("drop1_bwd", a, "backward", a),
                                 ("ln1", a, "backward", a), ("res0", a, "backward", a)])
    # the LayerNorms' gradients are partial sums over the sequence shards: all-reduced before the update
    small = sorted(_fed(dg, c["id"]) for c in cs if c["kind"] == "all-reduce" and c["bytes"] == 64 and
                   _fed(dg, c["id"])[1][0].startswith("adam"))
    assert small == [("ln1_bwd", ["adam.ln1"]), ("ln2_bwd", ["adam.ln2"]), ("lnf_bwd", ["adam.lnf"])]
    assert all(c["memory"] == a // 2 for c in cs if c["kind"] == "reduce-scatter")
    assert len(cs) == 6 + 9 + 4
    # issue order: each stream's seq respects the graph (a collective never waits on a later one)
    seq = {dg.index[c["id"]]: c["seq"] for c in cs}
    for v, sv in seq.items():
        seen, stack = set(), [v]
        while stack:
            for w in dg.succ[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        assert all(seq[w] > sv for w in seen & seq.keys()), dg.ids[v]


# ------------------------------------------------------------------ cost and memory per rank
SPLIT = {"emb", "qkv_w", "qkv", "attn", "proj_w", "proj", "fc_w", "fc", "gelu", "fc2_w", "fc2", "head_w", "head",
         "logsm", "nll", "nll_bwd", "logsm_bwd", "head_dx", "head_dw", "fc2_dx", "fc2_dw", "gelu_bwd", "fc_dx",
         "fc_dw", "proj_dx", "proj_dw", "attn_bwd", "qkv_dx", "qkv_dw", "emb_bwd", "wte_grad", "adam.wte",
         "adam.qkv", "adam.proj", "adam.fc", "adam.fc2"}
SEQUENCE = {"ln1", "drop1", "add1", "ln2", "drop2", "add2", "lnf", "lnf_bwd", "drop2_bwd", "ln2_bwd", "res1",
            "drop1_bwd", "ln1_bwd", "res0"}


@pytest.mark.parametrize("sp", [False, True])
def test_time_per_rank_is_the_split_share(sp):
    g = tiny_gpt()
    tp = 2
    dg = tensor_parallel_graph(g, tp, sequence_parallel=sp)
    halved = SPLIT | (SEQUENCE if sp else set())
    for r in range(tp):
        for v in _rank(dg, r):
            if dg.op[v].startswith("collective."):
                assert dg.compute[v] == 0.0
                continue
            o = dg.node_extra[v]["origin"]
            full = g.compute[g.index[o]]
            assert dg.compute[v] == pytest.approx(full / tp if o in halved else full), o
    whole = sum(g.compute)
    split_work = sum(g.compute[g.index[o]] for o in halved)
    assert sum(dg.compute[v] for v in _rank(dg, 1)) == pytest.approx(whole - split_work / 2)


def test_memory_per_rank_by_hand():
    g = tiny_gpt()
    dg = tensor_parallel_graph(g, 2)
    a = R * H * 2
    # Megatron section 3: split weights (their fp32 state, bf16 copies, gradients, Adam moments) and the
    # activations of split parts halve; LayerNorm, dropout, residual and partial-sum outputs stay whole
    want = {"input_0": 32, "target": 32, "emb": 256 + a, "ln1": 64 + a, "qkv_w": (768 + 384) // 2,
            "qkv": 96, "attn": (a + 32) // 2, "proj_w": (256 + 128) // 2, "proj": a, "drop1": a, "add1": a,
            "ln2": 64 + a, "fc_w": 1536 // 2, "fc": 128, "gelu": 128, "fc2_w": 1536 // 2, "fc2": a, "drop2": a,
            "add2": a, "lnf": 64 + a, "head_w": 128, "head": 64, "logsm": 64, "nll": 4,
            "lnf_bwd": 64, "fc2_dw": 256, "fc_dw": 256, "ln2_bwd": 64, "proj_dw": 64, "qkv_dw": 192,
            "ln1_bwd": 64, "wte_grad": 128, "adam.wte": 512, "adam.ln1": 128, "adam.qkv": 768, "adam.proj": 256,
            "adam.ln2": 128, "adam.fc": 1024, "adam.fc2": 1024, "adam.lnf": 128}
    for r in range(2):
        got = {dg.node_extra[v]["origin"]: dg.memory[v] for v in _rank(dg, r)
               if not dg.op[v].startswith("collective.")}
        assert {k: x for k, x in got.items() if x} == want
    assert sum(dg.memory[v] for v in _rank(dg, 0)) == sum(want.values())


def test_sequence_parallel_shards_the_replicated_activations():
    g = tiny_gpt()
    plain = tensor_parallel_graph(g, 2)
    dg = tensor_parallel_graph(g, 2, sequence_parallel=True)

    def mem(d, o):
        return d.memory[d.index[f"{o}/tp0"]]
    a = R * H * 2
    for o in ("drop1", "add1", "drop2", "add2"):
        assert (mem(plain, o), mem(dg, o)) == (a, a // 2)
    for o in ("ln1", "ln2", "lnf"):  # the LayerNorm's parameters stay whole
        assert (mem(plain, o), mem(dg, o)) == (64 + a, 64 + a // 2)
    assert mem(dg, "qkv") == mem(plain, "qkv")


def test_roofline_cost_of_a_thin_gemm():
    """On a roofline graph a split matmul is the roofline at its own shape: a column-parallel GEMM still
    reads its whole input, so split 16 ways it turns memory-bound and takes more than 1/16 of its time."""
    rows, k, n, elt = 1024, 1024, 1024, 2
    dt = {"dtype": "bfloat16", "tensor_core_op": True}

    def mm(nid, kk, nn, inp):
        fl, moved = 2 * rows * kk * nn, elt * (rows * kk + kk * nn + rows * nn)
        by = {t: roofline_time(fl, moved, t, **dt) for t in DEVICES}
        return {"id": nid, "op": "aten.mm", "compute_s": by["V100"], "compute_by_type": by,
                "memory_bytes": rows * nn * elt, "pass": "forward", "flops": fl, "bytes_moved": moved}

    def w(nid, kk, nn):
        return {"id": nid, "op": "aten._to_copy", "compute_s": 0.0, "memory_bytes": kk * nn * elt,
                "pass": "forward", "colocation": f"param:{nid}",
                "batch_independent": {"memory_bytes": kk * nn * elt, "state_bytes": kk * nn * elt}}
    gelu_moved = 2 * rows * n * elt
    gelu = {"id": "gelu", "op": "aten.gelu", "compute_s": 1e-5, "memory_bytes": rows * n * elt, "pass": "forward",
            "flops": rows * n, "bytes_moved": gelu_moved}
    nodes = [{"id": "x", "op": "placeholder", "compute_s": 0.0, "memory_bytes": rows * k * elt, "pass": "forward"},
             w("w1", k, n), mm("fc", k, n, "x"), gelu, w("w2", n, k), mm("fc2", n, k, "gelu"),
             {"id": "out", "op": "aten.add", "compute_s": 0.0, "memory_bytes": 0, "pass": "forward"}]
    edges = [{"src": "x", "dst": "fc", "bytes": rows * k * elt}, {"src": "w1", "dst": "fc", "bytes": k * n * elt},
             {"src": "fc", "dst": "gelu", "bytes": rows * n * elt},
             {"src": "gelu", "dst": "fc2", "bytes": rows * n * elt}, {"src": "w2", "dst": "fc2", "bytes": n * k * elt},
             {"src": "fc2", "dst": "out", "bytes": rows * k * elt}]
    g = build("mlp", nodes, edges, meta={"precision": "bf16", "cost_model": "roofline on all"})
    for tp in (2, 16):
        dg = tensor_parallel_graph(g, tp)
        fc = dg.index["fc/tp0"]
        fl = 2 * rows * k * n // tp
        moved = elt * (rows * k + k * n // tp + rows * n // tp)   # whole input, its columns, its output
        for t in ("A100", "V100"):
            assert dg.compute_by_type[fc][t] == pytest.approx(roofline_time(fl, moved, t, **dt), rel=1e-9)
        assert dg.node_extra[fc]["flops"] == fl and dg.node_extra[fc]["bytes_moved"] == moved
        fc2 = dg.index["fc2/tp0"]
        moved2 = elt * (rows * n // tp + n * k // tp + rows * k)   # its input columns, its rows, whole partial sums
        assert dg.compute_by_type[fc2]["A100"] == pytest.approx(roofline_time(fl, moved2, "A100", **dt), rel=1e-9)
    full = g.compute_by_type[g.index["fc"]]["A100"]
    t16 = tensor_parallel_graph(g, 16).compute_by_type[tensor_parallel_graph(g, 16).index["fc/tp0"]]["A100"]
    assert t16 > 1.5 * full / 16  # the thin GEMM is memory-bound: far less than 16x faster
    t2 = tensor_parallel_graph(g, 2).compute_by_type[tensor_parallel_graph(g, 2).index["fc/tp0"]]["A100"]
    assert t2 == pytest.approx((full - DEVICES["A100"].launch_s) / 2 + DEVICES["A100"].launch_s)  # still compute-bound


# ------------------------------------------------------------------ refusals
def test_refusals_in_one_line():
    g = tiny_gpt()
    with pytest.raises(InvalidInput, match=r"tp=3 does not divide the attention heads \(2\)") as exc:
        tensor_parallel_graph(g, 3)
    assert "\n" not in str(exc.value)
    with pytest.raises(InvalidInput, match=r"tp=4 does not divide the attention heads \(2\)"):
        tensor_parallel_graph(g, 4)
    with pytest.raises(InvalidInput, match=r"tp=2 does not divide the vocabulary \(17\) of graph 'tiny_gpt'"):
        tensor_parallel_graph(tiny_gpt(V=17), 2)
    chain = build("chain", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0},
                            {"id": "b", "op": "aten.mm", "compute_s": 1.0, "memory_bytes": 0}],
                  [{"src": "a", "dst": "b", "bytes": 8}])
    with pytest.raises(InvalidInput, match="no MLP .* and no attention") as exc:
        tensor_parallel_graph(chain, 2)
    assert "\n" not in str(exc.value)
    with pytest.raises(InvalidInput, match="already tensor-parallel"):
        tensor_parallel_graph(tensor_parallel_graph(g, 2), 2)
    with pytest.raises(InvalidInput, match="tp must be an integer"):
        tensor_parallel_graph(g, 0)
    with pytest.raises(InvalidInput, match=r"p\.json: field derivation\.steps\[0\]\.tp: tp=3 does not divide"):
        derive(g, {"steps": [tensor_parallel_step(3)]}, "p.json")
    with pytest.raises(InvalidInput, match=r"p\.json: field derivation\.steps\[0\]\.sequence_parallel: must be "
                                           r"true or false"):
        derive(g, {"steps": [{"transform": "tensor-parallel", "tp": 2, "sequence_parallel": "yes"}]}, "p.json")
    with pytest.raises(InvalidInput, match="more than the 2 devices"):
        derive(g, {"steps": [tensor_parallel_step(4)]}, "p.json", devices=2, cluster="c")


def test_size_is_said_before_building():
    g = tiny_gpt()
    assert tensor_parallel_size(g, 2, True).nodes == tensor_parallel_graph(g, 2, sequence_parallel=True).n
    with derived_budget(100), pytest.raises(InvalidInput, match=r"tensor-parallel: tp=2 of graph 'tiny_gpt' would "
                                                                r"build a derived graph of 1\d\d nodes"):
        tensor_parallel_graph(g, 2)


# ------------------------------------------------------------------ recipe, forgery, determinism
def test_rebuild_equals_and_forgery_is_rejected():
    g = tiny_gpt()
    d = {"steps": [tensor_parallel_step(2, True)]}
    doc = tensor_parallel_graph(g, 2, sequence_parallel=True).to_dict()
    assert rebuild(g, d, doc, "p.json").to_dict() == doc
    forged = json.loads(json.dumps(doc))
    i = next(i for i, nd in enumerate(forged["nodes"]) if nd["id"] == "fc/tp1")
    forged["nodes"][i]["compute_s"] = forged["nodes"][i]["compute_s"] / 2
    with pytest.raises(InvalidInput, match=r"p\.json: split_graph node 'fc/tp1' does not derive .*compute_s"):
        rebuild(g, d, forged, "p.json")
    dropped = json.loads(json.dumps(doc))
    dropped["edges"] = [e for e in dropped["edges"] if not e["dst"].startswith("proj/reduce-scatter")]
    with pytest.raises(InvalidInput, match="does not derive"):
        rebuild(g, d, dropped, "p.json")
    fewer = json.loads(json.dumps(doc))
    for nd in fewer["nodes"]:
        if "collective" in nd:
            nd["collective"]["bytes"] //= 2
    with pytest.raises(InvalidInput, match="collective is"):
        rebuild(g, d, fewer, "p.json")


def test_a_placement_file_with_the_step_is_simulated_and_a_forged_one_refused():
    """Through the placement document (schema, field checks) to the simulator, as every derivation."""
    g = tiny_gpt()
    cl = uniform(2, bandwidth=1e9, latency=0.0, memory=10**9)
    dg = tensor_parallel_graph(g, 2, sequence_parallel=True)
    p = Placement.from_indices(dg, cl, [dg.node_extra[v]["tp_rank"] for v in range(dg.n)], algorithm="given")
    p.graph = g.name
    attach(p, g, dg, [tensor_parallel_step(2, True)])
    doc = p.to_dict(embed_derived=True)
    assert doc["derivation"]["steps"] == [{"transform": "tensor-parallel", "tp": 2, "sequence_parallel": True}]
    back = Placement.from_dict(json.loads(json.dumps(doc)), "p.json")
    rep = simulate(g, cl, back, label="p.json")
    assert rep["makespan_s"] > 0
    assert sum(d["nodes"] for d in rep["devices"]) == dg.n
    forged = json.loads(json.dumps(doc))
    for nd in forged["split_graph"]["nodes"]:
        if nd["id"] == "ln1/tp0":
            nd["memory_bytes"] *= 2  # a LayerNorm not sharded after all
    with pytest.raises(InvalidInput, match=r"p\.json: split_graph node 'ln1/tp0' does not derive from graph "
                                           r"'tiny_gpt': memory_bytes is"):
        simulate(g, cl, Placement.from_dict(forged, "p.json"), label="p.json")
    bad = json.loads(json.dumps(doc))
    bad["derivation"]["steps"][0]["tp"] = 3
    bad.pop("split_graph")
    with pytest.raises(InvalidInput, match=r"^p\.json: field derivation\.steps\[0\]\.tp: 3 is more than the 2 "
                                           r"devices"):
        simulate(g, cl, Placement.from_dict(bad, "p.json"), label="p.json")


def test_deterministic():
    a = json.dumps(tensor_parallel_graph(tiny_gpt(), 2, sequence_parallel=True).to_dict(), sort_keys=True)
    b = json.dumps(tensor_parallel_graph(tiny_gpt(), 2, sequence_parallel=True).to_dict(), sort_keys=True)
    assert a == b


def test_inference_graph():
    """A forward-only graph: the forward all-reduces only (embedding, projection, fc2, cross entropy)."""
    g = tiny_gpt(training=False)
    dg = tensor_parallel_graph(g, 2)
    assert [_fed(dg, c["id"])[0] for c in _collectives(dg)] == ["emb", "proj", "fc2", "logsm"]
    assert dg.memory[dg.index["qkv_w/tp0"]] == g.memory[g.index["qkv_w"]] // 2


def test_tp1_is_the_graph_itself():
    g = tiny_gpt()
    dg = tensor_parallel_graph(g, 1)
    assert dg.n == g.n and not _collectives(dg)
    assert [dg.compute[dg.index[f"{x}/tp0"]] for x in g.ids] == g.compute
    assert [dg.memory[dg.index[f"{x}/tp0"]] for x in g.ids] == g.memory


# ------------------------------------------------------------------ the profiled GPT 1.3B
@pytest.fixture(scope="module")
def gpt13():
    with gzip.open(ZOO / "gpt_1.3b.json.gz") as f:
        return Graph.from_dict(json.load(f), label="gpt_1.3b")


def test_profiled_gpt_patterns(gpt13):
    p = find_patterns(gpt13)
    assert (len(p.attention), len(p.mlp)) == (24, 24)
    assert {k: p.dims[k] for k in ("hidden", "ffn", "vocab", "heads")} == {"hidden": 2048, "ffn": 8192,
                                                                          "vocab": 51200, "heads": 16}
    with pytest.raises(InvalidInput, match=r"tp=32 does not divide the attention heads \(16\)"):
        tensor_parallel_graph(gpt13, 32)
    with pytest.raises(InvalidInput, match=r"tp=3 does not divide the attention heads \(16\)"):
        tensor_parallel_graph(gpt13, 3)


def test_profiled_gpt_tp8(gpt13):
    dg = tensor_parallel_graph(gpt13, 8)
    b, s, h = 8, 2048, 2048
    cs = _collectives(dg)
    sizes = sorted({(c["kind"], c["bytes"]) for c in cs})
    # 4 per layer (2 forward, 2 backward) + the LM head's backward: b*s*h*2 bytes (bf16); the embedding's
    # all-reduce of its fp32 output b*s*h*4; the cross-entropy statistics 3 * 4 bytes per token
    assert sum(1 for c in cs if c["bytes"] == b * s * h * 2) == 4 * 24 + 1
    assert sizes == [("all-reduce", 3 * 4 * b * s), ("all-reduce", b * s * h * 2), ("all-reduce", b * s * h * 4)]
    # parameters, gradients and Adam state of the split weights / 8; the A100 work of a rank
    g = gpt13
    qkv = dg.index["adam.blocks.0.qkv.weight/tp3"]
    assert dg.memory[qkv] == g.memory[g.index["adam.blocks.0.qkv.weight"]] // 8
    emb = dg.index["embedding/tp5"]  # the vocabulary table / 8, the (partial) output whole
    assert dg.node_extra[emb]["output_bytes"] == b * s * h * 4
    assert dg.node_extra[emb]["batch_independent"]["state_bytes"] == 51200 * h * 4 // 8
    ln = dg.index["adam.blocks.0.ln1.weight/tp3"]
    assert dg.memory[ln] == g.memory[g.index["adam.blocks.0.ln1.weight"]]
    # Megatron section 3 by hand: per layer QKV 3h^2 + 3h, projection h^2, fc 4h^2 + 4h, fc2 4h^2 are split,
    # and the vocabulary's V h; LayerNorms (4h), the row-parallel biases (2h), the positions (s h) and the
    # final LayerNorm (2h) are not.  fp32 weights + Adam's two moments: 12 bytes a parameter (resident);
    # fp32 gradients: 4 bytes (kept by the backward)
    layers, vocab = 24, 51200
    split = layers * (12 * h * h + 7 * h) + vocab * h
    replicated = layers * 6 * h + s * h + 2 * h
    assert split + replicated == g.meta["parameters"]
    r0 = _rank(dg, 0)
    assert sum(dg.node_extra[v]["resident_bytes"] for v in r0) == 12 * (split // 8 + replicated)
    assert sum(dg.memory[v] for v in r0 if dg.node_extra[v]["pass"] == "backward") == 4 * (split // 8 + replicated)
    work = sum(dg.compute_by_type[v]["A100"] for v in _rank(dg, 0) if dg.compute_by_type[v])
    whole = sum(g.compute_by_type[v]["A100"] for v in range(g.n))
    assert whole / 8 < work < whole / 4


def test_profiled_transformer_separate_projections_and_cross_attention():
    """The zoo's encoder-decoder Transformer (nn.MultiheadAttention: separate Q, K, V projections, unfused
    attention, post-LayerNorm, tied embeddings): self- and cross-attention are split by heads."""
    with gzip.open(ZOO / "transformer.json.gz") as f:
        g = Graph.from_dict(json.load(f), label="transformer")
    p = find_patterns(g)
    assert (len(p.attention), len(p.mlp), len(p.embeddings)) == (18, 12, 2)  # 6 + 6 self, 6 cross
    assert all(len(cols) == 3 for cols, _ in p.attention)
    assert {k: p.dims[k] for k in ("hidden", "ffn", "vocab")} == {"hidden": 2048, "ffn": 8192, "vocab": 32000}
    dg = tensor_parallel_graph(g, 4, sequence_parallel=True)
    ln = [v for v in range(dg.n) if "layer_norm" in dg.op[v] and dg.node_extra[v].get("tp_rank") == 0]
    # every LayerNorm runs on its sequence shard, none on a hidden split
    assert all(dg.memory[v] < g.memory[g.index[dg.node_extra[v]["origin"]]] or g.memory[g.index[
        dg.node_extra[v]["origin"]]] == 0 for v in ln if dg.node_extra[v].get("pass") == "forward")
    # the input gradients of two partial sums added together are reduced once, after the add
    plain = tensor_parallel_graph(g, 4)
    adds = [c for c in _collectives(plain) if g.op[g.index[_fed(plain, c["id"])[0]]] == "aten.add"]
    assert len(adds) == 1


@pytest.mark.slow
def test_profiled_gpt_sequence_parallel_rebuild(gpt13):
    d = {"steps": [tensor_parallel_step(8, True)]}
    doc = tensor_parallel_graph(gpt13, 8, sequence_parallel=True).to_dict()
    assert rebuild(gpt13, d, doc, "p.json").n == len(doc["nodes"])
