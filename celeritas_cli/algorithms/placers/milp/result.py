"""The placement ``milp`` returns, with an honest status.

The solver's incumbent is read back (:func:`solution`), re-simulated, and
returned only when it is no slower than the warm start - judged on the
original graph when the graph solved is a coarse one whose original is
known (``Graph.origin``), else on the graph solved.  CP-SAT's OPTIMAL is
written only when the returned placement's simulated makespan meets the
proven bound within the rounding (:func:`honest_status`); on a coarse graph
it holds for the coarse graph only (``estimate.graph == "coarse"``, the
stderr line says "OPTIMAL (coarse graph)").  When there is no solver
solution, the warm start is returned with a note and a caveat
(:func:`hint_placement`).

The estimate: ``status`` (CP-SAT's status, except that OPTIMAL is
downgraded to FEASIBLE when the returned placement's simulated makespan
does not meet the proven bound within the rounding, or when the time grid
is coarse), ``solver_status``, ``makespan_s`` (simulated makespan of the
returned placement, ``makespan_by: "simulator"``), ``objective_s``,
``best_bound_s`` (a real lower bound: CP-SAT's bound less ``rounding_s``,
:func:`~.data.rounding_seconds`, or the simulator's ``lower_bound_s`` when
that is higher), ``gap`` (CP-SAT's own, in its integers),
``resolution_s``, ``rounding_s``, ``time_grid`` (``fine``, or ``coarse``
with a ``grid_note`` when the rounding is more than :data:`COARSE_GRID` of
the makespan: then neither objective nor bound says much, and the status
is never OPTIMAL), ``hint`` / ``hint_makespan_s``, ``source`` (``solver`` or
``hint``), ``det_time`` / ``det_time_used``, ``repeatable`` and a ``note``
when the hint was returned.  Status, makespan and bounds hold for the
graph solved: on a coarse graph ``estimate.graph`` is ``"coarse"``, and
when the original graph is known (``graph.origin``) ``original_makespan_s``
is the returned placement's makespan on it (``hint_original_makespan_s``
the warm start's).  A placement that is optimal for a coarse graph may lose
to a heuristic on the original; then the heuristic is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....errors import SolverError
from ....model.cluster import Cluster
from ....model.costs import CostModel
from ....model.graph import Graph
from ....model.placement import Placement
from ....sim.judge import original_makespan
from ....sim.simulator import run_schedule
from .data import rounding_seconds
from .hints import Hint
from .model import MilpVars

#: a time grid whose rounding (``rounding_s``) exceeds this share of the makespan is coarse
COARSE_GRID = 0.05


@dataclass
class WarmStart:
    """The warm-start chain's outcome: ``best`` heuristic (may be OOM),
    ``chain_cut`` (the wall clock stopped the chain), ``fallback`` (best if
    it fits memory), ``fb_orig`` (its makespan on the original graph, when
    known) and ``orig_s`` (seconds one original-graph simulation took)."""

    best: Hint | None = None
    chain_cut: bool = False
    fallback: Hint | None = None
    fb_orig: float | None = None
    orig_s: float = 0.0


@dataclass
class Call:
    """What one :func:`~.solver.solve` call writes into every result."""

    graph: Graph
    cluster: Cluster
    costs: CostModel
    congestion: str
    seed: int
    deterministic: bool
    console: object
    quiet: bool
    params: dict
    warm: WarmStart = field(default_factory=WarmStart)
    base_est: dict = field(default_factory=dict)

    def placement(self, device_of: list[int], order, est: dict) -> Placement:
        return Placement.from_indices(self.graph, self.cluster, device_of, algorithm="milp", order=order,
                                      params=self.params, seed=self.seed, estimate=est)


def solution(graph: Graph, k: int, mv: MilpVars, solver) -> tuple[list[int], list[list[int]]]:
    """Device per node and per-device order (solver start times, ties by
    end time then topological index) of the solver's incumbent."""
    n = graph.n
    units_dev = [next(d for d in range(k) if mv.x[u][d] is not None and solver.boolean_value(mv.x[u][d]))
                 for u in range(len(mv.units))]
    device_of = [units_dev[mv.unit_of[v]] for v in range(n)]
    starts = [solver.value(mv.start[v]) for v in range(n)]
    ends = [solver.value(mv.end[v]) for v in range(n)]
    topo_idx = graph.topo_index()
    order = [sorted((v for v in range(n) if device_of[v] == d), key=lambda v: (starts[v], ends[v], topo_idx[v]))
             for d in range(k)]
    return device_of, order


