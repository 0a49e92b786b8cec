"""The page of one simulated placement (``placer simulate --format html``):
the headline numbers, the plan in words, the estimate and its caveats, the
Gantt chart with the critical path, memory over time per device against its
capacity, the devices and the link traffic.

Everything shown comes from the simulator's report (``placer.report/v1``,
docs/design.md "Report") and its schedule; fields a report may lack (an
older report: ``memory_timeline``, ``peak_live``, ``idle_s``,
``peak_at_s``, ``mfu``) are left out or replaced, never guessed.
"""

from __future__ import annotations

from ..model.cluster import Cluster
from ..model.graph import Graph
from ..sim.simulator import critical_path
from .charts import gantt_chart, memory_chart
from .page import esc, fmt_bytes, fmt_s, kpis, kv_list, page, table, td

#: estimate fields shown in the estimate list (others are internal or shown elsewhere)
_ESTIMATE_HIDDEN = {"candidates", "caveat", "skipped"}


def headline(report: dict) -> str:
    """The KPI row: makespan, lower bound, makespan / LB, status, memory
    rule, transfers (and MFU when the report has it)."""
    ratio = report.get("makespan_over_lb")
    items = [("simulated makespan", f"{fmt_s(report.get('makespan_s'), 6)} s", ""),
             ("lower bound", f"{fmt_s(report.get('lower_bound_s'), 6)} s", ""),
             ("makespan / lower bound", f"{ratio:.3f}" if isinstance(ratio, (int, float)) else "-", ""),
             ("status", str(report.get("status")), "bad" if report.get("status") == "OOM" else "ok"),
             ("transfers", f"{report.get('transfers', {}).get('count', 0)} "
                           f"({fmt_bytes(report.get('transfers', {}).get('bytes', 0))})", "")]
    if report.get("memory_rule"):
        items.append(("memory rule", str(report["memory_rule"]), ""))
    if isinstance(report.get("mfu"), (int, float)):
        items.append(("model FLOPs utilisation", f"{report['mfu']:.1%}", ""))
    return kpis(items)


def notes(report: dict) -> list[str]:
    """The caveats of a result, as HTML list items: the algorithm's own
    caveat (†), why the memory rule differs from the one asked, a search the
    wall clock cut, an estimate that disagrees with the simulator, the
    devices over memory and what they hold at their peak."""
    est = report.get("estimate") or {}
    out = []
    if est.get("caveat"):
        out.append(f'<span class="dagger">†</span> {esc(est["caveat"])}')
    if report.get("memory_rule_note"):
        out.append(f"memory: {esc(report['memory_rule_note'])}")
    if est.get("clock_cut"):
        out.append("the wall clock cut the algorithm's search: another run may give another placement")
    if est.get("repeatable") is False:
        out.append("not repeatable: the algorithm's own search was ended by the wall clock")
    guess, real = est.get("makespan_s"), report.get("makespan_s")
    if isinstance(guess, (int, float)) and isinstance(real, (int, float)) and real > 0 \
            and abs(guess - real) > 0.01 * real and est.get("makespan_by") != "simulator":
        out.append(f"the algorithm estimated {fmt_s(guess, 6)} s; the simulator, which judges every placement, "
                   f"says {fmt_s(real, 6)} s ({(guess / real - 1):+.1%})")
    for d in report.get("devices") or []:
        if d.get("oom"):
            held = ", ".join(f"{x.get('node')} ({x.get('kind')}, {fmt_bytes(x.get('bytes'))})"
                             for x in d.get("peak_live") or [])
            out.append(f"<b class=\"bad\">{esc(d['id'])} is over memory</b>: peak {fmt_bytes(d.get('memory_bytes'))} "
                       f"of {fmt_bytes(d.get('capacity_bytes'))}" + (f"; at its peak it holds {esc(held)}" if held
                                                                      else ""))
    if report.get("tight_lower_bound_from") not in (None, "path_and_work") \
            and isinstance(report.get("tight_lower_bound_s"), (int, float)):
        out.append(f"a tighter lower bound holds: {fmt_s(report['tight_lower_bound_s'], 6)} s "
                   f"({esc(report['tight_lower_bound_from'])})")
    return out


def spread(report: dict) -> str:
    """The plan in the fewest words, from the report alone: the simulated
    graph's nodes over the devices that run some.

    Example
    -------
    >>> spread({"devices": [{"id": "gpu0", "nodes": 40}, {"id": "gpu1", "nodes": 20}, {"id": "gpu2", "nodes": 0}]})
    'operator placement: 60 nodes over 2 of 3 devices (gpu0 40, gpu1 20)'
    """
    devs = report.get("devices") or []
    used = sorted(((d["id"], int(d.get("nodes") or 0)) for d in devs if d.get("nodes")), key=lambda x: (-x[1], x[0]))
    total = sum(n for _, n in used)
    shown = ", ".join(f"{d} {n:,}" for d, n in used[:8]) + (", ..." if len(used) > 8 else "")
    of = f" of {len(devs)}" if len(used) != len(devs) else ""
    return f"operator placement: {total:,} nodes over {len(used)}{of} devices ({shown})"


