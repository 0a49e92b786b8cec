"""The comparison as text: Celeritas Table 3 / Table 4 layouts (rich text or
Markdown) and one CSV line per cell.

:func:`matrix` lays rows out like Celeritas Table 3: a row per graph, a
column per algorithm, ``OOM`` where a device overflows, the best makespan
marked, and a last column with the speed-up of the best over the second
best, ``1 - best / second`` (the reading that reproduces Table 3's numbers,
e.g. Tensor Holography ``1 - 1.461 / 2.220 = 34.2%``).

References
----------
Celeritas (Table 3: step time per model and algorithm, OOM cells, speed-up
over the second best; Table 4: placement generation time, coarse graph
generation included; 6.3: the two metrics).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Iterable

from .rows import (
    CSV_FIELDS,
    FAILED_STATUSES,
    OK_STATUSES,
    column_label,
    graph_stem,
    sort_rows,
)


def _fmt_num(x: float | None) -> str:
    """Four significant digits, no exponent between 1e-4 and 1e6."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-4:
        return f"{x:.3e}"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.4g}"


def _cell_text(r: dict | None, metric: str) -> str:
    if r is None:
        return ""
    st = r.get("status")
    if st == "timeout":
        return "timeout"
    if st == "error":
        return "error"
    mark = CAVEAT_MARK if r.get("caveat") else ""
    if metric == "makespan_s" and st == "OOM":
        return "OOM" + mark
    if metric == "total_time_s":
        t = r.get("placement_time_s")
        if t is None:
            return "-"
        return _fmt_num(t + (r.get("coarsen_time_s") or 0.0)) + mark
    return _fmt_num(r.get(metric)) + mark


CAVEAT_MARK = "†"
"""Marks a cell whose algorithm did not run as its paper describes (the
row's ``caveat``, from the placement's estimate: a smoke budget, a greedy
fallback, a returned warm start); every table lists the caveats under it."""


def caveat_lines(rows: list[dict], algorithms: list[str] | None = None) -> list[str]:
    """``"† COLUMN on GRAPHS: CAVEAT"`` for the rows with a caveat (one line
    per column and caveat, naming its graphs).

    Example
    -------
    >>> caveat_lines([{"algorithm": "m-sct", "graph": "g", "graph_file": "g.json", "status": "OK",
    ...                "caveat": "greedy favourite children"}])
    ['† m-sct on g: greedy favourite children']
    """
    seen: dict[tuple[str, str], list[str]] = {}
    for r in sort_rows(rows, algorithms):
        if r.get("caveat") and r.get("status") in OK_STATUSES:
            seen.setdefault((column_label(r), str(r["caveat"])), []).append(str(r.get("graph")))
    return [f"{CAVEAT_MARK} {a} on {', '.join(dict.fromkeys(gs))}: {c}" for (a, c), gs in seen.items()]


def columns(rows: list[dict], algorithms: list[str] | None = None) -> list[str]:
    """Column labels (:func:`~.rows.column_label`): the *algorithms* in
    their order, then any other algorithm found in *rows*; for each
    coarsening method (the original graph first) when rows mix them.

    Example
    -------
    >>> columns([{"algorithm": "heft", "coarsen": "cpd"}], ["adjusting", "heft"])
    ['cpd+adjusting', 'cpd+heft']
    """
    algos = list(algorithms or [])
    for r in rows:
        if r.get("algorithm") not in algos:
            algos.append(r["algorithm"])
    methods = sorted({r.get("coarsen") or "" for r in rows}) or [""]
    present = {(r.get("coarsen") or "", r.get("algorithm")) for r in rows}
    return [column_label({"algorithm": a, "coarsen": m}) for m in methods for a in algos
            if len(methods) == 1 or (m, a) in present]


