"""FD-DPS: scheduling by the dynamic critical path and node priority
(FD-DPS sections 4.2-4.3, Definitions 8-12, Formulas 6-12, Algorithms 1-2),
optionally on a graph whose critical operators were split
(:mod:`celeritas_cli.transform.splitting`, section 4.1).

The paper's extracted text omits its formulas; this module follows the
definitions it builds on (Kwok and Ahmad's DCP, its reference [20]) and
writes down every reading it chose (below and in :func:`est_lst`).
The steps: :func:`fd_dps_schedule` (Algorithms 1-2, one node at a time:
Sort_Node, Find_Slot, device preference, EST update) and, with
``split=True``, :func:`_split_critical` (section 4.1) and the comparison
of both schedules in :func:`_keep_split_if_faster`.

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
  ``congestion="channel"`` (default) or ``"port"`` a remote input's
  arrival also waits for its links to be free
  (:class:`~celeritas_cli.sim.links.InputArrivals`, the simulator's
  rules); ``"none"`` is the congestion-free reading.  A placed
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
  :func:`~celeritas_cli.transform.splitting.split_operation` (the
  split cost model of :mod:`celeritas_cli.transform.split_cost`, shared
  with OS-DPOS and data parallelism); both graphs are scheduled and the
  one with the smaller simulated makespan (under *congestion*, the rule
  the schedules were planned for) is kept (the split graph in
  ``Placement.derived``, its recipe in ``Placement.derivation``).  A node's
  first allowed dimension is the first whose split into *split_parts*
  parts can be built: a batch split only where the graph declares its batch
  (``meta.batch_size`` or ``assume_batch``) and *split_parts* divides the
  samples (:func:`~celeritas_cli.transform.admit.split_refusal`); a node
  with none is not split.  *split_parts* may not exceed the devices.
"""

from __future__ import annotations

import heapq
import math

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model, downward_rank, upward_rank
from ...model.graph import Graph
from ...model.limits import COUNT_MAX
from ...model.placement import Placement
from ...registry import ASSUME_BATCH, Param, congestion_param, overhead_param, register
from ...transform.admit import split_refusal
from ...transform.derivation import attach, split_step
from ...transform.recipe_check import MAX_STEPS
from ...scheduling.memory import DeviceMemory
from ...transform.split_cost import DEFAULT_OVERHEAD_S, splittable_dims
from ...transform.splitting import split_operation
from ...scheduling.timeline import Timeline
from ...sim.links import InputArrivals
from ...sim.simulator import makespan_of

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
                    eps: float = DEFAULT_EPS, fallback: str = "lowest-priority",
                    congestion: str = DEFAULT_CONGESTION):
    """Schedule *graph* by FD-DPS; returns ``(device_of, order, finish,
    makespan, oom, n_critical)`` at index level (the module docstring has
    the readings).

    Each step: Sort_Node (Algorithm 1) takes the schedulable node of
    largest ``EST + b`` (:meth:`_FdDps.priority`: DCPL, LST, NP), Find_Slot
    (Algorithm 2, Formula 11) its start on every memory-feasible device
    (:meth:`_FdDps.find_slot`), the device preference of 4.3(2) picks one
    (:meth:`_FdDps.choose_device`), and placing it updates the EST of its
    successors that become schedulable (Formula 6, :meth:`_FdDps.place`).
    """
    st = _FdDps(graph, cluster, cost_model(graph, cluster, costs), eps, fallback, congestion)
    while st.heap:
        _, _, v = heapq.heappop(st.heap)
        lst, tol = st.priority(v)
        start_d, plan_d = st.find_slot(v)
        d = st.choose_device(v, lst, tol, start_d)
        st.place(v, d, start_d[d], plan_d[d])
    order = [st.tl.order(d) for d in range(cluster.k)]
    makespan = max(st.finish) if graph.n else 0.0
    return st.device_of, order, st.finish, makespan, st.mem.oom(), st.n_critical


