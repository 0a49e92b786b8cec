"""The one pipeline builder: the placement every pipeline planner of placer
ends with (``pipeline``, ``gpipe``, ``pipedream``, ``alpa-stages``), and
the library's pipeline entry (:func:`staged_plan`), built from stages, the
devices of each stage, the micro-batch count and a
:class:`~.schedules.Schedule`.

A stage given one device is a plain pipeline stage; the recipe is then
``microbatch`` (and ``recompute``) alone.

Stage ``s`` runs on the devices ``groups[s]``; its *lanes* are the
replicas ``groups[s][r]``.  How a replicated stage shares the work:

* **Replicated pipelines** (every stage has ``R`` devices; hybrid data and
  pipeline parallelism, Narayanan et al., SC'21, 2.1 and 3; PipeDream's
  "replicated stages" when every stage is replicated alike): the recipe is
  ``microbatch`` (``m`` micro-batches of the global batch), ``recompute``
  (optional, one step per stage: a clone reads the clones of its own
  stage and the forward outputs of the stages before it, their
  checkpoints), then ``data-parallel`` with
  ``R`` replicas (every micro-batch split into ``R`` whole-sample shares,
  gradients all-reduced by one ring per gradient after the last
  accumulation).  Replica ``r`` of the pipeline runs stage ``s`` on
  ``groups[s][r]``, its ``m`` micro-batches in the schedule's order.
  With ``zero`` = 1 (Megatron-LM's distributed optimizer, ZeRO's
  ``P_os``) or 2 (``P_os+g``) the data-parallel step shards the optimizer
  state over the ``R`` replicas of each stage: a reduce-scatter of each
  accumulated gradient, each replica's update on ``1/R`` of the
  parameters, an all-gather of the updated parameters
  (:mod:`~celeritas_cli.transform.replicate`, "ZeRO").  Stage 3 is
  refused (:data:`~celeritas_cli.transform.replicate.ZERO3_REFUSED`).
* **Round-robin replicas** (stages replicated unevenly, as PipeDream's and
  Alpa's planners may choose): micro-batch ``i`` of stage ``s`` runs on
  lane ``i mod R_s`` (PipeDream's 1F1B-RR, Narayanan et al., SOSP'19, 3.3:
  a replicated stage takes the minibatches in turn).  The parameters stay
  on lane 0 and are sent once to the other lanes; the gradient of a
  parameter is accumulated in micro-batch order, the running sum passed from
  lane to lane (the micro-batch transform keeps one accumulation chain per
  parameter) - more traffic than PipeDream's all-reduce of a replicated
  stage, which :func:`staged_plan` reports in ``estimate.deviation``.

Orders: every lane runs its own micro-batches in the schedule's order
(:meth:`~.schedules.Schedule.steps` with its micro-batch count),
each step's nodes by upward rank inside the step; a device first runs its
once-per-step forward nodes (``weights`` nodes), then its steps, then its
ring all-reduce nodes, then its once-per-step backward and update nodes.
The ``microbatch`` step of the recipe records the schedule's name
(``schedule``), so what runs or exports the plan reads it from there.

Interleaved stages: ``S = p v`` stages, stage ``j`` on the devices of stage
``j mod p``, the first ``p`` stages on distinct devices
(:func:`plan_shape`, the one check of that layout); the schedule's own
shape rule (``m`` a multiple of ``p``, ...) is
:meth:`~.schedules.Schedule.refusal`.

References
----------
Narayanan et al., SC'21, 2.1-2.2 and 3 (PTD-P: pipelines replicated with
data parallelism); Narayanan et al., "PipeDream", SOSP'19, 3.2-3.3;
Huang et al., "GPipe", NeurIPS'19, 2.2-2.3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import upward_rank
from ..model.graph import Graph
from ..model.placement import Placement
from ..transform.admit import replica_kinds as kinds
from ..transform.derivation import attach, data_parallel_step
from ..transform.microbatch import microbatch_graph, microbatch_step
from ..transform.recompute import recompute_graph, recompute_step
from ..transform.replicate import check_zero, data_parallel_graph
from ..transform.split_cost import DEFAULT_OVERHEAD_S
from .cuts import _device, check_chain
from .schedules import ONE_F_ONE_B, Schedule, block_order, get_schedule, recomputable, stage_blocks

__all__ = ["Derived", "check_pipelinable", "derive_pipeline", "layout", "pipeline_orders", "placement_of",
           "plan_estimate", "plan_shape", "staged_plan"]


def plan_shape(groups: Sequence[Sequence[int]], schedule: str | Schedule) -> tuple[int, int, list[int]]:
    """``(p, v, replicas)``: pipeline depth (distinct stage device sets),
    model chunks per device, and the replicas of each stage.

    Raises
    ------
    InvalidInput
        Interleaved stages whose devices do not repeat every ``p`` stages,
        a device in two stages outside ``interleaved``, a stage without
        devices.

    >>> from celeritas_cli.pipelining.schedules import INTERLEAVED
    >>> plan_shape([[0, 1], [2, 3]], ONE_F_ONE_B), plan_shape([[0], [1], [0], [1]], INTERLEAVED)
    ((2, 1, [2, 2]), (2, 2, [1, 1, 1, 1]))
    """
    sched = get_schedule(schedule)
    if not groups or any(not g for g in groups):
        raise InvalidInput("pipeline: every stage needs at least one device")
    keys = [tuple(g) for g in groups]
    reps = [len(g) for g in groups]
    if sched.chunked:
        first = list(dict.fromkeys(keys))
        p = len(first)
        if len(keys) % p or keys[:p] != first or any(keys[j] != keys[j % p] for j in range(len(keys))):
            raise InvalidInput(f"pipeline: the {sched.title} schedule needs stage j on the devices of stage j mod p, "
                               f"the first p stages on distinct devices")
        flat = [d for k in first for d in k]
        if len(set(flat)) != len(flat):
            raise InvalidInput("pipeline: a device is in two pipeline stages")
        return p, len(keys) // p, reps
    flat = [d for k in keys for d in k]
    if len(set(flat)) != len(flat):
        raise InvalidInput(f"pipeline: the {sched.title} schedule needs distinct devices per stage (one stage per "
                           f"device); a schedule with model chunks runs several stages per device")
    return len(keys), 1, reps


def staged_plan(graph: Graph, cluster: Cluster, stage_of: Sequence[int],
                groups: Sequence[Sequence[int | str] | int | str], n_microbatches: int,
                schedule: str | Schedule = ONE_F_ONE_B, *, recompute: Sequence[str] = (), except_last: bool = False,
                overhead_s: float = DEFAULT_OVERHEAD_S, assume_batch: int | None = None,
                shares: Sequence[float] | None = None, algorithm: str = "pipeline", params: dict | None = None,
                seed: int | None = 0, estimate: dict | None = None, zero: int = 0) -> Placement:
    """The placement of a pipeline with replicated stages (module docstring).

    Parameters
    ----------
    graph : Graph
        The model's training graph, declaring its batch.
    cluster : Cluster
    stage_of : list of int
        Stage of every node (``0 .. S-1``), checked to form a chain.
    groups : list of (list of) int or str
        Devices of each stage (its lanes; a single device for a stage that
        is not replicated); with model chunks (interleaved): ``S = p v``
        stages, stage ``j`` on the devices of stage ``j mod p``.
    n_microbatches : int
        Micro-batches: of each replicated pipeline when every stage has the
        same number of devices, else of the step (shared round-robin).
    schedule : Schedule or str
        A :class:`~.schedules.Schedule` or its name
        (:data:`~.schedules.SCHEDULES`).
    recompute : list of str
        Forward node ids of *graph* whose activations are recomputed
        (:func:`~.schedules.recomputable` ones, one step per stage).
    except_last : bool
        Recompute every micro-batch but the last (torchgpipe's
        ``checkpoint="except_last"``: the last micro-batch's backward follows
        its forward at once).
    overhead_s, assume_batch
        Passed to the micro-batch and data-parallel transforms.
    shares : list of float, optional
        Replicated pipelines: the batch share of each replica (default
        equal), e.g. in proportion to the speed of its devices.
    algorithm, params, seed, estimate
        Written into the placement (*estimate* is extended).
    zero : int
        ZeRO stage (0-2) over the replicas (module docstring).

    Returns
    -------
    Placement
        Over the derived graph, with its recipe and per-device orders.

    Raises
    ------
    InvalidInput
        Stages that do not form a chain, bad groups (:func:`plan_shape`),
        a shape the schedule's rule refuses
        (:meth:`~.schedules.Schedule.refusal`), and what the transforms
        refuse (no declared batch, more micro-batches than samples,
        micro-batches that do not split into the replicas).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.pipelining.cuts import balanced_stages
    >>> g = layered(40, seed=1)
    >>> st = balanced_stages(g, uniform(4), [0, 1])
    >>> p = staged_plan(g, uniform(4), st.stage_of, [[0, 2], [1, 3]], 4, assume_batch=16)
    >>> [s["transform"] for s in p.derivation["steps"]], p.estimate["replicas"]
    (['microbatch', 'data-parallel'], [2, 2])
    >>> q = staged_plan(g, uniform(2), st.stage_of, [0, 1], 4, assume_batch=8)  # one device per stage
    >>> q.derivation["steps"][0]["micro_batches"], q.derivation["steps"][0]["schedule"], q.estimate["bubble_fraction"]
    ([2, 2, 2, 2], '1f1b', 0.25)
    """
    sched = get_schedule(schedule)
    devs = [[_device(cluster, d) for d in (g if isinstance(g, (list, tuple)) else [g])] for g in groups]
    p, v, reps = plan_shape(devs, sched)
    d = derive_pipeline(graph, stage_of, reps, n_microbatches, sched, v, recompute=recompute,
                        except_last=except_last, overhead_s=overhead_s, assume_batch=assume_batch, shares=shares,
                        symmetric=judged_by_kind(cluster), zero=zero)
    device_of, order = layout(d, stage_of, devs, sched, cluster.k)
    est = {**plan_estimate(d, devs, cluster, sched, n_microbatches), **(estimate or {})}
    return placement_of(d, cluster, device_of, order, algorithm=algorithm, seed=seed, estimate=est,
                        params={"stages": len(devs), "microbatches": n_microbatches, "schedule": sched.name,
                                **(params or {})}, devs=devs)


def judged_by_kind(cluster: Cluster) -> bool:
    """Whether replicas on *cluster* are judged one of each kind (no ``hosts``: sim/symmetric.py)."""
    return not any(h >= 0 for h in cluster.host_of)


def plan_estimate(d: "Derived", devs: Sequence[Sequence[int]], cluster: Cluster, schedule: str | Schedule,
                  n_microbatches: int) -> dict:
    """The ``estimate`` fields that describe a pipeline plan (no makespan:
    the simulator judges it)."""
    sched = get_schedule(schedule)
    p, v, reps = plan_shape(devs, sched)
    est = {"graph": "split", "graph_nodes": d.graph.n, "schedule": sched.name, "stages": len(devs),
           "pipeline_devices": p, "virtual_stages": v, "replicas": reps, "microbatches": n_microbatches,
           "micro_batches": d.micro_batches, "stage_devices": [[cluster.ids[x] for x in g] for g in devs],
           "bubble_fraction": sched.bubble(p, max(1, n_microbatches // d.lanes_per_mb), v),
           "recomputed": d.recomputed}
    if d.round_robin:
        est["deviation"] = ("unevenly replicated stages take micro-batches round-robin; a replicated stage's "
                            "gradients are accumulated lane to lane, not all-reduced")
    return est


def placement_of(d: "Derived", cluster: Cluster, device_of: Sequence[int], order: list[list[int]] | None, *,
                 algorithm: str, params: dict, seed: int | None, estimate: dict,
                 devs: Sequence[Sequence[int]] | None = None) -> Placement:
    """The :class:`~celeritas_cli.model.placement.Placement` of a laid-out
    pipeline, with its recipe from the base graph; replicated pipelines
    (stage groups *devs*) in the symmetric form: replica 0's nodes and
    orders, and the replica map (:mod:`~celeritas_cli.sim.symmetric`)."""
    out = Placement.from_indices(d.graph, cluster, device_of, algorithm=algorithm, order=order, params=params,
                                 seed=seed, estimate=estimate)
    attach(out, d.base, d.graph, d.steps)
    if "represented" in d.graph.meta.get("data_parallel", {}):
        if devs is None:
            raise ValueError("placement_of: a replicated pipeline needs its stage groups (devs)")
        rep0 = {d.graph.ids[x] for x in range(d.graph.n) if (d.graph.node_extra[x] or {}).get("replica", 0) == 0}
        out.assignment = {nid: did for nid, did in out.assignment.items() if nid in rep0}
        stages = list(dict.fromkeys(s for s in range(len(devs)) if devs[s][0] not in
                                    {devs[t][0] for t in range(s)}))  # interleaved chunks share devices
        rows = [[cluster.ids[devs[s][r]] for s in stages] for r in range(d.R)]
        if out.order is not None:
            out.order = {did: [nid for nid in seq if nid in rep0] for did, seq in out.order.items() if did in rows[0]}
        out.replicas = {"devices": rows}
        out.derived = None
    return out


@dataclass
class Derived:
    """A pipeline's derived graph (:func:`derive_pipeline`): ``graph`` (what
    is simulated), ``mbg`` (micro-batched and recomputed, before
    replication), the recipe ``steps``, the replicas ``R`` of every stage
    (1 for round-robin stages) and the micro-batches of each lane."""

    base: Graph
    graph: Graph
    mbg: Graph
    steps: list[dict]
    R: int
    reps: list[int]
    lane_mb: list[list[list[int]]]
    micro_batches: list[int]
    recomputed: int
    round_robin: bool

    @property
    def lanes_per_mb(self) -> int:
        return 1 if not self.round_robin else max(self.reps)


def check_pipelinable(graph: Graph) -> None:
    """Refuse a coarse graph: its nodes group operators, so the work done
    per sample, the gradients and the once-per-step updates are no longer
    told apart - micro-batches would repeat updates and replicas lose their
    all-reduce (``data-parallel`` refuses it for the same reason).

    Raises
    ------
    InvalidInput
        One line naming the graph and its original.
    """
    if graph.is_coarse:
        raise InvalidInput(f"pipeline: graph '{graph.name}' is coarse: its nodes group operators, so per-sample "
                           f"work, gradients and the optimizer updates cannot be told apart for micro-batches and "
                           f"replicas; pipeline the original graph '{graph.original_name}' instead")


def derive_pipeline(graph: Graph, stage_of: Sequence[int], reps: Sequence[int], n_microbatches: int,
                    schedule: str | Schedule = ONE_F_ONE_B, v: int = 1, *, recompute: Sequence[str] = (), except_last: bool = False,
                    overhead_s: float = DEFAULT_OVERHEAD_S, assume_batch: int | None = None,
                    shares: Sequence[float] | None = None, bucket_mb: float = 0.0,
                    symmetric: bool = True, recompute_segments: bool = False, zero: int = 0) -> Derived:
    """The derived graph of a pipeline with ``reps[s]`` replicas of stage
    ``s`` (module docstring; parameters as :func:`staged_plan`).  Depends
    on *stage_of* only through the recomputed nodes, so a planner that moves
    stage boundaries without recomputation reuses it (:func:`layout`).
    *bucket_mb* > 0 all-reduces the gradients in DDP buckets (one stage only:
    a bucket must not mix the gradients of two stages).  *symmetric*: build
    one replica of each kind (:mod:`~celeritas_cli.sim.symmetric`; False on
    a cluster with ``hosts``, whose replicas are judged in full).
    *recompute_segments* gates each connected part of a stage's clones on
    its own (:func:`~celeritas_cli.transform.recompute.recompute_graph`'s
    ``segments``: per transformer layer when the layers' inputs are kept).
    *zero*: 1 or 2 shards the optimizer state (and gradients) over the
    replicas (module docstring; nothing to shard without replicas).

    Raises
    ------
    InvalidInput
        As :func:`staged_plan`; a coarse graph (:func:`check_pipelinable`).
    """
    S = len(reps)
    m = n_microbatches
    sched = get_schedule(schedule)
    check_pipelinable(graph)
    zero = check_zero(zero)
    if len(stage_of) != graph.n or any(not 0 <= s < S for s in stage_of):
        raise InvalidInput(f"pipeline: stage_of must give every node of graph '{graph.name}' a stage 0..{S - 1}")
    check_chain(graph, stage_of)
    uniform_reps = len(set(reps)) == 1
    R = reps[0] if uniform_reps else 1
    if not uniform_reps and v > 1:
        raise InvalidInput(f"pipeline: the {sched.title} schedule needs every stage replicated alike")
    if shares is not None and (R < 2 or len(shares) != R):
        raise InvalidInput("pipeline: batch shares need one share per replica of every stage")
    if bucket_mb and S > 1:
        raise InvalidInput("pipeline: gradient buckets would mix the gradients of two stages; use bucket_mb=0")
    lane_mb = [[list(range(m))] * r if uniform_reps else [list(range(j, m, r)) for j in range(r)] for r in reps]
    if any(not mbs for lanes in lane_mb for mbs in lanes):
        raise InvalidInput(f"pipeline: {m} micro-batches leave a replica of a stage without work")
    p = S // v
    for lanes in lane_mb[:p]:
        for mbs in lanes:
            sched.check(p, len(mbs), v)  # refuse a bad schedule before building
    mbg = microbatch_graph(graph, m, overhead_s=overhead_s, assume_batch=assume_batch)
    mb = mbg.meta["microbatch"]
    steps = [{**microbatch_step(m, mb["global_batch"], mb["micro_batches"], overhead_s, assume_batch),
              "schedule": sched.name}]
    keep = recomputable(graph, stage_of, list(recompute or ()))
    for s in sorted({stage_of[graph.index[x]] for x in keep}):
        ids = [x for x in keep if stage_of[graph.index[x]] == s]
        if except_last and m > 1:
            ids = _copies_but_last(mbg, set(ids), m)
        if ids:
            steps.append(recompute_step(ids, recompute_segments))
            mbg = recompute_graph(mbg, ids, segments=recompute_segments)
    derived = mbg
    if R > 1:  # the replicas in the symmetric form: one of each kind built (sim/symmetric.py)
        step = data_parallel_step(R, "strong", overhead_s, list(shares) if shares is not None else None, bucket_mb,
                                  zero=zero)
        built = sorted(set(kinds(mbg, step))) if symmetric else None
        derived = data_parallel_graph(mbg, R, scaling="strong", overhead_s=overhead_s,
                                      shares=list(shares) if shares is not None else None, bucket_mb=bucket_mb,
                                      represent=built, zero=zero)
        steps.append(step)
    return Derived(graph, derived, mbg, steps, R, list(reps), lane_mb, list(mb["micro_batches"]),
                   len(mbg.meta.get("recompute", [])), not uniform_reps)


def layout(d: Derived, stage_of: Sequence[int], devs: Sequence[Sequence[int]], schedule: str | Schedule,
           k: int) -> tuple[list[int], list[list[int]] | None]:
    """``(device_of, order)`` of *d*'s graph with stages *stage_of* on the
    device groups *devs* (module docstring).  One stage whose lanes run one
    micro-batch each has no schedule to follow: no order (the simulator's
    own rule, which overlaps the all-reduce with the backward pass as for
    ``data-parallel``)."""
    sched = get_schedule(schedule)
    p, v, _ = plan_shape(devs, sched)
    check_chain(d.base, stage_of)
    blocks = stage_blocks(d.mbg, d.base, stage_of)
    where = _lanes(d.graph, d.mbg, blocks, d.R, d.reps)
    device_of = [devs[s][lane] for s, lane, _, _ in where]
    if "represented" in d.graph.meta.get("data_parallel", {}):  # every collective costed for its whole group
        groups: dict[str, list[int]] = {}
        for x, (s, _, _, _) in enumerate(where):
            c = (d.graph.node_extra[x] or {}).get("collective")
            if c is not None:
                groups.setdefault(c["group"], [devs[s][q] for q in range(d.R)])
        d.graph.meta["collective_devices"] = groups
    if len(devs) == 1 and all(len(mbs) == 1 for mbs in d.lane_mb[0]):
        return device_of, None
    return device_of, _orders(d.graph, where, [list(g) for g in devs], d.lane_mb, sched, p, v, k)


def pipeline_orders(derived: Graph, graph: Graph, stage_of: Sequence[int], stage_devices: Sequence[int], k: int,
                    schedule: str | Schedule, n_microbatches: int,
                    v: int = 1) -> tuple[list[int], list[list[int]]]:
    """``(device_of, order)`` of one pipeline that is not replicated:
    *derived* micro-batched (and recomputed) from *graph*, whose nodes have
    stages *stage_of*, stage ``j`` on device ``stage_devices[j]`` of *k*;
    the orders :func:`layout` gives (module docstring), for a graph built
    by other means than :func:`derive_pipeline`.

    Raises
    ------
    InvalidInput
        A stage without a device, a shape the schedule refuses.
    """
    sched = get_schedule(schedule)
    blocks = stage_blocks(derived, graph, stage_of)
    bad = next((x for x, (s, _, _) in enumerate(blocks) if not 0 <= s < len(stage_devices)), None)
    if bad is not None:
        raise InvalidInput(f"pipeline: node '{derived.ids[bad]}' is in stage {blocks[bad][0]}, but there are "
                           f"{len(stage_devices)} stage devices")
    devs = [[d] for d in stage_devices]
    lane_mb = [[list(range(n_microbatches))] for _ in devs]
    where = [(s, 0, kind, i) for s, kind, i in blocks]
    return ([stage_devices[s] for s, _, _ in blocks],
            _orders(derived, where, devs, lane_mb, sched, len(devs) // v, v, k))


def _copies_but_last(mbg: Graph, origins: set[str], m: int) -> list[str]:
    """Ids of the micro-batch copies of *origins* in micro-batches ``0 .. m-2``."""
    out = []
    for x in range(mbg.n):
        ex = mbg.node_extra[x] or {}
        if ex.get("origin") in origins and "recompute_of" not in ex and mbg.op[x] != "accumulate_grad" \
                and isinstance(ex.get("microbatch"), int) and ex["microbatch"] < m - 1:
            out.append(mbg.ids[x])
    return out


def _lanes(derived: Graph, mbg: Graph, blocks: list, R: int, reps: list[int]) -> list[tuple[int, int, str, int]]:
    """``(stage, lane, kind, micro-batch)`` of every node of *derived* (kind
    ``F``, ``B``, ``head``, ``tail`` or ``ring``; micro-batch -1 for once
    nodes)."""
    out = []
    if derived is mbg:
        for s, kind, i in blocks:
            out.append((s, i % reps[s] if i >= 0 else 0, kind, i))
        return out
    bucket_stage: dict = {}
    for x in range(derived.n):
        ring = (derived.node_extra[x] or {}).get("allreduce")
        if isinstance(ring, dict) and isinstance(ring.get("of"), list) and ring["of"]:
            bucket_stage[ring.get("bucket")] = blocks[mbg.index[ring["of"][0]]][0]
    for x in range(derived.n):
        ex = derived.node_extra[x] or {}
        r = int(ex.get("replica", 0))
        ring = ex.get("allreduce")
        if isinstance(ring, dict):  # a gradient's ring, or a bucket's (whose rs / ag nodes name only the bucket)
            of = ring.get("of")
            s = blocks[mbg.index[of]][0] if isinstance(of, str) else bucket_stage.get(ring.get("bucket"), 0)
            out.append((s, r, "ring", -1))
        else:
            s, kind, i = blocks[mbg.index[ex["origin"]]]
            out.append((s, r, kind, i))
    return out


def _orders(derived: Graph, where: list, devs: list[list[int]], lane_mb: list, schedule: Schedule, p: int, v: int,
            k: int) -> list[list[int]]:
    """Per-device orders (module docstring)."""
    topo = derived.topo_index()
    groups: dict[tuple, list[int]] = {}
    for x, (s, lane, kind, i) in enumerate(where):
        key = (s, lane, kind, i) if i >= 0 else (devs[s][lane], kind)
        groups.setdefault(key, []).append(x)
    up = upward_rank(derived, derived.compute.__getitem__, lambda e: 0.0)
    order: list[list[int]] = [[] for _ in range(k)]
    for rank in range(p):
        for lane, mbs in enumerate(lane_mb[rank]):
            d = devs[rank][lane]
            seq = sorted(groups.get((d, "head"), []), key=topo.__getitem__)
            for kind, chunk, j in schedule.steps(p, len(mbs), rank, v):
                block = groups.get((chunk * p + rank, lane, kind, mbs[j]), [])
                seq += block_order(derived, block, up, topo) if block else []
            seq += sorted(groups.get((d, "ring"), []), key=topo.__getitem__)
            seq += sorted(groups.get((d, "tail"), []), key=topo.__getitem__)
            order[d] = seq
    return order
