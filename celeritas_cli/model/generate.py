"""Deterministic synthetic DNN-like graphs for tests and benchmarks.

:func:`layered` builds a training-step graph the way frameworks lay one out:
a forward pass of blocks (1-4 parallel branches of 1-4 ops, a join, and
residual edges with some probability), the mirrored backward pass (one
gradient op per forward op, edges reversed, plus the saved activation edge
forward op -> its gradient op), and an optimizer update per parameterised
op, colocated with it (``colocation = "w:<op>"``, as TensorFlow colocates a
variable's ops).  Heavy ops (conv / matmul) have log-normally skewed times
and hold parameters (``batch_independent``: the weights, gradients and Adam
moments a heavy op holds, :mod:`celeritas_cli.scheduling.split_cost`); light
ops (bn, relu, add) are short.  Tensor sizes are
chosen so the CCR (Celeritas Eq. 1) on 4xV100 over PCIe is in the 20-50
range the paper's Table 2 reports for real models.  The same ``(n, seed)``
always gives the same graph.
"""

from __future__ import annotations

import random

from .graph import GRAPH_SCHEMA, Graph

MiB = 1024**2

HEAVY = ("aten.convolution", "aten.mm")
LIGHT = ("aten.native_batch_norm", "aten.relu", "aten.add", "aten.gelu", "aten.layer_norm")


def layered_doc(n: int, seed: int = 0, *, training: bool = True, name: str | None = None,
                residual_prob: float = 0.3, bytes_scale: float = 1.0, memory_scale: float = 1.0) -> dict:
    """The graph document of :func:`layered` (see the module docstring)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if n == 1:
        training = False
    rng = random.Random(seed)
    nodes: list[dict] = []
    edges: list[dict] = []
    out_bytes: list[int] = []
    fwd_edges: list[tuple[int, int]] = []
    is_param: list[bool] = []

    def budget(f: int, p: int) -> int:
        return 2 * f + p if training else f

    def add_node(op: str) -> int:
        i = len(nodes)
        heavy = op in HEAVY
        act = int(rng.lognormvariate(0.4, 0.8) * MiB * bytes_scale)
        # light ops are memory-bound (read + write at ~900 GB/s); heavy ops skewed
        comp = rng.lognormvariate(-11.1, 1.0) if heavy else 2.0 * act / 9.0e11 * rng.uniform(0.8, 1.5)
        params = int(rng.lognormvariate(-0.3, 1.2) * MiB * memory_scale) if heavy else 0
        mem = act + (4 * params if training else params)  # weights, grads, 2 Adam moments
        nodes.append({"id": f"{op.split('.')[-1]}_{i}", "op": op, "compute_s": round(comp, 9),
                      "memory_bytes": mem})
        if heavy:
            nodes[-1]["splittable"] = ["batch", "channel"] if op == "aten.convolution" else ["batch"]
            nodes[-1]["batch_independent"] = {"memory_bytes": mem - act, "state_bytes": params}
        out_bytes.append(act)
        is_param.append(heavy)
        return i

    def add_edge(s: int, d: int) -> None:
        fwd_edges.append((s, d))

    nparams = 0
    prev = add_node("aten.convolution")
    nparams += 1
    while budget(len(nodes), nparams) < n:
        width = rng.choice((1, 1, 1, 2, 3, 4))
        tails = []
        for _ in range(width):
            length = rng.randint(1, 4)
            cur = prev
            for j in range(length):
                if budget(len(nodes), nparams) >= n:
                    break
                op = rng.choice(HEAVY) if j == 0 else rng.choice(LIGHT)
                v = add_node(op)
                nparams += is_param[v]
                add_edge(cur, v)
                cur = v
            if cur != prev:
                tails.append(cur)
        if budget(len(nodes), nparams) >= n or not tails:
            break
        join = add_node("aten.cat" if len(tails) > 1 else "aten.add")
        for t in tails:
            add_edge(t, join)
        if rng.random() < residual_prob and prev not in tails:
            add_edge(prev, join)
        prev = join

    nf = len(nodes)
    for s, d in fwd_edges:
        edges.append({"src": nodes[s]["id"], "dst": nodes[d]["id"], "bytes": out_bytes[s],
                      "tensor": "out0"})
    if training:
        grad = [0] * nf
        for v in reversed(range(nf)):
            g = len(nodes)
            base = nodes[v]
            nodes.append({"id": f"grad_{base['id']}", "op": base["op"] + "_backward",
                          "compute_s": round(base["compute_s"] * rng.uniform(1.5, 2.5), 9),
                          "memory_bytes": out_bytes[v]})
            grad[v] = g
        for s, d in fwd_edges:
            # gradient flows d -> s; the gradient of s's output is as large as s's output
            edges.append({"src": nodes[grad[d]]["id"], "dst": nodes[grad[s]]["id"], "bytes": out_bytes[s],
                          "tensor": f"dgrad_{nodes[s]['id']}"})
        for v in range(nf):
            edges.append({"src": nodes[v]["id"], "dst": nodes[grad[v]]["id"], "bytes": out_bytes[v],
                          "tensor": "out0"})
        updates = [v for v in range(nf) if is_param[v]]
        excess = 2 * nf + len(updates) - n
        if excess > 0:
            updates = updates[:len(updates) - excess]
        for v in updates:
            group = f"w:{nodes[v]['id']}"
            nodes[v]["colocation"] = group
            pbytes = max(1, (nodes[v]["memory_bytes"] - out_bytes[v]) // 4)
            u = {"id": f"update_{nodes[v]['id']}", "op": "aten._fused_adam",
                 "compute_s": round(rng.lognormvariate(-11.0, 0.5), 9), "memory_bytes": 0,
                 "colocation": group}
            nodes.append(u)
            edges.append({"src": nodes[grad[v]]["id"], "dst": u["id"], "bytes": pbytes, "tensor": "wgrad"})
    return {"schema": GRAPH_SCHEMA, "name": name or f"layered_n{n}_s{seed}",
            "meta": {"source": f"synthetic layered n={n} seed={seed}",
                     "phase": "training" if training else "inference"},
            "nodes": nodes, "edges": edges}


def layered(n: int, seed: int = 0, **kwargs) -> Graph:
    """A DNN-like synthetic graph of exactly *n* nodes (see module docstring).

    Example
    -------
    >>> g = layered(50, seed=3)
    >>> g.n
    50
    """
    doc = layered_doc(n, seed, **kwargs)
    return Graph.from_dict(doc, label=doc["name"])
