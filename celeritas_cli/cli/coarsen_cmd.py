"""``placer coarsen``: run one registered coarsening method (Celeritas
Optimal Operation Fusion ``cpd`` and the others in the registry)."""

from __future__ import annotations

import os
import time

import click

from .. import registry
from ..log import warn
from ..model.costs import cost_model
from ..model.io import load_graph
from .common import (
    cluster_option,
    emit,
    finish,
    get_cluster,
    output_option,
    parse_params,
    stdin_is_tty,
)


class _MethodChoice(click.Choice):
    """``click.Choice`` over the registry, read when the command runs (other
    modules may register methods after this one is imported)."""

    def __init__(self) -> None:
        super().__init__([], case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self):
        return tuple(registry.coarsener_names())

    @choices.setter
    def choices(self, value) -> None:  # click's __init__ assigns it
        pass


def _fmt_bytes(b: float) -> str:
    return f"{b / 1024**3:.2f} GiB"


@click.command(context_settings={"max_content_width": 100})
@click.argument("graph_path", metavar="[GRAPH|-]", required=False)
@click.option("--method", "-m", type=_MethodChoice(), default="cpd", show_default=True,
              help="Coarsening method (from the registry).")
@click.option("--R", "R", type=int, default=None, metavar="N",
              help="cpd: exploration range, max nodes per cluster (Celeritas Eq. 6; default: the paper's 200, "
                   "lowered so the coarse graph keeps at least 3 nodes per device).")
@click.option("--M", "M", type=float, default=None, metavar="X",
              help="cpd: memory cap per cluster, a fraction of the smallest device memory if <= 1, "
                   "else bytes (default 0.25; never above the packing bound that keeps a graph that fits "
                   "the devices placeable).")
@cluster_option
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Method parameter, repeatable (for methods other than cpd, or to set cpd's).")
@output_option
def coarsen(graph_path, method, R, M, cluster_path, params, output):
    """Coarsen GRAPH (- for stdin) into a graph of a few hundred fused nodes.

    Each coarse node lists its original nodes in `members`; placing the coarse
    graph writes the placement over the original ids.  When GRAPH is a file,
    `meta.coarsened_from_file` records its absolute path, so `placer place
    --simulate` can also report the makespan on the original graph.  Node count and CCR
    (Celeritas Eq. 1) before and after go to stderr, as in Celeritas Table 2.

    \b
    Examples:
      placer coarsen g.json | placer place --algo adjusting > p.json
      placer coarsen g.json --R 100 --M 0.5 --cluster moirai-intra-server -o coarse.json
      placer profile --synthetic layered --nodes 36000 | placer coarsen - | placer place --algo order-place
    """
    if graph_path is None:
        if stdin_is_tty():
            raise click.UsageError("no GRAPH given and stdin is a terminal (use a file or pipe one in, e.g. "
                                   "`placer coarsen g.json | placer place --algo adjusting`)")
        graph_path = "-"
    raw: dict = parse_params(params)
    entry = registry.get_coarsener(method)
    for key, value in (("R", R), ("M", M)):
        if value is None:
            continue
        if key not in entry.params:
            raise click.BadParameter(f"method '{method}' takes no parameter {key} "
                                     f"(it takes: {', '.join(sorted(entry.params)) or 'none'})",
                                     param_hint=f"--{key}")
        raw[key] = value
    graph = load_graph(graph_path)
    cluster = get_cluster(cluster_path)
    t0 = time.perf_counter()
    costs = cost_model(graph, cluster)
    coarse = registry.coarsen(graph, cluster, method, params=raw, costs=costs)
    dt = time.perf_counter() - t0
    if graph_path != "-" and not graph.is_coarse:
        # lets `placer place --simulate` (and milp) judge the result on the original graph
        coarse.meta["coarsened_from_file"] = os.path.abspath(graph_path)
    ccr0 = costs.ccr()
    ccr1 = costs.for_graph(coarse).ccr()
    factor = graph.n / coarse.n if coarse.n else float("inf")
    warn(f"placer: coarsen --method {method} on {cluster.name}: "
         f"nodes {graph.n} -> {coarse.n} ({factor:.1f}x fewer), edges {graph.m} -> {coarse.m}, "
         f"CCR {ccr0:.3f} -> {ccr1:.3f}, largest node {_fmt_bytes(max(coarse.memory, default=0))}, "
         f"{dt:.3f} s")
    info = coarse.meta.get("cpd") if method == "cpd" else None
    if info:
        chosen = " (chosen from the graph; --R / --M override)" if R is None and M is None and not params else ""
        split = f", {info['split_units']} colocation units split to stay placeable" if info.get("split_units") else ""
        warn(f"placer: cpd R={info['R']}, memory cap {_fmt_bytes(info['M_bytes'])} per cluster{chosen}{split}")
    emit(coarse.to_dict(), output)
    finish()
