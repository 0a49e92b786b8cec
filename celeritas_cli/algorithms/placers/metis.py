"""METIS: k-way graph partitioning that minimises the edge cut.

Karypis & Kumar, "A fast and high quality multilevel scheme for
partitioning irregular graphs", SIAM J. Sci. Comput. 20(1), 1998 (the
k-way scheme of METIS 5).  Celeritas' Table 3 and HRL's Table 1 use it as
a device-placement baseline: partition the operator graph into as many
parts as devices, minimising the bytes crossing parts under a balance
constraint on node weights, part i going to device i.

Model given to METIS (through ``pymetis``):

* vertices are *units*: a colocation group is contracted to one vertex
  (groups never split), other nodes are their own vertex;
* undirected edge weights are the bytes of the distinct tensors between
  two units (in either direction);
* vertex weights are the units' compute (``weights=compute``: mean time
  over devices) or memory (``weights=memory``), scaled to integers;
* target part weights (``tpwgts``) are proportional to device speed for
  ``compute`` and to device memory for ``memory``, so heterogeneous
  clusters get proportionate shares; allowed imbalance ``ufactor`` (METIS'
  per-mille, default 30 = 3 %).

METIS ignores dependencies and device memory: the estimate reports
``OOM`` when a part exceeds its device.  Seeded through METIS' own seed
option, so a seed gives one partition.
"""

from __future__ import annotations

from ...errors import MissingDependency
from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import Param, register
from ...scheduling.partition import partition_inputs, placement_from_parts


@register("metis", paper="METIS (Karypis & Kumar 1998)", section="Celeritas Table 3; HRL Table 1",
          summary="k-way min edge-cut partition (pymetis), compute- or memory-balanced; groups kept whole.",
          params={"weights": Param(str, "compute", "vertex weights: compute or memory", ("compute", "memory")),
                  "ufactor": Param(int, 30, "allowed imbalance in per-mille (METIS ufactor)", min=1,
                                   max=1_000_000)})
def metis(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, weights: str = "compute",
          ufactor: int = 30) -> Placement:
    """Partition *graph* into ``cluster.k`` parts with METIS (module docstring).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    seed : int
        METIS' random seed.
    weights : {"compute", "memory"}
        What the balance constraint balances.
    ufactor : int
        Allowed load imbalance, per mille.

    Returns
    -------
    Placement
        Without ``order``; ``estimate`` has ``status`` and ``edge_cut_bytes``.

    Raises
    ------
    MissingDependency
        pymetis is not installed.

    References
    ----------
    Karypis & Kumar, SIAM J. Sci. Comput. 20(1):359-392, 1998.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = metis(layered(40), uniform(2))
    >>> sorted(set(p.assignment.values()))
    ['gpu0', 'gpu1']
    """
    try:
        import pymetis
    except ImportError:  # pragma: no cover - a core dependency
        raise MissingDependency("algorithm 'metis' needs pymetis: pip install pymetis") from None
    unit_of, nu, xadj, adjncy, vw, ew, tpwgts, mem = partition_inputs(graph, cluster, weights, costs)
    k = cluster.k
    if k == 1 or nu <= 1:
        parts = [0] * nu
    else:
        opts = pymetis.Options(seed=seed, ufactor=ufactor)
        _cut, parts = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw,
                                         eweights=ew or None, tpwgts=tpwgts, options=opts)
        parts = list(parts)
    return placement_from_parts(graph, cluster, unit_of, parts, mem, "metis", seed)

