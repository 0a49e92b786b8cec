"""FD-DPS: scheduling by the dynamic critical path and node priority
(FD-DPS sections 4.2-4.3, Definitions 8-12, Formulas 6-12, Algorithms 1-2),
optionally on a graph whose critical operators were split
(:mod:`celeritas_cli.scheduling.splitting`, section 4.1).

The paper's extracted text omits its formulas; this module follows the
definitions it builds on (Kwok and Ahmad's DCP, its reference [20]) and
writes down every reading it chose (see :func:`est_lst` and :func:`fd_dps`).
"""

from __future__ import annotations

import heapq
import math

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model, downward_rank, upward_rank
from ..model.graph import Graph
from ..model.limits import TIME_MAX
from ..model.placement import Placement
from ..registry import Param, register
from ..scheduling.derivation import attach, split_step
from ..scheduling.memory import DeviceMemory
from ..scheduling.split_cost import DEFAULT_OVERHEAD_S, splittable_dims
from ..scheduling.splitting import split_operation
from ..scheduling.timeline import Timeline
from ..sim.simulator import makespan_of
from .dpos import Links

DEFAULT_EPS = 1.0e-9


def est_lst(graph: Graph, costs: CostModel) -> tuple[list[float], list[float], float, list[bool]]:
    """EST, LST, DCPL and critical nodes of the unscheduled graph.

    Reading of FD-DPS Definitions 8-10 and Formulas 6-8 before any node is
    placed (a node's device is not known yet, so its time is the mean over
    devices, ``w(v) = CostModel.mean_time[v]``, and an edge costs its mean
    transfer time over device pairs, ``c(e) = CostModel.mean_comm(e)``):

    * Formula 6: ``EST(entry) = 0``; ``EST(v) = max over in-edges (p, v) of
      EST(p) + w(p) + c(p, v)`` (breadth-first / topological order).
    * DCPL = ``max_v EST(v) + w(v)``.
    * Formula 7: ``LST(exit) = DCPL - w(exit)`` for every sink (the paper
      says the exit's LST "is the total time of the critical path"; taken
      as a *start* time it must leave room for the exit's own execution,
      as in DCP's ALST); ``LST(v) = min over out-edges (v, s) of
      LST(s) - c(v, s) - w(v)``.
    * Formula 8: ``v`` is critical iff ``EST(v) = LST(v)`` (up to a
      relative tolerance of 1e-9 of DCPL for floating point).

    Returns
    -------
    (est, lst, dcpl, critical)

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("d", [{"id": x, "compute_s": c, "memory_bytes": 0} for x, c in
    ...                 (("a", 1), ("b", 3), ("c", 1), ("d", 1))],
    ...           [{"src": "a", "dst": "b", "bytes": 0}, {"src": "a", "dst": "c", "bytes": 0},
    ...            {"src": "b", "dst": "d", "bytes": 0}, {"src": "c", "dst": "d", "bytes": 0}])
    >>> est, lst, dcpl, crit = est_lst(g, CostModel(g, uniform(2, latency=0.0)))
    >>> dcpl, crit
    (5.0, [True, True, False, True])
    """
    n = graph.n
    w = costs.mean_time
    ce = [costs.mean_comm(e) for e in range(graph.m)]
    topo = graph.topo_order()
    est = downward_rank(graph, w.__getitem__, ce.__getitem__)  # Definition 8
    dcpl = max((est[v] + w[v] for v in range(n)), default=0.0)
    lst = [0.0] * n
    for v in reversed(topo):
        if not graph.out_edges[v]:
            lst[v] = dcpl - w[v]
            continue
        best = math.inf
        for e in graph.out_edges[v]:
            t = lst[graph.edge_dst[e]] - ce[e]
            if t < best:
                best = t
        lst[v] = best - w[v]
    tol = 1e-9 * max(dcpl, 1e-30)
    critical = [abs(lst[v] - est[v]) <= tol for v in range(n)]
    return est, lst, dcpl, critical


def node_priority(est: float, lst: float, eps: float = DEFAULT_EPS) -> float:
    """Node priority, FD-DPS Definition 12 (Formula 9): ``NP = 1 / (LST - EST
    + eps)`` with *eps* the non-zero constant that keeps it finite for a
    critical node (``LST = EST``).  A negative slack (a node already late
    for the current DCPL) counts as zero.

    >>> node_priority(3.0, 3.0, 0.5), node_priority(3.0, 5.0, 0.5)
    (2.0, 0.4)
    """
    return 1.0 / (max(lst - est, 0.0) + eps)


