"""One comparison cell: load the graph (and coarsen it), place it with one
registered algorithm, time the placement, simulate it on the original graph
and return the result row.  A failing algorithm never raises out of
:func:`run_cell`: its row says ``status: "error"`` and why.

References
----------
Celeritas 6.3 and Table 4 (placement generation time, coarse graph
generation included); the simulated makespan stands in for the measured
step time (docs/design.md: the simulator is the judge).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import orjson

from .. import registry
from ..errors import PlacerError, TimeLimit
from ..log import quiet
from .rows import ROW_SCHEMA, graph_stem
from .tasks import Task


class _Cache:
    """Per-process cache of the last graphs, clusters and coarse graphs
    (cells of one graph usually run back to back in one worker)."""

    def __init__(self, size: int = 2):
        self.size = size
        self.items: dict[tuple, Any] = {}

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key in self.items:
            value = self.items.pop(key)
        else:
            value = make()
        self.items[key] = value
        while len(self.items) > self.size:
            self.items.pop(next(iter(self.items)))
        return value


_GRAPHS = _Cache(2)
_COARSE = _Cache(4)
_CLUSTERS = _Cache(8)


def _file_stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    except OSError:
        return (os.path.abspath(path), 0, 0)


def base_row(task: Task) -> dict:
    """The row of *task* with every result field empty."""
    return {"schema": ROW_SCHEMA, "graph": graph_stem(task.graph_file), "graph_file": task.graph_file,
            "nodes": None, "edges": None, "cluster": task.cluster, "devices": len(task.cluster_doc.get("devices", [])),
            "algorithm": task.algorithm, "coarsen": task.coarsen, "coarse_nodes": None, "seed": task.seed,
            "params": task.params, "status": None, "makespan_s": None, "lower_bound_s": None,
            "makespan_over_lb": None, "utilisation": None, "transfers": None, "transfer_bytes": None,
            "placement_time_s": None, "coarsen_time_s": None, "simulate_time_s": None,
            "estimate_status": None, "estimate_makespan_s": None, "caveat": None, "error": None}


def failed_row(task: Task, status: str, message: str) -> dict:
    """The row of a cell that produced no result (timeout, dead worker)."""
    row = base_row(task)
    row.update(status=status, error=message)
    return row


def phase_limit(time_limit: float) -> float:
    """Seconds one phase of a cell may take: the limit + 2 s + 10 %.

    Example
    -------
    >>> phase_limit(10.0)
    13.0
    """
    return time_limit * 1.1 + 2.0


def run_cell(task: Task, phase: Callable[[str], None] | None = None,
             graph_bytes: bytes | None = None) -> dict:
    """Run one cell and return its result row; never raises for a failing
    algorithm (the row says ``status: "error"`` and why).

    Parameters
    ----------
    task : Task
        The cell.
    phase : callable, optional
        Called with ``"load"``, ``"place"``, ``"simulate"`` as each phase
        starts (the process executor resets the cell's deadline on each).
    graph_bytes : bytes, optional
        The graph file's content (Ray workers get it from the object store).

    Returns
    -------
    dict
        A ``placer.compare/v1`` row.  ``placement_time_s`` is the wall time
        of the algorithm alone (Celeritas Table 4); ``coarsen_time_s`` that
        of building the coarse graph (measured once per graph and cluster in
        a process, reused by later cells).  What the cell printed (stdout
        and stderr, Python-level; progress lines only when
        ``task.verbose``) is in the private field ``_log``, for the caller
        to show without breaking its progress bar.
    """
    row = base_row(task)
    captured = io.StringIO()  # stdout carries only the comparison's output
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured), quiet(not task.verbose):
        _run_cell(task, row, phase or (lambda _p: None), graph_bytes)
    if captured.getvalue().strip():
        row["_log"] = captured.getvalue()
    return row


def _run_cell(task: Task, row: dict, phase: Callable[[str], None], graph_bytes: bytes | None) -> dict:
    step = ["load"]  # the phase a failure is reported in
    try:
        phase("load")
        graph, gkey, cluster = _load(task, graph_bytes)
        row.update(graph=graph.name, nodes=graph.n, edges=graph.m)
        work = graph
        if task.coarsen:
            step[0] = f"coarsen {task.coarsen}"
            work, t_coarse = _coarse(task, graph, gkey, cluster)
            row.update(coarse_nodes=work.n, coarsen_time_s=t_coarse)
        step[0] = "place"
        phase("place")
        placement = _place(task, work, cluster, row)
        step[0] = "simulate"
        phase("simulate")
        _simulate(task, graph, cluster, placement, row)
    except TimeLimit as exc:  # the registry stopped the algorithm at its limit (model/clock.py)
        row.update(status="timeout", error=f"{step[0]}: {exc}")
    except PlacerError as exc:
        row.update(status="error", error=f"{step[0]}: {exc}")
    except MemoryError:
        row.update(status="error", error=f"{step[0]}: out of host memory")
    except Exception as exc:  # a bug in one algorithm must not stop the batch
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        row.update(status="error", error=f"{step[0]}: {type(exc).__name__}: {exc}{where}")
    return row


def _load(task: Task, graph_bytes: bytes | None):
    """The graph (cached by file stamp), its cache key, and the cluster."""
    from ..model.cluster import Cluster
    from ..model.graph import Graph
    from ..model.jsonio import loads, unpack

    if graph_bytes is not None:
        graph_bytes = unpack(graph_bytes, task.graph_file)  # gunzipped, within the size cap
        graph = Graph.from_dict(loads(graph_bytes, task.graph_file), task.graph_file)
        gkey: tuple = ("bytes", task.graph_file, len(graph_bytes))
    else:
        gkey = _file_stamp(task.graph_file)
        graph = _GRAPHS.get(gkey, lambda: _load_graph(task.graph_file))
    cluster = _CLUSTERS.get((task.cluster, orjson.dumps(task.cluster_doc, option=orjson.OPT_SORT_KEYS)),
                            lambda: Cluster.from_dict(task.cluster_doc, task.cluster))
    return graph, gkey, cluster


def _load_graph(path: str):
    from ..model.io import load_graph

    return load_graph(path)


def _coarse(task: Task, graph, gkey: tuple, cluster):
    """The coarse graph and the seconds it took to build (cached: cells of
    one graph and cluster share it)."""
    ckey = (gkey, task.cluster, task.coarsen, orjson.dumps(task.coarsen_params, option=orjson.OPT_SORT_KEYS))

    def make_coarse():
        t0 = time.perf_counter()
        cg = registry.coarsen(graph, cluster, task.coarsen, params=task.coarsen_params)
        return cg, time.perf_counter() - t0

    return _COARSE.get(ckey, make_coarse)


def _place(task: Task, work, cluster, row: dict):
    placement = registry.place(work, cluster, task.algorithm, seed=task.seed, params=task.params)
    row["placement_time_s"] = placement.placement_time_s
    # the algorithm's own status, with the graph it holds for ("OPTIMAL (coarse graph)")
    row["estimate_status"] = placement.estimate.label()
    est = placement.estimate.makespan_s
    row["estimate_makespan_s"] = est if isinstance(est, (int, float)) and math.isfinite(est) else None
    row["caveat"] = placement.estimate.get("caveat")
    return placement


def _simulate(task: Task, graph, cluster, placement, row: dict) -> None:
    from ..sim.simulator import simulate

    t0 = time.perf_counter()
    report = simulate(graph, cluster, placement, congestion=task.congestion, label=f"{task.algorithm} placement",
                      memory=task.memory)
    row["simulate_time_s"] = time.perf_counter() - t0
    devs = report["devices"]
    row.update(status=report["status"], makespan_s=report["makespan_s"], lower_bound_s=report["lower_bound_s"],
               makespan_over_lb=report["makespan_over_lb"],
               utilisation=(sum(d["utilisation"] for d in devs) / len(devs)) if devs else None,
               transfers=report["transfers"]["count"], transfer_bytes=report["transfers"]["bytes"])
    if task.keep_placement:
        row["_placement"] = placement.to_dict()
