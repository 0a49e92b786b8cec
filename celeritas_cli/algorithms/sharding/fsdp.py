"""Sharded data parallelism: ZeRO stages 1-3 and PyTorch FSDP as a row.

The model is replicated on ``k`` devices as data parallelism does (each
replica on its share of the batch, in whole samples), but the training
state is sharded over the replicas (:mod:`celeritas_cli.transform.fsdp`):
stage 1 the optimizer state (ZeRO ``P_os``), stage 2 also the gradients
(``P_os+g``), stage 3 also the parameters (``P_os+g+p``, PyTorch FSDP's
``FULL_SHARD``), which are all-gathered per FSDP unit before its forward and
again before its backward, freed after use, while its gradients are
reduce-scattered.  Every collective is one ``collective.*`` node per
replica (``collectives=nccl``, the default: costed by NCCL's formulas on
the collective stream, simulator rule 6) or a ring of transfers on the
links (``collectives=ring``, what ``placer run`` executes), issued in
FSDP's order with forward and backward prefetch and the rate limiter, so
communication overlaps the neighbouring units' compute exactly as far as
the stream (or the links) and the dependencies allow.  Replica ``r`` and
its collectives go to the ``r``-th chosen device; no order is given (the
simulator's rule), as for ``data-parallel``.  With nccl collectives the
placement is written in the symmetric form
(:mod:`~celeritas_cli.sim.symmetric`): replica 0's nodes and the replica
map, judged one replica of each kind (replicas with the same samples).

The estimate is the simulator's: the makespan with channel congestion, and
the memory peaks under the judge's time rule (a graph that declares no
``resident_bytes`` falls back to the static rule, which charges every
gathered unit for the whole step), so ``status`` is ``OOM`` exactly when
``placer simulate`` would say so.  This is what most people run first for
a model that does not fit one device with its optimizer state (a 6.7B GPT
on 8 A100s: data parallelism needs about 100 GiB per GPU for the state
alone).

Activation recomputation (``recompute=full``; FSDP with activation
checkpointing, ``torch.utils.checkpoint`` around each transformer block, as
Megatron-LM's ``--recompute-granularity full --recompute-method uniform
--recompute-num-layers 1``): every transformer layer's input is kept
(:func:`~celeritas_cli.algorithms.pipelines.megatron.layer_checkpoints`)
and every other forward node that runs per sample is recomputed before
its backward (:func:`recompute_nodes`), each layer's clones gated on their
own (the recompute step's ``segments``), the recipe ``recompute`` then
``fsdp``.  Under stage 3 a recomputed forward reads its unit's parameters
from the unit's *backward* all-gather
(:mod:`~celeritas_cli.transform.fsdp_units`, "Readers"), as FSDP's
backward pre-hook gathers them before the checkpointed forward reruns: the
forward gather is freed after the forward, not kept alive for the
recomputation.  A graph without attention patterns recomputes from the
graph's inputs (no layer input is known).
"""

from __future__ import annotations

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement, finite_or_none
from ...model.estimate import Estimate
from ...model.params import COLLECTIVES, DEFAULT_OVERHEAD_S, DEFAULT_SHARES
from ...registry import ASSUME_BATCH, DEVICES, Param, overhead_param, register, shares_param
from ...sim import symmetric
from .replicas import planned, replica_loads
from ...sim.memory import peaks
from ...sim.mfu import mfu
from ...sim.simulator import lower_bound, run_schedule
from ...transform.allreduce import check_form
from ...transform.derivation import attach
from ...transform.fsdp import check_fsdp, fsdp_graph, fsdp_step
from ...transform.fsdp_units import UNIT_MB_MAX
from ...transform.microbatch import once_nodes
from ...transform.passes import node_passes
from ...transform.recompute import recompute_graph, recompute_step
from ..pipelines.megatron import layer_checkpoints

RECOMPUTE = ("none", "full")
from .data_parallel import choose_devices, replica_devices, speed_samples


@register("fsdp", paper="ZeRO (Rajbhandari et al., SC'20); PyTorch FSDP (Zhao et al., VLDB 2023)",
          section="ZeRO 5.1-5.3, 7.2 (stages, volume); FSDP 3.2-3.5 (units, prefetch, rate limiter)",
          summary="Sharded data parallelism: k replicas on shares of the batch, optimizer state (stage 1), "
                  "gradients (2) and parameters (3, FSDP) sharded; all-gathers per unit before forward and "
                  "backward, reduce-scatters of gradients (NCCL on its own stream), overlapped as FSDP's prefetch "
                  "does.",
          params={"devices": DEVICES,
                  "stage": Param(int, 3, "ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters (FSDP "
                                 "FULL_SHARD)", min=1, max=3),
                  "unit_mb": Param(float, 0.0, "FSDP units: 0 = one per module (transformer block or top-level "
                                   "child); else about this many MiB of parameters each", min=0, max=UNIT_MB_MAX),
                  "overhead_s": overhead_param("extra time of an op whose time is scaled linearly (s)"),
                  "shares": shares_param("equal batch shares, or whole samples in proportion to each device's "
                                         "speed on the graph (mixed devices; not in the papers)"),
                  "collectives": COLLECTIVES,
                  "recompute": Param(str, "none", "activation recomputation: none, or full (each transformer "
                                                  "layer's input kept, the layer recomputed before its backward)",
                                     choices=RECOMPUTE),
                  "assume_batch": ASSUME_BATCH},
          quick_params={})
