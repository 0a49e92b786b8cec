"""Single device: the whole graph on the fastest device (the baseline every
model-parallel paper starts from; Celeritas Table 3 "Single GPU")."""

from __future__ import annotations

from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import register


@register("single-device", paper="baseline", section="Celeritas 6.2 (single GPU)",
          summary="Everything on the fastest device (OOM when it does not fit).")
def single_device(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None) -> Placement:
    """Place every node on the device with the smallest total compute time,
    ties by device index.  The estimate reports ``OOM`` when the graph's
    memory exceeds that device's capacity (no fallback: that is the point of
    this baseline).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = single_device(layered(10), uniform(2))
    >>> set(p.assignment.values())
    {'gpu0'}
    """
    costs = cost_model(graph, cluster, costs)
    totals = [sum(costs.time[v][d] for v in range(graph.n)) for d in range(cluster.k)]
    best = min(range(cluster.k), key=lambda d: (totals[d], d))
    fits = graph.total_memory() <= cluster.devices[best].memory
    return Placement.from_indices(graph, cluster, [best] * graph.n, algorithm="single-device", seed=seed,
                                  order=None,
                                  estimate={"makespan_s": totals[best], "status": "FEASIBLE" if fits else "OOM"})
