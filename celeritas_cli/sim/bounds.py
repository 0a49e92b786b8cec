"""Lower bounds on the simulated makespan, each labelled with where it
comes from.

:func:`celeritas_cli.sim.simulator.lower_bound` (docs/design.md, simulator item 6)
ignores communication, so on graphs with a high communication-to-computation
ratio ``makespan / LB`` says little.  :func:`memory_cut_bound` adds the
communication that memory forces: a graph that fits on no single device must
send at least one tensor between devices, and the cheapest such tensor still
costs time on a path.  :func:`lower_bounds` reports both, with the
conditions under which each holds.

Which bound holds for what
--------------------------
A placement made on a *derived* graph (data parallelism, fsdp, micro-batches,
recomputation, operation splits: ``Placement.derivation``) runs another graph
than the one the user gave: its nodes are parts of the original nodes, so the
original graph's critical path does not bound it (four data-parallel replicas
each run a quarter of every node).  For such a placement the report's bounds
are computed on the derived graph that was run, and ``holds_for`` names it by
its recipe's steps (:func:`derived_graph_words`); next to them
``work_any_derivation`` (:func:`work_bound` of the graph given) holds for
every placement of the graph given *and* of every graph placer may derive
from it, so it compares placements made on different graphs.
"""

from __future__ import annotations

import math

from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model, downward_rank, upward_rank
from ..model.graph import Graph

#: ``lower_bounds`` names (the report schema lists the same)
BOUND_NAMES = ("path_and_work", "memory_cut", "work_any_derivation")


def work_bound(graph: Graph, cluster: Cluster, costs: CostModel | None = None) -> float:
    """Total work / devices: ``sum(fastest time) / k``, or ``sum(compute_s) /
    sum(speed)`` when that is larger and no node has per-type times (then a
    node's time on *d* is ``compute_s / speed(d)``).

    It holds for every placement of *graph* and of every graph
    :mod:`~celeritas_cli.transform.derivation` derives from it: a part of a
    node on a fraction ``f`` of its batch never takes less than ``f`` of the
    node's time on any device (:func:`~celeritas_cli.transform.split_cost.part_times`:
    never better than linear), the parts of a node cover at least its whole
    batch (``k`` replicas of ``1/k``, ``n`` split parts of ``1/n``, or
    ``f = 1`` for weak scaling and batch-independent nodes), and a derivation
    only adds nodes (all-reduce steps, weights, concatenations) of
    non-negative time; so the derived graph's total work is at least this
    graph's, and ``k`` devices cannot finish it sooner.  (The critical path
    does not carry over: a derived part may be ``k`` or more times shorter
    than its node.)  It assumes the default cost rules
    (:class:`~celeritas_cli.model.costs.CostModel`); a plugged-in model
    whose split times beat linear scaling voids it.

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 3, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 1}])
    >>> work_bound(g, uniform(4))
    1.0
    """
    costs = cost_model(graph, cluster, costs)
    if graph.n == 0:
        return 0.0
    work = math.fsum(costs.fastest_time) / cluster.k
    if not any(graph.compute_by_type):
        work = max(work, math.fsum(graph.compute) / sum(d.speed for d in cluster.devices))
    return work


def derived_graph_words(derivation: dict | None, given: Graph) -> str:
    """The derived graph a recipe makes of *given*, in the plan's words
    (:func:`celeritas_cli.sim.describe.describe`, the one describer of
    recipes), for the bounds' ``holds_for``.  Only the recipe: the bounds
    hold for every placement and schedule of that graph, so a pipeline's
    stages and schedule (its orders) are not named.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("mlp", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [])
    >>> derived_graph_words({"steps": [{"transform": "microbatch", "m": 8, "global_batch": 64,
    ...                                 "micro_batches": [8] * 8}]}, g)
    '8 micro-batches of 8 samples (global batch 64) of mlp, gradients accumulated'
    """
    from .describe import Context, describe

    base = (derivation or {}).get("base")
    members = base.get("members") if isinstance(base, dict) else None
    return describe(derivation, Context(given.name, len(members) if isinstance(members, list) else given.n))


def edge_path_weights(graph: Graph, costs: CostModel) -> list[float]:
    """``w[e] = head(u) + fastest(u) + comm_min(e) + tail(v)`` for every edge
    ``e = (u, v)``: a lower bound on the makespan of any schedule in which
    *v* runs on another device than *u*.

    ``head(u)`` is the longest path into *u* (excluded) and ``tail(v)`` the
    longest path out of *v* (included), both with every node at its fastest
    device and no communication; ``comm_min(e)`` is the cheapest transfer of
    *e*'s tensor between two different devices
    (:meth:`CostModel.min_tensor_comm`).

    Why it is a lower bound: *u* cannot finish before ``head(u) +
    fastest(u)`` (every predecessor chain runs at least that long, whatever
    the devices and transfers); when *v* is on another device its input
    leaves *u*'s device no earlier than *u* finishes (docs/design.md rule 3: a
    transfer starts when its producer finishes, and congestion only delays
    it) and takes at least ``comm_min(e)``; *v* starts no earlier than its
    arrival (rule 2), and the makespan is at least *v*'s start plus the
    longest chain from *v* at fastest times.
    """
    fastest = costs.fastest_time
    head = downward_rank(graph, fastest.__getitem__, lambda e: 0.0)
    tail = upward_rank(graph, fastest.__getitem__, lambda e: 0.0)
    cmin_t = [costs.min_tensor_comm(t) for t in range(len(graph.tensor_src))]
    return [head[graph.edge_src[e]] + fastest[graph.edge_src[e]] + cmin_t[graph.edge_tensor[e]]
            + tail[graph.edge_dst[e]] for e in range(graph.m)]


