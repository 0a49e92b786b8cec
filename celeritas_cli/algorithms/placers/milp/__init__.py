"""Moirai's exact placement (III-D, Eq. 4-8) as a CP-SAT model.

Moirai (moirai.txt, III-D) places the operators of a coarsened graph by a
MILP solved with Gurobi: each operator on exactly one device (Eq. 4c) with a
device-specific processing time, memory per device (Eq. 5), no two operators
of one device overlapping (Eq. 6), a data flow paying a transfer only when
its endpoints are on different devices, on the directed channel between them
(Eq. 7), and no two transfers overlapping on one channel (Eq. 8); the
objective is the makespan (Eq. 4).  We solve the same problem with OR-Tools
CP-SAT in the flexible-job-shop style:

* one optional interval per (node, device) with the node's time on that
  device, sharing the node's start variable; ``add_exactly_one`` over the
  presence literals (Eq. 4c) - literals are per colocation group, so a group
  is never split;
* ``add_no_overlap`` per device (Eq. 6, replacing Moirai's big-M pairs);
* one linear memory constraint per device (Eq. 5);
* one transfer per (producer, tensor, destination device), as the simulator
  sends it (docs/design.md rule 3): literal ``y[t,b]`` = "tensor *t* must reach
  device *b*" (some consumer on *b*, producer elsewhere), one optional
  interval per source device *a* (present iff the producer is on *a*, Eq. 7's
  channel choice), starting after the producer ends; each consumer on *b*
  starts after the arrival;
* congestion as in the simulator: ``channel`` (Eq. 8) - ``add_no_overlap``
  per directed channel a->b; ``port`` - per sender uplink and per receiver
  downlink (Moirai's released code); ``none`` - transfers overlap freely;
* redundant cuts: makespan >= every device's load, node start windows from
  zero-communication heads and tails;
* symmetry breaking between identical devices (same type, speed, memory,
  and link rows/columns that swap): the j-th device of a class may only host
  a group if the (j-1)-th hosts a group of smaller topological rank.

Times are integers of ``resolution`` seconds (rounded to nearest, a
positive time never to zero units; the default resolution is the power of
ten giving the hint's makespan 1e5-1e6 units - the schedule's scale, not the
longest option's: a time beyond 2^40 units, e.g. a link of 1e12 s latency,
is clamped, which keeps the model a relaxation).  The model is a relaxation
of the simulator: every simulated schedule (any order, FIFO channels) is a
solution, so CP-SAT's best bound is a lower bound on the simulated makespan
of any placement under the same congestion rule up to the rounding; the
result subtracts the rounding (:func:`~.data.rounding_seconds`) so that
``best_bound_s`` is a real bound, and calls the grid ``coarse`` (never
OPTIMAL) when the rounding is more than 5 % of the makespan.  The simulator's tie rule is modelled too: one
producer's transfers on one channel (``port``: on its uplink) leave in tensor
order.  The converse does not hold exactly: the solver may let a later
producer's transfer pass an earlier one on a channel (Moirai's Eq. 8 is a
plain either-or; FIFO between different producers would need a reified
order per pair), while the simulator serves a channel FIFO, so the replay of
the solver's schedule (its per-device order) can be later than its
objective.  That is why the result is always re-simulated and never worse
than its warm start - judged on the original graph when the graph solved is
a coarse graph whose original is known (``Graph.origin``), else on the graph
solved.  On a coarse graph the status and the bound hold for the coarse
graph only (``estimate.graph == "coarse"``): members of a coarse node run
back to back there, so the original graph's optimum may lie below the coarse
graph's "bound".

Reading chosen where the paper is silent: Moirai minimises inference latency
on the coarsened graph; we minimise the simulated makespan of whatever graph
is given (forward-only or training step), transfers follow docs/design.md (one per
producer, tensor and destination device, not one per edge as Eq. 7's data
flows), and a multi-hop pair is one channel as in the simulator.
Determinism and time: by default the search is CP-SAT's one-worker search
stopped by a deterministic-time budget (``det_time``), so the same input and
seed give the same placement; the wall clock (``time_limit``, which bounds the
whole call) only caps it, and stderr says when it did.  A model too large for
the time limit is not built (see :func:`solve`).
Modules, in the order of a call: :mod:`.data` (the problem's integers,
resolution), :mod:`.model` (one function per constraint family of III-D,
Eq. 4-8), :mod:`.symmetry`, :mod:`.replay` and :mod:`.hints` (warm start),
:mod:`.solver` (CP-SAT parameters, budgets, :func:`solve`) and
:mod:`.result` (honest status, never worse than the warm start).
"""

from __future__ import annotations

from ....model.cluster import Cluster
from ....model.congestion import DEFAULT_CONGESTION
from ....model.costs import CostModel
from ....model.graph import Graph
from ....model.limits import TIME_MAX
from ....model.placement import Placement
from ....registry import Param, congestion_param, register, time_limit_param
from .data import UNITS_MAX, auto_resolution, integer_durations, model_size
from .hints import HINT_CHAIN, Hint, add_hint, heuristic_hint, hinted_model
from .model import MilpVars, build_model
from .replay import integer_schedule
from .solver import DEFAULT_TIME_LIMIT, DET_PER_SECOND, solve
from .symmetry import identical_classes

__all__ = ["DET_PER_SECOND", "HINT_CHAIN", "UNITS_MAX", "Hint", "MilpVars", "add_hint", "auto_resolution",
           "build_model", "heuristic_hint", "hinted_model", "identical_classes", "integer_durations",
           "integer_schedule", "milp", "model_size", "solve"]


@register("milp", paper="Moirai", section="III-D, Eq. 4-8",
          summary="Exact placement + schedule by CP-SAT (Moirai's MILP), warm-started; for coarse graphs.",
          params={
              "time_limit": time_limit_param(DEFAULT_TIME_LIMIT, "wall-clock limit for the whole call (the "
                                                                 "det_time and model-size budgets of 60 s when 0)"),
              "workers": Param(int, 8, "CP-SAT workers when deterministic=false (capped at the CPU count)", min=1,
                               max=1024),
              "resolution": Param(float, 0.0, "seconds per integer time unit (0 = automatic)", min=0,
                                 max=TIME_MAX),
              "congestion": congestion_param("transfer contention rule, as the simulator"),
              "hint": Param(str, "auto", "warm start: auto, none, or an algorithm name"),
              "deterministic": Param(bool, True, "reproducible search (one worker, deterministic-time budget); "
                                                 "false = parallel workers until the wall clock"),
              "det_time": Param(float, 0.0, "deterministic budget in CP-SAT deterministic-time units "
                                            f"(0 = {DET_PER_SECOND:g} x time_limit)", min=0, max=TIME_MAX),
          },
          quick_params={"time_limit": 5}, uses_origin=True)
def milp(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
         time_limit: float = DEFAULT_TIME_LIMIT, workers: int = 8,
         resolution: float = 0.0, congestion: str = DEFAULT_CONGESTION, hint: str = "auto",
         deterministic: bool = True, det_time: float = 0.0, deadline: float | None = None) -> Placement:
    """Moirai's exact placement (III-D) solved by CP-SAT; see :func:`solve`.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> p = milp(g, uniform(2, bandwidth=100.0, latency=0.0), time_limit=5, workers=1, hint="none")
    >>> p.estimate["status"], p.estimate["makespan_s"]
    ('OPTIMAL', 3.0)
    """
    return solve(graph, cluster, time_limit=time_limit, workers=workers, seed=seed, resolution=resolution,
                 congestion=congestion, hint=hint, deterministic=deterministic, det_time=det_time, costs=costs,
                 deadline=deadline)
