"""Activation recomputation as a graph transformation: a forward node's
activation is dropped once its forward readers are done and recomputed,
just before the backward needs it, by a clone of the node (Chen et al.,
"Training Deep Nets with Sublinear Memory Cost", 2016, section 3-4:
drop the results of a segment, keep its input, recompute the segment in the
backward; GPipe's re-materialisation, Huang et al., NeurIPS 2019, 2.3;
Megatron-LM's activation recomputation, Narayanan et al., SC'21, 3.5).

:func:`recompute_graph` returns a new validated graph; the recipe step is
``{"transform": "recompute", "nodes": [ids]}`` (:func:`recompute_step`).

Structure
---------
For every listed forward node ``v`` whose activation a backward node reads:

* ``<v>/recompute`` (field ``recompute_of`` = ``v``; ``v``'s other fields
  kept, so a micro-batch copy's clone keeps its ``microbatch`` and
  ``origin``; ``origin`` = ``v`` when ``v`` has none) has ``v``'s op and times, and ``v``'s activation as memory
  (``resident_bytes`` 0, ``batch_independent.memory_bytes`` 0): it holds
  the recomputed activation until its backward readers finish.  It keeps
  ``v``'s colocation (in a plain graph ``v`` reads its parameters on its
  own device; in a micro-batched graph it reads ``params`` from the
  ``weights`` node like ``v``).  The clone of a collective node (a
  tensor-parallel all-reduce recomputed with its layer, as Megatron-LM's
  full recomputation reruns it) is a collective of its own: group
  ``<group>/recompute``, the same ``seq``.
* Its inputs are ``v``'s inputs, from the clone of the producer when the
  producer is recomputed too (a recomputed segment is recomputed from its
  first input, Chen et al.'s checkpoint), else from the producer, which
  therefore keeps that activation until the clone has run.
* ``v``'s tensors that a backward node or a clone reads (parameter reads,
  ``batch_independent.state_tensors``, excepted: they are resident state)
  go to those readers from the clone; ``v`` keeps sending them to its
  forward readers.  Under the time rule ``v``'s activation is then live
  from ``v``'s start to its last forward reader, and the clone's from the
  clone's start to its last backward reader: less memory between the
  forward and the backward, one more run of ``v`` (the trade the issue's
  hand test shows).  The static rule charges both (it cannot see when
  memory is freed).
* The clones of one micro-batch (one replica) that read no other clone
  also read the gradients that enter their backward readers from outside
  (from backward nodes that do not depend on the clones: in a pipeline,
  the gradient the next stage sends): recomputation starts once the
  backward of that micro-batch can start, as Megatron-LM and GPipe
  recompute, never earlier (the gradient goes to the clone's device anyway,
  for its backward readers; the extra edge carries no new traffic there).
  With ``segments`` (the step's ``"segments": true``) each connected part
  of a micro-batch's clones (clones reading each other) is gated on its
  own: when every transformer layer's input is kept, a layer's clones wait
  for the gradient entering that layer's backward, so one layer is
  recomputed at a time (Megatron-LM's ``--recompute-method uniform``), and
  the tensor ranks of a micro-batch are gated apart.

Listed ids are ids of the graph, or the ``origin`` of micro-batch copies
(all of them), so one step lists the model's nodes however many
micro-batches there are.  A listed node that no backward node reads from is
left as it is.  Refused, in one line: an unknown id, a node that is not in
the forward pass (:mod:`~celeritas_cli.transform.passes`), a recompute
clone.

``meta.recompute``: the ids recomputed (appended to when recomputed again).

References
----------
Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory
Cost", arXiv:1604.06174, 2016, sections 3-4; Huang et al., "GPipe",
NeurIPS 2019, 2.3; Narayanan et al., SC'21, 3.5.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph
from .microbatch import declares_resident
from .passes import node_passes
from .size import Size, check_size
from .split_cost import batch_profile
from .splitting import edge_dicts, fresh_namer

__all__ = ["apply_recompute_step", "recompute_graph", "recompute_size", "recompute_step", "resolve_nodes"]


def recompute_step(nodes: list[str], segments: bool = False) -> dict:
    """The recipe step of :func:`recompute_graph` (``segments`` written only when set)."""
    step: dict[str, Any] = {"transform": "recompute", "nodes": [str(x) for x in nodes]}
    if segments:
        step["segments"] = True
    return step


def _extra(graph: Graph, v: int) -> dict:
    return (graph.node_extra[v] or {}) if graph.node_extra else {}


def resolve_nodes(graph: Graph, ids: list[str]) -> list[int]:
    """Node indices named by *ids*: a node id, or the ``origin`` of
    micro-batch copies (all of them); in index order, each once.

    Raises
    ------
    InvalidInput
        An id that names no node and no copies, a node outside the forward
        pass, or a recompute clone.
    """
    copies: dict[str, list[int]] = {}
    for v in range(graph.n):
        ex = _extra(graph, v)
        if "microbatch" in ex and "origin" in ex and "recompute_of" not in ex and graph.op[v] != "accumulate_grad":
            copies.setdefault(str(ex["origin"]), []).append(v)
    passes = node_passes(graph)
    chosen: set[int] = set()
    for nid in ids:
        if not isinstance(nid, str):
            raise InvalidInput(f"recompute: node ids must be strings, got {nid!r}")
        vs = [graph.index[nid]] if nid in graph.index else copies.get(nid)
        if not vs:
            raise InvalidInput(f"recompute: graph '{graph.name}' has no node '{nid}' (nor micro-batch copies of it)")
        for v in vs:
            if "recompute_of" in _extra(graph, v):
                raise InvalidInput(f"recompute: node '{graph.ids[v]}' is already a recompute clone")
            if passes[v] != "forward":
                raise InvalidInput(f"recompute: node '{graph.ids[v]}' is in the {passes[v]} pass; only forward "
                                   f"nodes' activations can be recomputed")
            chosen.add(v)
    return sorted(chosen)


def recompute_graph(graph: Graph, nodes: list[str], *, segments: bool = False) -> Graph:
    """*graph* with the activations of *nodes* recomputed in the backward
    (module docstring).

    Parameters
    ----------
    graph : Graph
        A training graph (plain, micro-batched, split or data-parallel).
    nodes : list of str
        Node ids, or origins of micro-batch copies.
    segments : bool
        Gate each *segment* of a micro-batch's clones on its own (module
        docstring): recomputation per transformer layer, or per tensor rank.

    Returns
    -------
    Graph

    Raises
    ------
    InvalidInput
        See :func:`resolve_nodes`.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, p, mem=0: {"id": i, "compute_s": 1.0, "memory_bytes": mem, "pass": p}
    >>> g = build("r", [nd("a", "forward", 8), nd("b", "forward", 8), nd("db", "backward"),
    ...                 nd("da", "backward")],
    ...           [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "db", "bytes": 8},
    ...            {"src": "a", "dst": "da", "bytes": 8}, {"src": "db", "dst": "da", "bytes": 8}])
    >>> r = recompute_graph(g, ["a"])
    >>> [r.ids[v] for v in range(r.n)], [(r.ids[r.edge_src[e]], r.ids[r.edge_dst[e]]) for e in range(r.m)][:4]
    (['a', 'b', 'db', 'da', 'a/recompute'], [('a', 'b'), ('b', 'db'), ('a/recompute', 'da'), ('db', 'da')])
    >>> [r.ids[u] for u in r.pred[r.index["a/recompute"]]]  # a reads nothing; its clone waits for db's gradient
    ['db']
    """
    moved = _moved(graph, resolve_nodes(graph, nodes))
    check_size(Size(*recompute_size(graph, nodes, segments)), f"recomputing {len(nodes)} nodes of graph '{graph.name}'",
               "fewer recomputed nodes")
    passes = node_passes(graph)
    prof = batch_profile(graph)
    fresh = fresh_namer(graph)
    docs = graph.to_dict()["nodes"]
    resident = declares_resident(graph)
    clone = {v: fresh(f"{graph.ids[v]}/recompute") for v in sorted(moved)}
    new_nodes = []
    for v in sorted(moved):
        nd: dict[str, Any] = {k: val for k, val in docs[v].items() if k not in ("members", "resident_bytes")}
        nd["id"] = clone[v]
        nd["memory_bytes"] = graph.memory[v] - prof.fixed_memory[v]
        bi = nd.get("batch_independent") if isinstance(nd.get("batch_independent"), dict) else {}
        nd["batch_independent"] = {"memory_bytes": 0, "state_bytes": 0,
                                   **({"bytes_moved": bi["bytes_moved"]} if "bytes_moved" in bi else {})}
        if isinstance(nd.get("batch_line"), dict):
            nd["batch_line"] = {k: x for k, x in nd["batch_line"].items() if k != "memory_bytes"}
        nd["recompute_of"] = graph.ids[v]
        nd.setdefault("origin", graph.ids[v])  # what the clone copies: v's origin, or v
        if isinstance(nd.get("collective"), dict):  # a recomputed collective is a collective of its own
            nd["collective"] = {**nd["collective"], "group": f"{nd['collective'].get('group')}/recompute"}
        if resident:
            nd["resident_bytes"] = 0
        new_nodes.append(nd)
    edges = []
    extra_edges = []
    for e, ed in enumerate(edge_dicts(graph)):
        s, d, t = graph.edge_src[e], graph.edge_dst[e], graph.edge_tensor[e]
        if s in moved and t in moved[s] and passes[d] == "backward":
            edges.append({**ed, "src": clone[s]})
        else:
            edges.append(ed)
        if d in moved:  # the clone reads what v reads, from the producer's clone when that is recomputed too
            src = clone[s] if s in moved and t in moved[s] else graph.ids[s]
            extra_edges.append({**ed, "src": src, "dst": clone[d]})
    eds = edge_dicts(graph)
    extra_edges += [{**eds[e], "dst": clone[v]} for e, v in _gates(graph, moved, passes, segments)]
    meta = dict(graph.meta)
    meta["recompute"] = list(graph.meta.get("recompute", [])) + [graph.ids[v] for v in sorted(moved)]
    doc = {"schema": GRAPH_SCHEMA, "name": graph.name if "recompute" in graph.meta else f"{graph.name}+rc",
           "meta": meta, "nodes": docs + new_nodes, "edges": edges + extra_edges}
    return Graph.from_dict(doc, label=doc["name"], derived=True)


def _gates(graph: Graph, moved: dict[int, set[int]], passes: list[str],
           segments: bool = False) -> list[tuple[int, int]]:
    """``(edge, v)``: the clone of *v* also reads the tensor of *edge* (of
    *graph*), so that the first clones of each micro-batch (replica), or of
    each of its segments, wait for the gradients entering their backward
    (module docstring): a backward node's input from a backward node that
    is not a reader of the clones and does not descend from one."""
    topo = graph.topo_index()
    groups: dict[tuple, list[int]] = {}
    seg = _segments(graph, moved) if segments else {}
    for v in moved:
        ex = _extra(graph, v)
        groups.setdefault((str(ex.get("replica")), str(ex.get("microbatch")), seg.get(v, 0)), []).append(v)
    out = []
    for vs in groups.values():
        region = {graph.edge_dst[e] for v in vs for e in graph.out_edges[v]
                  if graph.edge_tensor[e] in moved[v] and passes[graph.edge_dst[e]] == "backward"}
        entering = [e for d in region for e in graph.in_edges[d]
                    if passes[graph.edge_src[e]] == "backward" and graph.edge_src[e] not in region]
        if not entering:
            continue
        limit = max(topo[graph.edge_src[e]] for e in entering)
        below, stack = set(region), list(region)  # what descends from the readers (no later than limit)
        while stack:
            for y in graph.succ[stack.pop()]:
                if y not in below and topo[y] <= limit:
                    below.add(y)
                    stack.append(y)
        gates = list({(graph.edge_src[e], graph.edge_tensor[e]): e for e in entering
                      if graph.edge_src[e] not in below}.values())
        inside = set(vs)
        first = [v for v in sorted(vs) if not any(u in inside for u in graph.pred[v])]
        out += [(e, v) for v in first for e in gates]
    return out


def _segments(graph: Graph, moved: dict[int, set[int]]) -> dict[int, int]:
    """Recomputed node -> its segment: the connected parts of the clones
    (a clone reading another clone joins its segment)."""
    parent = {v: v for v in moved}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for v in moved:
        for e in graph.out_edges[v]:
            d = graph.edge_dst[e]
            if d in moved and graph.edge_tensor[e] in moved[v]:
                a, b = root(v), root(d)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {v: root(v) for v in moved}


def _moved(graph: Graph, chosen: list[int]) -> dict[int, set[int]]:
    """For each node of *chosen* that gets a clone: its tensors the clone
    sends (activations a backward node or another clone reads), decided
    from the last node backwards."""
    passes = node_passes(graph)
    state = batch_profile(graph).state_out
    cons = graph.tensor_consumers()
    out_tensors: list[list[int]] = [[] for _ in range(graph.n)]
    for t, p in enumerate(graph.tensor_src):
        out_tensors[p].append(t)
    moved: dict[int, set[int]] = {}
    for v in sorted(chosen, key=lambda x: -graph.topo_index()[x]):
        ts = {t for t in out_tensors[v] if t not in state[v]
              and any(passes[d] == "backward" or (d in moved and d != v) for d in cons[t])}
        if ts:
            moved[v] = ts
    return moved


def recompute_size(graph: Graph, nodes: list[str], segments: bool = False) -> tuple[int, int]:
    """``(nodes, edges)`` of :func:`recompute_graph`, counted without
    building it: a clone per recomputed node, a copy of each of its
    input edges, and the edges of the gradients the first clones wait for.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("r", [{"id": "a", "compute_s": 1, "memory_bytes": 8, "pass": "forward"},
    ...                 {"id": "b", "compute_s": 1, "memory_bytes": 8, "pass": "forward"},
    ...                 {"id": "db", "compute_s": 1, "memory_bytes": 0, "pass": "backward"}],
    ...           [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "db", "bytes": 8}])
    >>> recompute_size(g, ["b"]), (lambda r: (r.n, r.m))(recompute_graph(g, ["b"]))
    ((4, 3), (4, 3))
    """
    moved = _moved(graph, resolve_nodes(graph, nodes))
    gates = _gates(graph, moved, node_passes(graph), segments) if moved else []
    return graph.n + len(moved), graph.m + sum(1 for d in graph.edge_dst if d in moved) + len(gates)


def apply_recompute_step(graph: Graph, step: dict, label: str) -> Graph:
    """Apply a recorded ``recompute`` step to *graph*.

    Raises
    ------
    KeyError, TypeError
        A missing ``nodes`` field or one that is not a list (the caller
        words them).
    InvalidInput
        See :func:`resolve_nodes`.
    """
    nodes = step["nodes"]
    if not isinstance(nodes, list) or not isinstance(step.get("segments", False), bool):
        raise TypeError(nodes)
    return recompute_graph(graph, nodes, segments=step.get("segments", False))