def _estimate(report: dict) -> str:
    est = report.get("estimate") or {}
    pairs = [(k, esc(v if not isinstance(v, float) else f"{v:.6g}")) for k, v in est.items()
             if k not in _ESTIMATE_HIDDEN and isinstance(v, (str, int, float, bool)) and v is not None]
    html = kv_list(pairs) if pairs else '<p class="muted">the algorithm recorded no estimate</p>'
    cands = est.get("candidates")
    if isinstance(cands, list) and cands and all(isinstance(c, dict) for c in cands):
        rows = [[td(c.get("name", "?")), td(fmt_s(c.get("makespan_s"), 6), c.get("makespan_s")),
                 td(c.get("status", ""))] for c in cands]
        html += "<details><summary>the candidates it judged</summary>" + table(
            ["candidate", "makespan (s)", "status"], rows) + "</details>"
    return html


def devices_table(report: dict) -> str:
    """Per device: nodes, busy and idle time, utilisation, memory peak (and
    when), capacity, OOM; ``-`` where an older report lacks a field (idle
    time is makespan - busy time, worked out when ``idle_s`` is missing)."""
    rows = []
    for d in report.get("devices") or []:
        util = d.get("utilisation") or 0.0
        bar = f'<span class="bar" style="width:{60 * min(1.0, util):.0f}px"></span>{util:.1%}'
        idle = d.get("idle_s")
        if idle is None and isinstance(d.get("busy_s"), (int, float)) and report.get("makespan_s") is not None:
            idle = max(0.0, report["makespan_s"] - d["busy_s"])  # what idle_s is (an older report lacks it)
        rows.append([td(d.get("id")), td(d.get("type", "")), td(str(d.get("nodes", "")), d.get("nodes")),
                     td(fmt_s(d.get("busy_s"), 6), d.get("busy_s")), td(bar, util, raw=True),
                     td(fmt_s(idle, 6), idle),
                     td(fmt_bytes(d.get("memory_bytes")), d.get("memory_bytes"), cls="oom" if d.get("oom") else ""),
                     td(fmt_s(d.get("peak_at_s"), 6), d.get("peak_at_s")),
                     td(fmt_bytes(d.get("static_memory_bytes")), d.get("static_memory_bytes")),
                     td(fmt_bytes(d.get("capacity_bytes")), d.get("capacity_bytes")),
                     td("OOM" if d.get("oom") else "", cls="oom" if d.get("oom") else "")])
    return table(["device", "type", "nodes", "busy (s)", "utilisation", "idle (s)", "memory peak", "peak at (s)",
                  "static sum", "capacity", "OOM"], rows, left=2)


def links_section(report: dict) -> str:
    """The link traffic: a table per directed link (transfers, bytes, busy
    time and its share of the makespan) and a device x device matrix of the
    bytes sent."""
    links = report.get("links") or []
    if not links:
        return '<p class="muted">no transfers: every tensor stayed on its device</p>'
    makespan = float(report.get("makespan_s") or 0.0) or 1.0
    rows = []
    for ln in sorted(links, key=lambda x: -x.get("bytes", 0)):
        share = ln.get("busy_s", 0.0) / makespan
        bar = f'<span class="bar" style="width:{60 * min(1.0, share):.0f}px;background:#7f7f7f"></span>{share:.1%}'
        rows.append([td(f"{ln['src']} → {ln['dst']}"), td(str(ln.get("transfers", "")), ln.get("transfers")),
                     td(fmt_bytes(ln.get("bytes")), ln.get("bytes")), td(fmt_s(ln.get("busy_s"), 6), ln.get("busy_s")),
                     td(bar, share, raw=True)])
    html = table(["link", "transfers", "bytes", "busy (s)", "busy / makespan"], rows)
    ids = [d["id"] for d in report.get("devices") or []]
    sent = {(ln["src"], ln["dst"]): ln.get("bytes", 0) for ln in links}
    top = max(sent.values()) or 1
    cells = []
    for a in ids:
        row = [td(a)]
        for b in ids:
            v = sent.get((a, b), 0)
            style = f' style="background:rgba(78,121,167,{0.08 + 0.8 * v / top:.2f})"' if v else ""
            row.append(f'<td{style} data-tip="{esc(a)} → {esc(b)}: {fmt_bytes(v)}">{fmt_bytes(v) if v else ""}</td>')
        cells.append(row)
    html += "<h3>bytes sent (row: from, column: to)</h3>" + table(["from \\ to"] + ids, cells, sortable=False)
    return html


