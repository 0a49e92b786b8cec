"""Gantt charts (SVG, or PNG with the optional matplotlib) and Chrome trace
JSON (chrome://tracing, Perfetto) of a simulated schedule.

One row per device for compute and one per used directed link for transfers,
time on the x axis with round ticks and an axis title.  Ops are coloured by
type: the eight types with the most compute time get their own colour (a
palette distinct from the one ``placer compare`` uses for algorithms), the
rest share "other", transfers are grey; a legend names each colour with its
share of the compute time.  A dashed line marks the simulator's lower bound
(docs/design.md, simulator item 6) when it is given.  The SVG is written by
hand (no plotting dependency); each bar has a ``<title>`` tooltip (id, op,
start, end).
"""

from __future__ import annotations

import html
import math
import os
from collections import defaultdict

from ..errors import InvalidInput, MissingDependency
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.jsonio import write_bytes, write_json

#: Algorithm colours of ``placer compare`` (Tableau 10).
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
#: Op-type colours of Gantt charts (ColorBrewer Dark2): unlike :data:`PALETTE`, so a chart's ops never
#: look like the algorithms of the bar panels beside it.
OP_PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4")
OTHER_COLOUR = "#c9c9c9"
TRANSFER_COLOUR = "#6b6b6b"
LB_COLOUR = "#b2182b"


def op_type(op: str) -> str:
    """The legend name of an op: ``aten.convolution`` -> ``convolution``."""
    return op.removeprefix("aten.").split(".")[0] or "op"


def op_colours(graph: Graph, sched) -> tuple[dict[str, str], list[tuple[str, str, float]]]:
    """Colour per op type and the legend ``[(label, colour, share of compute time)]``:
    the :data:`OP_PALETTE` types with the most busy time first (ties by name),
    then ``other`` for the rest."""
    busy: dict[str, float] = defaultdict(float)
    for v in range(graph.n):
        busy[op_type(graph.op[v])] += max(sched.finish[v] - sched.start[v], 0.0)
    total = math.fsum(busy.values()) or 1.0
    ranked = sorted(busy, key=lambda t: (-busy[t], t))
    colours = {t: OP_PALETTE[i] for i, t in enumerate(ranked[:len(OP_PALETTE)])}
    legend = [(t, colours[t], busy[t] / total) for t in ranked[:len(OP_PALETTE)]]
    rest = ranked[len(OP_PALETTE):]
    if rest:
        legend.append((f"other ({len(rest)} types)", OTHER_COLOUR, math.fsum(busy[t] for t in rest) / total))
    return colours, legend


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


def time_unit(span: float) -> tuple[float, str]:
    """``(factor, name)`` to show times up to *span* seconds: s, ms or µs."""
    if span >= 1.0:
        return 1.0, "s"
    if span >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def nice_ticks(span: float, most: int = 8) -> list[float]:
    """Round tick positions from 0 to at most *span*: multiples of 1, 2, 2.5
    or 5 x 10^k, at most *most* + 1 of them.

    Example
    -------
    >>> nice_ticks(0.9795)
    [0.0, 0.2, 0.4, 0.6, 0.8]
    >>> nice_ticks(3.0)
    [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    """
    if not (span > 0 and math.isfinite(span)):
        return [0.0]
    exp = math.floor(math.log10(span / most))
    for m in (1, 2, 2.5, 5, 10):
        step = m * 10.0**exp
        if span / step <= most:
            break
    count = int(math.floor(span / step * (1 + 1e-9)))
    return [round(i * step, 12) for i in range(count + 1)]


def _fmt(t: float, factor: float) -> str:
    return f"{round(t * factor, 9):g}"


def _share(x: float) -> str:
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def _legend_items(legend: list[tuple[str, str, float]]) -> list[tuple[str, str]]:
    return [(f"{lab} {_share(share)}", col) for lab, col, share in legend] + [("transfer", TRANSFER_COLOUR)]


def _legend_layout(items: list[tuple[str, str]], x0: float, y0: int, x_max: float):
    """``(x, y, label, colour)`` of each legend entry, flowing left to right
    and wrapping at *x_max* (text width estimated at 6.5 px per character)."""
    x, y, out = x0, y0, []
    for lab, col in items:
        w = 16 + 6.5 * len(lab) + 24
        if x > x0 and x + w > x_max:
            x, y = x0, y + 20
        out.append((x, y, lab, col))
        x += w
    return out


def _summary(sched, lower_bound: float | None) -> str:
    text = f"makespan {sched.makespan:.4g} s"
    if lower_bound and lower_bound > 0:
        text += f", lower bound {lower_bound:.4g} s (makespan / LB {sched.makespan / lower_bound:.3f})"
    return text


