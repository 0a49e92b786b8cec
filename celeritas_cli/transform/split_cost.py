"""The split cost model: what a node costs, holds and sends when it runs on
a fraction of its batch.  The one place these rules live; used by
:func:`~celeritas_cli.transform.splitting.split_operation` (FastT 5.2,
FD-DPS 4.1: batch and channel splits) and
:func:`~celeritas_cli.transform.replicate.data_parallel_graph` (FastT's
data-parallel graph, every replica on ``1/k`` of the batch).

What is recognised in a graph
-----------------------------
* **Optimizer update** (:func:`is_update`): a node whose ``role`` field is
  ``"optimizer"``, or whose op is ``optim.*`` (``placer profile``:
  ``optim.adam``, ``optim.sgd``), a fused/foreach torch optimizer
  (``aten._fused_adam``, ``_foreach_sgd``...), or a TensorFlow
  ``Apply*``/``ResourceApply*`` op.  Updates are batch-independent: a split
  never applies to them and every data-parallel replica runs one in full.
* **Gradient**: a tensor consumed by an update node, produced outside the
  update's colocation group (the variable's own group holds the weights).
  These are what data parallelism all-reduces, and what a batch-split
  backward op produces as *partial* sums (summed, not concatenated).
* **Parameters** of a node: its ``batch_independent.state_bytes`` field
  (``placer profile`` and :mod:`~celeritas_cli.model.generate` write it);
  otherwise, for a node in an update's colocation group, a quarter of its
  batch-independent memory in a training graph (weights, gradients, two
  Adam moments: the generator's rule) and all of it in inference.  A
  batch-split part receives them from an ``op/weights`` node; the tensors a
  node forwards to later readers of its parameters are listed in
  ``batch_independent.state_tensors``.
* **Batch-independent memory** (parameters, gradients, optimizer state) of
  a node: the intercept of the Standard Evaluation line
  ``batch_line.memory_bytes`` (measured at several batch sizes, so it also
  sees a loss's scalar outputs); else ``batch_independent.memory_bytes``
  (``placer profile`` of one batch: parameters, buffers, kept gradients,
  optimizer state); else all of it for
  an update or batch-independent node; else the memory not explained by
  the node's activation outputs (``output_bytes`` or its largest output
  tensor, gradient outputs excluded).  The rest scales with the batch.
* **Batch-independent node**: an update, or a node with inputs that are all
  batch-independent tensors (e.g. a sum of two gradients).  Batch-independent
  tensors: gradients, listed state tensors, and outputs of batch-independent
  nodes.  Graph sources (data inputs) scale with the batch, whatever
  parameters they hold.  A node's *own* parameters are not an input: a
  rewrite that moves a node's state to a ``weights`` node (a micro-batch
  copy ``<v>/mb<i>`` reading ``<v>/weights``, fields ``origin``; a split
  part reading ``<v>/weights``, fields ``split_of``) leaves a copy of a
  source a source, so the copies of the first layer, and everything after
  them, still scale with the batch (issue 33, D6: before, a data-parallel
  replica of a micro-batched graph ran every micro-batch whole).

Time of a node on a fraction ``f`` of its batch (:func:`part_times`)
-----------------------------------------------------------------------
For ``compute_s`` and each ``compute_by_type`` entry ``t`` (the time at the
node's batch ``B``):

1. **Standard Evaluation line** (Celeritas 4.2.1): when the node has
   ``batch_line`` = ``{"batch": B, "compute_s": [a, b], "compute_by_type":
   {type: [a, b]}}`` (``placer profile --batch-sizes`` writes it), ``t'
   = t * (a + b*f*B) / (a + b*B)``.
2. **Roofline at the smaller shape**: when the graph's times are the
   roofline of :mod:`celeritas_cli.model.devices` (``meta.cost_model``
   starts with ``roofline``; a ``meta.measured`` device type is excluded)
   and the node has ``flops`` and ``bytes_moved``: with ``M_fixed =
   batch_independent.bytes_moved`` (parameter reads and gradient writes,
   0 when absent) the memory time becomes ``(M_fixed + f*(M - M_fixed)) /
   bandwidth``, the FLOP time of a compute-bound node scales by ``f``, and
   the launch cost stays.
3. **Linear**: ``t' = f*t + overhead_s`` (one extra kernel launch).

Whatever the source, ``f*t <= t' <= t``: never better than linear, never
slower than the whole batch.

What can be replicated or split
-------------------------------
Every op of a training step whose work is independent per sample: pointwise
ops, convolutions, matmuls along the sample dimension, norms (BatchNorm with
*local* batch statistics, as PyTorch DDP does by default, so a replica's
statistics differ from the full batch's), losses that average over samples
(each replica's mean; gradients are averaged by the all-reduce), and backward
ops (a weight gradient of a sample shard is a partial sum).  Not modelled, and
therefore wrong when present: ops that couple samples (SyncBatchNorm, in-batch
negatives / contrastive losses, batch-level sorting or top-k), ops whose
leading dimension is not the sample dimension (recorded as ``batch``
splittable by mistake), and data-dependent shapes.  A ``channel`` split
slices output channels: allowed for ops that produce no gradient (a backward
op's input gradient would be a sum of partials, which this model does not
build); backward ops split along ``batch`` only.

References
----------
FastT (Yi et al., CoNEXT 2020) 5.2 (operation splitting, data-parallel
graph); Celeritas 4.2.1 (Standard Evaluation: per-node lines against the
batch size); Williams et al., "Roofline", CACM 2009.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model.devices import DEVICES, REFERENCE
from ..model.graph import Graph
from ..model.params import DEFAULT_OVERHEAD_S  # noqa: F401  (re-exported: the rewrites' default)

COPY_BANDWIDTH_BPS = 9.0e11

_UPDATE_RE = re.compile(r"^_*(fused_|foreach_)?(adam|adamw|sgd|adagrad|adadelta|adamax|rmsprop|lamb|lion|"
                        r"nadam|radam)$")
_APPLY_RE = re.compile(r"^(resource)?apply[a-z]+$")


def is_update(graph: Graph, v: int) -> bool:
    """True when node *v* is an optimizer update (see the module docstring).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("u", [{"id": "a", "op": "optim.adam", "compute_s": 0, "memory_bytes": 0},
    ...                 {"id": "b", "op": "aten._fused_adam", "compute_s": 0, "memory_bytes": 0},
    ...                 {"id": "c", "op": "ResourceApplyAdam", "compute_s": 0, "memory_bytes": 0},
    ...                 {"id": "d", "op": "aten.add", "compute_s": 0, "memory_bytes": 0}], [])
    >>> [is_update(g, v) for v in range(4)]
    [True, True, True, False]
    """
    extra = graph.node_extra[v] if graph.node_extra else None
    if extra and extra.get("role") == "optimizer":
        return True
    op = graph.op[v]
    if op.startswith("optim."):
        return True
    short = op.rsplit(".", 1)[-1].lower()
    return bool(_UPDATE_RE.match(short) or _APPLY_RE.match(short))


def _extra(graph: Graph, v: int, key: str):
    extra = graph.node_extra[v] if graph.node_extra else None
    return extra.get(key) if extra else None


@dataclass
class BatchProfile:
    """What scales with the batch in one graph (see the module docstring).

    Per node: ``update``, ``fixed_node`` (batch-independent),
    ``fixed_memory`` (bytes that do not scale), ``param_bytes`` (parameters
    a batch-split part must receive), ``gradient_out`` (tensor ids of the
    gradients it produces), ``state_out`` (tensor ids forwarding its
    parameters), ``inputs`` (its in-edges but the reads of its own
    parameters from its ``weights`` node).  Per tensor: ``fixed_tensor``,
    ``gradient``.
    """

    update: list[bool]
    fixed_node: list[bool]
    fixed_memory: list[int]
    param_bytes: list[int]
    fixed_tensor: list[bool]
    gradient: list[bool]
    gradient_out: list[list[int]]
    state_out: list[list[int]]
    inputs: list[list[int]]

    def activation(self, graph: Graph, v: int) -> int:
        """Bytes of node *v*'s memory that scale with the batch."""
        return graph.memory[v] - self.fixed_memory[v]


