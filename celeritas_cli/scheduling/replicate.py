"""The data-parallel graph: the model replicated ``k`` times, each replica on
its share of the batch, gradients reduced by a ring all-reduce before each
optimizer update (FastT section 5.2's "data parallel graph based on the
model DAG ... replicated as many times as the number of devices"; the DP
baseline of its Tables 1-2; PyTorch DDP / Horovod semantics).

:func:`data_parallel_graph` returns a new validated
:class:`~celeritas_cli.model.graph.Graph`; ``data-parallel`` places replica
``r`` on the ``r``-th chosen device, and ``os-dpos`` starts from this graph
when the model fits one device.

Structure
---------
* ``<id>/rep<r>`` for every node and replica ``r = 0..k-1``, with extra
  fields ``replica`` (``r``) and ``origin`` (the original id), and the
  colocation group ``<group>/rep<r>`` (each replica has its own variables
  and its own optimizer update, as in DDP).  Replicas of a coarse node
  carry no ``members`` (one node on ``k`` devices cannot be expanded back).
* Time and memory of a replica node (:mod:`~celeritas_cli.scheduling.split_cost`):
  a batch-dependent node runs on ``f = 1/k`` of the batch (strong scaling,
  the default: the global batch stays the graph's; ``f = shares[r]`` for
  replica ``r`` with uneven ``shares``) or the whole of it
  (``scaling="weak"``: every replica runs the graph's batch, the global
  batch is ``k`` times larger), with :func:`~.split_cost.part_times`;
  memory = batch-independent memory (parameters, gradients, optimizer
  state, held in full by every replica) + ``ceil(f * activations)``.
  Optimizer updates and batch-independent nodes run in full in every
  replica.  ``flops``, ``bytes_moved``, ``output_bytes`` and ``batch_line``
  are rescaled the same way, so a replica node can be split again.
* Edges inside a replica: the same tensors; bytes ``ceil(f * b)`` for
  tensors that scale with the batch, whole for batch-independent ones.
  Measured ``comm_s_by_pair`` entries are kept only on tensors whose size
  does not change.
* Gradients (tensors consumed by an update, :func:`~.split_cost.batch_profile`):
  for each gradient tensor of ``G`` bytes produced by ``p``, a ring
  all-reduce over the replicas in order ``0 -> 1 -> ... -> k-1 -> 0``, in
  ``k`` chunks (``G // k`` bytes, the first ``G % k`` one byte more):

  - reduce-scatter, steps ``s = 0..k-2``: ``<p>/allreduce<j>/rs<s>/rep<q>``
    on replica ``q`` receives from replica ``q-1`` its partial sum of chunk
    ``c = (q-1-s) mod k`` (its raw chunk when ``s = 0``), adds its own
    chunk ``c`` (``compute_s = 3·chunk / 9e11``: read two, write one);
    after step ``k-2`` replica ``q`` holds the reduced chunk ``(q+1) mod k``;
  - all-gather, steps ``s = 0..k-2``: ``<p>/allreduce<j>/ag<s>/rep<q>``
    (zero cost) receives from replica ``q-1`` the reduced chunk
    ``(q-s) mod k`` and forwards it at the next step;
  - ``<p>/allreduce<j>/rep<q>`` (zero cost): the reduced gradient on
    replica ``q``; it feeds every consumer of the gradient there.

  Every ring transfer is an edge between adjacent replicas, so it crosses a
  link and the simulator's congestion rule applies; each replica sends
  ``2·(k-1)`` chunks, ``2·(k-1)/k · G`` bytes.  Every ring node has an
  ``allreduce`` field (``of``: producer id, ``tensor``, ``phase``:
  ``reduce-scatter`` / ``all-gather`` / ``result``, ``step``, ``chunk``,
  ``bytes``) and ``replica``.  With ``bucket_mb = 0`` gradients are
  reduced one tensor at a time.  A graph without update nodes (inference,
  or a graph that does not model the optimizer) has nothing to reduce: the
  replicas are independent.
* Buckets (``bucket_mb > 0``; PyTorch DDP, Li et al. VLDB 2020, 3.2.2
  "Gradient Bucketing"): the gradients are grouped into buckets of about
  ``bucket_mb`` MiB in the order they become ready (:func:`gradient_buckets`)
  and each bucket is reduced by one ring as above, of the bucket's total
  bytes ``B``.  A bucket of one gradient is that gradient's ring (same ids
  and fields).  A bucket of two or more gradients gets, on every replica
  ``q``, a zero-cost node ``bucket<b>/allreduce/bucket/rep<q>`` (the flat
  bucket buffer, DDP with ``gradient_as_bucket_view``: no copy is charged)
  fed by every gradient of the bucket on ``q`` (same device: no transfer),
  so the ring starts when the bucket's last gradient is ready; then
  ``bucket<b>/allreduce/rs<s>/rep<q>``, ``.../ag<s>/rep<q>`` and the
  result ``bucket<b>/allreduce/rep<q>``, which feeds every consumer of
  every gradient of the bucket on ``q`` (each edge the gradient's bytes,
  under the gradient's tensor name, prefixed with its producer's id when
  two gradients of the bucket share a name).  Their ``allreduce`` field:
  ``bucket`` (index), ``phase`` (``bucket`` / ``reduce-scatter`` /
  ``all-gather`` / ``result``), ``bytes`` (``B``), ``step``, ``chunk``;
  the bucket and result nodes also list ``of`` (producer ids) and
  ``tensor`` (tensor names) in bucket order.  Rings of different buckets
  are not serialised (NCCL runs DDP's bucket all-reduces in order on one
  stream): they share the links under the congestion rule, as
  per-gradient rings do.  Each replica sends ``2·(k-1)/k · B`` bytes per
  bucket, in ``2·(k-1)`` transfers instead of ``2·(k-1)`` per gradient:
  fewer link latencies and fewer nodes, but a bucket waits for its last
  gradient.
* ``meta.data_parallel``: ``replicas``, ``scaling``, ``batch_fraction``,
  ``global_batch`` / ``replica_batch`` (when ``meta.batch_size`` is known),
  ``gradients`` (count), ``gradient_bytes`` and
  ``allreduce_bytes_per_device`` (the sum over gradients, or buckets, of
  ``2·(k-1)·G // k``; with uneven chunks a replica's bytes differ by a byte
  per chunk); with buckets also ``bucket_mb`` and ``buckets`` (count).

References
----------
FastT (Yi et al., CoNEXT 2020), 5.2 and 6.2 (DP baseline, strong and weak
scaling); Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009 (the ring: ``2(k-1)/k`` of the data per
node); Li et al., "PyTorch Distributed", VLDB 2020 (DDP: replicated
optimizer, local BatchNorm statistics).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph
from .split_cost import (
    COPY_BANDWIDTH_BPS,
    DEFAULT_OVERHEAD_S,
    BatchProfile,
    batch_profile,
    part_times,
)
from .splitting import edge_dicts, fresh_namer

SCALINGS = ("strong", "weak")
#: the largest bucket capacity accepted (MiB): 1 TiB, every model's gradients in one bucket
BUCKET_MB_MAX = 2**20


def _part_bytes(x: int, k: int, frac: float, equal: bool) -> int:
    """Bytes of a replica's share of *x*: ``ceil(x / k)`` for equal shares,
    ``ceil(frac * x)`` otherwise."""
    return -(-int(x) // k) if equal else math.ceil(frac * int(x))


def check_shares(shares, k: int) -> list[float]:
    """*shares* as a list of ``k`` positive batch fractions summing to 1.

    Raises
    ------
    InvalidInput
        Wrong length, a non-positive or non-finite share, or a sum not 1.
    """
    try:
        out = [float(x) for x in shares]
    except (TypeError, ValueError):
        raise InvalidInput(f"data-parallel: shares must be a list of numbers, got {shares!r}") from None
    if len(out) != k or not all(math.isfinite(x) and x > 0 for x in out) or abs(math.fsum(out) - 1.0) > 1e-9:
        raise InvalidInput(f"data-parallel: shares must be {k} positive batch fractions summing to 1, got {shares!r}")
    return out


def chunk_sizes(nbytes: int, k: int) -> list[int]:
    """Bytes of the ``k`` ring chunks of an ``nbytes`` tensor.

    >>> chunk_sizes(10, 4)
    [3, 3, 2, 2]
    """
    return [nbytes // k + (1 if c < nbytes % k else 0) for c in range(k)]


def gradient_buckets(graph: Graph, grads: list[int], cap_bytes: int) -> list[list[int]]:
    """Gradient tensors *grads* grouped into all-reduce buckets (PyTorch DDP,
    Li et al. VLDB 2020, 3.2.2 "Gradient Bucketing").

    Order: the order the gradients become ready, taken as the order their
    producers run when one replica runs alone on one device under the
    simulator's rule without an order (:func:`ready_order`).  DDP builds its
    buckets from the reverse order of parameter registration and, after the
    first iteration, rebuilds them in the order the gradients actually
    became ready; this is the second, read from the model instead of a run.

    Filling (DDP's ``compute_bucket_assignment_by_size``): gradients are
    appended to the current bucket in that order, and the bucket closes once
    it holds at least *cap_bytes* (so a gradient larger than the cap ends
    the bucket it joins).  A gradient whose producer depends on a consumer
    of a gradient already in the current bucket starts a new bucket (its
    all-reduce could not start before that bucket's result, a cycle).
    *cap_bytes* <= 0: every gradient alone, in tensor order (no bucketing).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("b", [{"id": "l2", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "l1", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "l2", "dst": "l1", "bytes": 8}, {"src": "l1", "dst": "u", "bytes": 30, "tensor": "g1"},
    ...            {"src": "l2", "dst": "u", "bytes": 20, "tensor": "g2"}])
    >>> [[g.tensor_name[t] for t in b] for b in gradient_buckets(g, [1, 2], 40)]
    [['g2', 'g1']]
    >>> [[g.tensor_name[t] for t in b] for b in gradient_buckets(g, [1, 2], 20)]
    [['g2'], ['g1']]
    """
    if cap_bytes <= 0:
        return [[t] for t in grads]
    topo = graph.topo_order()
    run = ready_order(graph)
    src = graph.tensor_src
    order = sorted(grads, key=lambda t: (run[src[t]], t))
    consumers = [dict.fromkeys(graph.edge_dst[e] for e in graph.tensor_edges[t]) for t in range(len(src))]
    # nodes downstream of a consumer of a gradient: only their producers need the cycle check
    below = [False] * graph.n
    starts = {d for t in grads for d in consumers[t]}
    for v in topo:
        below[v] = any(u in starts or below[u] for u in graph.pred[v])
    buckets: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for t in order:
        if cur and below[src[t]] and _reaches({d for x in cur for d in consumers[x]}, src[t], graph):
            buckets.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += graph.tensor_bytes[t]
        if size >= cap_bytes:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def ready_order(graph: Graph) -> list[int]:
    """Position of every node in the order it runs when *graph* runs alone
    on one device and the device always takes the ready node of largest
    upward rank (``compute_s`` summed along the longest path to a sink),
    ties by topological index: the simulator's rule without an order
    (docs/design.md, rule 4) on a single device, where no transfer costs.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("r", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "short", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "long", "compute_s": 5, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "short", "bytes": 1}, {"src": "a", "dst": "long", "bytes": 1}])
    >>> ready_order(g)
    [0, 2, 1]
    """
    topo = graph.topo_order()
    pos = graph.topo_index()
    rank = [0.0] * graph.n
    for v in reversed(topo):
        rank[v] = graph.compute[v] + max((rank[s] for s in graph.succ[v]), default=0.0)
    need = [len(p) for p in graph.pred]
    heap = [(-rank[v], pos[v], v) for v in range(graph.n) if not need[v]]
    heapq.heapify(heap)
    out = [0] * graph.n
    i = 0
    while heap:
        v = heapq.heappop(heap)[2]
        out[v] = i
        i += 1
        for s in graph.succ[v]:
            need[s] -= 1
            if not need[s]:
                heapq.heappush(heap, (-rank[s], pos[s], s))
    return out


def _reaches(sources: set[int], target: int, graph: Graph) -> bool:
    """True when *target* is a descendant of a node in *sources*."""
    seen = {target}
    stack = [target]
    while stack:
        v = stack.pop()
        for u in graph.pred[v]:
            if u in sources:
                return True
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _replica_template(graph: Graph, v: int, prof: BatchProfile, k: int, strong: bool, overhead_s: float,
                      fixed_out: int, share: float | None = None) -> dict:
    """Node document of one replica of node *v* (without id and colocation);
    *fixed_out* = bytes of its batch-independent output tensors; *share*
    the replica's batch fraction when shares are not equal."""
    equal = share is None
    frac = (1.0 / k if equal else share) if strong else 1.0
    scales = strong and k > 1 and not prof.fixed_node[v]
    fixed = prof.fixed_memory[v]
    out: dict[str, Any] = {"op": graph.op[v]}
    if scales:
        c, by = part_times(graph, v, frac, overhead_s=overhead_s)
    else:
        c, by = graph.compute[v], (dict(graph.compute_by_type[v]) if graph.compute_by_type[v] else None)
    out["compute_s"] = c
    if by:
        out["compute_by_type"] = by
    act = graph.memory[v] - fixed
    out["memory_bytes"] = fixed + (_part_bytes(act, k, frac, equal) if scales else act)
    if graph.splittable[v]:
        out["splittable"] = list(graph.splittable[v])
    extra = dict(graph.node_extra[v] or {}) if graph.node_extra else {}
    extra.pop("replica", None)
    extra.pop("origin", None)
    if scales:
        bi = extra.get("batch_independent") if isinstance(extra.get("batch_independent"), dict) else {}
        if isinstance(extra.get("flops"), (int, float)):
            extra["flops"] = int(round(extra["flops"] * frac))
        if isinstance(extra.get("bytes_moved"), (int, float)):
            mf = bi.get("bytes_moved", 0)
            extra["bytes_moved"] = int(round(mf + (extra["bytes_moved"] - mf) * frac))
        if isinstance(extra.get("output_bytes"), int):
            rest = max(0, extra["output_bytes"] - fixed_out)
            extra["output_bytes"] = fixed_out + _part_bytes(rest, k, frac, equal)
        line = extra.get("batch_line")
        if isinstance(line, dict) and isinstance(line.get("batch"), (int, float)):
            extra["batch_line"] = {**line, "batch": line["batch"] * frac}
    out.update(extra)
    return out


