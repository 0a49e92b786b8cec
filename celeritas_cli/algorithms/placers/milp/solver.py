"""Solving Moirai's MILP with CP-SAT under a counted budget.

:func:`solve` is the whole call, in named steps: check the arguments,
warm-start (:mod:`.hints`), refuse a model too large for the time limit
(:func:`too_large`), choose the resolution (:func:`~.data.choose_resolution`),
build the hinted model, search (:func:`search`: CP-SAT parameters, the
deterministic-time budget, the wall-clock cap) and write the result
(:mod:`.result`).
"""

from __future__ import annotations

import math
import os
import threading
import time

from .... import registry
from ....errors import Infeasible, InvalidInput, SolverError
from ....log import chatty
from ....model.cluster import Cluster
from ....model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from ....model.costs import CostModel, cost_model
from ....model.graph import Graph
from ....model.limits import WAIT_MAX
from ....model.params import SOLVER_TIME_LIMIT
from ....model.placement import Placement
from ....sim.judge import original_makespan
from ....sim.simulator import lower_bound
from ....log import stderr_console
from .data import choose_resolution, cp_module, model_size
from .hints import heuristic_hint, hint_names, hinted_model
from .result import Call, WarmStart, give_up, solver_placement

#: the MILP's time limit (s; the long solvers' default); with time_limit 0 (no wall clock) the counted budgets are
#: this one's
DEFAULT_TIME_LIMIT = SOLVER_TIME_LIMIT
TOO_LARGE = 5000      # nodes: above this the model is not built (return the hint)
LARGE = 1000          # nodes: above this warn that a proof is unlikely
HINT_SHARE = 0.5
"""Share of ``time_limit``, counted from the first heuristic, within which
warm-start heuristics are started (a cap: normally the chain takes a few
per cent of it)."""
INTERVALS_PER_SECOND = 1000
"""Largest model (optional intervals, :func:`~.data.model_size`) built per
second of ``time_limit``.  Measured on a loaded 2-core machine: the
1,300-node Transformer (21k intervals) took 1 s to build and 5-12 s to
presolve, while CP-SAT does not check its time limit inside some of those
phases."""
DET_PER_SECOND = 0.05
"""Default deterministic budget: CP-SAT deterministic-time units per second
of ``time_limit``.  Measured rates of the one-worker search on a loaded
2-core machine: 0.06-0.33 units per wall second (coarse zoo graphs, 60- and
300-node layered graphs), so the budget is normally spent within 15-80 % of
the limit and the wall clock rarely decides."""


def progress_callback_class():
    """A ``CpSolverSolutionCallback`` printing incumbent and bound to stderr."""
    cp_model = cp_module()

    class Progress(cp_model.CpSolverSolutionCallback):
        """Incumbent and bound to stderr on every improving solution."""

        def __init__(self, res: float, console, quiet: bool):
            super().__init__()
            self.res = res
            self.console = console
            self.quiet = quiet
            self.count = 0

        def on_solution_callback(self) -> None:
            self.count += 1
            if self.quiet:
                return
            obj = self.objective_value * self.res
            bound = self.best_objective_bound * self.res
            gap = (obj - bound) / obj if obj > 0 else 0.0
            self.console.print(f"milp: #{self.count} incumbent {obj:.6g} s, bound {bound:.6g} s, "
                               f"gap {gap:.2%}, {self.wall_time:.1f} s")

    return Progress


def solver_parameters(prm, *, deterministic: bool, workers: int, det_budget: float, cap: float, seed: int) -> None:
    """Set CP-SAT's parameters.  Deterministic: one worker (CP-SAT's
    sequential search repeats exactly under a deterministic-time limit), no
    LP relaxation (measured: building it for a 1,300-node model took 30 s
    with no time check, and the interleaved multi-worker mode overran its
    wall-clock limit by 90 s), ``max_deterministic_time = det_budget``.
    Otherwise *workers* in parallel.  Both: the wall clock capped at *cap*
    and no SAT probing in presolve (measured: 5 s of a 10 s budget on 168
    nodes, before the hint is even tried)."""
    if deterministic:
        prm.num_workers = 1
        prm.max_deterministic_time = det_budget
        prm.linearization_level = 0
    else:
        prm.num_workers = workers
    if math.isfinite(cap):  # else CP-SAT's default: no wall-clock limit
        prm.max_time_in_seconds = max(cap, 0.01)
    prm.random_seed = int(seed) % (2**31)
    prm.log_search_progress = False
    prm.cp_model_probing_level = 0


