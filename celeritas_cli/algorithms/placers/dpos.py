"""FastT's DPOS: Device Placement and Operation Sequencing (FastT section 5.1,
Algorithm 1).

A list scheduler in the HEFT family with FastT's two twists: priorities are
upward ranks computed with *maximal* costs, and the operations of the
critical path go to a *critical-path device* chosen up front by how many of
the remaining critical-path operations fit on it and their average time.
Every other operation goes to the memory-feasible device of minimum EFT,
with insertion into idle slots (:class:`~celeritas_cli.scheduling.timeline.Timeline`).
The per-device execution order (ascending start time, Algorithm 1 line 23)
is part of the output.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model, upward_rank
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import Param, congestion_param, register
from ...scheduling.memory import DeviceMemory
from ...scheduling.timeline import Timeline
from ...sim.links import InputArrivals


@dataclass
class DposResult:
    """What :func:`dpos_schedule` computes (index level).

    ``device_of[v]``, ``order[d]`` (node indices by start time), ``start`` /
    ``finish`` (DPOS's own estimate), ``makespan`` (FT of the exit
    operation, Algorithm 1 line 24), ``critical_path`` (``SET_CP``, node
    indices from entry to exit), ``cp_device`` (device index per CP node)
    and ``oom`` (True when some node had to go over a device's capacity).
    """

    device_of: list[int]
    order: list[list[int]]
    start: list[float]
    finish: list[float]
    makespan: float
    critical_path: list[int]
    cp_device: list[int]
    oom: bool


def critical_path_by_rank(graph: Graph, rank: list[float]) -> list[int]:
    """FastT 5.1: start from the entry operation of largest rank, then
    repeatedly take the successor of largest rank (ties by topological
    index)."""
    if graph.n == 0:
        return []
    topo = graph.topo_index()
    v = min(graph.sources(), key=lambda x: (-rank[x], topo[x]))
    path = [v]
    while graph.succ[v]:
        v = min(graph.succ[v], key=lambda x: (-rank[x], topo[x]))
        path.append(v)
    return path


def dpos_schedule(graph: Graph, cluster: Cluster, costs: CostModel | None = None,
                  insertion: bool = True, congestion: str = DEFAULT_CONGESTION) -> DposResult:
    """Run DPOS (FastT Algorithm 1) on *graph*.

    Steps, with the paper's line numbers:

    * lines 3-4: ``w_i`` = maximal time of ``i`` over devices
      (:attr:`CostModel.max_time`), ``c_ij`` = maximal transfer time over
      device pairs (:meth:`CostModel.max_comm`); ``rank_u`` by
      :func:`~celeritas_cli.model.costs.upward_rank`; the critical path by
      :func:`critical_path_by_rank`.
    * line 5: the critical-path devices, :func:`critical_path_devices`.
    * lines 6-22: list scheduling in decreasing ``rank_u`` with min-EFT
      device choice and insertion, :func:`_list_schedule`.
    * line 23: the order on each device is by start time.

    Complexity: O((V + E)·k) plus the slot search of the timeline (linear in
    the idle gaps after the ready time; short in practice).

    Parameters
    ----------
    graph, cluster : the problem.
    costs : CostModel, optional
        Reused when given.
    insertion : bool
        Insert into idle slots (the paper) or only append.
    congestion : str
        ``"channel"``, ``"port"`` or ``"none"``, see
        :class:`~celeritas_cli.sim.links.InputArrivals`.

    Returns
    -------
    DposResult

    References
    ----------
    FastT (Yi et al., CoNEXT 2020), section 5.1 and Algorithm 1.
    """
    costs = cost_model(graph, cluster, costs)
    wmax = costs.max_time
    rank = upward_rank(graph, lambda v: wmax[v], costs.max_comm)
    cp = critical_path_by_rank(graph, rank)
    mem = DeviceMemory(graph, cluster)  # budget = device memory; best effort "most_free"
    cp_dev = critical_path_devices(graph, cluster.k, costs, cp, mem)
    device_of, start, finish, tl = _list_schedule(graph, cluster.k, costs, rank, cp_dev, mem,
                                                  insertion, congestion)
    dev_order = [tl.order(d) for d in range(cluster.k)]
    makespan = max(finish) if graph.n else 0.0
    return DposResult(device_of=device_of, order=dev_order, start=start, finish=finish, makespan=makespan,
                      critical_path=cp, cp_device=[cp_dev[v] for v in cp], oom=mem.oom())


def critical_path_devices(graph: Graph, k: int, costs: CostModel, cp: list[int], mem: DeviceMemory) -> list[int]:
    """FastT Algorithm 1 line 5: the device of each critical-path operation
    (-1 for the others), memory reserved on *mem*.

    From the first unassigned CP operation, every device simulates taking
    as many consecutive CP operations as fit in its free memory
    (:func:`_cp_run`) and the average time of those operations on it; the
    device of smallest average (ties: more operations, then device index)
    takes them, and when it is full the next device is chosen the same way
    ("when a critical-path device's memory is full, we find another").  An
    operation whose colocation group is already placed goes with it; one
    that fits nowhere goes to the device with the most free memory (OOM).
    """
    cp_dev = [-1] * graph.n
    i = 0
    while i < len(cp):
        first = cp[i]
        p = mem.pinned_device(first)
        if p >= 0:
            cp_dev[first] = p
            i += 1
            continue
        best = None
        for d in range(k):
            cnt, tot = _cp_run(graph, costs, cp, i, d, mem)
            if cnt:
                key = (tot / cnt, -cnt, d)
                if best is None or key < best[0]:
                    best = (key, d, cnt)
        if best is None:  # nothing fits anywhere: most free memory, OOM
            d = mem.fallback(first, rule="most_free")
            cp_dev[first] = d
            mem.place(first, d)
            i += 1
            continue
        _, d, cnt = best
        for v in cp[i:i + cnt]:
            cp_dev[v] = d
            mem.place(v, d)
        i += cnt
    return cp_dev


def _cp_run(graph: Graph, costs: CostModel, cp: list[int], i: int, d: int, mem: DeviceMemory) -> tuple[int, float]:
    """How many consecutive CP operations from ``cp[i]`` fit in device
    *d*'s free memory, and their total time on *d*.  A colocation group
    counts with its whole memory the first time the run takes a member; a
    node whose group already sits on another device ends the run."""
    used = 0.0
    tot = 0.0
    cnt = 0
    seen_groups: set[int] = set()
    time = costs.time
    for j in range(i, len(cp)):
        v = cp[j]
        g = mem.group_of[v]
        p = mem.pinned_device(v)
        if p >= 0:
            if p != d:
                break
            m = 0
        elif g >= 0:
            m = 0 if g in seen_groups else mem.group_mem[g]
            seen_groups.add(g)
        else:
            m = graph.memory[v]
        if used + m > mem.free(d):
            break
        used += m
        tot += time[v][d]
        cnt += 1
    return cnt, tot


def _list_schedule(graph: Graph, k: int, costs: CostModel, rank: list[float], cp_dev: list[int],
                   mem: DeviceMemory, insertion: bool, congestion: str
                   ) -> tuple[list[int], list[float], list[float], Timeline]:
    """FastT Algorithm 1 lines 6-22: ``(device_of, start, finish, timeline)``.

    Operations in decreasing ``rank_u`` (ties by topological index, so
    parents come first even with zero costs).  A CP operation goes to its
    CP device; any other to ``argmin_d EFT(o, d)`` over the devices with
    enough free memory (line 13: EFT = +inf otherwise), ties by device
    index.  ``EST(o, d) = max(avail, max_pred FT(p) + ĉ(p, o, d))`` with the
    actual transfer time ``ĉ`` (0 on the same device; with
    ``congestion="channel"`` or ``"port"`` it includes waiting for busy
    links, :class:`~celeritas_cli.sim.links.InputArrivals`) and ``avail``
    the first idle slot that fits (insertion).  Colocation: a group is
    placed as a whole; once one member has a device, every other member
    goes there (for a CP member this overrides nothing because CP groups
    are fixed in line 5).  No device with enough memory: the device with
    the most free memory, and *mem* records the OOM.
    """
    n, time, topo = graph.n, costs.time, graph.topo_index()
    tl = Timeline(k)
    device_of = [-1] * n
    start = [0.0] * n
    finish = [0.0] * n
    links = InputArrivals(graph, costs, congestion)
    for v in sorted(range(n), key=lambda v: (-rank[v], topo[v])):
        if cp_dev[v] != -1:
            cands = [cp_dev[v]]
        else:  # the group's device, else the devices with room, else the most free one
            cands = mem.candidates(v, rule="most_free")
        best_d, best_s, best_f, best_plan = -1, 0.0, 0.0, []
        for d in cands:
            dur = time[v][d]
            ready, plan = links.ready(v, d, finish, device_of)
            s = tl.earliest_start(d, ready, dur, insertion)
            f = s + dur
            if best_d == -1 or f < best_f:
                best_d, best_s, best_f, best_plan = d, s, f, plan
        links.commit(best_d, best_plan)
        if cp_dev[v] == -1:
            mem.place(v, best_d)
        device_of[v] = best_d
        start[v] = best_s
        finish[v] = best_f
        tl.reserve(best_d, best_s, best_f, v)
    return device_of, start, finish, tl


@register("dpos", paper="FastT (Yi et al., CoNEXT 2020)", section="5.1, Algorithm 1",
          summary="DPOS: max-cost rank_u list scheduling, critical-path device, min-EFT insertion, "
                  "execution order.",
          params={"congestion": congestion_param("link model of EST: 'none' = the paper's "
                                      "(transfer = latency + bytes/bandwidth), 'channel' / 'port' = also queue on "
                                      "busy links (the simulator's rules)"),
                  "insertion": Param(bool, True, "insert into idle slots (the paper) or only append")})
def dpos(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
         congestion: str = DEFAULT_CONGESTION, insertion: bool = True) -> Placement:
    """FastT's DPOS placement and execution order (see :func:`dpos_schedule`).

    Deterministic; *seed* is unused (ties are broken by topological index
    and device index).

    Parameters
    ----------
    graph, cluster : the problem.
    seed : int
        Unused.
    congestion : str
        ``"none"``: the paper's EST, ``FT(p) + ĉ`` with ĉ the link's latency
        + bytes / bandwidth.  ``"channel"`` (default) / ``"port"``: ĉ also
        waits for the links to be free, as the simulator's rule of that name
        does (:class:`~celeritas_cli.sim.links.InputArrivals`); FastT's cost model is the *measured* transfer
        time, which includes that queueing, and on graphs with a CCR of 20
        the congestion-free estimate spreads nodes over devices whose links
        then saturate.
    insertion : bool
        Insertion into idle slots (default, the paper) or append only.

    Returns
    -------
    Placement
        With ``order`` (per-device execution order) and ``estimate``
        (DPOS's FT of the exit operation; status ``FEASIBLE`` or ``OOM``).

    Notes
    -----
    Judge DPOS under the congestion rule it planned for.  Random layered
    DAGs with CCR 30 on 4xV100-pcie, simulated makespans (s), judged under
    ``channel`` / ``none``:

    ===========================  ===========  ===========  ===========  ===========
    placement                    500 channel  500 none     8k channel   8k none
    ===========================  ===========  ===========  ===========  ===========
    dpos (default ``channel``)   0.90         0.37         10.5         3.49
    dpos ``congestion=none``     1.07         0.22         14.3         2.01
    heft (contention-free plan)  1.80         0.24         14.6         2.01
    ===========================  ===========  ===========  ===========  ===========

    Judged without congestion the default DPOS is 1.5-1.9x slower than HEFT
    (the report "DPOS is 5-6x worse than HEFT on layered graphs with CCR
    30"): it budgets for queueing that judge does not charge and keeps 40%
    of the nodes on its critical-path device.  Planned for the judge's rule
    it matches or beats HEFT (0.22 vs 0.24 s, 2.01 vs 2.01 s), so neither the
    critical-path device nor the max-cost ranks of FastT 5.1 cause the gap;
    under the simulator's default rule DPOS is 1.4-2x faster than HEFT,
    whose contention-free plan saturates the links
    (``tests/algorithms/test_fastt.py::test_dpos_versus_heft_depends_on_the_judges_congestion_rule``).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = dpos(layered(40), uniform(2))
    >>> sorted(p.order) == ["gpu0", "gpu1"] or sorted(p.order)
    True

    References
    ----------
    FastT (Yi et al., "Optimizing distributed training deployment in
    heterogeneous GPU clusters", CoNEXT 2020), section 5.1, Algorithm 1.
    """
    res = dpos_schedule(graph, cluster, costs, insertion=insertion, congestion=congestion)
    return Placement.from_indices(graph, cluster, res.device_of, algorithm="dpos", order=res.order, seed=seed,
                                  estimate={"makespan_s": res.makespan,
                                            "status": "OOM" if res.oom else "FEASIBLE"})