class _FdDps:
    """The state of the FD-DPS schedule: the static tail ``b(v)`` (bottom
    level with mean costs, so ``LST(v) = DCPL - b(v)``), the schedulable
    nodes in a heap on ``-(EST + b)``, the devices' timelines, links and
    memory, and per placed node its finish and NP (Definition 12)."""

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, eps: float, fallback: str,
                 congestion: str):
        n = graph.n
        self.graph, self.eps, self.fallback, self.time = graph, eps, fallback, costs.time
        wbar = costs.mean_time
        self.cbar = [costs.mean_comm(e) for e in range(graph.m)]
        self.b = upward_rank(graph, lambda v: wbar[v], lambda e: self.cbar[e])
        self.topo = graph.topo_index()
        self.links = InputArrivals(graph, costs, congestion)
        self.mem = DeviceMemory(graph, cluster)  # budget = device memory; best effort "most_free"
        self.tl = Timeline(cluster.k)
        self.device_of = [-1] * n
        self.finish = [0.0] * n
        self.prio_at = [0.0] * n  # NP when placed, Definition 12
        self.t_est = [0.0] * n
        self.missing = [len(graph.pred[v]) for v in range(n)]
        self.heap: list[tuple[float, int, int]] = []
        for v in range(n):
            if self.missing[v] == 0:
                heapq.heappush(self.heap, (-(self.b[v]), self.topo[v], v))
        self.max_ft = 0.0
        self.n_critical = 0

    def priority(self, v: int) -> tuple[float, float]:
        """Section 4.2 for the node just picked: the dynamic critical path
        length, v's LST (Formula 7), whether it is critical (Formula 8,
        counted) and its NP (Formula 9, kept for the fallback rule);
        returns ``(LST, tolerance)``."""
        dcpl = max(self.max_ft, self.t_est[v] + self.b[v])
        lst = dcpl - self.b[v]
        tol = 1e-9 * max(dcpl, 1e-30)
        if lst - self.t_est[v] <= tol:
            self.n_critical += 1
        self.prio_at[v] = node_priority(self.t_est[v], lst, self.eps)
        return lst, tol

    def find_slot(self, v: int) -> tuple[dict[int, float], dict[int, list]]:
        """Find_Slot (Algorithm 2, Formula 11): v's start on each
        memory-feasible device (colocation groups placed whole; none: the
        most free one), zero communication from parents there, in the first
        idle gap that fits; and the transfers that start needs."""
        start_d: dict[int, float] = {}
        plan_d: dict[int, list] = {}
        for d in self.mem.candidates(v, rule="most_free"):
            r, plan_d[d] = self.links.ready(v, d, self.finish, self.device_of)
            start_d[d] = self.tl.earliest_start(d, r, self.time[v][d], True)
        return start_d, plan_d

    def choose_device(self, v: int, lst: float, tol: float, start_d: dict[int, float]) -> int:
        """Section 4.3(2): among the devices that let *v* start by its LST,
        (1) a parent's device, critical parent first; (2) Formula 12 with
        the favoured child; (3) the earliest start; (4) none: the fallback
        rule."""
        g, time, topo, finish, cbar = self.graph, self.time, self.topo, self.finish, self.cbar
        fits = [d for d in start_d if start_d[d] <= lst + tol]
        if not fits:
            return self._fallback_device(v, start_d)
        esrc = g.edge_src
        for e in sorted(g.in_edges[v], key=lambda e: (-(finish[esrc[e]] + cbar[e]), topo[esrc[e]], e)):
            if self.device_of[esrc[e]] in fits:  # (1)
                return self.device_of[esrc[e]]
        if g.out_edges[v]:  # (2) the favoured child: highest priority = longest estimated tail
            edst = g.edge_dst
            c = edst[min(g.out_edges[v], key=lambda e: (-(cbar[e] + self.b[edst[e]]), topo[edst[e]], e))]
            return min(fits, key=lambda d: (start_d[d] + time[v][d] + time[c][d], d))
        return min(fits, key=lambda d: (start_d[d], start_d[d] + time[v][d], d))  # (3)

    def _fallback_device(self, v: int, start_d: dict[int, float]) -> int:
        """4.3(2) rule (4), no device lets *v* start by its LST:
        ``lowest-priority`` = the device whose last node has the lowest NP
        (an empty device counts as NP 0), ties by EFT; ``eft`` = min EFT."""
        time, tasks = self.time, self.tl.tasks
        if self.fallback == "lowest-priority":
            def last_priority(d: int) -> float:
                return self.prio_at[tasks[d][-1]] if tasks[d] else 0.0
            return min(start_d, key=lambda d: (last_priority(d), start_d[d] + time[v][d], d))
        return min(start_d, key=lambda d: (start_d[d] + time[v][d], d))

    def place(self, v: int, d: int, s: float, plan: list) -> None:
        """Fix *v* on *d* at *s* (its slot, transfers and memory), then make
        the successors whose parents are all placed schedulable, with EST
        from their parents' real finish (Formula 6)."""
        f = s + self.time[v][d]
        self.tl.reserve(d, s, f, v)
        self.links.commit(d, plan)
        self.device_of[v] = d
        self.finish[v] = f
        if f > self.max_ft:
            self.max_ft = f
        self.mem.place(v, d)
        g, finish, cbar, esrc = self.graph, self.finish, self.cbar, self.graph.edge_src
        for sc in g.succ[v]:
            self.missing[sc] -= 1
            if self.missing[sc] == 0:
                r = 0.0
                for e in g.in_edges[sc]:
                    t = finish[esrc[e]] + cbar[e]
                    if t > r:
                        r = t
                self.t_est[sc] = r
                heapq.heappush(self.heap, (-(r + self.b[sc]), self.topo[sc], sc))


