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
LEGEND_COLUMNS = 4


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


def gantt_svg(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None) -> str:
    """An SVG Gantt chart of *sched* (a :class:`~celeritas_cli.sim.simulator.Schedule`),
    with a dashed line at *lower_bound* seconds when it is given."""
    rows = _rows(graph, cluster, sched)
    colours, _ = op_colours(graph, sched)
    legend = legend_entries(graph, sched)
    if lower_bound and lower_bound > 0:
        legend.append((f"lower bound {lower_bound:.4g} s", LOWER_BOUND))
    width, left, right, row_h, top = 1200, 150, 40, 22, 58
    ticks = nice_ticks(max(sched.makespan, lower_bound or 0.0))
    factor, unit = time_unit(ticks[-1])
    scale = (width - left - right) / ticks[-1]
    axis_y = top + row_h * len(rows)
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


def gantt_png(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None) -> bytes:
    """The chart of :func:`draw_gantt` as PNG bytes (matplotlib, the ``plot`` extra).

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
    fig, ax = plt.subplots(figsize=(12, max(0.4 * len(rows) + 1.5, 0.2 * legend_rows + 1.2)))
    draw_gantt(ax, graph, cluster, sched, title, lower_bound)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_gantt(graph: Graph, cluster: Cluster, sched, path: str, title: str = "",
                lower_bound: float | None = None) -> None:
    """Write the Gantt chart to *path* (atomically, like every output): ``.svg``
    by hand, ``.png`` through matplotlib (``pip install -e .[plot]``)."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext == ".svg":
        write_bytes(gantt_svg(graph, cluster, sched, title, lower_bound).encode(), path)
    elif ext == ".png":
        try:
            data = gantt_png(graph, cluster, sched, title, lower_bound)
        except MissingDependency as exc:
            raise MissingDependency(f"{path}: {exc}") from None
        write_bytes(data, path)
    else:
        raise InvalidInput(f"{path}: Gantt charts are written as .svg or .png")


def chrome_trace(graph: Graph, cluster: Cluster, sched) -> dict:
    """Chrome trace-event JSON: one thread per device (compute) and per
    directed link (transfers), times in microseconds."""
    events: list[dict] = []
    rows = _rows(graph, cluster, sched)
    for tid, (label, items) in enumerate(rows):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": label}})
        for s, e, name, op in items:
            events.append({"name": name, "cat": op, "ph": "X", "pid": 0, "tid": tid,
                           "ts": s * 1e6, "dur": (e - s) * 1e6})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": graph.name, "cluster": cluster.name, "makespan_s": sched.makespan}}


def write_trace(graph: Graph, cluster: Cluster, sched, path: str) -> None:
    write_json(chrome_trace(graph, cluster, sched), path)
