"""Celeritas' Optimal Operation Fusion: CPD-TOPO order + Optimal_BP breakpoints.

The nodes are sorted in CPD-TOPO order (:func:`celeritas_cli.scheduling.orders.cpd_topo`),
and the sequence is cut at the breakpoints that minimise the total
communication cost between consecutive clusters (Kernighan's sequential
partitioning, Celeritas Eq. 4-6), each cluster spanning at most ``R`` nodes
and ``M`` bytes.  Clusters become coarse nodes with
:func:`celeritas_cli.transform.contract.contract`; because every cluster is a contiguous
piece of a topological order, the coarse graph is a DAG (Lemma 2).

Colocation groups (the reading chosen here; the paper only says TensorFlow
places a group where its first node went, 6.1): :func:`contract` gives
coarse nodes that share any colocation group one colocation value, so a
valid coarse placement never splits a group.  Left alone that chains groups
together: on a training graph the forward op holding a weight and its
optimizer update (colocated, far apart in any topological order) would tie
the forward cluster to a backward cluster that holds the updates of other
forward clusters, and so on, until one group spans the whole graph.  So a
colocated node that is a *sink* (no successors, e.g. an optimizer update)
and did not land in the cluster of its group's first member (in CPD-TOPO
order) is moved out of its cluster into a "follower" coarse node holding
the detached sinks whose anchors share one cluster.  A set of sinks has no
out-edges, so this cannot create a cycle, and each coarse colocation group
stays one cluster plus its followers.  Colocated nodes that are not sinks
stay where the DP put them (their groups then merge clusters, which is
then a real constraint of that partition).

Feasibility (not in the paper): coarsening must not turn a graph that fits
the devices into one that does not.  With ``T`` the graph's memory and
``C_d`` the devices' memories, ``s = (sum C_d - T) / k`` is the *packing
bound*.  Every cluster is capped at ``min(M, s)`` bytes (a single node
heavier than that is a cluster by itself), and a *coarse colocation unit*
(coarse nodes tied by shared groups, which must share a device) heavier
than ``s`` that is more than one original unit (a colocation group, or a
node) is undone:
its clusters are split into their colocated nodes (one coarse node each)
and the runs of other nodes between them (:func:`split_heavy_units`).  Then
every coarse unit is one original unit or weighs at most ``s``, and a
placement of the coarse graph fits whenever one of the original graph
does: put the coarse units that are original units where that placement
put them, then the others first-fit; one that fits no device would mean
every device is loaded above ``C_d - s``, more than ``T`` in all.

Default parameters (:func:`default_parameters`, used when ``R`` or ``M``
is 0): ``R = min(200, ceil(n / (3 k)))`` for ``n`` nodes on ``k`` devices -
the paper's R = 200 (chosen for TensorFlow graphs of 3.8k-36k nodes, Table
2: 37-220 coarse nodes), lowered on smaller graphs so that the DP cuts at
least ``3 k`` clusters (at ``n / R`` segments at least, usually more): a
few per device instead of the 1-3 coarse nodes R = 200 leaves of a graph
of a few hundred operators.  ``M = 0.25`` (the paper's), lowered to the
packing bound when memory is tight.  (Measured on the zoo graphs and
synthetic layered graphs on three clusters, the makespan Adjusting reaches
is erratic in R - a greedy placer meets memory limits at different cuts -
and no rule of the coarse-graph size was better on all; this one was
among the best on average and never collapses a graph.)
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import InvalidInput, SolverError
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.limits import BYTES_MAX, COUNT_MAX
from ..registry import Param, register_coarsener
from ..scheduling.orders import cpd_topo
from ..transform.contract import contract, is_acyclic

DEFAULT_M = 0.25
DEFAULT_R = 200       # the paper's exploration range
MIN_PER_DEVICE = 3    # the default R leaves at least this many clusters per device


def packing_bound(graph: Graph, cluster: Cluster) -> int | None:
    """``(sum of device memories - graph memory) / devices`` in bytes: a
    cluster or coarse colocation unit no heavier than this can always be
    packed after the rest (module docstring; 0 when the graph fills the
    devices exactly: then only nodes without memory are merged); None when
    the graph's memory exceeds the cluster's (nothing fits anyway)."""
    slack = cluster.total_memory() - graph.total_memory()
    return slack // cluster.k if slack >= 0 and cluster.k else None


def default_parameters(graph: Graph, cluster: Cluster) -> tuple[int, float]:
    """Default ``(R, M)`` of :func:`cpd` for *graph* on *cluster*.

    ``R = min(200, ceil(n / (3 k)))``: the paper's 200, lowered so that the
    coarse graph has at least 3 nodes per device; ``M`` is the paper's 0.25
    of the smallest device memory, lowered to the packing bound
    (:func:`packing_bound`) when that is smaller.  See the module docstring;
    other granularities are ``cpd(graph, cluster, R=..., M=...)``.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> default_parameters(layered(36000), uniform(4)), default_parameters(layered(60), uniform(4))
    ((200, 0.25), (5, 0.25))
    """
    n, k = graph.n, max(1, cluster.k)
    R = max(1, min(DEFAULT_R, math.ceil(n / (MIN_PER_DEVICE * k))))
    M = DEFAULT_M
    bound = packing_bound(graph, cluster)
    if bound is not None and cluster.min_memory() > 0:
        M = min(M, max(bound, 1) / cluster.min_memory())
    return R, M


def memory_cap(cluster: Cluster, M: float) -> int:
    """Per-cluster memory cap in bytes: ``M`` times the smallest device
    memory when ``M <= 1``, else ``M`` bytes (Celeritas 5.1.3, "M = 0.25*")."""
    if not (M > 0) or not math.isfinite(M):
        raise InvalidInput(f"coarsening 'cpd' parameter M: must be a positive fraction (<= 1) or bytes, got {M}")
    return int(M * cluster.min_memory()) if M <= 1 else int(M)


def optimal_bp(graph: Graph, seq: Sequence[int], edge_cost: Sequence[float], R: int,
               mem_cap: float) -> tuple[list[int], float]:
    """Optimal breakpoints of the node sequence *seq* (Optimal_BP).

    With ``v_1..v_n = seq``, a partition into clusters of consecutive nodes
    is given by the positions where clusters start.  ``cost(i, j)`` (Eq. 4)
    is the communication from ``set[v_i, v_j) = {v_i..v_{j-1}}`` to the nodes
    from ``v_j`` on, and

        S(j) = min over i of S(i) + cost(i, j),  S(0) = 0            (Eq. 6)
        subject to  j - R <= i < j  and  memory(v_i..v_{j-1}) <= M.

    ``S(n)`` is the total inter-cluster communication.  For a fixed ``j``
    the whole window ``cost(., j)`` is updated from ``cost(., j-1)`` with
    Eq. 5 in one vector step: every ``cost(i, j)`` gains the out-edges of
    ``v_{j-1}`` and loses its in-edges from ``[i, j-1)``, so the DP takes
    O(R·n + E) vector work instead of recomputing Eq. 4 (quadratic).
    Steps: the edge terms per position (:func:`_sequence_edges`), the DP
    (:func:`_breakpoint_dp`, Algorithm 1 lines 25-28), the breakpoints
    (:func:`_backtrack`, lines 29-33).

    Reading where the paper is silent: a single node heavier than ``M``
    forms a cluster by itself (otherwise no partition exists); ties between
    equally cheap predecessors go to the earliest ``i`` (larger cluster).
    Only edges between nodes of *seq* count.

    Parameters
    ----------
    graph : Graph
    seq : sequence of int
        Node indices in a topological order (CPD-TOPO in Algorithm 1).
    edge_cost : sequence of float
        ``c[e]`` per edge of *graph* (Eq. 1's mean transfer time).
    R : int
        Exploration range (max nodes per cluster), >= 1.
    mem_cap : float
        Max memory (bytes) per cluster.

    Returns
    -------
    (list[int], float)
        Cluster start positions in *seq* (first is 0; empty for an empty
        sequence) and the optimal cost ``S(n)``.

    References
    ----------
    Celeritas 5.1.3, Eq. 4-6 and Algorithm 1 (function Optimal_BP);
    Kernighan 1971, "Optimal sequential partitions of graphs".

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 1}
    >>> g = build("c", [nd("a"), nd("b"), nd("c"), nd("d")],
    ...           [{"src": "a", "dst": "b", "bytes": 5}, {"src": "b", "dst": "c", "bytes": 1},
    ...            {"src": "c", "dst": "d", "bytes": 5}])
    >>> optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], R=2, mem_cap=10)
    ([0, 2], 1.0)
    """
    n = len(seq)
    if R < 1:
        raise InvalidInput(f"coarsening 'cpd' parameter R: must be >= 1, got {R}")
    if n == 0:
        return [], 0.0
    out_sum, ins = _sequence_edges(graph, seq, edge_cost)
    prefix = [0]
    for v in seq:
        prefix.append(prefix[-1] + graph.memory[v])
    S, P = _breakpoint_dp(out_sum, ins, prefix, R, mem_cap)
    return _backtrack(P), float(S[n])


def _sequence_edges(graph: Graph, seq: Sequence[int], edge_cost: Sequence[float]
                    ) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The terms of Eq. 4-5 per position of *seq*: ``out_sum[x]`` = cost of
    the out-edges of ``v_x`` (to nodes of *seq*), ``ins[x]`` = ``(position,
    cost)`` of its in-edges from nodes of *seq*.

    Raises
    ------
    InvalidInput
        *seq* is not topological.
    """
    n = len(seq)
    pos = [-1] * graph.n
    for i, v in enumerate(seq):
        pos[v] = i
    out_sum = [0.0] * n
    ins: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for e, (s, d) in enumerate(zip(graph.edge_src, graph.edge_dst)):
        ps, pd = pos[s], pos[d]
        if ps < 0 or pd < 0:
            continue
        if pd <= ps:
            raise InvalidInput(f"optimal_bp: sequence is not topological (edge {graph.ids[s]}->{graph.ids[d]})")
        out_sum[ps] += edge_cost[e]
        ins[pd].append((ps, edge_cost[e]))
    return out_sum, ins


