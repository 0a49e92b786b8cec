"""Data parallelism: FastT's "DP" baseline (FastT 6.2, Tables 1-2), the
strategy every placement should be compared against.

The model is replicated on ``k`` devices, each replica runs its share of the
batch, and the gradients are reduced by a ring all-reduce (reduce-scatter +
all-gather, explicit transfers on the links) before each replica's optimizer
update: :func:`~celeritas_cli.transform.replicate.data_parallel_graph`
builds that graph with the split cost model of
:mod:`~celeritas_cli.transform.split_cost`; replica ``r`` and its ring
nodes go to the ``r``-th chosen device.  Per-device memory = parameters +
gradients + optimizer state + the replica's share of the activations; a
device over capacity makes the placement ``OOM``, reported like any other.

Execution order: none is given, so every device follows the simulator's own
rule (the ready node of largest upward rank).  A ring step's transfer starts
as soon as its chunk is ready, but the reduce-scatter adds wait for a free
device, and backward ops outrank them: most of the all-reduce runs after the
backward pass, with only its first step overlapped.  Collective libraries
(NCCL under DDP or Horovod) reduce on a separate stream concurrently with
the backward pass, so this is a conservative estimate of data parallelism;
``benchmarks/bench_data_parallel.py`` reports the exposed part.  Gradients are all-reduced in DDP buckets
(``bucket_mb``, default 25 MiB; 0 = one ring per gradient).  (Ordering
ring nodes first by boosting their rank also boosts every ancestor, which
measured slower: 1.694 s against 1.682 s on the zoo transformer.)
"""

from __future__ import annotations

import math

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.estimate import Estimate
from ...model.placement import Placement, finite_or_none
from ...model.params import COLLECTIVES, DEFAULT_BUCKET_MB, DEFAULT_OVERHEAD_S, DEFAULT_SHARES
from ...registry import ASSUME_BATCH, DEVICES, Param, overhead_param, register, shares_param
from ...transform.admit import dp_batch
from ...transform.allreduce import BUCKET_MB_MAX
from ...transform.batch import balance_samples, whole_samples
from ...transform.derivation import attach, data_parallel_step
from ...transform.replicate import SCALINGS, data_parallel_graph
from ...transform.split_cost import batch_profile, part_times
from ...sim import symmetric
from .replicas import planned, replica_loads
from ...sim.simulator import lower_bound, run_schedule



def choose_devices(cluster: Cluster, devices: str | int | None) -> list[int]:
    """Device indices for the replicas: all (``""``/``None``/``0``), the
    first ``N`` of the cluster (an integer), or a comma-separated list of ids.

    >>> from celeritas_cli.model.cluster import uniform
    >>> c = uniform(4)
    >>> choose_devices(c, ""), choose_devices(c, "2"), choose_devices(c, "gpu3,gpu1")
    ([0, 1, 2, 3], [0, 1], [3, 1])
    """
    text = "" if devices is None else str(devices).strip()
    if text in ("", "0", "all"):
        return list(range(cluster.k))
    if text.isdigit():
        count = int(text)
        if count > cluster.k:
            raise InvalidInput(f"data-parallel parameter devices: {count} replicas but cluster '{cluster.name}' has "
                               f"{cluster.k} devices")
        return list(range(count))
    out = []
    for did in (x.strip() for x in text.split(",")):
        if did not in cluster.index:
            raise InvalidInput(f"data-parallel parameter devices: unknown device '{did}' (cluster '{cluster.name}' "
                               f"has {', '.join(cluster.ids)})")
        if cluster.index[did] in out:
            raise InvalidInput(f"data-parallel parameter devices: device '{did}' listed twice")
        out.append(cluster.index[did])
    return out