def gantt_svg(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None) -> str:
    """An SVG Gantt chart of *sched* (a :class:`~celeritas_cli.sim.simulator.Schedule`),
    with the *lower_bound* (seconds) as a dashed line when given."""
    rows = _rows(graph, cluster, sched)
    colours, legend = op_colours(graph, sched)
    width, left, right, row_h, top = 1200, 150, 30, 22, 62
    plot_w = width - left - right
    span = max(sched.makespan, lower_bound or 0.0) or 1.0
    scale = plot_w / span
    factor, unit = time_unit(span)
    plot_bottom = top + row_h * len(rows)
    legend_rows = 1 + max(y for _, y, _, _ in _legend_layout(_legend_items(legend), left, 0, left + plot_w)) // 20
    height = plot_bottom + 62 + 20 * legend_rows
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{html.escape(title or graph.name)}</text>',
           f'<text x="10" y="38" fill="#444">{html.escape(_summary(sched, lower_bound))}</text>']
    for i, (label, _items) in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{plot_w}" height="{row_h - 4}" fill="#f4f4f4"/>')
    for t in nice_ticks(span):  # grid under the bars
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{plot_bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{plot_bottom + 14}" text-anchor="middle">{_fmt(t, factor)}</text>')
    for i, (_label, items) in enumerate(rows):
        y = top + i * row_h
        for s, e, name, op in items:
            x = left + s * scale
            w = max((e - s) * scale, 0.5)
            colour = TRANSFER_COLOUR if op == "transfer" else colours.get(op_type(op), OTHER_COLOUR)
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="{colour}">'
                       f'<title>{html.escape(name)} ({html.escape(op)}) {s:.6g}–{e:.6g} s</title></rect>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{plot_bottom + 32}" text-anchor="middle">time ({unit})</text>')
    out.append(f'<text x="10" y="{top - 6}" fill="#444">device / link</text>')
    if lower_bound and lower_bound > 0:
        x = left + lower_bound * scale
        anchor, dx = ("end", -4) if x > left + plot_w / 2 else ("start", 4)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{plot_bottom}" stroke="{LB_COLOUR}" '
                   f'stroke-width="1.5" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x + dx:.1f}" y="{top - 6}" text-anchor="{anchor}" fill="{LB_COLOUR}">'
                   f'lower bound {lower_bound:.4g} s</text>')
    for x, y, lab, col in _legend_layout(_legend_items(legend), left, plot_bottom + 48, left + plot_w):
        out.append(f'<rect x="{x:.1f}" y="{y}" width="12" height="12" fill="{col}"/>'
                   f'<text x="{x + 16:.1f}" y="{y + 10}">{html.escape(lab)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def gantt_png(graph: Graph, cluster: Cluster, sched, title: str = "", lower_bound: float | None = None) -> bytes:
    """The same chart as :func:`gantt_svg`, as PNG bytes, drawn by matplotlib (the ``plot`` extra).

    Raises
    ------
    MissingDependency
        matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise MissingDependency("PNG output needs matplotlib (pip install -e .[plot]); use a .svg file instead") \
            from None
    import io

    rows = _rows(graph, cluster, sched)
    colours, legend = op_colours(graph, sched)
    span = max(sched.makespan, lower_bound or 0.0) or 1.0
    factor, unit = time_unit(span)
    fig, ax = plt.subplots(figsize=(12, max(0.4 * len(rows) + 1.8, 0.22 * len(legend) + 1.5)))
    ax.set_axisbelow(True)
    ax.grid(axis="x", color="#ddd")
    for i, (_label, items) in enumerate(rows):
        ax.broken_barh([(s * factor, (e - s) * factor) for s, e, _, _ in items], (i - 0.4, 0.8),
                       facecolors=[TRANSFER_COLOUR if op == "transfer" else colours.get(op_type(op), OTHER_COLOUR)
                                   for *_, op in items])
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span * factor * 1.01)
    ax.set_xticks([t * factor for t in nice_ticks(span)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("device / link")
    handles = [Patch(color=col, label=lab) for lab, col in _legend_items(legend)]
    if lower_bound and lower_bound > 0:
        handles.append(ax.axvline(lower_bound * factor, color=LB_COLOUR, linestyle="--", linewidth=1.5,
                                  label=f"lower bound {lower_bound:.4g} s"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9,
              title="op type (share of compute time)", title_fontsize=9, alignment="left")
    ax.set_title(f"{title or graph.name}\n{_summary(sched, lower_bound)}", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_gantt(graph: Graph, cluster: Cluster, sched, path: str, title: str = "",
                lower_bound: float | None = None) -> None:
    """Write the Gantt chart to *path* (atomically): ``.svg`` by hand,
    ``.png`` through matplotlib (``pip install -e .[plot]``)."""
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
