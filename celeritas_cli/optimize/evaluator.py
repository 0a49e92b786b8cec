"""Judging candidate placements of :mod:`celeritas_cli.optimize`: the
simulator on the original graph, with an evaluation budget.

Every candidate the optimizer considers - a portfolio member or a refinement
move - is scored by :func:`celeritas_cli.sim.simulator.run_schedule` on the
ORIGINAL graph under one cost model (built once), so the number the search
minimises is exactly what ``placer simulate`` reports.  The score is the
pair ``(overflow, makespan)`` compared lexicographically: ``overflow`` is
the number of bytes over device memory summed over devices (0 for a
feasible placement), so any feasible placement beats any infeasible one and
among infeasible ones the one closer to fitting wins.  The device memory is
the judge's: each device's peak under its memory rule
(:func:`~celeritas_cli.sim.memory.peaks` on the realised schedule, the
``time`` rule, for a graph that declares ``resident_bytes``; the static sum
otherwise, or with ``memory="static"``), so a candidate the search calls
feasible is one ``placer simulate`` reports OK.

The budget is counted in evaluations (deterministic); the wall clock only
caps it (:class:`Budget` records when it did, so the caller can say so).
Assignments already judged are looked up, not simulated again.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..sim.memory import DEFAULT_RULE, applied_rule, peaks
from ..sim.simulator import Schedule, run_schedule


@dataclass(frozen=True)
class Score:
    """What a placement is judged by: bytes over memory (summed over
    devices), then the simulated makespan.  Lower is better."""

    overflow: int
    makespan: float

    @property
    def feasible(self) -> bool:
        return self.overflow == 0

    def better(self, other: "Score | None", rel: float = 1e-9) -> bool:
        """Strictly better than *other* (makespans closer than *rel* count as equal)."""
        if other is None:
            return True
        if self.overflow != other.overflow:
            return self.overflow < other.overflow
        return self.makespan < other.makespan * (1.0 - rel)


class Budget:
    """An evaluation budget capped by a wall-clock deadline.

    ``used`` counts simulations; ``charged`` is other work counted in
    simulation equivalents (the portfolio's placers, by estimate).
    ``take()`` spends one simulation and answers whether it may be made;
    ``clock_cut`` becomes True when the deadline, not the count, said no.

    Time decisions use the measured speed of the simulations made so far
    (seconds per simulation of the input graph, :meth:`sim_time`; before the
    first one, *sim_prior_s*): work of ``x`` simulations is expected to take
    ``x * sim_time()`` seconds, and ``reserve`` simulations' worth of time
    before the deadline is kept for finishing (the answer's bound, its
    placement document, writing it).

    ``held`` evaluations are kept for a later phase (``auto``'s refinement,
    :data:`~celeritas_cli.optimize.portfolio.REFINE_SHARE`): no new work
    starts on them (:meth:`exhausted`, :meth:`take`), but judging work
    already paid for (``take(clock=False)``) may use them - a member that
    ran is never thrown away for want of one simulation.

    >>> b = Budget(3, None)
    >>> b.take(), b.charge(1.0), b.take(), b.take()
    (True, None, True, False)
    >>> b = Budget(3, None)
    >>> b.held = 2.0
    >>> b.take(), b.exhausted(), b.take(), b.take(clock=False), b.take(clock=False), b.take(clock=False)
    (True, True, False, True, True, False)
    """

    def __init__(self, evaluations: float, deadline: float | None, sim_prior_s: float = 0.0, reserve: float = 0.0):
        self.limit = max(0.0, float(evaluations))
        self.used = 0
        self.charged = 0.0
        self.deadline = deadline
        self.clock_cut = False
        self.sim_seconds = 0.0  # wall time of the simulations made (for clock decisions only)
        self.sim_weight = 0.0  # their sizes, in simulations of the input graph
        self.sim_prior_s = sim_prior_s
        self.reserve = reserve
        self.held = 0.0  # evaluations kept for a later phase (see the class docstring)

    @property
    def spent(self) -> float:
        return self.used + self.charged

    def sim_time(self) -> float:
        """Seconds one simulation of the input graph takes: the mean of those
        made so far, else the prior."""
        return self.sim_seconds / self.sim_weight if self.sim_weight > 0 else self.sim_prior_s

    def seconds_for(self, amount: float) -> float:
        """Expected seconds of work of *amount* simulations plus one to judge it."""
        return (amount + 1) * self.sim_time()

    def remaining_time(self) -> float:
        """Seconds left before the deadline, less the reserve for finishing."""
        if self.deadline is None:
            return float("inf")
        return self.deadline - time.perf_counter() - self.reserve * self.sim_time()

    def out_of_time(self, weight: float = 0.0) -> bool:
        """No time left for a simulation of *weight* (0: none left at all)."""
        if self.remaining_time() <= weight * self.sim_time():
            self.clock_cut = True
            return True
        return False

    def over_count(self, weight: float = 1.0, held: bool = True) -> bool:
        """One more simulation (of a graph *weight* times the input's size)
        would take the count over its limit (less the ``held`` evaluations,
        unless *held* is False)."""
        limit = self.limit - (self.held if held else 0.0)
        return self.spent + 1 > limit or (weight > 1 and self.spent + weight > limit)

    def exhausted(self) -> bool:
        return self.over_count() or self.out_of_time()

    def take(self, weight: float = 1.0, clock: bool = True, force: bool = False) -> bool:
        """Spend one simulation; one of a graph *weight* times the input
        graph's size also charges ``weight - 1``.  ``clock=False``: the
        deadline and the ``held`` evaluations do not refuse it (only the
        whole count does), for judging work already paid for; else a
        simulation expected to end past the deadline is refused.
        *force*: a simulation outside the count (``auto``'s contenders on a
        count too small for them): nothing refuses it and nothing is charged."""
        if force:
            return True
        if self.over_count(weight, held=clock) or (clock and self.out_of_time(weight)):
            return False
        self.used += 1
        self.charged += max(0.0, weight - 1.0)
        return True

    def charge(self, amount: float) -> None:
        self.charged += amount

    def affordable(self, amount: float) -> bool:
        """Whether work of *amount* simulations (plus one to judge it) fits
        in the time left; False sets ``clock_cut``.  Before any simulation
        is measured only the prior speed is known, and the first piece of
        work is always affordable (an answer needs one candidate)."""
        if self.deadline is None or not self.used:
            return True
        if self.remaining_time() < self.seconds_for(amount):
            self.clock_cut = True
            return False
        return True


class Evaluator:
    """Scores index-level placements of *graph* on *cluster*:
    ``evaluate(device_of, order=None) -> (Score, Schedule)``, or None when
    *budget* is spent.

    Each simulation spends one evaluation of *budget*; an assignment judged
    before is answered from a cache of scores (keyed by a digest of the
    assignment and order) without spending one, as long as its schedule is
    still among the last few kept.

    Parameters
    ----------
    graph, cluster : Graph, Cluster
        The graph judged (the original graph, or a derived one a candidate carries).
    costs : CostModel, optional
        Built once (:func:`~celeritas_cli.model.costs.cost_model`) and used
        for every simulation.
    congestion : str
        The simulator's congestion rule.
    budget : Budget, optional
        Shared by every evaluator of one search (default: unlimited).
    weight : float
        Size of *graph* relative to the input graph of the search (a derived
        graph, e.g. data-parallel replicas, costs more per simulation).
    memory : str
        The judge's memory rule the overflow is counted under (``"time"``,
        the default, or ``"static"``; module docstring).  :meth:`loads`
        stays the static sum (what a move adds or removes, for the
        refinement's memory repair).
    """

    KEEP_SCHEDULES = 8

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel | None = None,
                 congestion: str = DEFAULT_CONGESTION, budget: Budget | None = None, weight: float = 1.0,
                 memory: str = DEFAULT_RULE):
        self.graph = graph
        self.cluster = cluster
        self.costs = cost_model(graph, cluster, costs)
        self.congestion = congestion
        self.budget = budget if budget is not None else Budget(1 << 62, None)
        self.weight = weight
        self.capacity = [d.memory for d in cluster.devices]
        self.memory_rule = applied_rule(graph, memory)[0]
        self.scores: dict[bytes, Score] = {}
        self._schedules: OrderedDict[bytes, Schedule] = OrderedDict()

    def loads(self, device_of: Sequence[int]) -> list[int]:
        """Memory per device of ``device_of``."""
        return self.graph.memory_by(device_of, self.cluster.k)

    def judged_overflow(self, device_of: Sequence[int], sched: Schedule) -> int:
        """Bytes over capacity summed over devices under the judge's rule:
        the static sums, or under the time rule the peaks of *sched*
        (:func:`~celeritas_cli.sim.memory.peaks`), computed only when some
        device's static sum plus the bytes it receives - a bound on its
        peak - is over its capacity."""
        load = self.loads(device_of)
        if self.memory_rule == "time":
            received = [0] * self.cluster.k
            for tr in sched.transfers:
                received[tr.dst_dev] += tr.nbytes
            if any(a + r > c for a, r, c in zip(load, received, self.capacity)):
                return self.overflow(peaks(self.graph, sched, self.cluster.k))
            return 0
        return self.overflow(load)

    def overflow(self, load: Sequence[int]) -> int:
        """Bytes over capacity, summed over devices."""
        return sum(max(0, x - c) for x, c in zip(load, self.capacity))

    @staticmethod
    def key(device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None) -> bytes:
        h = hashlib.blake2b(array("i", device_of).tobytes(), digest_size=16)
        if order is not None:
            for seq in order:
                h.update(array("i", seq).tobytes())
                h.update(b"|")
        return h.digest()

    def seen(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None) -> Score | None:
        """The score of an assignment judged before, else None."""
        return self.scores.get(self.key(device_of, order))

    def evaluate(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None,
                 clock: bool = True, force: bool = False) -> tuple[Score, Schedule] | None:
        """Simulate ``device_of`` (with the strict per-device *order* when
        given) on the graph; None when the budget is spent (*clock* and
        *force* as in :meth:`Budget.take`)."""
        key = self.key(device_of, order)
        sched = self._schedules.get(key)
        if sched is not None:
            self._schedules.move_to_end(key)
            return self.scores[key], sched
        if not self.budget.take(self.weight, clock, force):
            return None
        t0 = time.perf_counter()
        sched = run_schedule(self.graph, self.cluster, device_of, order, congestion=self.congestion,
                             costs=self.costs)
        self.budget.sim_seconds += time.perf_counter() - t0
        self.budget.sim_weight += self.weight
        score = Score(self.judged_overflow(device_of, sched), sched.makespan)
        self.scores[key] = score
        self._schedules[key] = sched
        if len(self._schedules) > self.KEEP_SCHEDULES:
            self._schedules.popitem(last=False)
        return score, sched