def batch_profile(graph: Graph) -> BatchProfile:
    """The :class:`BatchProfile` of *graph*, computed once per graph object.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("t", [{"id": "x", "compute_s": 1, "memory_bytes": 40},
    ...                 {"id": "w", "compute_s": 1, "memory_bytes": 90, "colocation": "p"},
    ...                 {"id": "g", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1, "memory_bytes": 0, "colocation": "p"}],
    ...           [{"src": "x", "dst": "w", "bytes": 40}, {"src": "w", "dst": "g", "bytes": 40},
    ...            {"src": "g", "dst": "u", "bytes": 50}])
    >>> p = batch_profile(g)
    >>> p.fixed_node, p.gradient, p.fixed_memory, p.param_bytes
    ([False, False, False, True], [False, False, True], [0, 50, 0, 0], [0, 50, 0, 0])
    """
    cached = graph.__dict__.get("_batch_profile")
    if cached is None:  # graphs are not mutated after loading: compute once per object
        cached = graph.__dict__["_batch_profile"] = _profile(graph)
    return cached


def _profile(graph: Graph) -> BatchProfile:
    n = graph.n
    update = [is_update(graph, v) for v in range(n)]
    nt = len(graph.tensor_src)
    gradient = [False] * nt
    for e in range(graph.m):
        d = graph.edge_dst[e]
        s = graph.edge_src[e]
        if update[d] and not update[s] and (graph.colocation[d] is None or graph.colocation[s] != graph.colocation[d]):
            gradient[graph.edge_tensor[e]] = True
    tensors_of: list[list[int]] = [[] for _ in range(n)]
    for t, p in enumerate(graph.tensor_src):
        tensors_of[p].append(t)
    state_out: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        bi = _extra(graph, v, "batch_independent")
        names = set(bi.get("state_tensors") or []) if isinstance(bi, dict) else set()
        if names:
            state_out[v] = [t for t in tensors_of[v] if graph.tensor_name[t] in names]
    fixed_tensor = list(gradient)
    for v in range(n):
        for t in state_out[v]:
            fixed_tensor[t] = True
    home = [{x for x in (_extra(graph, v, "origin"), _extra(graph, v, "split_of")) if x is not None}
            for v in range(n)]  # the node(s) a rewritten node stands for
    inputs = [[e for e in graph.in_edges[v]  # a read of the node's own parameters is not an input
               if not (graph.op[graph.edge_src[e]] == "weights" and home[v] & home[graph.edge_src[e]])]
              for v in range(n)]
    fixed_node = [False] * n
    for v in graph.topo_order():
        if update[v]:
            fixed_node[v] = True
        elif inputs[v]:
            fixed_node[v] = all(fixed_tensor[graph.edge_tensor[e]] for e in inputs[v])
        if fixed_node[v]:
            for t in tensors_of[v]:
                fixed_tensor[t] = True
    gradient_out = [[t for t in tensors_of[v] if gradient[t]] for v in range(n)]
    fixed_memory = [_fixed_memory(graph, v, fixed_node[v], tensors_of[v], fixed_tensor) for v in range(n)]
    in_group = {graph.colocation[v] for v in range(n) if update[v] and graph.colocation[v] is not None}
    training = graph.meta.get("phase") == "training"
    param_bytes = [0] * n
    for v in range(n):
        bi = _extra(graph, v, "batch_independent")
        if isinstance(bi, dict) and isinstance(bi.get("state_bytes"), int):
            param_bytes[v] = max(0, bi["state_bytes"])
        elif not update[v] and graph.colocation[v] in in_group:
            grads = sum(graph.tensor_bytes[t] for t in gradient_out[v])
            state = max(0, fixed_memory[v] - grads)
            param_bytes[v] = state // 4 if training else state
    return BatchProfile(update=update, fixed_node=fixed_node, fixed_memory=fixed_memory, param_bytes=param_bytes,
                        fixed_tensor=fixed_tensor, gradient=gradient, gradient_out=gradient_out, state_out=state_out,
                        inputs=inputs)


