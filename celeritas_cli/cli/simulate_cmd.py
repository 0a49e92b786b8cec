"""``placer simulate``: the discrete-event simulator, judge of every placement."""

from __future__ import annotations

import click

from ..log import console as text_console
from ..model.io import load_graph, load_placement
from ..sim.describe import describe_placement
from ..sim.memory import RULES as MEMORY_RULES
from ..sim.simulator import simulate as run_simulation
from ..transform.size import derived_budget
from .common import congestion_option, emit, finish, max_derived_option, output_option, placement_cluster


def render_report(report: dict, plan: str | None = None) -> None:
    """The report as a table on stdout; *plan* the placement's plan in words
    (:func:`celeritas_cli.sim.describe.describe_placement`)."""
    from rich.table import Table
    from rich.text import Text

    console = text_console(width=120)
    lb = report["lower_bound_s"]
    ratio = report["makespan_over_lb"]
    console.print(Text.assemble((str(report["graph"]), "bold"), " on ", (str(report["cluster"]), "bold"),
                                f" by {report['algorithm']} (congestion: {report['congestion']}, memory rule: "
                                f"{report['memory_rule']})"))
    if report.get("memory_rule_note"):
        console.print(f"note: {report['memory_rule_note']}")
    if plan:
        console.print(f"plan: {plan}")
    if report.get("judge"):
        console.print(f"judged: {report['judge']['words']}")
    console.print(f"makespan {report['makespan_s']:.6g} s   lower bound {lb:.6g} s   "
                  f"makespan/LB {ratio:.3f}   status {report['status']}" if ratio is not None else
                  f"makespan {report['makespan_s']:.6g} s   status {report['status']}")
    tight = report.get("tight_lower_bound_from")
    if tight and tight != "path_and_work" and report.get("makespan_over_tight_lb") is not None:
        console.print(f"tighter lower bound {report['tight_lower_bound_s']:.6g} s ({tight})   "
                      f"makespan/LB {report['makespan_over_tight_lb']:.3f}")
    t = Table(title=f"devices (memory: peak under the {report['memory_rule']} rule)")
    for col in ("device", "type", "nodes", "busy s", "util", "idle s", "peak GiB", "at s", "static GiB",
                "cap GiB", "OOM"):
        t.add_column(col, justify="right" if col not in ("device", "type") else "left")
    for d in report["devices"]:
        t.add_row(d["id"], d["type"], str(d["nodes"]), f"{d['busy_s']:.4g}", f"{d['utilisation']:.1%}",
                  f"{d['idle_s']:.4g}", f"{d['memory_bytes'] / 2**30:.2f}", f"{d['peak_at_s']:.4g}",
                  f"{d['static_memory_bytes'] / 2**30:.2f}", f"{d['capacity_bytes'] / 2**30:.2f}",
                  Text("OOM", style="red") if d["oom"] else "")
    console.print(t)
    if any("transfer_overhead_s" in d for d in report["devices"]):    # a calibrated host's transfer costs
        console.print("of the busy time, sending and receiving tensors (the hosts' send_s / recv_s): " + ", ".join(
            f"{d['id']} {d.get('transfer_overhead_s', 0.0):.4g} s" for d in report["devices"]))
    for d in report["devices"]:
        if d["oom"] and d["peak_live"]:
            live = ", ".join(f"{x['node']} {x['bytes'] / 2**20:.1f} MiB {x['kind']}" for x in d["peak_live"])
            console.print(f"{d['id']} at its peak holds {live}")
    if report["links"]:
        lt = Table(title="links")
        for col in ("link", "transfers", "MiB", "busy (s)"):
            lt.add_column(col, justify="right" if col != "link" else "left")
        for ln in report["links"]:
            lt.add_row(f"{ln['src']}→{ln['dst']}", str(ln["transfers"]), f"{ln['bytes'] / 2**20:.1f}",
                       f"{ln['busy_s']:.6g}")
        console.print(lt)
    console.print(f"transfers: {report['transfers']['count']} ({report['transfers']['bytes'] / 2**20:.1f} MiB); "
                  f"critical path: {len(report['critical_path'])} nodes")
    if report.get("mfu") is not None:
        console.print(f"model FLOPs utilisation (MFU): {report['mfu']:.1%}")


@click.command(context_settings={"max_content_width": 100})
@click.argument("graph_path", metavar="GRAPH|-")
@click.option("--placement", "-P", "placement_path", required=True, metavar="FILE|-",
              help="Placement file (- for stdin).")