def honest_status(optimal: bool, makespan_s: float, bound_s: float, tol_s: float, coarse: bool = False) -> str:
    """``OPTIMAL`` only when CP-SAT proved optimality, the returned
    placement's simulated makespan meets the bound within *tol_s* (the
    rounding of every task) and the time grid is not *coarse*; else
    ``FEASIBLE`` - never FEASIBLE called optimal.

    Example
    -------
    >>> honest_status(True, 3.0, 2.5, 0.1), honest_status(True, 2.55, 2.5, 0.1)
    ('FEASIBLE', 'OPTIMAL')
    >>> honest_status(True, 2.55, 2.5, 0.1, coarse=True)
    'FEASIBLE'
    """
    return "OPTIMAL" if optimal and not coarse and makespan_s <= bound_s + tol_s else "FEASIBLE"


def grid_fields(call: Call, mv: MilpVars, model_bound_s: float, makespan_s: float) -> dict:
    """``rounding_s``, the real ``best_bound_s`` and ``time_grid`` (with a
    ``grid_note`` when coarse) of a solve at ``mv.resolution`` (module
    docstring).

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> from celeritas_cli.algorithms.placers.milp.model import build_model
    >>> g = build("g", [{"id": "a", "compute_s": 1e-4, "memory_bytes": 0}], [])
    >>> c = uniform(2)
    >>> _, mv = build_model(g, c, resolution=10.0)
    >>> call = Call(g, c, cost_model(g, c), "channel", 0, True, None, True, {})
    >>> f = grid_fields(call, mv, 10.0, 1e-4)
    >>> f["time_grid"], f["best_bound_s"] <= 1e-4
    ('coarse', True)
    """
    res = mv.resolution
    rounding = rounding_seconds(call.graph, call.cluster, res, call.costs, (mv.dur, mv.comm))
    bound = max(0.0, model_bound_s - rounding, call.base_est.get("lower_bound_s") or 0.0)
    out = {"rounding_s": rounding, "best_bound_s": bound, "time_grid": "fine"}
    if rounding > COARSE_GRID * makespan_s:
        out["time_grid"] = "coarse"
        out["grid_note"] = (f"the time grid ({res:g} s per unit) is coarse for this schedule: rounding every time to "
                            f"it moves a schedule by up to {rounding:.3g} s against a makespan of {makespan_s:.3g} s, "
                            f"so the solver's objective and status say little; set -p resolution finer")
    return out


def hint_placement(call: Call, status: str, why: str, note: str, extra: dict | None = None) -> Placement:
    """The warm start returned instead of a solver solution (*why*)."""
    fallback, fb_orig = call.warm.fallback, call.warm.fb_orig
    assert fallback is not None
    est = {**call.base_est, "status": status, "makespan_s": fallback.makespan, "source": "hint",
           "hint": fallback.name, "hint_makespan_s": fallback.makespan, "note": note,
           "repeatable": bool(call.deterministic and not call.warm.chain_cut)}
    if fb_orig is not None:
        est["original_makespan_s"] = fb_orig
    est.update(extra or {})
    est["source"] = "hint"
    est["caveat"] = f"the warm start '{fallback.name}', not a solver solution ({why})"
    return call.placement(fallback.device_of, fallback.order, est)


