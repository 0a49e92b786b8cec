"""The Hierarchical Planner's deterministic training budget.

The project rule (same input and seed, same output): a budget that decides
the result is counted, and the wall clock only caps it.  HRL's budget is
iterations (1000 in the paper, section 3); when a ``time_limit`` is given
and ``iterations`` is 0 (auto), :func:`auto_iterations` derives the count
from the limit with a fixed cost model of one iteration - a function of the
graph's and the policy's sizes, never of the clock - so runs repeat, and the
wall clock (checked before each iteration) only stops training when a
machine is much slower than the model assumes; the planner then says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

NOISE_FRACTION = 0.75
"""Exploration noise during the first 75 % of the iterations (``stop_noise_step``
750 of 1000 in the released controller)."""
PAPER_ITERATIONS = 1000
"""HRL section 3: "All results are after 1000 iterations"."""
MAX_ITERATIONS = 10**6
"""Most iterations ``-p iterations`` accepts: 1000 x the paper's (issue 24, N01)."""
SECONDS_PER_GROUP = 6e-3
"""Cost model, decoder: seconds per group per iteration (one Placer decode
and its backward pass: M LSTM steps with attention over M groups)."""
SECONDS_PER_ELEMENT = 5e-5
"""Cost model, rewards: seconds per (node + edge) per sample (one
simulation, plus the group embeddings)."""
SECONDS_PER_ITERATION = 0.01
"""Cost model: fixed overhead of an iteration (Grouper, optimiser step)."""
TIME_SHARE = 0.5
"""Share of the time left after :data:`STARTUP_S` that the auto budget is
sized to use, so the clock rarely cuts it.  The cost model was fitted on a
loaded 2-core machine (per-iteration times of 0.05-2.2 s on 22- to 1,000-node
graphs, M = 13-256, 2 or 8 samples), overestimating most of them; under a
heavier load iterations took up to twice as long."""
STARTUP_S = 5.0
"""Seconds of the time limit set aside for importing torch and building the
networks (``import torch`` measured 1-5 s on a loaded machine)."""
MARGIN_S = 1.0
"""Seconds before the end of the time limit at which training stops at the
latest, left for writing the result and the interpreter's exit (``placer
place`` keeps the whole call within the limit + 10 % + 1 s)."""


def iteration_cost_s(n: int, m: int, groups: int, samples: int) -> float:
    """Modelled seconds of one training iteration (see the constants).

    Example
    -------
    >>> round(iteration_cost_s(1000, 1600, 256, 8), 3)
    2.586
    """
    return SECONDS_PER_ITERATION + SECONDS_PER_GROUP * groups + SECONDS_PER_ELEMENT * samples * (n + m)


def auto_iterations(n: int, m: int, groups: int, samples: int, time_limit: float) -> int:
    """Iterations that fit in *time_limit* by the cost model: the paper's
    1000 without a limit (0), else ``TIME_SHARE x (time_limit - STARTUP_S) /
    iteration_cost_s``, at least 1 and at most 1000.

    Example
    -------
    >>> auto_iterations(1000, 1600, 256, 8, 60.0), auto_iterations(60, 92, 52, 8, 0.0)
    (10, 1000)
    """
    if not time_limit:
        return PAPER_ITERATIONS
    fit = TIME_SHARE * max(0.0, time_limit - STARTUP_S) / iteration_cost_s(n, m, groups, samples)
    return max(1, min(PAPER_ITERATIONS, math.floor(fit)))


@dataclass
class TrainingBudget:
    """Counted iterations, capped by the wall clock from ``t0`` (the call's
    start, torch's import included) to ``end`` (the call's deadline, a
    :func:`time.perf_counter` reading; default ``t0 + time_limit``; none
    when ``time_limit`` is 0)."""

    iterations: int
    samples: int
    time_limit: float
    t0: float
    end: float | None = None
    done: int = 0
    n_samples: int = 0
    first_s: float = 0.0      # modelled seconds of one iteration (iteration_cost_s)
    horizon: int = 0          # iterations the noise schedule is laid over
    clock_cut: bool = False   # the wall clock changed the run (stopped it or shortened the schedule)
    _t1: float = 0.0          # end of the first iteration (its warm-up is not typical)

    def __post_init__(self) -> None:
        self.horizon = self.iterations
        if self.end is None and self.time_limit:
            self.end = self.t0 + self.time_limit

    def noisy(self, it: int) -> bool:
        """Exploration noise during the first ``NOISE_FRACTION`` of the
        schedule (``stop_noise_step`` 750 of 1000 in the released code)."""
        return it < NOISE_FRACTION * self.horizon

    def may_start(self, it: int) -> bool:
        """Whether iteration *it* may start.  Without a time limit, always;
        with one, the first when the modelled iteration (``first_s``) ends
        before the deadline (a slow start - a cold ``import torch`` measured
        10-15 s - leaves only the untrained policy's decode), none past the
        deadline; from the third iteration on the mean iteration time
        predicts how many fit before the deadline (one kept in reserve for
        the final decode): when fewer than the budget, the noise schedule
        is laid over the predicted count and ``clock_cut`` is set; an
        iteration that would end past the deadline does not start."""
        now = time.perf_counter()
        if it == 1:
            self._t1 = now
        if not self.time_limit or self.end is None:
            return True
        deadline = self.end - min(MARGIN_S, 0.1 * self.time_limit)
        if it == 0:
            if now + self.first_s <= deadline:
                return True
            self.clock_cut = True
            self.horizon = 0
            return False
        if now >= deadline:
            self.clock_cut = True
            return False
        if it < 2:
            return True
        mean = (now - self._t1) / (it - 1)
        left = deadline - now - mean  # keep one for the final decode
        fit = it + math.floor(left / mean) if mean > 0 else self.iterations
        if fit < self.iterations:
            self.clock_cut = True
            self.horizon = min(self.horizon, max(fit, it))
        return fit > it
