"""The simulator's schedule of a growing partial placement, kept exact as
nodes are added (for list schedulers whose estimate must be the simulated
makespan, e.g. Adjusting Placement with transfers as tasks).

A list scheduler places nodes one by one in a topological order and, for
each, asks when it could start on each device: :meth:`PartialSchedule.est`
answers with the inputs' arrivals (a local producer's finish, a tensor
already sent to the device, or a new transfer queued on its links in the
simulator's FIFO order, :class:`~celeritas_cli.sim.links.LinkTimeline`) and
the first idle slot of the device from then on.  :meth:`PartialSchedule.commit`
places the node there.

Invariant: the start and finish of every placed node, and every transfer,
are what :func:`~celeritas_cli.sim.simulator.run_schedule` gives the placed
nodes with their per-device orders (a partial placement, unplaced nodes
``-1``).  Under that strict order the simulator is the unique solution of

* ``start(u) = max(finish(previous node on u's device), arrival of each
  input)`` with an input's arrival its producer's finish on the same
  device, else the end of its transfer;
* ``start(X) = max(ready(X), end of the transfer before X on each of its
  links)`` for a transfer ``X`` with ``ready`` its producer's finish and
  "before" the FIFO order :func:`~celeritas_cli.sim.links.fifo_key`.

Ties at one instant follow the simulator's event batches: the finish of a
node of positive length is in the first batch at its finish time
(``batch 0``); a zero-length node that becomes startable in batch ``g``
finishes in batch ``g + 1``, and a zero-length transfer that starts when it
becomes ready arrives one batch after its producer finished.  Transfers
that become ready at one instant are issued by batch, then producer index
(the ``batch`` of :func:`~celeritas_cli.sim.links.fifo_key`).

Inserting a node into an idle slot of a device keeps the invariant (it ends
before the next node starts), and so does a transfer that fits an idle gap
of its links.  A transfer that became ready before transfers already queued
on its links, planned later (its consumer comes later in the placement
order), goes first in the simulator and *overtakes* them: it delays them,
and possibly what depends on them.  :meth:`commit` then re-times the
affected part by evaluating the equations above from the new transfers on,
in the order of their start times (a worklist; the FIFO positions of
transfers whose producer moved are updated as it goes), which touches only
what changes.  Should the worklist not settle within a budget
proportional to the placed part, the placed part is simulated instead.
The test-suite checks the invariant against ``run_schedule`` after every
commit on random graphs (:meth:`PartialSchedule.check`).  It holds for
clusters without calibrated ``hosts``: with them the partial schedule is
the list scheduler's model - every node at its ``CostModel.time``
(contention on every device of a host) and no transfer costs on the
devices (the simulator's rule 3a) - and the simulator judges the result.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right

from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.costs import CostModel
from ..model.graph import Graph
from ..scheduling.timeline import Timeline
from .links import LinkTimeline, fifo_key

_NODE, _XFER = 0, 1


class PartialSchedule:
    """Exact schedule of the nodes placed so far (module docstring).

    Attributes: ``dev[v]`` (-1 unplaced), ``start[v]``, ``fin[v]``,
    ``batch[v]`` (the event batch of v's finish at its instant), ``tl`` (a
    :class:`~celeritas_cli.scheduling.timeline.Timeline`: each device's
    nodes in order), ``links`` (the
    :class:`~celeritas_cli.sim.links.LinkTimeline`), ``transfers`` (``(tensor,
    dst) -> [key, src, start, end, duration]``), ``retimes`` (commits whose
    transfers overtook queued ones) and ``resims`` (re-times done by a full
    simulation, the fallback).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import CostModel
    >>> nd = lambda i, c: {"id": i, "compute_s": c, "memory_bytes": 0}
    >>> g = build("j", [nd("a", 1.0), nd("b", 3.0), nd("c", 1.0)],
    ...           [{"src": "a", "dst": "c", "bytes": 100}, {"src": "b", "dst": "c", "bytes": 100}])
    >>> cl = uniform(2, bandwidth=100.0, latency=0.0)
    >>> ps = PartialSchedule(g, cl, CostModel(g, cl))
    >>> for v, d in ((0, 0), (1, 0)):
    ...     ps.commit(v, d, *ps.est(v, d))
    >>> ps.est(2, 1)[0], ps.est(2, 0)[0]   # a's tensor 1-2, b's 4-5 on channel 0->1; all local on gpu0
    (5.0, 4.0)
    """

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, congestion: str = DEFAULT_CONGESTION,
                 insertion: bool = True):
        self.graph, self.cluster, self.costs = graph, cluster, costs
        self.congestion, self.insertion = congestion, insertion
        n, k = graph.n, cluster.k
        self.tl = Timeline(k)
        self.links = LinkTimeline(k, congestion)
        self.transfers: dict[tuple[int, int], list] = {}
        self.dev = [-1] * n
        self.start = [0.0] * n
        self.fin = [0.0] * n
        self.batch = [0] * n
        self.prev_on = [-1] * n
        self.next_on = [-1] * n
        self.retimes = 0
        self.resims = 0
        self.placed = 0
        # re-timing effort (worklist pops): at once while the total stays under work_budget, then
        # only by flush(), with one simulation (exact again after it; estimates meanwhile ignore the delays)
        self.work = 0
        self.work_budget = 2 * (n + graph.m) + 20_000
        self.pending: list = []
        src, etensor = graph.edge_src, graph.edge_tensor
        self.inputs: list[list[tuple[int, int]]] = []  # distinct (producer, tensor) per node
        for es in graph.in_edges:
            seen: dict[int, int] = {}
            for e in es:
                seen.setdefault(etensor[e], src[e])
            self.inputs.append(sorted((p, t) for t, p in seen.items()))
        self.out_tensors: list[list[int]] = [[] for _ in range(n)]
        for t, p in enumerate(graph.tensor_src):
            self.out_tensors[p].append(t)
        self.cons = graph.tensor_consumers()

    # ----------------------------------------------------------------- query
    def est(self, v: int, d: int) -> tuple[float, int, list]:
        """``(start, slot position, transfer plan)`` of *v* on device *d*:
        the time every input is there (new transfers queued on their links)
        and the first slot of the device from then on that holds *v*."""
        dev, fin, tr = self.dev, self.fin, self.transfers
        comm = self.costs.tensor_comm
        pre = 0.0
        items = []
        for p, t in self.inputs[v]:
            a = dev[p]
            if a == d:
                if fin[p] > pre:
                    pre = fin[p]
                continue
            rec = tr.get((t, d))
            if rec is not None:
                if rec[3] > pre:
                    pre = rec[3]
                continue
            items.append((fifo_key(fin[p], p, t, d, self.batch[p]), a, fin[p], comm(t, a, d)))
        plan = []
        if items:
            items.sort()
            for (key, a, _r, dur), (s, e, over) in zip(items, self.links.plan(d, items)):
                if e > pre:
                    pre = e
                plan.append((key, a, s, e, dur, over))
        s, pos = self.tl.slot(d, pre, self.costs.time[v][d], self.insertion)
        return s, pos, plan

    @property
    def makespan(self) -> float:
        self.flush()
        return max((self.fin[v] for v in range(self.graph.n) if self.dev[v] >= 0), default=0.0)

    def order(self) -> list[list[int]]:
        """Each device's nodes in execution order."""
        self.flush()
        return [list(ts) for ts in self.tl.tasks]

    # --------------------------------------------------------------- batches
    @staticmethod
    def _arrival_batch(rec: list) -> int:
        """Event batch of a transfer's arrival at its end time."""
        key = rec[0]
        return key[1] + 1 if key[0] == rec[2] == rec[3] else 0

    def _node_batch(self, u: int, s: float, prev: int) -> int:
        """Event batch of *u*'s finish when it starts at *s* after *prev*."""
        d = self.dev[u]
        if self.costs.time[u][d] > 0 or s != s + self.costs.time[u][d]:
            return 0
        fin, batch, tr = self.fin, self.batch, self.transfers
        g = -1
        if prev >= 0 and fin[prev] == s and batch[prev] > g:
            g = batch[prev]
        for p, t in self.inputs[u]:
            if self.dev[p] == d:
                if fin[p] == s and batch[p] > g:
                    g = batch[p]
            else:
                rec = tr[(t, d)]
                if rec[3] == s:
                    g = max(g, self._arrival_batch(rec))
        return g + 1

    # ---------------------------------------------------------------- commit
    def commit(self, v: int, d: int, s: float, pos: int, plan: list) -> None:
        """Place *v* on *d* at the slot of :meth:`est` (``s``, ``pos``) with
        its transfer *plan*, keeping the invariant."""
        f = s + self.costs.time[v][d]
        tl = self.tl
        tasks = tl.tasks[d]
        prev = tasks[pos - 1] if pos > 0 else -1
        nxt = tasks[pos] if pos < len(tasks) else -1
        tl.insert(d, pos, s, f, v)
        self.prev_on[v], self.next_on[v] = prev, nxt
        if prev >= 0:
            self.next_on[prev] = v
        if nxt >= 0:
            self.prev_on[nxt] = v
        self.dev[v], self.start[v], self.fin[v] = d, s, f
        self.placed += 1
        overtook = False
        for key, a, ts, te, dur, over in plan:
            self.links.reserve(a, d, key, ts, te)
            self.transfers[(key[3], d)] = [key, a, ts, te, dur]
            overtook = overtook or over
        self.batch[v] = self._node_batch(v, s, prev)
        if nxt >= 0 and self.start[nxt] == f:  # the next node now waits for v too: its batch may move
            self.pending.append((f, _NODE, nxt))
        if overtook:
            self.retimes += 1
            self.pending.append((s, _NODE, v))
            for key, a, ts, _te, _dur, _o in plan:
                self.pending.append((ts, _XFER, (key[3], d)))
                for r in self.links.resources(a, d):  # the transfers queued behind it
                    self._push_next(self.pending, r, key)
        if self.pending and self.work < self.work_budget:
            self.flush()

    def flush(self) -> None:
        """Re-time what overtaking transfers delayed (the schedule is exact
        after this call; :meth:`commit` calls it at once while the total
        re-timing work stays under ``work_budget``)."""
        if self.pending:
            seeds, self.pending = self.pending, []
            if self.work < self.work_budget:
                self._retime(seeds)
            else:  # many delays collected: one simulation of the placed part
                self._resimulate()

    # ---------------------------------------------------------------- re-time
    def _retime(self, seeds: list) -> None:
        """Evaluate the equations of the module docstring from *seeds* on,
        in the order of start times, until nothing changes."""
        heap = list(seeds)
        heapq.heapify(heap)
        old_start: dict[int, float] = {}  # nodes whose start changed: their start in self.tl
        budget = 50 * (self.placed + len(self.transfers)) + 1000
        pops = 0
        while heap:
            pops += 1
            if pops > budget:
                self.work += pops
                self._resimulate()
                return
            _, kind, ident = heapq.heappop(heap)
            if kind == _NODE:
                self._retime_node(ident, heap, old_start)
            else:
                self._retime_transfer(ident, heap)
        self.work += pops
        self._sync_devices(old_start)

    def _retime_node(self, u: int, heap: list, old_start: dict) -> None:
        dev, start, fin, tr = self.dev, self.start, self.fin, self.transfers
        d = dev[u]
        prev = self.prev_on[u]
        s = fin[prev] if prev >= 0 else 0.0
        for p, t in self.inputs[u]:
            x = fin[p] if dev[p] == d else tr[(t, d)][3]
            if x > s:
                s = x
        g = self._node_batch(u, s, prev)
        if s == start[u] and g == self.batch[u]:
            return
        old_start.setdefault(u, start[u])
        start[u] = s
        f = fin[u] = s + self.costs.time[u][d]
        self.batch[u] = g
        # dependents, by the earliest they can now start (so the worklist runs in time order)
        push = heapq.heappush
        nxt = self.next_on[u]
        if nxt >= 0:
            push(heap, (max(start[nxt], f), _NODE, nxt))
        for t in self.out_tensors[u]:
            for c in self.cons[t]:
                dc = dev[c]
                if dc == d:
                    push(heap, (max(start[c], f), _NODE, c))
                elif dc >= 0:
                    push(heap, (max(tr[(t, dc)][2], f), _XFER, (t, dc)))

    def _retime_transfer(self, ident: tuple[int, int], heap: list) -> None:
        t, b = ident
        rec = self.transfers[ident]
        key, a, s0, _e0, dur = rec
        p = key[2]
        links = self.links
        res = links.resources(a, b)
        newkey = fifo_key(self.fin[p], p, t, b, self.batch[p])
        moved = newkey != key
        if moved:  # the producer moved: so does the transfer's FIFO place
            for r in res:
                self._push_next(heap, r, key)
                self._move(r, key, newkey)
            rec[0] = key = newkey
        s = self.fin[p]
        for r in res:
            i = bisect_left(links.keys[r], key)
            if i and links.ends[r][i - 1] > s:
                s = links.ends[r][i - 1]
        if s == s0 and not moved:
            return
        e = s + dur
        rec[2], rec[3] = s, e
        for r in res:
            i = bisect_left(links.keys[r], key)
            links.starts[r][i], links.ends[r][i] = s, e
            self._push_next(heap, r, key, e)
        start, dev = self.start, self.dev
        for c in self.cons[t]:
            if dev[c] == b:
                heapq.heappush(heap, (max(start[c], e), _NODE, c))

    def _push_next(self, heap: list, r: int, key: tuple, at: float = 0.0) -> None:
        """Queue the transfer after *key* on resource *r* for re-timing
        (it cannot start before *at*)."""
        keys = self.links.keys[r]
        i = bisect_right(keys, key)
        if i < len(keys):
            nk = keys[i]
            heapq.heappush(heap, (max(self.links.starts[r][i], at), _XFER, (nk[3], nk[4])))

    def _move(self, r: int, key: tuple, newkey: tuple) -> None:
        links = self.links
        keys, starts, ends = links.keys[r], links.starts[r], links.ends[r]
        i = bisect_left(keys, key)
        s, e = starts[i], ends[i]
        del keys[i], starts[i], ends[i]
        j = bisect_left(keys, newkey)
        keys.insert(j, newkey)
        starts.insert(j, s)
        ends.insert(j, e)

    def _sync_devices(self, old_start: dict) -> None:
        """Write the new node times into the device timelines (located by
        their old, still sorted, start times)."""
        tl = self.tl
        where = []
        for u, s_old in old_start.items():
            d = self.dev[u]
            starts, tasks = tl.starts[d], tl.tasks[d]
            i = bisect_left(starts, s_old)
            while tasks[i] != u:
                i += 1
            where.append((d, i, u))
        for d, i, u in where:
            tl.starts[d][i] = self.start[u]
            tl.ends[d][i] = self.fin[u]

    def _resimulate(self) -> None:
        """Re-time the placed part by the simulator (the fallback)."""
        from .simulator import run_schedule

        self.resims += 1
        self.pending = []
        g, tl = self.graph, self.tl
        order = self.order()
        sched = run_schedule(g, self.cluster, self.dev, order, congestion=self.congestion, costs=self.costs,
                             label="partial schedule (re-time)")
        for d, seq in enumerate(order):
            tl.starts[d] = [sched.start[v] for v in seq]
            tl.ends[d] = [sched.finish[v] for v in seq]
            for v in seq:
                self.start[v], self.fin[v] = sched.start[v], sched.finish[v]
        comm, src = self.costs.tensor_comm, g.tensor_src
        self.transfers = {(x.tensor, x.dst_dev): [fifo_key(x.ready, src[x.tensor], x.tensor, x.dst_dev), x.src_dev,
                                                  x.start, x.end, comm(x.tensor, x.src_dev, x.dst_dev)]
                          for x in sched.transfers}
        placed = sorted((self.start[v], v) for seq in order for v in seq)
        for _ in range(len(placed) + 1):  # batches: a fixpoint along zero-length chains
            changed = False
            for _s, v in placed:
                b = self._node_batch(v, self.start[v], self.prev_on[v])
                if b != self.batch[v]:
                    self.batch[v], changed = b, True
            for (t, b), rec in self.transfers.items():
                key = fifo_key(rec[0][0], src[t], t, b, self.batch[src[t]])
                if key != rec[0]:
                    rec[0], changed = key, True
            if not changed:
                break
        self.links.rebuild((rec[1], b, rec[0], rec[2], rec[3]) for (t, b), rec in self.transfers.items())

    # ----------------------------------------------------------------- check
    def check(self) -> None:
        """Assert the invariant against the simulator (for tests)."""
        from .simulator import run_schedule

        self.flush()
        sched = run_schedule(self.graph, self.cluster, self.dev, self.order(), congestion=self.congestion,
                             costs=self.costs)
        for v in range(self.graph.n):
            if self.dev[v] >= 0:
                assert (self.start[v], self.fin[v]) == (sched.start[v], sched.finish[v]), (
                    f"node {self.graph.ids[v]}: {self.start[v]}, {self.fin[v]} != {sched.start[v]}, {sched.finish[v]}")
        got = {key: (rec[2], rec[3]) for key, rec in self.transfers.items()}
        want = {(x.tensor, x.dst_dev): (x.start, x.end) for x in sched.transfers}
        assert got == want, "transfers differ from the simulator's"
        for d in range(self.cluster.k):
            assert self.tl.starts[d] == [self.start[v] for v in self.tl.tasks[d]]
