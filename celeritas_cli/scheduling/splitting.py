"""Operation splitting as a graph transformation (FastT section 5.2,
Algorithm 2's ``SplitOperation``; FD-DPS section 4.1's intra-operator
parallelism).  Shared by ``os-dpos`` and ``fd-dps --split``.

:func:`split_operation` replaces one node ``op`` of a graph that lists a
dimension in its ``splittable`` field by ``n`` sub-operations and returns a
new, validated :class:`~celeritas_cli.model.graph.Graph` (built as a
``placer.graph/v1`` document and loaded with ``Graph.from_dict``, so it is
checked exactly like a file and :func:`~celeritas_cli.sim.simulator.simulate`
accepts it).  A placement computed on the split graph is written over the
split graph's node ids and carries the split graph document in
``Placement.split_graph``; the simulator then simulates that graph, i.e.
exactly what was planned.

Structure (FastT Algorithm 2, lines 16-30)
------------------------------------------
* ``op/part{i}`` for ``i = 0..n-1``: the sub-operations ``s_i``.
* ``op/split{j}``: one split node per distinct input tensor of ``op``
  (the paper adds one per predecessor; a predecessor normally sends one
  tensor, and one per tensor keeps the simulator's one-transfer-per-tensor
  rule).  It receives the whole tensor (same tensor identity as before, so a
  producer feeding several consumers still sends it once per device) and
  sends slice ``i`` to ``s_i``.  Only for ``batch`` splits: a ``channel``
  split needs the whole input in every part, so the producer feeds every
  ``s_i`` directly with its original tensor (sent once per device).
* ``op/concat{j}``: one concat node per distinct output tensor (the paper
  adds one per successor; they would all compute the same concatenation,
  so one per tensor is shared by the successors).  ``s_i`` sends it its
  slice; it sends the whole tensor, under its old name, to every consumer.
* ``op/weights`` (only when ``op`` holds parameters, see below): a
  zero-cost source node standing for the parameter variables' home.  It
  inherits ``op``'s ``colocation`` (so the variables stay with their
  update op) and sends the parameters to every part: the same tensor for
  a batch split (a broadcast, sent once per device, FastT 6.4 "to avoid
  overhead of broadcasting parameters to all replicas"), slice ``i`` for a
  channel split.  The parts themselves carry no colocation, which is what
  lets them run on different devices.

Cost model
----------
With ``act`` = activation bytes of ``op`` (its ``output_bytes`` field when
present, else its largest output tensor, at most ``memory_bytes``) and
``state = memory_bytes - act`` (parameters, gradients, optimiser state):

* sub-op time = ``time / n + overhead_s`` on every device type (``compute_s``
  and each ``compute_by_type`` entry), ``overhead_s`` (default
  :data:`DEFAULT_OVERHEAD_S` = 2 µs) being one extra kernel launch.
* sub-op memory: batch split replicates the state and divides activations,
  ``state + ceil(act / n)``; channel split divides both,
  ``ceil(state / n) + ceil(act / n)``.
* tensor bytes: the slices sent to and from the parts are ``ceil(b / n)``
  of each tensor ``b`` (channel-split inputs excepted, see above).
* parameters sent by ``op/weights``: ``state / 4`` in a training graph
  (``meta.phase == "training"``: weights, gradients and two Adam moments,
  the generator's rule) and ``state`` otherwise; whole for batch, divided
  for channel.  Gradient all-reduce of batch replicas is not modelled.
* split and concat nodes: memory-bound copies, ``compute_s = 2 · bytes /
  9e11`` (read + write at V100 HBM bandwidth, the generator's light-op
  rule), memory 0 (the tensors they produce are the parts' / op's
  activations, already counted).

Sub-operations are not splittable again (``splittable`` is dropped).

Coarse graphs
-------------
Unsplit nodes keep their ``members``, so a placement still expands to
original ids.  The new nodes (parts, split, concat, weights) carry no
``members``: one original operator now runs on several devices, so it cannot
be expanded back; the split node's members are recorded in
``meta.splits[*].members`` and its placement is written over the new ids.

``meta`` of the result: the input's meta plus ``split_from`` (the name of
the graph that was first split) and ``splits`` (one record per split:
``node``, ``dim``, ``n``, ``parts``, ``members``), appended to when a split
graph is split again.

References
----------
FastT: Yi et al., "Optimizing Distributed Training Deployment in
Heterogeneous GPU Clusters", CoNEXT 2020, section 5.2, Algorithm 2.
FD-DPS, section 4.1 (intra-operator parallelism with a tensor dimension).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph

DEFAULT_OVERHEAD_S = 2.0e-6
COPY_BANDWIDTH_BPS = 9.0e11
DIMENSIONS = ("batch", "channel")


def _ceil_div(a: int, n: int) -> int:
    return -(-int(a) // n)


def activation_bytes(graph: Graph, v: int) -> int:
    """Activation bytes of node *v*: its ``output_bytes`` field, else its
    largest output tensor, capped at ``memory_bytes``."""
    extra = graph.node_extra[v] if graph.node_extra else None
    if extra and isinstance(extra.get("output_bytes"), int):
        act = extra["output_bytes"]
    else:
        act = max((graph.edge_bytes[e] for e in graph.out_edges[v]), default=0)
    return max(0, min(int(act), graph.memory[v]))


def _edge_dicts(graph: Graph) -> list[dict]:
    """Edge dicts of *graph*, always with an explicit tensor name."""
    out = []
    ids = graph.ids
    for e in range(graph.m):
        ed: dict[str, Any] = {"src": ids[graph.edge_src[e]], "dst": ids[graph.edge_dst[e]],
                              "bytes": graph.edge_bytes[e], "tensor": graph.tensor_name[graph.edge_tensor[e]]}
        if graph.edge_comm[e]:
            ed["comm_s_by_pair"] = graph.edge_comm[e]
        out.append(ed)
    return out


def split_operation(graph: Graph, node: int | str, dim: str, n: int, *,
                    overhead_s: float = DEFAULT_OVERHEAD_S) -> Graph:
    """Split *node* of *graph* along *dim* into *n* sub-operations.

    Parameters
    ----------
    graph : Graph
        Any graph (fine, coarse or already split).
    node : int or str
        Node index or id; it must list *dim* in ``splittable``.
    dim : str
        ``"batch"`` or ``"channel"`` (see the module docstring for the cost
        model of each).
    n : int
        Number of parts, ``n >= 2``.
    overhead_s : float
        Extra time of each sub-operation (one kernel launch).

    Returns
    -------
    Graph
        A new validated graph; *graph* is unchanged.

    Raises
    ------
    InvalidInput
        Unknown node, a dimension the node does not list, ``n < 2``.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}],
    ...           [{"src": "a", "dst": "c", "bytes": 100}])
    >>> s = split_operation(g, "c", "batch", 2, overhead_s=0.0)
    >>> [s.ids[v] for v in range(s.n)], s.compute[2]
    (['a', 'c/split0', 'c/part0', 'c/part1'], 2.0)
    """
    if isinstance(node, str):
        if node not in graph.index:
            raise InvalidInput(f"split: graph '{graph.name}' has no node '{node}'")
        v = graph.index[node]
    else:
        v = int(node)
    vid = graph.ids[v]
    dims = graph.splittable[v] or []
    if dim not in dims:
        raise InvalidInput(f"split: node '{vid}' cannot be split along '{dim}' "
                           f"(its splittable field lists {dims or 'nothing'})")
    if dim not in DIMENSIONS:
        raise InvalidInput(f"split: node '{vid}': unknown dimension '{dim}' (known: {', '.join(DIMENSIONS)})")
    n = int(n)
    if n < 2:
        raise InvalidInput(f"split: node '{vid}': the number of parts must be at least 2, got {n}")

    taken = set(graph.ids)
    for mb in graph.members:
        if mb:
            taken.update(mb)

    def fresh(name: str) -> str:
        while name in taken:
            name += "~"
        taken.add(name)
        return name

    doc = graph.to_dict()
    nodes = doc["nodes"]
    batch = dim == "batch"
    act = activation_bytes(graph, v)
    state = graph.memory[v] - act
    training = graph.meta.get("phase") == "training"
    param_bytes = state // 4 if training else state
    base = nodes[v]
    by = graph.compute_by_type[v]

    parts = [fresh(f"{vid}/part{i}") for i in range(n)]
    part_mem = (state if batch else _ceil_div(state, n)) + _ceil_div(act, n)
    new_nodes: list[dict] = []
    new_edges: list[dict] = []
    weights = None
    if param_bytes > 0:
        weights = fresh(f"{vid}/weights")
        wn: dict[str, Any] = {"id": weights, "op": "weights", "compute_s": 0.0, "memory_bytes": 0}
        if graph.colocation[v] is not None:
            wn["colocation"] = graph.colocation[v]
        new_nodes.append(wn)
        for i, pid in enumerate(parts):
            if batch:
                new_edges.append({"src": weights, "dst": pid, "bytes": int(param_bytes), "tensor": "params"})
            else:
                new_edges.append({"src": weights, "dst": pid, "bytes": _ceil_div(param_bytes, n),
                                  "tensor": f"params{i}"})

    # inputs: group v's in-edges by tensor id, in edge order
    edicts = _edge_dicts(graph)
    in_groups: dict[int, list[int]] = {}
    for e in graph.in_edges[v]:
        in_groups.setdefault(graph.edge_tensor[e], []).append(e)
    for j, (t, es) in enumerate(in_groups.items()):
        e0 = es[0]
        tb = graph.tensor_bytes[t]
        if batch:
            sp = fresh(f"{vid}/split{j}")
            new_nodes.append({"id": sp, "op": "split", "compute_s": 2.0 * tb / COPY_BANDWIDTH_BPS,
                              "memory_bytes": 0})
            ed = dict(edicts[e0])
            ed["dst"] = sp
            new_edges.append(ed)
            for i, pid in enumerate(parts):
                new_edges.append({"src": sp, "dst": pid, "bytes": _ceil_div(tb, n), "tensor": f"part{i}"})
        else:
            for pid in parts:
                ed = dict(edicts[e0])
                ed["dst"] = pid
                new_edges.append(ed)

    for i, pid in enumerate(parts):
        pn: dict[str, Any] = {"id": pid, "op": base.get("op", "op"),
                              "compute_s": graph.compute[v] / n + overhead_s, "memory_bytes": int(part_mem)}
        if by:
            pn["compute_by_type"] = {k: val / n + overhead_s for k, val in sorted(by.items())}
        new_nodes.append(pn)

    # outputs: one concat node per distinct output tensor
    out_groups: dict[int, list[int]] = {}
    for e in graph.out_edges[v]:
        out_groups.setdefault(graph.edge_tensor[e], []).append(e)
    for j, (t, es) in enumerate(out_groups.items()):
        tb = graph.tensor_bytes[t]
        con = fresh(f"{vid}/concat{j}")
        new_nodes.append({"id": con, "op": "concat", "compute_s": 2.0 * tb / COPY_BANDWIDTH_BPS,
                          "memory_bytes": 0})
        for pid in parts:
            new_edges.append({"src": pid, "dst": con, "bytes": _ceil_div(tb, n), "tensor": f"out{j}"})
        for e in es:
            ed = dict(edicts[e])
            ed["src"] = con
            new_edges.append(ed)

    touching = set(graph.in_edges[v]) | set(graph.out_edges[v])
    out_nodes = nodes[:v] + new_nodes + nodes[v + 1:]
    out_edges = [ed for e, ed in enumerate(edicts) if e not in touching] + new_edges
    meta = dict(graph.meta)
    meta.setdefault("split_from", graph.meta.get("split_from", graph.name))
    record = {"node": vid, "dim": dim, "n": n, "parts": parts, "members": graph.original_ids(v)}
    meta["splits"] = list(graph.meta.get("splits", [])) + [record]
    name = graph.name if "split_from" in graph.meta else f"{graph.name}+split"
    new_doc = {"schema": GRAPH_SCHEMA, "name": name, "meta": meta, "nodes": out_nodes, "edges": out_edges}
    return Graph.from_dict(new_doc, label=name)


def split_many(graph: Graph, decisions: list[tuple[str, str, int]], *,
               overhead_s: float = DEFAULT_OVERHEAD_S) -> Graph:
    """Apply ``(node id, dim, n)`` splits in order (FastT's split list SP)."""
    for nid, dim, n in decisions:
        graph = split_operation(graph, nid, dim, n, overhead_s=overhead_s)
    return graph


def is_split_graph(graph: Graph) -> bool:
    """True when *graph* came out of :func:`split_operation`."""
    return bool(graph.meta.get("splits"))

