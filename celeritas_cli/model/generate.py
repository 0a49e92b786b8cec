"""Deterministic synthetic DNN-like graphs for tests and benchmarks.

:func:`layered` builds a training-step graph the way frameworks lay one out:
a forward pass of blocks (1-4 parallel branches of 1-4 ops, a join, and
residual edges with some probability), the mirrored backward pass (one
gradient op per forward op, edges reversed, plus the saved activation edge
forward op -> its gradient op), and an optimizer update per parameterised
op, colocated with it (``colocation = "w:<op>"``, as TensorFlow colocates a
variable's ops).  Heavy ops (conv / matmul) have log-normally skewed times
and hold parameters (``batch_independent``: the weights, gradients and Adam
moments a heavy op holds, :mod:`celeritas_cli.transform.split_cost`); light
ops (bn, relu, add) are short.  Tensor sizes are
chosen so the CCR (Celeritas Eq. 1) on 4xV100 over PCIe is in the 20-50
range the paper's Table 2 reports for real models.  The same ``(n, seed)``
always gives the same graph.

Memory over time (docs/design.md, "Node memory"): every node says its
``pass`` (``forward``, ``backward``, ``update``) and its ``resident_bytes``.
A heavy op's parameters, their gradient buffers and the two Adam moments
(``4 x params`` in training, the parameters alone in inference) are
resident: the synthetic model keeps its gradient buffers allocated across
steps, as PyTorch DDP's gradient buckets do.  Everything else is an
activation: a forward op's output (saved for its gradient op, so it lives
until that op finishes), a gradient op's input gradient.  Updates hold
nothing of their own.  ``meta.batch_size`` is 128 samples: the costs are
those of one batch, and 128 divides into whole samples for every
data-parallel and micro-batch split up to 128 ways (powers of two up to 16
replicas times 8 micro-batches).

Example
-------
>>> doc = layered_doc(8, seed=1)
>>> doc["meta"]["batch_size"], sorted({nd["pass"] for nd in doc["nodes"]})
(128, ['backward', 'forward', 'update'])
>>> all(0 <= nd["resident_bytes"] <= nd["memory_bytes"] for nd in doc["nodes"])
True
"""

from __future__ import annotations

import random

from .graph import GRAPH_SCHEMA, Graph

MiB = 1024**2
#: the batch the synthetic costs hold for (``meta.batch_size``, module docstring)
BATCH_SIZE = 128

HEAVY = ("aten.convolution", "aten.mm")
LIGHT = ("aten.native_batch_norm", "aten.relu", "aten.add", "aten.gelu", "aten.layer_norm")


