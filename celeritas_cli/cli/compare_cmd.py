"""``placer compare``: every algorithm on every graph and cluster, as a table
like Celeritas Table 3 (library: :mod:`celeritas_cli.compare.core`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .. import registry
from ..compare import core as lib
from ..errors import InvalidInput
from ..log import warn
from ..model.io import load_cluster
from ..model.jsonio import write_bytes
from ..sim.simulator import CONGESTION_RULES
from .common import parse_params, seed_option, stderr_console

FORMATS = ("table", "json", "csv", "markdown")


def _split_params(pairs: tuple[str, ...], algorithms: list[str]) -> tuple[dict, dict]:
    """``-p KEY=V`` (every algorithm declaring KEY) and ``-p ALGO:KEY=V``."""
    common: dict = {}
    per: dict[str, dict] = {}
    for k, v in parse_params(pairs).items():
        if ":" in k:
            algo, key = k.split(":", 1)
            if algo not in algorithms:
                raise click.BadParameter(f"'{algo}' in '{k}' is not among the compared algorithms",
                                         param_hint="-p/--param")
            per.setdefault(algo, {})[key] = v
        else:
            common[k] = v
    for k in common:
        if not any(k in registry.get(a).params for a in algorithms):
            raise click.BadParameter(f"no compared algorithm takes parameter '{k}'", param_hint="-p/--param")
    return common, per


def _algorithms(algos: str | None, exclude: str | None) -> list[str]:
    known = registry.names()
    if algos:
        chosen = [a.strip() for a in algos.split(",") if a.strip()]
        bad = [a for a in chosen if a not in known]
        if bad:
            raise click.BadParameter(f"unknown algorithm '{bad[0]}' (known: {', '.join(known)})",
                                     param_hint="--algos")
        chosen = list(dict.fromkeys(chosen))
    else:
        chosen = lib.default_algorithms()
        skipped = [a for a in known if a not in chosen and a not in lib.NOT_BY_DEFAULT]
        if skipped:
            warn(f"placer: skipping {', '.join(skipped)} (optional extra not installed)")
    if exclude:
        drop = {a.strip() for a in exclude.split(",") if a.strip()}
        bad = sorted(drop - set(known))
        if bad:
            raise click.BadParameter(f"unknown algorithm '{bad[0]}'", param_hint="--exclude")
        chosen = [a for a in chosen if a not in drop]
    if not chosen:
        raise click.BadParameter("no algorithm left to compare", param_hint="--algos")
    return chosen


class _Stream:
    """NDJSON output written row by row (so a killed run keeps its rows)."""

    def __init__(self, output: str, resume: str | None):
        self.to_stdout = output == "-"
        self.same_as_resume = bool(resume) and not self.to_stdout and os.path.exists(output) \
            and os.path.samefile(output, resume)
        if self.to_stdout:
            self.fh = sys.stdout.buffer
        else:
            directory = Path(output).parent
            if str(directory) and not directory.is_dir():
                raise InvalidInput(f"{output}: directory {directory} does not exist")
            if self.same_as_resume:
                _drop_partial_line(output)
            self.fh = open(output, "ab" if self.same_as_resume else "wb")

    def write(self, row: dict) -> None:
        self.fh.write(lib.row_line(row))
        self.fh.flush()

    def close(self) -> None:
        if not self.to_stdout:
            self.fh.close()


def _drop_partial_line(path: str) -> None:
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


@click.command(context_settings={"max_content_width": 100})
@click.argument("graphs", nargs=-1, required=True, metavar="GRAPHS...|DIR")
@click.option("--cluster", "-c", "clusters", multiple=True, metavar="FILE|NAME",
              help="Cluster file or bundled name; repeat to compare on several (default: 4xV100-pcie).")
@click.option("--algos", "-a", metavar="A,B,...", default=None,
              help="Algorithms to compare (default: every registered one whose extra is installed).")
@click.option("--exclude", metavar="A,B,...", default=None, help="Algorithms to leave out.")
@click.option("-p", "--param", "params", multiple=True, metavar="[ALGO:]KEY=VALUE",
              help="Algorithm parameter: KEY=V goes to every algorithm that takes KEY, ALGO:KEY=V to one.")
@click.option("--quick", is_flag=True, help="Use each algorithm's quick parameters (smoke runs).")
@click.option("--coarsen", metavar="METHOD", default=None,
              help="Place on the graph coarsened by METHOD (e.g. cpd); simulate on the original.")
@click.option("--coarsen-param", "coarsen_params", multiple=True, metavar="KEY=VALUE",
              help="Coarsening parameter, repeatable.")
@seed_option
@click.option("--time-limit", type=float, default=None, metavar="S",
              help="Per-cell limit: passed to algorithms taking time_limit; each phase of a cell that runs "
                   "longer than S + 2 s + 10% is killed and reported as timeout.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cells run in parallel (worker processes, or Ray tasks in flight).")
@click.option("--executor", type=click.Choice(["auto", "process", "ray"]), default="auto", show_default=True,
              help="auto: in this process for one job without a time limit, else worker processes; "
                   "ray: a Ray cluster (extra [ray]).")
@click.option("--ray-address", metavar="ADDR", default=None,
              help="Ray cluster to join (default: $RAY_ADDRESS, else a local Ray instance).")
@click.option("--congestion", type=click.Choice(CONGESTION_RULES), default="channel", show_default=True,
              help="Simulator congestion rule.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: Celeritas Table 3/4 layout; json: one row per line (NDJSON), streamed as cells "
                   "finish; csv: one line per cell; markdown: the tables in Markdown.")
@click.option("-o", "--output", default="-", metavar="FILE", show_default=True,
              help="Output file (- = stdout).  table/csv/markdown are written atomically at the end; "
                   "json is appended line by line.")
@click.option("--resume", metavar="FILE", default=None,
              help="Skip cells already in FILE (an earlier --format json output); with -o FILE the new "
                   "rows are appended to it.")
@click.option("--retry-failed", is_flag=True, help="With --resume: run error/timeout cells again.")
@click.option("--plot", metavar="FILE", default=None,
              help="Makespan bars per graph and a Gantt chart of each best placement (.svg; .png needs "
                   "matplotlib).")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even when some cells failed or timed out.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def compare(graphs, clusters, algos, exclude, params, quick, coarsen, coarsen_params, seed, time_limit, jobs,
            executor, ray_address, congestion, fmt, output, resume, retry_failed, plot, allow_failures,
            progress):
    """Compare placement algorithms over GRAPHS (files, or directories scanned
    for placer.graph/v1 *.json) on one or more clusters.

    Each cell places the graph, times the placement, simulates it and reports
    makespan (OOM when a device overflows), makespan / lower bound,
    utilisation, transfer bytes and placement time.  A failing or timed-out
    cell is reported in its cell and the rest go on; exit code 1 when any cell
    failed (unless --allow-failures).

    \b
    Examples:
      placer compare sample_graphs/ --cluster sample_graphs/clusters/4xV100-pcie.json
      placer compare g.json --algos adjusting,heft,m-sct --coarsen cpd --format markdown
      placer compare big/ -j 8 --time-limit 600 --format json -o runs.ndjson
      placer compare big/ --format json --resume runs.ndjson -o runs.ndjson
      placer compare big/ --executor ray --ray-address auto --format csv -o all.csv
    """
    if retry_failed and not resume:
        raise click.UsageError("--retry-failed needs --resume FILE")
    if time_limit is not None and time_limit <= 0:
        raise click.BadParameter("must be > 0", param_hint="--time-limit")
    if plot and not plot.lower().endswith((".svg", ".png")):
        raise click.BadParameter("plot file must end in .svg or .png", param_hint="--plot")
    if plot and plot.lower().endswith(".png"):
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise click.ClickException("--plot .png needs matplotlib: pip install 'celeritas-cli[plot]', "
                                       "or write .svg (no dependency)")
    if executor == "ray":
        lib.import_ray()
    if coarsen is not None and coarsen not in registry.coarsener_names():
        raise click.BadParameter(f"unknown coarsening method '{coarsen}' (known: "
                                 f"{', '.join(registry.coarsener_names()) or 'none'})", param_hint="--coarsen")
    algorithms = _algorithms(algos, exclude)
    common, per = _split_params(params, algorithms)
    if not clusters:
        warn("placer: no --cluster given, using the default 4xV100-pcie (4x V100-32GB, PCIe)")
        cluster_objs = [load_cluster(None)]
    else:
        cluster_objs = [load_cluster(c) for c in clusters]
    names = [c.name for c in cluster_objs]
    if len(set(names)) != len(names):
        raise InvalidInput(f"two clusters are both named '{next(n for n in names if names.count(n) > 1)}'; "
                           f"rename one (its \"name\" field)")
    previous = lib.read_rows(resume) if resume else None
    files = lib.discover_graphs(graphs)
    tasks_options = dict(coarsen=coarsen, coarsen_params=parse_params(coarsen_params), common_params=common,
                         per_algo_params=per, seed=seed, time_limit=time_limit, congestion=congestion,
                         quick=quick, keep_placement=bool(plot))
    total = len(files) * len(cluster_objs) * len(algorithms)
    for a in algorithms:  # bad parameters fail here, before any output file is opened
        lib.algorithm_params(a, common, per, time_limit, quick)
    if coarsen is not None:
        registry.get_coarsener(coarsen).coerce(tasks_options["coarsen_params"])

    stream = _Stream(output, resume) if fmt == "json" else None
    if stream is not None and previous and not stream.same_as_resume:
        for r in previous:
            if not (retry_failed and r.get("status") in lib.FAILED_STATUSES):
                stream.write(r)

    console = stderr_console()
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # no auto-refresh thread: worker processes are forked from this one
        bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, auto_refresh=False, transient=False)
    best_so_far: dict[tuple, dict] = {}
    failures = []
    pid = None

    def on_start(task):
        if bar is not None:
            bar.update(pid, description=task.label())
            bar.refresh()

    def on_result(task, row):
        if row.get("status") in lib.FAILED_STATUSES:
            failures.append(row)
            msg = f"{row['status']}: {task.label()}: {row.get('error')}"
            (bar.console if bar is not None else console).print(msg, markup=False, highlight=False)
        placement = row.pop("_placement", None)
        if placement is not None and row.get("status") == "OK":
            key = (row.get("graph_file"), row.get("cluster"), row.get("coarsen"))
            if key not in best_so_far or row["makespan_s"] < best_so_far[key]["makespan_s"]:
                best_so_far[key] = {**row, "_placement": placement}
        if stream is not None:
            stream.write(row)
        if bar is not None:
            bar.advance(pid)
            bar.refresh()

    def on_plan(todo):
        if bar is not None:
            bar.update(pid, total=todo, description=f"{todo} of {total} cells to run")
            bar.refresh()

    try:
        if bar is not None:
            bar.start()
            pid = bar.add_task("compare", total=total)
        rows = lib.compare(files, cluster_objs, algorithms, jobs=jobs, executor=executor, ray_address=ray_address,
                           previous=previous, retry_failed=retry_failed, on_plan=on_plan, on_start=on_start,
                           on_result=on_result, **tasks_options)
    finally:
        if bar is not None:
            bar.update(pid, description="done")
            bar.refresh()
            bar.stop()
        if stream is not None:
            stream.close()

    if fmt != "json":
        if fmt == "table":
            color = output == "-" and sys.stdout.isatty()
            text = lib.format_table(rows, algorithms, color=color)
        elif fmt == "csv":
            text = lib.format_csv(rows, algorithms)
        else:
            text = lib.format_markdown(rows, algorithms)
        write_bytes(text.encode(), output)
    if plot:
        _write_plot(plot, rows, algorithms, best_so_far, congestion, {c.name: c for c in cluster_objs})
    failed = [r for r in rows if r.get("status") in lib.FAILED_STATUSES]
    if failed:
        warn(f"placer: {len(failed)} of {len(rows)} cells failed or timed out")
        if not allow_failures:
            raise SystemExit(1)


def _write_plot(path: str, rows: list[dict], algorithms: list[str], best: dict, congestion: str,
                clusters: dict) -> None:
    """Bars for every cell; a Gantt chart per best placement found in this
    run (cells taken from --resume have no placement to draw)."""
    from ..compare import plots
    from ..model.io import load_graph
    from ..model.placement import Placement
    from ..sim.simulator import simulate

    schedules = []
    for (gf, cl, _co), row in sorted(best.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        graph = load_graph(gf)
        cluster = clusters[cl]
        sched: list = []
        simulate(graph, cluster, Placement.from_dict(row["_placement"]), congestion=congestion, schedule_out=sched)
        title = f"{row.get('graph')} on {cl}: best = {row['algorithm']}"
        schedules.append((sched[0].graph, cluster, sched[0], title))  # split graph if planned on one
    if path.lower().endswith(".png"):
        write_bytes(plots.compare_png(rows, algorithms, schedules), path)
        return
    from ..sim.gantt import gantt_svg

    gantts = [gantt_svg(g, c, s, title=t) for g, c, s, t in schedules]
    write_bytes(plots.compare_svg(rows, algorithms, gantts).encode(), path)
