"""``make bench``: run ``placer compare`` on synthetic and sample graphs and
write BENCHMARKS.md.

Synthetic graphs are :func:`celeritas_cli.model.generate.layered` training graphs
of 1k, 4k, 16k and 36k nodes (seed 0).  The ones of 16k nodes and more are
placed on the graph coarsened by ``cpd`` (Celeritas 5.1) when that method is
registered - as Celeritas does for the 30,000-node Transformer - and always
simulated on the original graph.  They use the algorithms that scale
(:data:`SCALABLE`, those registered at run time).  The sample graphs
(``sample_graphs/*.json``) and the model zoo (``sample_graphs/zoo``, the
models of Celeritas Table 3) use every registered algorithm whose extra is
installed, with its ``quick_params``; the zoo also gets Celeritas' own
pipeline (cpd, then adjusting) and Order-Place on the cpd coarse graph, and a
table laid out like Celeritas Table 3.

The machine is shared and noisy, so placement times are reported as ratios
to a reference measured in the same process: the time to load the graph file
and simulate a one-device placement of it (absolute seconds are shown too).
Makespans are reported as ratios to the simulator's lower bound (docs/design.md,
simulator item 6).  Cells run one at a time in a worker process forked from
this one, with a per-cell time limit; a failure or timeout is a note, not a
crash.  Finally the Markdown printed by every other ``benchmarks/bench_*.py``
script is appended (each run as a subprocess with a timeout).

Usage::

    python benchmarks/run.py            # full: 1k, 4k, 16k, 36k + samples + other benches
    python benchmarks/run.py --quick    # 1k, 4k + samples, shorter limits
    python benchmarks/run.py --no-others -o /tmp/B.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli import __version__, registry  # noqa: E402
from celeritas_cli import compare as lib  # noqa: E402
from celeritas_cli.model.generate import layered  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.model.jsonio import write_bytes, write_json  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402

SCALABLE = ("adjusting", "heft", "m-topo", "m-etf", "m-sct", "order-place", "metis", "dpos", "single-device")
COARSEN_FROM = 16_000  # nodes; bigger synthetic graphs are placed on their cpd coarse graph


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
        cpu = model or cpu
    except OSError:
        pass
    return [f"- Platform: {platform.platform()}",
            f"- CPU: {cpu}, {os.cpu_count()} logical CPUs (shared machine: absolute times are noisy)",
            f"- Python {platform.python_version()} ({platform.python_implementation()}), placer {__version__}",
            f"- Date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"]


def reference_time(path: str, cluster) -> float:
    """Seconds to load *path* and simulate it all on device 0 (the unit of
    the placement-time ratios)."""
    t0 = time.perf_counter()
    graph = load_graph(path)
    t1 = time.perf_counter()
    placement = Placement.from_indices(graph, cluster, [0] * graph.n, algorithm="reference")
    t2 = time.perf_counter()
    simulate(graph, cluster, placement)
    t3 = time.perf_counter()
    return (t1 - t0) + (t3 - t2)


def run_section(files: list[str], cluster, algorithms: list[str], *, coarsen: str | None, quick: bool,
                time_limit: float) -> list[dict]:
    def on_result(task, row):
        what = row["status"]
        if row.get("makespan_over_lb") is not None:
            what += f", makespan/LB {row['makespan_over_lb']:.3f}"
        if row.get("placement_time_s") is not None:
            what += f", placed in {row['placement_time_s']:.3f} s"
        if row.get("error"):
            what += f": {row['error']}"
        log(f"  {task.label()}: {what}")

    return lib.compare(files, [cluster], algorithms, jobs=1, executor="process", coarsen=coarsen, quick=quick,
                       time_limit=time_limit, on_result=on_result)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def tables(rows: list[dict], algorithms: list[str], refs: dict[str, float]) -> list[str]:
    """Two Markdown tables: makespan / LB (best in bold, OOM shown) and
    (coarsening + placement time) / reference."""
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(r["graph_file"], {})[r["algorithm"]] = r
    cols = [a for a in algorithms if any(a in g for g in groups.values())]
    out = ["Makespan / lower bound (simulated on the original graph; **best** makespan; OOM = a device over "
           "memory; algorithms that split operations, os-dpos and fd-dps, are simulated on their split graph, "
           "whose lower bound is lower):", "",
           "| Graph | nodes | placed on | " + " | ".join(cols) + " |",
           "|:---|---:|---:|" + "---:|" * len(cols)]
    for gf, cells in groups.items():
        any_row = next(iter(cells.values()))
        ok = [(c["makespan_s"], cols.index(a)) for a, c in cells.items()
              if c.get("status") == "OK" and c.get("makespan_s") is not None and a in cols]
        best = cols[min(ok)[1]] if ok else None
        vals = []
        for a in cols:
            c = cells.get(a)
            if c is None:
                vals.append("")
            elif c["status"] in ("error", "timeout"):
                vals.append(c["status"])
            else:
                txt = _fmt(c.get("makespan_over_lb"))
                txt = f"OOM ({txt})" if c["status"] == "OOM" else txt
                txt += lib.CAVEAT_MARK if c.get("caveat") else ""
                vals.append(f"**{txt}**" if a == best else txt)
        placed_on = f"{any_row['coarse_nodes']} ({any_row['coarsen']})" if any_row.get("coarse_nodes") else "original"
        out.append(f"| {any_row.get('graph')} | {any_row.get('nodes') or '-'} | {placed_on} | "
                   + " | ".join(vals) + " |")
    notes = lib.caveat_lines(rows, algorithms)
    out += [""] + [n + "  " for n in notes] if notes else []
    out += ["", "Placement generation time (coarsening included, Celeritas Table 4) / reference "
            "(reference = load the graph + simulate a one-device placement, same process):", "",
            "| Graph | reference (s) | " + " | ".join(cols) + " |",
            "|:---|---:|" + "---:|" * len(cols)]
    for gf, cells in groups.items():
        ref = refs.get(gf)
        vals = []
        for a in cols:
            c = cells.get(a)
            if c is None:
                vals.append("")
            elif c.get("placement_time_s") is None:
                vals.append(c["status"])
            else:
                t = c["placement_time_s"] + (c.get("coarsen_time_s") or 0.0)
                vals.append((_fmt(t / ref) if ref else _fmt(t)) + (lib.CAVEAT_MARK if c.get("caveat") else ""))
        name = next(iter(cells.values())).get("graph")
        out.append(f"| {name} | {_fmt(ref)} | " + " | ".join(vals) + " |")
    out += [""] + [n + "  " for n in notes] if notes else []
    failed = [r for r in rows if r["status"] in ("error", "timeout")]
    if failed:
        out += ["", "Failed cells:", ""]
        out += [f"- {r['status']}: {r.get('graph')} / {r['algorithm']}: {r.get('error')}" for r in failed]
    return out + [""]


def zoo_section(zoo: list[str], cluster, every: list[str], coarsen: str | None, time_limit: float,
                refs: dict[str, float]) -> list[str]:
    """The Celeritas Table 3 models of ``sample_graphs/zoo``: every algorithm
    on the original graph, plus Celeritas' own pipeline (cpd coarsening, then
    Adjusting Placement, Celeritas 5) and Order-Place on the same coarse
    graph (Celeritas 6.2.2), as columns ``cpd+adjusting`` / ``cpd+order-place``."""
    log(f"model zoo: {', '.join(every)} (quick parameters)")
    rows = run_section(zoo, cluster, every, coarsen=None, quick=True, time_limit=time_limit)
    cols = list(every)
    pipeline = [a for a in ("adjusting", "order-place") if a in every]
    if coarsen and pipeline:
        log(f"model zoo on the {coarsen} coarse graph: {', '.join(pipeline)}")
        for r in run_section(zoo, cluster, pipeline, coarsen=coarsen, quick=True, time_limit=time_limit):
            r["algorithm"] = f"{coarsen}+{r['algorithm']}"
            r["coarsen"] = None  # same table row as the original-graph cells
            rows.append(r)
        cols += [f"{coarsen}+{a}" for a in pipeline]
    table3 = lib.format_markdown(rows, cols, metrics=("makespan_s",)).strip()
    return ["## Model zoo (`sample_graphs/zoo`, the models of Celeritas Table 3)", "",
            "Every algorithm on the original graph with its quick parameters; "
            + (f"`{coarsen}+X` = X placed on the `{coarsen}` coarse graph (Celeritas' pipeline: "
               f"`{coarsen}+adjusting`), simulated on the original. " if coarsen and pipeline else "")
            + "Laid out like Celeritas Table 3 (simulated seconds per training step; speed-up of the best "
            "over the second best):", "", table3, "", *tables(rows, cols, refs)]


#: scripts whose full run needs longer than the others' timeout: seconds each (bench_auto_rows: the zoo on three
#: clusters, auto and about 12 rows each at the default 10 s limit, about 40 minutes)
LONG_SCRIPTS = {"bench_auto_rows.py": 3600.0}


def other_benchmarks(timeout: float) -> list[str]:
    out: list[str] = []
    here = Path(__file__).resolve().parent
    for script in sorted(here.glob("bench_*.py")):
        limit = max(timeout, LONG_SCRIPTS.get(script.name, 0.0))
        log(f"running {script.name} (timeout {limit:.0f} s)")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired:
            out += [f"## {script.name}", "", f"_Note: {script.name} did not finish within {limit:.0f} s; "
                    "no results._", ""]
            continue
        took = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            out += [f"## {script.name}", "", f"_Note: {script.name} failed (exit code {proc.returncode}): "
                    f"`{tail}`_", ""]
            continue
        text = proc.stdout.strip()
        heading = [] if text.startswith("#") else [f"## {script.name}", ""]
        out += [f"<!-- {script.name}, {took:.0f} s -->", *heading, text, ""]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 4k synthetic graphs + samples, short limits")
    ap.add_argument("--sizes", default=None, help="comma-separated synthetic sizes (default 1000,4000,16000,36000)")
    ap.add_argument("--cluster", default="4xV100-pcie")
    ap.add_argument("--time-limit", type=float, default=None, help="per-cell limit (s)")
    ap.add_argument("--no-others", action="store_true", help="skip the other benchmarks/bench_*.py scripts")
    ap.add_argument("--others-timeout", type=float, default=None, help="seconds per other script")
    ap.add_argument("-o", "--output", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        ([1000, 4000] if args.quick else [1000, 4000, 16000, 36000])
    time_limit = args.time_limit or (120.0 if args.quick else 600.0)
    cluster = load_cluster(args.cluster)
    known = registry.names()
    scalable = [a for a in SCALABLE if a in known]
    coarsen = "cpd" if "cpd" in registry.coarsener_names() else None
    doc = ["# Benchmarks", "",
           f"Generated by `python benchmarks/run.py{' --quick' if args.quick else ''}` "
           f"(`make bench`); cluster `{cluster.name}`, {cluster.k} devices, congestion rule `channel`.", "",
           "Machine:", "", *machine(), ""]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="placer-bench-") as tmp:
        files_small, files_big, refs = [], [], {}
        for n in sizes:
            path = str(Path(tmp) / f"layered_{n}.json")
            log(f"generating layered({n}, seed=0)")
            write_json(layered(n, seed=0).to_dict(), path)
            (files_big if coarsen and n >= COARSEN_FROM else files_small).append(path)
            refs[path] = reference_time(path, cluster)
        rows: list[dict] = []
        if files_small:
            log(f"synthetic graphs on the original graph: {', '.join(scalable)}")
            rows += run_section(files_small, cluster, scalable, coarsen=None, quick=False, time_limit=time_limit)
        if files_big:
            log(f"synthetic graphs on the {coarsen} coarse graph: {', '.join(scalable)}")
            rows += run_section(files_big, cluster, scalable, coarsen=coarsen, quick=False, time_limit=time_limit)
        doc += ["## Synthetic layered graphs (`generate.layered(n, seed=0)`)", "",
                f"Algorithms that scale ({', '.join(scalable)}); graphs of {COARSEN_FROM} nodes or more are "
                f"placed on their `{coarsen}` coarse graph (default R, M)." if coarsen else
                f"Algorithms that scale ({', '.join(scalable)}); no `cpd` coarsener registered, all on the "
                "original graph.", "", *tables(rows, scalable, refs)]

        every = lib.default_algorithms()
        zoo_dir = ROOT / "sample_graphs" / "zoo"
        all_zoo = lib.discover_graphs([zoo_dir]) if zoo_dir.is_dir() else []
        zoo = [f for f in all_zoo if not Path(f).name.startswith("gpt_")]   # Celeritas Table 3 only (GPTs: issue 23)
        samples = [f for f in lib.discover_graphs([ROOT / "sample_graphs"]) if f not in all_zoo]
        for f in samples + zoo:
            refs[f] = reference_time(f, cluster)
        log(f"sample graphs: {', '.join(every)} (quick parameters)")
        srows = run_section(samples, cluster, every, coarsen=None, quick=True, time_limit=time_limit)
        doc += ["## Sample graphs (`sample_graphs/*.json`)", "",
                "Every registered algorithm whose extra is installed, with its quick parameters "
                "(`placer compare --quick`), on the original graph.", "", *tables(srows, every, refs)]
        if zoo:
            doc += zoo_section(zoo, cluster, every, coarsen, time_limit, refs)
    doc += [f"_compare sections took {time.perf_counter() - t_start:.0f} s._", ""]
    if not args.no_others:
        doc += ["# Other benchmarks", ""]
        doc += other_benchmarks(args.others_timeout or (300.0 if args.quick else 900.0))
    write_bytes(("\n".join(doc).rstrip() + "\n").encode(), args.output)
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
