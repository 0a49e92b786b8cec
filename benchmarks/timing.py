"""Helpers shared by the benchmark scripts (not a benchmark itself): best-of-k
timing, and one place-then-simulate cell with its table formatting."""

from __future__ import annotations

import time

from celeritas_cli import registry
from celeritas_cli.log import quiet
from celeritas_cli.sim.simulator import simulate


def best_of(fn, k: int = 2):
    """Run *fn* *k* times; return (best wall time in seconds, last result).
    Best-of-k is the least noisy statistic on a shared machine."""
    best = float("inf")
    out = None
    for _ in range(k):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_cell(graph, cluster, costs, algo: str, params: dict) -> dict:
    """One cell: place *graph* with *algo*, then simulate it (derived
    placements on the graph their recipe rebuilds); wall time of the
    ``place`` call.  A failure is a note (status ``error``), not a crash.
    The result is plain JSON (scripts cache it)."""
    t0 = time.perf_counter()
    try:
        with quiet():
            p = registry.place(graph, cluster, algo, params=params, costs=costs)
        wall = time.perf_counter() - t0
        rep = simulate(graph, cluster, p, costs=costs)
    except Exception as exc:  # a failing cell is a note, not a crash
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}", "wall_s": time.perf_counter() - t0}
    est = p.estimate or {}
    return {"status": rep["status"], "makespan_s": rep["makespan_s"], "lower_bound_s": rep["lower_bound_s"],
            "wall_s": wall, "winner": est.get("winner"), "refined": est.get("refined"),
            "refinement_gain": est.get("refinement_gain"), "clock_cut": est.get("clock_cut")}


def fmt_makespan(r: dict | None) -> str:
    """A cell's makespan for a table: ``-`` (not run), ``error``, or 4
    significant digits with the status when it is not OK."""
    if r is None:
        return "-"
    if r["status"] == "error":
        return "error"
    return f"{r['makespan_s']:.4g}" + ("" if r["status"] == "OK" else f" ({r['status']})")
