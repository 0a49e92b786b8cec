"""Random placement (seeded): the floor any placement algorithm must beat."""

from __future__ import annotations

import random

from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import register
from ...scheduling.memory import DeviceMemory


@register("random", paper="baseline", section="HRL Table 1 / sanity floor",
          summary="Each node (colocation group) on a uniformly random device, seeded.")
def random_placement(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None) -> Placement:
    """Each node, or each colocation group as a whole, goes to a device drawn
    uniformly with ``random.Random(seed)``, in node index order.  Memory is
    not considered (the estimate says ``OOM`` when a device overflows).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> a = random_placement(layered(30), uniform(4), seed=1).assignment
    >>> a == random_placement(layered(30), uniform(4), seed=1).assignment
    True
    """
    rng = random.Random(seed)
    mem = DeviceMemory(graph, cluster)  # only tracks groups and loads: memory never limits the draw
    device_of = []
    for v in range(graph.n):
        d = mem.pinned_device(v)
        if d < 0:
            d = rng.randrange(cluster.k)
            mem.place(v, d)
        device_of.append(d)
    return Placement.from_indices(graph, cluster, device_of, algorithm="random", seed=seed,
                                  estimate={"status": mem.status()})