def _breakpoint_dp(out_sum: list[float], ins: list[list[tuple[int, float]]], prefix: list[int], R: int,
                   mem_cap: float) -> tuple[list[float], list[int]]:
    """Algorithm 1 lines 25-28: ``S(j)`` by Eq. 6 and ``P(j)``, the start of
    the last cluster of an optimal partition of ``v_1..v_j``, for every
    ``j``; *prefix* is the memory prefix sum of the sequence.

    ``A[i] + off = S(i) + cost(i, j)`` for the current ``j``: Eq. 5 updates
    the window in one vector step (the "+ out(v_{j-1})" term is the same
    for every ``i``, so it goes into the scalar ``off``); a position below
    ``j - R`` or below the memory window (``mlo``, which only grows) is
    dead.  The argmin takes the earliest ``i`` on ties; when no ``i`` fits
    the memory cap, ``v_{j-1}`` is a cluster by itself.
    """
    import numpy as np  # here, not at module level: registry loads this module for every command

    n = len(out_sum)
    A = np.zeros(n + 1)
    S = [0.0] * (n + 1)
    P = [0] * (n + 1)
    off = 0.0
    mlo = 0  # smallest i with prefix[j] - prefix[i] <= mem_cap
    for j in range(1, n + 1):
        x = j - 1
        lo = max(j - R, mlo)
        # Eq. 5: cost(i, j) = cost(i, j-1) + out(v_{j-1}) - in(v_{j-1} from [i, j-1))
        o = out_sum[x]
        off += o
        for s, c in ins[x]:
            if s >= lo:
                A[lo:s + 1] -= c
        A[x] = S[x] + o - off
        pj = prefix[j]
        while pj - prefix[mlo] > mem_cap:
            mlo += 1
        a = max(lo, min(mlo, x))
        best = x if a == x else a + int(A[a:j].argmin())
        S[j] = float(A[best]) + off
        P[j] = best
    return S, P