def proportional_shares(graph: Graph, costs: CostModel, devs: list[int]) -> list[float] | None:
    """Batch shares of replicas on *devs* in proportion to each device's
    throughput on *graph*: ``share_r ∝ 1 / T(devs[r])``, where ``T(d)`` is
    the time of the graph's batch-dependent nodes on device ``d`` (the
    linear part of a replica's time, :mod:`~celeritas_cli.transform.split_cost`),
    so every replica's batch-dependent work takes the same time.  None
    (equal shares) when every device has the same ``T``.

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> g = build("ab", [{"id": "a", "compute_s": 4, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 4, "memory_bytes": 0}], [])
    >>> c = uniform(2, speeds=[1.0, 3.0])
    >>> proportional_shares(g, cost_model(g, c), [0, 1]), proportional_shares(g, cost_model(g, c), [1, 1])
    ([0.25, 0.75], None)
    """
    fixed = batch_profile(graph).fixed_node
    totals = [math.fsum(costs.time[v][d] for v in range(graph.n) if not fixed[v]) for d in devs]
    if len(set(totals)) <= 1 or not all(t > 0 for t in totals):
        return None
    inv = [1.0 / t for t in totals]
    total = math.fsum(inv)
    return [x / total for x in inv]


def speed_samples(graph: Graph, costs: CostModel, devs: list[int], batch: int, overhead_s: float,
                  what: str = "the batch", sharded_updates: bool = False) -> list[int] | None:
    """Whole samples of replicas on *devs* for ``shares="proportional"``
    (placer's rule, not a paper's), or None (equal shares) on devices of
    one speed: the largest-remainder rounding of :func:`proportional_shares`,
    balanced (:func:`~celeritas_cli.transform.batch.balance_samples`) until
    the slowest replica is as fast as any whole-sample rounding allows,
    where a replica's time is its compute under the split cost model: every
    batch-dependent node on its fraction ``b / batch``
    (:func:`~celeritas_cli.transform.split_cost.part_times`: launches,
    parameter reads and ``overhead_s`` do not shrink with it) and the
    batch-independent nodes whole (an update on its ``1/k`` of the
    parameters with *sharded_updates*, as ZeRO runs it: ``t/k +
    overhead_s``), on the replica's device.  Proportional shares alone
    charge a slow device the same fixed work per step as a fast one, so
    their rounding can overload it (the zoo's nmt on moirai-intra-server:
    152/152/104/104 samples, where 153/153/103/103 finishes 0.5 % sooner;
    issue 33, J3).

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> g = build("ab", [{"id": "a", "compute_s": 8, "memory_bytes": 0},
    ...                  {"id": "u", "op": "optim.sgd", "compute_s": 4, "memory_bytes": 0}], [])
    >>> c = uniform(2, speeds=[1.0, 0.5])
    >>> speed_samples(g, cost_model(g, c), [0, 1], 8, 0.0)  # proportional [5, 3]: 9 s, 14 s; [7, 1]: 11 s, 10 s
    [7, 1]
    >>> speed_samples(g, cost_model(g, c), [0, 1], 8, 0.0, sharded_updates=True)  # updates 2 s, 4 s: [6, 2] 8 s
    [6, 2]
    """
    weights = proportional_shares(graph, costs, devs)
    if weights is None:
        return None
    start = whole_samples(batch, len(devs), weights, what=what)
    prof = batch_profile(graph)
    types = frozenset(costs.cluster.devices[d].type for d in devs)
    scaled = [v for v in range(graph.n) if not prof.fixed_node[v]]
    k = len(devs) if sharded_updates else 1
    whole = _ratios(graph, [v for v in range(graph.n) if prof.fixed_node[v]], types,
                    lambda v, t: min(t, t / k + overhead_s) if prof.update[v] and t > 0 else t, 1.0, 0.0)
    ratios: dict[int, list[tuple[int, dict[str, float]]]] = {}  # samples -> (node, part time / time by type)

    def time_of(i: int, b: int) -> float:
        if b not in ratios:
            ratios[b] = _ratios(graph, scaled, types, lambda v, t: t, b / batch, overhead_s)
        d = devs[i]
        kind = costs.cluster.devices[d].type
        return math.fsum(costs.time[v][d] * row.get(kind, row[""]) for v, row in (*whole, *ratios[b]))

    # no sample moves onto a device its share's static memory would overflow (the parameters and state
    # whole, the batch-dependent memory in proportion): balancing time must not trade a fit for speed
    fixed_mem = math.fsum(graph.memory[v] if prof.fixed_node[v] else prof.fixed_memory[v] for v in range(graph.n))
    per_sample = max(0.0, graph.total_memory() - fixed_mem) / batch

    def fits(i: int, b: int) -> bool:
        return fixed_mem + per_sample * b <= costs.cluster.devices[devs[i]].memory

    return balance_samples(start, time_of, fits)


