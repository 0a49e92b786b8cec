"""Benchmark: pipeline schedules as orders (issue 22.3) on the model zoo.

For each model and cluster: ``S`` stages (one per device, in the cluster's
device order, and the same rotated by half, so the slower devices come
first on moirai-intra-server) cut from the CPD-TOPO order and balanced by
time (:func:`celeritas_cli.pipelining.cuts.balanced_stages`), ``m``
micro-batches, and the GPipe, 1F1B and interleaved (two model chunks per
device) schedules (:func:`~celeritas_cli.pipelining.builder.staged_plan`),
each simulated by the judge: the step time, the ideal bubble fraction
(Narayanan et al. SC'21: ``(p-1)/m``, ``(p-1)/(v m)``), the slowest
device's busy time and the largest idle time.  No planner chooses anything
here (that is ``place --algo pipeline``, issue 23): the numbers are what a
plain balanced cut gives.

Prints Markdown to stdout (``benchmarks/run.py`` appends it to
BENCHMARKS.md).  Usage::

    python benchmarks/bench_pipeline.py [--models transformer,nmt] [--clusters moirai-intra-server] [--m 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.pipelining.cuts import balanced_stages  # noqa: E402
from celeritas_cli.pipelining.builder import staged_plan  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rows(model: str, cluster_name: str, m: int) -> list[str]:
    g = load_graph(ROOT / "sample_graphs" / "zoo" / f"{model}.json.gz")
    c = load_cluster(cluster_name)
    half = c.k // 2
    out = []
    for devs in (list(c.ids), list(c.ids[half:] + c.ids[:half])):
        plans = [("gpipe", devs), ("1f1b", devs), ("interleaved", devs * 2)]
        stages = {}
        for schedule, sdevs in plans:
            t0 = time.perf_counter()
            key = len(sdevs)
            if key not in stages:
                stages[key] = balanced_stages(g, c, sdevs)
            p = staged_plan(g, c, stages[key].stage_of, sdevs, m, schedule)
            p.split_graph = None
            rep = simulate(g, c, p)
            busy = max(d["busy_s"] for d in rep["devices"])
            idle = max(rep["makespan_s"] - d["busy_s"] for d in rep["devices"])
            out.append(f"| {model} | {cluster_name} | {' '.join(devs)} | {schedule} | {m} | "
                       f"{rep['makespan_s']:.4g} | {p.estimate['bubble_fraction']:.3f} | {busy:.4g} | {idle:.4g} | "
                       f"{rep['status']} |")
            log(f"{model} {cluster_name} {devs} {schedule}: {rep['makespan_s']:.4g} s "
                f"({time.perf_counter() - t0:.0f} s)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="transformer", help="zoo models (nmt: about 90 s a schedule)")
    ap.add_argument("--clusters", default="moirai-intra-server")
    ap.add_argument("--m", type=int, default=16, help="micro-batches")
    args = ap.parse_args()
    lines = ["## Pipeline schedules (balanced CPD-TOPO cut, one stage per device)", "",
             "Step time simulated by the judge (static memory rule until the time rule lands); bubble: the ideal "
             "fraction (p-1)/m, (p-1)/(v m) interleaved with v = 2; busy / idle: the slowest device's compute and "
             "the largest idle time.", "",
             "| model | cluster | stage devices | schedule | m | step (s) | bubble | max busy (s) | max idle (s) | "
             "status |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for model in args.models.split(","):
        for cluster in args.clusters.split(","):
            lines += rows(model, cluster, args.m)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
