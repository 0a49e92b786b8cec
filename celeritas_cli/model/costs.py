"""The cost-model seam: what a node and a transfer cost, for every algorithm
and the simulator.

A :class:`CostModel` binds a graph to a cluster and answers, in O(1):

* ``time[v][d]`` - node *v*'s compute time on device *d* (:meth:`CostModel.node_row`
  times the device's contention factor: a cluster's ``hosts`` group devices
  that share one machine's cores, and ``placer calibrate`` fits how much
  slower a node runs there, ``Cluster.contention``; the planners see it on
  every device of such a host, the simulator only where the placement keeps
  two or more devices of the host busy, :meth:`CostModel.placed_time`;
  a derived graph's ring-collective steps, :data:`RING_STEPS`, also take
  their host's ``collective_step_s``);
* ``comm(e, a, c)`` - transfer time of edge *e*'s tensor from device *a* to
  device *c* (0 when ``a == c``);
* ``tensor_comm(t, a, c)`` - the same for a tensor id;

and the aggregates the list schedulers use (HEFT's average costs, FastT's
maximal costs, CCR).  The default rules are those of the file formats
(docs/design.md): ``compute_by_type[d.type]`` when present, else
``compute_s / d.speed``; an edge's ``comm_s_by_pair`` entry when present,
else the link's latency + bytes / bandwidth.

One construction path
---------------------
Costs are built once per (graph, cluster) by :func:`cost_model` and passed
along: :func:`celeritas_cli.registry.place` builds them and hands them to
the algorithm (``costs=`` keyword), an algorithm that derives a graph (a
coarse or split graph) asks ``costs.for_graph(derived)``, and
:func:`celeritas_cli.sim.simulator.simulate` takes ``costs=`` too, so a
placement is judged under the model it was made with.

Adding a cost model
-------------------
Subclass :class:`CostModel` and override one or both hooks:

* :meth:`CostModel.node_row` - times of node *v* on every device (e.g.
  measured times looked up by ``self.graph.ids[v]`` or, for a coarse node,
  summed over ``self.graph.original_ids(v)``);
* :meth:`CostModel.link_time` - seconds to move *nbytes* from device *a* to
  device *c* (e.g. a per-pair fit ``k * bytes + b``);

then pass an instance: ``place(g, c, "heft", costs=MyModel(g, c))`` and
``simulate(g, c, p, costs=MyModel(g, c))``.  :meth:`CostModel.for_graph`
re-binds the same rules to a derived graph (override it when the rules need
more than the derived graph's own fields).  Example::

    class SlowLinks(CostModel):
        def link_time(self, nbytes, a, c):
            return 2 * super().link_time(nbytes, a, c)
"""

from __future__ import annotations

import copy
import math
from functools import cached_property

from .cluster import Cluster
from .collectives import collective_time as _collective_time
from .graph import Graph


#: the ops of a ring collective's steps in derived graphs (transform/allreduce.py ``ring_node``:
#: ``<kind>.<phase>``), which a host's ``collective_step_s`` is added to
RING_STEPS = (".reduce-scatter", ".all-gather")


def cost_model(graph: Graph, cluster: Cluster, costs: "CostModel | None" = None) -> "CostModel":
    """The costs of *graph* on *cluster*: *costs* re-bound to *graph* when
    given (the caller's model, see the module docstring), else the default
    :class:`CostModel`.  The one place costs are constructed.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("a", [{"id": "a", "compute_s": 2.0, "memory_bytes": 0}], [])
    >>> c = uniform(2, speeds=[1.0, 2.0])
    >>> cost_model(g, c).time
    [[2.0, 1.0]]
    >>> m = cost_model(g, c); cost_model(g, c, m) is m
    True
    """
    if costs is None:
        return CostModel(graph, cluster)
    if costs.cluster is not cluster and costs.cluster.ids != cluster.ids:
        raise ValueError(f"cost model is bound to cluster '{costs.cluster.name}', not '{cluster.name}'")
    return costs.for_graph(graph)


