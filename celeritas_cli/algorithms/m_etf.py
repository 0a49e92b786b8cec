"""m-ETF: Baechi's memory-constrained Earliest Task First list scheduler.

Jeon et al., "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (m-ETF; the authors' released code, placer/m_etf.py), after Hwang, Chow, Anger & Lee's ETF
(SIAM J. Comput. 1989).  Celeritas (Table 3, section 7) and Moirai (IV)
use it as a baseline.

The scheduler simulates time.  At the current time ``T`` every *free*
device proposes the ready node it could start earliest, by
``(start time, topological index)``; since a free device's start time is
``max(T, data ready time)`` only nodes whose inputs can be on the device by
``T`` qualify, and among them the lowest topological index.  The globally
earliest proposal wins (ties by topological index, then device index), is
placed and started, and the loop repeats until no free device has a
proposal; then ``T`` advances to the next event (a device finishing, or a
ready node's data arriving).  A node becomes ready once all its
predecessors have *finished* (as in Baechi's event loop).

Communication is estimated the way the simulator runs it: a tensor crosses
to a given device once (later consumers there reuse it) and each directed
channel carries one transfer at a time (the simulator's ``channel`` rule,
:class:`~celeritas_cli.sim.links.InputArrivals`).
Memory is checked per device (Baechi's "m-"): a node is proposed only by
devices whose load plus its memory fits; a colocation group is charged in
full and pinned when its first member is placed (Baechi's and Celeritas
6.1's rule), so later members can only go there.  When a ready node fits
on no device, it is allowed only on the device with the most free memory
(Celeritas 6.2.3's best-effort rule) and the estimate reports ``OOM``.

The per-device execution order is emitted as the placement's ``order``.

The memory/colocation bookkeeping is :class:`~celeritas_cli.scheduling.memory.DeviceMemory`
(shared with the other memory-aware placers; still importable from here).
This module holds :func:`etf_schedule`, which m-SCT (:mod:`.m_sct`) drives
with its favourite-child rule.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from dataclasses import dataclass
from typing import Sequence

from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from ..registry import register
from ..scheduling.memory import (
    DeviceMemory,  # importers of ``.m_etf.DeviceMemory`` keep working
)
from ..sim.links import InputArrivals


@dataclass
class EtfResult:
    device_of: list[int]
    order: list[list[int]]
    start: list[float]
    finish: list[float]
    makespan: float
    status: str


def etf_schedule(graph: Graph, cluster: Cluster, costs: CostModel | None = None, *,
                 favorite: Sequence[int] | None = None) -> EtfResult:
    """Run Baechi's m-ETF event loop (see the module docstring); with
    *favorite* (``favorite[u]`` = u's favourite child or -1) run m-SCT's
    variant instead (:mod:`.m_sct`).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    costs : CostModel, optional
    favorite : sequence of int, optional
        Favourite child per node; enables the SCT rule.

    Returns
    -------
    EtfResult
        Device per node, per-device order, estimated start/finish times,
        the estimated makespan and ``FEASIBLE``/``OOM``.
    """
    costs = cost_model(graph, cluster, costs)
    n, k = graph.n, cluster.k
    time = costs.time
    ti = graph.topo_index()
    mem = DeviceMemory(graph, cluster)
    inputs = InputArrivals(graph, costs, "channel")

    dev_of = [-1] * n
    start = [math.nan] * n
    finish = [math.nan] * n
    free_at = [0.0] * k
    last = [-1] * k
    order: list[list[int]] = [[] for _ in range(k)]
    # dr[v][d]: time v's inputs can be on d (NaN = stale); only for ready v
    dr: list[list[float] | None] = [None] * n
    need = [len(graph.pred[v]) for v in range(n)]
    in_ready = [False] * n
    ready: list[tuple[int, int]] = []  # (topo index, node), sorted
    events: list[tuple[float, int]] = []  # (finish time, node)

    def add_ready(v: int) -> None:
        in_ready[v] = True
        dr[v] = [math.nan] * k
        insort(ready, (ti[v], v))

    for v in graph.topo_order():
        if need[v] == 0:
            add_ready(v)

    def data_ready(v: int, d: int) -> float:
        """When all of v's input tensors can be on d (the channels' queues as reserved so far)."""
        return inputs.ready(v, d, finish, dev_of)[0]

    def get_dr(v: int, d: int) -> float:
        row = dr[v]
        assert row is not None
        x = row[d]
        if x != x:  # NaN: stale
            x = row[d] = data_ready(v, d)
        return x

    def commit(v: int, d: int, now: float) -> None:
        nonlocal done
        ready_t, plan = inputs.ready(v, d, finish, dev_of)
        inputs.commit(d, plan)
        remote = bool(plan)
        s = max(now, free_at[d], ready_t)
        f = s + time[v][d]
        dev_of[v] = d
        start[v], finish[v] = s, f
        free_at[d] = f
        last[d] = v
        order[d].append(v)
        mem.place(v, d)
        in_ready[v] = False
        ready.remove((ti[v], v))
        dr[v] = None
        if remote:  # channels into d got busier / tensors got cached on d
            for _, w in ready:
                row = dr[w]
                assert row is not None
                row[d] = math.nan
        heapq.heappush(events, (f, v))
        done += 1

    def release(now: float) -> None:
        while events and events[0][0] <= now:
            _, p = heapq.heappop(events)
            for s in graph.succ[p]:
                need[s] -= 1
                if need[s] == 0:
                    add_ready(s)

    def urgent_now(w: int, now: float) -> bool:
        """Baechi's urgent time of w - the latest of its start times over the
        devices it may go to (after it, every device could have run it) -
        has come: every allowed device is free and has w's inputs by *now*."""
        for d2 in range(k):
            if mem.allowed(w, d2) and (free_at[d2] > now or get_dr(w, d2) > now):
                return False
        return True

    def sct_state(d: int, now: float) -> int:
        """The favourite child device d waits for (AWAKE), or -1 (FREE)."""
        if favorite is None or last[d] < 0:
            return -1
        fc = favorite[last[d]]
        if fc < 0 or not in_ready[fc] or not mem.allowed(fc, d):
            return -1
        here = max(now, get_dr(fc, d))
        best = min(max(now, free_at[d2], get_dr(fc, d2)) for d2 in range(k) if mem.allowed(fc, d2))
        return fc if here <= best else -1

    def propose(d: int, now: float) -> int:
        fc = sct_state(d, now)
        if fc >= 0:
            # the earliest urgent node by (urgent time, topological index): all
            # urgent-now nodes share urgent time `now`, so the first in topo order;
            # an unpinned node that fits a busy device cannot be urgent (fast skip)
            busy_room = max((mem.cap[b] - mem.load[b] for b in range(k) if free_at[b] > now), default=-1)
            for _, w in ready:
                if mem.pinned_device(w) < 0 and mem.unit_memory(w) <= busy_room:
                    continue
                if mem.allowed(w, d) and urgent_now(w, now):
                    return w
            if get_dr(fc, d) <= now:
                return fc
            return -1
        for _, w in ready:
            if mem.allowed(w, d) and get_dr(w, d) <= now:
                return w
        return -1

    def next_time(now: float) -> float:
        """The next instant anything can change: a device finishing, or a
        ready node's inputs reaching a free device.  (For SCT this is a lower
        bound on every urgent time and on the favourite child's start, so an
        AWAKE device is woken in time; an extra wake-up costs nothing.)"""
        nt = events[0][0] if events else math.inf
        for d in range(k):
            if free_at[d] > now:
                continue
            for _, w in ready:
                x = get_dr(w, d)
                if now < x < nt and mem.allowed(w, d):
                    nt = x
        return nt

    done = 0
    now = 0.0
    while done < n:
        release(now)
        while True:
            best: tuple[int, int, int] | None = None
            for d in range(k):
                if free_at[d] > now:
                    continue
                w = propose(d, now)
                if w >= 0 and (best is None or (ti[w], d) < best[:2]):
                    best = (ti[w], d, w)
            if best is None:
                break
            commit(best[2], best[1], now)
            release(now)
        if done == n:
            break
        nt = next_time(now)
        if not math.isfinite(nt):  # cannot happen: every ready node has an allowed device
            raise RuntimeError(f"m-ETF stalled at t={now} with {len(ready)} ready nodes")
        now = nt
    makespan = max(finish) if n else 0.0
    return EtfResult(dev_of, order, start, finish, makespan, mem.status())


@register("m-etf", paper="Baechi (Jeon et al., SoCC 2020)",
          section="m-ETF (released placer/m_etf.py); Celeritas Table 3",
          summary="Memory-constrained Earliest Task First list scheduling (emits per-device order).")
def m_etf(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None) -> Placement:
    """Place and order *graph* with Baechi's m-ETF (module docstring).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    seed : int
        Unused (m-ETF is deterministic); recorded in the placement.

    Returns
    -------
    Placement
        With ``order`` and ``estimate`` = the scheduler's own makespan and
        ``FEASIBLE`` / ``OOM``.

    References
    ----------
    Jeon et al., SoCC 2020 (m-ETF); Hwang et al., SIAM J. Comput. 18(2), 1989.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = m_etf(layered(30), uniform(2))
    >>> sorted(p.order) == ['gpu0', 'gpu1'] and p.estimate["status"]
    'FEASIBLE'
    """
    res = etf_schedule(graph, cluster)
    return Placement.from_indices(graph, cluster, res.device_of, order=res.order, algorithm="m-etf",
                                  seed=seed, estimate={"makespan_s": res.makespan, "status": res.status})