def fd_dps_schedule(graph: Graph, cluster: Cluster, costs: CostModel | None = None, *,
                    eps: float = DEFAULT_EPS, fallback: str = "lowest-priority", congestion: str = "channel"):
    """Schedule *graph* by FD-DPS; returns ``(device_of, order, finish,
    makespan, oom, n_critical)`` at index level.  See :func:`fd_dps`."""
    costs = cost_model(graph, cluster, costs)
    n, k = graph.n, cluster.k
    time = costs.time
    wbar = costs.mean_time
    cbar = [costs.mean_comm(e) for e in range(graph.m)]
    # static tail (bottom level) with estimated costs: LST(v) = DCPL - b(v)
    b = upward_rank(graph, lambda v: wbar[v], lambda e: cbar[e])
    topo = graph.topo_index()
    in_edges, out_edges, esrc, edst = graph.in_edges, graph.out_edges, graph.edge_src, graph.edge_dst
    links = Links(graph, cluster, costs, congestion)

    mem = DeviceMemory(graph, cluster)  # budget = device memory; best effort "most_free"

    tl = Timeline(k)
    device_of = [-1] * n
    finish = [0.0] * n
    prio_at = [0.0] * n  # NP when placed, Definition 12
    t_est = [0.0] * n
    missing = [len(graph.pred[v]) for v in range(n)]
    heap: list[tuple[float, int, int]] = []
    for v in range(n):
        if missing[v] == 0:
            heapq.heappush(heap, (-(b[v]), topo[v], v))
    max_ft = 0.0
    n_critical = 0
    while heap:
        _, _, v = heapq.heappop(heap)
        # Dynamic critical path length and v's EST / LST (section 4.2)
        dcpl = max(max_ft, t_est[v] + b[v])
        lst = dcpl - b[v]
        slack = lst - t_est[v]
        tol = 1e-9 * max(dcpl, 1e-30)
        if slack <= tol:
            n_critical += 1
        prio_at[v] = node_priority(t_est[v], lst, eps)
        # memory-feasible devices (colocation groups placed whole; none: the most free one)
        feas = mem.candidates(v, rule="most_free")
        # Find_Slot: EST on each device, zero communication from parents there (Formula 11)
        start_d = {}
        plan_d = {}
        for d in feas:
            r, plan_d[d] = links.ready(v, d, finish, device_of)
            start_d[d] = tl.earliest_start(d, r, time[v][d], True)
        fits = [d for d in feas if start_d[d] <= lst + tol]
        chosen = -1
        if fits:
            # (1) a parent's device, critical parent first
            parents = sorted(in_edges[v], key=lambda e: (-(finish[esrc[e]] + cbar[e]), topo[esrc[e]], e))
            for e in parents:
                dp = device_of[esrc[e]]
                if dp in fits:
                    chosen = dp
                    break
            if chosen == -1 and out_edges[v]:
                # (2) the favoured child: highest priority = longest estimated tail
                ec = min(out_edges[v], key=lambda e: (-(cbar[e] + b[edst[e]]), topo[edst[e]], e))
                c = edst[ec]
                chosen = min(fits, key=lambda d: (start_d[d] + time[v][d] + time[c][d], d))
            if chosen == -1:
                # (3) earliest execution
                chosen = min(fits, key=lambda d: (start_d[d], start_d[d] + time[v][d], d))
        else:
            # (4) no device lets v start by its LST
            if fallback == "lowest-priority":
                def last_priority(d: int) -> float:
                    tasks = tl.tasks[d]
                    return prio_at[tasks[-1]] if tasks else 0.0
                chosen = min(feas, key=lambda d: (last_priority(d), start_d[d] + time[v][d], d))
            else:
                chosen = min(feas, key=lambda d: (start_d[d] + time[v][d], d))
        d = chosen
        s = start_d[d]
        f = s + time[v][d]
        tl.reserve(d, s, f, v)
        links.commit(d, plan_d[d])
        device_of[v] = d
        finish[v] = f
        if f > max_ft:
            max_ft = f
        mem.place(v, d)
        # update the search space: successors whose parents are all placed become
        # schedulable, with EST from their parents' real finish (Formula 6)
        for sc in graph.succ[v]:
            missing[sc] -= 1
            if missing[sc] == 0:
                r = 0.0
                for e in in_edges[sc]:
                    t = finish[esrc[e]] + cbar[e]
                    if t > r:
                        r = t
                t_est[sc] = r
                heapq.heappush(heap, (-(r + b[sc]), topo[sc], sc))
    order = [tl.order(d) for d in range(k)]
    makespan = max(finish) if n else 0.0
    return device_of, order, finish, makespan, mem.oom(), n_critical


