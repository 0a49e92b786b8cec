"""Simulator-in-the-loop refinement: move and swap units along the realised
critical path, level by level (coarse units first, then their members).

This is the uncoarsening phase of a multilevel partitioner (Karypis & Kumar
1998, section 3.3: project the partition one level down, then refine it
with local moves), with two changes: the objective is the simulated
makespan of the ORIGINAL graph (:class:`~celeritas_cli.optimize.evaluator.Evaluator`),
not the edge cut; and moves are not tried for every boundary unit but
proposed from the realised critical path of the current schedule
(:func:`~celeritas_cli.sim.simulator.critical_path`, ``Schedule.binding``),
where the makespan is actually decided:

* a critical node ``v`` that waited for a transfer from ``p`` on another
  device proposes moving ``v``'s unit to ``p``'s device and ``p``'s unit
  to ``v``'s device (the transfer disappears);
* a critical node that was ready but waited for its device (``p`` ran
  before it there) proposes moving its unit, or ``p``'s, to each other
  device, least busy first;
* a move that would overflow the target device's memory is replaced by a
  swap with the unit on the target device that frees enough memory with
  the least work.

Proposals are tried in decreasing order of the time the critical path lost
at them; the first that strictly improves ``(overflow, makespan)`` is
accepted (first improvement), the critical path is recomputed, and so on
until no proposal of the level improves, then the next finer level starts.
Moves never make a feasible placement infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..sim.simulator import Schedule, critical_path
from .evaluator import Evaluator, Score
from .levels import Level


@dataclass
class State:
    """The incumbent: assignment, per-device memory, score and schedule."""

    dev: list[int]
    load: list[int]
    score: Score
    sched: Schedule


Move = tuple[tuple[int, int], ...]  # ((unit, device), ...)


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


def propose(ev: Evaluator, level: Level, state: State) -> list[tuple[float, Move]]:
    """Candidate moves from the critical path, most promising first."""
    g, sched, dev, k = ev.graph, state.sched, state.dev, ev.cluster.k
    path = critical_path(g, sched)
    ready = _ready_times(ev, state, path)
    busy = [0.0] * k
    for v, d in enumerate(dev):
        busy[d] += ev.costs.time[v][d]
    by_busy = sorted(range(k), key=lambda d: (busy[d], d))
    unit_of = level.unit_of
    weighted: dict[Move, float] = {}

    def add(w: float, move: Move) -> None:
        if w > weighted.get(move, -1.0):
            weighted[move] = w

    for i in range(1, len(path)):
        p, v = path[i - 1], path[i]
        if dev[p] != dev[v]:
            w = sched.start[v] - sched.finish[p]
            add(w, ((unit_of[v], dev[p]),))
            add(w, ((unit_of[p], dev[v]),))
        else:
            w = sched.start[v] - ready[v]
            if w <= 0:
                continue
            for d in by_busy:
                if d != dev[v]:
                    add(w, ((unit_of[v], d),))
                    add(w * 0.5, ((unit_of[p], d),))
    ranked = sorted(weighted.items(), key=lambda kv: (-kv[1], kv[0]))
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


def _swap_partner(ev: Evaluator, level: Level, state: State, u: int, d: int, need: int,
                  protected: set[int]) -> int:
    """A unit entirely on *d* whose memory covers *need*, least work; -1 if none."""
    best, best_key = -1, None
    mem, time = ev.graph.memory, ev.costs.time
    for w in range(level.size):
        mb = level.members[w]
        if w == u or w in protected or state.dev[mb[0]] != d:
            continue
        if any(state.dev[x] != d for x in mb):
            continue
        m = sum(mem[x] for x in mb)
        if m < need:
            continue
        key = (sum(time[x][d] for x in mb), m, w)
        if best_key is None or key < best_key:
            best, best_key = w, key
    return best


def _feasible_move(ev: Evaluator, level: Level, state: State, move: Move, protected: set[int]) -> Move | None:
    """*move*, or a swap replacing it when it would overflow a device; None
    when neither keeps the memory state (never more overflow than now)."""
    cap = ev.capacity
    delta = _delta_load(ev, level, state.dev, move)
    new = [a + b for a, b in zip(state.load, delta)]
    if ev.overflow(new) <= state.score.overflow and (state.score.overflow or all(
            x <= c for x, c in zip(new, cap))):
        return move
    if len(move) != 1:
        return None
    u, d = move[0]
    src = state.dev[level.members[u][0]]
    if any(state.dev[x] != src for x in level.members[u]):
        return None
    need = new[d] - cap[d]
    w = _swap_partner(ev, level, state, u, d, need, protected)
    if w < 0:
        return None
    swap = ((u, d), (w, src))
    new = [a + b for a, b in zip(state.load, _delta_load(ev, level, state.dev, swap))]
    if ev.overflow(new) <= state.score.overflow and (state.score.overflow or all(
            x <= c for x, c in zip(new, cap))):
        return swap
    return None


def apply(level: Level, dev: list[int], move: Move) -> list[int]:
    out = list(dev)
    for u, d in move:
        for v in level.members[u]:
            out[v] = d
    return out


def refine_level(ev: Evaluator, level: Level, state: State,
                 on_accept: Callable[[State], None] | None = None) -> State:
    """First-improvement local search over *level*'s units (module
    docstring); stops when no proposal improves or the budget is spent."""
    while not ev.budget.exhausted():
        proposals = propose(ev, level, state)
        protected = {m[0][0] for _, m in proposals}
        improved = False
        for _, move in proposals:
            real = _feasible_move(ev, level, state, move, protected)
            if real is None:
                continue
            new_dev = apply(level, state.dev, real)
            known = ev.seen(new_dev)
            if known is not None and not known.better(state.score):
                continue
            res = ev.evaluate(new_dev)
            if res is None:
                return state
            score, sched = res
            if score.better(state.score):
                state = State(new_dev, ev.loads(new_dev), score, sched)
                improved = True
                if on_accept is not None:
                    on_accept(state)
                break
        if not improved:
            break
    return state


def refine(ev: Evaluator, levels: list[Level], state: State,
           on_accept: Callable[[State], None] | None = None) -> State:
    """Refine *state* level by level, coarsest first (module docstring)."""
    for level in levels:
        if ev.budget.exhausted():
            break
        state = refine_level(ev, level, state, on_accept)
    return state
