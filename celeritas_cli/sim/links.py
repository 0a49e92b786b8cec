"""Link occupancy: the one model of when a transfer may use the links.

A transfer of a tensor from device ``a`` to device ``b`` takes
``CostModel.tensor_comm`` seconds and, under the *congestion rule*, holds
some links while it runs (docs/design.md, "The simulator (the judge)", rule 3):

* ``channel`` (the default): the directed channel ``a->b``; a channel carries
  one transfer at a time (Moirai Eq. 8, Celeritas 6.1 "the data transmission
  process as an additional task");
* ``port``: ``a``'s uplink and ``b``'s downlink (one of each per device, the
  rule of Moirai's released code);
* ``none``: nothing; transfers overlap freely (the classic HEFT model).

Each rule is a set of *resources* per device pair (:meth:`LinkState.resources`):
``channel`` has ``k*k`` (one per ordered pair), ``port`` ``2k`` (uplinks
``0..k-1``, downlinks ``k..2k-1``) and ``none`` none.  A transfer starts at
``max(ready, the time each of its resources is free)`` and occupies them
until it ends.

Three views of the same occupancy:

* :class:`LinkState` - reservations made in time order (append): the
  simulator, which issues transfers first-in first-out by the time they
  become ready, and the list schedulers that queue a node's inputs behind
  everything already reserved (DPOS, FD-DPS, m-ETF, the MILP hint replay).
  :meth:`LinkState.plan` / :meth:`LinkState.commit` queue several inputs of
  one node tentatively and then keep them.
* :class:`LinkTimeline` - reservations made out of time order, for a
  scheduler that fills idle link gaps (Adjusting Placement).  It keeps each
  resource's transfers in the simulator's FIFO order (by
  :func:`fifo_key`), so a transfer goes where the simulator would put it:
  after every transfer that became ready before it.  :meth:`LinkTimeline.earliest`
  is its start there; :meth:`LinkTimeline.overtakes` says when it would delay
  a transfer already queued behind it (then the caller re-times its schedule).
* :class:`InputArrivals` - for list schedulers: when the inputs of a node
  would be on a candidate device (local producers' finish, tensors already
  sent there, and new transfers queued on a :class:`LinkState`), and
  committing them once the device is chosen.

Example
-------
>>> links = LinkState(2, "channel")
>>> links.send(0, 1, 0.0, 2.0), links.send(0, 1, 1.0, 2.0), links.send(1, 0, 1.0, 2.0)
(0.0, 2.0, 1.0)
>>> LinkState(2, "none").send(0, 1, 1.0, 2.0)
1.0
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Iterable, Sequence

# the rules are defined one layer down (registry and the commands use them too); re-exported here
from ..model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION, check_congestion

if TYPE_CHECKING:
    from ..model.costs import CostModel


def fifo_key(ready: float, producer: int, tensor: int, dst: int, batch: int = 0) -> tuple:
    """The simulator's order of transfers on shared links: by the time they
    become ready (the producer's finish); at one instant by the batch of
    events the producer's finish was processed in (*batch* > 0 only after a
    chain of zero-length nodes or transfers at that instant, see
    :class:`~celeritas_cli.sim.partial.PartialSchedule`), then by producer
    index, tensor id and destination device index.

    >>> fifo_key(1.0, 7, 3, 2) < fifo_key(1.0, 2, 0, 0, batch=1) < fifo_key(1.5, 0, 0, 0)
    True
    """
    return (ready, batch, producer, tensor, dst)


def _resources(rule: str, k: int, a: int, b: int) -> tuple[int, ...]:
    if rule == "channel":
        return (a * k + b,)
    if rule == "port":
        return (a, k + b)
    return ()


def _n_resources(rule: str, k: int) -> int:
    return k * k if rule == "channel" else 2 * k if rule == "port" else 0


class LinkState:
    """Link occupancy with reservations made in time order (append).

    ``free[r]`` is when resource ``r`` is free after every reservation made
    so far.  :meth:`send` reserves one transfer; :meth:`plan` computes the
    arrival of several transfers into one device tentatively (each queued
    behind the previous ones on shared resources) and :meth:`commit` keeps
    such a plan.

    Parameters
    ----------
    k : int
        Number of devices.
    rule : {"channel", "port", "none"}
    zero : float or int
        The time every resource is first free (``0`` keeps integer
        schedules integral, as the MILP hint replay needs).

    Example
    -------
    >>> links = LinkState(3, "port")
    >>> plan = links.plan(2, [(0.0, 0, 1.0), (0.0, 1, 1.0)])  # both into device 2's downlink
    >>> [(a, s, e) for a, s, e in plan]
    [(0, 0.0, 1.0), (1, 1.0, 2.0)]
    >>> links.commit(2, plan); links.start(1, 0, 0.0)      # device 1's uplink is busy until 2.0
    2.0
    """

    def __init__(self, k: int, rule: str = DEFAULT_CONGESTION, zero: float = 0.0):
        self.rule = check_congestion(rule)
        self.k = k
        self.free = [zero] * _n_resources(self.rule, k)
        # the hot paths, bound once per rule (no string compare per transfer)
        self.send = {"channel": self._send_channel, "port": self._send_port, "none": self._send_none}[self.rule]

    def resources(self, a: int, b: int) -> tuple[int, ...]:
        """Resource ids a transfer ``a->b`` holds under this rule."""
        return _resources(self.rule, self.k, a, b)

    def start(self, a: int, b: int, ready: float) -> float:
        """Earliest start of a transfer ``a->b`` ready at *ready*, after
        every reservation made so far."""
        s = ready
        free = self.free
        for r in _resources(self.rule, self.k, a, b):
            if free[r] > s:
                s = free[r]
        return s

    def reserve(self, a: int, b: int, end: float) -> None:
        """Hold the resources of ``a->b`` until *end* (never shortens)."""
        free = self.free
        for r in _resources(self.rule, self.k, a, b):
            if end > free[r]:
                free[r] = end

    # ``send(a, b, ready, dur) -> start``: start() then reserve(start + dur)
    def _send_channel(self, a: int, b: int, ready: float, dur: float) -> float:
        i = a * self.k + b
        f = self.free[i]
        s = ready if ready >= f else f
        self.free[i] = s + dur
        return s

    def _send_port(self, a: int, b: int, ready: float, dur: float) -> float:
        free = self.free
        j = self.k + b
        s = max(ready, free[a], free[j])
        free[a] = free[j] = s + dur
        return s

    def _send_none(self, a: int, b: int, ready: float, dur: float) -> float:
        return ready

    def plan(self, d: int, items: Iterable[tuple[float, int, float]]) -> list[tuple[int, float, float]]:
        """Queue transfers into device *d* tentatively, in the given order.

        *items* are ``(ready, src_device, duration)``; each starts after the
        reservations so far and after the earlier items of this plan on a
        shared resource.  Returns ``(src_device, start, end)`` per item
        (nothing is reserved: see :meth:`commit`)."""
        out = []
        if self.rule == "none":
            for ready, a, dur in items:
                out.append((a, ready, ready + dur))
            return out
        local: dict[int, float] = {}
        free = self.free
        k = self.k
        for ready, a, dur in items:
            s = ready
            for r in _resources(self.rule, k, a, d):
                f = local.get(r)
                if f is None:
                    f = free[r]
                if f > s:
                    s = f
            e = s + dur
            for r in _resources(self.rule, k, a, d):
                local[r] = e
            out.append((a, s, e))
        return out

    def commit(self, d: int, plan: Sequence[tuple[int, float, float]]) -> None:
        """Reserve the transfers of a :meth:`plan` into device *d*."""
        for a, _s, e in plan:
            self.reserve(a, d, e)


class LinkTimeline:
    """Link occupancy with reservations made out of time order, kept in the
    simulator's FIFO order per resource.

    Every resource keeps its transfers sorted by :func:`fifo_key` with their
    start and end times.  A new transfer's place is fixed by its key (the
    simulator serves transfers in that order), so it starts at
    ``max(ready, end of the transfer before it on each of its resources)``
    (:meth:`earliest`) - in the idle gap there when one is long enough.
    When it is not, the transfer would *overtake* the ones queued behind it
    (:meth:`overtakes`): reserving it anyway delays them, and the caller
    must re-time its schedule (e.g. by re-simulating it and calling
    :meth:`rebuild`).

    Example
    -------
    >>> tl = LinkTimeline(2, "channel")
    >>> tl.reserve(0, 1, fifo_key(5.0, 3, 3, 1), 5.0, 6.0)
    >>> tl.earliest(0, 1, fifo_key(1.0, 2, 2, 1), 1.0)      # before it, in the idle gap
    1.0
    >>> tl.overtakes(0, 1, fifo_key(1.0, 2, 2, 1), 1.0, 4.5), tl.overtakes(0, 1, fifo_key(1.0, 2, 2, 1), 1.0, 5.5)
    (False, True)
    """

    def __init__(self, k: int, rule: str = DEFAULT_CONGESTION):
        self.rule = check_congestion(rule)
        self.k = k
        nr = _n_resources(self.rule, k)
        self.keys: list[list[tuple]] = [[] for _ in range(nr)]
        self.starts: list[list[float]] = [[] for _ in range(nr)]
        self.ends: list[list[float]] = [[] for _ in range(nr)]

    def resources(self, a: int, b: int) -> tuple[int, ...]:
        return _resources(self.rule, self.k, a, b)

    def earliest(self, a: int, b: int, key: tuple, ready: float) -> float:
        """Start of a transfer ``a->b`` with FIFO *key*, ready at *ready*:
        after the transfer queued before it on each of its resources."""
        s = ready
        for r in _resources(self.rule, self.k, a, b):
            i = bisect_right(self.keys[r], key)
            if i and self.ends[r][i - 1] > s:
                s = self.ends[r][i - 1]
        return s

    def overtakes(self, a: int, b: int, key: tuple, start: float, end: float) -> bool:
        """True when a transfer ``[start, end)`` at its FIFO place would
        delay a transfer queued behind it (it ends after that one starts)."""
        for r in _resources(self.rule, self.k, a, b):
            keys = self.keys[r]
            i = bisect_right(keys, key)
            if i < len(keys) and self.starts[r][i] < end:
                return True
        return False

    def plan(self, d: int, items: Iterable[tuple[tuple, int, float, float]]) -> list[tuple[float, float, bool]]:
        """Queue transfers into device *d* tentatively.

        *items* are ``(key, src_device, ready, duration)`` in key order (the
        inputs of one node); each starts at its FIFO place, after the
        earlier items of this plan on a shared resource.  Returns ``(start,
        end, overtakes)`` per item; nothing is reserved.  (When an item
        overtakes a reserved transfer that precedes a later item, the later
        item's start ignores that delay: the caller re-times its schedule
        after committing such a plan.)

        >>> tl = LinkTimeline(2, "port")
        >>> tl.plan(1, [(fifo_key(0.0, 0, 0, 1), 0, 0.0, 2.0), (fifo_key(1.0, 1, 1, 1), 0, 1.0, 1.0)])
        [(0.0, 2.0, False), (2.0, 3.0, False)]
        """
        out = []
        local: dict[int, float] = {}
        k = self.k
        for key, a, ready, dur in items:
            res = _resources(self.rule, k, a, d)
            s = ready
            pos = []
            for r in res:
                i = bisect_right(self.keys[r], key)
                pos.append(i)
                if i and self.ends[r][i - 1] > s:
                    s = self.ends[r][i - 1]
                f = local.get(r)
                if f is not None and f > s:
                    s = f
            e = s + dur
            over = False
            for r, i in zip(res, pos):
                local[r] = e
                if i < len(self.keys[r]) and self.starts[r][i] < e:
                    over = True
            out.append((s, e, over))
        return out

    def reserve(self, a: int, b: int, key: tuple, start: float, end: float) -> None:
        """Record the transfer at its FIFO place (the times of the others
        are not changed; see :meth:`overtakes`)."""
        for r in _resources(self.rule, self.k, a, b):
            keys = self.keys[r]
            i = bisect_right(keys, key)
            keys.insert(i, key)
            self.starts[r].insert(i, start)
            self.ends[r].insert(i, end)

    def rebuild(self, transfers: Iterable[tuple[int, int, tuple, float, float]]) -> None:
        """Replace the content by *transfers* ``(a, b, key, start, end)``."""
        for lst in (self.keys, self.starts, self.ends):
            for x in lst:
                x.clear()
        for a, b, key, s, e in sorted(transfers, key=lambda x: x[2]):
            for r in _resources(self.rule, self.k, a, b):
                self.keys[r].append(key)
                self.starts[r].append(s)
                self.ends[r].append(e)


class InputArrivals:
    """When the inputs of a node would be on a candidate device, for list
    schedulers that place nodes one by one (DPOS, FD-DPS, m-ETF, HEFT).

    :meth:`ready` gives the time every input tensor of node *v* is on device
    *d*: a producer on *d* delivers at its finish; a tensor already sent to
    *d* arrives when that transfer ends (a tensor crosses to a device once,
    as in the simulator); every other tensor is a new transfer, queued on
    the links (:meth:`LinkState.plan`) in the simulator's FIFO order
    (producer finish, producer index, tensor id) behind the transfers
    reserved so far.  Reservations are made in placement order, so under
    ``channel`` / ``port`` this estimates the simulator's queues (a later
    node's earlier-ready transfer does not overtake them, as it would in the
    simulator); under ``none`` it is exact.  :meth:`commit` keeps the
    transfers of the chosen device.

    Parameters
    ----------
    graph : Graph
    costs : CostModel
        Transfer times (``tensor_comm``).
    rule : {"channel", "port", "none"}

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import CostModel
    >>> nd = lambda i: {"id": i, "compute_s": 1.0, "memory_bytes": 0}
    >>> g = build("j", [nd("a"), nd("b"), nd("c")],
    ...           [{"src": "a", "dst": "c", "bytes": 100}, {"src": "b", "dst": "c", "bytes": 100}])
    >>> ia = InputArrivals(g, CostModel(g, uniform(2, bandwidth=100.0, latency=0.0)))
    >>> ia.ready(2, 1, [1.0, 1.0, 0.0], [0, 0, -1])[0]       # both cross channel 0->1, one after the other
    3.0
    >>> InputArrivals(g, CostModel(g, uniform(2, bandwidth=100.0, latency=0.0)), "none").ready(
    ...     2, 1, [1.0, 1.0, 0.0], [0, 0, -1])[0]
    2.0
    """

    def __init__(self, graph, costs: "CostModel", rule: str = DEFAULT_CONGESTION):
        self.links = LinkState(costs.cluster.k, rule)
        self.free = rule == "none"
        self.tensor_comm = costs.tensor_comm
        self.sent: dict[tuple[int, int], float] = {}
        src, etensor = graph.edge_src, graph.edge_tensor
        self.inputs: list[list[tuple[int, int]]] = []
        for es in graph.in_edges:
            seen: dict[int, int] = {}
            for e in es:
                t = etensor[e]
                if t not in seen:
                    seen[t] = src[e]
            self.inputs.append([(p, t) for t, p in seen.items()])

    def ready(self, v: int, d: int, finish: Sequence[float], device_of: Sequence[int]) -> tuple[float, list]:
        """``(time all inputs of v are on d, plan)``; *plan* is what
        :meth:`commit` reserves if *v* goes to *d*."""
        r = 0.0
        items = []
        sent = self.sent
        comm = self.tensor_comm
        for p, t in self.inputs[v]:
            a = device_of[p]
            fp = finish[p]
            if a == d:
                if fp > r:
                    r = fp
                continue
            got = sent.get((t, d))
            if got is not None:
                if got > r:
                    r = got
                continue
            if self.free:
                x = fp + comm(t, a, d)
                if x > r:
                    r = x
                continue
            items.append((fp, p, t, a))
        if not items:
            return r, []
        items.sort()
        planned = self.links.plan(d, [(fp, a, comm(t, a, d)) for fp, _p, t, a in items])
        plan = []
        for (_fp, _p, t, a), (_a, s, e) in zip(items, planned):
            if e > r:
                r = e
            plan.append((t, a, s, e))
        return r, plan

    def commit(self, d: int, plan: Sequence[tuple[int, int, float, float]]) -> None:
        """Reserve the transfers of a :meth:`ready` plan for device *d*."""
        for t, a, _s, e in plan:
            self.sent[(t, d)] = e
            self.links.reserve(a, d, e)

    def arrival(self, t: int, d: int) -> float | None:
        """When tensor *t* reaches device *d* by a committed transfer (None if not sent)."""
        return self.sent.get((t, d))


__all__ = ["CONGESTION_RULES", "DEFAULT_CONGESTION", "InputArrivals", "LinkState", "LinkTimeline", "check_congestion",
           "fifo_key"]
