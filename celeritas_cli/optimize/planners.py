"""``auto``'s members that plan the whole training step rather than place
operators: placer's ``pipeline`` planner (stages, replicas, micro-batches,
schedule, recomputation; :mod:`celeritas_cli.algorithms.pipeline`) and
sharded data parallelism (``fsdp``, WP "fsdp": joins when it is registered).

A planner searches with a budget of its own, counted in simulations of the
input graph like auto's: it gets :data:`PLAN_SHARE` of auto's evaluations
as its ``evaluations`` (charged to auto before it starts) and the time left
before auto's deadline as its ``time_limit``, so it is sized before it
starts and stops at the deadline.  It runs only when its share can pay for
its model and at least one plan (:func:`planner_charge`: building and
simulating a derived graph about ``1.1 k`` times the input's size, the
smallest a pipeline over ``k`` devices builds) - on a huge graph it is left out and
said so.  With the same number of evaluations, auto's member and the
``pipeline`` row make the same search, so auto is never worse than the row
it ran.
"""

from __future__ import annotations

import math

from .runner import Spec

#: members that plan the step with a budget of their own
PLANNERS = ("pipeline",)
#: their share of auto's evaluations, together
PLAN_SHARE = 0.3
#: building a derived graph costs about this many simulations of it, and the pipeline model's phase about
#: MODEL_COST simulations of the input graph (algorithms/pipeline_search.py)
BUILD_COST = 3.0
MODEL_COST = 20.0
#: sharded data parallelism (WP "fsdp"): a member like data-parallel when it is registered, counted with the
#: data-parallel members; its cost per squared device count, in simulations of the input graph, is
#: data-parallel's (portfolio.DP_COST) until WP "fsdp" measures its own
FSDP_COST = 1.5


def planner_charge(spec: Spec, budget: float, k: int) -> tuple[float, str | None]:
    """``(charge, why_not)``: the evaluations planner *spec* gets of a
    *budget*, or the reason it cannot run (its share pays for no plan).

    >>> planner_charge(Spec("pipeline"), 1000, 4)
    (299.0, None)
    >>> planner_charge(Spec("pipeline"), 40, 4)[1][:40]
    'its share of the budget (11 evaluations)'
    """
    charge = max(0.0, PLAN_SHARE * budget - 1)
    need = MODEL_COST + (1 + BUILD_COST) * 1.1 * k
    if charge < need:
        return charge, (f"its share of the budget ({charge:.0f} evaluations) cannot pay for its model and one plan "
                        f"(about {need:.0f}: a derived graph of {k} replicas built and simulated)")
    return charge, None


def planner_params(spec: Spec, charge: float, time_left: float, beat: float = 0.0) -> dict:
    """The parameters planner *spec* runs with inside auto: *charge*
    evaluations, the time left (``math.inf``: no wall-clock limit) and
    the best feasible makespan so far, *beat* (the planner gives up,
    before building anything, when its model predicts no plan near it;
    auto pays back what it did not spend).

    >>> planner_params(Spec("pipeline"), 299.0, 4.5, 0.2)
    {'evaluations': 299, 'time_limit': 4.5, 'quiet': True, 'beat_s': 0.2}
    """
    return {"evaluations": max(1, int(charge)), "time_limit": 0.0 if math.isinf(time_left) else max(0.1, time_left),
            "quiet": True, "beat_s": beat}