def _split_critical(graph: Graph, cluster: Cluster, costs: CostModel, parts: int, max_splits: int,
                    overhead_s: float, assume_batch: int | None = None) -> tuple[Graph, list[dict]]:
    """Split the splittable critical nodes (Definition 10 on the unscheduled
    graph), heaviest first, at most *max_splits*, along their first allowed
    dimension (:func:`~celeritas_cli.transform.split_cost.splittable_dims`)
    whose split into *parts* parts can be built (a batch split needs equal
    parts of whole samples, :func:`~celeritas_cli.transform.admit.split_refusal`);
    returns the split graph and its recipe steps."""
    _, _, _, crit = est_lst(graph, costs)
    topo = graph.topo_index()
    dim_of = {v: next((d for d in splittable_dims(graph, v) if split_refusal(graph, v, d, parts, assume_batch) is None),
                      None) for v in range(graph.n) if crit[v]}
    cands = sorted((v for v, d in dim_of.items() if d is not None), key=lambda v: (-costs.mean_time[v], topo[v]))
    if max_splits > 0:
        cands = cands[:max_splits]
    cands = cands[:MAX_STEPS]  # a recipe has at most MAX_STEPS steps
    g = graph
    steps = []
    assumed = assume_batch if "batch_size" not in graph.meta else None
    for v in cands:
        steps.append(split_step(graph.ids[v], dim_of[v], parts, overhead_s, assumed))
        g = split_operation(g, graph.ids[v], steps[-1]["dim"], parts, overhead_s=overhead_s, assume_batch=assume_batch)
    return g, steps


@register("fd-dps", paper="FD-DPS (2023)", section="4.2-4.3, Definitions 8-12, Algorithms 1-2",
          summary="Dynamic critical path scheduling: critical nodes first, then NP = 1/(LST-EST+eps); "
                  "Find_Slot with parent/child device preference; optional operator splitting.",
          params={"eps": Param(float, DEFAULT_EPS, "the non-zero constant of NP = 1/(LST-EST+eps) (s)", gt=0),
                  "fallback": Param(str, "lowest-priority", "device when none lets the node start by its LST",
                                    choices=("lowest-priority", "eft")),
                  "congestion": congestion_param("link model of Find_Slot's EST and of the "
                                      "split/unsplit comparison: 'none' = transfer = latency + bytes/bandwidth, "
                                      "'channel' / 'port' = also queue on busy links (the simulator's rules)"),
                  "split": Param(bool, False, "split critical splittable operators first (section 4.1)"),
                  "split_parts": Param(int, 0, "parts per split operator (0 = number of devices)", min=0, max=1024,
                                       check=lambda v: "must be 0 or >= 2" if v == 1 else None),
                  "max_splits": Param(int, 8, "split at most this many operators (0 = all critical ones)", min=0,
                                       max=COUNT_MAX),
                  "overhead_s": overhead_param("extra time of each sub-operation (s)"),
                  "assume_batch": ASSUME_BATCH},
          quick_params={})
