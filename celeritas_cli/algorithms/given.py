"""Given placement: re-evaluate an existing placement file (for example a
human expert's, HRL Table 1 "Human Experts") through the same simulator."""

from __future__ import annotations

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..model.io import load_placement
from ..model.placement import Placement
from ..registry import Param, register


@register("given", paper="baseline", section="HRL Table 1 (human experts)",
          summary="Read an existing placement file (-p file=P.json) and re-evaluate it.",
          params={"file": Param(str, None, "placement file to re-evaluate")})
def given(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
          file: str | None = None) -> Placement:
    """Load placement *file*, check it against *graph* and *cluster*, and
    return it (its order, if any, kept), so ``compare`` and ``simulate``
    judge it like any algorithm's output.

    Raises
    ------
    InvalidInput
        No file given, or the file does not fit the graph or cluster.
    """
    if not file:
        raise InvalidInput("algorithm 'given' needs the placement file: -p file=PLACEMENT.json")
    src = load_placement(file)
    device_of, order = src.resolve(graph, cluster, label=file)
    return Placement.from_indices(graph, cluster, device_of, order=order, algorithm="given", seed=seed,
                                  params={"file": file}, estimate=dict(src.estimate))
