"""A placement's plan in words, for people reading a table or a log.

A placement names a device for every node of the graph it was made on -
for a derived graph (data parallelism, operation splits, and the pipeline
transforms to come) the nodes of that graph, so a 1,304-node model run by
four replicas shows more than 3,000 nodes per device.  :func:`describe`
says what the plan is from the placement's recipe (``derivation.steps``)
and the graph it was derived from, e.g. ``data parallelism: 4 replicas of
transformer_b256, 1,304 nodes each, each on 1/4 of the batch + ring
all-reduce of the gradients in 25 MiB buckets`` or ``16 micro-batches of 16
samples (global batch 256) of transformer_b256, gradients accumulated``;
a placement without a
recipe is an operator placement (``operator placement: 1,304 nodes over 4
devices (gpu0 410, ...)``).

Each transform says itself in one function registered in
:data:`DESCRIBERS` (:func:`describer`), given the consecutive recipe steps
of that transform and the :class:`Context`; a new transform (FSDP) adds one
function here.  The words follow the placement, not only its recipe: a
placement of the data-parallel graph whose replicas do not each run whole
on a device of their own (``dpos`` on the replicas, as ``auto`` may
answer) is ``operator placement over a data-parallel graph of 8 replicas
of ...`` with how it spreads them (:func:`replica_devices`).  A transform without one is named as it is.  A pipeline's
stages and schedule are not in its recipe (they are its orders): the
``pipeline`` family writes them in its estimate and :func:`pipeline_words`
says them - ``"4-stage 1F1B, 16 micro-batches, stages 2xV100 | 2xP100,
recompute off"``; a tensor x pipeline x data plan (``megatron``) in
:func:`megatron_words` - ``"TP 8 × PP 2 × DP 32, 1F1B interleaved ×2, 8
micro-batches, sequence parallel, selective recompute"``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import groupby
from typing import Callable

from ..pipelining.schedules import INTERLEAVED, SCHEDULES


@dataclass
class Context:
    """What a describer may use: the base graph's ``name`` and ``nodes``
    (the coarse graph's when the recipe has a ``base``), the devices
    (``devices``: count of the cluster, when known) and the nodes per device
    of the placement (``per_device``: device id -> node count)."""

    name: str
    nodes: int
    devices: int | None = None
    per_device: dict[str, int] = field(default_factory=dict)
    #: replica index -> the devices its nodes run on (a replicated graph's placement; empty: not known)
    replicas: dict[int, set[str]] = field(default_factory=dict)

    def replicas_spread(self) -> str | None:
        """None when every replica runs whole on a device of its own (data
        parallelism, as the recipe says) or that is not known; else how the
        placement spreads them (an operator placement over the replicated
        graph, e.g. DPOS on the data-parallel graph).

        >>> Context("m", 10, 2, {"a": 12, "b": 12}, {0: {"a"}, 1: {"b"}}).replicas_spread() is None
        True
        >>> Context("m", 10, 2, {"a": 15, "b": 9}, {0: {"a", "b"}, 1: {"b"}}).replicas_spread()
        '1 of the 2 replicas spread over several devices, 9-15 nodes per device'
        """
        if not self.replicas:
            return None
        split = sum(1 for devs in self.replicas.values() if len(devs) > 1)
        homes = Counter(next(iter(devs)) for devs in self.replicas.values() if len(devs) == 1)
        shared = sum(n for n in homes.values() if n > 1)
        if not split and not shared:
            return None
        counts = sorted(self.per_device.values())
        what = [f"{split} of the {len(self.replicas)} replicas spread over several devices"] if split else []
        what += [f"{shared} whole replicas sharing devices"] if shared else []
        return ", ".join(what + ([f"{counts[0]:,}-{counts[-1]:,} nodes per device"] if counts else []))


#: transform name -> function(steps of that transform, context) -> words
DESCRIBERS: dict[str, Callable[[list[dict], Context], str]] = {}


def describer(transform: str):
    """Register the words of recipe steps ``{"transform": transform, ...}``."""

    def deco(func: Callable[[list[dict], Context], str]) -> Callable[[list[dict], Context], str]:
        DESCRIBERS[transform] = func
        return func

    return deco


@describer("data-parallel")
def _data_parallel(steps: list[dict], ctx: Context) -> str:
    """Data parallelism (:mod:`celeritas_cli.transform.replicate`), with its ZeRO stage.

    >>> _data_parallel([{"replicas": 4, "zero": 1}], Context("gpt", 100)).split(" + ")[1]
    'ZeRO-1 distributed optimizer: a reduce-scatter per gradient, each update on 1/4 of the parameters, an all-gather of the updated parameters (NCCL)'
    """
    out = []
    for step in steps:
        r = step.get("replicas")
        batch = ("each on the whole batch (weak scaling)" if step.get("scaling") == "weak" else
                 "batch shares by device speed" if step.get("shares") else f"each on 1/{r} of the batch")
        bucket = step.get("bucket_mb") or 0
        form = "explicit ring steps" if step.get("collectives") == "ring" else "NCCL"
        ring = (f"all-reduce of the gradients in {bucket:g} MiB buckets ({form})" if bucket else
                f"one all-reduce per gradient ({form})")
        zero = step.get("zero") or 0
        if zero:
            ring = (f"{zero_words(zero)}: a reduce-scatter per gradient{' bucket' if bucket else ''}, each update on "
                    f"1/{r} of the parameters, an all-gather of the updated parameters ({form})")
        rings = sum(ctx.per_device.values()) - r * ctx.nodes if isinstance(r, int) and r > 0 else 0
        if rings > 0 and len(steps) == 1:
            ring += f" ({rings // r:,} {'collective' if zero else 'all-reduce'} nodes per replica)"
        spread = ctx.replicas_spread()
        head = "data parallelism: " if spread is None else "operator placement over a data-parallel graph of "
        words = f"{head}{r} replicas of {ctx.name}, {ctx.nodes:,} nodes each, {batch} + {ring}"
        out.append(words if spread is None else f"{words}; {spread}")
    return "; ".join(out)


@describer("split")
def _split(steps: list[dict], ctx: Context) -> str:
    nodes = {s.get("node") for s in steps}
    dims = Counter(str(s.get("dim")) for s in steps)
    parts = sorted({int(s.get("n", 0)) for s in steps if isinstance(s.get("n"), int)})
    into = f"{parts[0]}" if len(parts) == 1 else f"{parts[0]}-{parts[-1]}" if parts else "?"
    how = ", ".join(f"{d} {c}" for d, c in sorted(dims.items()))
    return (f"operator splitting: {len(nodes)} operation{'s' if len(nodes) != 1 else ''} of {ctx.name} split "
            f"into {into} parts ({how})")


@describer("microbatch")
def _microbatch(steps: list[dict], ctx: Context) -> str:
    out = []
    for step in steps:
        sizes = step.get("micro_batches") or []
        each = (f" of {sizes[0]} samples" if sizes and len(set(sizes)) == 1 else
                f" of {min(sizes)}-{max(sizes)} samples" if sizes else "")
        batch = f" (global batch {step['global_batch']})" if step.get("global_batch") else ""
        out.append(f"{step.get('m')} micro-batches{each}{batch} of {ctx.name}, gradients accumulated")
    return "; ".join(out)


@describer("recompute")
def _recompute(steps: list[dict], ctx: Context) -> str:
    n = sum(len(s.get("nodes") or []) for s in steps)
    return f"recomputation: {n:,} forward node{'s' * (n != 1)} run again in the backward pass instead of kept"


@describer("fsdp")
def _fsdp(steps: list[dict], ctx: Context) -> str:
    """Sharded data parallelism (:mod:`celeritas_cli.transform.fsdp`).

    >>> _fsdp([{"replicas": 8, "stage": 1}], Context("gpt", 2206))[:72]
    'sharded data parallelism (ZeRO stage 1): 8 replicas of gpt, each on 1/8 '
    >>> _fsdp([{"replicas": 8, "stage": 3, "samples": [1, 3]}], Context("gpt", 2206)).split("; ")[1]
    'per unit (one per module) all-gathers before its forward and backward, a reduce-scatter of its gradients'
    """
    out = []
    for step in steps:
        r, stage = step.get("replicas"), step.get("stage")
        state = {1: "optimizer state", 2: "gradients and optimizer state"}.get(stage, "parameters, gradients and "
                                                                                    "optimizer state")
        batch = "batch shares by device speed" if step.get("samples") else f"each on 1/{r} of the batch"
        unit = f"of about {step['unit_mb']:g} MiB" if step.get("unit_mb") else "one per module"
        comm = ("all-gathers before its forward and backward, a reduce-scatter of its gradients" if stage == 3 else
                "a reduce-scatter of its gradients, an all-gather of its updated parameters")
        out.append(f"sharded data parallelism (ZeRO stage {stage}{', FSDP' if stage == 3 else ''}): {r} replicas "
                   f"of {ctx.name}, {batch}, {state} sharded; per unit ({unit}) {comm}")
    return "; ".join(out)


@describer("tensor-parallel")
def _tensor_parallel(steps: list[dict], ctx: Context) -> str:
    """Tensor (and sequence) parallelism (:mod:`celeritas_cli.transform.tensor_parallel`).

    >>> _tensor_parallel([{"tp": 8, "sequence_parallel": True}], Context("gpt", 2206))
    'tensor parallelism: every layer of gpt split over 8 ranks (Megatron-LM: MLP and attention column then row parallel, vocabulary-parallel embedding and cross entropy), sequence parallel (all-gather / reduce-scatter)'
    """
    out = []
    for step in steps:
        sp = ", sequence parallel (all-gather / reduce-scatter)" if step.get("sequence_parallel") else \
            ", all-reduces in forward and backward"
        out.append(f"tensor parallelism: every layer of {ctx.name} split over {step.get('tp')} ranks (Megatron-LM: "
                   f"MLP and attention column then row parallel, vocabulary-parallel embedding and cross "
                   f"entropy){sp}")
    return "; ".join(out)


#: the estimate fields of a 3D plan (tensor x pipeline x data; :func:`megatron_words`)
MEGATRON_FIELDS = ("tp", "pp", "dp", "schedule", "virtual_stages", "microbatches", "sequence_parallel", "recompute",
                   "use_distributed_optimizer")


def megatron_words(est) -> str | None:
    """A tensor x pipeline x data plan in words from its ``estimate`` fields
    (:data:`MEGATRON_FIELDS`; the ``megatron`` row writes them), e.g.
    ``"TP 8 × PP 2 × DP 32, 1F1B interleaved ×2, 8 micro-batches, sequence
    parallel, selective recompute, ZeRO-1 distributed optimizer"``; None
    for other plans.

    >>> megatron_words({"tp": 8, "pp": 2, "dp": 32, "schedule": "interleaved", "virtual_stages": 2,
    ...                 "microbatches": 8, "sequence_parallel": True, "recompute": "selective"})
    'TP 8 × PP 2 × DP 32, 1F1B interleaved ×2, 8 micro-batches, sequence parallel, selective recompute'
    >>> megatron_words({"tp": 1, "pp": 4, "dp": 2, "schedule": "1f1b", "microbatches": 16, "recompute": "full",
    ...                 "use_distributed_optimizer": True})
    'TP 1 × PP 4 × DP 2, 1F1B, 16 micro-batches, full recompute, ZeRO-1 distributed optimizer'
    >>> megatron_words({"tp": 2, "pp": 1, "dp": 4, "schedule": "1f1b", "microbatches": 1, "recompute": "none"})
    'TP 2 × PP 1 × DP 4, 1 micro-batch'
    """
    if not all(isinstance(est.get(f), int) and not isinstance(est.get(f), bool) for f in ("tp", "pp", "dp")):
        return None
    out = [f"TP {est['tp']} × PP {est['pp']} × DP {est['dp']}"]
    v = est.get("virtual_stages") or 1
    if est["pp"] > 1:
        out.append(f"1F1B interleaved ×{v}" if est.get("schedule") == INTERLEAVED.name and v > 1 else "1F1B")
    m = est.get("microbatches")
    if isinstance(m, int):
        out.append(f"{m} micro-batch{'es' if m != 1 else ''}")
    if est.get("sequence_parallel"):
        out.append("sequence parallel")
    if est.get("recompute") in ("full", "selective"):
        out.append(f"{est['recompute']} recompute")
    if est.get("use_distributed_optimizer") and est["dp"] > 1:
        out.append("ZeRO-1 distributed optimizer")
    return ", ".join(out)


def _spread(ctx: Context) -> str:
    used = sorted(ctx.per_device.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(used) == 1:
        return f"single device: all {ctx.nodes:,} nodes of {ctx.name} on {used[0][0]}"
    of = f" of {ctx.devices}" if ctx.devices is not None and ctx.devices != len(used) else ""
    shown = ", ".join(f"{d} {c:,}" for d, c in used[:8]) + (", ..." if len(used) > 8 else "")
    return f"operator placement: {ctx.nodes:,} nodes of {ctx.name} over {len(used)}{of} devices ({shown})"


def describe(derivation: dict | None, ctx: Context) -> str:
    """The plan in words (module docstring): one phrase per run of
    consecutive recipe steps of one transform, ``"; "``-joined; an
    operator placement's spread over the devices when there is no recipe.

    Example
    -------
    >>> describe({"steps": [{"transform": "data-parallel", "replicas": 4, "scaling": "strong",
    ...                      "bucket_mb": 25.0}]}, Context("transformer_b256", 1304))
    'data parallelism: 4 replicas of transformer_b256, 1,304 nodes each, each on 1/4 of the batch + all-reduce of the gradients in 25 MiB buckets (NCCL)'
    >>> describe({"steps": [{"transform": "data-parallel", "replicas": 2, "bucket_mb": 0}]},
    ...          Context("m", 100, 2, {"gpu0": 130, "gpu1": 130}))
    'data parallelism: 2 replicas of m, 100 nodes each, each on 1/2 of the batch + one all-reduce per gradient (NCCL) (30 all-reduce nodes per replica)'
    >>> describe(None, Context("g", 60, 4, {"gpu0": 40, "gpu1": 20}))
    'operator placement: 60 nodes of g over 2 of 4 devices (gpu0 40, gpu1 20)'
    """
    steps = [s for s in (derivation or {}).get("steps") or [] if isinstance(s, dict)]
    if not steps:
        return _spread(ctx)
    if (derivation or {}).get("base"):
        ctx = Context(f"the coarse graph of {ctx.name}", ctx.nodes, ctx.devices, ctx.per_device)
    words = []
    for transform, run in groupby(steps, key=lambda s: str(s.get("transform"))):
        run = list(run)
        func = DESCRIBERS.get(transform)
        words.append(func(run, ctx) if func is not None else f"{transform} ({len(run)} step{'s' * (len(run) > 1)})")
    return "; ".join(words)


#: the estimate fields of a pipeline plan (:func:`pipeline_words`), which ``auto`` copies from its winner
PIPELINE_FIELDS = ("schedule", "stages", "pipeline_devices", "virtual_stages", "replicas", "microbatches",
                   "stage_devices", "recomputed_stages", "shares_by_speed", "bucket_mb", "zero")


def _runs(names: list[str]) -> str:
    """``["V100", "V100", "P100"]`` -> ``"2xV100 | P100"``."""
    out = []
    for name, group in groupby(names):
        n = len(list(group))
        out.append(f"{n}x{name}" if n > 1 else name)
    return " | ".join(out)


def pipeline_words(est, device_type=None) -> str | None:
    """A pipeline plan in words from its ``estimate`` fields
    (:data:`PIPELINE_FIELDS`; the ``pipeline`` family of algorithms writes
    them), e.g. ``"4-stage 1F1B, 16 micro-batches, stages 2xV100 | 2xP100,
    recompute off"`` (consecutive stages on one device type grouped; one
    replica's pipeline when the pipeline is replicated); None for other
    plans.  *device_type* maps a device id to its type (default: the id).

    >>> pipeline_words({"schedule": "1f1b", "pipeline_devices": 4, "virtual_stages": 1, "replicas": [1] * 4,
    ...                 "microbatches": 16, "stage_devices": [["A"], ["B"], ["C"], ["D"]],
    ...                 "recomputed_stages": []}, {"A": "V100", "B": "V100", "C": "P100", "D": "P100"}.get)
    '4-stage 1F1B, 16 micro-batches, stages 2xV100 | 2xP100, recompute off'
    >>> pipeline_words({"schedule": "1f1b", "pipeline_devices": 1, "replicas": [4], "microbatches": 2,
    ...                 "stage_devices": [["a", "b", "c", "d"]], "recomputed_stages": []})
    'data parallelism x 4, 2 micro-batches accumulated, on a + b + c + d, recompute off'
    >>> pipeline_words({"schedule": "1f1b", "pipeline_devices": 2, "replicas": [2, 2], "microbatches": 8,
    ...                 "stage_devices": [["a", "b"], ["c", "d"]], "zero": 1})
    '2-stage 1F1B x 2 replicas, 8 micro-batches each, stages a | c, recompute off, ZeRO-1 distributed optimizer'
    """
    if not isinstance(est.get("schedule"), str) or not isinstance(est.get("stage_devices"), list):
        return None
    kind = device_type or (lambda x: x)
    lanes = [[str(kind(d) or d) for d in g] for g in est["stage_devices"] if isinstance(g, list)]
    p = int(est.get("pipeline_devices") or len(lanes))
    v = int(est.get("virtual_stages") or 1)
    reps = est.get("replicas")
    reps = reps if isinstance(reps, list) else [reps or 1] * len(lanes)
    even = len(set(reps)) == 1
    R, m = reps[0] if reps else 1, est.get("microbatches")
    mbs = f"{m} micro-batch{'es' if m != 1 else ''}"
    if p == 1:
        head = (f"data parallelism x {R}" if R > 1 else "one device") + \
               (f", {m} micro-batches accumulated" if isinstance(m, int) and m > 1 else "")
        where = f"on {' + '.join(lanes[0])}" if lanes else ""
    else:
        known = SCHEDULES.get(est["schedule"])
        name = known.title if known is not None else est["schedule"]
        head = f"{p}-stage {name}" + (f" ({v} chunks per device)" if v > 1 else "") + \
               (f" x {R} replicas, {mbs} each" if even and R > 1 else f", {mbs}")
        one = [g[0] if even or len(g) == 1 else "+".join(g) for g in lanes[:p]]
        where = f"stages {_runs(one)}" + ("" if even else " (replicated stages take micro-batches in turn)")
    rc = est.get("recomputed_stages") or []
    n = len(lanes)
    out = f"{head}, {where}, recompute " + ("off" if not rc else "on" if len(rc) >= n else f"{len(rc)} of {n} stages")
    if est.get("shares_by_speed"):
        out += ", batch shares by device speed"
    if p == 1 and R > 1 and "bucket_mb" in est:
        out += f", gradients in {est['bucket_mb']:g} MiB buckets" if est["bucket_mb"] else \
            ", one all-reduce ring per gradient"
    if est.get("zero") and even and R > 1:
        out += f", {zero_words(est['zero'])}"
    return out


def zero_words(zero) -> str:
    """ZeRO stage *zero* of data parallelism in words (:mod:`~celeritas_cli.transform.replicate`).

    >>> zero_words(1), zero_words(2)
    ('ZeRO-1 distributed optimizer', 'ZeRO-2 (optimizer state and gradients sharded)')
    """
    return "ZeRO-1 distributed optimizer" if zero == 1 else f"ZeRO-{zero} (optimizer state and gradients sharded)"


def describe_placement(placement, graph, cluster=None) -> str:
    """:func:`describe` for a :class:`~celeritas_cli.model.placement.Placement`
    of *graph* (the graph given to the algorithm, or its original when the
    recipe's ``base`` names the coarse graph it was made on); a pipeline
    plan (its estimate has :data:`PIPELINE_FIELDS`) in
    :func:`pipeline_words`."""
    est = placement.estimate if placement.estimate is not None else {}
    types = (lambda d: cluster.devices[cluster.index[d]].type if d in cluster.index else d) if cluster is not None \
        else None
    words = megatron_words(est)
    if words is None:
        words = pipeline_words(est, types)
    if words is not None:
        return words
    base = (placement.derivation or {}).get("base") if isinstance(placement.derivation, dict) else None
    nodes = len(base["members"]) if isinstance(base, dict) and isinstance(base.get("members"), list) else graph.n
    ctx = Context(graph.original_name if hasattr(graph, "original_name") else graph.name, nodes,
                  cluster.k if cluster is not None else None, nodes_per_device(placement),
                  replica_devices(placement))
    return describe(placement.derivation, ctx)


def _replica_rows(placement) -> list[list[str]] | None:
    """The replica map of a symmetric plan (``replicas.devices``,
    :mod:`~celeritas_cli.sim.symmetric`): replica ``r``'s device for each of
    replica 0's; None for a plan that lists every node."""
    replicas = getattr(placement, "replicas", None)
    rows = replicas.get("devices") if isinstance(replicas, dict) else None
    return rows if isinstance(rows, list) and rows and all(isinstance(r, list) for r in rows) else None


def nodes_per_device(placement) -> dict[str, int]:
    """Device id -> the nodes the plan runs there.  A symmetric plan lists
    replica 0's nodes only: every replica ``r`` runs as many on
    ``replicas.devices[r][j]`` as replica 0 on ``replicas.devices[0][j]``
    (what :func:`~celeritas_cli.sim.symmetric.expand` lists), counted
    without expanding the assignment.

    >>> from types import SimpleNamespace as P
    >>> nodes_per_device(P(assignment={"a/rep0": "g0", "b/rep0": "g0", "c/rep0": "g1"},
    ...                    replicas={"devices": [["g0", "g1"], ["g2", "g3"]]}))
    {'g0': 2, 'g1': 1, 'g2': 2, 'g3': 1}
    """
    counts = Counter(placement.assignment.values())
    rows = _replica_rows(placement)
    if rows is None:
        return dict(counts)
    counts = _tensor_counts(placement, counts)
    out: dict[str, int] = {}
    for row in rows:
        for a, b in zip(rows[0], row):
            if counts.get(a):
                out[b] = out.get(b, 0) + counts[a]
    return out


def _tensor_counts(placement, counts: Counter) -> Counter:
    """*counts* of tensor rank 0's nodes given to every tensor rank
    (``replicas.tensor`` of a plan whose tensor ranks are judged as kinds:
    rank ``t`` runs as many on ``tensor[t][i]`` as rank 0 on ``tensor[0][i]``)."""
    tensor = placement.replicas.get("tensor") if isinstance(placement.replicas, dict) else None
    if not isinstance(tensor, list) or not tensor or not all(isinstance(r, list) for r in tensor):
        return counts
    out = Counter(counts)
    for row in tensor[1:]:
        for a, b in zip(tensor[0], row):
            if counts.get(a):
                out[b] = counts[a]
    return out


_REPLICA_ID = re.compile(r"/rep(\d+)$")


def replica_devices(placement) -> dict[int, set[str]]:
    """Replica index -> the devices its nodes (and its collectives or ring
    steps) run on, for a placement of a replicated graph (a
    ``data-parallel`` step in its recipe): from the replica map of a
    symmetric plan (``replicas.devices``: replica ``r`` on the devices
    standing for those replica 0's nodes use), else read from the derived
    graph's nodes (``replica``) when the placement carries it, else from the
    node ids (``<id>/rep<r>``, :mod:`~celeritas_cli.transform.replicate`);
    empty for any other plan."""
    steps = (placement.derivation or {}).get("steps") if isinstance(placement.derivation, dict) else None
    if not any(isinstance(s, dict) and s.get("transform") == "data-parallel" for s in steps or []):
        return {}
    rows = _replica_rows(placement)
    if rows is not None:  # a symmetric plan: replica r runs where the map sends replica 0's devices
        used = set(_tensor_counts(placement, Counter(placement.assignment.values())))
        return {r: {b for a, b in zip(rows[0], row) if a in used} for r, row in enumerate(rows)}
    derived = getattr(placement, "derived", None)
    out: dict[int, set[str]] = {}
    if derived is not None and derived.node_extra:
        for v in range(derived.n):
            r = (derived.node_extra[v] or {}).get("replica")
            dev = placement.assignment.get(derived.ids[v])
            if isinstance(r, int) and dev is not None:
                out.setdefault(r, set()).add(dev)
        return out
    for node, dev in placement.assignment.items():
        found = _REPLICA_ID.search(node)
        if found:
            out.setdefault(int(found.group(1)), set()).add(dev)
    return out