def fsdp(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, devices: str = "",
         stage: int = 3, unit_mb: float = 0.0, overhead_s: float = DEFAULT_OVERHEAD_S, shares: str = DEFAULT_SHARES,
         assume_batch: int = 0, collectives: str = "nccl", recompute: str = "none") -> Placement:
    """Sharded data-parallel placement of *graph* (module docstring).

    Parameters
    ----------
    graph, cluster : the problem (a fine training graph that declares its
        batch; a coarse graph is refused: its nodes hide which state is
        parameters, gradients and optimizer state).
    seed : int
        Unused (deterministic).
    costs : CostModel, optional
        Cost model of *graph* (re-bound to the sharded graph).
    devices : str
        Replica devices (:func:`~.data_parallel.choose_devices`); default all.
    stage : int
        1, 2 or 3 (default: FSDP's full sharding).
    unit_mb : float
        0 (default): one FSDP unit per module; else units of about this many
        MiB of gathered parameters (:mod:`~celeritas_cli.transform.fsdp_units`).
    overhead_s : float
        Split cost model's linear-case overhead.
    shares : str
        ``equal`` (default: every replica on ``1/k`` of the batch, the
        first ``batch % k`` one sample more) or ``proportional`` (an
        addition: whole samples in proportion to each device's speed on the
        graph, rounded so the slowest replica is fastest,
        :func:`~.data_parallel.speed_samples`; recorded in the recipe as
        ``samples``).
    assume_batch : int
        The batch the costs hold for when the graph declares none (0: the
        graph's own; ``place --assume-batch``); recorded in the recipe.
    collectives : str
        ``nccl`` (default: one collective node per replica and collective,
        the symmetric form) or ``ring`` (explicit ring steps, every
        replica's nodes listed); recorded in the recipe when ``ring``.
    recompute : str
        ``none`` (default) or ``full`` (module docstring): the recipe
        starts with a ``recompute`` step.

    Returns
    -------
    Placement
        Over the sharded graph, with ``derivation`` ``[{"transform": "fsdp",
        ...}]``, no order (with nccl collectives over ``k > 1`` replicas:
        replica 0's nodes and ``replicas``, the symmetric form; else every
        replica's nodes), and an ``estimate``: the simulated makespan,
        ``status`` (``OOM`` when a device's peak is over its capacity),
        ``max_memory_bytes`` (the largest peak), ``memory_rule``,
        ``lower_bound_s`` of the sharded graph and ``makespan_over_lb``,
        ``mfu`` (:mod:`~celeritas_cli.sim.mfu`, None without ``flops``),
        ``replicas``, ``devices``, ``stage``, ``units``, ``global_batch``,
        ``replica_batch``, ``gather_bytes``, ``gradient_bytes`` and
        ``bytes_per_device`` (what each replica sends in one step).

    Raises
    ------
    InvalidInput
        Unknown devices, more replicas than devices, a stage not 1-3, a
        coarse or already derived graph, no declared batch or fewer samples
        than replicas (:func:`~celeritas_cli.transform.fsdp.check_fsdp`).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = fsdp(layered(40, seed=1), uniform(2), stage=3)
    >>> p.estimate["replicas"], p.estimate["stage"], p.derivation["steps"][0]["transform"]
    (2, 3, 'fsdp')
    """
    devs = choose_devices(cluster, devices)
    k = len(devs)
    assumed = assume_batch or None
    check_form(collectives, "fsdp")
    batch, equal = check_fsdp(graph, k, stage, assumed)  # refuses what cannot be sharded before anything else
    if recompute not in RECOMPUTE:
        raise InvalidInput(f"fsdp: recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    costs = cost_model(graph, cluster, costs)
    pre: list[dict] = []
    base = graph
    if recompute == "full":
        ids = recompute_nodes(graph)
        if ids:
            pre = [recompute_step(ids, True)]
            base = recompute_graph(graph, ids, segments=True)
    samples = None
    if shares == "proportional":
        samples = speed_samples(graph, costs, devs, batch, overhead_s, f"fsdp over {k} replicas: the batch",
                                sharded_updates=True)
        samples = None if samples == equal else samples
    if collectives == "nccl" and k > 1 and symmetric.asymmetry(cluster, None, []) is None:
        # (a cluster with hosts: every replica built and listed, as data-parallel does)
        return _symmetric(graph, cluster, costs, devs, stage, unit_mb, overhead_s, assumed, samples, seed, base, pre)
    g2 = fsdp_graph(base, k, stage, unit_mb=unit_mb, overhead_s=overhead_s, assume_batch=assumed, samples=samples,
                    collectives=collectives)
    c2 = costs.for_graph(g2)
    device_of = replica_devices(g2, devs)
    sched = run_schedule(g2, cluster, device_of, None, costs=c2)
    loads, rule = _loads(g2, sched, device_of, cluster.k)
    estimate = _estimate(graph, cluster, g2, sched, loads, rule, lower_bound(g2, cluster, c2), devs, stage)
    if pre:
        estimate["recomputed"] = len(pre[0]["nodes"])
    p = Placement.from_indices(g2, cluster, device_of, algorithm="fsdp", seed=seed, estimate=estimate)
    attach(p, graph, g2, pre + [fsdp_step(k, stage, g2.meta["fsdp"]["global_batch"], overhead_s, unit_mb, assumed,
                                          samples, collectives)])
    return p


def recompute_nodes(graph: Graph) -> list[str]:
    """Ids of the forward nodes ``recompute=full`` recomputes (module
    docstring): every forward node that runs per sample (not a parameter's
    cast, which runs once per step:
    :func:`~celeritas_cli.transform.microbatch.once_nodes`) but the
    transformer layers' inputs
    (:func:`~celeritas_cli.algorithms.pipelines.megatron.layer_checkpoints`),
    in graph order.

    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, p: {"id": i, "compute_s": 1, "memory_bytes": 8, "pass": p}
    >>> g = build("r", [nd("x", "forward"), nd("a", "forward"), nd("da", "backward")],
    ...           [{"src": "x", "dst": "a", "bytes": 8}, {"src": "a", "dst": "da", "bytes": 8}])
    >>> recompute_nodes(g)
    ['x', 'a']
    """
    once = once_nodes(graph)
    kept = set(layer_checkpoints(graph))
    passes = node_passes(graph)
    return [graph.ids[v] for v in range(graph.n) if passes[v] == "forward" and not once[v] and graph.ids[v] not in kept]


def _loads(g2: Graph, sched, device_of: list[int], n: int) -> tuple[list[int], str]:
    """Each device's peak under the time rule, or the static sums of a graph that declares no resident bytes."""
    loads = peaks(g2, sched, n)
    if loads is None:
        return g2.memory_by(device_of, n), "static"
    return loads, "time"


def _estimate(graph: Graph, cluster: Cluster, g2: Graph, sched, loads: list[int], rule: str, lb: float,
              devs: list[int], stage: int) -> dict:
    """The planner's estimate of a sharded plan: the simulated step, memory, units, bytes."""
    oom = [cluster.ids[d] for d in cluster.over_capacity(loads)]
    info = g2.meta["fsdp"]
    estimate = {"makespan_s": sched.makespan, "makespan_by": "simulator", "status": "OOM" if oom else "FEASIBLE",
                "lower_bound_s": lb, "makespan_over_lb": finite_or_none(sched.makespan / lb) if lb > 0 else None,
                "mfu": mfu(graph, cluster, sched.makespan), "replicas": len(devs),
                "devices": [cluster.ids[d] for d in devs], "stage": stage, "units": len(info["units"]),
                "global_batch": info["global_batch"], "replica_batch": info["replica_batch"],
                "gather_bytes": info["gather_bytes"], "gradient_bytes": info["gradient_bytes"],
                "bytes_per_device": info["bytes_per_device"], "max_memory_bytes": max(loads), "memory_rule": rule}
    if oom:
        estimate["oom_devices"] = oom
    return estimate


def _symmetric(graph: Graph, cluster: Cluster, costs: CostModel, devs: list[int], stage: int, unit_mb: float,
               overhead_s: float, assumed: int | None, samples: list[int] | None, seed: int, base: Graph,
               pre: list[dict]) -> Placement:
    """The plan in its symmetric form (:mod:`~celeritas_cli.sim.symmetric`):
    replica 0's nodes on its device and the replica map, judged one replica
    of each kind (the same samples on alike devices and links) as ``placer
    simulate`` judges it.  *base*: the graph the fsdp step shards (*graph*
    after the recipe's *pre* steps)."""
    k = len(devs)
    one = fsdp_graph(base, k, stage, unit_mb=unit_mb, overhead_s=overhead_s, assume_batch=assumed, samples=samples,
                     represent=[0])
    step = fsdp_step(k, stage, one.meta["fsdp"]["global_batch"], overhead_s, unit_mb, assumed, samples)
    p, j, sched, c2 = planned(graph, cluster, costs, "fsdp", one.ids, devs, pre + [step], seed)
    judged, rule = _loads(j.graph, sched, j.device_of, cluster.k)
    loads = replica_loads(judged, devs, j.kind_of, cluster.k)
    g2 = j.graph
    estimate = _estimate(graph, cluster, g2, sched, loads, rule, lower_bound(g2, cluster, c2), devs, stage)
    if pre:
        estimate["recomputed"] = len(pre[0]["nodes"])
    p.estimate = Estimate.from_dict(estimate)
    return p