def _backtrack(P: list[int]) -> list[int]:
    """Algorithm 1 lines 29-33: the cluster starts, following ``P`` back
    from ``n`` (``P(P(n))``, ...) to 0, in sequence order."""
    starts = []
    k = len(P) - 1
    while k > 0:
        k = P[k]
        starts.append(k)
    starts.reverse()
    return starts


def cpd_clusters(graph: Graph, cluster: Cluster, *, R: int = 0, M: float = 0.0,
                 costs: CostModel | None = None) -> tuple[list[int], dict]:
    """Cluster id per node by Algorithm 1 (see the module docstring for the
    colocation followers and the feasibility rule; ``R`` / ``M`` of 0 take
    :func:`default_parameters`).  Returns ``(cluster_of, info)``."""
    if R < 0:
        raise InvalidInput(f"coarsening 'cpd' parameter R: must be >= 1 (0 = from the graph), got {R}")
    if not (M >= 0) or not math.isfinite(M):
        raise InvalidInput(f"coarsening 'cpd' parameter M: must be a positive fraction (<= 1) or bytes "
                           f"(0 = the default), got {M}")
    costs = cost_model(graph, cluster, costs)
    auto_R, auto_M = default_parameters(graph, cluster) if not (R and M) else (R, M)
    R, M = R or auto_R, M or auto_M
    cap = memory_cap(cluster, M)
    bound = packing_bound(graph, cluster)
    # units heavier than this are undone: the packing bound, or (nothing fits anyway) the largest device
    unit_cap = bound if bound is not None else max(d.memory for d in cluster.devices)
    cap = min(cap, unit_cap)
    w = costs.mean_time
    c = costs.mean_comms
    seq = cpd_topo(graph, (w, c))
    starts, total = optimal_bp(graph, seq, c, R, cap)
    cluster_of = [0] * graph.n
    bounds = starts + [len(seq)]
    for ci in range(len(starts)):
        for p in range(bounds[ci], bounds[ci + 1]):
            cluster_of[seq[p]] = ci
    nxt, n_followers, detached = _detach_followers(graph, seq, cluster_of, len(starts))
    nxt, split = split_heavy_units(graph, seq, cluster_of, nxt, unit_cap)
    info = {"R": R, "M": M, "M_bytes": cap, "packing_bound_bytes": bound, "segments": len(starts),
            "follower_nodes": n_followers, "detached_sinks": detached, "split_units": split, "cut_cost_s": total}
    return cluster_of, info


