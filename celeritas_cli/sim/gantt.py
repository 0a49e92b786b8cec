"""Gantt charts (SVG, or PNG with the optional matplotlib) and Chrome trace
JSON (chrome://tracing, Perfetto) of a simulated schedule.

The SVG is written by hand (no plotting dependency): one row per device for
compute and one row per used directed link for transfers, time on the x
axis (round ticks in s, ms or µs, titled; the grid under the bars), each
node a rectangle with a ``<title>`` tooltip (id, op, start, end).  Compute
is coloured by operation type: the types that take the most device time get
a colour each, the rest share "other ops", and a legend under the chart says
which is which (with each type's share of the busy time).  Given the
simulator's lower bound (docs/design.md, simulator item 6), a dashed line
marks it, labelled, and the subtitle gives makespan / LB.

Given the simulation report (``memory=report``: its ``memory_timeline``,
``memory_rule`` and per-device ``capacity_bytes``), a small lane per device
under the others draws its live memory over time (the judge's rule,
:mod:`celeritas_cli.sim.memory`), scaled to the larger of its capacity and
its peak, with the capacity as a dashed line (red when the peak is over
it); the Chrome trace gets one memory counter per device.
"""

from __future__ import annotations

import html
import math
import os

from ..errors import InvalidInput, MissingDependency
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.jsonio import write_bytes, write_json

#: colours of operation types (Tableau 10), busiest type first
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
OTHER_OPS = "#dcdcdc"
TRANSFER = "#7f7f7f"
LOWER_BOUND = "#b2182b"
MEMORY = "#4e79a7"
CAPACITY = "#555555"
LEGEND_COLUMNS = 4
MEMORY_ROW_H = 34


def nice_ticks(vmax: float, max_intervals: int = 6) -> list[float]:
    """Round tick values ``0, s, 2s, ...`` up to the first one >= *vmax*,
    the step ``s`` being the smallest of 1, 2, 2.5, 5 x 10^k that needs at
    most *max_intervals* intervals.

    Example
    -------
    >>> nice_ticks(0.9795)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    >>> nice_ticks(5.0), nice_ticks(5.2)[-1]
    ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 6.0)
    """
    if not (vmax > 0 and math.isfinite(vmax)):
        return [0.0, 1.0]
    mag = 10.0 ** math.floor(math.log10(vmax / max_intervals))
    for m in (1, 2, 2.5, 5, 10, 20, 25, 50):
        step = m * mag
        n = math.ceil(vmax / step * (1 - 1e-9))
        if n <= max_intervals:
            return [float(f"{i * step:.12g}") for i in range(n + 1)]
    return [0.0, vmax]  # not reached: 50 x mag >= vmax / max_intervals * 10


def tick_label(t: float) -> str:
    """A tick value without float noise: ``0.30000000000000004`` -> ``0.3``."""
    return f"{t:.6g}"


def time_unit(span: float) -> tuple[float, str]:
    """``(factor, name)`` to label times up to *span* seconds: s, ms or µs.

    Example
    -------
    >>> time_unit(2.5), time_unit(0.008), time_unit(3e-5)
    ((1.0, 's'), (1000.0, 'ms'), (1000000.0, 'µs'))
    """
    if span >= 1.0:
        return 1.0, "s"
    if span >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _subtitle(sched, lower_bound: float | None) -> str:
    text = f"makespan {sched.makespan:.6g} s"
    if lower_bound and lower_bound > 0:
        text += f", lower bound {lower_bound:.6g} s, makespan / LB {sched.makespan / lower_bound:.3f}"
    return text