def search(cp_model, model, *, deterministic: bool, workers: int, det_budget: float, cap: float, seed: int,
           res: float, console, quiet: bool):
    """Run CP-SAT on *model*: ``(solver, status, wall_cut)``.

    Deterministic: the search stopped by the deterministic budget
    *det_budget* (:func:`solver_parameters`); the wall clock *cap* only
    caps it and ``wall_cut`` says when it did.  Otherwise *workers* in
    parallel until *cap* seconds (``inf``: no wall-clock limit).  A watchdog
    calls ``stop_search`` shortly after *cap* in case a phase ignores the
    limit; none beyond :data:`~celeritas_cli.model.limits.WAIT_MAX` (a timer
    that long overflows the platform's clock, issue 24 N03).
    """
    solver = cp_model.CpSolver()
    solver_parameters(solver.parameters, deterministic=deterministic, workers=workers, det_budget=det_budget,
                      cap=cap, seed=seed)
    watchdog = threading.Timer(1.05 * cap + 0.2, solver.stop_search) if 1.05 * cap + 0.2 <= WAIT_MAX else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        status = solver.solve(model, progress_callback_class()(res, console, quiet))
    finally:
        if watchdog is not None:
            watchdog.cancel()
    done = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    wall_cut = deterministic and not done and solver.deterministic_time < 0.99 * det_budget
    if wall_cut:
        console.print(f"milp: the wall clock stopped the search after {solver.wall_time:.3g} s, at "
                      f"{solver.deterministic_time:.3g} of its {det_budget:.3g} deterministic-time budget, so this "
                      f"result may differ between runs; raise --time-limit or lower -p det_time for a repeatable one")
    return solver, status, wall_cut


def too_large(graph: Graph, k: int, time_limit: float) -> str | None:
    """The message saying the model is too large for *time_limit* (more than
    ``TOO_LARGE`` nodes, or more than ``INTERVALS_PER_SECOND`` optional
    intervals per second), or None."""
    n, size = graph.n, model_size(graph, k)
    if n <= TOO_LARGE and size <= INTERVALS_PER_SECOND * time_limit:
        return None
    need = "" if n > TOO_LARGE else f" (it needs about {size / INTERVALS_PER_SECOND:.0f} s)"
    return (f"milp: graph '{graph.name}' ({n} nodes) makes a model of up to {size} intervals, too large to "
            f"solve within --time-limit {time_limit:g} s{need}; coarsen first "
            f"(`placer coarsen G | placer place - --algo milp`)" + ("" if n > TOO_LARGE else " or raise --time-limit"))


def _check_args(congestion: str, time_limit: float, det_time: float) -> None:
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"milp: unknown congestion rule '{congestion}' (use channel, port or none)")
    if not time_limit >= 0:
        raise InvalidInput(f"milp: time_limit must be >= 0 seconds (0 = no limit), got {time_limit}")
    if det_time < 0:
        raise InvalidInput(f"milp: det_time must be >= 0 (0 = automatic), got {det_time}")


def _empty_placement(graph: Graph, cluster: Cluster, params: dict, seed: int) -> Placement:
    return Placement.from_indices(graph, cluster, [], algorithm="milp", order=[[] for _ in range(cluster.k)],
                                  params=params, seed=seed,
                                  estimate={"status": "OPTIMAL", "makespan_s": 0.0, "makespan_by": "simulator",
                                            "objective_s": 0.0, "best_bound_s": 0.0, "gap": 0.0})


def warm_start(call: Call, hint: str, time_limit: float) -> WarmStart:
    """Run the warm-start chain named by *hint* (started only within
    ``HINT_SHARE`` of *time_limit*; 0 = no limit) and judge its
    memory-feasible best on the original graph when that is known."""
    graph, cluster, costs, console = call.graph, call.cluster, call.costs, call.console
    names = hint_names(hint)
    cut_at = time.perf_counter() + HINT_SHARE * time_limit if time_limit else math.inf
    best, chain_cut = (heuristic_hint(graph, cluster, names, call.seed, call.congestion, costs,
                                      None if call.quiet else console, deadline=cut_at)
                       if names else (None, False))
    if chain_cut:
        console.print(f"milp: the wall clock cut the warm-start chain after {HINT_SHARE:.0%} of --time-limit "
                      f"{time_limit:g} s, so this result may differ between runs")
    fallback = best if best is not None and best.fits else None
    t_orig = time.perf_counter()
    fb_orig = (original_makespan(graph, cluster, fallback.device_of, fallback.order, congestion=call.congestion,
                                 costs=costs) if fallback is not None else None)
    orig_s = time.perf_counter() - t_orig if graph.origin is not None else 0.0
    return WarmStart(best=best, chain_cut=chain_cut, fallback=fallback, fb_orig=fb_orig, orig_s=orig_s)


