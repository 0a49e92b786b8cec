"""``placer compare``: every algorithm on every graph and cluster, as a table
like Celeritas Table 3.  A thin layer over one library call,
:func:`celeritas_cli.compare.run_compare`."""

from __future__ import annotations

import click

from .. import registry
from ..compare import (
    FORMATS,
    NOT_BY_DEFAULT,
    CompareOptions,
    default_algorithms,
    run_compare,
)
from ..compare.formats import CSV_DIGITS
from ..log import warn
from ..model.io import load_cluster
from ..sim.memory import RULES as MEMORY_RULES
from .common import congestion_option, parse_params, seed_option, time_limit_option


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
        chosen = default_algorithms()
        skipped = [a for a in known if a not in chosen and a not in NOT_BY_DEFAULT]
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
@time_limit_option("Per-cell limit (0 = none): passed to algorithms taking time_limit; each phase of a cell "
                   "that runs longer than S + 2 s + 10% is killed and reported as timeout.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cells run in parallel (worker processes, or Ray tasks in flight).")
@click.option("--executor", type=click.Choice(["auto", "process", "ray"]), default="auto", show_default=True,
              help="auto: in this process for one job without a time limit, else worker processes; "
                   "ray: a Ray cluster (extra [ray]).")
@click.option("--ray-address", metavar="ADDR", default=None,
              help="Ray cluster to join (default: $RAY_ADDRESS, else a local Ray instance).")
@congestion_option("Link rule of the simulator that judges every cell.  It is also passed as "
                   "congestion=RULE to every algorithm that takes a congestion parameter (placer place --list), "
                   "so they plan for the link model they are judged under; an explicit -p [ALGO:]congestion=... "
                   "wins.  Algorithms without one keep their own model (heft: links without contention).")
@click.option("--memory", type=click.Choice(MEMORY_RULES), default="time", show_default=True,
              help="Memory rule of the simulator that judges every cell (OOM status): time (each device's peak "
                   "along the schedule) or static (the per-device sum of memory_bytes, the seed papers' rule; "
                   "also what graphs without resident_bytes get).  Algorithms keep their own rule.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: Celeritas Table 3/4 layout (cpd+X: X placed on the cpd coarse graph); json: one "
                   "row per line (NDJSON, full precision), streamed as cells finish; csv: one line per cell, "
                   f"floats to {CSV_DIGITS} significant digits; markdown: the tables in Markdown.")
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
@click.option("-v", "--verbose", is_flag=True,
              help="Show the algorithms' own progress lines (solver incumbents, library banners); without it "
                   "cells run quietly.  Either way what a cell prints comes above the progress bar when it "
                   "finishes, prefixed by the cell, and warnings about a result are always shown.")
def compare(graphs, clusters, algos, exclude, params, coarsen_params, allow_failures, **options):
    """Compare placement algorithms over GRAPHS (files, or directories scanned
    for placer.graph/v1 *.json) on one or more clusters.

    Each cell places the graph, times the placement, simulates it and reports
    makespan (OOM when a device overflows), makespan / lower bound,
    utilisation, transfer bytes and placement time.  A failing or timed-out
    cell is reported in its cell and the rest go on; exit code 1 when any cell
    failed (unless --allow-failures).  Ctrl-C stops the run and says on stderr
    what was kept and how to --resume it (exit code 130).

    \b
    Examples:
      placer compare sample_graphs/ --cluster sample_graphs/clusters/4xV100-pcie.json
      placer compare g.json --algos adjusting,heft,m-sct --coarsen cpd --format markdown
      placer compare big/ -j 8 --time-limit 600 --format json -o runs.ndjson
      placer compare big/ --format json --resume runs.ndjson -o runs.ndjson
      placer compare big/ --executor ray --ray-address auto --format csv -o all.csv
      placer compare g.json --algos m-topo,heft --memory static
    """
    _check_options(**options)
    algorithms = _algorithms(algos, exclude)
    common, per = _split_params(params, algorithms)
    try:
        result = run_compare(graphs, _clusters(clusters), algorithms,
                             CompareOptions(common_params=common, per_algo_params=per,
                                            coarsen_params=parse_params(coarsen_params), **options))
    except KeyboardInterrupt:  # run_compare said what was kept and how to --resume
        raise SystemExit(130) from None
    if result.failed and not allow_failures:
        raise SystemExit(1)


def _check_options(retry_failed, resume, plot, coarsen, **_):
    """Usage errors (exit 2) in the options themselves (--time-limit: :func:`.common.time_limit_seconds`)."""
    if retry_failed and not resume:
        raise click.UsageError("--retry-failed needs --resume FILE")
    if plot and not plot.lower().endswith((".svg", ".png")):
        raise click.BadParameter("plot file must end in .svg or .png", param_hint="--plot")
    if coarsen is not None and coarsen not in registry.coarsener_names():
        raise click.BadParameter(f"unknown coarsening method '{coarsen}' (known: "
                                 f"{', '.join(registry.coarsener_names()) or 'none'})", param_hint="--coarsen")


def _clusters(names: tuple[str, ...]) -> list:
    if not names:
        warn("placer: no --cluster given, using the default 4xV100-pcie (4x V100-32GB, PCIe)")
        return [load_cluster(None)]
    return [load_cluster(c) for c in names]