def _split_critical(graph: Graph, cluster: Cluster, costs: CostModel, parts: int, max_splits: int,
                    overhead_s: float) -> tuple[Graph, list[dict]]:
    """Split the splittable critical nodes (Definition 10 on the unscheduled
    graph), heaviest first, at most *max_splits*, along their first allowed
    dimension (:func:`~celeritas_cli.scheduling.split_cost.splittable_dims`)
    into *parts* parts; returns the split graph and its recipe steps."""
    _, _, _, crit = est_lst(graph, costs)
    topo = graph.topo_index()
    cands = sorted((v for v in range(graph.n) if crit[v] and splittable_dims(graph, v)),
                   key=lambda v: (-costs.mean_time[v], topo[v]))
    if max_splits > 0:
        cands = cands[:max_splits]
    g = graph
    steps = []
    for v in cands:
        steps.append(split_step(graph.ids[v], splittable_dims(graph, v)[0], parts, overhead_s))
        g = split_operation(g, graph.ids[v], steps[-1]["dim"], parts, overhead_s=overhead_s)
    return g, steps


@register("fd-dps", paper="FD-DPS (2023)", section="4.2-4.3, Definitions 8-12, Algorithms 1-2",
          summary="Dynamic critical path scheduling: critical nodes first, then NP = 1/(LST-EST+eps); "
                  "Find_Slot with parent/child device preference; optional operator splitting.",
          params={"eps": Param(float, DEFAULT_EPS, "the non-zero constant of NP = 1/(LST-EST+eps) (s)", gt=0),
                  "fallback": Param(str, "lowest-priority", "device when none lets the node start by its LST",
                                    choices=("lowest-priority", "eft")),
                  "congestion": Param(str, "channel", "link model of Find_Slot's EST: 'none' = transfer = "
                                      "latency + bytes/bandwidth, 'channel' = also queue on busy links",
                                      choices=("channel", "none")),
                  "split": Param(bool, False, "split critical splittable operators first (section 4.1)"),
                  "split_parts": Param(int, 0, "parts per split operator (0 = number of devices)", min=0, max=1024,
                                       check=lambda v: "must be 0 or >= 2" if v == 1 else None),
                  "max_splits": Param(int, 8, "split at most this many operators (0 = all critical ones)", min=0),
                  "overhead_s": Param(float, DEFAULT_OVERHEAD_S, "extra time of each sub-operation (s)", min=0,
                                      max=TIME_MAX)},
          quick_params={})
