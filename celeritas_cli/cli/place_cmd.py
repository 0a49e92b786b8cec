"""``placer place``: run one registered placement algorithm."""

from __future__ import annotations

import time

import click

from .. import registry
from ..errors import InvalidInput
from ..log import quiet as quiet_output
from ..log import warn
from ..model.clock import process_start
from ..model.congestion import DEFAULT_CONGESTION
from ..model.params import CAP_TIME_LIMIT, DEFAULT_TIME_LIMIT, SOLVER_TIME_LIMIT
from ..model.costs import cost_model
from ..model.io import load_graph
from ..sim.judge import attach_origin
from ..sim.simulator import simulate
from ..transform.size import derived_budget
from . import common
from .common import (
    assume_batch_option,
    cluster_option,
    congestion_option,
    emit,
    finish,
    get_cluster,
    max_derived_option,
    output_option,
    parse_params,
    seed_option,
    stdin_is_tty,
    time_limit_option,
)

#: the algorithm of ``placer place`` without ``--algo``
DEFAULT_ALGO = "auto"


def _list_algorithms() -> None:
    from rich.table import Table

    from ..log import console

    table = Table(title="placement algorithms (placer place --algo NAME)")
    for col in ("name", "paper", "section", "what it does", "parameters"):
        table.add_column(col, overflow="fold")
    aliases: dict[str, list[str]] = {}
    for alias, (name, _) in registry.ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    for e in registry.entries():
        params = ", ".join(f"{k}={p.default!r}" + (f" ({p.range_text()})" if p.range_text() else "")
                           for k, p in e.params.items()) or "-"
        summary = e.summary + (f" [needs extra: {e.extra}]" if e.extra else "")
        table.add_row(e.name + (f" (also {', '.join(aliases[e.name])})" if e.name in aliases else ""), e.paper,
                      e.section, summary, params)
    console(width=160).print(table)


@click.command(context_settings={"max_content_width": 100})
@click.argument("graph_path", metavar="[GRAPH|-]", required=False)
@click.option("--algo", "-a", metavar="NAME", default=DEFAULT_ALGO, show_default=True,
              help="Placement algorithm (see --list); the default, auto, is placer's own optimizer. Aliases: "
                   f"{registry.alias_text()}; a near miss is answered with the closest names.")