def layered_doc(n: int, seed: int = 0, *, training: bool = True, name: str | None = None,
                residual_prob: float = 0.3, bytes_scale: float = 1.0, memory_scale: float = 1.0) -> dict:
    """The graph document of :func:`layered` (see the module docstring)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if n == 1:
        training = False
    b = _Builder(random.Random(seed), training, bytes_scale, memory_scale)
    b.forward(n, residual_prob)
    nf = len(b.nodes)
    for s, d in b.fwd_edges:
        b.edges.append({"src": b.nodes[s]["id"], "dst": b.nodes[d]["id"], "bytes": b.out_bytes[s],
                        "tensor": "out0"})
    if training:
        grad = b.backward(nf)
        b.updates(nf, grad, n)
    return {"schema": GRAPH_SCHEMA, "name": name or f"layered_n{n}_s{seed}",
            "meta": {"source": f"synthetic layered n={n} seed={seed}",
                     "phase": "training" if training else "inference", "batch_size": BATCH_SIZE},
            "nodes": b.nodes, "edges": b.edges}


class _Builder:
    """The growing document of :func:`layered_doc`; one method per pass, drawing from one ``rng`` in a
    fixed order (forward, backward, updates), so ``(n, seed)`` fixes the graph."""

    def __init__(self, rng: random.Random, training: bool, bytes_scale: float, memory_scale: float):
        self.rng, self.training = rng, training
        self.bytes_scale, self.memory_scale = bytes_scale, memory_scale
        self.nodes: list[dict] = []
        self.edges: list[dict] = []
        self.out_bytes: list[int] = []
        self.fwd_edges: list[tuple[int, int]] = []
        self.is_param: list[bool] = []
        self.nparams = 0

    def budget(self) -> int:
        """Nodes the graph will have once the backward pass and updates are added."""
        f = len(self.nodes)
        return 2 * f + self.nparams if self.training else f

    def add_node(self, op: str) -> int:
        rng = self.rng
        i = len(self.nodes)
        heavy = op in HEAVY
        act = int(rng.lognormvariate(0.4, 0.8) * MiB * self.bytes_scale)
        # light ops are memory-bound (read + write at ~900 GB/s); heavy ops skewed
        comp = rng.lognormvariate(-11.1, 1.0) if heavy else 2.0 * act / 9.0e11 * rng.uniform(0.8, 1.5)
        params = int(rng.lognormvariate(-0.3, 1.2) * MiB * self.memory_scale) if heavy else 0
        mem = act + (4 * params if self.training else params)  # weights, grads, 2 Adam moments
        self.nodes.append({"id": f"{op.split('.')[-1]}_{i}", "op": op, "compute_s": round(comp, 9),
                           "memory_bytes": mem, "resident_bytes": mem - act, "pass": "forward"})
        if heavy:
            self.nodes[-1]["splittable"] = ["batch", "channel"] if op == "aten.convolution" else ["batch"]
            self.nodes[-1]["batch_independent"] = {"memory_bytes": mem - act, "state_bytes": params}
        self.out_bytes.append(act)
        self.is_param.append(heavy)
        self.nparams += heavy
        return i

    def forward(self, n: int, residual_prob: float) -> None:
        """Blocks of 1-4 branches of 1-4 ops (a heavy op, then light ones), a join and maybe a residual
        edge, until the finished graph would reach *n* nodes."""
        rng = self.rng
        prev = self.add_node("aten.convolution")
        while self.budget() < n:
            width = rng.choice((1, 1, 1, 2, 3, 4))
            tails = []
            for _ in range(width):
                length = rng.randint(1, 4)
                cur = prev
                for j in range(length):
                    if self.budget() >= n:
                        break
                    v = self.add_node(rng.choice(HEAVY) if j == 0 else rng.choice(LIGHT))
                    self.fwd_edges.append((cur, v))
                    cur = v
                if cur != prev:
                    tails.append(cur)
            if self.budget() >= n or not tails:
                break
            join = self.add_node("aten.cat" if len(tails) > 1 else "aten.add")
            for t in tails:
                self.fwd_edges.append((t, join))
            if rng.random() < residual_prob and prev not in tails:
                self.fwd_edges.append((prev, join))
            prev = join

    def backward(self, nf: int) -> list[int]:
        """One gradient op per forward op (reverse order), the reversed edges and the saved activation
        edges; returns forward node -> its gradient node."""
        nodes, edges, out_bytes = self.nodes, self.edges, self.out_bytes
        grad = [0] * nf
        for v in reversed(range(nf)):
            g = len(nodes)
            base = nodes[v]
            nodes.append({"id": f"grad_{base['id']}", "op": base["op"] + "_backward",
                          "compute_s": round(base["compute_s"] * self.rng.uniform(1.5, 2.5), 9),
                          "memory_bytes": out_bytes[v], "resident_bytes": 0, "pass": "backward"})
            grad[v] = g
        for s, d in self.fwd_edges:
            # gradient flows d -> s; the gradient of s's output is as large as s's output
            edges.append({"src": nodes[grad[d]]["id"], "dst": nodes[grad[s]]["id"], "bytes": out_bytes[s],
                          "tensor": f"dgrad_{nodes[s]['id']}"})
        for v in range(nf):
            edges.append({"src": nodes[v]["id"], "dst": nodes[grad[v]]["id"], "bytes": out_bytes[v],
                          "tensor": "out0"})
        return grad

    def updates(self, nf: int, grad: list[int], n: int) -> None:
        """An Adam update per parameterised op (as many as fit in *n* nodes), colocated with it and fed
        by its gradient op."""
        nodes = self.nodes
        updates = [v for v in range(nf) if self.is_param[v]]
        excess = 2 * nf + len(updates) - n
        if excess > 0:
            updates = updates[:len(updates) - excess]
        for v in updates:
            group = f"w:{nodes[v]['id']}"
            nodes[v]["colocation"] = group
            pbytes = max(1, (nodes[v]["memory_bytes"] - self.out_bytes[v]) // 4)
            u = {"id": f"update_{nodes[v]['id']}", "op": "aten._fused_adam",
                 "compute_s": round(self.rng.lognormvariate(-11.0, 0.5), 9), "memory_bytes": 0,
                 "resident_bytes": 0, "pass": "update", "colocation": group}
            nodes.append(u)
            self.edges.append({"src": nodes[grad[v]]["id"], "dst": u["id"], "bytes": pbytes, "tensor": "wgrad"})


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
