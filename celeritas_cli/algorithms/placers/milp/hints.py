"""Warm start: heuristic placements simulated, the best hinted to CP-SAT.

Moirai (III-D) hands its MILP to Gurobi cold.  Here a chain of fast
registered heuristics (:data:`HINT_CHAIN`) runs first; the best
memory-feasible one (i) bounds the model's horizon, (ii) hints every
variable through its integer replay (:func:`~.replay.integer_schedule`),
permuted into the symmetry-broken form, and (iii) is the fallback the
result is never worse than (:mod:`.result`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from ....errors import InvalidInput
from ....model.cluster import Cluster
from ....model.costs import CostModel
from ....model.graph import Graph
from ....sim.simulator import Schedule, check_colocation, run_schedule
from .data import integer_durations
from .model import MilpVars, build_model
from .replay import integer_schedule
from .symmetry import canonical_permutation

HINT_CHAIN = ("adjusting", "heft", "single-device")


@dataclass
class Hint:
    """One simulated heuristic placement: its devices, per-device order,
    simulated makespan, whether it fits memory, the schedule and the time
    the simulation took."""

    name: str
    device_of: list[int]
    order: list[list[int]] | None
    makespan: float
    fits: bool
    sched: Schedule
    sim_s: float = 0.0


def hint_names(hint: str) -> tuple[str, ...]:
    """The heuristics the ``hint`` parameter names: ``auto`` =
    :data:`HINT_CHAIN`, ``none`` = no warm start, else one registered name."""
    if hint == "none":
        return ()
    if hint == "auto":
        return HINT_CHAIN
    from .... import registry

    if hint == "milp":
        raise InvalidInput("milp: hint cannot be 'milp' itself (use auto, none or a heuristic's name)")
    registry.get(hint)  # unknown name -> InvalidInput listing the known ones
    return (hint,)


def _simulated_hint(graph: Graph, cluster: Cluster, name: str, seed: int, congestion: str,
                    costs: CostModel) -> Hint | None:
    """Heuristic *name*'s placement simulated (None for a split graph)."""
    from .... import registry

    p = registry.place(graph, cluster, name, seed=seed, costs=costs)
    if p.is_derived:
        return None
    device_of, order = p.resolve(graph, cluster, f"{name} hint")
    check_colocation(graph, cluster, device_of, f"{name} hint")
    t_sim = time.perf_counter()
    sched = run_schedule(graph, cluster, device_of, order, congestion=congestion, costs=costs)
    sim_s = time.perf_counter() - t_sim
    fits = not cluster.over_capacity(graph.memory_by(device_of, cluster.k))
    return Hint(name, list(device_of), order, sched.makespan, fits, sched, sim_s)


def heuristic_hint(graph: Graph, cluster: Cluster, names: Sequence[str], seed: int, congestion: str,
                   costs: CostModel, console, deadline: float = math.inf) -> tuple[Hint | None, bool]:
    """Run each registered heuristic of *names*, simulate it, keep the best
    (memory-feasible first, then makespan, then list order).  The chain
    stops before a heuristic once ``time.perf_counter()`` is past
    *deadline*; returns ``(best, cut)`` with ``cut`` true when it did."""
    from .... import registry

    known = set(registry.names())
    best: Hint | None = None
    for name in names:
        if name not in known or name == "milp":
            continue
        if time.perf_counter() >= deadline:
            return best, True
        try:
            h = _simulated_hint(graph, cluster, name, seed, congestion, costs)
        except Exception as exc:  # a concurrent heuristic may fail; the chain goes on
            if console is not None:
                console.print(f"milp: hint '{name}' failed ({type(exc).__name__}: {exc}); skipped")
            continue
        if h is None:
            continue
        if console is not None:
            console.print(f"milp: hint {name}: simulated makespan {h.makespan:.6g} s"
                          + ("" if h.fits else " (OOM, not a fallback)"))
        if best is None or (not best.fits and h.fits) or (h.fits == best.fits and h.makespan < best.makespan):
            best = h
    return best, False


def _hint_transfers(model, graph: Graph, mv: MilpVars, dev: list[int], inv: list[int], ist: list[int],
                    tstart: dict) -> None:
    """Transfer literals ``y``, starts ``tau`` and channel literals ``z``
    (Eq. 7) from the replay; an absent transfer's ``tau`` sits at its
    producer's end."""
    for (t, b), (tau, y, zs) in mv.transfers.items():
        p = graph.tensor_src[t]
        key = (t, inv[b])
        need = key in tstart
        model.add_hint(y, need)
        model.add_hint(tau, tstart[key] if need else ist[p] + mv.dur[p][dev[p]])
        for a, z in zs.items():
            model.add_hint(z, need and dev[p] == a)


def _hint_auxiliaries(model, mv: MilpVars, dev: list[int], inv: list[int], tstart: dict) -> None:
    """The FIFO chains' running maxima and the symmetry prefixes."""
    for seq, lows in mv.chains:
        low = 0
        for (t, b), lv in zip(seq, lows):
            key = (t, inv[b])
            if key in tstart:
                low = max(low, tstart[key])
            model.add_hint(lv, low)
    for (d0, _), plist in mv.prefix.items():
        on = False
        for u, pu in enumerate(plist):
            on = on or dev[mv.units[u][0]] == d0
            if pu is not None and mv.x[u][d0] is not None:
                model.add_hint(pu, on)


def add_hint(model, graph: Graph, mv: MilpVars, hint: Hint, replay: tuple, k: int) -> None:
    """Hint every variable with the hint's integer *replay* (devices permuted
    into the symmetry-broken canonical form)."""
    ist, tstart, ims = replay
    perm = canonical_permutation(hint.device_of, mv.units, mv.classes, k)
    dev = [perm[d] for d in hint.device_of]
    inv = [0] * k
    for old, new in enumerate(perm):
        inv[new] = old
    for u, mem in enumerate(mv.units):
        for d in range(k):
            if mv.x[u][d] is not None:
                model.add_hint(mv.x[u][d], dev[mem[0]] == d)
    for v in range(graph.n):
        model.add_hint(mv.start[v], ist[v])
        model.add_hint(mv.end[v], ist[v] + mv.dur[v][dev[v]])
    _hint_transfers(model, graph, mv, dev, inv, ist, tstart)
    model.add_hint(mv.makespan, ims)
    _hint_auxiliaries(model, mv, dev, inv, tstart)


def hinted_model(graph: Graph, cluster: Cluster, best: Hint | None, feasible: bool, res: float, congestion: str,
                 costs: CostModel):
    """:func:`~.model.build_model`, its horizon bounded by a memory-feasible
    warm start's integer replay, every variable hinted with that replay."""
    horizon = replay = None
    if best is not None:
        dur, comm = integer_durations(graph, cluster, res, costs)
        replay = integer_schedule(graph, best, dur, comm, congestion, cluster.k)
        if feasible:
            horizon = replay[2]  # a memory-feasible hint bounds the optimum
    model, mv = build_model(graph, cluster, resolution=res, congestion=congestion, horizon=horizon, costs=costs)
    if best is not None:
        add_hint(model, graph, mv, best, replay, cluster.k)
    return model, mv