def _fixed_memory(graph: Graph, v: int, fixed_node: bool, tensors: list[int], fixed_tensor: list[bool]) -> int:
    mem = graph.memory[v]
    line = _extra(graph, v, "batch_line")
    if isinstance(line, dict) and _is_line(line.get("memory_bytes")):
        return max(0, min(mem, int(round(line["memory_bytes"][0]))))
    bi = _extra(graph, v, "batch_independent")
    if isinstance(bi, dict) and isinstance(bi.get("memory_bytes"), int):
        return max(0, min(mem, bi["memory_bytes"]))
    if fixed_node:
        return mem
    fixed_out = sum(graph.tensor_bytes[t] for t in tensors if fixed_tensor[t])
    ob = _extra(graph, v, "output_bytes")
    if isinstance(ob, int):
        act = max(0, ob - fixed_out)
    else:
        act = max((graph.tensor_bytes[t] for t in tensors if not fixed_tensor[t]), default=0)
    act = max(0, min(act, mem - min(fixed_out, mem)))
    return mem - act


def _is_line(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(a, (int, float)) for a in x)


def splittable_dims(graph: Graph, v: int) -> list[str]:
    """The dimensions node *v* may be split along: its ``splittable`` list
    without ``batch`` for a batch-independent node and without ``channel``
    for a node that produces gradients or whose op is a ``*_backward`` op
    (see the module docstring)."""
    dims = graph.splittable[v] or []
    if not dims:
        return []
    prof = batch_profile(graph)
    out = []
    for d in dims:
        if d == "batch" and prof.fixed_node[v]:
            continue
        if d == "channel" and (prof.gradient_out[v] or graph.op[v].endswith("_backward")):
            continue
        out.append(d)
    return out


