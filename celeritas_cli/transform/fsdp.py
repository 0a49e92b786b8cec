"""Sharded data parallelism as a graph transformation: ZeRO's stages 1-3
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC'20) and PyTorch FSDP (Zhao et al., "PyTorch FSDP:
Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023).

:func:`fsdp_graph` returns a new validated
:class:`~celeritas_cli.model.graph.Graph`; the recipe step
(:func:`fsdp_step`) is ``{"transform": "fsdp", "replicas": k, "stage":
1|2|3, "global_batch": B, "overhead_s": s}`` (+ ``"unit_mb": x`` for the
size wrap policy, ``"samples": [b0, ...]`` for unequal shares of the batch,
``"assume_batch": N`` when the user asserted the batch, ``"collectives":
"ring"`` for explicit ring steps; absent = ``nccl``).

What is sharded (ZeRO section 5, Figure 1)
-------------------------------------------
``k`` replicas each run a share of the batch in whole samples
(:func:`~.batch.whole_samples`; times, activations and batch-dependent
tensors as a data-parallel replica's, :mod:`~.replicate`), and each holds
``1/k`` of the state (:mod:`~.fsdp_units` says what is parameters,
gradients and optimizer state):

* **stage 1** (ZeRO ``P_os``, section 5.1): optimizer state.  Each replica's
  update runs on its ``1/k`` of every parameter (time ``t/k`` + ``overhead_s``,
  memory and ``flops`` ``1/k``).  Its gradients are reduce-scattered, not
  all-reduced: the update needs only the reduced shard, and the
  all-reduce's all-gather half carries the *updated parameters* instead
  (section 7.2.1: the same ``2Ψ`` volume as data parallelism).  The full
  gradient stays live until the update (an edge from its producer).
* **stage 2** (``P_os+g``, section 5.2): + gradients.  A unit's gradients
  are freed once reduce-scattered; only the reduced shard lives until the
  update; resident gradient buffers are sharded.
* **stage 3** (``P_os+g+p``, section 5.3; FSDP's ``FULL_SHARD``): +
  parameters.  Each unit's parameters are all-gathered before its forward
  and again before its backward (FSDP sections 3.2.1 and 3.3), held by the
  gather's result node as an *activation*, so under the judge's time rule
  they are freed after their last reader (FSDP's resharding after
  forward); gradients are reduce-scattered per unit; nothing is gathered
  after the update.  Volume per replica ``3Ψ (k-1)/k`` (section 7.2.2).

Structure (``k >= 2``; one replica is the model with ``replica`` 0)
--------------------------------------------------------------------
* ``<id>/rep<r>`` for every node (fields ``replica``, ``origin``,
  colocation ``<group>/rep<r>``), sharded as above; a source holder runs on
  its shard in stage 3 (its outputs ``1/k``).
* Per unit ``i`` and replica ``q``, zero-cost nodes with a field ``fsdp``
  (``unit``, ``name``, ``phase``, ``bytes``, ``for``; ``step``/``chunk``
  on ring steps): stage 3 ``fsdp/u<i>/shard/rep<q>`` (the unit's flat
  parameter shard, resident; it receives the source holders' sharded
  outputs), and one collective per entry of FSDP's issue order
  (:mod:`~.fsdp_units`), in one of two forms (``collectives``):

  - ``nccl`` (the default): ONE node per replica and collective
    (:func:`~.allreduce.collective_node`, simulator rule 6: it runs on the
    device's collective stream, ``seq`` = its place in the issue order, so
    every stream takes the collectives in FSDP's order, costed by NCCL's
    formulas for the whole group, ``ranks = k``).  A gather
    ``fsdp/u<i>/fwd/rep<q>`` or ``/bwd/rep<q>`` (``collective.all-gather``
    of the unit's gathered bytes) reads the shard and feeds every reader;
    its ``memory_bytes`` are the gathered unit, an activation from the
    gather's start (the output buffer is allocated when the collective is
    issued) until its last reader.  A reduce-scatter
    ``fsdp/u<i>/grad/rep<q>`` (``collective.reduce-scatter`` of the unit's
    gradient bytes) reads the unit's gradients where they were produced
    (FSDP reduces the flat gradient in place: no copy) and its output, the
    reduced shard (``memory_bytes``), feeds the unit's updates; stages 1-2
    ``fsdp/u<i>/post/rep<q>`` (``collective.all-gather`` of the updated
    parameters, fed by the unit's updates, written into the replicated
    parameters: no memory).  Every replica's share of a flat buffer is
    ``ceil(x / k)``: FSDP pads a flat parameter to a multiple of ``k``
    (Zhao et al. 3.2.1), so every replica holds the same and replicas of
    one kind (the same samples) are alike (the symmetric judge,
    :mod:`~celeritas_cli.sim.symmetric`; ``represent`` builds only some
    replicas).  No edge crosses replicas: the traffic is in the formula.
  - ``ring``: per gather ``.../start/rep<q>`` (issues it), the ring
    all-gather ``.../ag<s>/rep<q>`` of :func:`~.allreduce.ring_all_gather`
    (each step keeps its chunk), and the gathered unit
    ``fsdp/u<i>/<fwd|bwd>/rep<q>`` (``memory_bytes`` = the unit's gathered
    bytes, an activation), which feeds every reader; per unit with
    gradients ``fsdp/u<i>/grad/pack/rep<q>`` (the flat gradient, an
    activation, fed by the unit's gradients), the ring reduce-scatter
    ``.../rs<s>/rep<q>`` of :func:`~.allreduce.ring_reduce_scatter`, and
    the reduced shard ``fsdp/u<i>/grad/rep<q>``, which feeds the unit's
    updates; stages 1-2 ``fsdp/u<i>/post/start/rep<q>`` (fed by the unit's
    updates), its ring all-gather and ``fsdp/u<i>/post/rep<q>``.  Shards
    are ring chunks (replica ``q`` holds chunk ``(q+1) mod k``).  Every
    ring step is a transfer between adjacent replicas, so the simulator's
    congestion rule applies; this is what ``placer run`` executes
    (:func:`~celeritas_cli.run.plan.executable` turns the nccl form's
    nodes into these, by id: the gathered node and the reduced shard keep
    the nccl node's id).

  In both forms a chain of zero-byte edges (tensor ``issue``) orders the
  collectives as FSDP issues them, and zero-byte edges (tensor
  ``rate-limit``) hold a gather until the readers of the gather two before
  it finish (:mod:`~.fsdp_units`): prefetch overlaps a gather with the
  previous unit's compute and never runs further ahead.  (In the nccl form
  the issue chain repeats what the stream's ``seq`` order says; as its edge
  leaves the collective node, a gathered unit is held at least until the
  next collective ends.)
* ``meta.fsdp``: ``replicas``, ``stage``, ``wrap``, ``unit_mb``, ``units``
  (``name``, ``gather_bytes``, ``gradient_bytes``), ``global_batch``,
  ``replica_batch``, ``gather_bytes``, ``gradient_bytes`` and
  ``bytes_per_device`` (sent by each replica: ``(k-1)·x // k`` per ring of
  ``x`` bytes), ``collectives`` (the form) and ``represented`` (the
  replicas built, when only some are).

Not modelled: the nccl form's stream runs one collective at a time (FSDP
issues all-gathers and reduce-scatters on two streams, so a reduce-scatter
may overlap the next all-gather); mixed-precision master weights held by a
source holder count as parameters (sharded by stage 3 only, where ZeRO counts them as
optimizer state), gathers and reduce-scatters in the graph's dtypes, one
process group (no hybrid sharding), no CPU offload.

Example
-------
>>> from celeritas_cli.model.graph import build
>>> nd = lambda i, **kw: {"id": i, "compute_s": 1.0, "memory_bytes": 0, **kw}
>>> g = build("m", [nd("x"), nd("f", colocation="param:l.0.w", memory_bytes=8, resident_bytes=8,
...                             batch_independent={"memory_bytes": 8, "state_bytes": 8}),
...                 nd("b", op="aten.mm_backward"),
...                 nd("u", op="optim.sgd", colocation="param:l.0.w", memory_bytes=16, resident_bytes=16)],
...           [{"src": "x", "dst": "f", "bytes": 4}, {"src": "f", "dst": "b", "bytes": 4},
...            {"src": "b", "dst": "u", "bytes": 8, "tensor": "grad"}], meta={"batch_size": 2})
>>> d = fsdp_graph(g, 2, 3, overhead_s=0.0)
>>> [d.memory[d.index[i]] for i in ("f/rep0", "u/rep0", "fsdp/u0/shard/rep0", "fsdp/u0/fwd/rep0")]
[0, 8, 4, 8]
>>> d.meta["fsdp"]["bytes_per_device"]   # 3 x 8 bytes x (k - 1) / k
12
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph
from ..model.residency import declares
from .allreduce import (
    check_form,
    chunk_sizes,
    collective_node,
    ring_all_gather,
    ring_collect,
    ring_node,
    ring_reduce_scatter,
)
from .batch import declared_batch, whole_samples
from .fsdp_units import Plan, Unit, check_unit_mb, fsdp_plan, fsdp_size
from .fsdp_units import sharded_node as _sharded
from .replicate import _replica_template
from .size import Size, check_size
from .split_cost import DEFAULT_OVERHEAD_S, batch_profile
from .splitting import edge_dicts, fresh_namer

STAGES = (1, 2, 3)
_PASS = {"fwd": "forward", "bwd": "backward", "rs": "backward", "post": "update"}


def fsdp_step(replicas: int, stage: int, global_batch: int, overhead_s: float, unit_mb: float = 0.0,
              assume_batch: int | None = None, samples: list[int] | None = None, collectives: str = "nccl") -> dict:
    """The recipe step of :func:`fsdp_graph` (``unit_mb`` only for the size
    wrap policy, ``assume_batch`` only when the user asserted the batch,
    ``samples`` only when the replicas' shares are not the equal ones,
    ``collectives`` only when it is not ``nccl``)."""
    step: dict[str, Any] = {"transform": "fsdp", "replicas": int(replicas), "stage": int(stage),
                            "global_batch": int(global_batch), "overhead_s": overhead_s}
    if unit_mb:
        step["unit_mb"] = float(unit_mb)
    if samples is not None:
        step["samples"] = [int(b) for b in samples]
    if assume_batch is not None:
        step["assume_batch"] = int(assume_batch)
    if collectives != "nccl":
        step["collectives"] = collectives
    return step


def check_fsdp(graph: Graph, replicas: int, stage: int, assume_batch: int | None = None,
               samples: list[int] | None = None) -> tuple[int, list[int]]:
    """``(batch, samples per replica)`` of sharded data parallelism of
    *graph* over *replicas* at *stage* (*samples*, when given, else equal
    shares of whole samples), or why it cannot be built.

    Raises
    ------
    InvalidInput
        ``replicas < 1``, a stage not 1-3, a coarse graph (its nodes hide
        which state is parameters, gradients and optimizer state), one
        already data-parallel, sharded or split (sharding comes first), a
        micro-batched one (stage 3: not modelled, as DeepSpeed refuses
        ZeRO-3 with pipelines; stages 1-2: the data-parallel step's
        ``zero``, :mod:`~.replicate`), a graph that declares no batch, fewer samples than
        replicas, or *samples* that are not ``k`` whole numbers >= 1 summing
        to the batch.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidInput(f"fsdp: the number of replicas must be an integer >= 1, got {replicas!r}")
    if stage not in STAGES:
        raise InvalidInput(f"fsdp: stage must be 1, 2 or 3 (ZeRO's P_os, P_os+g, P_os+g+p), got {stage!r}")
    if graph.is_coarse:
        raise InvalidInput(f"fsdp: graph '{graph.name}' is coarse: its nodes group operators, so parameters, "
                           f"gradients and optimizer state cannot be told apart; shard the original graph "
                           f"'{graph.original_name}' instead")
    if graph.meta.get("microbatch"):
        if stage == 3:
            raise InvalidInput(f"fsdp: graph '{graph.name}' is micro-batched: stage 3 over micro-batches or a "
                               f"pipeline is not modelled (every micro-batch would all-gather each unit again; "
                               f"DeepSpeed refuses ZeRO-3 with pipeline parallelism too); shard the model's graph")
        raise InvalidInput(f"fsdp: graph '{graph.name}' is micro-batched: ZeRO stage {stage} over a pipeline's "
                           f"replicas is the data-parallel step's zero={stage} (-p zero={stage}), after the "
                           f"micro-batches")
    for key, what in (("data_parallel", "data-parallel"), ("fsdp", "sharded"), ("splits", "split")):
        if graph.meta.get(key):
            raise InvalidInput(f"fsdp: graph '{graph.name}' is already {what}; sharded data parallelism applies to "
                               f"the model's graph, before any other rewrite")
    batch = declared_batch(graph, assume_batch,
                           what=f"sharded data parallelism over {replicas} replicas (each on a share of the batch)")
    equal = whole_samples(batch, replicas, what=f"fsdp over {replicas} replicas: the batch")
    if samples is None:
        return batch, equal
    if not isinstance(samples, list) or len(samples) != replicas or sum(samples) != batch or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in samples):
        raise InvalidInput(f"fsdp: samples must be {replicas} whole numbers of samples >= 1 summing to the batch of "
                           f"{batch}, got {samples!r}")
    return batch, list(samples)


