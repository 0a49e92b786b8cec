"""SVG charts of the HTML pages, written by hand (no plotting library):

* :func:`gantt_chart` - a placement's schedule: one lane per device and per
  used directed link, bars coloured by operation type (the colours of
  :mod:`celeritas_cli.sim.gantt`), the critical path outlined, the lower
  bound dashed; a bar's details (node, op, start, end, device, bytes) come
  from the chart's embedded JSON when hovered (:mod:`.page`);
* :func:`memory_chart` - each device's live memory over time (the
  report's ``memory_timeline``, a step function) on the Gantt chart's time
  axis, with its capacity line and its peak; a report without a timeline
  (written before placer judged memory over time) gets one bar per device
  (the static sum against the capacity);
* :func:`strip_plot` - one value per (algorithm, graph) cell on a linear or
  log axis: ``compare``'s makespan / lower bound and placement time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.cluster import Cluster
from ..model.graph import Graph
from ..sim.gantt import LOWER_BOUND, OTHER_OPS, TRANSFER, legend_entries, nice_ticks, op_colours, tick_label, \
    time_unit
from .page import esc, fmt_bytes, json_script

WIDTH, LEFT, RIGHT = 1200, 170, 30
ROW_H = 20
MEMORY_H = 64
#: the memory chart's scale reaches the capacity when it is at most this many times the highest peak
CAPACITY_SHOWN = 4.0


def _time_axis(span: float) -> tuple[list[float], float, str, float]:
    """Round ticks up to *span* seconds, the unit factor and name, pixels per second."""
    ticks = nice_ticks(span)
    factor, unit = time_unit(ticks[-1])
    return ticks, factor, unit, (WIDTH - LEFT - RIGHT) / ticks[-1]


def _ticks_svg(ticks: list[float], factor: float, scale: float, top: float, bottom: float, labels: bool) -> list[str]:
    out = []
    for t in ticks:
        x = LEFT + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#ddd"/>')
        if labels:
            out.append(f'<text x="{x:.1f}" y="{bottom + 13}" text-anchor="middle" font-size="11">'
                       f'{tick_label(t * factor)}</text>')
    return out


#: bars narrower than this many pixels share a drawn bar with their neighbours in the same pixel
MERGE_PX = 1.0


@dataclass
class _Bar:
    """What is drawn as one bar: one node or transfer, or several narrower
    than :data:`MERGE_PX` side by side (the longest one gives the colour)."""

    start: float
    end: float
    label: str
    op: str
    nbytes: int
    colour: str
    critical: bool
    count: int = 1
    longest: float = 0.0

    def absorb(self, other: "_Bar") -> None:
        if other.end - other.start > self.longest:
            self.longest, self.colour, self.op = other.end - other.start, other.colour, other.op
        self.end = max(self.end, other.end)
        self.nbytes += other.nbytes
        self.critical = self.critical or other.critical
        self.count += 1
        self.label = f"{self.label.split(' … ')[0]} … {other.label}"


def _merge(bars: list[_Bar], scale: float) -> list[_Bar]:
    """One lane's bars (by start) with runs of sub-pixel bars merged: a bar
    narrower than :data:`MERGE_PX` joins the previous drawn bar when that
    one holds only such bars and started less than :data:`MERGE_PX` earlier.

    Example
    -------
    >>> bs = [_Bar(t, t + 0.1, f"n{t}", "op", 1, "#000", False) for t in (0.0, 0.2, 5.0)]
    >>> [(b.count, b.start, b.end, b.label) for b in _merge(bs, scale=4.0)]
    [(2, 0.0, 0.30000000000000004, 'n0.0 … n0.2'), (1, 5.0, 5.1, 'n5.0')]
    """
    out: list[_Bar] = []
    for b in bars:
        b.longest = b.end - b.start
        narrow = (b.end - b.start) * scale < MERGE_PX
        last = out[-1] if out else None
        if narrow and last is not None and last.longest * scale < MERGE_PX \
                and (b.start - last.start) * scale < MERGE_PX:
            last.absorb(b)
        else:
            out.append(b)
    return out


def _round(t: float) -> float:
    return float(f"{t:.7g}")


def gantt_chart(graph: Graph, cluster: Cluster, sched, chart_id: str, critical: set[int] | None = None,
                lower_bound: float | None = None) -> str:
    """The Gantt chart of *sched* (a schedule of *graph*) as inline SVG plus
    its hover data, a JSON block named *chart_id*: ``lanes`` (devices, then
    used directed links; ``devices`` of them are devices) and per drawn bar
    ``[label, op, start, end, lane, bytes, count, critical]`` (``count`` > 1:
    that many sub-pixel nodes or transfers side by side, :func:`_merge`;
    for a transfer ``op`` names its producer).  Bars holding a node of
    *critical* carry the class ``cp`` (the page's switch outlines them and
    fades the rest)."""
    critical = critical or set()
    colours, _ = op_colours(graph, sched)
    ticks, factor, unit, scale = _time_axis(max(sched.makespan, lower_bound or 0.0))
    lanes: list[tuple[str, list[_Bar]]] = []
    for d, dev in enumerate(cluster.devices):
        lanes.append((dev.id, [_Bar(sched.start[v], sched.finish[v], graph.ids[v], graph.op[v], graph.memory[v],
                                    colours[graph.op[v]], v in critical) for v in sched.device_order[d]]))
    links: dict[tuple[int, int], list[_Bar]] = {}
    for tr in sorted(sched.transfers, key=lambda x: (x.src_dev, x.dst_dev, x.start, x.end)):
        src = graph.ids[graph.tensor_src[tr.tensor]]
        links.setdefault((tr.src_dev, tr.dst_dev), []).append(
            _Bar(tr.start, tr.end, f"{src}:{graph.tensor_name[tr.tensor]}", src, tr.nbytes, TRANSFER, False))
    lanes += [(f"{cluster.ids[a]}→{cluster.ids[b]}", bars) for (a, b), bars in sorted(links.items())]
    top = 8
    axis_y = top + ROW_H * len(lanes)
    legend = legend_entries(graph, sched) + ([(f"lower bound {lower_bound:.4g} s", LOWER_BOUND)]
                                             if lower_bound else [])
    legend_y = axis_y + 44
    height = legend_y + 18 * ((len(legend) + 3) // 4) + 6
    out = [f'<svg class="gantt" id="{esc(chart_id)}-svg" data-chart="{esc(chart_id)}" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    for i, (label, _bars) in enumerate(lanes):
        y = top + i * ROW_H
        out.append(f'<text x="6" y="{y + 14}">{esc(label)}</text>'
                   f'<rect x="{LEFT}" y="{y}" width="{WIDTH - LEFT - RIGHT}" height="{ROW_H - 3}" fill="#f4f4f4"/>')
    out += _ticks_svg(ticks, factor, scale, top, axis_y + 3, True)
    items: list[list] = []
    for i, (_label, bars) in enumerate(lanes):
        y = top + i * ROW_H
        for b in _merge(bars, scale):
            cls = ' class="cp"' if b.critical else ""
            out.append(f'<rect data-i="{len(items)}"{cls} x="{LEFT + b.start * scale:.1f}" y="{y}" '
                       f'width="{max((b.end - b.start) * scale, 0.6):.1f}" height="{ROW_H - 3}" fill="{b.colour}"/>')
            items.append([b.label, b.op, _round(b.start), _round(b.end), i, b.nbytes, b.count, int(b.critical)])
    if lower_bound and lower_bound > 0:
        x = LEFT + lower_bound * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="{LOWER_BOUND}" '
                   f'stroke-width="1.5" stroke-dasharray="5,3" data-tip="lower bound {lower_bound:.6g} s"/>')
    out.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{axis_y + 30}" text-anchor="middle">'
               f'time ({unit})</text>')
    for i, (label, colour) in enumerate(legend):
        x, y = LEFT + (i % 4) * 250, legend_y + (i // 4) * 18
        edge = ' stroke="#999"' if colour == OTHER_OPS else ""
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"{edge}/>'
                   f'<text x="{x + 17}" y="{y}">{esc(label)}</text>')
    out.append("</svg>")
    data = {"factor": factor, "unit": unit, "lanes": [label for label, _ in lanes], "devices": cluster.k,
            "items": items}
    return "\n".join(out) + "\n" + json_script(chart_id, data)


def memory_chart(report: dict, span: float | None = None) -> str:
    """Each device's live memory over time (``report["memory_timeline"]``)
    on the Gantt chart's time axis (up to *span* seconds, default the
    makespan), one lane per device on one shared scale, with the capacity
    line (or, when the capacity is far above every peak, a note saying so),
    the peak marked and described on hover; a report without a timeline
    gets :func:`memory_bars`."""
    timeline = report.get("memory_timeline")
    if not isinstance(timeline, dict) or not timeline:
        return memory_bars(report)
    devices = report["devices"]
    makespan = float(report.get("makespan_s") or 0.0)
    ticks, factor, unit, scale = _time_axis(max(span or 0.0, makespan))
    peaks = [max([int(d.get("memory_bytes") or 0)] + [int(b) for _, b in timeline.get(d["id"], [])])
             for d in devices]
    caps = [int(d.get("capacity_bytes") or 0) for d in devices]
    top_peak = max(peaks + [1])
    show_cap = max(caps + [0]) <= CAPACITY_SHOWN * top_peak
    ymax = max(top_peak, max(caps) if show_cap else 0) * 1.08
    height = 8 + MEMORY_H * len(devices) + 40
    out = [f'<svg class="memory" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
           f'xmlns="http://www.w3.org/2000/svg" font-size="11">']
    axis_y = 8 + MEMORY_H * len(devices)
    out += _ticks_svg(ticks, factor, scale, 8, axis_y, True)
    for i, dev in enumerate(devices):
        base = 8 + (i + 1) * MEMORY_H - 6
        lane_h = MEMORY_H - 12

        def y_of(b: float) -> float:
            return base - lane_h * b / ymax

        points = [(float(t), float(b)) for t, b in timeline.get(dev["id"], [])]
        over = caps[i] and peaks[i] > caps[i]
        colour = "#d62728" if over else "#4e79a7"
        path = [f"M{LEFT},{base:.1f}"]  # a step function: level b from t until the next point
        for t, b in points:
            path.append(f"H{LEFT + t * scale:.2f}V{y_of(b):.1f}")
        path.append(f"H{LEFT + makespan * scale:.2f}V{base:.1f}Z")
        tip = _peak_tip(dev, peaks[i], caps[i])
        out.append(f'<text x="6" y="{base - lane_h / 2 + 4:.1f}">{esc(dev["id"])}</text>'
                   f'<text x="6" y="{base - lane_h / 2 + 17:.1f}" font-size="10" fill="#666">peak '
                   f'{esc(fmt_bytes(peaks[i]))} of {esc(fmt_bytes(caps[i]))}</text>'
                   f'<rect x="{LEFT}" y="{base - lane_h}" width="{WIDTH - LEFT - RIGHT}" height="{lane_h}" '
                   f'fill="#fafafa" data-tip="{esc(tip)}"/>'
                   f'<path d="{"".join(path)}" fill="{colour}" fill-opacity="0.25" stroke="{colour}" '
                   f'stroke-width="1" data-tip="{esc(tip)}"/>')
        if show_cap and caps[i]:
            y = y_of(caps[i])
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="{LOWER_BOUND}" '
                       f'stroke-dasharray="6,3" data-tip="capacity of {esc(dev["id"])}: {fmt_bytes(caps[i])}"/>')
        at = dev.get("peak_at_s")
        if isinstance(at, (int, float)) and peaks[i] > 0:
            out.append(f'<circle cx="{LEFT + at * scale:.1f}" cy="{y_of(peaks[i]):.1f}" r="3.5" fill="{colour}" '
                       f'stroke="#fff" data-tip="{esc(tip)}"/>')
    out.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{axis_y + 30}" text-anchor="middle">'
               f'time ({unit})</text>')
    out.append("</svg>")
    note = (f"Shared scale: 0 to {fmt_bytes(ymax)}; dashed red line: each device's capacity." if show_cap else
            f"Shared scale: 0 to {fmt_bytes(ymax)}; every capacity (up to {fmt_bytes(max(caps))}) is more than "
            f"{CAPACITY_SHOWN:g}x the highest peak, so it lies above the chart.")
    return "\n".join(out) + f'\n<p class="small muted">{esc(note)}</p>'


def _peak_tip(dev: dict, peak: int, cap: int) -> str:
    lines = [f"{dev['id']}: peak {fmt_bytes(peak)} of {fmt_bytes(cap)}"
             + (f" at {dev['peak_at_s']:.6g} s" if isinstance(dev.get("peak_at_s"), (int, float)) else "")]
    if peak > cap > 0:
        lines.append(f"OVER capacity by {fmt_bytes(peak - cap)}")
    for item in dev.get("peak_live") or []:
        lines.append(f"{item.get('kind', '?')} {item.get('node', '?')}: {fmt_bytes(item.get('bytes'))}")
    return "\n".join(lines)


def memory_bars(report: dict) -> str:
    """One bar per device: its memory (the report's ``memory_bytes``) against
    its capacity - for reports without a ``memory_timeline``."""
    devices = report.get("devices") or []
    width = 900
    top = max([int(d.get("capacity_bytes") or 0) for d in devices] + [int(d.get("memory_bytes") or 0)
                                                                      for d in devices] + [1])
    height = 10 + 22 * len(devices) + 10
    out = [f'<svg class="memory" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
           f'font-size="11">']
    for i, d in enumerate(devices):
        y = 10 + 22 * i
        mem, cap = int(d.get("memory_bytes") or 0), int(d.get("capacity_bytes") or 0)
        w_cap, w_mem = (width - LEFT - 180) * cap / top, (width - LEFT - 180) * mem / top
        colour = "#d62728" if mem > cap else "#4e79a7"
        out.append(f'<text x="6" y="{y + 13}">{esc(d.get("id"))}</text>'
                   f'<rect x="{LEFT}" y="{y}" width="{w_cap:.1f}" height="16" fill="#eee" stroke="#bbb"/>'
                   f'<rect x="{LEFT}" y="{y + 3}" width="{w_mem:.1f}" height="10" fill="{colour}" '
                   f'data-tip="{esc(d.get("id"))}: {fmt_bytes(mem)} of {fmt_bytes(cap)}"/>'
                   f'<text x="{LEFT + max(w_cap, w_mem) + 6:.1f}" y="{y + 13}">{fmt_bytes(mem)} / '
                   f'{fmt_bytes(cap)}</text>')
    out.append("</svg>")
    return ("\n".join(out) + '\n<p class="small muted">This report has no memory_timeline (written before placer '
            "judged memory over time): each bar is the device's memory_bytes against its capacity (grey).</p>")


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten from below *lo* to above *hi*.

    Example
    -------
    >>> _log_ticks(0.003, 20)
    [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]
    """
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [float(f"1e{k}") for k in range(a, max(b, a + 1) + 1)]


def strip_plot(categories: list[str], points: list[tuple[str, float, str, str]], groups: list[str],
               colours: list[str], ylabel: str, reference: float | None = None, log: bool | None = None) -> str:
    """Values per category as dots: *points* are ``(category, value, group,
    tooltip)``, one colour per group (the legend), a dashed *reference*
    line (1 for makespan / lower bound), a log axis when *log* (default:
    when the values span more than 30x)."""
    vals = [v for _, v, _, _ in points if v is not None and math.isfinite(v) and v > 0]
    width, left, right, top, plot_h = WIDTH, 70, 20, 12, 260
    if not vals or not categories:
        return '<p class="muted">nothing to plot</p>'
    lo, hi = min(vals + ([reference] if reference else [])), max(vals + ([reference] if reference else []))
    if log is None:
        log = hi / lo > 30
    if log:
        ticks = _log_ticks(lo, hi)
        a, b = math.log10(ticks[0]), math.log10(ticks[-1])

        def y_of(v: float) -> float:
            return top + plot_h * (1 - (math.log10(v) - a) / (b - a))
    else:
        ticks = nice_ticks(hi)

        def y_of(v: float) -> float:
            return top + plot_h * (1 - v / ticks[-1])
    slot = (width - left - right) / len(categories)
    bottom = top + plot_h
    legend_y = bottom + 100
    height = legend_y + 18 * ((len(groups) + 4) // 5) + 4
    out = [f'<svg class="strip" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'xmlns="http://www.w3.org/2000/svg" font-size="11">']
    for t in ticks:
        y = y_of(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick_label(t)}</text>')
    out.append(f'<text x="14" y="{top + plot_h / 2:.0f}" transform="rotate(-90 14 {top + plot_h / 2:.0f})" '
               f'text-anchor="middle">{esc(ylabel)}{" (log scale)" if log else ""}</text>')
    if reference:
        y = y_of(reference)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="{LOWER_BOUND}" '
                   f'stroke-dasharray="5,3"/>')
    pos = {c: i for i, c in enumerate(categories)}
    gpos = {g: i for i, g in enumerate(groups)}
    for i, c in enumerate(categories):
        cx = left + (i + 0.5) * slot
        if i % 2:
            out.append(f'<rect x="{left + i * slot:.1f}" y="{top}" width="{slot:.1f}" height="{plot_h}" '
                       f'fill="#000" fill-opacity="0.025"/>')
        out.append(f'<text x="{cx:.1f}" y="{bottom + 12}" text-anchor="end" '
                   f'transform="rotate(-40 {cx:.1f} {bottom + 12})">{esc(c)}</text>')
    spread = min(slot * 0.6, 60)
    for cat, v, g, tip in points:
        if cat not in pos or v is None or not math.isfinite(v) or v <= 0:
            continue
        k = gpos.get(g, 0)
        dx = (k - (len(groups) - 1) / 2) * spread / max(1, len(groups))
        cx = left + (pos[cat] + 0.5) * slot + dx
        out.append(f'<circle cx="{cx:.1f}" cy="{y_of(v):.1f}" r="4.5" fill="{colours[k % len(colours)]}" '
                   f'fill-opacity="0.85" stroke="#fff" data-tip="{esc(tip)}"/>')
    for i, g in enumerate(groups):
        x, y = left + (i % 5) * 220, legend_y + (i // 5) * 18
        out.append(f'<circle cx="{x + 5}" cy="{y - 4}" r="5" fill="{colours[i % len(colours)]}"/>'
                   f'<text x="{x + 15}" y="{y}">{esc(g)}</text>')
    out.append("</svg>")
    return "\n".join(out)