def _ratios(graph: Graph, nodes: list[int], types: frozenset[str], rule, frac: float,
            overhead_s: float) -> list[tuple[int, dict[str, float]]]:
    """Per node of *nodes*: its time on the fraction *frac* of the batch
    (:func:`~celeritas_cli.transform.split_cost.part_times`), through
    ``rule(v, time)``, over its whole time, by device type among *types*
    (``""``: ``compute_s``, for a type without ``compute_by_type``)."""
    out = []
    for v in nodes:
        if frac < 1.0:
            c, by = part_times(graph, v, frac, overhead_s=overhead_s, types=types)
        else:
            c, by = graph.compute[v], {t: x for t, x in (graph.compute_by_type[v] or {}).items() if t in types}
        row = {"": rule(v, c) / graph.compute[v] if graph.compute[v] > 0 else 1.0}
        for t, x in (by or {}).items():
            full = graph.compute_by_type[v][t]
            row[t] = rule(v, x) / full if full > 0 else 1.0
        out.append((v, row))
    return out


def replica_devices(graph: Graph, devs: list[int]) -> list[int]:
    """``device_of`` of a data-parallel graph: replica ``r`` on ``devs[r]``."""
    return [devs[int((graph.node_extra[v] or {})["replica"])] for v in range(graph.n)]


@register("data-parallel", paper="FastT (Yi et al., CoNEXT 2020)", section="6.2 (DP baseline, Tables 1-2), 5.2",
          summary="Data parallelism: the model replicated on k devices, each on 1/k of the batch, gradients "
                  "all-reduced (NCCL's ring / hierarchical ring on its own stream) before each optimizer update.",
          params={"devices": DEVICES,
                  "scaling": Param(str, "strong", "strong: the graph's batch is the global batch (each replica "
                                   "runs 1/k); weak: each replica runs the graph's batch", choices=SCALINGS),
                  "overhead_s": overhead_param("extra time of a replica op whose time is scaled linearly (s)"),
                  "shares": shares_param("strong scaling: equal batch shares (FastT's DP), or proportional to each "
                                         "device's speed on the graph (not in the paper)"),
                  "bucket_mb": Param(float, DEFAULT_BUCKET_MB, "gradients all-reduced in buckets of this many MiB "
                                     "in the order they become ready (PyTorch DDP's bucket_cap_mb, not in "
                                     "FastT); 0 = one all-reduce per gradient", min=0, max=BUCKET_MB_MAX),
                  "collectives": COLLECTIVES,
                  "assume_batch": ASSUME_BATCH},
          quick_params={})