def critical_section(graph: Graph, sched, path: list[int], report: dict) -> str:
    """The critical path in words: its length, the compute on it and its
    first and last nodes (the Gantt chart outlines it)."""
    if not path:
        return '<p class="muted">empty graph</p>'
    compute = sum(sched.finish[v] - sched.start[v] for v in path)
    makespan = sched.makespan or 1.0
    names = [graph.ids[v] for v in path]
    shown = " → ".join(esc(n) for n in names[:12])
    if len(names) > 24:
        shown += " → … → " + " → ".join(esc(n) for n in names[-12:])
    elif len(names) > 12:
        shown += " → " + " → ".join(esc(n) for n in names[12:])
    ids = report.get("critical_path") or names
    given = f" ({len(ids)} of the graph given)" if len(ids) != len(path) else ""
    rest = ("; the rest is waiting for transfers and devices" if compute < 0.999 * makespan else
            ": the makespan is all computation on it")
    return (f"<p>{len(path)} nodes{given}, {fmt_s(compute, 6)} s of computation, {compute / makespan:.1%} of the "
            f"makespan{rest}.</p><p class=\"mono small\">{shown}</p>"
            f"<details><summary>all {len(ids)} node ids</summary><p class=\"mono small\">"
            f"{esc(', '.join(map(str, ids)))}</p></details>")


def placement_sections(graph: Graph, cluster: Cluster, sched, report: dict, plan: str | None = None,
                       prefix: str = "p", level: int = 2) -> str:
    """The sections of one placement's view (HTML), ids prefixed by
    *prefix* so several fit on one page (``compare``'s best placements);
    *graph* is the graph simulated (the derived graph when the placement
    carries a recipe), *plan* the plan in words
    (:func:`celeritas_cli.sim.describe.describe_placement`; default:
    :func:`spread`, from the report alone)."""
    h = f"h{level}"
    path = critical_path(graph, sched)
    gid = f"{prefix}-gantt"
    parts = [headline(report)]
    who = (f"{esc(report.get('graph'))} on {esc(report.get('cluster'))} by {esc(report.get('algorithm'))}, "
           f"congestion rule {esc(report.get('congestion'))}")
    parts.append(f"<{h}>The plan</{h}><p>{who}.</p>")
    parts.append(f"<p>{esc(plan or spread(report))}</p>")
    found = notes(report)
    parts.append(f"<{h}>Estimate and caveats</{h}>")
    parts.append('<ul class="notes">' + "".join(f"<li>{n}</li>" for n in found) + "</ul>" if found else
                 '<p class="muted">no caveats: the algorithm ran as its paper describes and every device fits</p>')
    parts.append(_estimate(report))
    parts.append(f"<{h}>Schedule</{h}>"
                 f'<p class="small"><label><input type="checkbox" data-cp="{gid}-svg"> highlight the critical path '
                 f"({len(path)} nodes, outlined)</label> &nbsp; hover a bar for its node, op, start, end, device and "
                 f"bytes</p>")
    parts.append('<div class="scroll">' + gantt_chart(graph, cluster, sched, gid, set(path),
                                                      report.get("lower_bound_s")) + "</div>")
    parts.append(f"<{h}>Memory over time</{h}>")
    parts.append('<div class="scroll">' + memory_chart(report, sched.makespan) + "</div>")
    parts.append(f"<{h}>Devices</{h}>" + devices_table(report))
    parts.append(f"<{h}>Link traffic</{h}>" + links_section(report))
    parts.append(f"<{h}>Critical path</{h}>" + critical_section(graph, sched, path, report))
    return "\n".join(parts)


def placement_page(graph: Graph, cluster: Cluster, sched, report: dict, plan: str | None = None) -> str:
    """The whole self-contained page of one simulated placement.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.placement import Placement
    >>> from celeritas_cli.sim.simulator import simulate
    >>> g = build("pair", [{"id": "a", "compute_s": 1, "memory_bytes": 8},
    ...                    {"id": "b", "compute_s": 2, "memory_bytes": 8}], [{"src": "a", "dst": "b", "bytes": 4}])
    >>> c = uniform(2, bandwidth=4.0, latency=0.0)
    >>> out = []
    >>> rep = simulate(g, c, Placement.from_indices(g, c, [0, 1], algorithm="hand"), schedule_out=out)
    >>> html = placement_page(out[0].graph, c, out[0], rep)
    >>> html.startswith("<!DOCTYPE html>"), 'class="gantt"' in html, rep["makespan_s"]
    (True, True, 4.0)
    """
    title = f"{report.get('graph')} by {report.get('algorithm')} on {report.get('cluster')}"
    sub = f"placer simulate: makespan {fmt_s(report.get('makespan_s'), 6)} s, status {report.get('status')}"
    return page(title, placement_sections(graph, cluster, sched, report, plan), sub)
