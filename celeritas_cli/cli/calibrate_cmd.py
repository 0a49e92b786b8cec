"""``placer calibrate``: fit node times, batch lines, links and contention from
``placer run --node-times`` reports into graph and cluster files.  Thin layer over
:mod:`celeritas_cli.profile.calibrate` and :mod:`celeritas_cli.run.resimulate`."""

from __future__ import annotations

import click

from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.jsonio import label_of, read_json
from .common import emit, get_cluster, output_option, stderr_console


@click.command("calibrate", context_settings={"max_content_width": 100})
@click.argument("reports", nargs=-1, required=True, metavar="REPORT...")
@click.option("--graph", "-g", "graph_path", required=True, metavar="FILE",
              help="The graph file the placements were made for (placer profile --measure).")
@click.option("--cluster", "-c", "cluster_path", required=True, metavar="FILE|NAME",
              help="The cluster the runs used (placer profile --comm-bench --processes N).")
@click.option("--cluster-out", "cluster_out", metavar="FILE", default=None,
              help="Where to write the calibrated cluster (fitted links; hosts with their contention, "
                   "transfer and collective costs).")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: node wall times, what a step takes on this machine as loaded as it was; cpu: the "
                   "thread CPU time of each node, what it would take without waiting for a core.")
@output_option
def calibrate(reports, graph_path, cluster_path, cluster_out, clock, output):
    """Fit what the simulator needs from measured runs and write it into the
    graph (per-node times at the graph's batch, batch lines a + b*batch where
    nodes ran at two or more batch sizes, e.g. in a data-parallel run) and the
    cluster (latency and bandwidth per device pair; per host, a contention
    factor for devices that share its cores, what a transfer costs the sending
    and the receiving process, and a ring collective's fixed cost per step).  The fit's error and every report's
    placement simulated again (measured / simulated before and after, Kendall
    tau) go to stderr.

    \b
    Examples:
      placer run --graph g.json -P dp.json --cluster cpu2.json --backend gloo --node-times -o r1.json
      placer run --graph g.json -P metis.json --cluster cpu2.json --backend gloo --node-times -o r2.json
      placer calibrate r1.json r2.json --graph g.json --cluster cpu2.json -o g_cal.json --cluster-out cpu2_cal.json
      placer place g_cal.json --cluster cpu2_cal.json -o p.json
    """
    from ..profile.calibrate import calibrate as fit
    from ..run.resimulate import BAND, resimulate, summary

    console = stderr_console()
    graph_doc = read_json(graph_path, "placer.graph/v1")
    cluster = get_cluster(cluster_path)
    labels = [label_of(r) for r in reports]
    docs = [read_json(r, "placer.run/v1") for r in reports]
    cal = fit(graph_doc, cluster.to_dict(), docs, labels=labels, clock=clock)
    s = cal.summary
    e = s["node_error"]
    say = lambda msg: console.print(f"placer calibrate: {msg}")  # noqa: E731
    say(f"{s['nodes_fitted']} node times at batch {s['batch']} from {len(docs)} report(s) ({clock} clock), "
        f"{s['batch_lines']} with a batch line, {s['nodes_unmeasured']} unmeasured (op-type fit), "
        f"{s['scaled_linearly']} scaled linearly from another batch")
    say(f"fit error per sample (|sample - fitted| / fitted): mean {100 * e['mean']:.1f}%, median "
        f"{100 * e['median']:.1f}%, p90 {100 * e['p90']:.1f}%, {100 * e['within_20']:.0f}% within 20%")
    fit = s["op_types"].get("*")
    if fit:
        say(f"node times against the graph's: {1e6 * fit['overhead_s']:.1f} us + {fit['scale']:.3f} x old time "
            f"(least squares over {fit['nodes']} nodes; per op type in meta.calibrated of the graph)")
    for lab, g in s["dispatch_s"].items():
        say(f"{lab}: time between nodes {1e6 * g:.1f} us per node")
    d = s["dispatch"]
    say(f"dispatch: {1e6 * d['per_node_s']:.1f} us per node (added to every node); a transfer costs its sender "
        f"{1e6 * d['send_s'][0]:.1f} us + {1e12 * d['send_s'][1]:.1f} us per MB and its receiver "
        f"{1e6 * d['recv_s'][0]:.1f} us of the device's time (hosts' send_s / recv_s); fitted over "
        f"{d['devices']} device runs")
    col = s["collective"]
    if col["buckets"]:
        say(f"collectives: {1e6 * col['collective_step_s']:.1f} us per ring step beyond the links (hosts' "
            f"collective_step_s), from {col['buckets']} data-parallel all-reduce(s)")
    for host, h in s["hosts"].items():
        say(f"host {host}: contention {h['contention']:.3f} (from {h['nodes']} nodes run both alone and crowded)"
            if h["nodes"] else f"host {host}: contention not fitted (no node ran both alone and crowded): 1.0")
    for pair, f in s["links"].items():
        say(f"link {pair}: latency {1e6 * f['latency_s']:.1f} us, bandwidth {f['bandwidth_Bps'] / 1e9:.3f} GB/s "
            f"({f['how']}, {f['n']} transfers, median error {100 * f['error']:.1f}%)")
    kept = [i for i, d in enumerate(docs) if isinstance(d["node_times"].get("placement"), dict)]
    for i in sorted(set(range(len(docs))) - set(kept)):
        say(f"{labels[i]}: keeps no placement (made by an older placer run): not simulated again")
    graph = Graph.from_dict(cal.graph, "calibrated graph")
    rows = resimulate([docs[i] for i in kept], [labels[i] for i in kept], graph,
                      Cluster.from_dict(cal.cluster, "calibrated cluster"))
    for r in rows:
        say(f"{r['report']}: measured {r['measured_s']:.5g} s; simulated {r['before_s']:.5g} s before "
            f"(measured/simulated {r['measured_s'] / r['before_s']:.2f}), {r['after_s']:.5g} s after "
            f"({r['measured_s'] / r['after_s']:.2f})")
    if len(rows) >= 2:
        t = summary(rows)
        say(f"Kendall tau measured vs simulated: {t['tau_before']:.2f} before, {t['tau_after']:.2f} after; "
            f"within [{BAND[0]}, {BAND[1]}]: {t['within_before']} before, {t['within_after']} after, of "
            f"{t['placements']} (the same runs: an in-sample check)")
    if cluster_out:
        emit(cal.cluster, cluster_out)
    else:
        say("the calibrated cluster is not written (--cluster-out FILE)")
    emit(cal.graph, output)