def data_parallel_graph(graph: Graph, replicas: int, *, scaling: str = "strong",
                        overhead_s: float = DEFAULT_OVERHEAD_S, shares: list[float] | None = None,
                        bucket_mb: float = 0.0) -> Graph:
    """The data-parallel graph of *graph* with *replicas* replicas (see the
    module docstring).

    Parameters
    ----------
    graph : Graph
        The model's graph (fine or coarse).
    replicas : int
        ``k >= 1``.
    scaling : str
        ``"strong"`` (the global batch is the graph's; every replica runs
        ``1/k`` of it) or ``"weak"`` (every replica runs the graph's batch).
    overhead_s : float
        Extra time of a replica node whose time is scaled linearly
        (:func:`~.split_cost.part_times`).
    shares : list of float, optional
        Strong scaling only: replica ``r`` runs the fraction ``shares[r]``
        of the batch instead of ``1/k`` (uneven batch shares, e.g. in
        proportion to device speed; :func:`check_shares`).  Its times,
        activations and activation tensors scale by its share; gradients,
        and so the all-reduce, are whole in every replica.

    Returns
    -------
    Graph

    Raises
    ------
    InvalidInput
        ``replicas < 1``, an unknown scaling, or *shares* that are not
        ``k`` positive fractions summing to 1 (or given with weak scaling),
        or a negative or non-finite *bucket_mb*.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("m", [{"id": "x", "compute_s": 4.0, "memory_bytes": 400},
    ...                 {"id": "w", "compute_s": 8.0, "memory_bytes": 500, "colocation": "p",
    ...                  "batch_independent": {"memory_bytes": 100, "state_bytes": 100}},
    ...                 {"id": "g", "compute_s": 8.0, "memory_bytes": 100},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1.0, "memory_bytes": 0, "colocation": "p"}],
    ...           [{"src": "x", "dst": "w", "bytes": 400}, {"src": "w", "dst": "g", "bytes": 400},
    ...            {"src": "g", "dst": "u", "bytes": 100}])
    >>> d = data_parallel_graph(g, 2, overhead_s=0.0)
    >>> d.compute[d.index["w/rep1"]], d.memory[d.index["w/rep1"]], d.compute[d.index["u/rep1"]]
    (4.0, 300, 1.0)
    >>> d.meta["data_parallel"]["allreduce_bytes_per_device"]
    100
    """
    k = int(replicas)
    if k < 1:
        raise InvalidInput(f"data-parallel: the number of replicas must be at least 1, got {replicas}")
    if scaling not in SCALINGS:
        raise InvalidInput(f"data-parallel: unknown scaling '{scaling}' (use strong or weak)")
    strong = scaling == "strong"
    cap = _bucket_cap(bucket_mb)
    if shares is not None:
        if not strong:
            raise InvalidInput("data-parallel: batch shares need strong scaling (weak: every replica runs the "
                               "whole batch)")
        shares = check_shares(shares, k)
    prof = batch_profile(graph)
    fresh = fresh_namer(graph)
    n = graph.n
    fixed_out = [0] * n
    for t, p in enumerate(graph.tensor_src):
        if prof.fixed_tensor[t]:
            fixed_out[p] += graph.tensor_bytes[t]
    base = [_replica_template(graph, v, prof, k, strong, overhead_s, fixed_out[v]) for v in range(n)] \
        if shares is None else None
    templates = [base or [_replica_template(graph, v, prof, k, strong, overhead_s, fixed_out[v], shares[r])
                          for v in range(n)] for r in range(k)]
    rep_id = [[fresh(f"{graph.ids[v]}/rep{r}") for v in range(n)] for r in range(k)]
    nodes: list[dict] = []
    for r in range(k):
        for v in range(n):
            nd = {"id": rep_id[r][v], **templates[r][v], "replica": r, "origin": graph.ids[v]}
            if graph.colocation[v] is not None:
                nd["colocation"] = f"{graph.colocation[v]}/rep{r}"
            nodes.append(nd)
    reduce = k > 1
    edges: list[dict] = []
    for r in range(k):
        for e, ed in enumerate(edge_dicts(graph)):
            t = graph.edge_tensor[e]
            if reduce and prof.gradient[t]:
                continue
            out = {**ed, "src": rep_id[r][graph.edge_src[e]], "dst": rep_id[r][graph.edge_dst[e]]}
            if strong and not prof.fixed_tensor[t]:
                out["bytes"] = _part_bytes(ed["bytes"], k, shares[r] if shares else 0.0, shares is None)
                if out["bytes"] != ed["bytes"]:
                    out.pop("comm_s_by_pair", None)
            edges.append(out)
    grads = [t for t in range(len(graph.tensor_src)) if prof.gradient[t]] if reduce else []
    ring_of = {t: j for t, j in zip(grads, _ring_index(graph, grads))}
    buckets = gradient_buckets(graph, grads, cap)
    for b, ts in enumerate(buckets):
        if len(ts) == 1:
            _ring(graph, ts[0], ring_of[ts[0]], k, rep_id, fresh, nodes, edges)
        else:
            _bucket_ring(graph, b, ts, k, rep_id, fresh, nodes, edges)
    meta = dict(graph.meta)
    meta["data_parallel"] = _info(graph, k, scaling, shares, grads, buckets if cap > 0 else None, bucket_mb)
    name = f"{graph.name}+dp{k}"
    return Graph.from_dict({"schema": GRAPH_SCHEMA, "name": name, "meta": meta, "nodes": nodes, "edges": edges},
                           label=name)


