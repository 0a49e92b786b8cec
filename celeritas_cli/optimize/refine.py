"""Simulator-in-the-loop refinement: move and swap units along the realised
critical path, level by level (coarse units first, then their members).

This is the uncoarsening phase of a multilevel partitioner (Karypis & Kumar
1998, section 3.3: project the partition one level down, then refine it
with local moves), with two changes: the objective is the simulated
``(bytes over memory, makespan)`` of the ORIGINAL graph
(:class:`~celeritas_cli.optimize.evaluator.Evaluator`), not the edge cut;
and moves are not tried for every boundary unit but proposed where the
makespan is decided, on the realised critical path of the current schedule
(:func:`~celeritas_cli.sim.simulator.critical_path`, ``Schedule.binding``):

* a critical node ``v`` that waited ``w`` for a transfer from ``p`` on
  another device proposes moving ``v``'s unit to ``p``'s device and ``p``'s
  unit to ``v``'s device (the transfer disappears);
* a critical node that was ready but waited ``w`` for its device (``p`` ran
  before it there) proposes moving its unit, or ``p``'s, to each other device;
* while some device is over its memory, units on it propose moving to
  devices with room (memory repair);
* a move that would overflow the target device is replaced by a swap with
  the smallest-work unit on that device that frees enough memory.

Each proposal's promise is ``w`` minus the transfer time its unit's other
boundary edges would add (:func:`comm_delta`, METIS' gain in seconds); the
most promising are simulated first, at most :data:`TRIES` per round, and
the first that strictly improves is accepted (first improvement).  Then
the critical path is recomputed and the next round starts, until a round
finds nothing; then the next finer level.  Moves never make a feasible
placement infeasible, nor an infeasible one more so.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

from ..sim.simulator import Schedule, critical_path
from .evaluator import Evaluator, Score
from .levels import Level

#: proposals simulated per round at most, before the level counts as refined
TRIES = 16
#: successive levels used are at least this factor apart in size
LEVEL_STEP = 1.8


@dataclass
class State:
    """The incumbent: assignment, per-device memory, score and schedule, and
    in *order mode* the strict per-device order the simulator follows
    (``order``; None: the simulator's own rank order)."""

    dev: list[int]
    load: list[int]
    score: Score
    sched: Schedule
    order: list[list[int]] | None = None
    _seq: list[int] | None = None

    def sequence(self, graph) -> list[int]:
        """All nodes by realised start time, ties by topological index: a
        topological order, so per-device subsequences never deadlock."""
        if self._seq is None:
            start, topo = self.sched.start, graph.topo_index()
            self._seq = sorted(range(graph.n), key=lambda v: (start[v], topo[v]))
        return self._seq


def reorder(graph, state: State, new_dev: list[int], k: int) -> list[list[int]]:
    """Order mode: each device runs its nodes in the order they started in
    the incumbent's schedule (moved nodes where they started before)."""
    order: list[list[int]] = [[] for _ in range(k)]
    for v in state.sequence(graph):
        order[new_dev[v]].append(v)
    return order


Move = tuple[tuple[int, int], ...]  # ((unit, device), ...)


def comm_delta(ev: Evaluator, level: Level, dev: list[int], u: int, d: int) -> float:
    """Change of the summed transfer time over unit *u*'s boundary edges if
    *u* moved to device *d* (positive: more communication)."""
    g, comm, uo = ev.graph, ev.costs.comm, level.unit_of
    src, dst = g.edge_src, g.edge_dst
    delta = 0.0
    for e in level.boundary[u]:
        a, b = dev[src[e]], dev[dst[e]]
        before = comm(e, a, b) if a != b else 0.0
        if uo[src[e]] == u:
            after = comm(e, d, b) if d != b else 0.0
        else:
            after = comm(e, a, d) if a != d else 0.0
        delta += after - before
    return delta


def _ready_times(ev: Evaluator, state: State, path: list[int]) -> dict[int, float]:
    g, sched, dev = ev.graph, state.sched, state.dev
    arrival: dict[tuple[int, int], float] = {}
    for tr in sched.transfers:
        arrival[(tr.tensor, tr.dst_dev)] = tr.end
    ready = {}
    for v in path:
        r = 0.0
        for e in g.in_edges[v]:
            p = g.edge_src[e]
            t = sched.finish[p] if dev[p] == dev[v] else arrival.get((g.edge_tensor[e], dev[v]), sched.finish[p])
            if t > r:
                r = t
        ready[v] = r
    return ready


def unit_devices(level: Level, dev: list[int]) -> list[int]:
    """Device of each unit, -1 for a unit spread over several."""
    out = [dev[mb[0]] for mb in level.members]
    for u, mb in enumerate(level.members):
        d = out[u]
        for v in mb:
            if dev[v] != d:
                out[u] = -1
                break
    return out


def _repair_moves(ev: Evaluator, level: Level, state: State, udev: list[int], add) -> None:
    """Memory repair: units on over-full devices to devices with room."""
    k, cap, load = ev.cluster.k, ev.capacity, state.load
    for s in range(k):
        over = load[s] - cap[s]
        if over <= 0:
            continue
        units = sorted((u for u in range(level.size) if udev[u] == s and level.mem[u] > 0),
                       key=lambda u: (-min(level.mem[u], over), u))[:4 * TRIES]
        for u in units:
            for d in range(k):
                if d != s and load[d] + level.mem[u] <= cap[d]:
                    add(1e9 - comm_delta(ev, level, state.dev, u, d), ((u, d),))


def propose(ev: Evaluator, level: Level, state: State) -> list[tuple[float, Move]]:
    """Candidate moves, most promising first (module docstring)."""
    g, sched, dev, k = ev.graph, state.sched, state.dev, ev.cluster.k
    path = critical_path(g, sched)
    ready = _ready_times(ev, state, path)
    unit_of = level.unit_of
    promise: dict[Move, float] = {}
    delta_cache: dict[tuple[int, int], float] = {}

    def delta(u: int, d: int) -> float:
        key = (u, d)
        if key not in delta_cache:
            delta_cache[key] = comm_delta(ev, level, dev, u, d)
        return delta_cache[key]

    def add(w: float, move: Move) -> None:
        if w > promise.get(move, -float("inf")):
            promise[move] = w

    if state.score.overflow:
        _repair_moves(ev, level, state, unit_devices(level, dev), add)
    for i in range(1, len(path)):
        p, v = path[i - 1], path[i]
        up, uv = unit_of[p], unit_of[v]
        if dev[p] != dev[v]:
            w = sched.start[v] - sched.finish[p]
            add(w - max(0.0, delta(uv, dev[p]) + w), ((uv, dev[p]),))
            add(w - max(0.0, delta(up, dev[v]) + w), ((up, dev[v]),))
        else:
            w = sched.start[v] - ready[v]
            if w <= 0:
                continue
            for d in range(k):
                if d != dev[v]:
                    add(w - delta(uv, d), ((uv, d),))
                    add(0.5 * w - delta(up, d), ((up, d),))
    ranked = sorted(promise.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(w, m) for m, w in ranked]


def _delta_load(ev: Evaluator, level: Level, dev: list[int], move: Move) -> list[int]:
    delta = [0] * ev.cluster.k
    mem = ev.graph.memory
    for u, d in move:
        for v in level.members[u]:
            if dev[v] != d:
                delta[dev[v]] -= mem[v]
                delta[d] += mem[v]
    return delta


class _Swaps:
    """Swap partners: per device, the units wholly on it sorted by memory."""

    def __init__(self, ev: Evaluator, level: Level, state: State):
        self.udev = unit_devices(level, state.dev)
        time = ev.costs.time
        self.by_dev: list[list[tuple[int, float, int]]] = [[] for _ in range(ev.cluster.k)]
        for u, d in enumerate(self.udev):
            if d >= 0:
                work = sum(time[v][d] for v in level.members[u])
                self.by_dev[d].append((level.mem[u], work, u))
        for lst in self.by_dev:
            lst.sort()
        self.keys = [[m for m, _, _ in lst] for lst in self.by_dev]

    def partner(self, u: int, d: int, need: int, scan: int = 8) -> int:
        """A unit on *d* with memory >= *need* and the least work (of the
        *scan* smallest such), -1 if none."""
        lst = self.by_dev[d]
        i = bisect_left(self.keys[d], need)
        best, best_key = -1, None
        for m, work, w in lst[i:i + scan]:
            if w != u and (best_key is None or (work, w) < best_key):
                best, best_key = w, (work, w)
        return best


def _keeps_memory(ev: Evaluator, state: State, new: list[int]) -> bool:
    """The move does not add bytes over the static sums (a cheap filter before
    simulating; the judge's own rule then decides, in the score)."""
    return ev.overflow(new) <= ev.overflow(state.load)


def _feasible_move(ev: Evaluator, level: Level, state: State, move: Move, swaps: _Swaps) -> Move | None:
    """*move*, or a swap replacing it when it would overflow a device; None
    when neither keeps the memory state."""
    new = [a + b for a, b in zip(state.load, _delta_load(ev, level, state.dev, move))]
    if _keeps_memory(ev, state, new):
        return move
    u, d = move[0]
    src = swaps.udev[u]
    if len(move) != 1 or src < 0:
        return None
    w = swaps.partner(u, d, new[d] - ev.capacity[d])
    if w < 0:
        return None
    swap = ((u, d), (w, src))
    new = [a + b for a, b in zip(state.load, _delta_load(ev, level, state.dev, swap))]
    return swap if _keeps_memory(ev, state, new) else None


def apply(level: Level, dev: list[int], move: Move) -> list[int]:
    """The assignment *dev* with *move* made."""
    out = list(dev)
    for u, d in move:
        for v in level.members[u]:
            out[v] = d
    return out


def refine_level(ev: Evaluator, level: Level, state: State,
                 on_accept: Callable[[State], bool] | None = None) -> tuple[State, bool]:
    """First-improvement local search over *level*'s units (module
    docstring); stops when a round improves nothing, the budget is spent, or
    *on_accept* (called with each accepted state) answers False.  Returns
    the state and whether to go on."""
    while not ev.budget.exhausted():
        proposals = propose(ev, level, state)
        swaps = _Swaps(ev, level, state)
        improved = False
        tries = 0
        for _, move in proposals:
            if tries >= TRIES:
                break
            real = _feasible_move(ev, level, state, move, swaps)
            if real is None:
                continue
            new_dev = apply(level, state.dev, real)
            new_order = None if state.order is None else reorder(ev.graph, state, new_dev, ev.cluster.k)
            known = ev.seen(new_dev, new_order)
            if known is not None and not known.better(state.score):
                continue
            tries += 1
            res = ev.evaluate(new_dev, new_order)
            if res is None:
                return state, False
            score, sched = res
            if score.better(state.score):
                state = State(new_dev, ev.loads(new_dev), score, sched, new_order)
                improved = True
                if on_accept is not None and not on_accept(state):
                    return state, False
                break
        if not improved:
            break
    return state, True


def thin(levels: list[Level]) -> list[Level]:
    """Levels at least :data:`LEVEL_STEP` apart in size, coarsest first,
    always ending with the finest."""
    out: list[Level] = []
    for lv in levels:
        if not out or lv.size >= LEVEL_STEP * out[-1].size:
            out.append(lv)
    if levels and out[-1] is not levels[-1]:
        out.append(levels[-1])
    return out


def refine(ev: Evaluator, levels: list[Level], state: State,
           on_accept: Callable[[State], bool] | None = None) -> State:
    """Refine *state* level by level, coarsest first (module docstring);
    *on_accept* as in :func:`refine_level`."""
    for level in thin(levels):
        if ev.budget.exhausted():
            break
        state, go_on = refine_level(ev, level, state, on_accept)
        if not go_on:
            break
    return state