class CostModel:
    """Node and edge costs of *graph* on *cluster* (see the module docstring
    for the rules and how to plug in another model)."""

    def __init__(self, graph: Graph, cluster: Cluster):
        self.cluster = cluster
        self._bind(graph)

    def _bind(self, graph: Graph) -> None:
        self.graph = graph
        for name in ("fastest_time", "mean_time", "max_time", "_pair_stats", "mean_comms"):
            self.__dict__.pop(name, None)
        self.time: list[list[float]] = [self.node_row(v) for v in range(graph.n)]
        coll = self.cluster.collective_step
        if any(coll):                        # a ring collective's fixed cost per step (hosts, placer calibrate)
            for v, op in enumerate(graph.op):
                if op.endswith(RING_STEPS) and not op.startswith("collective."):  # those: collective_time
                    self.time[v] = [t + c for t, c in zip(self.time[v], coll)]
        #: the node times without contention (the same list as ``time`` when no host has any)
        self.alone_time = self.time
        kappa = self.cluster.contention
        if any(x != 1.0 for x in kappa):     # devices sharing a host's cores (cluster ``hosts``, placer calibrate)
            self.time = [[t * x for t, x in zip(row, kappa)] for row in self.time]

    def collective_time(self, devices, kind: str, nbytes: int) -> float:
        """Seconds a collective of *kind* (``all-reduce``, ``all-gather``,
        ``reduce-scatter``) of an *nbytes* buffer per rank takes over the
        ranks on *devices* (device indices, the whole group): the NCCL
        formulas of :mod:`~celeritas_cli.model.collectives`, the same for
        every planner and the simulator.  Override to plug in measured
        collective times."""
        return _collective_time(self.cluster, devices, kind, nbytes)

    def placed_time(self, device_of) -> list[list[float]]:
        """``time`` for a placement (``device_of[v]``, -1: not placed): a host's
        ``contention`` applies where two or more of its devices run nodes,
        as ``placer calibrate`` fits it (a node crowded by another device of
        its host, against the same node alone); a device that is the only
        busy one of its host runs at its ``alone_time``.

        >>> from celeritas_cli.model.graph import build
        >>> from celeritas_cli.model.cluster import Cluster
        >>> c = Cluster.from_dict({"schema": "placer.cluster/v1", "links": {"default": {"bandwidth_Bps": 1e9}},
        ...     "devices": [{"id": i, "type": "cpu", "memory_bytes": 1} for i in ("a", "b")],
        ...     "hosts": [{"devices": ["a", "b"], "contention": 1.5}]})
        >>> g = build("g", [{"id": v, "compute_s": 2.0, "memory_bytes": 0} for v in "xy"], [])
        >>> m = cost_model(g, c)
        >>> m.placed_time([0, 0])[0], m.placed_time([0, 1])[0]
        ([2.0, 3.0], [3.0, 3.0])
        """
        if self.alone_time is self.time:
            return self.time
        hosts = self.cluster.host_of
        busy: dict[int, set[int]] = {}
        for d in set(device_of):
            if d >= 0 and hosts[d] >= 0:
                busy.setdefault(hosts[d], set()).add(d)
        alone = [d for ds in busy.values() if len(ds) == 1 for d in ds if self.cluster.contention[d] != 1.0]
        if not alone:
            return self.time
        out = [row[:] for row in self.time]
        for row, base in zip(out, self.alone_time):
            for d in alone:
                row[d] = base[d]
        return out

    def for_graph(self, graph: Graph) -> "CostModel":
        """The same cost rules bound to *graph* (a coarse or split graph
        derived from this model's graph, or any graph on the same cluster)."""
        if graph is self.graph:
            return self
        clone = copy.copy(self)
        clone._bind(graph)
        return clone

    # -------------------------------------------------------------- hooks
    def node_row(self, v: int) -> list[float]:
        """Times of node *v* on every device (hook; default: the file's
        ``compute_by_type[d.type]``, else ``compute_s / d.speed``)."""
        c = self.graph.compute[v]
        by = self.graph.compute_by_type[v]
        devs = self.cluster.devices
        if by:
            return [by[d.type] if d.type in by else c / d.speed for d in devs]
        return [c / d.speed for d in devs]

    def link_time(self, nbytes: float, a: int, c: int) -> float:
        """Seconds to move *nbytes* from device *a* to a different device *c*
        (hook; default: the link's latency + bytes / bandwidth)."""
        return self.cluster.latency[a][c] + nbytes / self.cluster.bandwidth[a][c]

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
        return self.link_time(g.edge_bytes[e], a, c)

    def tensor_comm(self, t: int, a: int, c: int) -> float:
        """Transfer time of tensor *t* (its first edge's override applies)."""
        return self.comm(self.graph.tensor_edges[t][0], a, c)

    def min_tensor_comm(self, t: int) -> float:
        """The cheapest transfer of tensor *t* between two different devices:
        :meth:`tensor_comm` minimised over ordered pairs - with the default
        link rule on a cluster of servers, over the pairs that hold every
        distinct link figure (``Cluster._summary_pairs``: O(GPUs per
        server²), not O(devices²); of those, one pair per distinct latency
        and bandwidth, :attr:`_figure_pairs`) and the pairs the tensor's
        measured ``comm_s_by_pair`` names."""
        k = self.cluster.k
        if k < 2:
            return 0.0
        if self._default_links and self.cluster.servers is not None:
            pairs = list(self._figure_pairs)
            override = self.graph.edge_comm[self.graph.tensor_edges[t][0]]
            if override:
                index = self.cluster.index
                for key in override:
                    a, _, c = key.partition("->")
                    if a in index and c in index and a != c:
                        pairs.append((index[a], index[c]))
        else:
            pairs = [(a, c) for a in range(k) for c in range(k) if a != c]
        return min(self.tensor_comm(t, a, c) for a, c in pairs)

    @cached_property
    def _figure_pairs(self) -> list[tuple[int, int]]:
        """The first of ``Cluster._summary_pairs`` with each distinct
        (latency, bandwidth): the default :meth:`link_time` of a pair is a
        function of those two, so its minimum over them is the minimum over
        every pair (a cluster of servers has a handful: its fabric, a rail,
        across rails)."""
        lat, bw = self.cluster.latency, self.cluster.bandwidth
        first: dict[tuple[float, float], tuple[int, int]] = {}
        for a, c in self.cluster._summary_pairs():
            first.setdefault((lat[a][c], bw[a][c]), (a, c))
        return list(first.values())

    @property
    def _default_links(self) -> bool:
        return type(self).link_time is CostModel.link_time

    @cached_property
    def _pairs(self) -> list[tuple[int, int]]:
        k = self.cluster.k
        return [(a, c) for a in range(k) for c in range(k) if a != c]

    @cached_property
    def _pair_stats(self) -> tuple[float, float, float, float]:
        cl = self.cluster
        if cl.servers is not None:   # O(devices) rows, not the O(devices²) pairs (model/servers.py)
            return cl.pair_stats()
        pairs = self._pairs
        if not pairs:
            return 0.0, 0.0, 0.0, 0.0
        inv = [1.0 / cl.bandwidth[a][c] for a, c in pairs]
        lat = [cl.latency[a][c] for a, c in pairs]
        return sum(lat) / len(lat), sum(inv) / len(inv), max(lat), max(inv)

    def mean_comm(self, e: int) -> float:
        """Average transfer time of edge *e* over ordered pairs of distinct
        devices (HEFT's c̄, Topcuoglu 2002 Eq. 4 without the same-device term)."""
        if self.cluster.k < 2:
            return 0.0
        if not self._default_links:
            times = [self.link_time(self.graph.edge_bytes[e], a, c) for a, c in self._pairs]
            return math.fsum(times) / len(times)
        mlat, minv, _, _ = self._pair_stats
        return mlat + self.graph.edge_bytes[e] * minv

    @cached_property
    def mean_comms(self) -> list[float]:
        """:meth:`mean_comm` of every edge (cached: the coarsener, CPD-TOPO and
        CCR read all of them)."""
        if self.cluster.k < 2 or not self._default_links:
            return [self.mean_comm(e) for e in range(self.graph.m)]
        mlat, minv, _, _ = self._pair_stats
        return [mlat + b * minv for b in self.graph.edge_bytes]

    def max_comm(self, e: int) -> float:
        """Worst-case transfer time of edge *e* over device pairs (FastT's
        maximal communication cost, section 5)."""
        if self.cluster.k < 2:
            return 0.0
        if not self._default_links:
            return max(self.link_time(self.graph.edge_bytes[e], a, c) for a, c in self._pairs)
        _, _, xlat, xinv = self._pair_stats
        return xlat + self.graph.edge_bytes[e] * xinv

    def ccr(self) -> float:
        """Communication-to-computing ratio, Celeritas Eq. 1:
        CCR = sum over edges of c_ij / sum over nodes of w_i, with c_ij the
        mean transfer time over device pairs and w_i the mean node time."""
        comp = math.fsum(self.mean_time)
        comm = math.fsum(self.mean_comms)
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
