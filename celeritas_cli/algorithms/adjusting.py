"""Celeritas' Adjusting Placement (section 5.2, Algorithm 2).

Nodes are visited in CPD-TOPO order.  Each one stays on the device of the
previous node, ``d_k``, unless another device's earliest start time (EST,
Eq. 7, with insertion into idle slots) is earlier by more than
``back_cost`` (Eq. 8, the longest transfer of its outputs back to ``d_k``)
- condition Eq. 9.  A device without room for the node has EST = +inf;
when every device is full, the device with the lowest memory usage takes
it (best effort).  Run it on the coarse graph of ``placer coarsen``.
"""

from __future__ import annotations

import math

from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from ..registry import Param, register
from ..scheduling.memory import DeviceMemory
from ..scheduling.orders import cpd_topo
from ..scheduling.timeline import Timeline
from .order_place import placement_estimate

INF = math.inf


@register("adjusting", paper="Celeritas", section="5.2, Algorithm 2 (Eq. 7-9)",
          summary="CPD-TOPO order; stay on the previous node's device unless another starts it earlier "
                  "by more than the cost of sending results back (run on a coarse graph).",
          params={"insertion": Param(bool, True, "insert into idle slots when computing EST (Eq. 7)"),
                  "order": Param(bool, False, "also write each device's execution order (the EST schedule)")})
def adjusting(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, insertion: bool = True,
              order: bool = False) -> Placement:
    """Adjusting Placement (Celeritas Algorithm 2).

    For node ``v_i`` of the CPD-TOPO sequence and each device ``d``:
    ``pre_t = max over in-edges (p, v_i) of Fin_t[p] + c_{p,i}`` (no
    transfer when ``p`` is on ``d``) and ``EST(d) = max(pre_t, d_ava[d])``
    where ``d_ava`` is the start of the first idle slot of ``d`` after
    ``pre_t`` long enough for ``v_i`` (:class:`~celeritas_cli.scheduling.timeline.Timeline`,
    Eq. 7).  With ``d_k`` the device of ``v_{i-1}`` and ``d_1`` the device
    with the smallest EST (ties: lowest index), ``v_i`` goes to ``d_1`` if
    ``EST(d_k) - EST(d_1) > back_cost`` (Eq. 9), else to ``d_k`` if it has
    room, else (every device full) to the device with the lowest memory
    usage (best effort).

    Readings where the paper is silent: ``c_{p,i}`` is the real transfer
    time of the edge over the link ``dev(p) -> d`` (CostModel.comm);
    ``back_cost = max over out-edges of c`` over the link ``d_1 -> d_k``;
    the first node has no ``d_k`` and takes ``d_1``.  The paper writes
    ``argmin Ava_m`` for the best-effort device but says "the device with the
    lowest memory usage"; the text is followed (fewest bytes used).
    Colocation: a group is a unit - its first node in the sequence reserves
    the whole group's memory on the device chosen for it (EST is +inf where
    the group does not fit), later members go to that device (Celeritas 6.1
    "first member decides", as in Baechi).  Transfers are not serialised
    here (the paper's model); the estimate's ``makespan_s`` is the
    simulator's, ``schedule_makespan_s`` Algorithm 2's own.

    Parameters
    ----------
    graph : Graph
        Usually a coarse graph; any graph works (O(k (V + E)) plus the slot
        search of the timeline).
    cluster : Cluster
    seed : int
        Unused (deterministic).
    insertion : bool
        Insertion-based EST (the paper's rule); False appends only.
    order : bool
        Write the per-device order of the EST schedule into the placement
        (the simulator then follows it strictly).  Default off: the paper's
        output is a device per node.

    Returns
    -------
    Placement
        Over the original node ids of a coarse graph.

    References
    ----------
    Celeritas 5.2, Eq. 7-9, Algorithm 2; 6.1 (colocation).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> nd = lambda i: {"id": i, "compute_s": 1.0, "memory_bytes": 0}
    >>> g = build("fork", [nd("r"), nd("a"), nd("b")],
    ...           [{"src": "r", "dst": "a", "bytes": 10}, {"src": "r", "dst": "b", "bytes": 10}])
    >>> p = adjusting(g, uniform(2, bandwidth=100.0, latency=0.0))
    >>> sorted(set(p.assignment.values()))   # b moves: 1.1 start beats 2.0 by > 0
    ['gpu0', 'gpu1']
    """
    costs = cost_model(graph, cluster, costs)
    k, n = cluster.k, graph.n
    seq = cpd_topo(graph, costs)
    time = costs.time
    comm = costs.comm
    src = graph.edge_src
    in_edges, out_edges = graph.in_edges, graph.out_edges
    mem = DeviceMemory(graph, cluster)
    tl = Timeline(k)
    fin = [0.0] * n
    dev = [-1] * n
    start_of = [0.0] * n
    dk = -1
    moves = 0
    best_effort = 0

    def est_on(v: int, d: int) -> float:
        pre = 0.0
        for e in in_edges[v]:
            p = src[e]
            t = fin[p] if dev[p] == d else fin[p] + comm(e, dev[p], d)
            if t > pre:
                pre = t
        return tl.earliest_start(d, pre, time[v][d], insertion)

    for v in seq:
        forced = mem.pinned_device(v)
        if forced >= 0:
            d = forced
            s = est_on(v, d)
        else:
            est = [est_on(v, d) if mem.fits(v, d) else INF for d in range(k)]
            d1 = min(range(k), key=lambda x: (est[x], x))
            if dk < 0:
                dk = d1
            if est[d1] == INF:  # all devices are out of memory: best effort, lowest usage
                d = mem.fallback(v, rule="least_used")
                s = est_on(v, d)
                best_effort += 1
            elif est[dk] == INF:  # d_k full: earliest device with room (Eq. 9 with EST(d_k) = inf)
                d, s = d1, est[d1]
            else:
                back = 0.0
                if d1 != dk:
                    for e in out_edges[v]:
                        c = comm(e, d1, dk)
                        if c > back:
                            back = c
                if est[dk] - est[d1] > back:  # Eq. 9
                    d, s = d1, est[d1]
                else:
                    d, s = dk, est[dk]
            if d != dk:
                moves += 1
            mem.place(v, d)
        f = s + time[v][d]
        tl.reserve(d, s, f, v)
        dev[v] = d
        fin[v] = f
        start_of[v] = s
        dk = d
    sched_ms = max(fin) if n else 0.0
    per_dev = [tl.order(d) for d in range(k)] if order else None
    est_doc = placement_estimate(graph, cluster, dev, costs, mem.load,
                                 {"schedule_makespan_s": sched_ms, "device_changes": moves,
                                  "best_effort_nodes": best_effort}, order=per_dev)
    return Placement.from_indices(graph, cluster, dev, algorithm="adjusting", seed=seed, order=per_dev,
                                  params={"insertion": insertion, "order": order}, estimate=est_doc)