def _bucket_cap(bucket_mb) -> int:
    """Bucket capacity in bytes of *bucket_mb* MiB (0: no bucketing)."""
    try:
        mb = float(bucket_mb)
    except (TypeError, ValueError):
        raise InvalidInput(f"data-parallel: bucket_mb must be a number of MiB, got {bucket_mb!r}") from None
    if not math.isfinite(mb) or mb < 0 or mb > BUCKET_MB_MAX:
        raise InvalidInput(f"data-parallel: bucket_mb must be between 0 and {BUCKET_MB_MAX} MiB, got {bucket_mb!r}")
    return math.ceil(mb * 2**20)


def _ring_index(graph: Graph, grads: list[int]) -> list[int]:
    """``j`` of ``<producer>/allreduce<j>``: the gradient's rank among its producer's gradients."""
    count: dict[int, int] = {}
    out = []
    for t in grads:
        p = graph.tensor_src[t]
        out.append(count.get(p, 0))
        count[p] = out[-1] + 1
    return out


def _info(graph: Graph, k: int, scaling: str, shares: list[float] | None, grads: list[int],
          buckets: list[list[int]] | None, bucket_mb: float) -> dict[str, Any]:
    """``meta.data_parallel`` of the data-parallel graph (module docstring)."""
    strong = scaling == "strong"
    frac: Any = (1.0 / k if shares is None else shares) if strong else 1.0
    groups = buckets if buckets is not None else [[t] for t in grads]
    sizes = [sum(graph.tensor_bytes[t] for t in ts) for ts in groups]
    info: dict[str, Any] = {"from": graph.name, "replicas": k, "scaling": scaling, "batch_fraction": frac,
                            "gradients": len(grads), "gradient_bytes": sum(graph.tensor_bytes[t] for t in grads),
                            "allreduce_bytes_per_device": sum(2 * (k - 1) * x // k for x in sizes) if k > 1 else 0}
    if buckets is not None:
        info["bucket_mb"] = float(bucket_mb)
        info["buckets"] = len(buckets)
    b = graph.meta.get("batch_size")
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        info["global_batch"] = b if strong else b * k
        info["replica_batch"] = (b / k if shares is None else [b * x for x in shares]) if strong else b
    return info


def _ring(graph: Graph, t: int, j: int, k: int, rep_id: list[list[str]], fresh, nodes: list[dict],
          edges: list[dict]) -> None:
    """Append the ring all-reduce of gradient tensor *t* (module docstring)."""
    p = graph.tensor_src[t]
    pid = graph.ids[p]
    tname = graph.tensor_name[t]
    size = graph.tensor_bytes[t]
    consumers = list(dict.fromkeys(graph.edge_dst[e] for e in graph.tensor_edges[t]))

    def feed(q: int, res: str) -> None:
        for d in consumers:
            edges.append({"src": res, "dst": rep_id[q][d], "bytes": size, "tensor": tname})

    _ring_nodes(f"{pid}/allreduce{j}", {"of": pid, "tensor": tname}, {}, size, k, [rep_id[q][p] for q in range(k)],
                tname, fresh, nodes, edges, feed)


def _bucket_ring(graph: Graph, b: int, ts: list[int], k: int, rep_id: list[list[str]], fresh, nodes: list[dict],
                 edges: list[dict]) -> None:
    """Append the ring all-reduce of bucket *b*, gradient tensors *ts* (two
    or more, in bucket order; module docstring): a ``bucket`` node per
    replica gathers them, one ring reduces the bucket's bytes, and the
    result node of each replica feeds every consumer of every gradient."""
    size = sum(graph.tensor_bytes[t] for t in ts)
    of = [graph.ids[graph.tensor_src[t]] for t in ts]
    names = [graph.tensor_name[t] for t in ts]
    prefix = f"bucket{b}/allreduce"
    whole = {"bucket": b, "of": of, "tensor": names}
    # the name a result edge carries: the gradient's, unless two gradients of the bucket share it
    seen: dict[str, int] = {}
    for x in names:
        seen[x] = seen.get(x, 0) + 1
    out_name = [x if seen[x] == 1 else f"{pid}/{x}" for x, pid in zip(names, of)]
    packs = []
    for q in range(k):
        nid = fresh(f"{prefix}/bucket/rep{q}")
        nodes.append({"id": nid, "op": "allreduce.bucket", "compute_s": 0.0, "memory_bytes": 0, "replica": q,
                      "allreduce": {**whole, "phase": "bucket", "bytes": size}})
        for t, x in zip(ts, out_name):
            edges.append({"src": rep_id[q][graph.tensor_src[t]], "dst": nid, "bytes": graph.tensor_bytes[t],
                          "tensor": graph.tensor_name[t]})
        packs.append(nid)

    def feed(q: int, res: str) -> None:
        for t, x in zip(ts, out_name):
            for d in dict.fromkeys(graph.edge_dst[e] for e in graph.tensor_edges[t]):
                edges.append({"src": res, "dst": rep_id[q][d], "bytes": graph.tensor_bytes[t], "tensor": x})

    _ring_nodes(prefix, {"bucket": b}, whole, size, k, packs, f"bucket{b}", fresh, nodes, edges, feed)


def _ring_nodes(prefix: str, head: dict, result_head: dict, size: int, k: int, src: list[str], tname: str, fresh,
                nodes: list[dict], edges: list[dict], feed) -> None:
    """The ring all-reduce of *size* bytes held by node ``src[q]`` on every
    replica ``q``: reduce-scatter, all-gather and result nodes (module
    docstring); ring nodes carry ``allreduce`` = *head* + phase fields
    (*result_head* on the result nodes when given); ``feed(q, result_id)``
    appends the result's out-edges."""
    chunks = chunk_sizes(size, k)

    def ring_node(nid: str, phase: str, q: int, step: int | None, chunk: int | None, cost: float) -> str:
        info: dict[str, Any] = {**(result_head if phase == "result" and result_head else head), "phase": phase,
                                "bytes": size}
        if step is not None:
            info["step"] = step
        if chunk is not None:
            info["chunk"] = chunk
        nodes.append({"id": nid, "op": f"allreduce.{phase}", "compute_s": cost, "memory_bytes": 0,
                      "replica": q, "allreduce": info})
        return nid

    rs = [[""] * k for _ in range(k - 1)]
    for s in range(k - 1):
        for q in range(k):
            c = (q - 1 - s) % k
            rs[s][q] = ring_node(fresh(f"{prefix}/rs{s}/rep{q}"), "reduce-scatter", q, s, c,
                                 3.0 * chunks[c] / COPY_BANDWIDTH_BPS)
            source = src[(q - 1) % k] if s == 0 else rs[s - 1][(q - 1) % k]
            edges.append({"src": source, "dst": rs[s][q], "bytes": chunks[c],
                          "tensor": f"{tname}/chunk{c}" if s == 0 else "partial"})
            edges.append({"src": src[q], "dst": rs[s][q], "bytes": chunks[c], "tensor": f"{tname}/chunk{c}"})
    ag = [[""] * k for _ in range(k - 1)]
    for s in range(k - 1):
        for q in range(k):
            c = (q - s) % k
            ag[s][q] = ring_node(fresh(f"{prefix}/ag{s}/rep{q}"), "all-gather", q, s, c, 0.0)
            source = rs[k - 2][(q - 1) % k] if s == 0 else ag[s - 1][(q - 1) % k]
            edges.append({"src": source, "dst": ag[s][q], "bytes": chunks[c], "tensor": "reduced"})
    for q in range(k):
        res = ring_node(fresh(f"{prefix}/rep{q}"), "result", q, None, None, 0.0)
        edges.append({"src": rs[k - 2][q], "dst": res, "bytes": chunks[(q + 1) % k], "tensor": "reduced"})
        for s in range(k - 1):
            edges.append({"src": ag[s][q], "dst": res, "bytes": chunks[(q - s) % k], "tensor": "reduced"})
        feed(q, res)
