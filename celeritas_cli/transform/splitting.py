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
* ``op/split{j}``: one split node per distinct batch-dependent input tensor
  of ``op`` (the paper adds one per predecessor; a predecessor normally
  sends one tensor, and one per tensor keeps the simulator's
  one-transfer-per-tensor rule).  It receives the whole tensor (same
  tensor identity as before, so a producer feeding several consumers still
  sends it once per device) and sends slice ``i`` to ``s_i``.  Only for
  ``batch`` splits, and only for tensors that scale with the batch: a
  batch-independent input (a parameter read, see
  :mod:`~celeritas_cli.transform.split_cost`) and every input of a
  ``channel`` split go whole to every ``s_i`` (sent once per device).
* ``op/concat{j}``: one concat node per distinct output tensor that is
  sliced by the split (the paper adds one per successor; they would all
  compute the same concatenation, so one per tensor is shared by the
  successors).  ``s_i`` sends it its slice; it sends the whole tensor,
  under its old name, to every consumer.
* ``op/sum{j}`` (batch splits of an op that produces gradients, e.g. a
  ``convolution_backward``): each ``s_i`` computes the weight gradient of
  its shard of samples, a *full-size partial* gradient, and sends all of it
  to the sum node, which adds the ``n`` partials and sends the gradient,
  under its old name, to the update.  (A concatenation of ``n`` slices
  would model ``1/n`` of the bytes and no reduction.)
* ``op/weights`` (when ``op`` holds parameters or other batch-independent
  memory): a zero-cost source node standing for the variables' home.  It
  inherits ``op``'s ``colocation`` (so the variables stay with their update
  op), holds the batch-independent memory (batch split: once, however many
  parts share a device) and sends the parameters to every part: the same
  tensor for a batch split (a broadcast, sent once per device, FastT 6.4
  "to avoid overhead of broadcasting parameters to all replicas"), slice
  ``i`` for a channel split.  It also forwards ``op``'s parameter reads
  (``batch_independent.state_tensors``) to their consumers.  The parts
  themselves carry no colocation, which is what lets them run on different
  devices.

Cost model (:mod:`~celeritas_cli.transform.split_cost`)
--------------------------------------------------------
With ``fixed`` = the node's batch-independent memory (parameters,
gradients, optimizer state), ``act = memory_bytes - fixed`` and ``params``
the parameter bytes a part needs:

* sub-op time, batch split: :func:`~.split_cost.part_times` at ``1/n`` of
  the batch (Standard Evaluation line, else roofline at the smaller shape,
  else ``time / n + overhead_s``; never better than linear).  Channel
  split: ``time / n + overhead_s`` (the line is against the batch).
* sub-op memory, batch split: ``ceil(act / n)``; the sum nodes hold their
  gradient (kept until the update) and ``op/weights`` the rest of
  ``fixed``.  Channel split divides both: ``ceil(fixed / n) + ceil(act / n)``.
* tensor bytes: the slices sent to and from the parts are ``ceil(b / n)``
  of each tensor ``b``; partial gradients are whole.
* split, concat and sum nodes: memory-bound copies, ``compute_s = 2 · bytes
  / 9e11`` (read + write at V100 HBM bandwidth, the generator's light-op
  rule; a sum reads ``n`` partials: ``(n + 1) · bytes / 9e11``), memory 0
  except the sum's kept gradient.

Memory over time (docs/design.md "Node memory"): in a graph that declares
``resident_bytes``, ``op/weights`` holds the resident part of ``op``'s
memory (as much of it as its memory holds; the rest of the resident bytes,
if any, goes in equal shares to the parts), a channel split part
``ceil(resident / n)``, and the parts' activation shares, the sums' kept
gradients and the split and concat nodes are activations (resident 0);
every new node carries ``op``'s ``pass``.

Sub-operations are not splittable again (``splittable`` is dropped).  A
split must be one :func:`~.split_cost.splittable_dims` allows: no batch
split of a batch-independent op (an optimizer update), no channel split of
an op that produces gradients (its input gradient would be a sum).

Coarse graphs
-------------
Unsplit nodes keep their ``members``, so a placement still expands to
original ids.  The new nodes (parts, split, concat, sum, weights) carry no
``members``: one original operator now runs on several devices, so it cannot
be expanded back; the split node's members are recorded in
``meta.splits[*].members`` and its placement is written over the new ids.

