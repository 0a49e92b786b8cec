"""Judging a placement made on a coarse graph on the original graph.

A coarse graph's makespan is not the user's: its nodes run their members
back to back, so the same placement usually simulates to a different
makespan on the original graph (members overlap with transfers), and a
solver's optimum or bound on the coarse graph is no bound on the original.
Issue 18.2/18.3: every number says which graph it holds for, and where the
original graph is known the candidates are judged on it.

The original is known when ``Graph.origin`` is set: by
:func:`celeritas_cli.registry.coarsen` (``compare``, library pipelines), or
by :func:`attach_origin` from the coarse graph's ``meta.coarsened_from_file``
(written by ``placer coarsen GRAPH_FILE``).
"""

from __future__ import annotations

import os
from typing import Sequence

from ..errors import PlacerError
from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from .simulator import check_colocation, run_schedule


def attach_origin(coarse: Graph) -> Graph | None:
    """Load the original graph of *coarse* from ``meta.coarsened_from_file``
    when that file exists, is a valid graph named ``meta.coarsened_from`` and
    holds exactly the coarse graph's member ids; set and return
    ``coarse.origin`` (None when any of that fails: the caller then labels
    the coarse graph's numbers as such)."""
    if coarse.origin is not None or not coarse.is_coarse:
        return coarse.origin
    path = coarse.meta.get("coarsened_from_file")
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    from ..model.io import load_graph

    try:
        original = load_graph(path)
    except (PlacerError, OSError):
        return None
    if original.name != coarse.original_name:
        return None
    members = {i for v in range(coarse.n) for i in coarse.original_ids(v)}
    if len(members) != original.n or any(i not in original.index for i in members):
        return None
    coarse.origin = original
    return original


def original_makespan(coarse: Graph, cluster: Cluster, device_of: Sequence[int],
                      order: Sequence[Sequence[int]] | None = None, *, congestion: str = DEFAULT_CONGESTION,
                      costs: CostModel | None = None) -> float | None:
    """Simulated makespan on ``coarse.origin`` of a placement given on the
    coarse graph's node indices (``device_of``, optional per-device
    ``order``, expanded to the members in their listed order as
    :meth:`Placement.from_indices` writes it); None when the original is
    unknown.  *costs* is the coarse graph's cost model, re-bound to the
    original (:meth:`CostModel.for_graph`).

    Raises
    ------
    InvalidInput
        The members do not match the original's node ids.
    """
    origin = coarse.origin
    if origin is None:
        return None
    p = Placement.from_indices(coarse, cluster, device_of, order=order, algorithm="judge")
    label = f"placement on '{coarse.name}' judged on '{origin.name}'"
    dev, ordr = p.resolve(origin, cluster, label)
    check_colocation(origin, cluster, dev, label)
    c = costs.for_graph(origin) if costs is not None else cost_model(origin, cluster)
    return run_schedule(origin, cluster, dev, ordr, congestion=congestion, costs=c, label=label).makespan