def give_up(call: Call, msg: str, status: str, why: str, note: str, extra: dict | None = None) -> Placement:
    """Say *msg* on stderr; return the memory-feasible warm start (*note*
    with ``{hint}`` its name), or raise :class:`SolverError` when there is none."""
    call.console.print(msg)
    if call.warm.fallback is None:
        raise SolverError(msg)
    return hint_placement(call, status, why, note.format(hint=call.warm.fallback.name), extra)


def _hint_wins(call: Call, est: dict, sim: float, sim_orig: float | None, honest) -> Placement | None:
    """The warm start, when the solver's placement simulates slower than it
    (on the original graph when both are known there), else None."""
    fallback, fb_orig = call.warm.fallback, call.warm.fb_orig
    judged_orig = sim_orig is not None and fb_orig is not None
    if fallback is None or not ((fb_orig < sim_orig) if judged_orig else (fallback.makespan < sim)):
        return None
    on = "on the original graph " if judged_orig else ""
    mine, theirs = (sim_orig, fb_orig) if judged_orig else (sim, fallback.makespan)
    est.update({"solver_makespan_s": sim, "status": honest(fallback.makespan), "source": "hint",
                "note": f"solver's placement simulates to {mine:.6g} s {on}, worse than hint "
                        f"'{fallback.name}' ({theirs:.6g} s); returned the hint".replace(" ,", ",")})
    if sim_orig is not None:
        est["solver_original_makespan_s"] = sim_orig
    est["makespan_s"] = fallback.makespan
    est["caveat"] = f"the warm start '{fallback.name}': the solver's placement simulated slower {on}".strip()
    if fb_orig is not None:
        est["original_makespan_s"] = fb_orig
    return call.placement(fallback.device_of, fallback.order, est)


def solver_placement(call: Call, mv: MilpVars, solver, optimal: bool, status_name: str, est: dict) -> Placement:
    """The placement to return: the solver's, or the warm start when that
    simulates faster (on the original graph when it is known)."""
    graph, cluster, best = call.graph, call.cluster, call.warm.best
    res = mv.resolution
    device_of, order = solution(graph, cluster.k, mv, solver)
    sim = run_schedule(graph, cluster, device_of, order, congestion=call.congestion, costs=call.costs).makespan
    sim_orig = original_makespan(graph, cluster, device_of, order, congestion=call.congestion, costs=call.costs)
    obj = solver.objective_value * res
    sim_best = min(sim, best.makespan) if best is not None and call.warm.fallback is not None else sim
    grid = grid_fields(call, mv, solver.best_objective_bound * res, sim_best)
    bound = grid["best_bound_s"]
    coarse = grid["time_grid"] == "coarse"
    gap = (obj - solver.best_objective_bound * res) / obj if obj > 0 else 0.0  # CP-SAT's own, in its integers
    est.update({"status": status_name, "solver_status": status_name, "objective_s": obj, **grid, "gap": gap})
    if best is not None:
        est["hint"] = best.name
        est["hint_makespan_s"] = best.makespan
    where = " (coarse graph)" if graph.is_coarse else ""
    if not call.quiet or coarse:
        call.console.print(f"milp: {status_name}{where} objective {obj:.6g} s, bound {bound:.6g} s, gap {gap:.2%}; "
                           f"simulated {sim:.6g} s" + (f", hint {best.makespan:.6g} s" if best is not None else "")
                           + (f"; on the original graph {sim_orig:.6g} s" if sim_orig is not None else "")
                           + (f"; {grid['grid_note']}" if coarse else ""))
    tol = res * (graph.n + len(graph.tensor_src)) + grid["rounding_s"]

    def honest(ms: float) -> str:
        return honest_status(optimal, ms, bound, tol, coarse)

    hint_won = _hint_wins(call, est, sim, sim_orig, honest)
    if hint_won is not None:
        return hint_won
    est.update({"status": honest(sim), "makespan_s": sim, "source": "solver"})
    if sim_orig is not None:
        est["original_makespan_s"] = sim_orig
    return call.placement(device_of, order, est)