def _roofline_types(graph: Graph) -> frozenset[str]:
    """Device types whose times in *graph* are the shipped roofline (read
    once per graph object: every node's :func:`part_times` asks)."""
    cached = graph.__dict__.get("_roofline_types")
    if cached is not None:
        return cached
    cm = graph.meta.get("cost_model")
    types: set[str] = set()
    if isinstance(cm, str) and cm.startswith("roofline"):
        types = set(DEVICES)
        measured = graph.meta.get("measured")
        if isinstance(measured, dict):
            types.discard(measured.get("device"))
            types.discard("compute_s")
        elif REFERENCE in types:
            types.add("compute_s")
    graph.__dict__["_roofline_types"] = out = frozenset(types)
    return out


def part_times(graph: Graph, v: int, frac: float, *, overhead_s: float = DEFAULT_OVERHEAD_S,
               types: frozenset[str] | None = None) -> tuple[float, dict | None]:
    """``(compute_s, compute_by_type)`` of node *v* run on the fraction
    *frac* (``0 < frac <= 1``) of its batch (see the module docstring);
    *types*, when given, limits ``compute_by_type`` to those device types.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("t", [{"id": "a", "compute_s": 8.0, "memory_bytes": 0},
    ...                 {"id": "b", "compute_s": 8.0, "memory_bytes": 0,
    ...                  "batch_line": {"batch": 8, "compute_s": [4.0, 0.5]}}], [])
    >>> part_times(g, 0, 0.25, overhead_s=0.0)[0], part_times(g, 1, 0.25)[0]
    (2.0, 5.0)
    """
    if frac >= 1.0:
        return graph.compute[v], dict(graph.compute_by_type[v]) if graph.compute_by_type[v] else None
    line = _extra(graph, v, "batch_line")
    if not isinstance(line, dict) or not isinstance(line.get("batch"), (int, float)) or line["batch"] <= 0:
        line = None
    roof = _roofline_types(graph) if line is None else set()
    flops = _extra(graph, v, "flops")
    moved = _extra(graph, v, "bytes_moved")
    if not (isinstance(flops, (int, float)) and isinstance(moved, (int, float))):
        roof = set()
    bi = _extra(graph, v, "batch_independent")
    moved_fixed = bi.get("bytes_moved", 0) if isinstance(bi, dict) else 0

    def one(t: float, key: str, ab) -> float:
        lo = frac * t
        if line is not None and _is_line(ab):
            a, b = float(ab[0]), float(ab[1])
            full = a + b * line["batch"]
            if full > 0:
                return min(t, max(lo, t * (a + b * frac * line["batch"]) / full))
        if key in roof:
            s = DEVICES[REFERENCE if key == "compute_s" else key]
            mem = moved / s.bandwidth_Bps
            work = t - s.launch_s
            if work > 0:
                mem_f = (moved_fixed + frac * (moved - moved_fixed)) / s.bandwidth_Bps
                flop_f = frac * work if work > mem * (1 + 1e-9) else 0.0
                return min(t, max(lo, max(flop_f, mem_f) + s.launch_s))
        return min(t, lo + overhead_s) if t > 0 else 0.0

    c = one(graph.compute[v], "compute_s", (line or {}).get("compute_s"))
    by = graph.compute_by_type[v]
    lines_by = (line or {}).get("compute_by_type") or {}
    out_by = {k: one(val, k, lines_by.get(k)) for k, val in sorted(by.items())
              if types is None or k in types} if by else None
    return c, out_by
