"""Benchmark: ``place --algo auto`` (placer's optimizer, issue 13) against
every other registered algorithm, and on the 36,000-node layered graph.
Prints a Markdown section (``benchmarks/run.py`` appends it to BENCHMARKS.md).

1. Model zoo (``sample_graphs/zoo/*.json.gz``) on 4xV100-pcie: every other
   registered algorithm whose extra is installed, with its quick parameters
   (as ``placer compare --quick``), on the original graph, and ``auto`` with
   its defaults (10 s limit).  All simulated on the original graph (split
   placements on the graph they carry), channel congestion.  Reported:
   auto / best other (< 1 means auto wins) and its geometric mean.
2. ``placer profile --synthetic layered --nodes 36000 --seed 0``: ``placer
   place g.json`` (auto, defaults) through the real command line, timed wall
   clock (interpreter start, loading and writing included), then simulated:
   makespan / lower bound.

All ratios come from this one run; the machine is shared, so wall times are
noisy.  ``--quick`` runs the zoo only.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.compare.inputs import default_algorithms  # noqa: E402
from celeritas_cli.compare.tasks import algorithm_params  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.generate import layered_doc  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.model.jsonio import read_json, write_json  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.sim.simulator import lower_bound, simulate  # noqa: E402

CLUSTER = "4xV100-pcie"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_algo(graph, cluster, costs, algo: str, params: dict) -> dict:
    t0 = time.perf_counter()
    try:
        p = registry.place(graph, cluster, algo, params=params, costs=costs)
        rep = simulate(graph, cluster, p, costs=costs)
    except Exception as exc:  # a failing cell is a note, not a crash
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}", "time_s": time.perf_counter() - t0}
    return {"status": rep["status"], "makespan_s": rep["makespan_s"], "time_s": p.placement_time_s,
            "estimate": p.estimate}


def zoo(cluster) -> list[str]:
    files = sorted((ROOT / "sample_graphs" / "zoo").glob("*.json.gz"))
    others = [a for a in default_algorithms() if a != "auto"]
    rows, ratios = [], []
    for f in files:
        g = load_graph(str(f))
        costs = cost_model(g, cluster)
        res = {}
        for a in others:
            log(f"bench_auto: {g.name}: {a}")
            res[a] = run_algo(g, cluster, costs, a, algorithm_params(a, {}, {}, None, quick=True))
        log(f"bench_auto: {g.name}: auto")
        mine = run_algo(g, cluster, costs, "auto", {"quiet": True})
        ok = {a: r["makespan_s"] for a, r in res.items() if r["status"] == "OK"}
        best = min(ok, key=lambda a: (ok[a], a)) if ok else None
        est = mine.get("estimate", {})
        if best is not None and mine["status"] == "OK":
            ratios.append(mine["makespan_s"] / ok[best])
            ratio = f"{ratios[-1]:.3f}"
        else:
            ratio = "-"
        auto_ms = f"{mine['makespan_s']:.4g}" if "makespan_s" in mine else mine["status"]
        rows.append(f"| {g.name} | {g.n} | {best or '-'} | {ok.get(best, float('nan')):.4g} | {auto_ms}"
                    f"{'' if mine['status'] == 'OK' else ' (' + mine['status'] + ')'} | **{ratio}** | "
                    f"{est.get('winner', '-')}{' + refinement' if est.get('refined') else ''} | "
                    f"{100 * (est.get('refinement_gain') or 0):.1f} % | {est.get('evaluations', '-')} | "
                    f"{mine['time_s']:.1f} |")
    gmean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    return ["### Model zoo: auto vs the best other algorithm", "",
            f"Cluster `{cluster.name}`; every other registered algorithm ({len(others)}: "
            f"{', '.join(others)}) with its quick parameters, `auto` with its defaults; simulated makespan of "
            "one training step on the original graph. auto / best < 1: auto wins.", "",
            "| graph | nodes | best other | its makespan (s) | auto (s) | auto / best | auto's start | "
            "refinement gain | evaluations | auto time (s) |",
            "|:---|---:|:---|---:|---:|---:|:---|---:|---:|---:|", *rows, "",
            f"Geometric mean of auto / best other: **{gmean:.3f}** over {len(ratios)} graphs.", ""]


def layered36(cluster, n: int = 36_000, seed: int = 0) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-auto-") as tmp:
        gpath, ppath = os.path.join(tmp, "g.json"), os.path.join(tmp, "p.json")
        write_json(layered_doc(n, seed=seed), gpath)
        cmd = [sys.executable, "-m", "celeritas_cli", "place", gpath, "--cluster", CLUSTER, "-o", ppath]
        log(f"bench_auto: layered {n}: placer place (auto)")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return [f"_layered {n}: placer place failed: {proc.stderr.strip().splitlines()[-1:]}_", ""]
        g = load_graph(gpath)
        p = Placement.from_dict(read_json(ppath), ppath)
    costs = cost_model(g, cluster)
    rep = simulate(g, cluster, p, costs=costs)
    lb = lower_bound(g, cluster, costs)
    est = p.estimate
    cut = "yes" if est.get("clock_cut") else "no"
    return ["### Layered 36,000 nodes: auto through the command line", "",
            f"`placer profile --synthetic layered --nodes {n} --seed {seed}` on `{cluster.name}`; "
            "`placer place g.json` (auto, default 10 s limit), wall clock of the whole command.", "",
            "| nodes | lower bound (s) | auto makespan (s) | makespan / LB | best start | start / LB | "
            "evaluations | clock cut | wall (s) |", "|---:|---:|---:|---:|:---|---:|---:|:---:|---:|",
            f"| {g.n} | {lb:.4g} | {rep['makespan_s']:.4g} | **{rep['makespan_s'] / lb:.3f}** | "
            f"{est.get('winner')} | {est.get('start_makespan_s', float('nan')) / lb:.3f} | "
            f"{est.get('evaluations')} / {est.get('evaluation_budget', 0):.0f} | {cut} | {wall:.1f} |", ""]


def main(argv: list[str]) -> int:
    cluster = load_cluster(CLUSTER)
    out = ["## auto: placer's optimizer (benchmarks/bench_auto.py)", ""]
    out += zoo(cluster)
    if "--quick" not in argv:
        out += layered36(cluster)
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
