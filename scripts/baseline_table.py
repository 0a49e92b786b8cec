#!/usr/bin/env python
"""Markdown table of simulated makespans: every registered placement
algorithm on the sample graphs, on one cluster (default 4xV100-pcie).

Every placement is judged by the same simulator (``channel`` congestion);
a cell shows the simulated makespan in ms, ``OOM`` when a device
overflows, and the row ``lower bound`` the simulator's LB.  ``given`` is
skipped (it needs a file).  Used for the README until ``placer compare``
exists.

    python scripts/baseline_table.py                 # default params
    python scripts/baseline_table.py --quick         # each entry's quick_params
    python scripts/baseline_table.py --graphs sample_graphs/layered_60.json --algos m-etf,heft
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.errors import PlacerError  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.sim.simulator import lower_bound, simulate  # noqa: E402

DEFAULT_GRAPHS = [ROOT / "sample_graphs" / f"layered_{n}.json" for n in (60, 300, 1000)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="*", default=[str(g) for g in DEFAULT_GRAPHS])
    ap.add_argument("--cluster", default=None, help="cluster file or bundled name (default 4xV100-pcie)")
    ap.add_argument("--algos", default=None, help="comma-separated subset (default: all registered)")
    ap.add_argument("--quick", action="store_true", help="use each algorithm's quick_params")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--congestion", default="channel", choices=("channel", "port", "none"))
    args = ap.parse_args(argv)

    cluster = load_cluster(args.cluster)
    graphs = [load_graph(g) for g in args.graphs]
    names = args.algos.split(",") if args.algos else [n for n in registry.names() if n != "given"]
    rows: list[list[str]] = []
    for name in names:
        entry = registry.get(name)
        params = dict(entry.quick_params) if args.quick else {}
        cells = [f"`{name}`"]
        for g in graphs:
            t0 = time.perf_counter()
            try:
                p = registry.place(g, cluster, name, seed=args.seed, params=params)
                rep = simulate(g, cluster, p, congestion=args.congestion)
            except (PlacerError, ImportError) as exc:
                cells.append(f"error: {str(exc)[:40]}")
                print(f"{name} on {g.name}: {exc}", file=sys.stderr)
                continue
            cell = f"{rep['makespan_s'] * 1e3:.2f}"
            if rep["status"] != "OK":
                cell += " OOM"
            cells.append(cell)
            print(f"{name} on {g.name}: {rep['makespan_s'] * 1e3:.3f} ms ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr)
        rows.append(cells)
    rows.append(["lower bound"] + [f"{lower_bound(g, cluster) * 1e3:.2f}" for g in graphs])

    header = ["algorithm"] + [f"{g.name} ({g.n} nodes)" for g in graphs]
    print(f"Simulated makespan (ms) on {cluster.name}, congestion={args.congestion}"
          f"{', quick params' if args.quick else ''}, seed {args.seed}:\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * len(graphs)) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
