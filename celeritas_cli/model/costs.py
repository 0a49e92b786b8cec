"""Cost rules shared by every algorithm and the simulator.

A :class:`CostModel` binds a graph to a cluster and answers, in O(1):

* ``time[v][d]`` - node *v*'s compute time on device *d*
  (``compute_by_type[d.type]`` when present, else ``compute_s / d.speed``);
* ``comm(e, a, c)`` - transfer time of edge *e*'s tensor from device *a* to *c*
  (the edge's ``comm_s_by_pair`` entry ``"a->c"`` when present, else the
  link's latency + bytes / bandwidth; 0 when ``a == c``);
* ``tensor_comm(t, a, c)`` - the same for a tensor id.

Aggregates used by the list schedulers (HEFT's average costs, FastT's
maximal costs) are methods here so fine and coarse graphs share them.
"""

from __future__ import annotations

import math
from functools import cached_property

from .cluster import Cluster
from .graph import Graph


class CostModel:
    """Node and edge costs of *graph* on *cluster* (see module docstring)."""

    def __init__(self, graph: Graph, cluster: Cluster):
        self.graph = graph
        self.cluster = cluster
        devs = cluster.devices
        speeds = [d.speed for d in devs]
        types = [d.type for d in devs]
        self.time: list[list[float]] = []
        for v in range(graph.n):
            c = graph.compute[v]
            by = graph.compute_by_type[v]
            if by:
                self.time.append([by[t] if t in by else c / s for t, s in zip(types, speeds)])
            else:
                self.time.append([c / s for s in speeds])

    # -------------------------------------------------------------- nodes
    def node_time(self, v: int, d: int) -> float:
        return self.time[v][d]

    @cached_property
    def fastest_time(self) -> list[float]:
        return [min(row) for row in self.time]

    @cached_property
    def mean_time(self) -> list[float]:
        k = self.cluster.k
        return [math.fsum(row) / k for row in self.time]

    @cached_property
    def max_time(self) -> list[float]:
        return [max(row) for row in self.time]

    # -------------------------------------------------------------- edges
    def comm(self, e: int, a: int, c: int) -> float:
        """Transfer time of edge *e* from device *a* to device *c*."""
        if a == c:
            return 0.0
        g = self.graph
        override = g.edge_comm[e]
        if override:
            key = f"{self.cluster.devices[a].id}->{self.cluster.devices[c].id}"
            if key in override:
                return override[key]
        return self.cluster.latency[a][c] + g.edge_bytes[e] / self.cluster.bandwidth[a][c]

    def tensor_comm(self, t: int, a: int, c: int) -> float:
        """Transfer time of tensor *t* (its first edge's override applies)."""
        return self.comm(self.graph.tensor_edges[t][0], a, c)

    @cached_property
    def _pair_stats(self) -> tuple[float, float, float, float]:
        cl = self.cluster
        k = cl.k
        pairs = [(a, c) for a in range(k) for c in range(k) if a != c]
        if not pairs:
            return 0.0, 0.0, 0.0, 0.0
        inv = [1.0 / cl.bandwidth[a][c] for a, c in pairs]
        lat = [cl.latency[a][c] for a, c in pairs]
        return sum(lat) / len(lat), sum(inv) / len(inv), max(lat), max(inv)

    def mean_comm(self, e: int) -> float:
        """Average transfer time of edge *e* over ordered pairs of distinct
        devices (HEFT's c̄, Topcuoglu 2002 Eq. 4 without the same-device term)."""
        mlat, minv, _, _ = self._pair_stats
        if self.cluster.k < 2:
            return 0.0
        return mlat + self.graph.edge_bytes[e] * minv

    def max_comm(self, e: int) -> float:
        """Worst-case transfer time of edge *e* over device pairs (FastT's
        maximal communication cost, section 5)."""
        _, _, xlat, xinv = self._pair_stats
        if self.cluster.k < 2:
            return 0.0
        return xlat + self.graph.edge_bytes[e] * xinv

    def ccr(self) -> float:
        """Communication-to-computing ratio, Celeritas Eq. 1:
        CCR = sum over edges of c_ij / sum over nodes of w_i, with c_ij the
        mean transfer time over device pairs and w_i the mean node time."""
        g = self.graph
        comp = math.fsum(self.mean_time)
        comm = math.fsum(self.mean_comm(e) for e in range(g.m))
        if comp == 0:
            return math.inf if comm else 0.0
        return comm / comp


def upward_rank(graph: Graph, node_cost, edge_cost) -> list[float]:
    """rank_u(v) = w(v) + max over out-edges e=(v,s) of (c(e) + rank_u(s)).

    *node_cost(v)* and *edge_cost(e)* are callables, so HEFT (averages),
    FastT (maxima) and the simulator (real placement costs) share this.
    Computed in reverse topological order, O(V+E).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("c", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 1}])
    >>> upward_rank(g, lambda v: g.compute[v], lambda e: 0.5)
    [3.5, 2.0]
    """
    rank = [0.0] * graph.n
    out_edges, dst = graph.out_edges, graph.edge_dst
    for v in reversed(graph.topo_order()):
        best = 0.0
        for e in out_edges[v]:
            r = edge_cost(e) + rank[dst[e]]
            if r > best:
                best = r
        rank[v] = node_cost(v) + best
    return rank


def downward_rank(graph: Graph, node_cost, edge_cost) -> list[float]:
    """rank_d(v) = max over in-edges e=(p,v) of (rank_d(p) + w(p) + c(e)); the
    top level / earliest start with unbounded devices.  O(V+E)."""
    rank = [0.0] * graph.n
    in_edges, src = graph.in_edges, graph.edge_src
    for v in graph.topo_order():
        best = 0.0
        for e in in_edges[v]:
            p = src[e]
            r = rank[p] + node_cost(p) + edge_cost(e)
            if r > best:
                best = r
        rank[v] = best
    return rank