def data_parallel(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                  devices: str = "", scaling: str = "strong", overhead_s: float = DEFAULT_OVERHEAD_S,
                  shares: str = DEFAULT_SHARES, bucket_mb: float = DEFAULT_BUCKET_MB,
                  assume_batch: int = 0, collectives: str = "nccl") -> Placement:
    """Data-parallel placement of *graph* (FastT's DP baseline).

    Parameters
    ----------
    graph, cluster : the problem (a coarse graph is replicated coarse node by
        coarse node).
    seed : int
        Unused (deterministic).
    costs : CostModel, optional
        Cost model of *graph* (re-bound to the data-parallel graph).
    devices : str
        Replica devices (:func:`choose_devices`); default all.
    scaling : str
        ``strong`` (default: the graph's batch is the global batch, every
        replica runs ``1/k`` of it) or ``weak`` (every replica runs the
        graph's batch: the step processes ``k`` times as many samples, so
        compare samples per second, not step times, with other placements).
    overhead_s : float
        Split cost model's linear-case overhead (:func:`~.split_cost.part_times`).
    shares : str
        ``equal`` (default, FastT's DP baseline: every replica on ``1/k``)
        or ``proportional`` (an addition, not in the paper: on a
        heterogeneous cluster, replica ``r`` runs the batch fraction
        :func:`proportional_shares` gives its device, in whole samples
        rounded so that the slowest replica is fastest
        (:func:`speed_samples`, placer's rule), so a faster device gets
        more samples - as uneven-batch DDP setups do; identical to
        ``equal`` on identical devices).  Strong scaling only.  The shares
        are recorded in the recipe, so ``simulate`` rebuilds the same graph.
    bucket_mb : float
        An addition, not in FastT (PyTorch DDP, Li et al. VLDB 2020, 3.2.2
        "Gradient Bucketing"): ``> 0`` groups the gradients into buckets of
        ``bucket_mb`` MiB in the order they become ready
        (:func:`~celeritas_cli.transform.allreduce.gradient_buckets`) and reduces each bucket by
        one ring all-reduce of its total bytes once all its gradients are
        ready; ``0`` reduces every gradient by its own ring.  Recorded in
        the recipe.  Default 25 MiB, DDP's default ``bucket_cap_mb``.
    assume_batch : int
        The batch the graph's costs hold for when it declares none
        (``meta.batch_size``; 0 = the graph's own).  Strong scaling over
        ``k > 1`` replicas divides the batch, which is possible only where
        the batch is known and has at least ``k`` samples; the replicas get
        whole samples (a batch that ``k`` does not divide gives the first
        ``batch % k`` replicas one sample more, recorded as ``shares``).
        Recorded in the recipe (``assume_batch``), with the batch divided
        (``global_batch``).
        Measured (``benchmarks/bench_data_parallel.py --only buckets``,
        simulated step against ``bucket_mb=0``) on the five zoo models:
        4xV100-pcie 0.97-1.06, 8xA100-nvswitch 0.91-1.00,
        2x8xA100-infiniband 0.50-0.99 (fewer link latencies), with 3-10x
        fewer nodes on models of many small gradients (inception_v3,
        resnet50, tensor_holography; 1.7-2.8x on transformer, nmt's few
        large gradients barely change) and as much less time to place; a
        bucket loses where it waits for late gradients on slow links
        (transformer on 4xV100-pcie: 1.06; layered_60 on
        moirai-inter-server: 1.18, where 1 MiB gives 1.04).  1 MiB lost at
        most 4% in these runs but won less across servers (0.50-0.99).

    Returns
    -------
    Placement
        Over the data-parallel graph (``derivation`` ``[{"transform":
        "data-parallel", ...}]``), without an order; with nccl collectives
        (the default) in the symmetric form (replica 0's nodes and the
        replica map, ``replicas``: :mod:`~celeritas_cli.sim.symmetric`),
        with ring collectives every replica's nodes (``derived``); and
        an ``estimate`` holding the simulated makespan (channel congestion),
        ``status`` (``OOM`` when a device is over capacity), the simulator's
        ``lower_bound_s`` of the data-parallel graph (not of *graph*: a
        replica runs a fraction of every node, so the original critical path
        does not bound it) and ``makespan_over_lb``, ``replicas``,
        ``devices``, ``scaling``, ``gradient_bytes``,
        ``allreduce_bytes_per_device`` and ``max_memory_bytes``.

    Raises
    ------
    InvalidInput
        Unknown devices or more replicas than devices; strong scaling of a
        graph that declares no batch (and none assumed), of a batch smaller
        than the replicas, or of a coarse graph (its gradients cannot be
        told apart: replicate the original graph); a data-parallel graph
        over the derived-graph budget.  Said before anything is built.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = data_parallel(layered(40, seed=1), uniform(2), assume_batch=32)
    >>> p.estimate["replicas"], p.replicas["devices"], p.derivation["steps"][0]["global_batch"]
    (2, [['gpu0'], ['gpu1']], 32)

    References
    ----------
    FastT (Yi et al., CoNEXT 2020) 6.2 (DP baseline, strong and weak
    scaling) and 5.2 (the data-parallel graph); Li et al., "PyTorch
    Distributed", VLDB 2020.
    """
    devs = choose_devices(cluster, devices)
    k = len(devs)
    assumed = assume_batch or None
    if shares == "proportional" and scaling != "strong":
        raise InvalidInput("data-parallel parameter shares: proportional needs scaling=strong")
    batch, _ = dp_batch(graph, k, scaling, None, assumed)  # refuses a graph without a batch before anything else
    costs = cost_model(graph, cluster, costs)
    split = proportional_shares(graph, costs, devs) if shares == "proportional" else None
    if batch is not None and scaling == "strong" and k > 1:
        what = f"data-parallel over {k} replicas: the batch"
        samples = (speed_samples(graph, costs, devs, batch, overhead_s, what) if split is not None else None) \
            or whole_samples(batch, k, what=what)
        split = None if len(set(samples)) == 1 else [b / batch for b in samples]
    strong_split = batch is not None and scaling == "strong" and k > 1
    step = data_parallel_step(k, scaling, overhead_s, split, bucket_mb, global_batch=batch if strong_split else None,
                              assume_batch=assumed, collectives=collectives)
    if collectives == "nccl" and k > 1 and symmetric.asymmetry(cluster, None, []) is None:
        return _symmetric(graph, cluster, costs, devs, step, seed)  # (a cluster with hosts: every replica built)
    g2 = data_parallel_graph(graph, k, scaling=scaling, overhead_s=overhead_s, shares=split,
                             bucket_mb=bucket_mb, assume_batch=assumed, collectives=collectives)
    c2 = costs.for_graph(g2)
    device_of = replica_devices(g2, devs)
    sched = run_schedule(g2, cluster, device_of, None, costs=c2)
    loads = g2.memory_by(device_of, cluster.k)
    lb = lower_bound(g2, cluster, c2)  # of the data-parallel graph: the original's critical path does not bound it
    estimate = _estimate(graph, cluster, g2, sched, loads, lb, devs, step)
    p = Placement.from_indices(g2, cluster, device_of, algorithm="data-parallel", seed=seed, estimate=estimate)
    attach(p, graph, g2, [step])
    return p


