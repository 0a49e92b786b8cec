"""Benchmark: ``place --algo auto`` (placer's optimizer, issue 13) against
every other registered algorithm, and on the 36,000-node layered graph.
Prints a Markdown section (``benchmarks/run.py`` appends it to BENCHMARKS.md).

1. Model zoo (``sample_graphs/zoo/*.json.gz``) on 4xV100-pcie, plus the
   transformer on moirai-intra-server (two V100 32 GiB + two P100 16 GiB:
   heterogeneous, and the 72.7 GiB model fills three quarters of it): every
   other registered algorithm whose extra is installed - ``data-parallel``
   (FastT's DP baseline) included - with its quick parameters (as ``placer
   compare --quick``), and ``auto`` with its defaults (10 s limit).  All
   simulated by ``placer simulate``'s code on the graph given (derived
   placements on the graph their recipe rebuilds), channel congestion.
   Reported per row: the best other algorithm and its makespan, the
   data-parallel makespan, auto's makespan, **auto / best other** (< 1:
   auto wins), auto / its lower bound (the simulator's bound of the graph
   auto's answer runs, ``sim/bounds.py``), the candidate auto refined
   (``winner``), the refinement gain, and auto's wall time (the
   ``registry.place`` call: portfolio, refinement, writing nothing); then
   the geometric means of auto / best other.
2. ``placer profile --synthetic layered --nodes 36000 --seed 0``: ``placer
   place g.json`` (auto, defaults) through the real command line, timed wall
   clock (interpreter start, loading and writing included), then simulated:
   makespan / lower bound.

All ratios come from this one run; the machine is shared, so wall times are
noisy.  ``--quick`` runs part 1 only.
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

from timing import fmt_makespan, run_cell  # noqa: E402  (benchmarks/timing.py)

from celeritas_cli.compare.inputs import default_algorithms  # noqa: E402
from celeritas_cli.compare.tasks import algorithm_params  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.generate import layered_doc  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.model.jsonio import read_json, write_json  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.sim.simulator import lower_bound, simulate  # noqa: E402

CLUSTER = "4xV100-pcie"
ZOO = ("inception_v3", "nmt", "resnet50", "tensor_holography", "transformer")
#: (zoo graph, cluster): the five graphs on the default cluster, then the tight heterogeneous row
CASES = [(g, CLUSTER) for g in ZOO] + [("transformer", "moirai-intra-server")]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def case_row(gname: str, cname: str, others: list[str]) -> tuple[str, float | None]:
    """The table row of one (graph, cluster) case and its auto / best-other ratio."""
    g = load_graph(str(ROOT / "sample_graphs" / "zoo" / f"{gname}.json.gz"))
    cluster = load_cluster(cname)
    costs = cost_model(g, cluster)
    res = {}
    for a in others:
        log(f"bench_auto: {gname} on {cname}: {a}")
        res[a] = run_cell(g, cluster, costs, a, algorithm_params(a, {}, {}, None, quick=True))
    log(f"bench_auto: {gname} on {cname}: auto")
    mine = run_cell(g, cluster, costs, "auto", {"quiet": True})
    ok = {a: r["makespan_s"] for a, r in res.items() if r["status"] == "OK"}
    best = min(ok, key=lambda a: (ok[a], a)) if ok else None
    ratio = mine["makespan_s"] / ok[best] if best is not None and mine["status"] == "OK" else None
    lb = mine.get("lower_bound_s") or 0.0
    over_lb = f"{mine['makespan_s'] / lb:.3f}" if lb > 0 and "makespan_s" in mine else "-"
    won = f"{mine.get('winner') or '-'}{' + refinement' if mine.get('refined') else ''}"
    row = (f"| {gname} | {cname} | {g.n} | {best or '-'} | {fmt_makespan(res.get(best))} | "
           f"{fmt_makespan(res.get('data-parallel'))} "
           f"| {fmt_makespan(mine)} | **{'-' if ratio is None else f'{ratio:.3f}'}** | {over_lb} | {won} | "
           f"{100 * (mine.get('refinement_gain') or 0):.1f} % | {mine['wall_s']:.1f} |")
    return row, ratio


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def zoo() -> list[str]:
    others = [a for a in default_algorithms() if a != "auto"]
    rows, ratios = [], {}
    for gname, cname in CASES:
        row, ratio = case_row(gname, cname, others)
        rows.append(row)
        if ratio is not None:
            ratios[(gname, cname)] = ratio
    zoo_r = [r for (g, c), r in ratios.items() if c == CLUSTER]
    return ["### Model zoo: auto vs the best other algorithm", "",
            f"Every other registered algorithm ({len(others)}: {', '.join(others)}) with its quick parameters, "
            "`auto` with its defaults; simulated makespan of one training step (derived placements - data "
            "parallelism, splits - on the graph their recipe rebuilds). auto / best < 1: auto wins. auto / LB: "
            "the simulator's lower bound of the graph auto's answer runs. Wall: auto's `place` call.", "",
            "| graph | cluster | nodes | best other | its makespan (s) | data-parallel (s) | auto (s) | "
            "auto / best | auto / LB | auto's winner | refinement gain | auto wall (s) |",
            "|:---|:---|---:|:---|---:|---:|---:|---:|---:|:---|---:|---:|", *rows, "",
            f"Geometric mean of auto / best other: **{_gmean(zoo_r):.3f}** over the {len(zoo_r)} zoo graphs on "
            f"{CLUSTER}; **{_gmean(list(ratios.values())):.3f}** over all {len(ratios)} rows.", ""]


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
    out = ["## auto: placer's optimizer (benchmarks/bench_auto.py)", ""]
    out += zoo()
    if "--quick" not in argv:
        out += layered36(load_cluster(CLUSTER))
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