``meta`` of the result: the input's meta plus ``split_from`` (the name of
the graph that was first split) and ``splits`` (one record per split:
``node``, ``dim``, ``n``, ``parts``, ``members``), appended to when a split
graph is split again.  New nodes say what they are: ``split_of`` (the split
node's id) and, on parts, ``part`` (``i``).

References
----------
FastT: Yi et al., "Optimizing Distributed Training Deployment in
Heterogeneous GPU Clusters", CoNEXT 2020, section 5.2, Algorithm 2.
FD-DPS, section 4.1 (intra-operator parallelism with a tensor dimension).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph
from ..model.residency import memory_fields, resident_of
from .admit import DIMENSIONS, node_batch, split_refusal, split_size
from .size import check_size
from .split_cost import (
    COPY_BANDWIDTH_BPS,
    DEFAULT_OVERHEAD_S,
    batch_profile,
    part_times,
)

__all__ = ["COPY_BANDWIDTH_BPS", "DEFAULT_OVERHEAD_S", "DIMENSIONS", "activation_bytes", "split_operation",
           "split_many", "is_split_graph", "split_refusal", "split_size", "node_batch"]


def _ceil_div(a: int, n: int) -> int:
    return -(-int(a) // n)


def activation_bytes(graph: Graph, v: int) -> int:
    """Bytes of node *v*'s memory that scale with the batch
    (:class:`~.split_cost.BatchProfile`)."""
    return batch_profile(graph).activation(graph, v)


def edge_dicts(graph: Graph) -> list[dict]:
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


def fresh_namer(graph: Graph):
    """A function returning ids not used by *graph* (nor by its members)."""
    taken = set(graph.ids)
    for mb in graph.members:
        if mb:
            taken.update(mb)

    def fresh(name: str) -> str:
        while name in taken:
            name += "~"
        taken.add(name)
        return name

    return fresh


def _resolve(graph: Graph, node: int | str, dim: str, n: int, assume: int | None = None) -> int:
    if isinstance(node, str):
        if node not in graph.index:
            raise InvalidInput(f"split: graph '{graph.name}' has no node '{node}'")
        v = graph.index[node]
    else:
        v = int(node)
    why = split_refusal(graph, v, dim, n, assume)
    if why:
        raise InvalidInput(why)
    return v


def split_operation(graph: Graph, node: int | str, dim: str, n: int, *,
                    overhead_s: float = DEFAULT_OVERHEAD_S, assume_batch: int | None = None) -> Graph:
    """Split *node* of *graph* along *dim* into *n* sub-operations.

    FastT Algorithm 2's ``SplitOperation`` (lines 16-30) in its steps: the
    sub-operations ``s_i`` (lines 17-19) are named first; the parameters'
    home (:func:`_weights_node`), a split node per sliced input (lines
    20-23, :func:`_split_inputs`), the sub-operations with their share of
    time and memory (:func:`_part_nodes`) and a concat or sum node per
    output (lines 24-27, :func:`_merge_outputs`) are added; ``op`` and its
    edges are removed and the graph is rebuilt (lines 28-29,
    :func:`_rebuild`).  The module docstring has the structure and the cost
    model.

    Parameters
    ----------
    graph : Graph
        Any graph (fine, coarse, data-parallel or already split).
    node : int or str
        Node index or id; it must list *dim* in ``splittable`` and
        :func:`~.split_cost.splittable_dims` must allow it.
    dim : str
        ``"batch"`` or ``"channel"`` (see the module docstring for the cost
        model of each).
    n : int
        Number of parts, ``n >= 2``.
    overhead_s : float
        Extra time of each sub-operation where the time is linear (one
        kernel launch).
    assume_batch : int, optional
        The batch the graph's costs hold for, when it declares none
        (``--assume-batch``), for a batch split.

    Returns
    -------
    Graph
        A new validated graph; *graph* is unchanged.

    Raises
    ------
    InvalidInput
        Unknown node, a dimension the node does not list or may not be split
        along, ``n < 2``, a batch split of a graph without a declared batch
        or into parts that are not equal whole samples
        (:func:`split_refusal`), a result over the derived-graph budget
        (:func:`split_size`); all before anything is built.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}],
    ...           [{"src": "a", "dst": "c", "bytes": 100}], meta={"batch_size": 8})
    >>> s = split_operation(g, "c", "batch", 2, overhead_s=0.0)
    >>> [s.ids[v] for v in range(s.n)], s.compute[2]
    (['a', 'c/split0', 'c/part0', 'c/part1'], 2.0)
    """
    v = _resolve(graph, node, dim, n, assume_batch)
    check_size(split_size(graph, v, dim, n), f"split: node '{graph.ids[v]}' into {n} parts",
               "split it into fewer parts")
    sp = _Split.start(graph, v, dim, int(n))
    _weights_node(sp)
    _split_inputs(sp)
    _part_nodes(sp, overhead_s)
    _merge_outputs(sp)
    return _rebuild(sp)


@dataclass
class _Split:
    """One split in progress: the node, its memory split into ``fixed``
    (batch-independent) and ``act``, the bytes of parameters a part needs,
    its output tensors grouped (gradients and parameter reads among them),
    the sub-operation ids, and the nodes and edges added so far (in the
    order they go into the new graph)."""

    graph: Graph
    v: int
    dim: str
    n: int
    fresh: Callable[[str], str]
    prof: Any
    edicts: list[dict]
    parts: list[str]
    out_groups: dict[int, list[int]]
    grads: list[int]
    states: list[int]
    new_nodes: list[dict] = field(default_factory=list)
    new_edges: list[dict] = field(default_factory=list)
    weights: str | None = None
    weights_resident: int = 0
    sum_mem: dict[int, int] = field(default_factory=dict)

    @property
    def batch(self) -> bool:
        return self.dim == "batch"

    @property
    def vid(self) -> str:
        return self.graph.ids[self.v]

    @classmethod
    def start(cls, graph: Graph, v: int, dim: str, n: int) -> "_Split":
        """Group v's outputs by tensor and name the sub-operations (lines 17-19)."""
        fresh = fresh_namer(graph)
        prof = batch_profile(graph)
        parts = [fresh(f"{graph.ids[v]}/part{i}") for i in range(n)]
        out_groups: dict[int, list[int]] = {}
        for e in graph.out_edges[v]:
            out_groups.setdefault(graph.edge_tensor[e], []).append(e)
        batch = dim == "batch"
        grads = [t for t in out_groups if batch and prof.gradient[t]]
        states = [t for t in out_groups if batch and t in prof.state_out[v]]
        return cls(graph, v, dim, n, fresh, prof, edge_dicts(graph), parts, out_groups, grads, states)


def _weights_node(sp: _Split) -> None:
    """``op/weights``: the home of op's batch-independent memory, which
    sends the parameters to every part (whole for a batch split, slice
    ``i`` for a channel split).  For a batch split the sum nodes keep
    their gradients out of that memory (``sum_mem``) and the weights node
    the rest, held once."""
    g, v, n = sp.graph, sp.v, sp.n
    fixed = sp.prof.fixed_memory[v]
    params = sp.prof.param_bytes[v]
    rest = fixed
    for t in sp.grads:
        sp.sum_mem[t] = min(g.tensor_bytes[t], rest)
        rest -= sp.sum_mem[t]
    if not (params > 0 or sp.states or (sp.batch and rest > 0)):
        return
    sp.weights = sp.fresh(f"{sp.vid}/weights")
    wmem = int(rest) if sp.batch else 0
    wn: dict[str, Any] = {"id": sp.weights, "op": "weights", "compute_s": 0.0, "memory_bytes": wmem,
                          "split_of": sp.vid, **memory_fields(g, v, wmem, resident_of(g, v))}
    sp.weights_resident = wn.get("resident_bytes", 0)
    if g.colocation[v] is not None:
        wn["colocation"] = g.colocation[v]
    sp.new_nodes.append(wn)
    if params <= 0:
        return
    for i, pid in enumerate(sp.parts):
        if sp.batch:
            sp.new_edges.append({"src": sp.weights, "dst": pid, "bytes": int(params), "tensor": "params"})
        else:
            sp.new_edges.append({"src": sp.weights, "dst": pid, "bytes": _ceil_div(params, n),
                                 "tensor": f"params{i}"})


def _split_inputs(sp: _Split) -> None:
    """Lines 20-23: per distinct input tensor (in edge order), a batch split
    of a batch-dependent tensor gets ``op/split{j}``, which receives it
    whole and sends slice ``i`` to ``s_i``; any other input goes whole to
    every part."""
    g = sp.graph
    in_groups: dict[int, list[int]] = {}
    for e in g.in_edges[sp.v]:
        in_groups.setdefault(g.edge_tensor[e], []).append(e)
    j = 0
    for t, es in in_groups.items():
        tb = g.tensor_bytes[t]
        if sp.batch and not sp.prof.fixed_tensor[t]:
            node = sp.fresh(f"{sp.vid}/split{j}")
            j += 1
            sp.new_nodes.append({"id": node, "op": "split", "compute_s": 2.0 * tb / COPY_BANDWIDTH_BPS,
                                 "memory_bytes": 0, "split_of": sp.vid, **memory_fields(g, sp.v, 0, 0)})
            sp.new_edges.append({**sp.edicts[es[0]], "dst": node})
            for i, pid in enumerate(sp.parts):
                sp.new_edges.append({"src": node, "dst": pid, "bytes": _ceil_div(tb, sp.n), "tensor": f"part{i}"})
        else:
            for pid in sp.parts:
                sp.new_edges.append({**sp.edicts[es[0]], "dst": pid})


def _part_nodes(sp: _Split, overhead_s: float) -> None:
    """The sub-operations ``s_i``: time :func:`~.split_cost.part_times` at
    ``1/n`` of the batch (batch split) or ``time / n + overhead_s``
    (channel split); memory ``ceil(act / n)``, plus ``ceil(fixed / n)`` for
    a channel split."""
    g, v, n = sp.graph, sp.v, sp.n
    fixed = sp.prof.fixed_memory[v]
    act = g.memory[v] - fixed
    resident = resident_of(g, v)
    if sp.batch:
        c_s, c_by = part_times(g, v, 1.0 / n, overhead_s=overhead_s)
        part_mem = _ceil_div(act, n)
        part_res = _ceil_div(max(0, resident - sp.weights_resident), n)
    else:
        c_s = g.compute[v] / n + overhead_s
        by = g.compute_by_type[v]
        c_by = {k: val / n + overhead_s for k, val in sorted(by.items())} if by else None
        part_mem = _ceil_div(fixed, n) + _ceil_div(act, n)
        part_res = _ceil_div(resident, n)
    for i, pid in enumerate(sp.parts):
        pn: dict[str, Any] = {"id": pid, "op": g.op[v], "compute_s": c_s, "memory_bytes": int(part_mem)}
        if c_by:
            pn["compute_by_type"] = c_by
        pn["split_of"] = sp.vid
        pn["part"] = i
        pn.update(memory_fields(g, v, int(part_mem), part_res))
        sp.new_nodes.append(pn)


def _merge_outputs(sp: _Split) -> None:
    """Lines 24-27, per distinct output tensor: a parameter read comes from
    ``op/weights``, a gradient from ``op/sum{j}`` (the parts' full-size
    partials added), anything else from ``op/concat{j}`` (the parts'
    slices); that node sends the whole tensor, under its old name, to every
    consumer."""
    g, n = sp.graph, sp.n
    for j, (t, es) in enumerate(sp.out_groups.items()):
        tb = g.tensor_bytes[t]
        if t in sp.states:
            src = sp.weights
        elif t in sp.grads:
            src = sp.fresh(f"{sp.vid}/sum{j}")
            sp.new_nodes.append({"id": src, "op": "sum", "compute_s": (n + 1) * tb / COPY_BANDWIDTH_BPS,
                                 "memory_bytes": int(sp.sum_mem[t]), "split_of": sp.vid,
                                 **memory_fields(g, sp.v, int(sp.sum_mem[t]), 0)})
            for pid in sp.parts:
                sp.new_edges.append({"src": pid, "dst": src, "bytes": tb, "tensor": f"partial{j}"})
        else:
            src = sp.fresh(f"{sp.vid}/concat{j}")
            sp.new_nodes.append({"id": src, "op": "concat", "compute_s": 2.0 * tb / COPY_BANDWIDTH_BPS,
                                 "memory_bytes": 0, "split_of": sp.vid, **memory_fields(g, sp.v, 0, 0)})
            for pid in sp.parts:
                sp.new_edges.append({"src": pid, "dst": src, "bytes": _ceil_div(tb, n), "tensor": f"out{j}"})
        for e in es:
            sp.new_edges.append({**sp.edicts[e], "src": src})


def _rebuild(sp: _Split) -> Graph:
    """Lines 28-29: the new nodes take op's place, op's edges are replaced
    by the new ones, ``meta.splits`` records the split; the document is
    loaded (and so validated) as a graph file would be."""
    g, v = sp.graph, sp.v
    nodes = g.to_dict()["nodes"]
    touching = set(g.in_edges[v]) | set(g.out_edges[v])
    out_nodes = nodes[:v] + sp.new_nodes + nodes[v + 1:]
    out_edges = [ed for e, ed in enumerate(sp.edicts) if e not in touching] + sp.new_edges
    meta = dict(g.meta)
    meta.setdefault("split_from", g.meta.get("split_from", g.name))
    record = {"node": sp.vid, "dim": sp.dim, "n": sp.n, "parts": sp.parts, "members": g.original_ids(v)}
    meta["splits"] = list(g.meta.get("splits", [])) + [record]
    name = g.name if "split_from" in g.meta else f"{g.name}+split"
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