@click.option("--cluster", "-c", "cluster_path", metavar="FILE|NAME", default=None,
              help="Cluster file or bundled name. Default: the bundled cluster the placement was made for (a "
                   "placement made on a cluster file, or on an edited copy of a bundled one, needs --cluster; "
                   "a --cluster other than the one it was made for is a warning).")
@congestion_option("channel: one transfer at a time per directed link; port: one uplink and one downlink "
                   "per device; none: transfers overlap freely.")
@click.option("--no-congestion", is_flag=True, help="Short for --congestion none.")
@click.option("--memory", type=click.Choice(MEMORY_RULES), default="time", show_default=True,
              help="time: each device's live memory along the schedule (resident state for the whole step, an "
                   "activation until its last use, a received tensor until its last consumer finishes), OOM on "
                   "the peak; static: the per-device sum of memory_bytes (the seed papers' rule).  A graph that "
                   "declares no resident_bytes is judged by the static rule (the report says so).")
@click.option("--gantt", metavar="FILE",
              help="Write a Gantt chart (.svg, or .png with matplotlib), with each device's memory over time "
                   "under the lanes.")
@click.option("--trace", metavar="FILE",
              help="Write a Chrome trace JSON (chrome://tracing, Perfetto), with memory counters per device.")
@click.option("--format", "fmt", type=click.Choice(["json", "table", "html"]), default="json", show_default=True,
              help="json: the placer.report/v1 document; table: a readable summary on stdout; html: one "
                   "self-contained page (Gantt chart with hover details and the critical path, memory over time "
                   "per device, link traffic, estimate and caveats) written to -o.")
@click.option("--full-sim", is_flag=True,
              help="Simulate every replica of a plan written in its symmetric form (data parallelism, replicated "
                   "pipelines: the file lists replica 0 and its replicas' devices). By default one replica of "
                   "each kind is simulated and stands for the others, which gives the same numbers "
                   "(docs/design.md, 'The symmetric judge') in a time that does not grow with the replicas.")
@max_derived_option
@output_option
def simulate(graph_path, placement_path, cluster_path, congestion, no_congestion, memory, gantt, trace, fmt,
             full_sim, max_derived_nodes, output):
    """Simulate a placement of GRAPH and report makespan, utilisation, memory
    (each device's peak, when and what is live then), transfers, the
    critical path and makespan / lower bound.

    \b
    Examples:
      placer simulate g.json --placement p.json --format table
      placer place g.json --algo heft | placer simulate g.json -P - --gantt g.svg
      placer simulate g.json -P p.json --congestion port --trace trace.json -o report.json
      placer simulate g.json -P p.json --memory static --format table
      placer simulate g.json -P p.json --format html -o page.html
      placer simulate g.json -P dp.json --full-sim      # every replica, event by event
    """
    if graph_path == "-" and placement_path == "-":
        raise click.UsageError("GRAPH and --placement cannot both be stdin")
    if trace == "-" and (output == "-" or fmt == "table"):
        raise click.UsageError("--trace - would put the trace and the report on stdout together; "
                               "give --trace FILE, or -o FILE for the report")
    if no_congestion:
        congestion = "none"
    placement = load_placement(placement_path)
    graph = load_graph(graph_path)
    label = "<stdin>" if placement_path == "-" else placement_path
    cluster = placement_cluster(placement, cluster_path, label)
    scheds: list = []
    with derived_budget(max_derived_nodes):
        report = run_simulation(graph, cluster, placement, congestion=congestion, label=label, schedule_out=scheds,
                                memory=memory, full=full_sim)
    sim_graph = scheds[0].graph  # the split graph when the placement carries one
    if gantt:
        from ..sim.gantt import write_gantt

        write_gantt(sim_graph, cluster, scheds[0], gantt, title=f"{report['graph']} / {report['algorithm']}",
                    lower_bound=report["lower_bound_s"], memory=report)
    if trace:
        from ..sim.gantt import write_trace

        write_trace(sim_graph, cluster, scheds[0], trace, memory=report)
    if fmt == "html":
        from ..model.jsonio import write_bytes
        from ..report import placement_page

        plan = describe_placement(placement, graph, cluster)
        write_bytes(placement_page(sim_graph, cluster, scheds[0], report, plan).encode(), output)
    elif fmt == "table":
        render_report(report, describe_placement(placement, graph, cluster))
        if output != "-":
            emit(report, output)
    else:
        emit(report, output)
    finish()
