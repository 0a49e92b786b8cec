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

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import InvalidInput, MissingDependency
from ..graph import Graph
from ..memory import DeviceMemory
from ..placement import Placement
from ..registry import Param, register

_SCALE = 1_000_000  # largest integer weight handed to the partitioner


def unit_graph(graph: Graph, mem: DeviceMemory) -> tuple[list[int], int, dict[tuple[int, int], int]]:
    """Units (colocation groups contracted) and the undirected byte weight
    between them: ``(unit_of, number of units, {(a, b): bytes} with a < b)``."""
    unit_of = [-1] * graph.n
    group_unit: dict[int, int] = {}
    u = 0
    for v in range(graph.n):
        g = mem.group_of[v]
        if g >= 0:
            if g not in group_unit:
                group_unit[g] = u
                u += 1
            unit_of[v] = group_unit[g]
        else:
            unit_of[v] = u
            u += 1
    weights: dict[tuple[int, int], int] = {}
    seen: set[tuple[int, int]] = set()  # (tensor, destination unit): each tensor counted once per unit
    for e in range(graph.m):
        a, b = unit_of[graph.edge_src[e]], unit_of[graph.edge_dst[e]]
        if a == b or (graph.edge_tensor[e], b) in seen:
            continue
        seen.add((graph.edge_tensor[e], b))
        key = (a, b) if a < b else (b, a)
        weights[key] = weights.get(key, 0) + graph.edge_bytes[e]
    return unit_of, u, weights


def _scaled(values: list[float]) -> list[int]:
    top = max(values, default=0.0)
    if top <= 0:
        return [1] * len(values)
    return [max(1, round(x / top * _SCALE)) for x in values]


def partition_inputs(graph: Graph, cluster: Cluster, weights: str):
    """CSR arrays, integer vertex/edge weights and target part weights for
    a partitioner (shared with :mod:`.scotch`)."""
    if weights not in ("compute", "memory"):
        raise InvalidInput(f"metis/scotch parameter weights: must be compute or memory, got {weights!r}")
    mem = DeviceMemory(graph, cluster)
    unit_of, nu, ew = unit_graph(graph, mem)
    costs = CostModel(graph, cluster)
    vw = [0.0] * nu
    for v in range(graph.n):
        vw[unit_of[v]] += costs.mean_time[v] if weights == "compute" else graph.memory[v]
    adj: list[list[tuple[int, int]]] = [[] for _ in range(nu)]
    keys = sorted(ew)
    ints = _scaled([float(ew[key]) for key in keys])
    for (a, b), w in zip(keys, ints):
        adj[a].append((b, w))
        adj[b].append((a, w))
    xadj = [0]
    adjncy: list[int] = []
    eweights: list[int] = []
    for a in range(nu):
        for b, w in sorted(adj[a]):
            adjncy.append(b)
            eweights.append(w)
        xadj.append(len(adjncy))
    share = [d.speed for d in cluster.devices] if weights == "compute" else [d.memory for d in cluster.devices]
    total = sum(share)
    tpwgts = [s / total for s in share] if total > 0 else [1.0 / cluster.k] * cluster.k
    return unit_of, nu, xadj, adjncy, _scaled(vw), eweights, tpwgts, mem


@register("metis", paper="METIS (Karypis & Kumar 1998)", section="Celeritas Table 3; HRL Table 1",
          summary="k-way min edge-cut partition (pymetis), compute- or memory-balanced; groups kept whole.",
          params={"weights": Param(str, "compute", "vertex weights: compute or memory", ("compute", "memory")),
                  "ufactor": Param(int, 30, "allowed imbalance in per-mille (METIS ufactor)")})
def metis(graph: Graph, cluster: Cluster, *, seed: int = 0, weights: str = "compute",
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
    >>> from celeritas_cli.generate import layered
    >>> from celeritas_cli.cluster import uniform
    >>> p = metis(layered(40), uniform(2))
    >>> sorted(set(p.assignment.values()))
    ['gpu0', 'gpu1']
    """
    try:
        import pymetis
    except ImportError:  # pragma: no cover - a core dependency
        raise MissingDependency("algorithm 'metis' needs pymetis: pip install pymetis") from None
    unit_of, nu, xadj, adjncy, vw, ew, tpwgts, mem = partition_inputs(graph, cluster, weights)
    k = cluster.k
    if k == 1 or nu <= 1:
        parts = [0] * nu
    else:
        opts = pymetis.Options(seed=seed, ufactor=ufactor)
        _cut, parts = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw,
                                         eweights=ew or None, tpwgts=tpwgts, options=opts)
        parts = list(parts)
    return _placement(graph, cluster, unit_of, parts, mem, "metis", seed)


def _placement(graph: Graph, cluster: Cluster, unit_of: list[int], parts, mem: DeviceMemory,
               name: str, seed: int) -> Placement:
    device_of = [int(parts[unit_of[v]]) for v in range(graph.n)]
    for v in graph.topo_order():
        mem.place(v, device_of[v])
    cut = 0
    seen: set[tuple[int, int]] = set()
    for e in range(graph.m):
        a, b = device_of[graph.edge_src[e]], device_of[graph.edge_dst[e]]
        if a != b and (graph.edge_tensor[e], b) not in seen:
            seen.add((graph.edge_tensor[e], b))
            cut += graph.edge_bytes[e]
    return Placement.from_indices(graph, cluster, device_of, algorithm=name, seed=seed,
                                  estimate={"status": mem.status(), "edge_cut_bytes": cut})
