"""Celeritas' Optimal Operation Fusion: CPD-TOPO order + Optimal_BP breakpoints.

The nodes are sorted in CPD-TOPO order (:func:`celeritas_cli.scheduling.orders.cpd_topo`),
and the sequence is cut at the breakpoints that minimise the total
communication cost between consecutive clusters (Kernighan's sequential
partitioning, Celeritas Eq. 4-6), each cluster spanning at most ``R`` nodes
and ``M`` bytes.  Clusters become coarse nodes with
:func:`celeritas_cli.coarsening.contract.contract`; because every cluster is a contiguous
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
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import InvalidInput, SolverError
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.limits import BYTES_MAX
from ..registry import Param, register_coarsener
from ..scheduling.orders import cpd_topo
from .contract import contract, is_acyclic


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
    prefix = [0]
    for v in seq:
        prefix.append(prefix[-1] + graph.memory[v])
    # A[i] + off = S(i) + cost(i, j) for the current j.  The "+ out(v_{j-1})"
    # term of Eq. 5 is the same for every i, so it goes into the scalar off.
    A = np.zeros(n + 1)
    S = [0.0] * (n + 1)
    P = [0] * (n + 1)
    off = 0.0
    mlo = 0  # smallest i with prefix[j] - prefix[i] <= mem_cap
    for j in range(1, n + 1):
        x = j - 1
        # entries below j - R or below the memory window (mlo only grows) are dead
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
    starts = []
    k = n
    while k > 0:
        k = P[k]
        starts.append(k)
    starts.reverse()
    return starts, float(S[n])


def cpd_clusters(graph: Graph, cluster: Cluster, *, R: int = 200, M: float = 0.25,
                 costs: CostModel | None = None) -> tuple[list[int], dict]:
    """Cluster id per node by Algorithm 1 (see the module docstring for the
    colocation followers).  Returns ``(cluster_of, info)``."""
    costs = cost_model(graph, cluster, costs)
    cap = memory_cap(cluster, M)
    w = costs.mean_time
    c = [costs.mean_comm(e) for e in range(graph.m)]
    seq = cpd_topo(graph, (w, c))
    starts, total = optimal_bp(graph, seq, c, R, cap)
    cluster_of = [0] * graph.n
    bounds = starts + [len(seq)]
    for ci in range(len(starts)):
        for p in range(bounds[ci], bounds[ci + 1]):
            cluster_of[seq[p]] = ci
    # colocation followers (module docstring)
    anchor: dict[str, int] = {}
    for v in seq:
        g = graph.colocation[v]
        if g is not None and g not in anchor:
            anchor[g] = v
    follower_cluster: dict[int, int] = {}
    nxt = len(starts)
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
    info = {"R": R, "M_bytes": cap, "segments": len(starts), "follower_nodes": len(follower_cluster),
            "detached_sinks": detached, "cut_cost_s": total}
    return cluster_of, info


@register_coarsener(
    "cpd", paper="Celeritas", section="5.1, Algorithm 1 (Eq. 4-6)",
    summary="CPD-TOPO order, optimal breakpoints within range R and memory M; clusters become coarse nodes.",
    params={"R": Param(int, 200, "exploration range: max nodes per cluster", min=1),
            "M": Param(float, 0.25, "memory cap per cluster: fraction of the smallest device memory "
                                    "if <= 1, else bytes", gt=0, max=BYTES_MAX)})
def cpd(graph: Graph, cluster: Cluster, *, costs: CostModel | None = None, R: int = 200, M: float = 0.25) -> Graph:
    """Optimal Operation Fusion (Celeritas Algorithm 1): the coarse graph.

    Parameters
    ----------
    graph : Graph
        Fine (or already coarse) graph.
    cluster : Cluster
        Supplies the communication costs (Eq. 1) and the memory cap.
    R : int
        Exploration range (Eq. 6), default 200 as in the paper.
    M : float
        Memory cap per cluster: a fraction of the smallest device memory if
        <= 1 (default 0.25, the paper's choice), else bytes.

    Returns
    -------
    Graph
        The coarse graph (``members``, aggregated edges, ``meta.coarsening
        = "cpd"``, ``meta.cpd`` with the parameters and the DP's cut cost).

    Raises
    ------
    InvalidInput
        R < 1 or M not positive.
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
    """
    costs = cost_model(graph, cluster, costs)
    cluster_of, info = cpd_clusters(graph, cluster, R=R, M=M, costs=costs)
    if graph.n and not is_acyclic(graph, cluster_of):
        raise SolverError(f"coarsening 'cpd' of graph '{graph.name}' produced a cyclic coarse graph "
                          f"(a bug: Lemma 2 forbids it); report it with the graph file")
    return contract(graph, cluster_of, method="cpd", extra_meta={"cpd": info})
