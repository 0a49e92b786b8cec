"""Operation features and colocation units of the Hierarchical Planner
(Mirhoseini et al., ICLR 2018, section 2: "type, size and number of outputs,
as well as connections to other operations"), pure Python so they import
without torch."""

from __future__ import annotations

import math
from typing import Any

from ....model.costs import CostModel
from ....model.graph import Graph

MAX_OUTPUTS = 5
"""Output tensors per op encoded in the features (the released controller's
``max_num_outputs``)."""
ADJ_DIM = 20
"""Width of the adjacency feature (the released controller's ``adj_embed_dim``)."""
TYPE_DIM = 16
"""Size of the trainable op-type embedding."""
SIZE_DIM = MAX_OUTPUTS + 4  # output sizes, output count, compute, memory, topo position


def units(graph: Graph) -> tuple[list[int], int]:
    """Colocation units: nodes sharing a colocation value form one unit,
    every other node is its own unit; units are numbered by their first node
    index.  Returns ``(unit_of, number_of_units)``."""
    unit_of, members = graph.colocation_units()
    return unit_of, len(members)


def op_features(graph: Graph, costs: CostModel | None = None) -> dict[str, Any]:
    """Per-operation features of HRL section 2 ("type, size and number of
    outputs, as well as connections to other operations"), pure Python.

    Parameters
    ----------
    graph : Graph
    costs : CostModel, optional
        For the mean node time (defaults to ``graph.compute``).

    Returns
    -------
    dict
        ``types`` (sorted distinct op names), ``type_idx[v]``,
        ``size[v]`` (``SIZE_DIM`` floats: the node's output tensor sizes,
        ``log1p(bytes) / log1p(largest tensor)``, largest first, up to
        ``MAX_OUTPUTS``, zero-padded; the number of outputs / the largest
        count; compute / largest; memory / largest; (topo index + 1) / n),
        ``adj[v]`` (``ADJ_DIM`` floats: the released controller's encoding,
        pairs ``(neighbour position, +1)`` for successors then ``(position,
        -1)`` for predecessors, truncated / zero-padded, with positions
        ``(topo index + 1) / n`` so 0 means "none").

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "op": "mm"},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0, "op": "relu"}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> f = op_features(g)
    >>> f["types"], f["type_idx"], f["size"][0][:MAX_OUTPUTS + 1], f["adj"][0][:4]
    (['mm', 'relu'], [0, 1], [1.0, 0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    """
    n = graph.n
    types = sorted(set(graph.op))
    tindex = {t: i for i, t in enumerate(types)}
    outs: list[list[int]] = [[] for _ in range(n)]
    for t, p in enumerate(graph.tensor_src):
        outs[p].append(graph.tensor_bytes[t])
    max_bytes = max(graph.tensor_bytes, default=0)
    lmax = math.log1p(max_bytes) if max_bytes > 0 else 1.0
    max_cnt = max((len(o) for o in outs), default=0) or 1
    comp = costs.mean_time if costs is not None else graph.compute
    cmax = max(comp, default=0.0) or 1.0
    mmax = max(graph.memory, default=0) or 1
    pos = graph.topo_index()
    size: list[list[float]] = []
    adj: list[list[float]] = []
    for v in range(n):
        sizes = sorted(outs[v], reverse=True)[:MAX_OUTPUTS]
        row = [math.log1p(b) / lmax for b in sizes] + [0.0] * (MAX_OUTPUTS - len(sizes))
        row += [len(outs[v]) / max_cnt, comp[v] / cmax, graph.memory[v] / mmax, (pos[v] + 1) / n]
        size.append(row)
        a: list[float] = []
        for s in graph.succ[v]:
            a += [(pos[s] + 1) / n, 1.0]
        for p in graph.pred[v]:
            a += [(pos[p] + 1) / n, -1.0]
        a = a[:ADJ_DIM]
        adj.append(a + [0.0] * (ADJ_DIM - len(a)))
    return {"types": types, "type_idx": [tindex[o] for o in graph.op], "size": size, "adj": adj}


def default_groups(graph: Graph) -> int:
    """HRL's number of groups M (a hyperparameter): 256, or fewer when the
    graph has fewer colocation units than that."""
    return max(1, min(256, units(graph)[1]))
