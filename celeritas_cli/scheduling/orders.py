"""Topological orders used to place and to coarsen graphs.

* :func:`m_topo` - Baechi's M-TOPO: Kahn's algorithm with a FIFO queue of
  0-indegree nodes (BFS-like), Celeritas 4.2.2 / Jeon et al. 2020.
* :func:`dfs_topo` - Celeritas' DFS-TOPO (4.2.2): the newly freed children
  of the node just output go to the *head* of the queue, so a chain is
  output contiguously (depth first).
* :func:`cpd_topo` - Celeritas' critical-path DFS-TOPO (5.1.3, Algorithm 1
  function CPD_Topo): roots sorted by decreasing ``cpath = tlevel + blevel``,
  the children of the node just output sorted by increasing ``cpath`` and
  each freed child pushed to the head, so the child with the largest
  ``cpath`` (the one on the critical path) comes next.

All functions are iterative (no recursion, so 100k-node graphs are fine),
run in O(V + E log deg) and return plain lists of node indices.  Ties are
broken by node index, so the orders are deterministic.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ..errors import CycleError
from ..model.costs import downward_rank, upward_rank
from ..model.graph import Graph, describe_cycle

__all__ = ["m_topo", "dfs_topo", "cpd_topo", "tlevel_blevel", "node_edge_costs", "cut_edges"]


def node_edge_costs(graph: Graph, costs=None) -> tuple[list[float], list[float]]:
    """Node weights ``w[v]`` and edge weights ``c[e]`` from *costs*.

    Parameters
    ----------
    graph : Graph
    costs : CostModel, (w, c) pair of sequences, or None
        A :class:`~celeritas_cli.model.costs.CostModel` gives the mean node time
        over devices and the mean transfer time of each edge over ordered
        pairs of distinct devices - the ``w_i`` and ``c_ij`` of Celeritas
        Eq. 1.  A pair ``(w, c)`` is used as given.  ``None`` means
        ``w = compute_s`` and no communication.

    Returns
    -------
    (list[float], list[float])
    """
    if costs is None:
        return list(graph.compute), [0.0] * graph.m
    if isinstance(costs, (tuple, list)):
        w, c = costs
        return list(w), list(c)
    return list(costs.mean_time), list(costs.mean_comms)


def tlevel_blevel(graph: Graph, costs=None) -> tuple[list[float], list[float]]:
    """Top and bottom levels of every node, with communication cost.

    ``tlevel(v) = max over in-edges (p, v) of tlevel(p) + w_p + c_pv`` (0 for
    sources) and ``blevel(v) = w_v + max over out-edges (v, s) of
    c_vs + blevel(s)`` (``w_v`` for sinks).  Parallel edges between the same
    pair (different tensors) are taken one by one, so the heaviest counts.

    Parameters
    ----------
    graph : Graph
    costs : CostModel, (w, c) pair, or None
        See :func:`node_edge_costs`.

    Returns
    -------
    (list[float], list[float])
        ``tlevel`` and ``blevel`` indexed by node.

    References
    ----------
    Celeritas (Zhang et al.), section 5.1.3, Eq. 2 (tlevel) and Eq. 3 (blevel).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("c", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 1}])
    >>> tlevel_blevel(g, ([1.0, 2.0], [0.5]))
    ([0.0, 1.5], [3.5, 2.0])
    """
    w, c = node_edge_costs(graph, costs)
    # tlevel is the downward rank and blevel the upward rank (costs.py)
    tl = downward_rank(graph, w.__getitem__, c.__getitem__)
    bl = upward_rank(graph, w.__getitem__, c.__getitem__)
    return tl, bl


def m_topo(graph: Graph) -> list[int]:
    """Baechi's M-TOPO order: Kahn's algorithm, FIFO queue, sources in index
    order, newly freed nodes appended to the tail (BFS-like).

    Returns
    -------
    list[int]
        Node indices in topological order (a copy of ``graph.topo_order()``).

    References
    ----------
    Celeritas 4.2.2 (M-TOPO, Jeon et al. 2020, Baechi).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 0}
    >>> g = build("f", [nd("a1"), nd("a2"), nd("b1"), nd("b2")],
    ...           [{"src": "a1", "dst": "b1", "bytes": 1}, {"src": "a2", "dst": "b2", "bytes": 1}])
    >>> [g.ids[v] for v in m_topo(g)]
    ['a1', 'a2', 'b1', 'b2']
    """
    return list(graph.topo_order())


def _head_queue_order(graph: Graph, roots: Sequence[int], children_of) -> list[int]:
    """Shared loop of DFS-TOPO and CPD-TOPO: pop the head of the queue,
    output it, and push each child that becomes 0-indegree to the head, in
    the order ``children_of(v)`` yields them (so the *last* pushed is next)."""
    n = graph.n
    indeg = [len(p) for p in graph.pred]
    queue = deque(roots)
    order: list[int] = []
    append, popleft, pushleft = order.append, queue.popleft, queue.appendleft
    while queue:
        v = popleft()
        append(v)
        for s in children_of(v):
            indeg[s] -= 1
            if indeg[s] == 0:
                pushleft(s)
    if len(order) != n:
        raise CycleError(f"graph {graph.name!r}: {describe_cycle(graph)}")
    return order


def dfs_topo(graph: Graph) -> list[int]:
    """Celeritas' DFS-TOPO order.

    A queue holds the 0-indegree nodes (initially the sources in index
    order).  The head is output and its out-edges removed; the children that
    become 0-indegree are pushed to the *head* of the queue.  Reading chosen
    where the paper defers to 5.1 for several freed children: without
    ``cpath`` values, children are pushed in reverse successor (edge) order,
    so the first successor is output next - plain depth-first order.

    Returns
    -------
    list[int]

    References
    ----------
    Celeritas 4.2.2 (DFS-TOPO) and Figure 3.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 0}
    >>> g = build("f", [nd("a1"), nd("a2"), nd("b1"), nd("b2")],
    ...           [{"src": "a1", "dst": "b1", "bytes": 1}, {"src": "a2", "dst": "b2", "bytes": 1}])
    >>> [g.ids[v] for v in dfs_topo(g)]
    ['a1', 'b1', 'a2', 'b2']
    """
    succ = graph.succ
    roots = [v for v in range(graph.n) if not graph.pred[v]]
    return _head_queue_order(graph, roots, lambda v: reversed(succ[v]))


def cpd_topo(graph: Graph, costs=None) -> list[int]:
    """Celeritas' critical-path DFS-TOPO (CPD-TOPO) order.

    ``cpath(v) = tlevel(v) + blevel(v)`` (:func:`tlevel_blevel`).  The queue
    starts with the sources sorted by decreasing ``cpath`` (ties: lower
    index first).  Repeatedly the head is output, its children are sorted
    by increasing ``cpath`` (ties: higher index first) and every child whose
    indegree drops to 0 is pushed to the head in that order, so the freed
    child with the largest ``cpath`` - the one on the critical path - is
    output next (Algorithm 1, lines 8-23).

    Parameters
    ----------
    graph : Graph
    costs : CostModel, (w, c) pair, or None
        Node and edge weights for ``tlevel``/``blevel``; see
        :func:`node_edge_costs` (a CostModel gives Eq. 1's mean costs).

    Returns
    -------
    list[int]
        Node indices; position ``i`` holds the node with ``CPD_Order = i``.

    References
    ----------
    Celeritas 5.1.3, Eq. 2-3 and Algorithm 1 (function CPD_Topo).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, w: {"id": i, "compute_s": w, "memory_bytes": 0}
    >>> g = build("fork", [nd("r", 1), nd("light", 1), nd("heavy", 5)],
    ...           [{"src": "r", "dst": "light", "bytes": 1}, {"src": "r", "dst": "heavy", "bytes": 1}])
    >>> [g.ids[v] for v in cpd_topo(g)]
    ['r', 'heavy', 'light']
    """
    tl, bl = tlevel_blevel(graph, costs)
    cp = [a + b for a, b in zip(tl, bl)]
    roots = sorted((v for v in range(graph.n) if not graph.pred[v]), key=lambda v: (-cp[v], v))
    succ = graph.succ
    # children sorted once, by increasing cpath (ties: higher index first so
    # the lower index ends at the head)
    kids = [sorted(s, key=lambda x: (cp[x], -x)) if len(s) > 1 else s for s in succ]
    return _head_queue_order(graph, roots, kids.__getitem__)


def cut_edges(graph: Graph, order: Sequence[int], parts: int) -> int:
    """Edges cut when *order* is split into *parts* contiguous, equally
    sized pieces (the Figure 3 comparison of Celeritas 4.2.2)."""
    n = graph.n
    pos = [0] * n
    for i, v in enumerate(order):
        pos[v] = i
    size = -(-n // parts) if parts else n
    return sum(1 for s, d in zip(graph.edge_src, graph.edge_dst) if pos[s] // size != pos[d] // size)