@cluster_option
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Algorithm parameter, repeatable (see --list for each algorithm's).")
@seed_option
@time_limit_option(f"Time limit in seconds, counted from the start of the command, loading included; 0 = no "
                   f"limit. Every algorithm holds it (by default auto and pipeline {DEFAULT_TIME_LIMIT:g} s, milp "
                   f"and hierarchical {SOLVER_TIME_LIMIT:g} s, the others {CAP_TIME_LIMIT:g} s): stopped past it, it answers with the best plan it had or an "
                   f"error. An explicit -p time_limit=S wins.")
@congestion_option("Link rule the algorithm plans with (and --simulate judges with), for algorithms that take "
                   "one (placer place --list); an explicit -p congestion=RULE wins. Default: the algorithm's "
                   f"({DEFAULT_CONGESTION}).", default=None)
@click.option("--simulate/--no-simulate", "do_simulate", default=False,
              help="Also simulate the result and print makespan / LB to stderr (on a coarse graph: labelled so, "
                   "plus the original graph's when meta.coarsened_from_file is readable).")
@click.option("--timings/--no-timings", default=True, show_default=True,
              help="Record wall-clock times (placement_time_s, solver/training times). --no-timings makes the "
                   "file byte-identical for the same input and --seed.")
@assume_batch_option
@click.option("--embed-derived", is_flag=True,
              help="Also write the derived graph (data-parallel replicas, split operations) as split_graph, for "
                   "tools that want the document; by default only its recipe (derivation) is written, from which "
                   "simulate, run and export rebuild it.")
@max_derived_option
@click.option("--list", "list_algos", is_flag=True, help="List the algorithms with their papers and exit.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress (auto's bar or lines) and no notes on stderr; warnings about the result are "
                   "still said.")
@output_option
def place(graph_path, algo, cluster_path, params, seed, time_limit, congestion, do_simulate, timings, assume_batch,
          embed_derived, max_derived_nodes, list_algos, quiet, output):
    """Place GRAPH (a graph or coarse graph file, - for stdin) on a cluster.

    Without --algo, auto searches for the best placement it can confirm with
    the simulator within --time-limit (10 s): a portfolio of the fast
    algorithms, then refinement; give it the original graph (it coarsens by
    itself). A placement made on a coarse graph is written over the original
    node ids.

    \b
    Examples:
      placer place g.json > p.json                 # auto, the default
      placer place g.json --time-limit 60 --no-timings -o p.json
      placer place g.json -q -o p.json             # no progress on stderr
      placer coarsen g.json | placer place --algo adjusting > p.json
      placer place g.json --algo heft --cluster moirai-intra-server -o p.json
      placer place coarse.json --algo milp --time-limit 30 --congestion port
      placer place g.json --algo m-sct --seed 3 --no-timings   # byte-identical reruns
      placer place g.json --algo data-parallel --assume-batch 64   # a graph without meta.batch_size
      placer place g.json --algo pipeline -p stages=4 -p microbatches=16 --cluster moirai-intra-server
      placer place --list
    """
    started = (common.FAST_EXIT and process_start()) or time.perf_counter()  # the placer process's start
    if list_algos:
        _list_algorithms()
        return
    try:  # imports only that algorithm's module when it exists; an alias names one and fixes parameters
        algo, given_params = registry.resolve(algo, parse_params(params))
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--algo") from None
    if graph_path is None:
        if stdin_is_tty():
            raise click.UsageError("no GRAPH given and stdin is a terminal (use a file or pipe one in, e.g. "
                                   "`placer place g.json` or `placer coarsen g.json | placer place --algo adjusting`)")
        graph_path = "-"
    entry = registry.get(algo)
    raw, left_out = registry.with_flags(entry, given_params, time_limit=time_limit, congestion=congestion,
                                        assume_batch=assume_batch)
    for line in left_out:
        warn(f"placer: {line}")
    entry.coerce(raw)  # a bad or out-of-range parameter says so before anything is loaded
    graph = load_graph(graph_path)
    cluster = get_cluster(cluster_path, quiet=quiet)
    if graph.is_coarse and (do_simulate or entry.uses_origin):
        attach_origin(graph)  # meta.coarsened_from_file, when readable
    costs = cost_model(graph, cluster)
    # --time-limit bounds the whole command, loading included: the deadline counts from its start
    with quiet_output(quiet), derived_budget(max_derived_nodes):
        result = registry.place(graph, cluster, algo, seed=seed, params=raw, costs=costs, started=started)
    if do_simulate:
        with derived_budget(max_derived_nodes):
            _report(graph, cluster, algo, result, costs, congestion or DEFAULT_CONGESTION)
    emit(result.to_dict(timings=timings, embed_derived=embed_derived), output)
    finish()  # the interpreter need not free the graph node by node: the limit counts until the process ends


def _report(graph, cluster, algo: str, result, costs, congestion: str) -> None:
    """``--simulate``: the judged makespan on stderr, labelled with the graph
    it holds for; for a coarse graph also the original graph's when known."""
    report = simulate(graph, cluster, result, costs=costs, congestion=congestion)
    on = f" on the coarse graph '{graph.name}' ({graph.n} nodes)" if graph.is_coarse else ""
    warn(f"placer: {algo}: simulated makespan{on} {report['makespan_s']:.6g} s ({report['status']})"
         + _ratio(report) + f", placed in {result.placement_time_s:.3f} s")
    if not graph.is_coarse:
        return
    if graph.origin is None:
        warn(f"placer: {algo}: these are the coarse graph's numbers; the original graph's makespan differs "
             f"(judge it with `placer simulate {graph.original_name}.json -P PLACEMENT`)")
        return
    orig = simulate(graph.origin, cluster, result, costs=costs.for_graph(graph.origin), congestion=congestion)
    warn(f"placer: {algo}: on the original graph '{graph.origin.name}' ({graph.origin.n} nodes): simulated "
         f"makespan {orig['makespan_s']:.6g} s ({orig['status']})" + _ratio(orig))


def _ratio(report: dict) -> str:
    ratio = report["makespan_over_lb"]
    return f", makespan/LB {ratio:.3f}" if ratio is not None else ""
