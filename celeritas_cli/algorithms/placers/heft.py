"""HEFT: Heterogeneous Earliest Finish Time list scheduling.

Topcuoglu, Hariri & Wu, "Performance-effective and low-complexity task
scheduling for heterogeneous computing", IEEE TPDS 13(3), 2002, section 4.1.
The classic list scheduler the device-placement papers compare against
(FastT and Celeritas build on its ranks and insertion policy).

1. **Priorities** (Eq. 7-8): upward rank with *average* costs,
   ``rank_u(v) = w̄_v + max over successors s of (c̄_vs + rank_u(s))``, where
   ``w̄`` is the node's mean time over devices (:attr:`CostModel.mean_time`)
   and ``c̄`` the edge's mean transfer time over ordered pairs of distinct
   devices (:meth:`CostModel.mean_comm`).  Nodes are taken by decreasing
   rank, ties by topological index (so a predecessor always comes first).
2. **Device selection** (Eq. 3-6): for each device, the data-ready time is
   the latest input arrival (``finish(p) + comm`` for a remote producer,
   ``finish(p)`` for a local one; HEFT's contention-free model, the
   ``none`` rule of :class:`~celeritas_cli.sim.links.InputArrivals`, so a
   tensor sent to a device once serves its other consumers there), and the
   earliest start is the first idle slot of the device's timeline that
   holds the node (insertion-based policy, :class:`~celeritas_cli.scheduling.timeline.Timeline`).
   The node goes to the device with the smallest earliest *finish* time,
   ties by device index.
3. **Memory** (``memory_aware``, default on; not in the 2002 paper):
   devices without room for the node's unit get EFT = +inf; a node that
   fits nowhere goes to the device with the most free memory (best effort,
   estimate ``OOM``).  Colocation: the first member placed pins its group's
   device, later members get EFT = +inf elsewhere.

The per-device order is the timeline's start order and is emitted as the
placement's ``order`` (an insertion-filled gap keeps its place).
"""

from __future__ import annotations

import math

from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model, upward_rank
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import Param, register
from ...scheduling.memory import DeviceMemory
from ...scheduling.timeline import Timeline
from ...sim.links import InputArrivals


@register("heft", paper="Topcuoglu et al., IEEE TPDS 2002", section="4.1 (Eq. 3-8)",
          summary="Upward rank on mean costs + insertion-based earliest finish time; memory-aware by default.",
          params={"memory_aware": Param(bool, True, "devices without room get EFT=+inf"),
                  "insertion": Param(bool, True, "insertion-based slots (False: append only)")})
def heft(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, memory_aware: bool = True,
         insertion: bool = True) -> Placement:
    """Place and order *graph* with HEFT (module docstring).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    seed : int
        Unused (deterministic); recorded.
    memory_aware : bool
        Refuse devices without room (EFT = +inf).  Off: the 2002 algorithm,
        which may overfill a device (estimate ``OOM``).
    insertion : bool
        Use the insertion-based policy (Topcuoglu 2002, section 4.1).

    Returns
    -------
    Placement
        With ``order`` and ``estimate`` = HEFT's own makespan and status.

    References
    ----------
    Topcuoglu, Hariri & Wu, IEEE TPDS 13(3):260-274, 2002.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> heft(layered(30), uniform(2)).estimate["status"]
    'FEASIBLE'
    """
    costs = cost_model(graph, cluster, costs)
    n, k = graph.n, cluster.k
    ti = graph.topo_index()
    rank = upward_rank(graph, lambda v: costs.mean_time[v], costs.mean_comm)
    prio = sorted(range(n), key=lambda v: (-rank[v], ti[v]))
    mem = DeviceMemory(graph, cluster)
    if not memory_aware:
        mem.cap = [math.inf] * k
    tl = Timeline(k)
    dev_of = [-1] * n
    finish = [0.0] * n
    inputs = InputArrivals(graph, costs, "none")  # HEFT's contention-free links
    for v in prio:
        best = (math.inf, k, 0.0)
        for d in range(k):
            if not mem.allowed(v, d):
                continue
            ready = inputs.ready(v, d, finish, dev_of)[0]
            dur = costs.time[v][d]
            s = tl.earliest_start(d, ready, dur, insertion=insertion)
            if (s + dur, d) < best[:2]:
                best = (s + dur, d, s)
        eft, d, s = best
        tl.reserve(d, s, eft, v)
        dev_of[v] = d
        finish[v] = eft
        mem.place(v, d)
    makespan = max(finish) if n else 0.0
    return Placement.from_indices(graph, cluster, dev_of, order=[tl.order(d) for d in range(k)],
                                  algorithm="heft", seed=seed,
                                  estimate={"makespan_s": makespan, "status": mem.status()})
