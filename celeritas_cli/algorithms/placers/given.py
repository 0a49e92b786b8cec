"""Given placement: re-evaluate an existing placement file (for example a
human expert's, HRL Table 1 "Human Experts") through the same simulator."""

from __future__ import annotations

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.graph import Graph
from ...model.io import load_placement
from ...model.placement import Placement
from ...registry import Param, register
from ...transform.derivation import rebuild


@register("given", paper="baseline", section="HRL Table 1 (human experts)",
          summary="Read an existing placement file (-p file=P.json) and re-evaluate it.",
          params={"file": Param(str, None, "placement file to re-evaluate")})
def given(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
          file: str | None = None) -> Placement:
    """Load placement *file*, check it against *graph* and *cluster*, and
    return it (its order, if any, kept), so ``compare`` and ``simulate``
    judge it like any algorithm's output.  A placement of a derived graph
    (``derivation``: operation splits, data parallelism) is checked against
    the derived graph rebuilt from *graph*
    (:func:`~celeritas_cli.transform.derivation.rebuild`) and keeps its
    recipe.

    Raises
    ------
    InvalidInput
        No file given, or the file does not fit the graph or cluster.
    """
    if not file:
        raise InvalidInput("algorithm 'given' needs the placement file: -p file=PLACEMENT.json")
    src = load_placement(file)
    target = graph
    if src.derivation is not None or src.split_graph is not None:
        target = rebuild(graph, src.derivation, src.split_graph, label=file, devices=cluster.k, cluster=cluster.name)
    device_of, order = src.resolve(target, cluster, label=file)
    p = Placement.from_indices(target, cluster, device_of, order=order, algorithm="given", seed=seed,
                               params={"file": file}, estimate=dict(src.estimate))
    if target is not graph:
        p.derivation, p.derived, p.graph = src.derivation, target, graph.original_name
    return p
