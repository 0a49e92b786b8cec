"""Comparison plots: makespan per algorithm per graph (grouped bars), plus
the Gantt chart of each graph's best placement.

The SVG is written by hand, so ``placer compare --plot out.svg`` needs no
plotting library.  Grouped bars use one panel per (graph, cluster) with its
own y axis: graphs of 60 and 36,000 nodes differ by orders of magnitude in
makespan, and one shared axis would flatten the small ones.  Each panel
draws a dashed line at the lower bound (DESIGN.md, simulator item 6), OOM
cells as hatched red bars (the simulated makespan of a placement that would
not fit), failed cells as a cross.  PNG output needs matplotlib (the
``plot`` extra) and draws the same panels; the Gantt charts come from
:mod:`celeritas_cli.sim.gantt`.
"""

from __future__ import annotations

import html
import re

from ..errors import MissingDependency
from ..model.jsonio import write_bytes
from ..sim.gantt import PALETTE
from .rows import graph_stem, sort_rows

PANEL_W, PANEL_H = 380, 240


def _nice_max(x: float) -> float:
    """Smallest 1/2/2.5/5 x 10^k >= x."""
    if x <= 0:
        return 1.0
    import math

    exp = math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * 10**exp >= x * (1 - 1e-12):
            return m * 10**exp
    return 10 ** (exp + 1)


def _groups(rows: list[dict], algorithms: list[str]) -> list[tuple[str, dict[str, dict]]]:
    groups: dict[tuple, dict[str, dict]] = {}
    names: dict[tuple, str] = {}
    for r in sort_rows(rows, algorithms):
        key = (r.get("graph_file"), r.get("cluster"), r.get("coarsen"))
        groups.setdefault(key, {})[r["algorithm"]] = r
        if r.get("graph"):
            names[key] = r["graph"]
    multi = len({k[1] for k in groups}) > 1
    out = []
    for key, cells in groups.items():
        title = names.get(key, graph_stem(str(key[0])))
        if multi:
            title += f" on {key[1]}"
        if key[2]:
            title += f" (coarsen {key[2]})"
        out.append((title, cells))
    return out


def bars_svg(rows: list[dict], algorithms: list[str], title: str = "Makespan per algorithm") -> tuple[str, int, int]:
    """Grouped-bar SVG body (no ``<svg>`` wrapper) and its width and height."""
    groups = _groups(rows, algorithms)
    cols = max(1, min(3, len(groups)))
    nrows = (len(groups) + cols - 1) // cols
    width = cols * PANEL_W + 20
    legend_h = 22 * ((len(algorithms) + 5) // 6)
    top = 40 + legend_h
    height = top + nrows * PANEL_H + 10
    colour = {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(algorithms)}
    out = [f'<text x="10" y="22" font-size="15">{html.escape(title)}</text>']
    for i, a in enumerate(algorithms):
        x = 10 + (i % 6) * 190
        y = 34 + (i // 6) * 22
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour[a]}"/>'
                   f'<text x="{x + 16}" y="{y + 11}">{html.escape(a)}</text>')
    out.append('<defs><pattern id="oom" width="6" height="6" patternUnits="userSpaceOnUse" '
               'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6c6c6"/>'
               '<line x1="0" y1="0" x2="0" y2="6" stroke="#d62728" stroke-width="3"/></pattern></defs>')
    for gi, (gtitle, cells) in enumerate(groups):
        px = 10 + (gi % cols) * PANEL_W
        py = top + (gi // cols) * PANEL_H
        left, right, ptop, bottom = px + 55, px + PANEL_W - 15, py + 22, py + PANEL_H - 45
        vals = [c["makespan_s"] for c in cells.values() if c.get("makespan_s") is not None]
        lbs = [c["lower_bound_s"] for c in cells.values() if c.get("lower_bound_s")]
        ymax = _nice_max(max(vals + lbs, default=1.0))
        out.append(f'<text x="{px + 5}" y="{py + 14}" font-size="12">{html.escape(gtitle)}</text>')
        out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>'
                   f'<line x1="{left}" y1="{ptop}" x2="{left}" y2="{bottom}" stroke="#333"/>')
        for t in range(5):
            v = ymax * t / 4
            y = bottom - (bottom - ptop) * t / 4
            out.append(f'<line x1="{left - 3}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                       f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" font-size="9">{v:.3g}</text>')
        mid = (ptop + bottom) / 2
        out.append(f'<text x="{px + 10}" y="{mid:.1f}" font-size="9" transform="rotate(-90 {px + 10} {mid:.1f})" '
                   f'text-anchor="middle">makespan (s)</text>')
        present = [a for a in algorithms if a in cells]
        slot = (right - left) / max(1, len(present))
        bw = max(2.0, slot * 0.7)
        best = min((c["makespan_s"] for c in cells.values() if c.get("status") == "OK"
                    and c.get("makespan_s") is not None), default=None)
        for j, a in enumerate(present):
            c = cells[a]
            x = left + j * slot + (slot - bw) / 2
            cx = x + bw / 2
            val = c.get("makespan_s")
            tip = f"{a}: {c.get('status')}"
            if val is not None:
                tip += f", makespan {val:.6g} s"
            if c.get("error"):
                tip += f" - {c['error']}"
            if c.get("status") in ("OK", "OOM") and val is not None:
                h = (bottom - ptop) * val / ymax
                fill = "url(#oom)" if c["status"] == "OOM" else colour[a]
                stroke = ' stroke="#000" stroke-width="2"' if c["status"] == "OK" and val == best else ""
                out.append(f'<rect x="{x:.1f}" y="{bottom - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                           f'fill="{fill}"{stroke}><title>{html.escape(tip)}</title></rect>')
                if c["status"] == "OOM":
                    out.append(f'<text x="{cx:.1f}" y="{bottom - h - 3:.1f}" text-anchor="middle" '
                               f'font-size="9" fill="#d62728">OOM</text>')
            else:
                out.append(f'<text x="{cx:.1f}" y="{bottom - 4:.1f}" text-anchor="middle" font-size="12" '
                           f'fill="#d62728">×<title>{html.escape(tip)}</title></text>')
            out.append(f'<text x="{cx:.1f}" y="{bottom + 10:.1f}" font-size="9" text-anchor="end" '
                       f'transform="rotate(-35 {cx:.1f} {bottom + 10:.1f})">{html.escape(a)}</text>')
        if lbs:
            y = bottom - (bottom - ptop) * min(lbs) / ymax
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#555" '
                       f'stroke-dasharray="4 3"><title>lower bound {min(lbs):.6g} s</title></line>')
    return "\n".join(out), width, height


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


