"""Which pass of a training step each node belongs to: ``forward``,
``backward`` or ``update`` (the optimizer step).

Pipeline schedules order a stage's work by pass (GPipe: all forwards, then
all backwards; 1F1B: one forward, one backward), recomputation clones
forward nodes for the backward, and micro-batching puts gradient
accumulation in the backward, so every rewrite and schedule needs each
node's pass.

Source of truth
---------------
1. The node field ``pass`` (``"forward"``, ``"backward"`` or ``"update"``),
   written by ``placer profile`` and the synthetic generator, and
   propagated by every rewrite.
2. Otherwise a structural fallback (graphs written before the field
   existed, converted files):

   * **update**: an optimizer update
     (:func:`~celeritas_cli.transform.split_cost.is_update`), or a node that
     only updates reach (work after the optimizer step);
   * **loss-gradient seeds**: the gradient ops (``*_backward*`` /
     ``*Grad*`` / ``*backprop*`` op names, PyTorch's and TensorFlow's
     naming) that no other gradient op reaches: the first nodes of the
     backward pass (``nll_loss_backward``); one per loss, so one per
     replica of a data-parallel graph.  A graph without gradient op names
     uses the brief's rule instead: the last node, in topological order,
     that is an ancestor of every update (the point where the backward pass
     branches into the parameters' gradients);
   * **backward**: the seeds and everything they reach, except updates;
   * **forward**: every other node (the loss and what it is computed from,
     saved tensors the backward reads, parameter reads, data inputs).

   An inference graph (``meta.phase == "inference"``, or no update and no
   gradient op) is all forward.

Structurally, the backward pass of a training step is exactly the part of
the graph that depends on the loss gradient (every gradient of the chain
rule does), which is why "reached from the seed" is the rule; GPipe's
re-materialisation (Huang et al., NeurIPS 2019, 2.3) and the pipeline
schedules of Narayanan et al. (SC'21, 2.2) all rest on this split of a step
into a forward and a backward part.

Example
-------
>>> from celeritas_cli.model.graph import build
>>> nd = lambda i, op="aten.mm", **kw: {"id": i, "op": op, "compute_s": 1, "memory_bytes": 0, **kw}
>>> g = build("t", [nd("x"), nd("loss", "aten.nll_loss_forward"), nd("dloss", "aten.nll_loss_backward"),
...                 nd("dx", "aten.mm"), nd("u", "optim.sgd")],
...           [{"src": "x", "dst": "loss", "bytes": 1}, {"src": "loss", "dst": "dloss", "bytes": 1},
...            {"src": "x", "dst": "dx", "bytes": 1}, {"src": "dloss", "dst": "dx", "bytes": 1},
...            {"src": "dx", "dst": "u", "bytes": 1}])
>>> node_passes(g)
['forward', 'forward', 'backward', 'backward', 'update']
"""

from __future__ import annotations

import re

from ..errors import InvalidInput
from ..model.graph import Graph
from .split_cost import is_update

PASSES = ("forward", "backward", "update")
__all__ = ["PASSES", "declares_passes", "is_gradient_op", "loss_seeds", "node_passes"]

_GRAD_OP_RE = re.compile(r"backward|backprop|grad", re.IGNORECASE)


def _extra(graph: Graph, v: int, key: str):
    extra = graph.node_extra[v] if graph.node_extra else None
    return extra.get(key) if extra else None


def declares_passes(graph: Graph) -> bool:
    """True when at least one node of *graph* carries a ``pass`` field."""
    return any(_extra(graph, v, "pass") is not None for v in range(graph.n))


def is_gradient_op(graph: Graph, v: int) -> bool:
    """True when node *v*'s op names a gradient op (``aten.*_backward*``,
    TensorFlow ``*Grad*`` / ``*Backprop*``) and it is not an update.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("o", [{"id": "a", "op": "aten.convolution_backward", "compute_s": 0, "memory_bytes": 0},
    ...                 {"id": "b", "op": "ReluGrad", "compute_s": 0, "memory_bytes": 0},
    ...                 {"id": "c", "op": "aten.mm", "compute_s": 0, "memory_bytes": 0}], [])
    >>> [is_gradient_op(g, v) for v in range(3)]
    [True, True, False]
    """
    short = graph.op[v].rsplit(".", 1)[-1]
    return bool(_GRAD_OP_RE.search(short)) and not is_update(graph, v)


