"""Baechi's co-placement coarsening: merge an edge u -> v when u's only
successor is v or v's only predecessor is u.

Jeon et al., "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (operator co-placement: "when the output of an
operator is consumed only by another operator, place them together";
released code ``CoplacementGrouper``).  Celeritas 5.1.2 describes the rule
as "limiting the merged node's indegree or outdegree to 1, which avoids
loops" and contrasts it with its own Optimal Operation Fusion.

Algorithm.  The *eligible* edges are Baechi's: ``u -> v`` of the original
graph where u's only successor is v or v's only predecessor is u.  They
are contracted one at a time (union-find over a quotient graph), in
order of (topological index of u, of v), but only while the two clusters
still satisfy the rule *in the quotient*: cluster ``A`` has exactly one
successor cluster or cluster ``B`` exactly one predecessor cluster.  An
edge failing that is deferred to the next pass and dropped when a pass
merges nothing more.  Baechi applies the rule to colocation groups, where
cycles do not matter; for a coarse DAG they do: in the graph x->r, p->q,
p->r, q->s, r->s, r->t the eligible edges p->q, q->s, x->r, r->t would
give clusters {p,q,s} and {x,r,t} with edges both ways.  Applying the rule
to the *current* quotient instead (re-deriving degrees after each merge)
would avoid that but collapses any single-sink DAG to one node.

Acyclicity.  Contracting ``A -> B`` in a DAG creates a cycle only if
another path ``A -> X -> ... -> B`` exists.  If ``A``'s only successor is
``B`` every path out of ``A`` starts with the edge ``A -> B``; if ``B``'s
only predecessor is ``A`` every path into ``B`` ends with it; either way
there is no other path, so each contraction keeps the quotient a DAG.
:func:`celeritas_cli.transform.contract.is_acyclic` re-checks the result (tests too).

Colocation.  Groups are kept as constraints, not fused: :func:`contract`
gives every coarse node that holds a group member the group's
(merged) colocation value, so a coarse placement can never split a group.
Fusing a whole group into one node (Baechi's colocation grouping) would
create cycles here, because a weight's forward op and its optimizer update
sit at opposite ends of the training graph.
"""

from __future__ import annotations

from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..registry import register_coarsener
from ..transform.contract import contract, is_acyclic


def baechi_clusters(graph: Graph) -> list[int]:
    """``cluster_of[v]`` (values 0..c-1, numbered by first member in
    topological order) under the degree-1 merge rule (module docstring)."""
    n = graph.n
    parent = list(range(n))
    succ = [set(s) for s in graph.succ]
    pred = [set(p) for p in graph.pred]
    ti = graph.topo_index()
    first = list(ti)  # smallest topological index in each cluster

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def merge(a: int, b: int) -> None:
        """Contract quotient edge a -> b (both representatives)."""
        if len(succ[a]) + len(pred[a]) < len(succ[b]) + len(pred[b]):
            keep, drop = b, a
        else:
            keep, drop = a, b
        parent[drop] = keep
        first[keep] = min(first[keep], first[drop])
        for x in succ[drop]:
            pred[x].discard(drop)
            if x != keep:
                pred[x].add(keep)
                succ[keep].add(x)
        for x in pred[drop]:
            succ[x].discard(drop)
            if x != keep:
                succ[x].add(keep)
                pred[keep].add(x)
        for side in (succ[keep], pred[keep]):
            side.discard(drop)
            side.discard(keep)
        succ[drop] = set()
        pred[drop] = set()

    # Baechi's eligible edges: u's only successor is v, or v's only predecessor is u
    eligible = sorted({(ti[u], ti[v], u, v) for u in range(n) for v in graph.succ[u]
                       if len(graph.succ[u]) == 1 or len(graph.pred[v]) == 1})
    pending = [(u, v) for _, _, u, v in eligible]
    while pending:
        deferred = []
        for u, v in pending:
            a, b = find(u), find(v)
            if a == b:
                continue
            if len(succ[a]) == 1 or len(pred[b]) == 1:
                merge(a, b)
            else:
                deferred.append((u, v))
        if len(deferred) == len(pending):
            break  # the rest would risk a cycle in the quotient
        pending = deferred
    reps = sorted({find(v) for v in range(n)}, key=lambda r: first[r])
    number = {r: i for i, r in enumerate(reps)}
    return [number[find(v)] for v in range(n)]


@register_coarsener("baechi", paper="Baechi (Jeon et al., SoCC 2020)",
                    section="co-placement (released placer/grouper.py); Celeritas 5.1.2",
                    summary="Merge u->v when u has out-degree 1 or v in-degree 1 (never a cycle).")
def baechi(graph: Graph, cluster: Cluster, *, costs: CostModel | None = None) -> Graph:
    """Coarsen *graph* with Baechi's degree-1 co-placement rule.

    Parameters
    ----------
    graph : Graph
    cluster : Cluster
        Unused (the rule is structural); part of the coarsener signature.

    Returns
    -------
    Graph
        The coarse graph (``meta.coarsening = "baechi"``), acyclic.

    References
    ----------
    Jeon et al., SoCC 2020 (co-placement); Celeritas 5.1.2.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("c", [{"id": x, "compute_s": 1, "memory_bytes": 0} for x in "abc"],
    ...           [{"src": "a", "dst": "b", "bytes": 1}, {"src": "b", "dst": "c", "bytes": 1}])
    >>> baechi(g, uniform(2)).n
    1
    """
    cluster_of = baechi_clusters(graph)
    if not is_acyclic(graph, cluster_of):  # pragma: no cover - impossible by the docstring's argument
        raise RuntimeError("baechi coarsening produced a cycle")
    return contract(graph, cluster_of, method="baechi")