def _rows(graph: Graph, cluster: Cluster, sched) -> list[tuple[str, list[tuple[float, float, str, str]]]]:
    rows: list[tuple[str, list]] = []
    for d, dev in enumerate(cluster.devices):
        items = [(sched.start[v], sched.finish[v], graph.ids[v], graph.op[v]) for v in sched.device_order[d]]
        rows.append((dev.id, items))
    links: dict[tuple[int, int], list] = {}
    for tr in sched.transfers:
        name = f"{graph.ids[graph.tensor_src[tr.tensor]]}:{graph.tensor_name[tr.tensor]}"
        links.setdefault((tr.src_dev, tr.dst_dev), []).append((tr.start, tr.end, name, "transfer"))
    for (a, b), items in sorted(links.items()):
        rows.append((f"{cluster.ids[a]}→{cluster.ids[b]}", items))
    return rows


def legend_entries(graph: Graph, sched) -> list[tuple[str, str]]:
    """``(label, colour)`` of the chart's legend: the busiest operation types
    (each with its share of the device busy time), "other ops" when more
    types than colours, and "transfer" when the schedule has transfers."""
    colours, busy = op_colours(graph, sched)
    total = sum(busy.values()) or 1.0
    out = [(f"{_short(op)} {_percent(busy[op] / total)}", c) for op, c in colours.items() if c != OTHER_OPS]
    rest = sum(t for op, t in busy.items() if colours[op] == OTHER_OPS)
    if any(c == OTHER_OPS for c in colours.values()):
        out.append((f"other ops {_percent(rest / total)}", OTHER_OPS))
    if sched.transfers:
        out.append(("transfer", TRANSFER))
    return out


def _percent(share: float) -> str:
    return "<1%" if 0 < share < 0.005 else f"{100 * share:.0f}%"


def _short(op: str, limit: int = 32) -> str:
    op = op.removeprefix("aten.")
    return op if len(op) <= limit else op[:limit - 1] + "…"


def op_colours(graph: Graph, sched) -> tuple[dict[str, str], dict[str, float]]:
    """Colour per operation type, by decreasing busy time in *sched* (ties
    by name): the first ``len(PALETTE) - 1`` get a palette colour, the rest
    :data:`OTHER_OPS`.  Also returns the busy seconds per type."""
    busy: dict[str, float] = {}
    for seq in sched.device_order:
        for v in seq:
            busy[graph.op[v]] = busy.get(graph.op[v], 0.0) + (sched.finish[v] - sched.start[v])
    ranked = sorted(busy, key=lambda op: (-busy[op], op))
    keep = len(PALETTE) - 1 if len(ranked) > len(PALETTE) - 1 else len(ranked)
    return {op: (PALETTE[i] if i < keep else OTHER_OPS) for i, op in enumerate(ranked)}, busy


def memory_lanes(cluster: Cluster, report: dict | None) -> list[tuple[str, list, int, int]]:
    """``(device id, [[t, bytes], ...], capacity, peak)`` per device from a
    simulation report's ``memory_timeline`` (none without a report)."""
    if not report or not report.get("memory_timeline"):
        return []
    timeline, devs = report["memory_timeline"], {d["id"]: d for d in report.get("devices", [])}
    out = []
    for dv in cluster.devices:
        pts = timeline.get(dv.id) or [[0.0, 0]]
        peak = devs[dv.id]["memory_bytes"] if dv.id in devs else max(b for _, b in pts)
        out.append((dv.id, pts, dv.memory, peak))
    return out


def lane_scale(capacity: int, peak: int) -> tuple[float, bool]:
    """``(top of the lane in bytes, whether the capacity line is on it)``:
    the capacity when the peak is at least a quarter of it, else 1.15 x
    the peak (the capacity is then off the lane, and its label says so), so
    the shape of a small footprint stays visible.

    >>> lane_scale(100, 50), lane_scale(100, 20), lane_scale(100, 0)
    ((100.0, True), (23.0, False), (100.0, True))
    """
    if peak <= 0 or peak >= capacity / 4:
        return float(max(capacity, peak, 1)), True
    return max(1.15 * peak, 1.0), False