def _base_estimate(call: Call) -> dict:
    """What every estimate of the call starts with."""
    est = {"congestion": call.congestion, "lower_bound_s": lower_bound(call.graph, call.cluster, call.costs),
           "makespan_by": "simulator"}
    if call.warm.fb_orig is not None:
        est["hint_original_makespan_s"] = call.warm.fb_orig
    return est


def search_cap(end: float | None, time_limit: float, warm: WarmStart) -> float:
    """Seconds left for the search: until the call's deadline *end* (a
    :func:`time.perf_counter` reading; None = no limit: ``inf``) less a
    reserve for the result's two simulations (graph solved and original)
    and for the caller to write it and exit (placer place: limit + 10 % +
    1 s in all)."""
    if end is None:
        return math.inf
    reserve = 2.0 * (warm.best.sim_s if warm.best is not None else 0.0) + 2.0 * warm.orig_s \
        + 0.02 * time_limit + min(0.5, 0.05 * time_limit)
    return end - reserve - time.perf_counter()


def _outcome(cp_model, call: Call, model, mv, solver, status, search_est: dict) -> Placement:
    """Raise on a proof of infeasibility or an invalid model, fall back to
    the warm start without a solution, else :func:`~.result.solver_placement`."""
    graph, cluster = call.graph, call.cluster
    status_name = solver.status_name(status)
    if status == cp_model.INFEASIBLE:
        caps = ", ".join(f"{d.id} {d.memory}" for d in cluster.devices)
        raise Infeasible(f"milp: CP-SAT proved no placement of '{graph.name}' fits the devices' memory "
                         f"(needs {graph.total_memory()} bytes in all; capacities: {caps}); "
                         f"use more or larger devices")
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"milp: CP-SAT rejected the model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        msg = (f"milp: CP-SAT found no solution for {graph.n} nodes within {solver.wall_time:.3g} s; "
               f"run `placer coarsen` first or raise --time-limit")
        return give_up(call, msg, status_name, "no solution within the budget",
                       "no solver solution; returned hint '{hint}'", search_est)
    return solver_placement(call, mv, solver, status == cp_model.OPTIMAL, status_name,
                            {**call.base_est, **search_est})


