"""Benchmark: the pipeline planners (issue 23) - placer's ``pipeline``, the
peers' rows (``gpipe``, ``pipedream``, ``alpa-stages``), data parallelism,
sharded data parallelism (``fsdp``, equal and speed-proportional shares), the best placement
algorithms, and ``auto`` over all of them - on the model zoo on
4xV100-pcie and on the memory-tight moirai-intra-server (2xV100-32GB +
2xP100-16GB), and on the GPT 6.7B graph on 8xA100-nvswitch.

Every row is placed with its quick parameters (as ``placer compare
--quick``), ``auto`` with its defaults (10 s limit; its counted budget
decides unless the wall clock cuts it, which the table marks) and with the
same budget and no wall clock (``auto (budget only)``: what the default
answers on a machine that keeps up; the ratios use it where the clock cut
the default), and each
placement is simulated by ``placer simulate``'s code on the graph its
recipe rebuilds.  Reported per case: each row's simulated seconds per step
(OOM when a device is over memory), auto / the best other row, and auto /
auto before issue 23 (the numbers of BENCHMARKS.md then, :data:`TODAY`);
then the geometric mean of the latter over the ten cases.  For GPT 6.7B:
the work bound (total work / the devices' summed speed: every device busy
all step) and each row's simulated model FLOPs utilisation.

Prints Markdown to stdout (``benchmarks/run.py`` appends it to
BENCHMARKS.md).  Usage::

    python benchmarks/bench_planners.py [--cases transformer@moirai-intra-server,gpt] [--rows pipeline,auto]
        [--cache results.json]

``--cache`` keeps finished cells in a JSON file and reuses them (to run the
expensive cases apart); the ratios are still computed from one table.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import case_arguments, fmt_makespan, ok, run_cell, zoo_case  # noqa: E402

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.compare.tasks import algorithm_params  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.sim.mfu import mfu  # noqa: E402

ZOO = ("inception_v3", "nmt", "resnet50", "tensor_holography", "transformer")
CLUSTERS = ("4xV100-pcie", "moirai-intra-server")
#: auto's simulated seconds per step before issue 23 (BENCHMARKS.md, static memory rule on moirai-intra-server)
TODAY = {("inception_v3", "4xV100-pcie"): 0.4056, ("nmt", "4xV100-pcie"): 0.9008,
         ("resnet50", "4xV100-pcie"): 0.1608, ("tensor_holography", "4xV100-pcie"): 0.1122,
         ("transformer", "4xV100-pcie"): 1.681, ("inception_v3", "moirai-intra-server"): 0.472,
         ("nmt", "moirai-intra-server"): 1.949, ("resnet50", "moirai-intra-server"): 0.183,
         ("tensor_holography", "moirai-intra-server"): 0.131, ("transformer", "moirai-intra-server"): 3.326}
#: the rows next to auto: data parallelism, the planners, and the strongest placement algorithms of the zoo
ROWS = ("data-parallel", "data-parallel(shares=proportional)", "fsdp", "fsdp(shares=proportional)", "pipeline",
        "gpipe", "pipedream", "alpa-stages", "heft", "metis", "m-etf", "adjusting")
GPT = ("gpt_6.7b", "8xA100-nvswitch")
#: auto with the default budget of evaluations but no wall clock: what the default answers when the machine keeps up
NO_CLOCK = "auto (budget only)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


#: the rows that only differ from another on mixed devices (batch shares by device speed)
PROPORTIONAL = ("data-parallel(shares=proportional)", "fsdp(shares=proportional)")


def row_algo(row: str) -> tuple[str, dict]:
    if row in PROPORTIONAL:
        return row.split("(")[0], {"shares": "proportional"}
    return row, {}


def cell(graph, cluster, costs, row: str) -> dict:
    algo, extra = row_algo(row)
    if row == "auto":
        params = {"quiet": True}
    elif row == NO_CLOCK:
        algo, params = "auto", {"quiet": True, "time_limit": 0.0}
    else:
        params = {**algorithm_params(algo, {}, {}, None, quick=True), **extra}
    out = run_cell(graph, cluster, costs, algo, params)
    if out["status"] != "error" and graph.meta.get("precision"):
        out["mfu"] = mfu(graph, cluster, out["makespan_s"])
    return out


def run_case(gname: str, cname: str, rows: list[str], cache: dict) -> dict:
    g, c, costs, mixed = zoo_case(gname, cname)
    out = {}
    for row in rows:
        if row in PROPORTIONAL and not mixed:
            continue
        if row != NO_CLOCK and row_algo(row)[0] not in registry.names():
            continue
        key = f"{gname}@{cname}:{row}"
        if key not in cache:
            log(f"bench_planners: {gname} on {cname}: {row}")
            cache[key] = cell(g, c, costs, row)
        out[row] = cache[key]
    return out


def zoo_table(results: dict) -> list[str]:
    rows = [r for r in (*ROWS, "auto", NO_CLOCK) if any(r in res for res in results.values())]
    head = "| graph | cluster | " + " | ".join(rows) + " | auto / best other | auto / auto before |"
    lines = [head, "|" + "---|" * (len(rows) + 4)]
    ratios = []
    for (gname, cname), res in results.items():
        others = {r: x["makespan_s"] for r, x in res.items() if r not in ("auto", NO_CLOCK) and ok(x)}
        best = min(others.values()) if others else None
        mine = res.get("auto")
        if mine is not None and mine.get("clock_cut") and ok(res.get(NO_CLOCK)):
            mine = res[NO_CLOCK]  # the clock of a loaded machine cut the default: its budget's answer
        vs_best = f"{mine['makespan_s'] / best:.3f}" if ok(mine) and best else "-"
        before = TODAY.get((gname, cname))
        vs_today = mine["makespan_s"] / before if ok(mine) and before else None
        if vs_today is not None:
            ratios.append(vs_today)
        cells = []
        for r in rows:
            x = res.get(r)
            text = fmt_makespan(x)
            if ok(x) and best is not None and x["makespan_s"] <= best * (1 + 1e-9) and r not in ("auto", NO_CLOCK):
                text = f"**{text}**"
            if r == "auto" and x is not None and x.get("clock_cut"):
                text += " (clock cut)"
            cells.append(text)
        lines.append(f"| {gname} | {cname} | " + " | ".join(cells) + f" | {vs_best} | "
                     f"{'-' if vs_today is None else f'{vs_today:.3f}'} |")
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines += ["", f"Geometric mean of auto / auto before over the {len(ratios)} cases: **{gm:.3f}**."]
    return lines


def gpt_table(res: dict) -> list[str]:
    g = load_graph(str(ROOT / "sample_graphs" / "zoo" / f"{GPT[0]}.json.gz"))
    c = load_cluster(GPT[1])
    costs = cost_model(g, c)
    total = sum(costs.node_time(v, 0) for v in range(g.n))  # every node on one A100 (all devices alike)
    bound = total / c.k
    lines = [f"Work bound: {total:.3f} s of work on one A100 / {c.k} devices = **{bound:.3f} s**.", "",
             "| row | step (s) | status | / work bound | simulated MFU |", "|---|---:|---|---:|---:|"]
    for row, x in res.items():
        if x["status"] == "error":
            lines.append(f"| {row} | error | {x['error'][:80]} | - | - |")
            continue
        m = x.get("mfu")
        lines.append(f"| {row} | {x['makespan_s']:.4g} | {x['status']} | {x['makespan_s'] / bound:.2f} | "
                     f"{'-' if m is None else f'{100 * m:.1f}%'} |")
    return lines


def main() -> None:
    args, cache = case_arguments(__doc__, "graph@cluster list, or 'gpt' (default: all)", "rows to run (default: all)")
    rows = [r for r in args.rows.split(",") if r] or [*ROWS, "auto", NO_CLOCK]
    wanted = [x for x in args.cases.split(",") if x]
    cases = [(g, c) for c in CLUSTERS for g in ZOO if not wanted or f"{g}@{c}" in wanted]
    results = {}
    for gname, cname in cases:
        results[(gname, cname)] = run_case(gname, cname, rows, cache)
        if args.cache:
            Path(args.cache).write_text(json.dumps(cache, indent=1))
    gpt = {}
    if not wanted or "gpt" in wanted:
        gpt_rows = [r for r in rows if r not in (*PROPORTIONAL, "heft", "metis", "m-etf", "adjusting")]
        gpt = run_case(*GPT, gpt_rows, cache)
        if args.cache:
            Path(args.cache).write_text(json.dumps(cache, indent=1))
    out = ["## Pipelines, the peers' planners and auto (benchmarks/bench_planners.py)", "",
           "Simulated seconds per training step (time memory rule; OOM: a device over memory at its peak); every "
           "row with its quick parameters, auto with its defaults; **bold**: the best row other than auto. "
           "auto before: auto's answer before issue 23 (BENCHMARKS.md; static memory rule on moirai-intra-server). "
           f"{NO_CLOCK}: auto with its default budget of evaluations and no wall clock (-p time_limit=0), the answer "
           "of the default when the machine keeps up; where the clock cut the default (a loaded machine), the "
           "ratios use it.",
           ""]
    if results:
        out += zoo_table(results) + [""]
    if gpt:
        out += [f"### {GPT[0]} on {GPT[1]}", ""] + gpt_table(gpt)
    print("\n".join(out))


if __name__ == "__main__":
    main()