def fd_dps(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, eps: float = DEFAULT_EPS,
           fallback: str = "lowest-priority", congestion: str = "channel", split: bool = False,
           split_parts: int = 0, max_splits: int = 8, overhead_s: float = DEFAULT_OVERHEAD_S) -> Placement:
    """FD-DPS placement and execution order.

    Reading of sections 4.2-4.3 (the text omits the formulas):

    * Costs: an unplaced node costs its mean time over devices, an edge
      into an unplaced node its mean transfer time; a placed node costs its
      real time on its device and starts at its real start; an edge between
      two placed nodes costs the real transfer (0 on one device: "the
      communication cost of edge from p to v is set to 0").
    * EST (Formula 6) of a schedulable node (all parents placed - 4.3(1)):
      ``max over parents of FT(p) + c(p, v)``.  Its tail ``b(v)`` (longest
      path from ``v`` to an exit, own time included) only involves unplaced
      nodes, so it never changes; ``LST(v) = DCPL - b(v)`` (Formula 7).
    * DCPL (dynamic critical path length) = ``max(latest finish of a placed
      node, max over schedulable v of EST(v) + b(v))``.  This is a lower
      bound of the exact value, which would also need the EST of every
      non-schedulable node (a cone below each placed node: the full update
      is O(V·(V+E)), too slow on 36,000 nodes).  It does not change *which*
      node is picked: at any step ``NP(v) = 1 / (LST - EST + eps) = 1 /
      (DCPL - EST(v) - b(v) + eps)`` is decreasing in ``DCPL - EST - b`` with
      ``DCPL`` common to all nodes, so ordering by NP is ordering by
      ``EST(v) + b(v)``, and the critical nodes (``EST = LST``, Formula 8)
      are exactly the top of that order.  "Critical nodes first, otherwise by
      priority" (Algorithm 1, Sort_Node) is therefore a heap on
      ``-(EST + b)``, ties by topological index.  *eps* is Definition 12's
      non-zero constant (:func:`node_priority`); the NP values themselves
      are used by the fallback rule (4) below.
    * Find_Slot (Formula 11, Algorithm 2): on each memory-feasible device
      the node's EST is recomputed with zero communication from parents on
      that device, and the slot is the first gap between placed nodes that
      fits (:class:`~celeritas_cli.scheduling.timeline.Timeline` insertion).  With
      ``congestion="channel"`` (default) a remote input's arrival also
      waits for its link to be free (:class:`~.dpos.Links`, the simulator's
      default rule); ``"none"`` is the congestion-free reading.  A placed
      node's start is fixed ("the scheduling process cannot affect the
      execution of scheduled nodes"), so its LST is its start and Formula
      11's "time < LST(next) - EFT(prev)" is the timeline's gap test.  A
      device *satisfies* the node when that slot lets it start by its LST.
    * Device preference, 4.3(2): (1) among satisfying devices, a parent's
      device (parents by decreasing ``FT(p) + c(p, v)``, the critical parent
      first); (2) else, Formula 12: with the favoured child ``c`` (highest
      priority child = largest ``c(v, c) + b(c)``), the satisfying device
      minimising ``start(v, d) + t(v, d) + t(c, d)`` (whether ``c`` itself
      would fit there is not checked); (3) for an exit node,
      the satisfying device of earliest start; (4) when no device satisfies,
      ``fallback="lowest-priority"``: the device whose last placed node has
      the lowest priority (its NP when it was placed; an empty device
      counts as lowest, NP 0), ties by EFT; ``fallback="eft"``: minimum EFT.
    * Memory and colocation: devices without room for the node (for a
      colocation group's first node, for the whole group) are excluded; a
      group follows its first node.  No device with room: the one with most
      free memory, and the estimate says ``OOM``.
    * ``split=True`` (section 4.1): the splittable critical nodes of the
      unscheduled graph (Definition 10), heaviest first, at most
      *max_splits*, are split along their first allowed dimension into
      *split_parts* parts (0 = number of devices) by
      :func:`~celeritas_cli.scheduling.splitting.split_operation` (the
      split cost model of :mod:`celeritas_cli.scheduling.split_cost`, shared
      with OS-DPOS and data parallelism); both graphs are scheduled and the
      one with the smaller simulated makespan is kept (the split graph
      travels in ``Placement.split_graph``, its recipe in
      ``Placement.derivation``).

    Complexity: O((V + E)·k + V log V) plus the timeline's gap search.

    Parameters
    ----------
    graph, cluster : the problem.
    seed : int
        Unused (deterministic).
    eps, fallback, congestion, split, split_parts, max_splits, overhead_s :
        See above and the registry help.

    Returns
    -------
    Placement
        With ``order`` and ``estimate`` (the schedule's own makespan,
        ``critical_nodes`` = nodes picked with zero slack, status).

    References
    ----------
    FD-DPS ("Adaptive distributed parallel training method for a deep
    learning model based on dynamic critical paths of DAG", 2023),
    sections 4.1-4.3; Y.-K. Kwok and I. Ahmad, "Dynamic critical-path
    scheduling", IEEE TPDS 7(5), 1996 (the paper's reference [20]).
    """
    if not eps > 0:
        raise InvalidInput(f"fd-dps parameter eps: must be a positive constant (Definition 12), got {eps}")
    costs = cost_model(graph, cluster, costs)
    device_of, order, _, ms, oom, ncrit = fd_dps_schedule(graph, cluster, costs, eps=eps, fallback=fallback,
                                                        congestion=congestion)
    g_used = graph
    steps: list[dict] = []
    estimate = {"makespan_s": ms, "critical_nodes": ncrit, "status": "OOM" if oom else "FEASIBLE"}
    if split and cluster.k > 1:
        parts = split_parts or cluster.k
        g_split, steps = _split_critical(graph, cluster, costs, parts, max_splits, overhead_s)
        if g_split is not graph:
            c2 = costs.for_graph(g_split)
            d2, o2, _, ms2, oom2, nc2 = fd_dps_schedule(g_split, cluster, c2, eps=eps, fallback=fallback,
                                                             congestion=congestion)
            sim1 = makespan_of(graph, cluster, device_of, order, costs=costs)
            sim2 = makespan_of(g_split, cluster, d2, o2, costs=c2)
            estimate["unsplit_simulated_s"] = sim1
            estimate["split_simulated_s"] = sim2
            if sim2 < sim1:
                g_used, device_of, order = g_split, d2, o2
                estimate.update({"makespan_s": ms2, "critical_nodes": nc2, "status": "OOM" if oom2 else "FEASIBLE",
                                 "splits": [{k: r[k] for k in ("node", "dim", "n")}
                                            for r in g_split.meta.get("splits", [])]})
    p = Placement.from_indices(g_used, cluster, device_of, algorithm="fd-dps", order=order, seed=seed,
                               estimate=estimate)
    attach(p, graph, g_used, steps if g_used is not graph else [])
    return p