def memory_cut_bound(graph: Graph, cluster: Cluster, costs: CostModel | None = None) -> tuple[float, int | None]:
    """A lower bound on the makespan of every placement that fits in memory,
    from the communication that memory forces.  Returns ``(bound, edge)``:
    the bound in seconds (0.0 when it says nothing) and the index of the edge
    that sets it (None then).

    Kruskal in decreasing order of :func:`edge_path_weights`: nodes of one
    colocation group start merged (they share a device in every valid
    placement); edges are added heaviest first, merging components and their
    memory, until a component holds more bytes than the largest device.
    The weight ``w`` of that last edge is the bound.

    Validity (proof): let the bound be ``w``, reached when component ``H``
    became heavier than every device.  ``H`` is connected by edges of
    weight ``>= w`` and colocation links.  A placement that fits in memory
    cannot put all of ``H`` on one device, so some link inside ``H`` joins
    two devices; colocation links never do (a placement splitting a group
    is invalid), so an edge ``e`` of ``H`` does, and by
    :func:`edge_path_weights` every schedule of the placement has makespan
    ``>= w(e) >= w``.  It holds under every congestion rule (congestion only
    delays transfers), for any per-device order.  It does not hold for a
    placement that overflows a device (an OOM placement may keep ``H``
    together); a single node or colocation group heavier than every device
    admits no fitting placement, and the bound is then 0.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 6},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 6}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> memory_cut_bound(g, uniform(2, memory=10, bandwidth=100.0, latency=0.0))  # 1 + 1 s transfer + 2
    (4.0, 0)
    """
    costs = cost_model(graph, cluster, costs)
    cap = max(d.memory for d in cluster.devices)
    if graph.m == 0 or graph.total_memory() <= cap:
        return 0.0, None
    parent = list(range(graph.n))
    mem = list(graph.memory)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> int:
        ra, rb = find(a), find(b)
        if ra != rb:
            if ra > rb:
                ra, rb = rb, ra
            parent[rb] = ra
            mem[ra] += mem[rb]
        return ra

    for nodes in graph.colocation_groups().values():
        for v in nodes[1:]:
            union(nodes[0], v)
    if any(mem[find(v)] > cap for v in range(graph.n)):
        return 0.0, None  # no placement fits at all
    w = edge_path_weights(graph, costs)
    for e in sorted(range(graph.m), key=lambda e: (-w[e], e)):
        r = union(graph.edge_src[e], graph.edge_dst[e])
        if mem[r] > cap:
            return w[e], e
    return 0.0, None


def lower_bounds(graph: Graph, cluster: Cluster, costs: CostModel | None = None, *,
                 given: Graph | None = None, derivation: dict | None = None) -> list[dict]:
    """Every lower bound with its provenance: ``[{"name", "value_s",
    "holds_for", "source"}]``.  ``path_and_work`` is
    :func:`~celeritas_cli.sim.simulator.lower_bound` (every placement of
    *graph*); ``memory_cut`` is :func:`memory_cut_bound` (placements of
    *graph* that fit in memory), present when it is positive.

    When *graph* was derived (*derivation*, the placement's recipe) from
    *given* (the graph the user gave), both are said to hold for that
    derived graph, and ``work_any_derivation`` (:func:`work_bound` of
    *given*, which holds for every placement of *given* and of every graph
    derived from it) follows them."""
    from .simulator import lower_bound

    costs = cost_model(graph, cluster, costs)
    derived = given is not None and given is not graph
    of = f"the derived graph that was run ({derived_graph_words(derivation, given)})" if derived else None
    out = [{"name": "path_and_work", "value_s": lower_bound(graph, cluster, costs),
            "holds_for": f"every placement of {of}" if derived else "every placement",
            "source": "longest path at fastest devices without communication; total work / devices"}]
    cut, e = memory_cut_bound(graph, cluster, costs)
    if e is not None and cut > 0:
        out.append({"name": "memory_cut", "value_s": cut,
                    "holds_for": f"placements of {of} that fit in memory" if derived else
                                 "placements that fit in memory",
                    "source": f"the graph fits on no device, so a tensor must cross devices; the cheapest path "
                              f"through such a crossing (edge {graph.ids[graph.edge_src[e]]} -> "
                              f"{graph.ids[graph.edge_dst[e]]})"})
    if derived:
        out.append({"name": "work_any_derivation", "value_s": work_bound(given, cluster, costs.for_graph(given)),
                    "holds_for": "every placement of the graph given and of every graph placer derives from it "
                                 "(data parallelism, fsdp, micro-batches, recomputation, operation splits)",
                    "source": "total work of the graph given / devices: a node part on a fraction f of the batch "
                              "never takes less than f of the node's time, and derivations only add nodes"})
    return out