def _step_path(pts: list, end: float, x0: float, scale: float, y0: float, h: float, ymax: float) -> str:
    """SVG points of a step function from its ``[t, bytes]`` points to *end*."""
    out = []
    for i, (t, b) in enumerate(pts):
        t_next = pts[i + 1][0] if i + 1 < len(pts) else max(end, t)
        y = y0 + h - h * b / ymax
        out.append(f"{x0 + t * scale:.2f},{y:.2f} {x0 + t_next * scale:.2f},{y:.2f}")
    return " ".join(out)


def _memory_svg(lanes: list, y_start: float, left: float, inner: float, scale: float, end: float,
                rule: str) -> list[str]:
    out = [f'<text x="10" y="{y_start - 2:.0f}" font-size="10" fill="#555">memory ({html.escape(rule)} rule)</text>']
    h = MEMORY_ROW_H - 8
    for i, (dev_id, pts, cap, peak) in enumerate(lanes):
        y = y_start + i * MEMORY_ROW_H
        ymax, cap_on = lane_scale(cap, peak)
        over = peak > cap
        out.append(f'<text x="10" y="{y + 12}">{html.escape(dev_id)}</text>'
                   f'<text x="10" y="{y + 24}" font-size="9" fill="{LOWER_BOUND if over else "#555"}">'
                   f'peak {peak / 2**30:.3g} / {cap / 2**30:.3g} GiB</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{inner}" height="{h}" fill="#f8f8f8"/>')
        out.append(f'<polyline fill="none" stroke="{MEMORY}" stroke-width="1.2" '
                   f'points="{_step_path(pts, end, left, scale, y, h, ymax)}"><title>{html.escape(dev_id)}: '
                   f'peak {peak} bytes</title></polyline>')
        if cap_on:
            yc = y + h - h * cap / ymax
            out.append(f'<line x1="{left}" y1="{yc:.2f}" x2="{left + inner}" y2="{yc:.2f}" '
                       f'stroke="{LOWER_BOUND if over else CAPACITY}" stroke-dasharray="4,3">'
                       f'<title>capacity {cap} bytes</title></line>')
        else:
            out.append(f'<text x="{left + inner - 4}" y="{y + 9}" text-anchor="end" font-size="9" fill="#555">'
                       f'capacity {cap / 2**30:.3g} GiB, above the lane</text>')
    return out