def solve(graph: Graph, cluster: Cluster, *, time_limit: float = DEFAULT_TIME_LIMIT, workers: int = 8, seed: int = 0,
          resolution: float = 0.0, congestion: str = DEFAULT_CONGESTION, hint: str = "auto",
          quiet: bool = False, deterministic: bool = True, det_time: float = 0.0,
          costs: CostModel | None = None, deadline: float | None = None) -> Placement:
    """Place *graph* on *cluster* with the CP-SAT model of :func:`~.model.build_model`.

    Parameters
    ----------
    time_limit : float
        Wall-clock budget in seconds for the whole call: the OR-Tools import,
        the warm-start heuristics (started only within ``HINT_SHARE`` of it),
        model building, the search (what is left,
        minus a reserve for the final simulations) and the result.  A model
        larger than ``INTERVALS_PER_SECOND`` x *time_limit* optional
        intervals (:func:`~.data.model_size`) is not built: the best warm start is
        returned with a message saying to coarsen first (or
        :class:`SolverError` when there is none).  0 = no wall-clock limit;
        the counted budgets (``det_time``, model size) are then those of
        :data:`DEFAULT_TIME_LIMIT`.
    workers : int
        CP-SAT search workers when ``deterministic`` is false, capped at
        ``os.cpu_count()`` (the deterministic search uses one).
    seed : int
        CP-SAT ``random_seed`` and the heuristics' seed.
    resolution : float
        Seconds per integer unit; 0 = automatic (:func:`~.data.auto_resolution` of
        the hint's makespan, or of the serial bound).
    congestion : {"channel", "port", "none"}
        As the simulator; the placement is scored under the same rule.
    hint : str
        ``auto`` (best of adjusting, heft, single-device, whichever are
        registered), ``none``, or one algorithm's name.
    quiet : bool
        No progress lines (warnings about size and missing solutions still
        go to stderr).
    deterministic : bool
        Reproducible search (the project's "same input and seed, same
        output"): the search stops at a counted budget, CP-SAT's
        deterministic time ``det_time`` (see :func:`search`); the wall
        clock only caps it, and when it does a line on stderr says the
        result may differ between runs (``estimate.repeatable`` false).
        ``deterministic=False`` searches with ``workers`` in parallel until
        the wall-clock budget; then only a proven optimum's objective is
        repeatable.
    det_time : float
        The deterministic budget in CP-SAT deterministic-time units (about
        seconds of one core of a fast machine); 0 = ``DET_PER_SECOND`` x
        *time_limit*.

    Returns
    -------
    Placement
        With a per-device ``order`` (solver start times, ties by topological
        index) and an ``estimate`` whose fields :mod:`.result` lists: an
        honest ``status`` (never FEASIBLE called optimal; on a coarse graph
        it holds for the coarse graph), the simulated ``makespan_s``, the
        solver's objective, bound and gap, the warm start's, and
        ``repeatable``.

    Raises
    ------
    Infeasible
        CP-SAT proves that no placement fits (memory), or a group fits on no
        device.
    SolverError
        No solution within the budget (or a model too large for it) and no
        memory-feasible heuristic.

    Notes
    -----
    Never worse than the warm start (see :mod:`.result`).

    deadline : float, optional
        The :func:`time.perf_counter` reading at which the wall clock ends
        (``registry.place`` passes the command's start + *time_limit*);
        default: *time_limit* from this call's start.

    References
    ----------
    Moirai (moirai.txt) III-D, Eq. 4-8; the OR-Tools flexible job-shop
    sample for the interval formulation.
    """
    t0 = time.perf_counter()
    end = deadline if deadline is not None else registry.deadline(time_limit, t0)
    cp_model = cp_module()  # the import (about a second) counts against the limit
    console = stderr_console()
    quiet = quiet or not chatty()  # placer compare runs cells quietly unless -v
    _check_args(congestion, time_limit, det_time)
    budget_s = time_limit or DEFAULT_TIME_LIMIT  # what the counted budgets derive from
    workers = 1 if deterministic else max(1, min(int(workers), os.cpu_count() or 1))
    det_budget = det_time if det_time > 0 else DET_PER_SECOND * budget_s
    n, k = graph.n, cluster.k
    costs = cost_model(graph, cluster, costs)
    params = {"workers": workers, "congestion": congestion}
    if deterministic:
        params["det_time"] = det_budget
    if n == 0:
        return _empty_placement(graph, cluster, params, seed)
    if graph.total_memory() > cluster.total_memory():
        raise Infeasible(f"milp: graph '{graph.name}' needs {graph.total_memory()} bytes but cluster "
                         f"'{cluster.name}' has {cluster.total_memory()} in all; no placement fits")
    call = Call(graph, cluster, costs, congestion, seed, deterministic, console, quiet, params)
    call.warm = warm_start(call, hint, time_limit)
    call.base_est = _base_estimate(call)
    msg = too_large(graph, k, budget_s)
    if msg:
        return give_up(call, msg, "UNKNOWN", "model too large for the time limit",
                       f"model not built ({n} nodes, {model_size(graph, k)} intervals); returned hint '{{hint}}'")
    if n > LARGE:
        console.print(f"milp: {n} nodes is large for CP-SAT; expect no optimality proof within {time_limit:g} s "
                      f"(consider `placer coarsen` first)")
    best = call.warm.best
    res = choose_resolution(graph, costs, resolution, best.makespan if best is not None else None)
    params["resolution"] = res
    model, mv = hinted_model(graph, cluster, best, call.warm.fallback is not None, res, congestion, costs)
    cap = search_cap(end, time_limit, call.warm)
    if cap <= 0.0:
        return give_up(call, f"milp: no time left for the search within --time-limit {time_limit:g} s; coarsen "
                             f"first or raise it", "UNKNOWN", "no time left to search",
                       "no time left to search; returned hint '{hint}'", {"repeatable": False})
    solver, status, wall_cut = search(cp_model, model, deterministic=deterministic, workers=workers,
                                      det_budget=det_budget, cap=cap, seed=seed, res=res, console=console,
                                      quiet=quiet)
    search_est = {"resolution_s": res, "solve_time_s": time.perf_counter() - t0,
                  "repeatable": bool(deterministic and not wall_cut and not call.warm.chain_cut)}
    if deterministic:
        search_est["det_time_used"] = solver.deterministic_time
    return _outcome(cp_model, call, model, mv, solver, status, search_est)
