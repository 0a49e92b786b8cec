"""Building a coarse graph from a partition of nodes into clusters.

Shared by every coarsening method (Celeritas CPD-TOPO + Optimal_BP, Baechi,
Moirai fusion): given ``cluster_of[v]`` for each node, :func:`contract`
returns the coarse :class:`Graph` whose node ``c`` stands for the members of
cluster ``c`` (docs/design.md: compute, memory and resident bytes are sums,
an edge between coarse nodes carries the sum of the distinct tensors
crossing it, and ``meta.coarsened_from`` names the original graph).  :func:`contract` does not
check acyclicity of the quotient; :func:`is_acyclic` does, and coarsening
methods assert it (Celeritas Lemma 2 guarantees it for contiguous segments
of a topological order).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Sequence

from ..model.graph import Graph
from ..model.residency import pass_of, resident_list


def contract(graph: Graph, cluster_of: Sequence[int], *, name: str | None = None,
             method: str = "", extra_meta: dict | None = None) -> Graph:
    """Contract *graph* by the partition ``cluster_of`` (values ``0..c-1``).

    Coarse node ids are the id of the first member in topological order;
    members are listed in topological order of *graph* (so orders expand
    validly).  If *graph* is itself coarse, members are original ids.
    Colocation: coarse nodes whose members share any colocation group share
    one colocation value (groups touched by one coarse node are merged, by
    union-find), so a group is never split by a valid coarse placement.
    A coarse edge that carries exactly one original tensor keeps that
    tensor's identity (``"<src>/<tensor>"``) so the simulator still sends it
    once per device; otherwise coarse edges from one coarse source with the
    same set of original tensors share a tensor id.  The result's ``origin``
    is the original graph (*graph*, or *graph*'s own origin when it is
    coarse), so placements on it can be judged on the original.

    Steps: the members of each coarse node (:func:`_coarse_members`), the
    merged colocation groups (:func:`_colocation_roots`), one node per
    cluster (:func:`_coarse_node`), the edges (:func:`_coarse_edges`).
    """
    members = _coarse_members(graph, cluster_of)
    new_index = {c: i for i, c in enumerate(members)}
    root = _colocation_roots(graph, members.values())
    nodes = [_coarse_node(graph, mem, root) for mem in members.values()]
    edges = _coarse_edges(graph, [new_index[c] for c in cluster_of], nodes)
    meta = dict(graph.meta)
    meta["coarsened_from"] = graph.original_name
    if method:
        meta["coarsening"] = method
    if extra_meta:
        meta.update(extra_meta)
    doc = {"schema": "placer.graph/v1", "name": name or f"{graph.original_name}@{method or 'coarse'}",
           "meta": meta, "nodes": nodes, "edges": edges}
    coarse = Graph.from_dict(doc, label=doc["name"])
    coarse.origin = graph.origin if graph.is_coarse else graph
    return coarse


def _coarse_members(graph: Graph, cluster_of: Sequence[int]) -> dict[int, list[int]]:
    """Non-empty clusters -> members in topological order, the clusters
    ordered by their first member's topological position (the coarse node
    order)."""
    n = graph.n
    k = (max(cluster_of) + 1) if n else 0
    members: list[list[int]] = [[] for _ in range(k)]
    for v in graph.topo_order():
        members[cluster_of[v]].append(v)
    topo_index = graph.topo_index()
    order = sorted(range(k), key=lambda c: topo_index[members[c][0]] if members[c] else n)
    return {c: members[c] for c in order if members[c]}


def _colocation_roots(graph: Graph, member_lists: Iterable[list[int]]) -> Callable[[str], str]:
    """Union-find over colocation group names: the groups one coarse node
    touches are merged; returns ``find`` (a group's representative, the
    smallest name of its merged set)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for mem in member_lists:
        groups = sorted({graph.colocation[v] for v in mem if graph.colocation[v] is not None})
        for gname in groups[1:]:
            ra, rb = find(groups[0]), find(gname)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return find