def _estimate(graph: Graph, cluster: Cluster, g2: Graph, sched, loads: list[int], lb: float, devs: list[int],
              step: dict) -> dict:
    """The planner's estimate of a data-parallel plan: the simulated step, memory, bytes."""
    oom = [cluster.ids[d] for d in cluster.over_capacity(loads)]
    info = g2.meta["data_parallel"]
    estimate = {"makespan_s": sched.makespan, "makespan_by": "simulator", "status": "OOM" if oom else "FEASIBLE",
                "lower_bound_s": lb, "makespan_over_lb": finite_or_none(sched.makespan / lb) if lb > 0 else None,
                "replicas": len(devs), "devices": [cluster.ids[d] for d in devs], "scaling": step["scaling"],
                "gradient_bytes": info["gradient_bytes"],
                "allreduce_bytes_per_device": info["allreduce_bytes_per_device"], "max_memory_bytes": max(loads)}
    if step.get("shares") is not None:
        estimate["shares"] = step["shares"]
    if "buckets" in info:
        estimate["bucket_mb"], estimate["buckets"] = info["bucket_mb"], info["buckets"]
    if "global_batch" in info:
        estimate["global_batch"] = info["global_batch"]
        estimate["replica_batch"] = info["replica_batch"]
    if oom:
        estimate["oom_devices"] = oom
    return estimate


def _symmetric(graph: Graph, cluster: Cluster, costs: CostModel, devs: list[int], step: dict, seed: int) -> Placement:
    """The plan in its symmetric form (:mod:`~celeritas_cli.sim.symmetric`):
    replica 0's nodes on its device, the replica map, judged one replica of
    each kind (the full graph of ``k`` replicas is never built)."""
    k = len(devs)
    one = data_parallel_graph(graph, k, scaling=step["scaling"], overhead_s=step["overhead_s"],
                              shares=step.get("shares"), bucket_mb=step.get("bucket_mb", 0.0),
                              assume_batch=step.get("assume_batch"), represent=[0])
    p, j, sched, c2 = planned(graph, cluster, costs, "data-parallel", one.ids, devs, [step], seed)
    loads = replica_loads(j.graph.memory_by(j.device_of, cluster.k), devs, j.kind_of, cluster.k)
    lb = lower_bound(j.graph, cluster, c2)
    p.estimate = Estimate.from_dict(_estimate(graph, cluster, j.graph, sched, loads, lb, devs, step))
    return p
