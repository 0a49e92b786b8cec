"""The ``placer.report/v1`` document of a simulated schedule
(docs/design.md, "Report"): makespan and status, per-device time and
memory under the judge's memory rule (:mod:`celeritas_cli.sim.memory`),
per-link traffic, the lower bounds (:mod:`celeritas_cli.sim.bounds`) and
the realised critical path.

Memory fields (the rule applied, ``memory_rule``; why it is not the one
asked, ``memory_rule_note``): per device ``memory_bytes`` (the peak under
the rule), ``static_memory_bytes`` (the static sum), ``peak_at_s``,
``peak_live`` (the five largest items live at the peak), ``idle_s``
(makespan - busy time: a pipeline's bubble) and ``oom`` (the peak over
capacity); ``memory_timeline`` (``{device: [[t, bytes], ...]}``, the live
memory's step function, max-pooled to at most 2000 points a device).
"""

from __future__ import annotations

from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..model.placement import Placement, finite_or_none
from .memory import DEFAULT_RULE, judge_memory
from .mfu import mfu

REPORT_SCHEMA = "placer.report/v1"


def critical_path(graph: Graph, sched) -> list[int]:
    """Nodes of the realised schedule's critical path, first to last: from
    the node that finishes last, back through ``sched.binding`` (the node
    that let each node start; *sched* is a
    :class:`~celeritas_cli.sim.simulator.Schedule`)."""
    if graph.n == 0:
        return []
    v = max(range(graph.n), key=lambda x: (sched.finish[x], -x))
    path = []
    seen = set()
    while v != -1 and v not in seen:
        seen.add(v)
        path.append(v)
        v = sched.binding[v]
    path.reverse()
    return path


def build_report(graph: Graph, cluster: Cluster, placement: Placement, sched, costs: CostModel, congestion: str,
                 bounds: list[dict], given: Graph | None = None, memory: str = DEFAULT_RULE) -> dict:
    """The report of *sched* (a :class:`~celeritas_cli.sim.simulator.Schedule`
    of *graph*, the graph simulated) for *placement*; *bounds* are its
    :func:`~celeritas_cli.sim.bounds.lower_bounds` (``path_and_work``
    first); *given* is the graph the user gave when *graph* is derived from
    it (MFU counts its FLOPs); *memory* the rule asked for (module
    docstring)."""
    k = cluster.k
    busy = [0.0] * k
    count = [0] * k
    time = sched.node_time or costs.placed_time(sched.device_of)
    for v, d in enumerate(sched.device_of):
        busy[d] += time[v][d]
        count[d] += 1
    if cluster.transfer_costs and sched.overhead:       # rule 3a of the simulator
        busy = [b + x for b, x in zip(busy, sched.overhead)]
    prof = judge_memory(graph, sched, k, memory)
    over_ids = set(cluster.over_capacity(prof.peak))
    makespan = sched.makespan
    devices = []
    oom = [cluster.ids[d] for d in sorted(over_ids)]
    for d, dv in enumerate(cluster.devices):
        devices.append({"id": dv.id, "type": dv.type, "nodes": count[d], "busy_s": busy[d],
                        "utilisation": busy[d] / makespan if makespan > 0 else 0.0,
                        "idle_s": max(0.0, makespan - busy[d]),
                        "memory_bytes": prof.peak[d], "static_memory_bytes": prof.static[d],
                        "peak_at_s": prof.peak_at[d], "peak_live": prof.live[d],
                        "capacity_bytes": dv.memory, "oom": d in over_ids})
        if cluster.transfer_costs:      # rule 3a of the simulator: part of busy_s
            devices[-1]["transfer_overhead_s"] = sched.overhead[d] if sched.overhead else 0.0
    links: dict[tuple[int, int], list] = {}
    for tr in sched.transfers:
        st = links.setdefault((tr.src_dev, tr.dst_dev), [0.0, 0, 0])
        st[0] += tr.end - tr.start
        st[1] += tr.nbytes
        st[2] += 1
    link_rows = [{"src": cluster.ids[a], "dst": cluster.ids[b], "busy_s": st[0], "bytes": st[1], "transfers": st[2]}
                 for (a, b), st in sorted(links.items())]
    lb = bounds[0]["value_s"]  # path_and_work: lower_bound()
    # the tightest bound that holds for this placement: memory_cut needs it to fit under the static rule
    # (a graph whose static sum fits no device may still fit one under the time rule, with no crossing)
    static_oom = bool(cluster.over_capacity(prof.static))
    tight = max((b for b in bounds if not (static_oom and b["name"] == "memory_cut")), key=lambda b: b["value_s"])
    path = critical_path(graph, sched)
    cp_ids: list[str] = []
    for v in path:
        cp_ids.extend(graph.original_ids(v))
    return {
        "schema": REPORT_SCHEMA,
        "graph": graph.original_name,
        "cluster": cluster.name,
        "algorithm": placement.algorithm,
        "congestion": congestion,
        "memory_rule": prof.rule,
        "memory_rule_note": prof.note,
        "status": "OOM" if oom else "OK",
        "makespan_s": makespan,
        "lower_bound_s": lb,
        "makespan_over_lb": finite_or_none(makespan / lb) if lb > 0 else None,
        "lower_bounds": bounds,
        "tight_lower_bound_s": tight["value_s"],
        "tight_lower_bound_from": tight["name"],
        "makespan_over_tight_lb": finite_or_none(makespan / tight["value_s"]) if tight["value_s"] > 0 else None,
        "oom_devices": oom,
        "devices": devices,
        "links": link_rows,
        "transfers": {"count": len(sched.transfers), "bytes": sum(tr.nbytes for tr in sched.transfers)},
        "critical_path": cp_ids,
        "memory_timeline": {cluster.ids[d]: prof.timeline[d] for d in range(k)},
        "estimate": placement.estimate.to_dict(),
        "placement_time_s": placement.placement_time_s,
        "mfu": mfu(given if given is not None else graph, cluster, makespan),   # sim/mfu.py (WP llm)
    }
