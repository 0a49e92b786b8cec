"""``placer compare --format html``: the whole comparison as one
self-contained page (:mod:`celeritas_cli.report`).

* the results tables of :func:`~.formats.matrix` (Celeritas Table 3: the
  makespan, best per row highlighted, OOM, † caveats and the speed-up of the
  best over the second; Table 4: placement time; makespan / lower bound),
  sortable by any column, each cell a link to that cell's row below;
* makespan / lower bound and placement time per algorithm, one dot per
  graph (strip plots, the time on a log axis);
* every cell with its numbers, its caveat or error and its placement - a
  ``.placement.json.gz`` embedded in the page (``placer simulate G -P FILE``
  reads it; ``split_graph`` is left out, simulate rebuilds it from the
  recipe) - for the cells run in this invocation (resumed rows have none);
* the best placement of each graph and cluster as on ``placer simulate
  --format html``: Gantt chart, memory over time, links, critical path.
"""

from __future__ import annotations

import base64
import gzip
import re
from collections import Counter

import orjson

from ..report.charts import strip_plot
from ..report.page import FIXED, esc, fmt_bytes, fmt_s, kpis, page, table, td
from ..report.placement import placement_sections
from .formats import CAVEAT_MARK, TABLES, caveat_lines, columns, matrix
from .plots import ALGO_PALETTE
from .rows import FAILED_STATUSES, cell_key, column_label, graph_stem, natural_key, sort_rows


def _cell_ids(rows: list[dict]) -> dict[tuple, str]:
    """An HTML id per cell (``cell-1``, ...), in the tables' row order."""
    return {cell_key(r): f"cell-{i + 1}" for i, r in enumerate(rows)}