def node_passes(graph: Graph) -> list[str]:
    """The pass of every node of *graph* (module docstring): its ``pass``
    field where present, the structural fallback elsewhere.  Computed once
    per graph object.

    Raises
    ------
    InvalidInput
        A ``pass`` field that is not ``forward``, ``backward`` or ``update``.
    """
    cached = graph.__dict__.get("_node_passes")
    if cached is None:
        cached = graph.__dict__["_node_passes"] = _passes(graph)
    return cached


def _passes(graph: Graph) -> list[str]:
    given = [_extra(graph, v, "pass") for v in range(graph.n)]
    for v, p in enumerate(given):
        if p is not None and p not in PASSES:
            raise InvalidInput(f"graph '{graph.name}': node '{graph.ids[v]}' has pass {p!r} "
                               f"(use {', '.join(PASSES)})")
    if all(p is not None for p in given):
        return list(given)
    out = _structural(graph)
    return [p if p is not None else q for p, q in zip(given, out)]


def _structural(graph: Graph) -> list[str]:
    n = graph.n
    update = [is_update(graph, v) for v in range(n)]
    out = ["forward"] * n
    if graph.meta.get("phase") == "inference":
        return ["update" if u else "forward" for u in update]
    topo = graph.topo_order()
    after_update = [False] * n  # reached from an update only through non-updates
    for v in topo:
        after_update[v] = bool(graph.pred[v]) and all(update[u] or after_update[u] for u in graph.pred[v])
    backward = [False] * n
    for s in loss_seeds(graph):
        backward[s] = True
    for v in topo:
        if not backward[v] and any(backward[u] for u in graph.pred[v]):
            backward[v] = True
    for v in range(n):
        if update[v] or (after_update[v] and not backward[v]):
            out[v] = "update"
        elif backward[v]:
            out[v] = "backward"
    return out


def loss_seeds(graph: Graph) -> list[int]:
    """The first nodes of the backward pass (module docstring), in
    topological order: the gradient ops no other gradient op reaches, or,
    without gradient op names, the last ancestor of every update; ``[]``
    for a graph with neither (inference).

    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 0}
    >>> g = build("s", [nd("f"), nd("l"), nd("b1"), nd("b2"), {**nd("u1"), "op": "optim.sgd"},
    ...                 {**nd("u2"), "op": "optim.sgd"}],
    ...           [{"src": "f", "dst": "l", "bytes": 1}, {"src": "l", "dst": "b1", "bytes": 1},
    ...            {"src": "l", "dst": "b2", "bytes": 1}, {"src": "b1", "dst": "u1", "bytes": 1},
    ...            {"src": "b2", "dst": "u2", "bytes": 1}])
    >>> [g.ids[v] for v in loss_seeds(g)]
    ['l']
    """
    topo = graph.topo_order()
    grad = [is_gradient_op(graph, v) for v in range(graph.n)]
    if any(grad):
        below = [False] * graph.n  # reached from a gradient op
        seeds = []
        for v in topo:
            below[v] = any(grad[u] or below[u] for u in graph.pred[v])
            if grad[v] and not below[v]:
                seeds.append(v)
        return seeds
    updates = [v for v in range(graph.n) if is_update(graph, v)]
    if not updates:
        return []
    bit = {u: 1 << i for i, u in enumerate(updates)}
    full = (1 << len(updates)) - 1
    reach = [0] * graph.n
    for v in reversed(topo):
        r = bit.get(v, 0)
        for s in graph.succ[v]:
            r |= reach[s]
        reach[v] = r
    last = [v for v in topo if reach[v] == full and v not in bit]
    return last[-1:]
