"""``auto``'s members that plan the whole training step rather than place
operators: placer's ``pipeline`` planner (stages, replicas, micro-batches,
schedule, recomputation; :mod:`celeritas_cli.algorithms.pipelines.pipeline`) and
sharded data parallelism (``fsdp``: ZeRO stage 3 / PyTorch FSDP,
:mod:`celeritas_cli.algorithms.sharding.fsdp`).

A planner searches with a budget of its own, counted in simulations of the
input graph like auto's: it gets :data:`PLAN_SHARE` of auto's evaluations
as its ``evaluations`` (charged to auto before it starts; what it did not
spend is paid back, what it spent beyond is charged) and the time left
before auto's deadline as its ``time_limit``, so it is sized before it
starts and stops at the deadline.  Its share comes only out of what the
members before it (:data:`~.portfolio.PRIORITY` order) leave of the
portfolio's part of the budget, ``1 -`` :data:`~.portfolio.REFINE_SHARE`
(the refinement's share, which no member eats into; the members after it
get what it leaves), so where the members before it cost much it gets
less.  It runs only when its charge can pay for
its model and at least one plan (:func:`planner_charge`: building and
simulating a derived graph about ``1.1 k`` times the input's size, the
smallest a pipeline over ``k`` devices builds) - on a huge graph it is left out and
said so.  With the same number of evaluations, auto's member and the
``pipeline`` row make the same search, so auto is never worse than
``placer place --algo pipeline -p evaluations=N`` with ``N`` the
evaluations auto gave its member (``-v`` says them) - unless the member
gave up because its model predicted no plan near auto's best so far
(``beat_s``), the model's own error then deciding; the row with the whole
default budget searches more than the member and can be better.

``fsdp`` (stage 3, its default; ``shares=proportional`` first on mixed
devices) is a member like ``data-parallel``: it builds one sharded graph
and simulates it once, so it is sized before it starts and counted with
the data-parallel members (:func:`fsdp_charge`: data-parallel's charge
scaled by the counted sizes of the two graphs, neither built), and the
portfolio skips it, saying why, when that charge does not fit the budget
or its estimated time the deadline.
"""

from __future__ import annotations

import math

from ..errors import PlacerError
from ..model.graph import Graph
from ..model.params import DEFAULT_BUCKET_MB  # data-parallel's: the graph fsdp's charge is compared with
from ..transform.admit import data_parallel_size
from ..transform.fsdp_units import fsdp_plan, fsdp_size
from .runner import Spec

#: members that plan the step with a budget of their own
PLANNERS = ("pipeline", "3d")
#: their share of auto's evaluations, together
PLAN_SHARE = 0.3
#: building a derived graph costs about this many simulations of it, and the pipeline model's phase about
#: MODEL_COST simulations of the input graph (algorithms/pipelines/search.py)
BUILD_COST = 3.0
MODEL_COST = 20.0
#: fsdp's stage inside auto (FSDP's FULL_SHARD, the fsdp row's default)
FSDP_STAGE = 3


def fsdp_charge(graph: Graph, k: int, dp_charge: float) -> float:
    """What auto charges ``fsdp`` over *k* replicas of *graph*: the
    data-parallel member's charge *dp_charge* times the ratio of the two
    derived graphs' nodes and edges - of one replica each, what the
    symmetric judge builds and simulates - both counted without building them
    (:func:`~celeritas_cli.transform.fsdp_units.fsdp_size`,
    :func:`~celeritas_cli.transform.admit.data_parallel_size`).  Measured
    on one loaded core (building, simulating and judging the derived graph,
    in simulations of the input graph per unit of its size over the
    input's): fsdp 8.5-31, data-parallel 7.4-46, on layered graphs of 1,000
    and 5,000 nodes over 4 and 8 devices and four zoo graphs over 4 - the
    same cost per element, within the noise, so the sizes decide.  A graph
    fsdp cannot count (coarse, no batch) keeps *dp_charge*: the member
    refuses it in one line when it runs.

    >>> from celeritas_cli.model.generate import layered
    >>> g = layered(60, seed=1)
    >>> round(fsdp_charge(g, 4, 24.0) / 24.0, 2) > 1.0  # per-unit gathers: a larger graph than the replicas'
    True
    """
    try:  # one replica of each, as the symmetric judge builds them (sim/symmetric.py)
        fs = fsdp_size(graph, fsdp_plan(graph, FSDP_STAGE), k, "nccl", 1)
        dp = data_parallel_size(graph, k, DEFAULT_BUCKET_MB, "nccl", 1)
    except PlacerError:
        return dp_charge
    return dp_charge * (fs[0] + fs[1]) / max(1, dp.nodes + dp.edges)


#: micro-batches of the first plan a planner judges, at most (its derived graph: one pipeline replica of each
#: kind, the symmetric judge; the replicas themselves are not built)
FIRST_PLAN_MB = 8


def planner_need(k: int) -> float:
    """Evaluations a planner needs at least: its model's phase and one plan
    over *k* devices built and simulated (module docstring): at most
    :data:`FIRST_PLAN_MB` micro-batch copies of the graph, whatever the
    replicas (sim/symmetric.py)."""
    return MODEL_COST + (1 + BUILD_COST) * 1.1 * min(k, FIRST_PLAN_MB)


def planner_charge(spec: Spec, budget: float, k: int, room: float = math.inf) -> tuple[float, str | None]:
    """``(charge, why_not)``: the evaluations planner *spec* gets of a
    *budget* - :data:`PLAN_SHARE` of it, at most the *room* the members
    before it leave of the portfolio's part (less one to judge its plan) -
    or the reason it cannot run (that pays for no plan).

    >>> planner_charge(Spec("pipeline"), 1000, 4)
    (299.0, None)
    >>> planner_charge(Spec("pipeline"), 1000, 4, room=150.0)
    (149.0, None)
    >>> planner_charge(Spec("pipeline"), 40, 4)[1][:40]
    'its share of the budget (11 evaluations,'
    """
    charge = max(0.0, min(PLAN_SHARE * budget, room) - 1)
    need = planner_need(k)
    if charge < need:
        return charge, (f"its share of the budget ({charge:.0f} evaluations, of what the members before it leave of "
                        f"the portfolio's part) cannot pay for its model and one plan (about {need:.0f}: a derived "
                        f"graph of one replica of each kind, up to {min(k, FIRST_PLAN_MB)} micro-batches, built and simulated)")
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
