"""The result row of one comparison cell (``placer.compare/v1``): its fields,
its identity, and the orders and groupings every output uses.

A row is a flat dict, one per (graph, cluster, algorithm, coarsening method,
seed).  Fields whose name starts with ``_`` are private to one run (the
placement kept for ``--plot``, the cell's captured stderr) and never written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROW_SCHEMA = "placer.compare/v1"
GRAPH_SCHEMA = "placer.graph/v1"
OK_STATUSES = ("OK", "OOM")
FAILED_STATUSES = ("error", "timeout")
CSV_FIELDS = ("graph", "graph_file", "nodes", "edges", "cluster", "devices", "algorithm", "coarsen",
              "coarse_nodes", "seed", "status", "makespan_s", "lower_bound_s", "makespan_over_lb",
              "utilisation", "transfers", "transfer_bytes", "placement_time_s", "coarsen_time_s",
              "simulate_time_s", "estimate_status", "estimate_makespan_s", "caveat", "error")


def graph_stem(path: str) -> str:
    """``dir/nmt.json.gz`` -> ``nmt``.

    Example
    -------
    >>> graph_stem("big/nmt.json.gz")
    'nmt'
    """
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def natural_key(text: str) -> tuple:
    """``layered_60`` before ``layered_300``: digit runs compare as numbers.

    Example
    -------
    >>> sorted(["g_300", "g_60"], key=natural_key)
    ['g_60', 'g_300']
    """
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text))


def cell_key(row: dict) -> tuple:
    """Identity of a cell in a result row: (graph file, cluster, algorithm,
    coarsening method, seed) - what ``--resume`` matches on."""
    return (os.path.normpath(str(row.get("graph_file", ""))), str(row.get("cluster", "")),
            str(row.get("algorithm", "")), row.get("coarsen") or None, int(row.get("seed") or 0))


def column_label(row: dict) -> str:
    """The column a row is shown in: its algorithm, prefixed by the
    coarsening method when it placed a coarse graph.

    Example
    -------
    >>> column_label({"algorithm": "adjusting", "coarsen": "cpd"}), column_label({"algorithm": "heft"})
    ('cpd+adjusting', 'heft')
    """
    method = row.get("coarsen")
    return f"{method}+{row.get('algorithm')}" if method else str(row.get("algorithm"))


def group_key(row: dict) -> tuple:
    """The table row a result belongs to: (graph file, cluster, coarsening method)."""
    return (row.get("graph_file"), row.get("cluster"), row.get("coarsen"))


def sort_rows(rows: list[dict], algorithms: list[str] | None = None) -> list[dict]:
    """Rows in (graph file, cluster, algorithm) order - file names in natural
    order (numbers by value); algorithms in the order given, unknown ones
    after, by name."""
    pos = {a: i for i, a in enumerate(algorithms or [])}
    return sorted(rows, key=lambda r: (natural_key(str(r.get("graph_file"))), str(r.get("cluster")),
                                       str(r.get("coarsen") or ""),
                                       pos.get(r.get("algorithm"), len(pos)), str(r.get("algorithm")),
                                       int(r.get("seed") or 0)))


def best_rows(rows: list[dict]) -> dict[tuple, dict]:
    """Per (graph file, cluster, coarsen): the row with the smallest
    makespan among those without OOM or failure (ties: first algorithm)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") != "OK" or r.get("makespan_s") is None:
            continue
        key = group_key(r)
        if key not in best or r["makespan_s"] < best[key]["makespan_s"]:
            best[key] = r
    return best