def _coarse_node(graph: Graph, mem: list[int], root: Callable[[str], str]) -> dict:
    """The node document of one cluster: compute and memory summed (per
    device type too, a member without a type's time counting its
    ``compute_s``), ``resident_bytes`` summed when the graph declares it
    (a member without it counting all its memory), the members' ``pass``
    when they all have the same, the merged colocation group,
    ``splittable`` kept for a single member, and the original ids as
    ``members``."""
    first = mem[0]
    types: set[str] = set()
    for v in mem:
        if graph.compute_by_type[v]:
            types.update(graph.compute_by_type[v])
    nd: dict = {"id": graph.ids[first],
                "op": graph.op[first] if len(mem) == 1 else f"group({len(mem)})",
                "compute_s": sum(graph.compute[v] for v in mem)}
    if types:
        nd["compute_by_type"] = {
            t: sum((graph.compute_by_type[v] or {}).get(t, graph.compute[v]) for v in mem)
            for t in sorted(types)}
    nd["memory_bytes"] = sum(graph.memory[v] for v in mem)
    resident = resident_list(graph)
    if resident is not None:
        nd["resident_bytes"] = sum(resident[v] for v in mem)
    passes = {pass_of(graph, v) for v in mem}
    if len(passes) == 1 and None not in passes:
        nd["pass"] = passes.pop()
    groups = sorted({graph.colocation[v] for v in mem if graph.colocation[v] is not None})
    if groups:
        nd["colocation"] = root(groups[0])
    if len(mem) == 1 and graph.splittable[first]:
        nd["splittable"] = graph.splittable[first]
    orig: list[str] = []
    for v in mem:
        orig.extend(graph.original_ids(v))
    nd["members"] = orig
    return nd


def _coarse_edges(graph: Graph, coarse_of: Sequence[int], nodes: list[dict]) -> list[dict]:
    """One edge per (coarse src, coarse dst) pair, carrying the sum of the
    distinct original tensors crossing it, in pair order.  Tensor identity:
    a single tensor keeps ``"<src>/<tensor>"``; a set of tensors gets
    ``"<coarse src>#set<i>"``, shared by the edges of one source with the
    same set.  An edge made of one original edge keeps its per-pair times."""
    crossing: dict[tuple[int, int], dict[int, int]] = {}
    first_edge: dict[tuple[int, int], list[int]] = {}
    for e in range(graph.m):
        cu = coarse_of[graph.edge_src[e]]
        cv = coarse_of[graph.edge_dst[e]]
        if cu == cv:
            continue
        t = graph.edge_tensor[e]
        crossing.setdefault((cu, cv), {})[t] = graph.tensor_bytes[t]
        first_edge.setdefault((cu, cv), []).append(e)
    edges = []
    set_names: dict[tuple[int, tuple[int, ...]], str] = {}
    for (cu, cv) in sorted(crossing):
        tensors = crossing[(cu, cv)]
        ed: dict = {"src": nodes[cu]["id"], "dst": nodes[cv]["id"], "bytes": sum(tensors.values())}
        tkey = tuple(sorted(tensors))
        if len(tkey) == 1:
            t = tkey[0]
            ed["tensor"] = f"{graph.ids[graph.tensor_src[t]]}/{graph.tensor_name[t]}"
        else:
            sk = (cu, tkey)
            if sk not in set_names:
                set_names[sk] = f"{nodes[cu]['id']}#set{sum(1 for s in set_names if s[0] == cu)}"
            ed["tensor"] = set_names[sk]
        es = first_edge[(cu, cv)]
        if len(es) == 1 and graph.edge_comm[es[0]]:
            ed["comm_s_by_pair"] = graph.edge_comm[es[0]]
        edges.append(ed)
    return edges


def is_acyclic(graph: Graph, cluster_of: Sequence[int]) -> bool:
    """True when the quotient graph of *graph* under ``cluster_of`` is a DAG
    (Kahn's algorithm on the quotient, O(V+E))."""
    k = (max(cluster_of) + 1) if graph.n else 0
    succ: list[set[int]] = [set() for _ in range(k)]
    for s, d in zip(graph.edge_src, graph.edge_dst):
        cs, cd = cluster_of[s], cluster_of[d]
        if cs != cd:
            succ[cs].add(cd)
    indeg = [0] * k
    for c in range(k):
        for d in succ[c]:
            indeg[d] += 1
    q = deque(c for c in range(k) if indeg[c] == 0)
    seen = 0
    while q:
        c = q.popleft()
        seen += 1
        for d in succ[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                q.append(d)
    return seen == k
