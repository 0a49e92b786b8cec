"""Comparison plots: makespan per algorithm per graph (grouped bars), plus
the Gantt chart of each graph's best placement, in the same order.

The SVG is written by hand, so ``placer compare --plot out.svg`` needs no
plotting library.  Grouped bars use one panel per (graph, cluster) with its
own y axis: graphs of 60 and 36,000 nodes differ by orders of magnitude in
makespan, and one shared axis would flatten the small ones.  The y axes
have round ticks (:func:`~celeritas_cli.sim.gantt.nice_ticks`) and a title.
Algorithms have their own palette (:data:`ALGO_PALETTE`, unlike the
operation-type colours of the Gantt charts) and a legend; columns are named
as in the tables (``cpd+adjusting`` for an algorithm placed on the cpd
coarse graph).  Each panel draws a labelled dashed line at the lower bound
(docs/design.md, simulator item 6), the best bar outlined, OOM cells as hatched
red bars (the simulated makespan of a placement that would not fit), failed
cells as a cross.  PNG output needs matplotlib (the ``plot`` extra) and
draws the same figure; the Gantt charts come from :mod:`celeritas_cli.sim.gantt`.
"""

from __future__ import annotations

import html
import io
import re

from ..errors import MissingDependency
from ..model.congestion import DEFAULT_CONGESTION
from ..model.jsonio import write_bytes
from ..sim.gantt import nice_ticks, tick_label
from .formats import columns
from .rows import column_label, graph_stem, natural_key, sort_rows

PANEL_W, PANEL_H = 380, 250

#: colours of the compared algorithms (matplotlib's tab20b, darkest first):
#: none of them is a colour of the Gantt charts' operation types
ALGO_PALETTE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39",
                "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd", "#9c9ede",
                "#cedb9c", "#e7cb94", "#e7969c", "#de9ed6")
OOM_RED = "#d62728"


def algorithm_colours(rows: list[dict], algorithms: list[str]) -> dict[str, str]:
    """Colour per column label, in table column order (stable across panels)."""
    return {c: ALGO_PALETTE[i % len(ALGO_PALETTE)] for i, c in enumerate(columns(rows, algorithms))}


def _groups(rows: list[dict], algorithms: list[str]) -> list[tuple[str, dict[str, dict]]]:
    """``(panel title, {column label: row})`` per (graph, cluster), in table order."""
    groups: dict[tuple, dict[str, dict]] = {}
    names: dict[tuple, str] = {}
    for r in sort_rows(rows, algorithms):
        key = (r.get("graph_file"), r.get("cluster"))
        groups.setdefault(key, {})[column_label(r)] = r
        if r.get("graph"):
            names[key] = r["graph"]
    multi = len({k[1] for k in groups}) > 1
    out = []
    for key, cells in groups.items():
        title = names.get(key, graph_stem(str(key[0])))
        if multi:
            title += f" on {key[1]}"
        out.append((title, cells))
    return out


def _best(cells: dict[str, dict], order: list[str]) -> str | None:
    """The column of the smallest OK makespan (ties: the first column), as in the tables."""
    ok = [(c["makespan_s"], order.index(a), a) for a, c in cells.items()
          if c.get("status") == "OK" and c.get("makespan_s") is not None]
    return min(ok)[2] if ok else None


def _panel_scale(cells: dict[str, dict]) -> tuple[list[float], float | None]:
    """Round y ticks covering every bar and the lower bound, and the lower bound."""
    vals = [c["makespan_s"] for c in cells.values() if c.get("makespan_s") is not None]
    lbs = [c["lower_bound_s"] for c in cells.values() if c.get("lower_bound_s")]
    return nice_ticks(max(vals + lbs, default=1.0), 5), (min(lbs) if lbs else None)