def fsdp_graph(graph: Graph, replicas: int, stage: int, *, unit_mb: float = 0.0,
               overhead_s: float = DEFAULT_OVERHEAD_S, assume_batch: int | None = None,
               samples: list[int] | None = None, collectives: str = "nccl",
               represent: list[int] | None = None) -> Graph:
    """The sharded data-parallel graph of *graph* (module docstring).

    Parameters
    ----------
    graph : Graph
        The model's training step (fine, with ``meta.batch_size``).
    replicas : int
        ``k >= 1``, at most the batch.
    stage : int
        1 (optimizer state), 2 (+ gradients) or 3 (+ parameters: FSDP).
    unit_mb : float
        0: one unit per module (:func:`~.fsdp_units.unit_key`); else units
        of about this many MiB of gathered parameters.
    overhead_s : float
        Extra time of a node whose time is scaled linearly.
    assume_batch : int, optional
        The batch the costs hold for, when the graph declares none.
    samples : list of int, optional
        Samples of each replica (whole, summing to the batch; e.g. in
        proportion to device speed); default equal shares.
    collectives : str
        ``"nccl"`` (default): every all-gather and reduce-scatter one
        ``collective.*`` node per replica (module docstring), costed by the
        NCCL formulas on the collective stream (simulator rule 6);
        ``"ring"``: the explicit ring steps (what ``placer run`` executes).
    represent : list of int, optional
        Build only these replicas (the symmetric judge,
        :mod:`~celeritas_cli.sim.symmetric`; the nccl form only): their
        nodes, ids and costs are those of the full graph, and their
        collectives still say ``ranks = k``.  ``meta.fsdp.represented``
        lists them.

    Raises
    ------
    InvalidInput
        :func:`check_fsdp`, a negative or huge *unit_mb*, an unknown
        *collectives* form, *represent* not replicas of the nccl form, or a
        graph over the derived-graph budget
        (:func:`~.fsdp_units.fsdp_size`, :mod:`~.size`); all before
        anything is built.
    """
    batch, samples = check_fsdp(graph, replicas, stage, assume_batch, samples)
    k = replicas
    check_unit_mb(unit_mb)
    check_form(collectives, "fsdp")
    reps = sorted({int(r) for r in represent}) if represent is not None else list(range(k))
    if represent is not None and (collectives != "nccl" or not reps or reps[0] < 0 or reps[-1] >= k):
        raise InvalidInput(f"fsdp: represent {represent!r} must list replicas 0..{k - 1} of the nccl form")
    plan = fsdp_plan(graph, stage, unit_mb)
    check_size(Size(*fsdp_size(graph, plan, k, collectives, len(reps))), f"fsdp: {k} replicas of graph '{graph.name}'",
               "use fewer replicas (-p devices=N) or larger units (-p unit_mb=)", devices=k)
    shares = None if len(set(samples)) == 1 else [b / batch for b in samples]
    prof = batch_profile(graph)
    fresh = fresh_namer(graph)
    fixed_out = [0] * graph.n
    for t, p in enumerate(graph.tensor_src):
        if prof.fixed_tensor[t]:
            fixed_out[p] += graph.tensor_bytes[t]
    built = set(reps)
    rep = [[fresh(f"{graph.ids[v]}/rep{r}") for v in range(graph.n)] if r in built else [] for r in range(k)]
    nodes: list[dict] = []
    for r in reps:
        for v in range(graph.n):
            nd = _replica_template(graph, v, prof, k, True, overhead_s, fixed_out[v],
                                   None if shares is None else shares[r])
            nd = {"id": rep[r][v], **_sharded(graph, v, nd, plan, k, overhead_s), "replica": r,
                  "origin": graph.ids[v]}
            if graph.colocation[v] is not None:
                nd["colocation"] = f"{graph.colocation[v]}/rep{r}"
            nodes.append(nd)
    edges = _replica_edges(graph, plan, k, rep, shares, prof.fixed_tensor, reps)
    if k > 1:
        _Collectives(graph, plan, k, rep, fresh, nodes, edges, reps, collectives == "nccl").build()
    meta = dict(graph.meta)
    meta["batch_size"] = batch
    meta["fsdp"] = _info(graph, plan, k, unit_mb, batch, samples)
    meta["fsdp"]["collectives"] = collectives
    if represent is not None:
        meta["fsdp"]["represented"] = reps
    name = f"{graph.name}+fsdp{k}"
    return Graph.from_dict({"schema": GRAPH_SCHEMA, "name": name, "meta": meta, "nodes": nodes, "edges": edges},
                           label=name)


