"""Planning a comparison: one :class:`Task` per cell (graph x cluster x
algorithm), each algorithm's parameters resolved and checked before any
cell runs, and the cells an earlier run (``--resume``) already did left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from ..model.congestion import DEFAULT_CONGESTION
from .rows import FAILED_STATUSES, cell_key


@dataclass
class Task:
    """One cell of the comparison.  ``cluster_doc`` is the cluster document
    (small, shipped with the task); the graph is read from ``graph_file``.
    ``verbose`` lets the algorithm print its progress lines (cells run
    quietly otherwise, :func:`celeritas_cli.log.quiet`)."""

    graph_file: str
    cluster: str
    cluster_doc: dict
    algorithm: str
    coarsen: str | None = None
    coarsen_params: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    seed: int = 0
    time_limit: float | None = None
    congestion: str = DEFAULT_CONGESTION
    keep_placement: bool = False
    verbose: bool = False
    memory: str = "time"

    @property
    def key(self) -> tuple:
        return cell_key({"graph_file": self.graph_file, "cluster": self.cluster, "algorithm": self.algorithm,
                         "coarsen": self.coarsen, "seed": self.seed})

    def label(self) -> str:
        via = f" (coarsen {self.coarsen})" if self.coarsen else ""
        return f"{Path(self.graph_file).name} / {self.cluster} / {self.algorithm}{via}"


def algorithm_params(algo: str, common: dict[str, Any], per_algo: dict[str, dict[str, Any]],
                     time_limit: float | None, quick: bool = False, congestion: str | None = None) -> dict[str, Any]:
    """Parameters for *algo*: its ``quick_params`` when *quick*, then the
    *common* ones it declares (others are ignored: they belong to other
    algorithms), then ``per_algo[algo]`` (all must exist), and the flags
    ``time_limit`` and *congestion* (the judge's link rule, so it plans for
    the link model it is judged under) where the algorithm declares them and
    none was given (:func:`celeritas_cli.registry.with_flags`, as ``placer
    place``).

    Raises
    ------
    InvalidInput
        An unknown or ill-typed parameter (before any cell runs).

    Example
    -------
    >>> algorithm_params("dpos", {}, {}, None, congestion="none")
    {'congestion': 'none'}
    >>> algorithm_params("heft", {}, {}, None, congestion="none")   # plans without link contention anyway
    {}
    >>> algorithm_params("dpos", {"congestion": "port"}, {}, None, congestion="none")
    {'congestion': 'port'}
    """
    entry = registry.get(algo)
    out: dict[str, Any] = {}
    if quick:  # a quick time_limit wins over the cell's (it is meant to be short)
        out.update(entry.quick_params)
    out.update({k: v for k, v in common.items() if k in entry.params})
    out.update(per_algo.get(algo, {}))
    out, _ = registry.with_flags(entry, out, time_limit=time_limit, congestion=congestion)
    entry.coerce(out)  # reject unknown / ill-typed parameters before any cell runs
    return out


def make_tasks(graph_files: list[str], clusters: list, algorithms: list[str], *,
               coarsen: str | None = None, coarsen_params: dict | None = None,
               common_params: dict | None = None, per_algo_params: dict | None = None,
               seed: int = 0, time_limit: float | None = None, congestion: str = DEFAULT_CONGESTION,
               quick: bool = False, keep_placement: bool = False, verbose: bool = False,
               memory: str = "time") -> list[Task]:
    """The cells, in (graph, cluster, algorithm) order.  *clusters* are
    :class:`~celeritas_cli.model.cluster.Cluster` objects.  Every cell is
    judged under *congestion* and the memory rule *memory*, and algorithms
    with a ``congestion`` parameter plan for it (:func:`algorithm_params`).

    Raises
    ------
    InvalidInput
        A bad algorithm or coarsening parameter.
    """
    params = {a: algorithm_params(a, common_params or {}, per_algo_params or {}, time_limit, quick, congestion)
              for a in algorithms}
    if coarsen is not None:
        registry.get_coarsener(coarsen).coerce(coarsen_params or {})
    tasks = []
    for gf in graph_files:
        for cl in clusters:
            doc = cl.to_dict()
            for a in algorithms:
                tasks.append(Task(gf, cl.name, doc, a, coarsen, dict(coarsen_params or {}), params[a], seed,
                                  time_limit, congestion, keep_placement, verbose, memory))
    return tasks


def kept_rows(previous: list[dict] | None, retry_failed: bool = False) -> list[dict]:
    """The rows of an earlier run that stand (``--resume``): all of them,
    except failed ones (error/timeout) when *retry_failed*."""
    return [r for r in previous or [] if not (retry_failed and r.get("status") in FAILED_STATUSES)]


def tasks_to_run(tasks: list[Task], kept: list[dict]) -> list[Task]:
    """*tasks* whose cell is not among the *kept* rows."""
    done = {cell_key(r) for r in kept}
    return [t for t in tasks if t.key not in done]