def matrix(rows: list[dict], metric: str = "makespan_s", algorithms: list[str] | None = None) -> dict:
    """The Table-3 layout of *rows*: ``{"columns": [...], "rows": [{"graph",
    "cluster", "cells": {column: text}, "best": column|None, "second":
    column|None, "speedup": 1 - best/second or None}], "multi_cluster":
    bool}``; a row per (graph, cluster), a column per algorithm
    (``cpd+adjusting`` for one placed on the cpd coarse graph, see
    :func:`columns`).

    For ``metric="makespan_s"`` the best is the smallest makespan among
    cells that are neither OOM nor failed (Celeritas Table 3 shows OOM
    instead of a time) and ``speedup`` compares it with the second best.
    ``metric="total_time_s"`` is coarsening + placement time (Table 4).
    """
    rows = sort_rows(rows, algorithms)
    cols = columns(rows, algorithms)
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r.get("graph_file"), r.get("cluster")), {})[column_label(r)] = r
    clusters = {k[1] for k in groups}
    out_rows = []
    for (gf, cl), cells in groups.items():
        name = next((c.get("graph") for c in cells.values() if c.get("graph")), graph_stem(str(gf)))
        ranked = []
        if metric == "makespan_s":
            ranked = sorted(((c["makespan_s"], cols.index(a), a) for a, c in cells.items()
                             if c.get("status") == "OK" and c.get("makespan_s") is not None))
        best = ranked[0][2] if ranked else None
        second = ranked[1][2] if len(ranked) > 1 else None
        speedup = None
        if len(ranked) > 1 and ranked[1][0] > 0:
            speedup = 1.0 - ranked[0][0] / ranked[1][0]
        methods = {c.get("coarsen") for c in cells.values()}
        out_rows.append({"graph": name, "graph_file": gf, "cluster": cl,
                         "coarsen": next(iter(methods)) if len(methods) == 1 else None,
                         "nodes": next((c.get("nodes") for c in cells.values() if c.get("nodes")), None),
                         "cells": {a: _cell_text(cells.get(a), metric) for a in cols},
                         "best": best, "second": second, "speedup": speedup})
    return {"columns": cols, "rows": out_rows, "multi_cluster": len(clusters) > 1}


def coarse_note(rows: list[dict]) -> str | None:
    """What a ``cpd+X`` column means, or None without coarse rows."""
    methods = sorted({str(r["coarsen"]) for r in rows if r.get("coarsen")})
    if not methods:
        return None
    return "; ".join(f"{m}+X: X placed on the {m} coarse graph" for m in methods) + ", simulated on the original"


def _failed_lines(rows: list[dict], algorithms: list[str] | None) -> list[str]:
    return [f"{r['status']}: {Path(str(r.get('graph_file'))).name} / {r.get('cluster')} / {column_label(r)}: "
            f"{r.get('error')}" for r in sort_rows(rows, algorithms) if r.get("status") in FAILED_STATUSES]


def _speedup_text(m_row: dict) -> str:
    if m_row["speedup"] is None:
        return "-"
    return f"{100 * m_row['speedup']:.1f}% over {m_row['second']}"


TABLES = (("makespan_s", "Simulated makespan (s) per training step, lower is better"),
          ("total_time_s", "Placement generation time (s), coarsening included"),
          ("makespan_over_lb", "Makespan / lower bound"))


def _table_titles(metrics: Iterable[str] | None = None) -> list[tuple[str, str]]:
    return [(m, t) for m, t in TABLES if metrics is None or m in metrics]


#: width of ``--format table`` when it goes to a file or a pipe (and ``$COLUMNS`` is not set)
DEFAULT_WIDTH = 120


