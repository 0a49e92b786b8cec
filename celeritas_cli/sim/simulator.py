"""The discrete-event simulator: the one judge of every placement.

Semantics (docs/design.md, "The simulator"):

1. Each device runs one node at a time, non-preemptively, for the node's
   time on that device (:class:`~celeritas_cli.model.costs.CostModel`).
2. A node may start when every input tensor is on its device: an input from
   the same device when its producer finishes, an input from another device
   when its transfer arrives.
3. One transfer per (producer, tensor, destination device).  It becomes ready
   when the producer finishes.  Congestion rule ``channel`` (default): each
   directed channel src-device->dst-device carries one transfer at a time,
   FIFO by ready time, ties by (producer index, tensor id) - Moirai Eq. 8,
   Celeritas 6.1 transfer-as-task.  ``port``: one uplink and one downlink per
   device; a transfer holds both its sender's uplink and its receiver's
   downlink (Moirai's released code).  ``none``: transfers overlap freely
   (classic HEFT model).  Compute and transfers overlap.  Destination devices
   of one tensor are served in device index order.  A multi-hop pair
   (``via``) is one channel with the path's bandwidth and latency; it does
   not occupy the intermediate links.

   3a. Where a cluster's ``hosts`` give a transfer a cost on the devices'
   own time (``send_s`` / ``recv_s``, fitted by ``placer calibrate`` for
   CPU processes, which copy and post every tensor they send and wait for
   every one they receive; zero for every bundled cluster), a node runs for
   its time plus ``a + b * bytes`` of its device's ``send_s`` for each
   transfer it makes (its tensors become ready when that is done) plus the
   device's ``recv_s`` for each received tensor it is the first node on the
   device to read.  A host's ``contention`` multiplies the node times of
   its devices only when two or more of them run nodes of the placement
   (:meth:`~celeritas_cli.model.costs.CostModel.placed_time`).
4. Order on a device: the placement's ``order`` when given, strictly
   followed; otherwise, whenever a device is free, the ready node with the
   largest upward rank computed with this placement's real costs, ties by
   topological index.  All events at one instant are processed before any
   device picks its next node.
5. Memory (:mod:`celeritas_cli.sim.memory`): under the ``time`` rule (the
   default) each device's live memory along the realised schedule -
   resident state for the whole step, an activation from its node's start
   until its last use, a received tensor from its transfer's start until
   its last consumer there finishes - and its peak; under ``static`` (the
   seed papers' rule, and the rule for a graph that declares no
   ``resident_bytes``) the per-device sum of ``memory_bytes``.  A device
   whose peak is over capacity makes the status ``OOM`` (reported, not an
   error).  A placement that splits a colocation group is invalid
   (:class:`~celeritas_cli.errors.ColocationError`).
6. Collectives (a derived graph's ``collective.*`` nodes, one per rank
   of a group; docs/design.md, "Collectives"): each device has a
   collective stream besides its compute slot, as NCCL runs on its own
   CUDA stream.  A collective is issued on its rank when its inputs are on
   the device (DDP issues a bucket's all-reduce when the bucket is ready,
   Megatron-LM its all-reduces inline, FSDP its gathers in its issue chain)
   and a stream runs what it was issued first in, first out (ties by the
   node's ``seq``); all members of a group start together, at the first
   instant every member was issued and is at the head of its free stream
   (ranks that issue in different orders hang, as NCCL does: an error), and
   run for
   :meth:`~celeritas_cli.model.costs.CostModel.collective_time` of the
   group's devices.  A collective does not hold the compute slot or a
   point-to-point channel (its traffic is in its formula).
7. The report (``placer.report/v1``, :mod:`celeritas_cli.sim.report`)
   carries the makespan, per-device busy
   time, utilisation and memory, per-link busy time and bytes, transfer
   totals, OOM devices, the critical path of the realised schedule (walking
   back from the last node through whichever of "the device's previous node"
   or "the latest-arriving input's producer" let each node start), and the
   lower bound LB = max(longest path with zero communication and each node
   at its fastest device, total work / devices) where total work is
   Σ fastest time / k, or Σ compute_s / Σ speed when no node has per-type
   times (a tighter bound, valid because then time = compute_s / speed).
   Next to it, ``lower_bounds`` lists every bound of
   :mod:`celeritas_cli.sim.bounds` with what it holds for (the memory-cut
   bound adds the communication memory forces), and
   ``tight_lower_bound_s`` / ``makespan_over_tight_lb`` use the tightest one
   that holds for this placement.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import ColocationError, InvalidInput
from ..model.clock import CHECK_EVERY, check_time
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from ..transform.derivation import rebuild
from .bounds import lower_bounds
from .links import CONGESTION_RULES, DEFAULT_CONGESTION, LinkState, check_congestion
from .memory import DEFAULT_RULE, RULES as MEMORY_RULES, check_rule
from .report import REPORT_SCHEMA, build_report, critical_path

__all__ = ["CONGESTION_RULES", "MEMORY_RULES", "REPORT_SCHEMA", "Schedule", "Transfer", "build_report",
           "check_colocation", "critical_path", "lower_bound", "makespan_of", "run_schedule", "simulate"]


@dataclass(slots=True)
class Transfer:
    tensor: int
    src_dev: int
    dst_dev: int
    ready: float
    start: float
    end: float
    nbytes: int


@dataclass
class Schedule:
    """The realised schedule: per-node start/finish, the transfers, and for
    each node the node that let it start (``binding[v]``, -1 for none).
    ``graph`` is the graph that was simulated (a placement's split graph when
    it carries one), which node indices refer to.  ``node_time[v][d]`` is
    the time node *v* ran for on device *d* (the placement's
    :meth:`~celeritas_cli.model.costs.CostModel.placed_time`), ``overhead[d]``
    device *d*'s time spent on transfers besides its nodes' times (rule 3a)."""

    device_of: list[int]
    start: list[float]
    finish: list[float]
    transfers: list[Transfer]
    binding: list[int]
    makespan: float
    device_order: list[list[int]] = field(default_factory=list)
    graph: Graph | None = None
    overhead: list[float] = field(default_factory=list)
    node_time: list[list[float]] = field(default_factory=list)


def check_colocation(graph: Graph, cluster: Cluster, device_of: Sequence[int], label: str) -> None:
    for group, nodes in graph.colocation_groups().items():
        first = device_of[nodes[0]]
        for v in nodes[1:]:
            if device_of[v] != first:
                raise ColocationError(
                    f"{label}: colocation group '{group}' is split: node '{graph.ids[nodes[0]]}' on "
                    f"{cluster.ids[first]}, node '{graph.ids[v]}' on {cluster.ids[device_of[v]]}")


def run_schedule(graph: Graph, cluster: Cluster, device_of: Sequence[int],
                 order: Sequence[Sequence[int]] | None = None, *, congestion: str = DEFAULT_CONGESTION,
                 costs: CostModel | None = None, label: str = "placement",
                 groups: dict[str, Sequence[int]] | None = None) -> Schedule:
    """Simulate *graph* on *cluster* with ``device_of[v]`` and optional strict
    per-device ``order`` (node indices); see the module docstring.

    This index-level entry point is what algorithms use to score candidate
    placements; :func:`simulate` wraps it for placement files.  Link
    occupancy is :class:`~celeritas_cli.sim.links.LinkState` (transfers are
    issued in the FIFO order of :func:`~celeritas_cli.sim.links.fifo_key`).
    The steps: the order rule of a device (rule 4: :func:`_strict_order` or
    :func:`_rank_order`), then the event loop (rules 1-3:
    :func:`_event_loop`).

    With an *order*, ``device_of[v] = -1`` marks a node that is not placed
    yet: it does not run, and no transfer is made for it (a list scheduler
    re-timing the part of the graph it has placed, e.g. Adjusting
    Placement; the placed nodes must be closed under predecessors).  Its
    ``start`` / ``finish`` stay NaN.

    *groups* maps a collective group's name to the devices of the whole
    group where *graph* holds only some of its ranks (the symmetric judge,
    :mod:`~celeritas_cli.sim.symmetric`: one rank of each kind stands for
    the others; default: ``graph.meta["collective_devices"]``, device
    indices, which the symmetric judge's graphs carry in memory); else a
    group is the devices of its nodes.

    Raises
    ------
    InvalidInput
        Unknown congestion rule, a strict order that cannot be followed (it
        deadlocks against the graph's dependencies), or collectives whose
        members disagree or whose issue orders deadlock.
    """
    check_congestion(congestion)
    costs = cost_model(graph, cluster, costs)
    dev = list(device_of)
    if groups is None and isinstance(graph.meta.get("collective_devices"), dict):  # a symmetric judge's graph
        groups = graph.meta["collective_devices"]
    coll = _Collectives.of(graph, dev, costs, groups, label)
    if order is not None:
        if coll is not None:
            order = [[v for v in q if coll.member[v] < 0] for q in order]
        rule = _strict_order(graph.n, order, dev)
        if coll is not None:
            rule.n_run += coll.n_run
    else:
        rule = _rank_order(graph, costs, dev, cluster.k)
    sched, done = _event_loop(graph, costs, dev, cluster.k, LinkState(cluster.k, congestion).send, rule, cluster,
                              coll)
    if done != rule.n_run:
        if coll is not None and coll.stuck():
            raise InvalidInput(f"{label}: {coll.stuck()}")
        raise InvalidInput(_deadlock_message(graph, cluster, dev, rule.queues, rule.ptr, sched.finish, label))
    if rule.n_run == graph.n:
        sched.makespan = max(sched.finish, default=0.0)
    else:  # a partial placement: unplaced nodes keep NaN
        sched.makespan = max((f for f in sched.finish if f == f), default=0.0)
    return sched


@dataclass(slots=True)
class _OrderRule:
    """Rule 4, which ready node a free device runs: ``ready(v)`` is told
    that all of v's inputs are on its device; ``take(d)`` returns the node
    device ``d`` starts now, or -1, and is only asked when ``pending[d]`` is
    truthy (false means nothing for ``d``: the hot loop skips the call).
    ``n_run`` is how many nodes run; ``queues`` / ``ptr`` (strict orders
    only) say where a deadlock is."""

    ready: Callable[[int], None]
    take: Callable[[int], int]
    pending: list
    n_run: int
    queues: list[list[int]] | None = None
    ptr: list[int] | None = None


def _strict_order(n: int, order: Sequence[Sequence[int]], dev: Sequence[int]) -> _OrderRule:
    """Rule 4 with an order: each device runs its queue strictly in turn."""
    queues = [list(seq) for seq in order]
    ptr = [0] * len(queues)
    ready_flag = [False] * n
    pending = [True] * len(queues)  # false once the head of the queue was found waiting

    def ready(v: int) -> None:
        ready_flag[v] = True
        pending[dev[v]] = True

    def take(d: int) -> int:
        q = queues[d]
        i = ptr[d]
        if i >= len(q) or not ready_flag[q[i]]:
            pending[d] = False
            return -1
        ptr[d] = i + 1
        return q[i]

    return _OrderRule(ready, take, pending, sum(len(q) for q in queues), queues, ptr)


def _rank_order(graph: Graph, costs: CostModel, dev: Sequence[int], k: int) -> _OrderRule:
    """Rule 4 without an order: the ready node of largest upward rank with
    this placement's costs (:func:`_placement_rank`), ties by topological
    index, from one heap per device."""
    rank = _placement_rank(graph, costs, dev)
    topo_idx = graph.topo_index()
    heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(k)]
    push, pop = heapq.heappush, heapq.heappop

    def ready(v: int) -> None:
        push(heaps[dev[v]], (-rank[v], topo_idx[v], v))

    def take(d: int) -> int:
        return pop(heaps[d])[2]

    return _OrderRule(ready, take, heaps, graph.n)


def _event_loop(graph: Graph, costs: CostModel, dev: list[int], k: int, send: Callable, rule: _OrderRule,
                cluster: Cluster, coll: "_Collectives | None" = None) -> tuple[Schedule, int]:
    """Rules 1-3a and 6 as a discrete-event loop; returns the schedule
    (makespan not yet set) and how many nodes ran.  Events are ``(time,
    kind, a, b)`` with kind 0 = tensor ``a`` arrives on device ``b``, 1 =
    node ``a`` finishes on device ``b`` (on its compute slot or, for a
    collective, its stream); all events of one instant are processed
    (finishes in node order, each sending its tensors) before the
    collectives that can start do and any free device takes its next
    node."""
    n = graph.n
    time, tensor_comm = costs.placed_time(dev), costs.tensor_comm
    tensor_src, tensor_bytes = graph.tensor_src, graph.tensor_bytes
    cons, out_tensors, need = _dependency_counts(graph)
    extra = _TransferCosts(graph, cluster, dev, cons, out_tensors) if cluster.transfer_costs else None
    overhead = [0.0] * k
    ready, take, pending = rule.ready, rule.take, rule.pending
    start, finish, binding = [math.nan] * n, [math.nan] * n, [-1] * n
    last_in_time, last_in_src = [0.0] * n, [-1] * n  # the latest input's arrival and producer
    running, dev_free, dev_last = [-1] * k, [0.0] * k, [-1] * k
    device_order: list[list[int]] = [[] for _ in range(k)]
    transfers: list[Transfer] = []
    events: list[tuple[float, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop

    member = coll.member if coll is not None else None

    def make_ready(v: int, t: float, src: int) -> None:  # one input of v is on v's device at t
        if t >= last_in_time[v]:
            last_in_time[v] = t
            last_in_src[v] = src
        need[v] -= 1
        if need[v] == 0:
            if member is not None and member[v] >= 0:
                coll.ready(v, t)
            else:
                ready(v)

    for v in range(n):
        if need[v] == 0:
            need[v] = 1
            make_ready(v, 0.0, -1)
    now, done, steps = 0.0, 0, 0
    while True:
        steps += 1
        if steps % CHECK_EVERY == 1:  # the registry's time cap (model/clock.py): at the start, then a few ms apart
            check_time()
        if coll is not None and coll.candidates:  # rule 6: the groups whose every member can start now
            for v, dur, b in coll.launch(last_in_time, last_in_src):
                start[v] = now
                finish[v] = now + dur
                binding[v] = b
                device_order[dev[v]].append(v)
                push(events, (finish[v], 1, v, dev[v]))
        for d in range(k):  # dispatch on every idle device
            if running[d] != -1 or not pending[d]:
                continue
            v = take(d)
            if v < 0:
                continue
            start[v] = now
            dur = time[v][d]
            if extra is not None:
                x = extra.of(v, d)
                dur += x
                overhead[d] += x
            finish[v] = now + dur
            if dev_last[d] != -1 and dev_free[d] >= last_in_time[v] and dev_free[d] == now:
                binding[v] = dev_last[d]  # the device was the last thing it waited for
            else:
                binding[v] = last_in_src[v]
            running[d] = v
            device_order[d].append(v)
            push(events, (finish[v], 1, v, d))
        if not events:
            break
        now = events[0][0]
        batch_fin: list[int] = []
        while events and events[0][0] == now:
            _, kind, a, b = pop(events)
            if kind == 1:
                batch_fin.append(a)
            else:  # arrival of tensor a on device b
                p = tensor_src[a]
                for c in cons[a]:
                    if dev[c] == b:
                        make_ready(c, now, p)
        batch_fin.sort()
        for p in batch_fin:
            a = dev[p]
            if member is not None and member[p] >= 0:
                coll.finished(p, now)
            else:
                running[a] = -1
                dev_free[a] = now
                dev_last[a] = p
            done += 1
            for t in out_tensors[p]:  # local consumers now, one transfer per remote device
                remote: list[int] = []
                for c in cons[t]:
                    dc = dev[c]
                    if dc == a:
                        make_ready(c, now, p)
                    elif dc >= 0 and dc not in remote:
                        remote.append(dc)
                if remote:
                    remote.sort()
                    for b in remote:
                        dur = tensor_comm(t, a, b)
                        s = send(a, b, now, dur)
                        transfers.append(Transfer(t, a, b, now, s, s + dur, tensor_bytes[t]))
                        push(events, (s + dur, 0, t, b))
    return Schedule(device_of=dev, start=start, finish=finish, transfers=transfers, binding=binding,
                    makespan=math.nan, device_order=device_order, graph=graph, overhead=overhead,
                    node_time=time), done


class _Collectives:
    """Rule 6: every device's collective stream.  ``member[v]`` is the
    index of node *v*'s group (-1: not a collective, or not placed);
    ``ready(v, t)`` is told that all of v's inputs are on its device at
    *t* (the collective is issued then), ``launch(...)`` yields ``(node,
    duration, binding)`` for every member of every group that can start
    now, ``finished(v, now)`` frees v's stream.  A stream runs its issued
    collectives first in, first out (ties by ``seq``, then group); ranks of
    one group placed on one device (a placer that put two replicas
    together) are reduced there first, at no cost, and take the device's
    stream once: the collective runs over the distinct devices."""

    def __init__(self, n: int) -> None:
        self.member = [-1] * n
        self.members: list[list[int]] = []
        self.duration: list[float] = []
        self.names: list[str] = []
        self.seq: list[int] = []
        self.issued: dict[int, list[tuple[float, int, int]]] = {}  # device -> heap (issued at, seq, group)
        self.on: dict[int, set[int]] = {}       # device -> groups in its heap
        self.busy: dict[int, int] = {}          # device -> the group running on its stream, -1 none
        self.last: dict[int, int] = {}          # device -> a node of the last group its stream ran
        self.free: dict[int, float] = {}        # device -> when its stream became free
        self.is_ready = [False] * n
        self.started = [False] * n
        self.candidates: set[int] = set()
        self.n_run = 0

    @classmethod
    def of(cls, graph: Graph, dev: Sequence[int], costs: CostModel, groups: dict | None,
           label: str) -> "_Collectives | None":
        """The collective streams of *graph* placed by *dev*; None when it has no collective."""
        extra = graph.node_extra
        if not extra:
            return None
        found: dict[str, list[int]] = {}
        for v, ex in enumerate(extra):
            if ex and "collective" in ex and dev[v] >= 0:
                c = ex["collective"]
                found.setdefault(c.get("group") if isinstance(c, dict) else None, []).append(v)
        if not found:
            return None
        self = cls(graph.n)
        cache: dict[tuple, float] = {}
        for g, (name, nodes) in enumerate(sorted(found.items(), key=lambda x: str(x[0]))):
            head = extra[nodes[0]]["collective"]
            kind, nbytes, seq, ranks = (head.get(x) for x in ("kind", "bytes", "seq", "ranks"))
            where = f"{label}: collective '{graph.ids[nodes[0]]}'"
            if not isinstance(name, str) or not isinstance(seq, int) or not isinstance(ranks, int) \
                    or not isinstance(nbytes, int) or nbytes < 0:
                raise InvalidInput(f"{where}: a collective needs a string 'group', integer 'seq', 'ranks' and "
                                   f"'bytes' >= 0")
            for v in nodes[1:]:
                c = extra[v]["collective"]
                if (c.get("kind"), c.get("bytes"), c.get("seq"), c.get("ranks")) != (kind, nbytes, seq, ranks):
                    raise InvalidInput(f"{label}: collective group '{name}': node '{graph.ids[v]}' disagrees with "
                                       f"'{graph.ids[nodes[0]]}' on kind, bytes, seq or ranks")
            whole = list(groups[name]) if groups is not None and name in groups else [dev[v] for v in nodes]
            if len(whole) != ranks:
                raise InvalidInput(f"{label}: collective group '{name}' has {len(whole)} ranks, its nodes say "
                                   f"{ranks}")
            key = (tuple(sorted(set(whole))), kind, nbytes)
            if key not in cache:
                cache[key] = costs.collective_time(list(key[0]), kind, nbytes)
            self.names.append(name)
            self.members.append(nodes)
            self.duration.append(cache[key])
            self.seq.append(seq)
            for v in nodes:
                self.member[v] = g
                d = dev[v]
                if d not in self.busy:
                    self.issued[d], self.on[d], self.busy[d], self.last[d], self.free[d] = [], set(), -1, -1, 0.0
            self.n_run += len(nodes)
        self.dev = dev
        return self

    def ready(self, v: int, t: float) -> None:
        self.is_ready[v] = True
        g, d = self.member[v], self.dev[v]
        if g not in self.on[d]:
            self.on[d].add(g)
            heapq.heappush(self.issued[d], (t, self.seq[g], g))
        self.candidates.add(g)

    def _can_start(self, g: int) -> bool:
        for v in self.members[g]:
            d = self.dev[v]
            if not self.is_ready[v] or self.busy[d] != -1 or self.issued[d][0][2] != g:
                return False
        return True

    def launch(self, last_in_time: list[float], last_in_src: list[int]):
        """Members of the groups that start now, in group then node order."""
        out = []
        for g in sorted(self.candidates):
            if not self._can_start(g):
                continue
            nodes = self.members[g]
            # what let the group start: the member whose input came last, or a stream's previous collective
            late = max(nodes, key=lambda v: (last_in_time[v], -v))
            t_in = last_in_time[late]
            slow = max(nodes, key=lambda v: (self.free[self.dev[v]], -v))
            b = self.last[self.dev[slow]] if self.free[self.dev[slow]] > t_in else last_in_src[late]
            for v in nodes:
                d = self.dev[v]
                if self.busy[d] != g:
                    self.busy[d] = g
                    heapq.heappop(self.issued[d])
                    self.on[d].discard(g)
                self.started[v] = True
                out.append((v, self.duration[g], b))
        self.candidates.clear()
        return out

    def finished(self, v: int, now: float) -> None:
        d = self.dev[v]
        if self.busy[d] != self.member[v]:
            return  # another rank of the group on this device freed the stream at this instant
        self.busy[d] = -1
        self.last[d] = v
        self.free[d] = now
        if self.issued[d]:
            self.candidates.add(self.issued[d][0][2])

    def stuck(self) -> str:
        """Why the streams stopped, when they did: ranks that issue collectives in different orders
        (NCCL would hang too), or a collective whose inputs never come."""
        for d, heap in self.issued.items():
            if heap:
                g = heap[0][2]
                other = next((u for u in self.members[g] if self.is_ready[u] and self.issued[self.dev[u]]
                              and self.issued[self.dev[u]][0][2] != g), None)
                if other is not None:
                    h = self.issued[self.dev[other]][0][2]
                    return (f"collective group '{self.names[g]}' never starts: its ranks issued it in another order "
                            f"than group '{self.names[h]}' (a rank runs its collectives in the order it issues "
                            f"them, as NCCL does; with different orders the ranks wait for each other)")
                return (f"collective group '{self.names[g]}' never starts: one of its ranks never issues it (its "
                        f"inputs wait for a collective issued after it)")
        return ""


class _TransferCosts:
    """Rule 3a: what node *v* on device *d* spends on transfers besides its
    time - the device's ``send_s`` line for each transfer it makes (one per
    tensor and remote device reading it, as rule 3 sends them) and its
    ``recv_s`` line for each tensor from another device it is the first
    node on *d* to read."""

    def __init__(self, graph: Graph, cluster: Cluster, dev: Sequence[int], cons, out_tensors):
        self.send, self.recv, self.dev = cluster.send_cost, cluster.recv_cost, dev
        self.nbytes, self.src, self.out, self.cons = graph.tensor_bytes, graph.tensor_src, out_tensors, cons
        self.in_edges, self.edge_tensor = graph.in_edges, graph.edge_tensor
        self.paid: set[int] = set()
        self.k = cluster.k

    def of(self, v: int, d: int) -> float:
        dev, nbytes = self.dev, self.nbytes
        x = 0.0
        a, b = self.recv[d]
        if a or b:
            for e in self.in_edges[v]:
                t = self.edge_tensor[e]
                key = t * self.k + d
                if dev[self.src[t]] != d and key not in self.paid:
                    self.paid.add(key)
                    x += a + b * nbytes[t]
        a, b = self.send[d]
        if a or b:
            for t in self.out[v]:
                remote = {dev[c] for c in self.cons[t]} - {d, -1}
                x += len(remote) * (a + b * nbytes[t])
        return x


def _dependency_counts(graph: Graph) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``(consumers of each tensor, tensors of each producer, inputs each
    node waits for)``; an input is one (tensor, consumer) pair."""
    cons = graph.tensor_consumers()
    out_tensors: list[list[int]] = [[] for _ in range(graph.n)]
    need = [0] * graph.n
    for t, p in enumerate(graph.tensor_src):
        out_tensors[p].append(t)
        for c in cons[t]:
            need[c] += 1
    return cons, out_tensors, need


def _placement_rank(graph: Graph, costs: CostModel, dev: Sequence[int]) -> list[float]:
    """Upward rank with this placement's real costs (rule 4's priority):
    ``rank(v) = time(v, dev v) + max over out-edges e=(v, c) of comm(e) + rank(c)``
    (:func:`~celeritas_cli.model.costs.upward_rank` with the loop inlined:
    this is the simulator's hot path)."""
    rank = [0.0] * graph.n
    out_edges, e_dst, time, comm = graph.out_edges, graph.edge_dst, costs.time, costs.comm
    for v in reversed(graph.topo_order()):
        dv = dev[v]
        best = 0.0
        for e in out_edges[v]:
            c = e_dst[e]
            dc = dev[c]
            r = rank[c] if dc == dv else comm(e, dv, dc) + rank[c]
            if r > best:
                best = r
        rank[v] = time[v][dv] + best
    return rank


def _deadlock_message(graph, cluster, dev, queue_of, ptr, finish, label) -> str:
    if queue_of is None:  # cannot happen for a DAG
        return f"{label}: simulation stalled"
    for d, q in enumerate(queue_of):
        if ptr[d] < len(q):
            v = q[ptr[d]]
            waiting = [p for p in graph.pred[v] if math.isnan(finish[p])]
            if waiting:
                p = waiting[0]
                return (f"{label}: order of {cluster.ids[d]} cannot be followed: node '{graph.ids[v]}' needs "
                        f"'{graph.ids[p]}' (on {cluster.ids[dev[p]]}), which is ordered after a node that waits "
                        f"for it; the per-device orders contradict the graph's dependencies")
    return f"{label}: the per-device orders deadlock"


def lower_bound(graph: Graph, cluster: Cluster, costs: CostModel | None = None) -> float:
    """LB = max(critical path with zero communication at fastest devices,
    total work / devices) - see the module docstring."""
    costs = cost_model(graph, cluster, costs)
    if graph.n == 0:
        return 0.0
    fastest = costs.fastest_time
    top = [0.0] * graph.n
    for v in graph.topo_order():
        best = 0.0
        for p in graph.pred[v]:
            if top[p] > best:
                best = top[p]
        top[v] = best + fastest[v]
    cp = max(top)
    work = math.fsum(fastest) / cluster.k
    if not any(graph.compute_by_type):
        work = max(work, math.fsum(graph.compute) / sum(d.speed for d in cluster.devices))
    return max(cp, work)


def simulate(graph: Graph, cluster: Cluster, placement: Placement, *, congestion: str = DEFAULT_CONGESTION,
             label: str = "placement", schedule_out: list | None = None,
             costs: CostModel | None = None, memory: str = DEFAULT_RULE, full: bool = False) -> dict:
    """Simulate *placement* of *graph* on *cluster* and return the
    ``placer.report/v1`` document (see the module docstring).

    *graph* may be the original graph or a coarse graph of it.  When the
    placement was made on a derived graph (FastT / FD-DPS operation
    splitting, data parallelism: ``derivation`` and ``split_graph``), the
    derived graph is rebuilt from *graph* and the recipe and simulated; a
    carried ``split_graph`` that differs from it is rejected
    (:func:`~celeritas_cli.transform.derivation.rebuild`).  When
    *schedule_out* is a list, the :class:`Schedule` is appended to it (for
    ``--gantt`` / ``--trace``).  *costs* is the cost model to judge under
    (default: the file's costs; re-bound to a split graph when there is one).
    *memory* is the memory rule, ``"time"`` (default) or ``"static"``
    (:mod:`~celeritas_cli.sim.memory`; a graph that declares no
    ``resident_bytes`` is judged by the static rule and the report says so).
    A placement that lists its replicas' devices (``replicas``) is judged
    one replica of each kind at a time when its replicas run alike
    (:mod:`~celeritas_cli.sim.symmetric`), else - or with *full* - every
    replica is simulated.

    Raises
    ------
    InvalidInput
        The placement misses or invents nodes, names unknown devices, or its
        order cannot be followed; its ``split_graph`` does not derive from
        *graph* by its ``derivation``; an unknown memory rule.
    ColocationError
        A colocation group is split across devices.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> c = uniform(2, bandwidth=100.0, latency=0.0)
    >>> p = Placement("ab", c.name, "given", {"a": "gpu0", "b": "gpu1"})
    >>> r = simulate(g, c, p)
    >>> r["makespan_s"], r["memory_rule"]
    (4.0, 'static')
    """
    check_rule(memory)
    placement.check_graph(graph, label)
    given = graph  # bounds of a derived placement say which graph they hold for (sim/bounds.py)
    judged = None
    if placement.replicas is not None:
        from . import symmetric  # a layer above this module's event loop

        prepared = symmetric.prepare(graph, cluster, placement, label)
        why = "asked (--full-sim)" if full else symmetric.asymmetry(cluster, *prepared[:2])
        if why is None:
            judged = symmetric.judge(graph, cluster, placement, label, prepared)
        else:
            if not full:
                from ..log import warn

                warn(f"{label}: every replica simulated: {why}")
            placement = symmetric.expand(graph, cluster, placement, label)
    if judged is not None:
        graph = judged.graph
        device_of, order = judged.device_of, judged.order
    elif placement.split_graph is not None or placement.derivation is not None:
        graph = rebuild(graph, placement.derivation, placement.split_graph, label, devices=cluster.k,
                        cluster=cluster.name)
    if judged is None:
        device_of, order = placement.resolve(graph, cluster, label)
    check_colocation(graph, cluster, device_of, label)
    costs = cost_model(graph, cluster, costs)
    sched = run_schedule(graph, cluster, device_of, order, congestion=congestion, costs=costs, label=label,
                         groups=judged.groups if judged is not None else None)
    if schedule_out is not None:
        schedule_out.append(sched)
    bounds = lower_bounds(graph, cluster, costs, given=given, derivation=placement.derivation)
    report = build_report(graph, cluster, placement, sched, costs, congestion, bounds, given=given, memory=memory)
    if judged is not None:
        from .symmetric import expand_report

        report = expand_report(report, cluster, judged)
    return report


def makespan_of(graph: Graph, cluster: Cluster, device_of: Sequence[int],
                order: Sequence[Sequence[int]] | None = None, *, congestion: str = DEFAULT_CONGESTION,
                costs: CostModel | None = None) -> float:
    """Simulated makespan of an index-level placement (for algorithms that
    score candidates, e.g. OS-DPOS, the Hierarchical Planner)."""
    return run_schedule(graph, cluster, device_of, order, congestion=congestion, costs=costs).makespan
