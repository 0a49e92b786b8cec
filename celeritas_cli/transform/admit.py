"""Before a graph rewrite builds anything: may it be done, and how large
will its result be.

Every rewrite that splits the batch is physically possible only where the
graph declares its batch (:mod:`~.batch`) and only in whole samples; data
parallelism needs a fine graph (on a coarse graph the gradients and the
optimizer updates they feed are no longer told apart, and the gradient
all-reduce would silently disappear: issue 24, case N13).  And every
rewrite states the size of what it builds from the size of its input
(:func:`data_parallel_size`, :func:`split_size`), so a recipe with a million
replicas is refused at once (:mod:`~.size`) instead of being built.

:mod:`~.replicate` (:func:`~.replicate.data_parallel_graph`) and
:mod:`~.splitting` (:func:`~.splitting.split_operation`) call these first;
algorithms call them to choose only what can be built
(:func:`dp_refusal`, :func:`split_refusal`).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInput
from ..model.graph import Graph
from .allreduce import bucket_cap, gradient_buckets
from .batch import declared_batch, whole_samples
from .size import Size, check_size
from .split_cost import batch_profile, splittable_dims

DIMENSIONS = ("batch", "channel")


def check_shares(shares, k: int) -> list[float]:
    """*shares* as a list of ``k`` positive batch fractions summing to 1.

    Raises
    ------
    InvalidInput
        Not a list, an element that is not a number (a string is not
        coerced), wrong length, a non-positive or non-finite share, or a
        sum not 1.

    >>> check_shares([0.25, 0.75], 2)
    [0.25, 0.75]
    >>> check_shares([0.5, "0.5"], 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: data-parallel: shares[1] must be a number, got '0.5'
    """
    if not isinstance(shares, (list, tuple)):
        raise InvalidInput(f"data-parallel: shares must be a list of {k} batch fractions, got {_short(shares)}")
    for i, x in enumerate(shares):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise InvalidInput(f"data-parallel: shares[{i}] must be a number, got {_short(x)}")
    out = [float(x) for x in shares]
    if len(out) != k or not all(math.isfinite(x) and x > 0 for x in out) or abs(math.fsum(out) - 1.0) > 1e-9:
        raise InvalidInput(f"data-parallel: shares must be {k} positive batch fractions summing to 1, "
                           f"got {_short(shares)}")
    return out


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def replica_samples(batch: int, k: int, shares: list[float] | None = None) -> list[int]:
    """Whole samples of each of *k* replicas of a *batch* (strong scaling):
    equal shares (:func:`~.batch.whole_samples`: the first ``batch % k``
    replicas one sample more), or *shares* (fractions), each of which must
    be a whole number of samples, at least one.

    Raises
    ------
    InvalidInput
        ``batch < k``, or a share that is not a whole number of samples.

    >>> replica_samples(10, 4), replica_samples(8, 2, [0.25, 0.75])
    ([3, 3, 2, 2], [2, 6])
    >>> replica_samples(8, 2, [0.3, 0.7])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: data-parallel: shares[0] = 0.3 is 2.4 samples of the batch of 8...
    """
    if shares is None:
        return whole_samples(batch, k, what=f"data-parallel over {k} replicas: the batch")
    samples = [round(x * batch) for x in shares]
    for r, (x, b) in enumerate(zip(shares, samples)):
        if b < 1 or abs(x * batch - b) > max(1e-6, batch * 1e-12):
            raise InvalidInput(f"data-parallel: shares[{r}] = {x:g} is {x * batch:g} samples of the batch of "
                               f"{batch}: every replica needs a whole number of samples, at least one")
    if sum(samples) != batch:
        raise InvalidInput(f"data-parallel: shares give {sum(samples)} samples, the batch is {batch}")
    return samples


def check_replicable(graph: Graph) -> None:
    """Refuse a graph data parallelism cannot replicate honestly.

    Raises
    ------
    InvalidInput
        A coarse graph (its nodes group operators, so gradients and the
        optimizer updates they feed are no longer told apart and the
        gradient all-reduce would silently disappear: replicate the original
        graph), a graph already data-parallel (or sharded, ``fsdp``), or one
        whose operations were split (data parallelism comes first in a recipe).
    """
    if graph.is_coarse:
        raise InvalidInput(f"data-parallel: graph '{graph.name}' is coarse: its nodes group operators, so gradients "
                           f"and the optimizer updates they feed cannot be told apart and the gradient all-reduce "
                           f"would be lost; replicate the original graph '{graph.original_name}' instead")
    if isinstance(graph.meta.get("data_parallel"), dict) or isinstance(graph.meta.get("fsdp"), dict):
        raise InvalidInput(f"data-parallel: graph '{graph.name}' is already data-parallel")
    if graph.meta.get("splits"):
        raise InvalidInput(f"data-parallel: graph '{graph.name}' has split operations; data parallelism must come "
                           f"before operation splits")


def dp_batch(graph: Graph, k: int, scaling: str = "strong", shares: list[float] | None = None,
             assume_batch: int | None = None) -> tuple[int | None, list[int] | None]:
    """The batch data parallelism over *k* replicas divides and each
    replica's whole samples: ``(batch, samples)``; ``samples`` is None when
    the batch is not divided (weak scaling, one replica), ``batch`` None
    when the graph declares none and none is needed.

    Strong scaling over ``k > 1`` replicas splits the batch, which needs a
    declared batch (:func:`~.batch.declared_batch`: ``meta.batch_size``, or
    *assume_batch*) of at least ``k`` samples.

    Raises
    ------
    InvalidInput
        No declared batch, ``batch < k``, shares that are not whole samples;
        a micro-batched graph whose micro-batches ``k`` does not divide (each
        replica's copy of a micro-batch runs ``1/k`` of it).
    """
    if scaling == "strong" and k > 1:
        batch = declared_batch(graph, assume_batch,
                               what=f"data parallelism over {k} replicas (each on a share of the batch)")
        mb = graph.meta.get("microbatch")
        if isinstance(mb, dict) and isinstance(mb.get("micro_batches"), list):
            # a micro-batch copy of every replica runs 1/k of its micro-batch: whole samples only if k divides them
            if shares is not None or any(not isinstance(b, int) or b % k for b in mb["micro_batches"]):
                raise InvalidInput(f"data-parallel: the micro-batches {mb['micro_batches']} of graph '{graph.name}' "
                                   f"do not divide into {k} equal shares of whole samples; replicate the model "
                                   f"graph first, then micro-batch it")
        return batch, replica_samples(batch, k, check_shares(shares, k) if shares is not None else None)
    if assume_batch is None and graph.meta.get("batch_size") is None:
        return None, None
    return declared_batch(graph, assume_batch), None


def gradient_plan(graph: Graph, k: int, cap: int) -> tuple[list[int], list[list[int]]]:
    """Gradient tensors to all-reduce (none for one replica) and their buckets."""
    if k <= 1:
        return [], []
    prof = batch_profile(graph)
    grads = [t for t in range(len(graph.tensor_src)) if prof.gradient[t]]
    return grads, gradient_buckets(graph, grads, cap)


def data_parallel_size(graph: Graph, replicas: int, bucket_mb: float = 0.0, collectives: str = "nccl",
                       built: int | None = None) -> Size:
    """Nodes and edges of :func:`~.replicate.data_parallel_graph` of *graph* with
    *replicas* replicas, counted from *graph* without building it.

    ``k`` replicas of every node and of every edge that does not carry a
    gradient; per all-reduce ring (one per gradient, or per bucket of
    gradients) of ``k`` replicas: ``2(k-1)`` reduce-scatter and all-gather
    nodes and a result node per replica, ``3k(k-1)`` ring edges, ``k^2``
    edges into the results and one edge per replica to every consumer of
    every gradient of the ring; a bucket of two or more gradients adds a
    bucket node per replica and an edge per gradient into it.  The ring is
    what makes the graph grow as ``k^2``.  In the ``nccl`` form (the
    default) a bucket is one collective node per replica, an edge per
    gradient into it and one per consumer out: ``O(k)``; *built* replicas
    of the ``k`` when only some are built (the symmetric judge).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("m", [{"id": "w", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "w", "dst": "u", "bytes": 100}])
    >>> data_parallel_size(g, 4, collectives="ring")
    Size(nodes=36, edges=56)
    >>> from celeritas_cli.transform.replicate import data_parallel_graph
    >>> d = data_parallel_graph(g, 4, scaling="weak", collectives="ring")
    >>> d.n, d.m
    (36, 56)
    >>> data_parallel_size(g, 4), data_parallel_graph(g, 4, scaling="weak").n
    (Size(nodes=12, edges=8), 12)
    """
    grads, buckets = gradient_plan(graph, int(replicas), bucket_cap(bucket_mb))
    k = int(replicas) if built is None else int(built)
    is_grad = set(grads)
    kept = sum(1 for e in range(graph.m) if graph.edge_tensor[e] not in is_grad)
    nodes, edges = k * graph.n, k * kept
    for ts in buckets:
        consumers = sum(len(set(graph.edge_dst[e] for e in graph.tensor_edges[t])) for t in ts)
        if collectives == "nccl":
            nodes += k
            edges += k * (len(ts) + consumers)
            continue
        nodes += k * (2 * (k - 1) + 1)
        edges += 3 * k * (k - 1) + k * k + k * consumers
        if len(ts) > 1:
            nodes += k
            edges += k * len(ts)
    return Size(nodes, edges)


def dp_refusal(graph: Graph, k: int, assume_batch: int | None = None, bucket_mb: float = 0.0, *,
               sized: bool = True) -> str | None:
    """Why data parallelism (strong scaling) over *k* replicas of *graph*
    cannot be built (:func:`check_replicable`, :func:`dp_batch`, and with
    *sized* the size budget), or None; for algorithms that choose whether to
    replicate.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [], meta={"batch_size": 2})
    >>> dp_refusal(g, 2) is None, dp_refusal(g, 4)  # doctest: +ELLIPSIS
    (True, 'data-parallel over 4 replicas: the batch of 2 samples cannot be split 4 ways...')
    """
    try:
        check_replicable(graph)
        dp_batch(graph, k, "strong", None, assume_batch)
        if sized:
            check_size(data_parallel_size(graph, k, bucket_mb), f"data-parallel: {k} replicas of graph '{graph.name}'",
                       devices=k)
    except InvalidInput as exc:
        return str(exc)
    return None


def node_batch(graph: Graph, v: int, assume: int | None = None) -> int:
    """Samples node *v* runs on: in a data-parallel graph a replica node's
    share (``meta.data_parallel.replica_batch``), else the batch the graph
    declares (:func:`~.batch.declared_batch`, *assume* when it declares
    none).

    Raises
    ------
    InvalidInput
        The graph declares no batch and none is assumed.
    """
    extra = graph.node_extra[v] if graph.node_extra else None
    info = graph.meta.get("data_parallel") or graph.meta.get("fsdp")  # both record each replica's samples
    if extra and "replica" in extra and isinstance(info, dict) and "replica_batch" in info:
        rb, r = info["replica_batch"], extra["replica"]
        value = rb[r] if isinstance(rb, list) and isinstance(r, int) and 0 <= r < len(rb) else rb
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return declared_batch(graph, assume, what=f"splitting node '{graph.ids[v]}' along the batch")


def split_refusal(graph: Graph, v: int, dim: str, n: int, assume: int | None = None) -> str | None:
    """Why node *v* of *graph* cannot be split along *dim* into *n* parts
    (None when it can): *dim* not in its ``splittable`` list or not allowed
    (:func:`~.split_cost.splittable_dims`), ``n < 2``, or a batch split
    whose parts would not be equal shares of whole samples: the node runs on
    ``b`` samples (:func:`node_batch`; a graph that declares no batch has
    none to split) and ``n`` must divide ``b`` (the part cost model gives
    every part ``1/n`` of the batch).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}], [],
    ...           meta={"batch_size": 6})
    >>> split_refusal(g, 0, "batch", 3) is None, split_refusal(g, 0, "batch", 4)
    (True, "split: node 'c' runs on 6 samples, which do not divide into 4 equal parts of whole samples")
    """
    vid = graph.ids[v]
    dims = graph.splittable[v] or []
    if dim not in dims:
        return f"split: node '{vid}' cannot be split along '{dim}' (its splittable field lists {dims or 'nothing'})"
    if dim not in DIMENSIONS:
        return f"split: node '{vid}': unknown dimension '{dim}' (known: {', '.join(DIMENSIONS)})"
    if dim not in splittable_dims(graph, v):
        why = ("it does not depend on the batch" if dim == "batch"
               else "it produces gradients, whose channel split would need a sum of partial input gradients")
        return f"split: node '{vid}' cannot be split along '{dim}': {why}"
    if int(n) < 2:
        return f"split: node '{vid}': the number of parts must be at least 2, got {n}"
    if dim == "batch":
        try:
            b = node_batch(graph, v, assume)
        except InvalidInput as exc:
            return f"split: {exc}"
        if b % int(n):
            return (f"split: node '{vid}' runs on {b} sample{'s' if b != 1 else ''}, which do not divide into {n} "
                    f"equal parts of whole samples")
    return None


def split_size(graph: Graph, v: int, dim: str, n: int) -> Size:
    """Nodes and edges of :func:`~.splitting.split_operation` of node *v* into *n*
    parts along *dim*, counted from *graph* without building it: the node
    becomes ``n`` parts, a split node per sliced input tensor, a concat or
    sum node per output tensor (parameter reads come from the weights node,
    present when the node holds parameters or batch-independent memory);
    its edges become one per part per input tensor and per output tensor,
    plus the edges into the split nodes and out to the consumers.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}],
    ...           [{"src": "a", "dst": "c", "bytes": 100}], meta={"batch_size": 4})
    >>> from celeritas_cli.transform.splitting import split_operation
    >>> split_size(g, 1, "batch", 2), split_operation(g, "c", "batch", 2).m
    (Size(nodes=4, edges=3), 3)
    """
    n = int(n)
    prof = batch_profile(graph)
    batch = dim == "batch"
    ins = dict.fromkeys(graph.edge_tensor[e] for e in graph.in_edges[v])
    outs: dict[int, int] = {}
    for e in graph.out_edges[v]:
        t = graph.edge_tensor[e]
        outs[t] = outs.get(t, 0) + 1
    grads = [t for t in outs if batch and prof.gradient[t]]
    states = {t for t in outs if batch and t in prof.state_out[v]}
    rest = prof.fixed_memory[v]
    for t in grads:
        rest -= min(graph.tensor_bytes[t], rest)
    params = prof.param_bytes[v]
    weights = params > 0 or bool(states) or (batch and rest > 0)
    sliced = sum(1 for t in ins if batch and not prof.fixed_tensor[t])
    nodes = graph.n - 1 + n + sliced + sum(1 for t in outs if t not in states) + int(weights)
    edges = graph.m - len(graph.in_edges[v]) - len(graph.out_edges[v])
    edges += (n if weights and params > 0 else 0) + len(ins) * n + sliced
    edges += sum(c + (0 if t in states else n) for t, c in outs.items())
    return Size(nodes, edges)


def replica_kinds(prefix: Graph, step: dict) -> list[int]:
    """For every replica of data-parallel recipe *step* applied to *prefix*,
    the first replica of its kind: the same number of samples (or the same
    share); replicas of one kind do the same work (the symmetric judge,
    :mod:`~celeritas_cli.sim.symmetric`).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [], meta={"batch_size": 10})
    >>> replica_kinds(g, {"replicas": 4}), replica_kinds(g, {"replicas": 5})
    ([0, 0, 2, 2], [0, 0, 0, 0, 0])
    """
    k = step["replicas"]
    batch, samples = dp_batch(prefix, k, step.get("scaling", "strong"), step.get("shares"), step.get("assume_batch"))
    key = samples if samples is not None else (step.get("shares") or [0] * k)
    first: dict = {}
    return [first.setdefault(key[r], r) for r in range(k)]