def fsdp_step_check(graph: Graph, step: dict, ctx) -> tuple[str | None, str] | None:
    """What of a recorded ``fsdp`` step (fields already checked,
    :mod:`~.recipe_check`) only *graph* can say: it may be sharded, its batch
    is the recorded ``global_batch``, ``samples`` are whole shares of it;
    ``None`` or ``(field or None, problem)`` (the ``check`` of the step's
    :class:`~.recipe_check.StepKind`)."""
    k = step["replicas"]
    try:
        batch = declared_batch(graph, step.get("assume_batch"), what=f"sharded data parallelism over {k} replicas")
        if k > batch:
            return "replicas", f"{k} replicas need {k} samples at least, graph '{graph.name}' holds costs for {batch}"
        check_fsdp(graph, k, step["stage"], step.get("assume_batch"))
    except InvalidInput as exc:
        return None, str(exc).removeprefix("fsdp: ")
    if step["global_batch"] != batch:
        return "global_batch", (f"the placement was made for a batch of {step['global_batch']} samples, graph "
                                f"'{graph.name}' holds costs for {batch}")
    if "samples" in step:
        try:
            check_fsdp(graph, step["replicas"], step["stage"], step.get("assume_batch"), step["samples"])
        except InvalidInput as exc:
            return "samples", str(exc).removeprefix("fsdp: samples ")
    return None