def _detach_followers(graph: Graph, seq: Sequence[int], cluster_of: list[int], nxt: int) -> tuple[int, int, int]:
    """Move colocated sinks away from foreign clusters (module docstring);
    returns (next free cluster id, follower clusters, detached sinks)."""
    anchor: dict[str, int] = {}
    for v in seq:
        g = graph.colocation[v]
        if g is not None and g not in anchor:
            anchor[g] = v
    follower_cluster: dict[int, int] = {}
    detached = 0
    for v in seq:
        g = graph.colocation[v]
        if g is None or graph.succ[v]:
            continue
        home = cluster_of[anchor[g]]
        if cluster_of[v] == home:
            continue
        if home not in follower_cluster:
            follower_cluster[home] = nxt
            nxt += 1
        cluster_of[v] = follower_cluster[home]
        detached += 1
    return nxt, len(follower_cluster), detached


def split_heavy_units(graph: Graph, seq: Sequence[int], cluster_of: list[int], nxt: int,
                      cap: int) -> tuple[int, int]:
    """Undo every coarse colocation unit heavier than *cap* bytes that is
    more than one original unit (module docstring): each of its clusters is
    split, in *seq* order, into its colocated nodes (one cluster each) and
    the runs of other nodes between them.  Runs of a contiguous segment stay
    contiguous, so the quotient stays acyclic.  Updates *cluster_of* in
    place; returns (next free cluster id, units split).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, g=None: {"id": i, "compute_s": 1, "memory_bytes": 5,
    ...                          **({"colocation": g} if g else {})}
    >>> g = build("u", [nd("a", "x"), nd("b"), nd("c", "y"), nd("d", "x"), nd("e", "y")], [])
    >>> cl = [0, 0, 0, 1, 1]        # cluster 0 holds a (x), b, c (y); cluster 1 holds d (x), e (y)
    >>> split_heavy_units(g, [0, 1, 2, 3, 4], cl, 2, cap=20), cl   # the unit weighs 25 > 20
    ((5, 1), [0, 1, 2, 3, 4])
    """
    n_clusters = max(cluster_of, default=-1) + 1
    parent = list(range(n_clusters))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, int] = {}
    joined = False
    for v in [v for v, grp in enumerate(graph.colocation) if grp is not None]:
        grp, c = graph.colocation[v], cluster_of[v]
        if grp in first:
            a, b = find(first[grp]), find(c)
            if a != b:
                parent[max(a, b)] = min(a, b)
                joined = True
        else:
            first[grp] = c
    if not joined:  # every unit is one cluster: within the cap, or one node, or groups that share it alone
        return nxt, 0
    c_mem = [0] * n_clusters
    c_loose = [0] * n_clusters
    for v, c in enumerate(cluster_of):
        c_mem[c] += graph.memory[v]
        if graph.colocation[v] is None:
            c_loose[c] += 1
    mem: dict[int, int] = {}
    loose: dict[int, int] = {}  # ungrouped nodes per unit
    for c in range(n_clusters):
        u = find(c)
        mem[u] = mem.get(u, 0) + c_mem[c]
        loose[u] = loose.get(u, 0) + c_loose[c]
    groups: dict[int, set] = {}
    for grp, c in first.items():
        groups.setdefault(find(c), set()).add(grp)
    heavy = set()
    for u, m in mem.items():
        if m <= cap or u not in groups:  # light, or a cluster without colocation (no merging)
            continue
        if len(groups[u]) == 1 and not loose.get(u):  # exactly one original group
            continue
        heavy.add(u)
    if not heavy:
        return nxt, 0
    run_of: dict[int, int] = {}  # cluster -> its current run of ungrouped nodes
    for v in seq:
        c = cluster_of[v]
        if find(c) not in heavy:
            continue
        if graph.colocation[v] is not None:
            cluster_of[v] = nxt
            nxt += 1
            run_of.pop(c, None)
        else:
            if c not in run_of:
                run_of[c] = nxt
                nxt += 1
            cluster_of[v] = run_of[c]
    # renumber densely (clusters of heavy units are gone)
    ids: dict[int, int] = {}
    for v, c in enumerate(cluster_of):
        cluster_of[v] = ids.setdefault(c, len(ids))
    return len(ids), len(heavy)