def _by_group(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        out.setdefault((r.get("graph_file"), r.get("cluster")), {})[column_label(r)] = r
    return out


def _value(row: dict | None, metric: str) -> float | None:
    if row is None or row.get("status") in FAILED_STATUSES:
        return None
    if metric == "total_time_s":
        t = row.get("placement_time_s")
        return None if t is None else t + (row.get("coarsen_time_s") or 0.0)
    return row.get(metric)


def _result_cell(r: dict | None, text: str, best: bool, metric: str, ids: dict[tuple, str]) -> str:
    """One cell of a results table: its text linking to its row under Cells,
    its sort value (OOM after every time, failed cells last), best / OOM /
    failed styling and a tooltip with its status, caveat or error."""
    if r is None:
        return td("", "x", cls="failed")
    status = r.get("status")
    cls = "best" if best else "oom" if status == "OOM" else "failed" if status in FAILED_STATUSES else ""
    tip = f"{column_label(r)} on {r.get('graph')}: {status}"
    if r.get("caveat"):
        tip += f"\n{CAVEAT_MARK} {r['caveat']}"
    if r.get("error"):
        tip += f"\n{r['error']}"
    value = _value(r, metric)
    sort = value if value is not None and status == "OK" else (1e300 if status == "OOM" else "x")
    return td(f'<a href="#{ids[cell_key(r)]}">{esc(text)}</a>', sort, cls=cls, tip=tip, raw=True)


def transposed(m: dict) -> bool:
    """Algorithms as rows when there are more of them than graph rows (the
    table then fits a screen, and sorting a graph's column ranks the
    algorithms on it); else graphs as rows, like Celeritas Table 3."""
    return len(m["columns"]) > len(m["rows"])


def results_table(rows: list[dict], algorithms: list[str], metric: str, ids: dict[tuple, str]) -> str:
    """One Table-3 layout as a sortable HTML table (:func:`transposed`
    decides the orientation): the best makespan highlighted, OOM and failed
    cells marked, † on a caveat (its text on hover), each cell a link to its
    row under Cells, the speed-up of the best over the second best."""
    m = matrix(rows, metric, algorithms)
    groups = _by_group(rows)
    speed = metric == "makespan_s"
    multi = m["multi_cluster"]

    def cell(mr: dict, c: str) -> str:
        return _result_cell(groups.get((mr["graph_file"], mr["cluster"]), {}).get(c), mr["cells"][c],
                            c == mr["best"], metric, ids)

    def graph_td(mr: dict) -> str:
        return td(mr["graph"] + (f" on {mr['cluster']}" if multi else ""),
                  tip=f"{mr['graph_file']} ({mr.get('nodes') or '?'} nodes)")

    out = []
    if transposed(m):
        heads = ["algorithm"] + [mr["graph"] + (f" on {mr['cluster']}" if multi else "") for mr in m["rows"]]
        for c in m["columns"]:
            out.append([td(c)] + [cell(mr, c) for mr in m["rows"]])
        if speed:
            out.append([FIXED, td("speed-up of the best")] + [td(f"{100 * mr['speedup']:.1f}%" if mr["speedup"]
                                                                is not None else "-") for mr in m["rows"]])
            out.append([FIXED, td("over (second best)")] + [td(mr["second"] or "-") for mr in m["rows"]])
        html = table(heads, out, cls="sticky")
    else:
        heads = ["graph"] + (["speed-up of the best"] if speed else []) + m["columns"]
        for mr in m["rows"]:
            line = [graph_td(mr)]
            if speed:
                sp = mr["speedup"]
                line.append(td(f"{100 * sp:.1f}% over {mr['second']}" if sp is not None else "-",
                               sp if sp is not None else "x"))
            out.append(line + [cell(mr, c) for c in m["columns"]])
        html = table(heads, out, cls="sticky")
    return html


def _plots(rows: list[dict], algorithms: list[str]) -> str:
    cols = columns(rows, algorithms)
    groups = []
    for r in rows:
        label = str(r.get("graph")) + (f" on {r.get('cluster')}" if len({x.get('cluster') for x in rows}) > 1
                                       else "")
        if label not in groups:
            groups.append(label)
    multi = len({x.get("cluster") for x in rows}) > 1

    def points(metric: str, unit: str) -> list[tuple]:
        out = []
        for r in rows:
            v = _value(r, metric)
            if v is None or (metric == "makespan_over_lb" and r.get("status") != "OK"):
                continue
            g = str(r.get("graph")) + (f" on {r.get('cluster')}" if multi else "")
            extra = f", {r['caveat']}" if r.get("caveat") else ""
            out.append((column_label(r), v, g, f"{g} / {column_label(r)}: {v:.4g}{unit}{extra}"))
        return out

    colours = list(ALGO_PALETTE[::3] + ALGO_PALETTE[1::3] + ALGO_PALETTE[2::3])
    return ("<h3>Makespan / lower bound (1 = the bound; OOM and failed cells left out)</h3>"
            + strip_plot(cols, points("makespan_over_lb", ""), groups, colours, "makespan / lower bound",
                         reference=1.0)
            + "<h3>Placement generation time, coarsening included</h3>"
            + strip_plot(cols, points("total_time_s", " s"), groups, colours, "seconds", log=True))


def _download(row: dict, placement: dict | None) -> str:
    """A link that saves the cell's placement (gzipped JSON, in the page)."""
    if placement is None:
        return td("-", tip="no placement kept: a resumed or failed cell")
    doc = {k: v for k, v in placement.items() if k != "split_graph"}
    data = base64.b64encode(gzip.compress(orjson.dumps(doc), mtime=0)).decode()
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", f"{row.get('graph')}__{row.get('cluster')}__{column_label(row)}")
    return td(f'<a download="{esc(name)}.placement.json.gz" href="data:application/gzip;base64,{data}">'
              f"placement</a>", raw=True, tip="placer simulate GRAPH -P this-file --format html")


def cells_table(rows: list[dict], ids: dict[tuple, str], placements: dict[tuple, dict],
                views: dict[tuple, str]) -> str:
    """Every cell: its numbers, caveat or error, its placement (a download)
    and, for the best of its graph, a link to its charts below."""
    out = []
    for r in rows:
        key = cell_key(r)
        status = r.get("status")
        cls = "oom" if status == "OOM" else "failed" if status in FAILED_STATUSES else ""
        note = r.get("error") or (f"{CAVEAT_MARK} {r['caveat']}" if r.get("caveat") else "")
        view = views.get((r.get("graph_file"), r.get("cluster")))
        best = view is not None and view[1] == key
        line = [f'<td id="{ids[key]}">{esc(r.get("graph"))}</td>', td(r.get("cluster")), td(column_label(r)),
                td(str(status), cls=f"l {cls}".strip()), td(fmt_s(r.get("makespan_s")), r.get("makespan_s")),
                td(fmt_s(r.get("makespan_over_lb")), r.get("makespan_over_lb")),
                td(fmt_s(_value(r, "total_time_s")), _value(r, "total_time_s")),
                _download(r, placements.get(key)),
                td(f'<a href="#{view[0]}">charts</a>' if best else "", raw=True),
                td(note, cls="wrap"),
                td(fmt_s(r.get("lower_bound_s")), r.get("lower_bound_s")),
                td(f"{r['utilisation']:.1%}" if isinstance(r.get("utilisation"), (int, float)) else "-",
                   r.get("utilisation")),
                td(fmt_bytes(r.get("transfer_bytes")), r.get("transfer_bytes")),
                td(str(r.get("estimate_status") or "-"), cls="l")]
        out.append(line)
    return table(["graph", "cluster", "algorithm", "status", "makespan (s)", "makespan / LB", "placed in (s)",
                  "placement", "best", "caveat or error", "lower bound (s)", "utilisation", "transferred",
                  "algorithm's estimate"], out, left=3)


def compare_page(rows: list[dict], algorithms: list[str], placements: dict[tuple, dict] | None = None,
                 best: list[tuple] | None = None, title: str = "placer compare") -> str:
    """The comparison page.

    Parameters
    ----------
    rows : list of dict
        ``placer.compare/v1`` rows (resumed ones included).
    algorithms : list of str
        The compared algorithms, in column order.
    placements : dict, optional
        :func:`~.rows.cell_key` -> placement document, for the cells run now.
    best : list of tuple, optional
        ``(row, graph, cluster, schedule, report, plan)`` per best placement
        (:func:`best_views`), drawn in full at the end.

    Example
    -------
    >>> rows = [{"graph": "g", "graph_file": "g.json", "cluster": "c", "algorithm": "heft", "status": "OK",
    ...          "makespan_s": 2.0, "lower_bound_s": 1.0, "makespan_over_lb": 2.0, "placement_time_s": 0.1}]
    >>> html = compare_page(rows, ["heft"])
    >>> 'class="best"' in html and 'href="#cell-1"' in html and html.count("<svg") == 2
    True
    """
    rows = sort_rows(rows, algorithms)
    placements = placements or {}
    ids = _cell_ids(rows)
    views = {}
    for i, (row, *_rest) in enumerate(best or []):
        views[(row.get("graph_file"), row.get("cluster"))] = (f"best-{i + 1}", cell_key(row))
    graphs = sorted({str(r.get("graph_file")) for r in rows}, key=natural_key)
    clusters = sorted({str(r.get("cluster")) for r in rows})
    status = Counter(r.get("status") for r in rows)
    wins = Counter(mr["best"] for mr in matrix(rows, "makespan_s", algorithms)["rows"] if mr["best"])
    body = [kpis([("cells", str(len(rows)), ""), ("OK", str(status.get("OK", 0)), "ok"),
                  ("OOM", str(status.get("OOM", 0)), "bad" if status.get("OOM") else ""),
                  ("failed or timed out", str(sum(status.get(s, 0) for s in FAILED_STATUSES)),
                   "bad" if any(status.get(s) for s in FAILED_STATUSES) else ""),
                  ("best most often", ", ".join(f"{a} ({n})" for a, n in wins.most_common(3)) or "-", "")])]
    body.append(f'<p class="small muted">Graphs: {esc(", ".join(graph_stem(g) for g in graphs))}. Clusters: '
                f'{esc(", ".join(clusters))}. Click a header to sort; hover a cell for its status and caveat; a '
                f"cell links to its row under Cells.</p>")
    body.append("<h2>Results</h2>")
    body.append('<p class="small muted">the best makespan of each graph highlighted; OOM: a device over memory '
                f"(red); {CAVEAT_MARK}: the algorithm did not run as its paper describes (listed below); click a "
                f"header to sort</p>")
    body.append('<div class="tables">' + "".join(f"<div><h3>{esc(heading)}</h3>"
                                                 f"{results_table(rows, algorithms, metric, ids)}</div>"
                                                 for metric, heading in TABLES) + "</div>")
    notes = caveat_lines(rows, algorithms)
    if notes:
        body.append('<ul class="notes small">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    body.append("<h2>Plots</h2>" + '<div class="scroll">' + _plots(rows, algorithms) + "</div>")
    body.append("<h2>Cells</h2>" + cells_table(rows, ids, placements, views))
    for i, (row, graph, cluster, sched, report, plan) in enumerate(best or []):
        body.append(f'<h2 id="best-{i + 1}">Best placement: {esc(row.get("graph"))} on {esc(row.get("cluster"))} '
                    f"by {esc(column_label(row))}</h2>")
        body.append(placement_sections(graph, cluster, sched, report, plan, prefix=f"best-{i + 1}", level=3))
    sub = (f"{len(graphs)} graph{'s' * (len(graphs) != 1)} x {len(clusters)} cluster{'s' * (len(clusters) != 1)} "
           f"x {len(columns(rows, algorithms))} algorithms, simulated by placer's judge")
    return page(title, "\n".join(body), sub)


def best_views(best: dict[tuple, dict], clusters: dict, congestion: str = "channel", memory: str = "time"
               ) -> list[tuple]:
    """``(row, graph, cluster, schedule, report, plan)`` of each best
    placement (``(graph file, cluster)`` -> row carrying its
    ``_placement``), simulated again on its graph under the cells' link and
    memory rules, in table order."""
    from ..model.io import load_graph
    from ..model.placement import Placement
    from ..sim.describe import describe_placement
    from ..sim.simulator import simulate

    out = []
    for (gf, cl), row in sorted(best.items(), key=lambda kv: (natural_key(str(kv[0][0])), str(kv[0][1]))):
        graph = load_graph(gf)
        sched: list = []
        placement = Placement.from_dict(row["_placement"])
        report = simulate(graph, clusters[cl], placement, congestion=congestion, schedule_out=sched,
                          label=f"{column_label(row)} placement", memory=memory)
        out.append((row, sched[0].graph, clusters[cl], sched[0], report,
                    describe_placement(placement, graph, clusters[cl])))
    return out