def fsdp_step_size(graph: Graph, step: dict, reps: int | None = None) -> Size:
    """Nodes and edges a recorded ``fsdp`` step builds (:func:`~.fsdp_units.fsdp_size`;
    *reps* replicas of it, the symmetric judge's, when given)."""
    return Size(*fsdp_size(graph, fsdp_plan(graph, step["stage"], step.get("unit_mb", 0.0)), step["replicas"],
                           step.get("collectives", "nccl"), reps))


def fsdp_step_build(graph: Graph, step: dict, represent: list[int] | None = None) -> Graph:
    """The graph of a recorded ``fsdp`` step (defaults filled in; only the
    replicas *represent* when given, :func:`fsdp_graph`)."""
    return fsdp_graph(graph, step["replicas"], step["stage"], unit_mb=step.get("unit_mb", 0.0),
                      overhead_s=step["overhead_s"], assume_batch=step.get("assume_batch"),
                      samples=step.get("samples"), collectives=step.get("collectives", "nccl"), represent=represent)


def fsdp_kinds(prefix: Graph, step: dict) -> list[int]:
    """For every replica of recorded ``fsdp`` *step* applied to *prefix*, the
    first replica of its kind: the same number of samples (equal shares:
    one kind).  Replicas of one kind do the same work: in the nccl form
    every replica holds a shard of the same size (FSDP pads a flat
    parameter to a multiple of ``k``), so only the samples tell them apart
    (the symmetric judge, :mod:`~celeritas_cli.sim.symmetric`).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [], meta={"batch_size": 10})
    >>> fsdp_kinds(g, {"replicas": 4, "stage": 3}), fsdp_kinds(g, {"replicas": 2, "stage": 3, "samples": [4, 6]})
    ([0, 0, 2, 2], [0, 1])
    """
    k = step["replicas"]
    _, samples = check_fsdp(prefix, k, step["stage"], step.get("assume_batch"), step.get("samples"))
    first: dict[int, int] = {}
    return [first.setdefault(samples[r], r) for r in range(k)]