def fd_dps(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, eps: float = DEFAULT_EPS,
           fallback: str = "lowest-priority", congestion: str = DEFAULT_CONGESTION, split: bool = False,
           split_parts: int = 0, max_splits: int = 8, overhead_s: float = DEFAULT_OVERHEAD_S,
           assume_batch: int = 0) -> Placement:
    """FD-DPS placement and execution order: :func:`fd_dps_schedule`, with
    ``split=True`` on the graph with its critical operators split too
    (:func:`_keep_split_if_faster`).  The module docstring has every reading
    of sections 4.1-4.3 (the text omits the formulas).

    Complexity: O((V + E)·k + V log V) plus the timeline's gap search.

    Parameters
    ----------
    graph, cluster : the problem.
    seed : int
        Unused (deterministic).
    eps, fallback, congestion, split, split_parts, max_splits, overhead_s :
        See the module docstring and the registry help.
    assume_batch : int
        The batch the graph's costs hold for when it declares none (0 = the
        graph's own), for batch splits; recorded in the recipe.

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
    if split and split_parts > cluster.k:
        raise InvalidInput(f"fd-dps parameter split_parts: {split_parts} parts is more than the {cluster.k} devices "
                           f"of cluster '{cluster.name}'")
    costs = cost_model(graph, cluster, costs)
    device_of, order, _, ms, oom, ncrit = fd_dps_schedule(graph, cluster, costs, eps=eps, fallback=fallback,
                                                        congestion=congestion)
    estimate = {"makespan_s": ms, "critical_nodes": ncrit, "status": "OOM" if oom else "FEASIBLE"}
    g_used, steps = graph, []
    if split and cluster.k > 1:
        g_used, steps, device_of, order = _keep_split_if_faster(
            graph, cluster, costs, device_of, order, estimate, eps=eps, fallback=fallback, congestion=congestion,
            parts=split_parts or cluster.k, max_splits=max_splits, overhead_s=overhead_s,
            assume_batch=assume_batch or None)
    p = Placement.from_indices(g_used, cluster, device_of, algorithm="fd-dps", order=order, seed=seed,
                               estimate=estimate)
    attach(p, graph, g_used, steps)
    return p


def _keep_split_if_faster(graph: Graph, cluster: Cluster, costs: CostModel, device_of: list[int],
                          order: list[list[int]], estimate: dict, *, eps: float, fallback: str, congestion: str,
                          parts: int, max_splits: int, overhead_s: float,
                          assume_batch: int | None = None) -> tuple[Graph, list[dict], list, list]:
    """Section 4.1 with ``split=True``: schedule the graph with its critical
    splittable operators split (:func:`_split_critical`) too and keep the
    schedule of smaller simulated makespan (under *congestion*, the rule
    both were planned for).  Returns ``(graph used, its recipe steps,
    device_of, order)``; *estimate* gets both simulated makespans and, when
    the split graph wins, its schedule's numbers and splits."""
    g_split, steps = _split_critical(graph, cluster, costs, parts, max_splits, overhead_s, assume_batch)
    if g_split is graph:
        return graph, [], device_of, order
    c2 = costs.for_graph(g_split)
    d2, o2, _, ms2, oom2, nc2 = fd_dps_schedule(g_split, cluster, c2, eps=eps, fallback=fallback,
                                                 congestion=congestion)
    sim1 = makespan_of(graph, cluster, device_of, order, congestion=congestion, costs=costs)
    sim2 = makespan_of(g_split, cluster, d2, o2, congestion=congestion, costs=c2)
    estimate["unsplit_simulated_s"] = sim1
    estimate["split_simulated_s"] = sim2
    if not sim2 < sim1:
        return graph, [], device_of, order
    estimate.update({"makespan_s": ms2, "critical_nodes": nc2, "status": "OOM" if oom2 else "FEASIBLE",
                     "splits": [{k: r[k] for k in ("node", "dim", "n")} for r in g_split.meta.get("splits", [])]})
    return g_split, steps, d2, o2