@register_coarsener(
    "cpd", paper="Celeritas", section="5.1, Algorithm 1 (Eq. 4-6)",
    summary="CPD-TOPO order, optimal breakpoints within range R and memory M; clusters become coarse nodes.",
    params={"R": Param(int, 0, "exploration range: max nodes per cluster (0 = the paper's 200, lowered so "
                               "that there are at least 3 coarse nodes per device)", min=0, max=COUNT_MAX),
            "M": Param(float, 0.0, "memory cap per cluster: fraction of the smallest device memory "
                                   "if <= 1, else bytes (0 = 0.25, lowered to the packing bound)", min=0,
                       max=BYTES_MAX)})
def cpd(graph: Graph, cluster: Cluster, *, costs: CostModel | None = None, R: int = 0, M: float = 0.0) -> Graph:
    """Optimal Operation Fusion (Celeritas Algorithm 1): the coarse graph.

    Parameters
    ----------
    graph : Graph
        Fine (or already coarse) graph.
    cluster : Cluster
        Supplies the communication costs (Eq. 1) and the memory cap.
    R : int
        Exploration range (Eq. 6).  0 (default): from the graph and cluster,
        :func:`default_parameters` (the paper's 200, lowered on small graphs
        to keep at least 3 coarse nodes per device).
    M : float
        Memory cap per cluster: a fraction of the smallest device memory if
        <= 1, else bytes.  0 (default): the paper's 0.25, lowered to the
        packing bound.  Either way the cap is at most the packing bound
        (:func:`packing_bound`, module docstring).

    Returns
    -------
    Graph
        The coarse graph (``members``, aggregated edges, ``meta.coarsening
        = "cpd"``, ``meta.cpd`` with the parameters used, the effective
        memory cap ``M_bytes``, the units split for feasibility and the DP's
        cut cost).

    Raises
    ------
    InvalidInput
        R < 0 or M negative.
    SolverError
        The quotient has a cycle (cannot happen: Lemma 2; checked anyway).

    References
    ----------
    Celeritas 5.1 (Lemma 2, Eq. 1-6, Algorithm 1, Table 2).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> cg = cpd(layered(500, seed=1), uniform(4), R=50)
    >>> cg.n < 60, cg.meta["coarsening"]
    (True, 'cpd')
    >>> cpd(layered(500, seed=1), uniform(4)).n >= 12   # default R, M: at least 3 per device
    True
    """
    costs = cost_model(graph, cluster, costs)
    cluster_of, info = cpd_clusters(graph, cluster, R=R, M=M, costs=costs)
    if graph.n and not is_acyclic(graph, cluster_of):
        raise SolverError(f"coarsening 'cpd' of graph '{graph.name}' produced a cyclic coarse graph "
                          f"(a bug: Lemma 2 forbids it); report it with the graph file")
    return contract(graph, cluster_of, method="cpd", extra_meta={"cpd": info})
