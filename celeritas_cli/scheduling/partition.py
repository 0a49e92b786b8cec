"""Graph partitioning inputs shared by the partitioner baselines (METIS,
Scotch): colocation groups contracted to *units*, integer vertex and edge
weights, target part weights proportional to device speed or memory, and the
placement of a unit partition (with its edge cut)."""

from __future__ import annotations

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from .memory import DeviceMemory

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


def partition_inputs(graph: Graph, cluster: Cluster, weights: str, costs: CostModel | None = None):
    """CSR arrays, integer vertex/edge weights and target part weights for
    a partitioner (METIS and Scotch)."""
    if weights not in ("compute", "memory"):
        raise InvalidInput(f"metis/scotch parameter weights: must be compute or memory, got {weights!r}")
    mem = DeviceMemory(graph, cluster)
    unit_of, nu, ew = unit_graph(graph, mem)
    costs = cost_model(graph, cluster, costs)
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


def placement_from_parts(graph: Graph, cluster: Cluster, unit_of: list[int], parts, mem: DeviceMemory,
                         name: str, seed: int) -> Placement:
    """Placement with unit ``u`` on device ``parts[u]``; the estimate has the
    memory status and the bytes crossing devices (each tensor once per
    destination device)."""
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