def table_width(to_terminal: bool) -> int:
    """The width ``--format table`` must fit: ``$COLUMNS`` when set, else
    the terminal's width when the table goes to one, else
    :data:`DEFAULT_WIDTH`."""
    import os
    import shutil

    try:
        cols = int(os.environ.get("COLUMNS", ""))
        if cols > 20:
            return cols
    except ValueError:
        pass
    if to_terminal:
        return max(40, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
    return DEFAULT_WIDTH


def _grid(m: dict, metric: str, transposed: bool, color: bool, folded: bool = False
          ) -> tuple[list[str], list[str], list[tuple]]:
    """One table of :func:`matrix` *m* as ``(label headers, column headers,
    [(labels, cells), ...])``: graphs as rows and algorithms as columns, or
    *transposed* (algorithms as rows, one column per graph, the speed-up in
    two last rows).  The best makespan is bold (``*`` in plain text).
    *folded*: names in the column headers (and the second best's) on
    several lines, as narrow as the column's values (:func:`fold`)."""
    def mark(text: str, best: bool) -> str:
        if not best:
            return escape(text) if color else text
        return f"[bold]{escape(text)}[/bold]" if color else f"{text}*"

    def graph_label(mr: dict) -> str:
        return f"{mr['graph']}\n{mr['cluster']}" if m["multi_cluster"] else mr["graph"]

    def width(texts: Iterable[str]) -> int:  # a column's room: its values, at least FOLD_MIN
        return max([FOLD_MIN] + [_text_width(t) for t in texts]) if folded else 10**6

    speed = metric == "makespan_s"
    if not transposed:
        heads = ["Graph"] + (["Cluster"] if m["multi_cluster"] else [])
        body = [([mr["graph"]] + ([mr["cluster"]] if m["multi_cluster"] else []),
                 [mark(mr["cells"][c], c == mr["best"]) for c in m["columns"]]
                 + ([_speedup_text(mr)] if speed else [])) for mr in m["rows"]]
        cols = [fold(c, width(mr["cells"][c] + "*" for mr in m["rows"])) for c in m["columns"]]
        return heads, cols + (["Speed up"] if speed else []), body
    body = [([c], [mark(mr["cells"][c], c == mr["best"]) for mr in m["rows"]]) for c in m["columns"]]
    room = [width([mr["cells"][c] + "*" for c in m["columns"]] + ["100.0%"]) for mr in m["rows"]]
    if speed:
        body.append((["speed-up"], [f"{100 * mr['speedup']:.1f}%" if mr["speedup"] is not None else "-"
                                    for mr in m["rows"]]))
        body.append((["over (2nd best)"], [fold(mr["second"] or "-", w) for mr, w in zip(m["rows"], room)]))
    return ["Algorithm"], [fold(graph_label(mr), w) for mr, w in zip(m["rows"], room)], body


#: names in a column header (and the second best's in the transposed table) fold to the column's
#: values' width, but not below this
FOLD_MIN = 8


def fold(text: str, width: int, breaks: str = "_-") -> str:
    """*text* on lines of at most *width* cells, broken after ``_`` or
    ``-`` (a piece longer than *width* stays whole); existing line breaks
    are kept.

    Example
    -------
    >>> fold("tensor_holography_b32", 11)
    'tensor_\\nholography_\\nb32'
    >>> fold("data-parallel", 8), fold("heft", 3), fold("gpt_1.3b_b8", 8)
    ('data-\\nparallel', 'heft', 'gpt_\\n1.3b_b8')
    """
    out = []
    for line in text.split("\n"):
        pieces, cur = [], ""
        for ch in line:
            cur += ch
            if ch in breaks:
                pieces.append(cur)
                cur = ""
        if cur:
            pieces.append(cur)
        lines = [""]
        for piece in pieces:
            if lines[-1] and len(lines[-1]) + len(piece) > width:
                lines.append("")
            lines[-1] += piece
        out.extend(lines)
    return "\n".join(out)


def escape(text: str) -> str:
    """*text* safe inside rich markup."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _text_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


def _column_widths(heads: list[str], cols: list[str], body: list[tuple]) -> tuple[list[int], list[int]]:
    """Natural widths of the label columns and the data columns (text only)."""
    lw = [max([_text_width(h)] + [_text_width(labels[i]) for labels, _ in body]) for i, h in enumerate(heads)]
    cw = [max([_text_width(c)] + [_text_width(cells[j]) for _, cells in body]) for j, c in enumerate(cols)]
    return lw, cw


def table_fits(heads: list[str], cols: list[str], body: list[tuple], width: int) -> bool:
    """Whether the table fits *width* columns: each column takes its text
    plus two of padding and one of border, plus one border at the end."""
    lw, cw = _column_widths(heads, cols, body)
    return sum(w + 3 for w in lw + cw) + 1 <= width


def _chunks(heads: list[str], cols: list[str], body: list[tuple], width: int) -> list[list[int]]:
    """The data columns in consecutive groups that fit *width* with the
    label columns repeated (a column wider than the rest of the line gets a
    group of its own)."""
    lw, cw = _column_widths(heads, cols, body)
    room = width - sum(w + 3 for w in lw) - 1
    groups: list[list[int]] = [[]]
    used = 0
    for j, w in enumerate(cw):
        if groups[-1] and used + w + 3 > room:
            groups.append([])
            used = 0
        groups[-1].append(j)
        used += w + 3
    return groups


def table_layout(m: dict, width: int) -> tuple[bool, bool]:
    """``(transposed, folded)`` for the tables of *m* to fit *width*: the
    first of graphs as rows, the same with the names in the headers folded,
    algorithms as rows, the same folded, that fits the makespan table (the
    widest); when none does, folded, and algorithms as rows when there are
    at least as many algorithms as graphs (fewer column groups)."""
    for transposed in (False, True):
        for folded in (False, True):
            if table_fits(*_grid(m, "makespan_s", transposed, False, folded), width):
                return transposed, folded
    return len(m["columns"]) >= len(m["rows"]), True


def format_table(rows: list[dict], algorithms: list[str] | None = None, *, color: bool = False,
                 width: int = DEFAULT_WIDTH) -> str:
    """Plain-text (or, with *color*, ANSI) tables like Celeritas Tables 3 and
    4, rendered with rich: makespan, placement time, makespan / LB.  The
    best makespan is bold (``*`` in plain text); the speed-up of the best
    over the second best ends each row.  Fits *width* columns: graphs as
    rows when they fit, else algorithms as rows (:func:`table_layout`), and
    columns split into groups (label column repeated) when even that is too
    wide."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=color, no_color=not color, width=width, highlight=False,
                      color_system="standard" if color else None)
    transposed, folded = table_layout(matrix(rows, "makespan_s", algorithms), width)
    for metric, title in _table_titles():
        m = matrix(rows, metric, algorithms)
        caption = None
        if metric == "makespan_s":
            caption = ("best in bold" if color else "best marked *") + "; OOM: a device over memory"
            if transposed:
                caption += f"; algorithms as rows (graphs as rows would not fit {width} columns)"
            if coarse_note(rows):
                caption += f"; {coarse_note(rows)}"
        heads, cols, body = _grid(m, metric, transposed, color, folded)
        groups = _chunks(*_grid(m, metric, transposed, False, folded), width)  # plain text: what the columns hold
        for gi, group in enumerate(groups):
            part = f" ({gi + 1}/{len(groups)})" if len(groups) > 1 else ""
            t = Table(title=escape(title + part), caption=caption if gi == len(groups) - 1 else None,
                      title_justify="left", caption_justify="left")
            for h in heads:
                t.add_column(escape(h), no_wrap=True)
            for j in group:
                t.add_column(escape(cols[j]), justify="right")
            for labels, cells in body:
                t.add_row(*[escape(x) for x in labels], *[cells[j] if color else escape(cells[j]) for j in group])
            console.print(t)
        for line in caveat_lines(rows, algorithms):
            console.print(line, markup=False, highlight=False)
        console.print()
    for line in _failed_lines(rows, algorithms):
        console.print(line, markup=False, highlight=False)
    return buf.getvalue()


