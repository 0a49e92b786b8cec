"""Benchmark of ``place --algo milp`` (Moirai III-D on CP-SAT) on coarse graphs.

For each target size (default 50, 100, 250 coarse nodes) a synthetic
layered training graph of ``fine`` x size nodes is coarsened - with the
registered ``cpd`` method (Celeritas Optimal_BP) when present, its range R
bisected to land near the size, else by cutting the topological order into
equal chunks with :func:`celeritas_cli.transform.contract.contract` - and placed by
``milp`` under a time limit.  Prints a Markdown table to stdout:

    size | fine | status | makespan | hint | ratio | gap | bound | time

``makespan`` and ``hint`` are simulated on the coarse graph (the model's
graph; ``hint`` is the best warm start), ``fine`` makespan is the same
placement simulated on the original graph, ratio = fine makespan / the warm
start's fine makespan (<= 1 by construction: milp knows the original graph
here and judges its candidates on it), status and gap (CP-SAT's (objective -
bound) / objective) hold for the coarse graph, time = wall time of the whole
``place`` call.

Usage::

    python benchmarks/bench_milp.py [--sizes 50,100,250] [--time-limit 20]
        [--cluster moirai-inter-server] [--workers 8] [--seed 0]

A script, not a test: it takes about (time limit + a few s) per size.
"""

from __future__ import annotations

import argparse
import sys
import time

from celeritas_cli import registry
from celeritas_cli.transform.contract import contract
from celeritas_cli.model.generate import layered
from celeritas_cli.model.io import load_cluster
from celeritas_cli.sim.simulator import simulate


def coarse_graph(g, cluster, target: int):
    """A coarse graph of about *target* nodes (cpd if registered, else chunks)."""
    if "cpd" in registry.coarsener_names():
        lo, hi = 1, max(2, g.n)
        best = None
        while lo <= hi:  # larger R -> fewer clusters
            r = (lo + hi) // 2
            cg = registry.coarsen(g, cluster, "cpd", params={"R": r})
            if best is None or abs(cg.n - target) < abs(best[1].n - target):
                best = (r, cg)
            if cg.n > target:
                lo = r + 1
            elif cg.n < target:
                hi = r - 1
            else:
                break
        return best[1], f"cpd R={best[0]}"
    topo = g.topo_order()
    cof = [0] * g.n
    for i, v in enumerate(topo):
        cof[v] = i * target // g.n
    return contract(g, cof, method="chunk"), "chunk"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50,100,250")
    ap.add_argument("--fine", type=int, default=8, help="original nodes per coarse node")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--cluster", default="moirai-inter-server")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--congestion", default="channel", choices=("channel", "port", "none"))
    args = ap.parse_args(argv)
    cluster = load_cluster(args.cluster)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        g = layered(args.fine * size, seed=args.seed)
        cg, how = coarse_graph(g, cluster, size)
        t0 = time.perf_counter()
        p = registry.place(cg, cluster, "milp", seed=args.seed,
                           params={"time_limit": args.time_limit, "workers": args.workers,
                                   "congestion": args.congestion})
        wall = time.perf_counter() - t0
        e = p.estimate
        ms = simulate(cg, cluster, p, congestion=args.congestion)["makespan_s"]
        fine = simulate(g, cluster, p, congestion=args.congestion)["makespan_s"]
        hint = e.get("hint_makespan_s")
        hint_fine = e.get("hint_original_makespan_s")
        rows.append((cg.n, g.n, how, e.label(), e.get("source"), ms, fine, hint,
                     fine / hint_fine if hint_fine else None, e.get("gap"), e.get("best_bound_s"), wall))
        print(f"bench_milp: {cg.n} nodes done in {wall:.1f} s", file=sys.stderr)

    def f(x, spec=".4g"):
        return "-" if x is None else format(x, spec)

    print(f"milp on {cluster.name}, time limit {args.time_limit:g} s, congestion {args.congestion}, "
          f"workers {args.workers} (deterministic search: 1)\n")
    print("| size | fine nodes | coarsening | status | from | makespan (s) | fine makespan (s) | hint (s) "
          "| fine ratio | gap | bound (s) | time (s) |")
    print("|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (n, fn, how, st, src, ms, fine, hint, ratio, gap, bound, wall) in rows:
        print(f"| {n} | {fn} | {how} | {st} | {src} | {f(ms)} | {f(fine)} | {f(hint)} | {f(ratio, '.3f')} "
              f"| {f(gap, '.1%')} | {f(bound)} | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