def compare_png(rows: list[dict], algorithms: list[str], schedules: list | None = None) -> bytes:
    """The same figure as PNG bytes, drawn with matplotlib: bar panels, then
    one Gantt axis per ``(graph, cluster, schedule, title)`` in *schedules*."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("a .png plot needs matplotlib: pip install 'celeritas-cli[plot]', "
                                "or write .svg (no dependency)") from None
    groups = _groups(rows, algorithms)
    schedules = schedules or []
    cols = max(1, min(3, len(groups)))
    nrows = (len(groups) + cols - 1) // cols
    fig = plt.figure(figsize=(5 * cols, 3.2 * nrows + 3.0 * len(schedules)))
    total = nrows + len(schedules)
    colour = {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(algorithms)}
    for gi, (gtitle, cells) in enumerate(groups):
        ax = fig.add_subplot(total, cols, gi + 1)
        present = [a for a in algorithms if a in cells]
        vals = [cells[a].get("makespan_s") if cells[a].get("status") in ("OK", "OOM") else 0 for a in present]
        bars = ax.bar(range(len(present)), [v or 0 for v in vals], color=[colour[a] for a in present])
        for b, a in zip(bars, present):
            st = cells[a].get("status")
            if st != "OK":
                b.set_hatch("//")
                ax.annotate("OOM" if st == "OOM" else "×", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", color="#d62728", fontsize=8)
        ax.set_xticks(range(len(present)), present, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("makespan (s)")
        ax.set_title(gtitle, fontsize=9)
    for si, (graph, cluster, sched, stitle) in enumerate(schedules):
        ax = fig.add_subplot(total, 1, nrows + si + 1)
        for d in range(cluster.k):
            spans = [(sched.start[v], sched.finish[v] - sched.start[v]) for v in sched.device_order[d]]
            ax.broken_barh(spans, (d - 0.4, 0.8), color=PALETTE[d % len(PALETTE)])
        ax.set_yticks(range(cluster.k), cluster.ids)
        ax.set_xlabel("time (s)")
        ax.set_title(f"{stitle}: makespan {sched.makespan:.6g} s", fontsize=9)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def best_schedules(best: dict[tuple, dict], clusters: dict, congestion: str = "channel") -> list[tuple]:
    """``(graph, cluster, schedule, title)`` of each best placement in *best*
    (group key -> row carrying its ``_placement``), simulated again on its
    graph (the split graph when the algorithm planned on one)."""
    from ..model.io import load_graph
    from ..model.placement import Placement
    from ..sim.simulator import simulate

    schedules = []
    for (gf, cl, _co), row in sorted(best.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        graph = load_graph(gf)
        cluster = clusters[cl]
        sched: list = []
        simulate(graph, cluster, Placement.from_dict(row["_placement"]), congestion=congestion, schedule_out=sched)
        title = f"{row.get('graph')} on {cl}: best = {row['algorithm']}"
        schedules.append((sched[0].graph, cluster, sched[0], title))  # split graph if planned on one
    return schedules


def write_plot(path: str, rows: list[dict], algorithms: list[str], best: dict[tuple, dict], clusters: dict,
               congestion: str = "channel") -> None:
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
