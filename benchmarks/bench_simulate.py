"""Benchmark: `simulate` on synthetic graphs up to 100,000 nodes with a
4-device placement (issue: foundation).  Prints a Markdown section.

Times are reported as ratios to reading + validating the same graph file in
the same process (the machine is shared and noisy; absolute seconds are
given for orientation only).
"""

from __future__ import annotations

import os
import sys
import tempfile

from timing import best_of  # benchmarks/timing.py (scripts run from this folder)

from celeritas_cli.model.generate import layered_doc
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate


def main(sizes=(1000, 10_000, 100_000)) -> None:
    cluster = load_cluster(None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"g{n}.json")
            write_json(layered_doc(n, seed=1), path)
            t_load, g = best_of(lambda: load_graph(path))
            # a 4-device placement: contiguous quarters of the topological order, colocation kept
            topo = g.topo_order()
            dev = [0] * g.n
            for i, v in enumerate(topo):
                dev[v] = min(3, 4 * i // g.n)
            groups = g.colocation_groups()
            for members in groups.values():
                for v in members[1:]:
                    dev[v] = dev[members[0]]
            p = Placement.from_indices(g, cluster, dev, algorithm="quarters")
            t_sim, rep = best_of(lambda: simulate(g, cluster, p))
            t_nc, _ = best_of(lambda: simulate(g, cluster, p, congestion="none"))
            rows.append((n, g.m, t_load, t_sim, t_nc, rep["transfers"]["count"], rep["makespan_over_lb"]))
    print("## simulate: discrete-event simulator scaling\n")
    print("4 devices (4xV100-pcie), placement = contiguous quarters of the topological order. "
          "Times are best of 2, as ratios to loading + validating the same graph file in the same run.\n")
    print("| nodes | edges | load (s) | simulate / load | simulate no-congestion / load | transfers | makespan / LB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, m, tl, ts, tn, tr, ratio in rows:
        print(f"| {n:,} | {m:,} | {tl:.3f} | {ts / tl:.2f} | {tn / tl:.2f} | {tr:,} | {ratio:.2f} |")
    print(f"\nLargest graph: {rows[-1][0]:,} nodes simulated in {rows[-1][3]:.2f} s on this machine.\n")


if __name__ == "__main__":
    sizes = tuple(int(x) for x in sys.argv[1:]) or (1000, 10_000, 100_000)
    main(sizes)
