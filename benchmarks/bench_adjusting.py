"""Benchmark: the Celeritas rows on the model zoo (issue 13 items 2-3).

For each zoo graph on 4xV100-pcie: the cpd coarse graph with the default
parameters (``default_parameters``) and with the paper's R = 200, placed by
Order-Place, by Adjusting Placement with the literal Eq. 7 (``congestion=
none``) and with transfers as tasks (the default), every placement simulated
on the ORIGINAL graph under the simulator's default ``channel`` rule.  The
last column checks that Adjusting's own schedule is the simulator's: with
``order=true`` its ``schedule_makespan_s`` equals the simulated makespan of
the coarse graph.  Prints a Markdown section.
"""

from __future__ import annotations

import sys
from pathlib import Path

from celeritas_cli import registry
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.sim.simulator import simulate

ZOO = Path(__file__).resolve().parent.parent / "sample_graphs" / "zoo"


def row(path: Path, cluster) -> str:
    g = load_graph(str(path))

    def ms(placement) -> str:
        rep = simulate(g, cluster, placement)
        return f"{rep['makespan_s']:.3f}" + ("" if rep["status"] == "OK" else " OOM")

    cg = registry.coarsen(g, cluster, "cpd")
    paper = registry.coarsen(g, cluster, "cpd", params={"R": 200, "M": 0.25})
    op = registry.place(cg, cluster, "order-place")
    eq7 = registry.place(cg, cluster, "adjusting", params={"congestion": "none"})
    tasks = registry.place(cg, cluster, "adjusting")
    tasks_paper = registry.place(paper, cluster, "adjusting")
    exact = registry.place(cg, cluster, "adjusting", params={"order": "true"})
    same = exact.estimate["schedule_makespan_s"] == simulate(cg, cluster, exact)["makespan_s"]
    return (f"| {g.name} | {g.n:,} | {cg.meta['cpd']['R']} / {cg.n} | {ms(op)} | {ms(eq7)} | {ms(tasks)} | "
            f"{paper.n} / {ms(tasks_paper)} | {'yes' if same else 'NO'} ({exact.estimate['retimes']}) |")


def main() -> None:
    cluster = load_cluster(None)
    print("## Celeritas rows: cpd + Order-Place / Adjusting Placement on the model zoo\n")
    print("4xV100-pcie; simulated makespan (s) on the original graph, channel congestion.  "
          "`R / coarse nodes`: cpd's default parameters; Eq. 7: Adjusting with `-p congestion=none` "
          "(transfers never wait, the paper's literal EST); tasks: the default, input transfers queued on the "
          "links (Celeritas 6.1).  R=200: the paper's range with the default Adjusting.  Exact: with `-p "
          "order=true`, Adjusting's own makespan equals the simulated one (re-timings needed).\n")
    print("| graph | nodes | R / coarse nodes | Order-Place | Adjusting Eq. 7 | Adjusting tasks | "
          "R=200: coarse nodes / Adjusting | exact (re-timings) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for path in sorted(p for p in ZOO.glob("*.json.gz") if not p.name.startswith("gpt_")):   # Celeritas' zoo
        try:
            print(row(path, cluster), flush=True)
        except Exception as exc:  # a benchmark row fails alone
            print(f"| {path.name} | failed: {type(exc).__name__}: {exc} |||||||", flush=True)
    print()


if __name__ == "__main__":
    sys.exit(main())