def _replica_edges(graph: Graph, plan: Plan, k: int, rep: list[list[str]], shares: list[float] | None,
                   fixed: list[bool], reps: list[int]) -> list[dict]:
    """The edges inside every replica: the model's, scaled by the replica's
    share, without the gradient edges (stages 2-3; they go to the unit's
    reduce-scatter) and, in stage 3, without the reads of gathered
    parameters (they come from the gathers)."""
    out: list[dict] = []
    shard3 = plan.stage == 3 and k > 1
    for r in reps:
        for e, ed in enumerate(edge_dicts(graph)):
            t, d = graph.edge_tensor[e], graph.edge_dst[e]
            if k > 1 and t in plan.grad_tensor and plan.stage > 1:
                continue
            param = t in plan.param_tensor
            if shard3 and param and not plan.update[d]:
                continue  # read from the unit's gather
            x = {**ed, "src": rep[r][graph.edge_src[e]], "dst": rep[r][d]}
            if shard3 and param:
                x["bytes"] = -(-ed["bytes"] // k)  # an update reads its own shard
            elif k > 1 and not fixed[t] and not param:
                x["bytes"] = -(-ed["bytes"] // k) if shares is None else math.ceil(shares[r] * ed["bytes"])
            if x["bytes"] != ed["bytes"]:
                x.pop("comm_s_by_pair", None)
            out.append(x)
    return out


class _Collectives:
    """The FSDP nodes and edges of every unit (module docstring), appended
    to *nodes* and *edges*, for the replicas *reps*: one collective node
    per replica and collective (*nccl*), or the explicit ring steps."""

    def __init__(self, graph: Graph, plan: Plan, k: int, rep: list[list[str]], fresh, nodes: list[dict],
                 edges: list[dict], reps: list[int], nccl: bool):
        self.g, self.plan, self.k, self.rep, self.fresh = graph, plan, k, rep, fresh
        self.nodes, self.edges = nodes, edges
        self.reps, self.nccl = reps, nccl
        self.declares = declares(graph)
        self.ends: dict[int, list[str]] = {}
        self.starts: dict[int, list[str]] = {}

    def extra(self, item: str) -> dict:
        out: dict[str, Any] = {"pass": _PASS[item]}
        if self.declares:
            out["resident_bytes"] = 0
        return out

    def node(self, nid: str, phase: str, q: int, u: Unit, item: str, size: int, memory: int = 0,
             resident: bool = False) -> str:
        head = {"unit": u.index, "name": u.name, "for": _PASS[item]}
        extra = self.extra(item)
        if resident and self.declares:
            extra["resident_bytes"] = memory
        return ring_node(self.nodes, self.fresh(nid), phase, q, head, size, kind="fsdp", memory=memory, extra=extra)

    def collective(self, j: int, prefix: str, kind: str, u: Unit, item: str, size: int, memory: int) -> list[str]:
        """The nccl form's collective *j* of the sequence: node ``<prefix>/rep<q>`` of every built replica."""
        group = self.fresh(prefix)
        head = {"unit": u.index, "name": u.name, "for": _PASS[item]}
        out = [""] * self.k
        for q in self.reps:
            out[q] = collective_node(self.nodes, self.fresh(f"{prefix}/rep{q}"), kind, q, group, j, self.k, size,
                                     field="fsdp", head=head, memory=memory, extra=self.extra(item))
        return out

    def build(self) -> None:
        plan = self.plan
        shards: dict[int, list[str]] = {}
        for u in plan.units:
            if plan.stage == 3 and u.gather_bytes > 0 and any(kind in ("fwd", "bwd") and i == u.index
                                                             for kind, i in plan.sequence):
                shards[u.index] = self.shard(u)
        for j, (kind, i) in enumerate(plan.sequence):
            u = plan.units[i]
            if kind in ("fwd", "bwd"):
                self.gather(j, u, kind, shards[i])
            elif kind == "rs":
                self.reduce_scatter(j, u)
            else:
                self.post(j, u)
            if j > 0:
                for q in self.reps:
                    self.edges.append({"src": self.ends[j - 1][q], "dst": self.starts[j][q], "bytes": 0,
                                       "tensor": "issue"})
            for c in plan.waits.get(j, []):
                for q in self.reps:
                    self.edges.append({"src": self.rep[q][c], "dst": self.starts[j][q], "bytes": 0,
                                       "tensor": "rate-limit"})

    def own(self, nbytes: int, q: int) -> int:
        """Replica *q*'s part of a flat buffer of *nbytes*: the ring's chunk
        ``(q + 1) mod k``, or in the nccl form ``ceil(nbytes / k)`` on every
        replica (FSDP pads a flat parameter to a multiple of ``k`` and
        cuts it into ``k`` equal shards: Zhao et al. VLDB 2023, 3.2.1)."""
        return -(-nbytes // self.k) if self.nccl else chunk_sizes(nbytes, self.k)[(q + 1) % self.k]

    def shard(self, u: Unit) -> list[str]:
        g, k, plan = self.g, self.k, self.plan
        out = [""] * k
        for q in self.reps:
            s = self.node(f"fsdp/u{u.index}/shard/rep{q}", "shard", q, u, "fwd", u.gather_bytes,
                          self.own(u.shard_bytes, q), resident=True)
            for v in u.holders:
                if plan.source[v]:
                    for t in dict.fromkeys(g.edge_tensor[e] for e in g.out_edges[v]):
                        self.edges.append({"src": self.rep[q][v], "dst": s, "bytes": -(-g.tensor_bytes[t] // k),
                                           "tensor": g.tensor_name[t]})
            out[q] = s
        return out

    def readers(self, res: str, q: int, u: Unit, kind: str) -> None:
        for c, name, nbytes in (u.fwd if kind == "fwd" else u.bwd):
            tensor = "params" if name == "*" else (name or f"params:{self.g.ids[c]}")
            self.edges.append({"src": res, "dst": self.rep[q][c], "bytes": nbytes, "tensor": tensor})

    def gather(self, j: int, u: Unit, kind: str, shard: list[str]) -> None:
        k, size = self.k, u.gather_bytes
        prefix = f"fsdp/u{u.index}/{kind}"
        if self.nccl:  # the gathered unit, an activation from the gather's start
            ends = self.collective(j, prefix, "all-gather", u, kind, size, size)
            for q in self.reps:
                self.edges.append({"src": shard[q], "dst": ends[q], "bytes": self.own(size, q), "tensor": "shard"})
                self.readers(ends[q], q, u, kind)
            self.starts[j], self.ends[j] = ends, ends
            return
        chunks = chunk_sizes(size, k)
        starts = [self.node(f"{prefix}/start/rep{q}", "start", q, u, kind, size) for q in range(k)]
        for q in range(k):
            self.edges.append({"src": shard[q], "dst": starts[q], "bytes": chunks[(q + 1) % k], "tensor": "shard"})
        head = {"unit": u.index, "name": u.name, "for": _PASS[kind]}
        ag = ring_all_gather(prefix, head, size, k, starts, 1, self.fresh, self.nodes, self.edges, kind="fsdp",
                             tensor="chunk", keep=True, extra=self.extra(kind))
        ends = []
        for q in range(k):
            res = self.node(f"{prefix}/rep{q}", "gathered", q, u, kind, size, size)
            ring_collect(res, q, starts, ag, chunks, 1, "chunk", self.edges)
            self.readers(res, q, u, kind)
            ends.append(res)
        self.starts[j], self.ends[j] = starts, ends

    def grad_inputs(self, dst: str, q: int, u: Unit) -> None:
        g = self.g
        for t in u.grads:
            self.edges.append({"src": self.rep[q][g.tensor_src[t]], "dst": dst, "bytes": g.tensor_bytes[t],
                               "tensor": g.tensor_name[t]})

    def reduce_scatter(self, j: int, u: Unit) -> None:
        k, size = self.k, u.grad_bytes
        prefix = f"fsdp/u{u.index}/grad"
        if self.nccl:  # fed by the unit's gradients; its output is the reduced shard
            c = self.own(size, 0)
            ends = self.collective(j, prefix, "reduce-scatter", u, "rs", size, c)
            for q in self.reps:
                self.grad_inputs(ends[q], q, u)
                for v in u.updates:
                    self.edges.append({"src": ends[q], "dst": self.rep[q][v], "bytes": c, "tensor": "grad"})
            self.starts[j], self.ends[j] = ends, ends
            return
        chunks = chunk_sizes(size, k)
        packs = [self.node(f"{prefix}/pack/rep{q}", "pack", q, u, "rs", size, size) for q in range(k)]
        for q in range(k):
            self.grad_inputs(packs[q], q, u)
        head = {"unit": u.index, "name": u.name, "for": "backward"}
        last = ring_reduce_scatter(prefix, head, size, k, packs, "grad", self.fresh, self.nodes, self.edges,
                                   kind="fsdp", extra=self.extra("rs"))
        ends = []
        for q in range(k):
            c = chunks[(q + 1) % k]
            res = self.node(f"{prefix}/rep{q}", "grad-shard", q, u, "rs", size, c)
            self.edges.append({"src": last[q], "dst": res, "bytes": c, "tensor": "reduced"})
            for v in u.updates:
                self.edges.append({"src": res, "dst": self.rep[q][v], "bytes": c, "tensor": "grad"})
            ends.append(res)
        self.starts[j], self.ends[j] = packs, ends

    def updated(self, dst: str, q: int, u: Unit) -> None:
        for v in u.updates:
            self.edges.append({"src": self.rep[q][v], "dst": dst, "bytes": 0, "tensor": "updated"})

    def post(self, j: int, u: Unit) -> None:
        k, size = self.k, u.gather_bytes
        prefix = f"fsdp/u{u.index}/post"
        if self.nccl:  # written into the replicated parameters: no new buffer
            ends = self.collective(j, prefix, "all-gather", u, "post", size, 0)
            for q in self.reps:
                self.updated(ends[q], q, u)
            self.starts[j], self.ends[j] = ends, ends
            return
        chunks = chunk_sizes(size, k)
        starts = [self.node(f"{prefix}/start/rep{q}", "start", q, u, "post", size) for q in range(k)]
        for q in range(k):
            self.updated(starts[q], q, u)
        head = {"unit": u.index, "name": u.name, "for": "update"}
        ag = ring_all_gather(prefix, head, size, k, starts, 1, self.fresh, self.nodes, self.edges, kind="fsdp",
                             tensor="chunk", extra=self.extra("post"))
        ends = []
        for q in range(k):
            res = self.node(f"{prefix}/rep{q}", "gathered", q, u, "post", size)
            ring_collect(res, q, starts, ag, chunks, 1, "chunk", self.edges)
            ends.append(res)
        self.starts[j], self.ends[j] = starts, ends


def _info(graph: Graph, plan: Plan, k: int, unit_mb: float, batch: int, samples: list[int]) -> dict[str, Any]:
    """``meta.fsdp`` (module docstring)."""
    sizes = [plan.units[i].gather_bytes if kind != "rs" else plan.units[i].grad_bytes for kind, i in plan.sequence]
    return {"from": graph.name, "replicas": k, "stage": plan.stage, "wrap": plan.wrap, "unit_mb": float(unit_mb),
            "units": [{"name": u.name, "gather_bytes": u.gather_bytes, "gradient_bytes": u.grad_bytes}
                      for u in plan.units],
            "global_batch": batch, "replica_batch": samples[0] if len(set(samples)) == 1 else samples,
            "gather_bytes": sum(u.gather_bytes for u in plan.units),
            "gradient_bytes": sum(u.grad_bytes for u in plan.units),
            "bytes_per_device": sum((k - 1) * x // k for x in sizes) if k > 1 else 0}
