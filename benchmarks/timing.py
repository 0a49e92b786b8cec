"""Helpers shared by the benchmark scripts (not a benchmark itself): best-of-k
timing, and one place-then-simulate cell with its table formatting."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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


def ok(r: dict | None) -> bool:
    """A cell that ran and fits memory."""
    return r is not None and r["status"] == "OK"


def case_arguments(doc: str, cases_help: str, rows_help: str,
                   flags: dict[str, str] | None = None) -> tuple[argparse.Namespace, dict]:
    """The options of the zoo-table scripts (``--cases``, ``--rows``,
    ``--cache``, and the script's own on/off *flags*: name -> help) parsed,
    and the cache of finished cells they name."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--cases", default="", help=cases_help)
    ap.add_argument("--rows", default="", help=rows_help)
    ap.add_argument("--cache", default="", help="JSON file of finished cells to reuse and extend")
    for name, text in (flags or {}).items():
        ap.add_argument(name, action="store_true", help=text)
    args = ap.parse_args()
    cache = json.loads(Path(args.cache).read_text()) if args.cache and Path(args.cache).exists() else {}
    return args, cache


def zoo_case(gname: str, cname: str):
    """``(graph, cluster, cost model, mixed)`` of zoo graph *gname* on
    cluster *cname*; *mixed*: its devices differ in type or speed."""
    from celeritas_cli.model.costs import cost_model
    from celeritas_cli.model.io import load_cluster, load_graph

    g = load_graph(str(Path(__file__).resolve().parent.parent / "sample_graphs" / "zoo" / f"{gname}.json.gz"))
    c = load_cluster(cname)
    return g, c, cost_model(g, c), len({(d.type, d.speed) for d in c.devices}) > 1