def gantt_svg(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None,
              memory: dict | None = None) -> str:
    """An SVG Gantt chart of *sched* (a :class:`~celeritas_cli.sim.simulator.Schedule`),
    with a dashed line at *lower_bound* seconds when it is given and a
    memory lane per device when *memory* (the simulation report) is."""
    rows = _rows(graph, cluster, sched)
    lanes = memory_lanes(cluster, memory)
    colours, _ = op_colours(graph, sched)
    legend = legend_entries(graph, sched)
    if lower_bound and lower_bound > 0:
        legend.append((f"lower bound {lower_bound:.4g} s", LOWER_BOUND))
    if lanes:
        legend.append(("live memory", MEMORY))
        legend.append(("device capacity", CAPACITY))
    width, left, right, row_h, top = 1200, 150, 40, 22, 58
    ticks = nice_ticks(max(sched.makespan, lower_bound or 0.0))
    factor, unit = time_unit(ticks[-1])
    scale = (width - left - right) / ticks[-1]
    mem_y = top + row_h * len(rows) + 14
    axis_y = top + row_h * len(rows) + (14 + MEMORY_ROW_H * len(lanes) if lanes else 0)
    legend_y = axis_y + 50
    height = legend_y + 20 * ((len(legend) + LEGEND_COLUMNS - 1) // LEGEND_COLUMNS) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">{html.escape(title or graph.name)}</text>',
           f'<text x="10" y="37" fill="#444">{html.escape(_subtitle(sched, lower_bound))}</text>',
           f'<text x="10" y="{top - 4}" font-size="10" fill="#555">device / link</text>']
    for i, (label, _items) in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="10" y="{y + 15}">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{width - left - right}" height="{row_h - 4}" fill="#f4f4f4"/>')
    for t in ticks:  # the grid under the bars
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#ccc"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{tick_label(t * factor)}</text>')
    for i, (_label, items) in enumerate(rows):
        y = top + i * row_h
        for s, e, name, op in items:
            x = left + s * scale
            w = max((e - s) * scale, 0.5)
            colour = TRANSFER if op == "transfer" else colours[op]
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="{colour}">'
                       f'<title>{html.escape(name)} ({html.escape(op)}) {s:.6g}–{e:.6g} s</title></rect>')
    if lanes:
        out.extend(_memory_svg(lanes, mem_y, left, width - left - right, scale, sched.makespan,
                               str(memory.get("memory_rule", "time"))))
    if lower_bound and lower_bound > 0:
        x = left + lower_bound * scale
        anchor, dx = ("end", -4) if x > left + (width - left - right) / 2 else ("start", 4)
        out.append(f'<line x1="{x:.1f}" y1="{top - 12}" x2="{x:.1f}" y2="{axis_y}" stroke="{LOWER_BOUND}" '
                   f'stroke-width="1.5" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x + dx:.1f}" y="{top - 4}" text-anchor="{anchor}" font-size="10" '
                   f'fill="{LOWER_BOUND}">lower bound</text>')
    out.append(f'<text x="{left + (width - left - right) / 2:.0f}" y="{axis_y + 32}" text-anchor="middle">'
               f'time ({unit})</text>')
    for i, (label, colour) in enumerate(legend):
        x, y = left + (i % LEGEND_COLUMNS) * 250, legend_y + (i // LEGEND_COLUMNS) * 20
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{x + 16}" y="{y}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw_memory(axes, cluster: Cluster, sched, report: dict) -> None:
    """Draw each device's memory lane (:func:`memory_lanes`) on its own
    matplotlib axis of *axes* (one per device, sharing the time axis of the
    chart): the live memory in GiB as a step line, the capacity dashed."""
    factor, _ = time_unit(nice_ticks(sched.makespan)[-1])
    for ax, (dev_id, pts, cap, peak) in zip(axes, memory_lanes(cluster, report)):
        ts = [t * factor for t, _ in pts] + [max(sched.makespan, pts[-1][0]) * factor]
        ys = [b / 2**30 for _, b in pts] + [pts[-1][1] / 2**30]
        ymax, cap_on = lane_scale(cap, peak)
        ax.step(ts, ys, where="post", color=MEMORY, linewidth=1.0)
        if cap_on:
            ax.axhline(cap / 2**30, color=LOWER_BOUND if peak > cap else CAPACITY, linestyle="--", linewidth=1.0)
        else:
            ax.text(0.995, 0.92, f"capacity {cap / 2**30:.3g} GiB, above the lane", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7, color="#555")
        ax.set_ylim(0, ymax / 2**30 * 1.05)
        ax.set_ylabel(dev_id, rotation=0, ha="right", va="center", fontsize=8)
        ax.tick_params(labelsize=7)


def draw_gantt(ax, graph: Graph, cluster: Cluster, sched, title: str = "",
               lower_bound: float | None = None) -> None:
    """Draw the Gantt chart of *sched* on a matplotlib axis: the same rows,
    colours, round ticks, legend and lower-bound line as :func:`gantt_svg`."""
    from matplotlib.patches import Patch

    rows = _rows(graph, cluster, sched)
    colours, _ = op_colours(graph, sched)
    ticks = nice_ticks(max(sched.makespan, lower_bound or 0.0))
    factor, unit = time_unit(ticks[-1])
    ax.set_axisbelow(True)
    ax.grid(axis="x", color="#ddd")
    for i, (_label, items) in enumerate(rows):
        ax.broken_barh([(s * factor, (e - s) * factor) for s, e, _, _ in items], (i - 0.4, 0.8),
                       facecolors=[TRANSFER if op == "transfer" else colours[op] for *_, op in items])
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks([t * factor for t in ticks], [tick_label(t * factor) for t in ticks])
    ax.set_xlim(0, ticks[-1] * factor)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("device / link")
    ax.set_title(f"{title or graph.name}\n{_subtitle(sched, lower_bound)}", fontsize=10)
    handles = [Patch(color=c, label=lbl) for lbl, c in legend_entries(graph, sched)]
    if lower_bound and lower_bound > 0:
        handles.append(ax.axvline(lower_bound * factor, color=LOWER_BOUND, linestyle="--", linewidth=1.5,
                                  label=f"lower bound {lower_bound:.4g} s"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def gantt_png(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None,
              memory: dict | None = None) -> bytes:
    """The chart of :func:`draw_gantt` as PNG bytes (matplotlib, the ``plot``
    extra), with :func:`draw_memory`'s lanes under it when *memory* (the
    simulation report) is given.

    Raises
    ------
    MissingDependency
        matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("PNG output needs matplotlib (pip install -e .[plot]); use a .svg file instead") \
            from None
    import io

    rows = _rows(graph, cluster, sched)
    legend_rows = len(legend_entries(graph, sched)) + 1
    lanes = len(memory_lanes(cluster, memory))
    height = max(0.4 * len(rows) + 1.5, 0.2 * legend_rows + 1.2)
    fig, axes = plt.subplots(1 + lanes, 1, figsize=(12, height + 0.6 * lanes), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [height] + [0.6] * lanes})
    draw_gantt(axes[0][0], graph, cluster, sched, title, lower_bound)
    if lanes:
        draw_memory([a[0] for a in axes[1:]], cluster, sched, memory)
        axes[-1][0].set_xlabel(axes[0][0].get_xlabel())
        axes[0][0].set_xlabel("")
        axes[1][0].set_title(f"memory (GiB, {memory.get('memory_rule', 'time')} rule)", fontsize=9, loc="left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_gantt(graph: Graph, cluster: Cluster, sched, path: str, title: str = "",
                lower_bound: float | None = None, memory: dict | None = None) -> None:
    """Write the Gantt chart to *path* (atomically, like every output): ``.svg``
    by hand, ``.png`` through matplotlib (``pip install -e .[plot]``); with
    memory lanes when *memory* (the simulation report) is given."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext == ".svg":
        write_bytes(gantt_svg(graph, cluster, sched, title, lower_bound, memory).encode(), path)
    elif ext == ".png":
        try:
            data = gantt_png(graph, cluster, sched, title, lower_bound, memory)
        except MissingDependency as exc:
            raise MissingDependency(f"{path}: {exc}") from None
        write_bytes(data, path)
    else:
        raise InvalidInput(f"{path}: Gantt charts are written as .svg or .png")


def chrome_trace(graph: Graph, cluster: Cluster, sched, memory: dict | None = None) -> dict:
    """Chrome trace-event JSON: one thread per device (compute) and per
    directed link (transfers), times in microseconds; with *memory* (the
    simulation report) a counter ``memory <device>`` per device (bytes
    live, ``ph: "C"``) from its ``memory_timeline``."""
    events: list[dict] = []
    rows = _rows(graph, cluster, sched)
    for tid, (label, items) in enumerate(rows):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": label}})
        for s, e, name, op in items:
            events.append({"name": name, "cat": op, "ph": "X", "pid": 0, "tid": tid,
                           "ts": s * 1e6, "dur": (e - s) * 1e6})
    for dev_id, pts, _cap, _peak in memory_lanes(cluster, memory):
        for t, b in pts:
            events.append({"name": f"memory {dev_id}", "cat": "memory", "ph": "C", "pid": 0, "ts": t * 1e6,
                           "args": {"bytes": b}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": graph.name, "cluster": cluster.name, "makespan_s": sched.makespan}}


def write_trace(graph: Graph, cluster: Cluster, sched, path: str, memory: dict | None = None) -> None:
    write_json(chrome_trace(graph, cluster, sched, memory), path)
