"""Benchmark: the default ``auto`` against every single row at the same
default limit (issue 33, "Done when"): the model zoo on 4xV100-pcie,
moirai-intra-server and 8xA100-nvswitch.

Rows: ``data-parallel``, ``fsdp`` (and both with batch shares by device
speed on a cluster of mixed devices), ``pipeline``, ``gpipe``,
``pipedream``, ``alpa-stages``, and the best of the operator placers
:data:`PLACERS` (one column: the best one's makespan and name).  Every row
and ``auto`` run with their defaults - no ``quick_params``, the default time
limit where the algorithm takes one (``placer place --algo ROW``) - and each
placement is simulated by ``placer simulate``'s code on the graph its recipe
rebuilds.  A cell is marked ``>`` where auto's answer is slower than that
row's (auto is to be <= every row); ``clock`` where the wall clock cut
auto's search (a loaded machine: its answer may then differ from the
counted budget's).  The load average (``os.getloadavg``) before and after
is printed: the machine is shared, and the limits are wall clocks.

The full table is 21 cases of about 12 cells, each up to the default 10 s:
about 40 minutes.  ``--budget-only`` adds auto with its default budget and
no wall clock (``-p time_limit=0``): what the default answers when the
machine keeps up.  ``--cases gpt_1.3b@8xA100-nvswitch,transformer@moirai-intra-server``
runs some; ``--cache`` keeps finished cells in a JSON file.

Prints Markdown to stdout (``benchmarks/run.py`` appends it to BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import case_arguments, fmt_makespan, ok, run_cell, zoo_case  # noqa: E402

from celeritas_cli import registry  # noqa: E402

ZOO = ("inception_v3", "nmt", "resnet50", "tensor_holography", "transformer", "gpt_1.3b", "gpt_6.7b")
CLUSTERS = ("4xV100-pcie", "moirai-intra-server", "8xA100-nvswitch")
#: whole-step rows, each its own column
ROWS = ("data-parallel", "data-parallel(shares=proportional)", "fsdp", "fsdp(shares=proportional)", "pipeline",
        "gpipe", "pipedream", "alpa-stages")
#: the operator placers; the table shows the best of them
PLACERS = ("metis", "heft", "m-etf", "adjusting", "dpos", "m-topo")
BEST_PLACER = "best operator placer"
#: auto with its default budget of evaluations and no wall clock (``--budget-only``): what the default answers
#: on a machine that keeps up, for a loaded machine where the clock cut the default
NO_CLOCK = "auto (budget only)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def row_algo(row: str) -> tuple[str, dict]:
    if row.endswith("(shares=proportional)"):
        return row.split("(")[0], {"shares": "proportional"}
    return row, {}


def run_case(gname: str, cname: str, rows: list[str], cache: dict) -> dict:
    g, c, costs, mixed = zoo_case(gname, cname)
    out = {}
    for row in ["auto", *rows]:
        algo, params = ("auto", {"time_limit": 0.0}) if row == NO_CLOCK else row_algo(row)
        if (row != NO_CLOCK and params and not mixed) or algo not in registry.names():
            continue
        key = f"{gname}@{cname}:{row}"
        if key not in cache:
            log(f"bench_auto_rows: {gname} on {cname}: {row}")
            cache[key] = run_cell(g, c, costs, algo, {**params, **({"quiet": True} if algo == "auto" else {})})
        out[row] = cache[key]
    return out


def best_placer(res: dict) -> dict | None:
    """The fastest operator placer's cell (with its name), else any one."""
    cells = [(name, res[name]) for name in PLACERS if name in res]
    fine = [(n, x) for n, x in cells if ok(x)]
    if not cells:
        return None
    name, x = min(fine, key=lambda nx: nx[1]["makespan_s"]) if fine else cells[0]
    return {**x, "name": name}


def table(results: dict) -> tuple[list[str], int, int]:
    """The Markdown table, the cases where auto <= every row, and the cases."""
    cols = [r for r in (*ROWS, BEST_PLACER) if any(r in res for res in results.values())]
    free = any(NO_CLOCK in res for res in results.values())
    lines = ["| graph | cluster | auto | auto wall (s) | " + (f"{NO_CLOCK} | " if free else "") + " | ".join(cols) +
             " | auto <= all |", "|" + "---|" * (len(cols) + 5 + free)]
    good = 0
    for (gname, cname), res in results.items():
        mine = res.get("auto")
        cells, worse = [], []
        for col in cols:
            x = res.get(col)
            text = fmt_makespan(x)
            if col == BEST_PLACER and x is not None:
                text += f" ({x['name']})"
            if ok(x) and (not ok(mine) or mine["makespan_s"] > x["makespan_s"] * (1 + 1e-9)):
                worse.append(col)
                text = f"> {text}"
            cells.append(text)
        auto_text = fmt_makespan(mine) + (f" ({mine.get('winner')})" if ok(mine) else "")
        if mine is not None and mine.get("clock_cut"):
            auto_text += " clock"
        good += not worse
        wall = f"{mine['wall_s']:.1f}" if mine is not None and "wall_s" in mine else "-"
        budget_only = [fmt_makespan(res.get(NO_CLOCK))] if free else []
        lines.append(f"| {gname} | {cname} | {auto_text} | " + " | ".join([wall, *budget_only, *cells]) + " | " +
                     ("yes" if not worse else "no: " + ", ".join(worse)) + " |")
    return lines, good, len(results)


def main() -> None:
    args, cache = case_arguments(__doc__, "graph@cluster list (default: the whole zoo on the three clusters)",
                                 "rows besides auto (default: all, and the operator placers)",
                                 {"--budget-only": f"also {NO_CLOCK}: the default budget, no wall clock"})
    rows = [r for r in args.rows.split(",") if r] or [*ROWS, *PLACERS]
    if args.budget_only:
        rows.append(NO_CLOCK)
    wanted = [x for x in args.cases.split(",") if x]
    cases = [(g, c) for c in CLUSTERS for g in ZOO if not wanted or f"{g}@{c}" in wanted]
    load_before = os.getloadavg()
    results = {}
    for gname, cname in cases:
        res = run_case(gname, cname, rows, cache)
        placer = best_placer(res)
        results[(gname, cname)] = {**{r: x for r, x in res.items() if r not in PLACERS},
                                   **({BEST_PLACER: placer} if placer else {})}
        if args.cache:
            Path(args.cache).write_text(json.dumps(cache, indent=1))
    load_after = os.getloadavg()
    lines, good, total = table(results)
    print("\n".join([
        "## auto against every row at the default limit (benchmarks/bench_auto_rows.py)", "",
        "Simulated seconds per training step (OOM: a device over memory at its peak); auto and every row with "
        "their defaults (10 s where the algorithm takes a time limit); `>`: the row is faster than auto; `clock`: "
        f"the wall clock cut auto's search. Best operator placer: the fastest of {', '.join(PLACERS)}. "
        f"Load average before {load_before[0]:.2f} / {load_before[1]:.2f}, after {load_after[0]:.2f} / "
        f"{load_after[1]:.2f} on {os.cpu_count()} CPUs.", "", *lines, "",
        f"auto <= every row in **{good} of {total}** cases."]))


if __name__ == "__main__":
    main()
