"""Gantt charts (SVG, or PNG with the optional matplotlib) and Chrome trace
JSON (chrome://tracing, Perfetto) of a simulated schedule.

The SVG is written by hand (no plotting dependency): one row per device for
compute and one row per used directed link for transfers, time on the x
axis, each node a rectangle with a ``<title>`` tooltip (id, op, start, end).
"""

from __future__ import annotations

import html
import os
import zlib

from ..errors import InvalidInput, MissingDependency
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.jsonio import write_bytes, write_json

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")


def _colour(op: str) -> str:
    return PALETTE[zlib.crc32(op.encode()) % len(PALETTE)]


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


def gantt_svg(graph: Graph, cluster: Cluster, sched, title: str = "") -> str:
    """An SVG Gantt chart of *sched* (a :class:`~celeritas_cli.sim.simulator.Schedule`)."""
    rows = _rows(graph, cluster, sched)
    width, left, row_h, top = 1200, 150, 22, 40
    span = sched.makespan or 1.0
    scale = (width - left - 20) / span
    height = top + row_h * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">{html.escape(title or graph.name)} — makespan '
           f'{sched.makespan:.6g} s</text>']
    for i, (label, items) in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="10" y="{y + 15}">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{width - left - 20}" height="{row_h - 4}" fill="#f4f4f4"/>')
        for s, e, name, op in items:
            x = left + s * scale
            w = max((e - s) * scale, 0.5)
            colour = "#999999" if op == "transfer" else _colour(op)
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="{colour}">'
                       f'<title>{html.escape(name)} ({html.escape(op)}) {s:.6g}–{e:.6g} s</title></rect>')
    y = top + len(rows) * row_h + 15
    for j in range(6):
        t = span * j / 5
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y - 10}" stroke="#ccc"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 5}" text-anchor="middle">{t:.4g}s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_gantt(graph: Graph, cluster: Cluster, sched, path: str, title: str = "") -> None:
    """Write the Gantt chart to *path*: ``.svg`` by hand, ``.png`` through
    matplotlib (``pip install -e .[plot]``)."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".svg":
        write_bytes(gantt_svg(graph, cluster, sched, title).encode(), path)
        return
    if ext != ".png":
        raise InvalidInput(f"{path}: Gantt charts are written as .svg or .png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency(f"{path}: PNG output needs matplotlib (pip install -e .[plot]); "
                                f"use a .svg file instead") from None
    rows = _rows(graph, cluster, sched)
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(rows) + 1.5))
    for i, (_label, items) in enumerate(rows):
        ax.broken_barh([(s, e - s) for s, e, _, _ in items], (i - 0.4, 0.8),
                       facecolors=["#999999" if op == "transfer" else _colour(op) for *_, op in items])
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{title or graph.name} — makespan {sched.makespan:.6g} s")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


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