def format_markdown(rows: list[dict], algorithms: list[str] | None = None,
                    metrics: Iterable[str] | None = None) -> str:
    """GitHub-flavoured Markdown tables (best in **bold**); *metrics*
    selects among ``makespan_s``, ``total_time_s``, ``makespan_over_lb``
    (default: all three)."""
    out = []
    for metric, title in _table_titles(metrics):
        m = matrix(rows, metric, algorithms)
        head = ["Graph"] + (["Cluster"] if m["multi_cluster"] else []) + m["columns"]
        if metric == "makespan_s":
            head.append("Speed up")
        out.append(f"**{title}**\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join([":---"] * (2 if m["multi_cluster"] else 1)
                                  + ["---:"] * len(m["columns"])
                                  + (["---:"] if metric == "makespan_s" else [])) + "|")
        for mr in m["rows"]:
            cells = [f"**{mr['cells'][c]}**" if c == mr["best"] else mr["cells"][c] for c in m["columns"]]
            first = [mr["graph"]] + ([mr["cluster"]] if m["multi_cluster"] else [])
            last = [_speedup_text(mr)] if metric == "makespan_s" else []
            out.append("| " + " | ".join(_md_escape(x) for x in first + cells + last) + " |")
        if metric == "makespan_s" and coarse_note(rows):
            out.append(f"\n{coarse_note(rows)}.")
        notes = caveat_lines(rows, algorithms)
        if notes:
            out += [""] + [_md_escape(x) + "  " for x in notes]
        out.append("")
    failed = _failed_lines(rows, algorithms)
    if failed:
        out.append("Failed cells:\n")
        out.extend(f"- {_md_escape(line)}" for line in failed)
        out.append("")
    return "\n".join(out)


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


#: significant digits of the floats in CSV output (``--format csv``)
CSV_DIGITS = 6


def csv_value(x):
    """A CSV field: ``""`` for None, a float to :data:`CSV_DIGITS`
    significant digits in its shortest form, anything else as it is.

    Example
    -------
    >>> csv_value(0.0008122929999999998), csv_value(47101732), csv_value(2.0), csv_value(None)
    ('0.000812293', 47101732, '2.0', '')
    """
    if x is None:
        return ""
    if isinstance(x, float) and math.isfinite(x):
        return repr(float(f"{x:.{CSV_DIGITS}g}"))
    return x


def format_csv(rows: list[dict], algorithms: list[str] | None = None) -> str:
    """One CSV line per cell (long format), columns :data:`~.rows.CSV_FIELDS`,
    floats to :data:`CSV_DIGITS` significant digits."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in sort_rows(rows, algorithms):
        w.writerow({k: csv_value(r.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


def render(fmt: str, rows: list[dict], algorithms: list[str] | None = None, *, color: bool = False,
           width: int = DEFAULT_WIDTH) -> str:
    """*rows* as ``table`` (fitting *width* columns), ``csv`` or ``markdown`` text."""
    if fmt == "table":
        return format_table(rows, algorithms, color=color, width=width)
    if fmt == "csv":
        return format_csv(rows, algorithms)
    if fmt == "markdown":
        return format_markdown(rows, algorithms)
    raise ValueError(f"unknown format {fmt!r}")
