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
from ..compare.inputs import ALGORITHM_GROUPS, expand_algorithms
from ..errors import InvalidInput
from ..log import quiet as quiet_output
from ..log import warn
from ..model.io import load_cluster
from ..sim.memory import RULES as MEMORY_RULES
from .common import assume_batch_option, congestion_option, parse_params, seed_option, time_limit_option


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


def _names(text: str, hint: str) -> list[str]:
    """Comma-separated algorithm and group names -> algorithm names (usage error for an unknown one)."""
    known = registry.names()
    chosen = expand_algorithms(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in chosen if a not in known]
    if bad:
        try:  # a name placer place takes (an alias, another spelling): say which registered one it is
            name, fixed = registry.resolve(bad[0])
        except InvalidInput:
            raise click.BadParameter(f"unknown algorithm '{bad[0]}'{registry.did_you_mean(bad[0])} (known: "
                                     f"{', '.join(known)}; groups: {', '.join(ALGORITHM_GROUPS)})",
                                     param_hint=hint) from None
        per = "".join(f" -p {name}:{k}={v}" for k, v in fixed.items())
        raise click.BadParameter(f"'{bad[0]}' is {name}{''.join(f' with {k}={v}' for k, v in fixed.items())}; "
                                 f"compare takes registered names: {hint} {name}{per}", param_hint=hint)
    return chosen


def _algorithms(algos: str | None, exclude: str | None, quiet: bool = False) -> list[str]:
    if algos:
        chosen = _names(algos, "--algos")
    else:
        chosen = default_algorithms()
        skipped = [a for a in registry.names() if a not in chosen and a not in NOT_BY_DEFAULT]
        if skipped and not quiet:
            warn(f"placer: skipping {', '.join(skipped)} (optional extra not installed)")
    if exclude:
        drop = set(_names(exclude, "--exclude"))
        chosen = [a for a in chosen if a not in drop]
    if not chosen:
        raise click.BadParameter("no algorithm left to compare", param_hint="--algos")
    return chosen


@click.command(context_settings={"max_content_width": 100})
@click.argument("graphs", nargs=-1, required=True, metavar="GRAPHS...|DIR")
@click.option("--cluster", "-c", "clusters", multiple=True, metavar="FILE|NAME",
              help="Cluster file or bundled name; repeat to compare on several (default: 4xV100-pcie).")
@click.option("--algos", "-a", metavar="A,B,...", default=None,
              help="Algorithms or groups to compare, comma-separated (default: every registered algorithm whose "
                   "extra is installed).  Groups: " + "; ".join(f"{k}: {v}" for k, v in ALGORITHM_GROUPS.items())
                   + ".  E.g. --algos placement, --algos pipelines,heft.")
@click.option("--exclude", metavar="A,B,...", default=None, help="Algorithms or groups to leave out.")
@click.option("-p", "--param", "params", multiple=True, metavar="[ALGO:]KEY=VALUE",
              help="Algorithm parameter: KEY=V goes to every algorithm that takes KEY, ALGO:KEY=V to one.")
@click.option("--quick", is_flag=True, help="Use each algorithm's quick parameters (smoke runs).")
@click.option("--coarsen", metavar="METHOD", default=None,
              help="Place on the graph coarsened by METHOD (e.g. cpd); simulate on the original.")
@click.option("--coarsen-param", "coarsen_params", multiple=True, metavar="KEY=VALUE",
              help="Coarsening parameter, repeatable.")
@seed_option
@assume_batch_option
@time_limit_option("Per-cell limit (0 = none): every algorithm's time_limit; each phase of a cell "
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
                   f"floats to {CSV_DIGITS} significant digits; markdown: the tables in Markdown; html: one "
                   "self-contained page (sortable tables, makespan / lower bound and placement-time plots, each "
                   "cell's placement, the best placements' Gantt charts and memory over time).  A table fits the "
                   "terminal (or $COLUMNS, else 120 columns): algorithms become rows when graphs as rows are too "
                   "wide.")
@click.option("-o", "--output", default="-", metavar="FILE", show_default=True,
              help="Output file (- = stdout).  table/csv/markdown/html are written atomically at the end; "
                   "json is appended line by line.")
@click.option("--resume", metavar="FILE", default=None,
              help="Skip cells already in FILE (an earlier --format json output); with -o FILE the new "
                   "rows are appended to it.")
@click.option("--retry-failed", is_flag=True, help="With --resume: run error/timeout cells again.")
@click.option("--plot", metavar="FILE", default=None,
              help="Makespan bars per graph and a Gantt chart of each best placement (.svg; .png needs "
                   "matplotlib).")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even when some cells failed or timed out.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress on stderr: a bar on a terminal, one line per finished cell when stderr is piped.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress and no notes on stderr (failed cells, warnings and errors are still said).")
@click.option("-v", "--verbose", is_flag=True,
              help="Show the algorithms' own progress lines (solver incumbents, library banners); without it "
                   "cells run quietly.  Either way what a cell prints comes above the progress bar when it "
                   "finishes, prefixed by the cell, and warnings about a result are always shown.")
def compare(graphs, clusters, algos, exclude, params, coarsen_params, allow_failures, quiet, assume_batch,
            **options):
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
      placer compare sample_graphs/zoo --algos placement --exclude milp,hierarchical --quick
      placer compare sample_graphs/zoo --quick --format html -o zoo.html
      placer compare big/ -j 8 --time-limit 600 --format json -o runs.ndjson
      placer compare big/ --format json --resume runs.ndjson -o runs.ndjson
      placer compare big/ --executor ray --ray-address auto --format csv -o all.csv
      placer compare g.json --algos m-topo,heft --memory static
      placer compare g.json --algos data-parallel,metis --assume-batch 64
    """
    _check_options(**options)
    algorithms = _algorithms(algos, exclude, quiet)
    common, per = _split_params(params, algorithms)
    if assume_batch is not None:  # to every compared algorithm that splits the batch
        if any("assume_batch" in registry.get(a).params for a in algorithms):
            common["assume_batch"] = str(assume_batch)
        else:
            warn("placer: --assume-batch ignored: no compared algorithm splits the batch")
    if quiet:
        options["progress"] = False
    try:
        with quiet_output(quiet):
            result = run_compare(graphs, _clusters(clusters, quiet), algorithms,
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


def _clusters(names: tuple[str, ...], quiet: bool = False) -> list:
    if not names:
        if not quiet:
            warn("placer: no --cluster given, using the default 4xV100-pcie (4x V100-32GB, PCIe)")
        return [load_cluster(None)]
    return [load_cluster(c) for c in names]