def _legend_svg(labels: list[str], colour: dict[str, str], width: int) -> tuple[list[str], int]:
    """Algorithm swatches, then the lower bound, best and OOM keys; returns
    the SVG and the height it takes."""
    per_row = max(1, (width - 20) // 170)
    out = []
    keys = [(lbl, f'<rect width="12" height="12" fill="{colour[lbl]}"/>') for lbl in labels]
    keys += [("lower bound (LB)", '<line x1="0" y1="6" x2="14" y2="6" stroke="#555" stroke-dasharray="4 3"/>'),
             ("best (outlined)", '<rect width="12" height="12" fill="white" stroke="#000" stroke-width="2"/>'),
             ("OOM", '<rect width="12" height="12" fill="url(#oom)"/>')]
    for i, (label, swatch) in enumerate(keys):
        x, y = 10 + (i % per_row) * 170, 34 + (i // per_row) * 20
        out.append(f'<g transform="translate({x} {y})">{swatch}'
                   f'<text x="17" y="11">{html.escape(label)}</text></g>')
    return out, 20 * ((len(keys) + per_row - 1) // per_row)


def _panel_svg(px: float, py: float, gtitle: str, cells: dict[str, dict], order: list[str],
               colour: dict[str, str]) -> list[str]:
    """One bar panel with its top-left corner at (px, py)."""
    left, right, ptop, bottom = px + 62, px + PANEL_W - 30, py + 22, py + PANEL_H - 55
    ticks, lb = _panel_scale(cells)
    ymax = ticks[-1]
    out = [f'<text x="{px + 5}" y="{py + 14}" font-size="12">{html.escape(gtitle)}</text>',
           f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>'
           f'<line x1="{left}" y1="{ptop}" x2="{left}" y2="{bottom}" stroke="#333"/>']
    for v in ticks:
        y = bottom - (bottom - ptop) * v / ymax
        out.append(f'<line x1="{left - 3}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                   f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" font-size="9">{tick_label(v)}</text>')
    mid = (ptop + bottom) / 2
    out.append(f'<text x="{px + 10}" y="{mid:.1f}" font-size="10" transform="rotate(-90 {px + 10} {mid:.1f})" '
               f'text-anchor="middle">makespan (s)</text>')
    present = [a for a in order if a in cells]
    slot = (right - left) / max(1, len(present))
    bw = max(2.0, slot * 0.7)
    best = _best(cells, order)
    for j, a in enumerate(present):
        out.extend(_bar_svg(a, cells[a], left + j * slot + (slot - bw) / 2, bw, bottom, (bottom - ptop) / ymax,
                            colour[a], a == best))
    if lb is not None:
        y = bottom - (bottom - ptop) * lb / ymax
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#555" '
                   f'stroke-dasharray="4 3"><title>lower bound {lb:.6g} s</title></line>'
                   f'<text x="{right + 3}" y="{y + 3:.1f}" font-size="9" fill="#555">LB</text>')
    return out


def _bar_svg(label: str, c: dict, x: float, bw: float, bottom: float, per_s: float, fill: str,
             best: bool) -> list[str]:
    """One bar (or a cross for a failed cell) and its rotated label."""
    cx = x + bw / 2
    val = c.get("makespan_s")
    tip = f"{label}: {c.get('status')}"
    if val is not None:
        tip += f", makespan {val:.6g} s"
    if c.get("error"):
        tip += f" - {c['error']}"
    out = []
    if c.get("status") in ("OK", "OOM") and val is not None:
        h = per_s * val
        fill = "url(#oom)" if c["status"] == "OOM" else fill
        stroke = ' stroke="#000" stroke-width="2"' if best else ""
        out.append(f'<rect x="{x:.1f}" y="{bottom - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                   f'fill="{fill}"{stroke}><title>{html.escape(tip)}</title></rect>')
        if c["status"] == "OOM":
            out.append(f'<text x="{cx:.1f}" y="{bottom - h - 3:.1f}" text-anchor="middle" '
                       f'font-size="9" fill="{OOM_RED}">OOM</text>')
    else:
        out.append(f'<text x="{cx:.1f}" y="{bottom - 4:.1f}" text-anchor="middle" font-size="12" '
                   f'fill="{OOM_RED}">×<title>{html.escape(tip)}</title></text>')
    out.append(f'<text x="{cx:.1f}" y="{bottom + 10:.1f}" font-size="9" text-anchor="end" '
               f'transform="rotate(-35 {cx:.1f} {bottom + 10:.1f})">{html.escape(label)}</text>')
    return out


def bars_svg(rows: list[dict], algorithms: list[str], title: str = "Makespan per algorithm") -> tuple[str, int, int]:
    """Grouped-bar SVG body (no ``<svg>`` wrapper) and its width and height."""
    groups = _groups(rows, algorithms)
    order = columns(rows, algorithms)
    colour = algorithm_colours(rows, algorithms)
    cols = max(1, min(3, len(groups)))
    nrows = (len(groups) + cols - 1) // cols
    width = cols * PANEL_W + 20
    shown = [a for a in order if any(a in cells for _, cells in groups)]
    out = [f'<text x="10" y="22" font-size="15">{html.escape(title)}</text>',
           '<defs><pattern id="oom" width="6" height="6" patternUnits="userSpaceOnUse" '
           f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6c6c6"/>'
           f'<line x1="0" y1="0" x2="0" y2="6" stroke="{OOM_RED}" stroke-width="3"/></pattern></defs>']
    legend, legend_h = _legend_svg(shown, colour, width)
    out += legend
    top = 40 + legend_h
    for gi, (gtitle, cells) in enumerate(groups):
        out += _panel_svg(10 + (gi % cols) * PANEL_W, top + (gi // cols) * PANEL_H, gtitle, cells, order, colour)
    return "\n".join(out), width, top + nrows * PANEL_H + 10


_SIZE = re.compile(r'<svg\b[^>]*?\bwidth="([\d.]+)"[^>]*?\bheight="([\d.]+)"')


def compare_svg(rows: list[dict], algorithms: list[str], gantts: list[str] | None = None,
                title: str = "placer compare: simulated makespan per algorithm") -> str:
    """The whole figure: grouped bars on top, then each Gantt SVG (strings
    from :func:`celeritas_cli.sim.gantt.gantt_svg`) stacked below, nested as
    ``<svg>`` elements."""
    body, width, height = bars_svg(rows, algorithms, title)
    parts = [body]
    y = height
    for g in gantts or []:
        m = _SIZE.search(g)
        gw, gh = (float(m.group(1)), float(m.group(2))) if m else (1200.0, 400.0)
        inner = re.sub(r"^<\?xml[^>]*>\s*", "", g.strip())
        inner = re.sub(r"^<svg\b", f'<svg x="0" y="{y:.0f}"', inner, count=1)
        parts.append(inner)
        y += gh + 10
        width = max(width, int(gw))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{int(y)}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(parts) + "\n</svg>\n")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("a .png plot needs matplotlib: pip install 'celeritas-cli[plot]', "
                                "or write .svg (no dependency)") from None
    return plt


def _panel_png(ax, gtitle: str, cells: dict[str, dict], order: list[str], colour: dict[str, str]) -> None:
    present = [a for a in order if a in cells]
    best = _best(cells, order)
    vals = [cells[a].get("makespan_s") if cells[a].get("status") in ("OK", "OOM") else 0 for a in present]
    bars = ax.bar(range(len(present)), [v or 0 for v in vals], color=[colour[a] for a in present])
    for b, a in zip(bars, present):
        st = cells[a].get("status")
        if a == best:
            b.set_edgecolor("black")
            b.set_linewidth(2)
        if st != "OK":
            b.set_facecolor("#f6c6c6")
            b.set_edgecolor(OOM_RED)
            b.set_hatch("//")
            ax.annotate("OOM" if st == "OOM" else "×", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", color=OOM_RED, fontsize=8)
    ticks, lb = _panel_scale(cells)
    if lb is not None:
        ax.axhline(lb, color="#555", linestyle="--", linewidth=1)
        ax.annotate("LB", (1.0, lb), xycoords=("axes fraction", "data"), xytext=(3, 0), textcoords="offset points",
                    ha="left", va="center", fontsize=7, color="#555", annotation_clip=False)
    ax.set_yticks(ticks, [tick_label(t) for t in ticks])
    ax.set_ylim(0, ticks[-1])
    ax.set_xticks(range(len(present)), present, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("makespan (s)")
    ax.set_title(gtitle, fontsize=9)


def compare_png(rows: list[dict], algorithms: list[str], schedules: list | None = None) -> bytes:
    """The same figure as PNG bytes, drawn with matplotlib: bar panels with
    the algorithm legend on top, then one Gantt axis per ``(graph, cluster,
    schedule, title)`` in *schedules*.

    Raises
    ------
    MissingDependency
        matplotlib is not installed.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from ..sim.gantt import draw_gantt

    groups = _groups(rows, algorithms)
    order = columns(rows, algorithms)
    colour = algorithm_colours(rows, algorithms)
    schedules = schedules or []
    cols = max(1, min(3, len(groups)))
    nrows = (len(groups) + cols - 1) // cols
    shown = [a for a in order if any(a in cells for _, cells in groups)]
    handles = [Patch(color=colour[a], label=a) for a in shown]
    handles += [Line2D([], [], color="#555", linestyle="--", label="lower bound (LB)"),
                Patch(facecolor="white", edgecolor="black", linewidth=2, label="best (outlined)"),
                Patch(facecolor="#f6c6c6", edgecolor=OOM_RED, hatch="//", label="OOM")]
    legend_h = 0.3 + 0.2 * ((len(handles) + 5) // 6)
    gantt_h = [0.3 * (cluster.k + len({(t.src_dev, t.dst_dev) for t in sched.transfers})) + 1.6
               for _, cluster, sched, _ in schedules]
    heights = [legend_h] + [3.4] * nrows + gantt_h
    fig = plt.figure(figsize=(5.5 * cols, sum(heights)))
    grid = fig.add_gridspec(len(heights), cols, height_ratios=heights)
    top = fig.add_subplot(grid[0, :])
    top.axis("off")
    top.set_title("placer compare: simulated makespan per algorithm", loc="left")
    top.legend(handles=handles, loc="upper left", ncol=6, fontsize=8, frameon=False)
    for gi, (gtitle, cells) in enumerate(groups):
        _panel_png(fig.add_subplot(grid[1 + gi // cols, gi % cols]), gtitle, cells, order, colour)
    for si, (graph, cluster, sched, stitle) in enumerate(schedules):
        draw_gantt(fig.add_subplot(grid[1 + nrows + si, :]), graph, cluster, sched, stitle)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def best_schedules(best: dict[tuple, dict], clusters: dict, congestion: str = DEFAULT_CONGESTION) -> list[tuple]:
    """``(graph, cluster, schedule, title)`` of each best placement in *best*
    (``(graph file, cluster)`` -> row carrying its ``_placement``), in the
    order of the bar panels, simulated again on its graph (the split graph
    when the algorithm planned on one)."""
    from ..model.io import load_graph
    from ..model.placement import Placement
    from ..sim.simulator import simulate

    schedules = []
    for (gf, cl), row in sorted(best.items(), key=lambda kv: (natural_key(str(kv[0][0])), str(kv[0][1]))):
        graph = load_graph(gf)
        cluster = clusters[cl]
        sched: list = []
        simulate(graph, cluster, Placement.from_dict(row["_placement"]), congestion=congestion, schedule_out=sched)
        title = f"{row.get('graph')} on {cl}: best = {column_label(row)}"
        schedules.append((sched[0].graph, cluster, sched[0], title))  # split graph if planned on one
    return schedules


def write_plot(path: str, rows: list[dict], algorithms: list[str], best: dict[tuple, dict], clusters: dict,
               congestion: str = DEFAULT_CONGESTION) -> None:
    """Write ``--plot``: bars for every cell and a Gantt chart per best
    placement found in this run (cells taken from ``--resume`` have no
    placement to draw); ``.png`` through matplotlib, else SVG.

    Raises
    ------
    MissingDependency
        A ``.png`` without matplotlib.
    """
    schedules = best_schedules(best, clusters, congestion)
    if path.lower().endswith(".png"):
        write_bytes(compare_png(rows, algorithms, schedules), path)
        return
    from ..sim.gantt import gantt_svg

    gantts = [gantt_svg(g, c, s, title=t) for g, c, s, t in schedules]
    write_bytes(compare_svg(rows, algorithms, gantts).encode(), path)
