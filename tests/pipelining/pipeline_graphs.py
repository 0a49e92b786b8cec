"""Tiny training graphs for the pipeline, micro-batch and recompute tests."""

from __future__ import annotations

from celeritas_cli.model.graph import build


def layer_chain(layers: int = 3, *, tf: float = 4.0, tb: float = 8.0, tu: float = 0.0, act: int = 400,
                params: int = 0, grad: int = 0, batch: int = 4, passes: bool = True, resident: bool = True):
    """``x -> f0 -> ... -> f{L-1}``, the loss gradient at ``b{L-1}``, then
    ``b{L-1} -> ... -> b0``; ``f_i`` keeps its output ``y_i`` (``act``
    bytes) for ``b_i``, holds ``params`` bytes of parameters (resident) and
    is colocated with its update ``u_i`` (``2 params`` of optimizer state);
    ``b_i`` sends the ``grad``-byte gradient ``g`` to ``u_i`` and keeps it.
    Times on the whole batch of ``batch`` samples: ``tf``, ``tb``, ``tu``."""

    def node(nid, c, mem, p, op, res, **kw):
        nd = {"id": nid, "op": op, "compute_s": c, "memory_bytes": mem, **kw}
        if passes:
            nd["pass"] = p
        if resident:
            nd["resident_bytes"] = res
        return nd

    nodes = [node("x", 0.0, 0, "forward", "placeholder", 0)]
    edges = [{"src": "x", "dst": "f0", "bytes": act, "tensor": "y"}]
    for i in range(layers):
        nodes.append(node(f"f{i}", tf, act + params, "forward", "aten.mm", params, colocation=f"w{i}",
                          batch_independent={"memory_bytes": params, "state_bytes": params}))
        nxt = f"f{i + 1}" if i + 1 < layers else f"b{layers - 1}"
        edges.append({"src": f"f{i}", "dst": nxt, "bytes": act, "tensor": "y"})
        if i + 1 < layers:
            edges.append({"src": f"f{i}", "dst": f"b{i}", "bytes": act, "tensor": "y"})
    for i in reversed(range(layers)):
        nodes.append(node(f"b{i}", tb, grad, "backward", "aten.mm_backward", 0,
                          batch_independent={"memory_bytes": grad}))
        if i > 0:
            edges.append({"src": f"b{i}", "dst": f"b{i - 1}", "bytes": act, "tensor": "dx"})
        edges.append({"src": f"b{i}", "dst": f"u{i}", "bytes": grad, "tensor": "g"})
    for i in range(layers):
        nodes.append(node(f"u{i}", tu, 2 * params, "update", "optim.sgd", 2 * params, colocation=f"w{i}"))
    return build(f"chain{layers}", nodes, edges, meta={"phase": "training", "batch_size": batch})
