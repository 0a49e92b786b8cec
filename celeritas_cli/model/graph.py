"""The in-memory dataflow graph.

Nodes are indexed ``0..n-1`` in file order and every attribute is a flat
list indexed by node (or edge) number, so algorithms run in O(V+E) on
100k-node graphs without dict-of-dict overhead.

Tensors: an edge's data is identified by ``(src, tensor)``; edges with the
same source and ``tensor`` carry the same data, so it crosses to a given
device once (docs/design.md).  Each distinct ``(src, tensor)`` gets an integer id
in order of first appearance in the edge list (``edge_tensor[e]``), which is
also the simulator's tie-break order for transfers of one producer.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..errors import CycleError
from .graph_read import check_totals, read_edges, read_nodes
from .jsonio import check_depth, validate

GRAPH_SCHEMA = "placer.graph/v1"


@dataclass
class Graph:
    """A DAG of operators.  Build with :meth:`from_dict` or :func:`build`.

    Attributes (per node ``v``): ``ids[v]``, ``op[v]``, ``compute[v]``
    (seconds at speed 1.0), ``compute_by_type[v]`` (dict or None),
    ``memory[v]`` (bytes), ``colocation[v]`` (str or None), ``splittable[v]``
    (list or None), ``members[v]`` (list of original ids, coarse graphs only),
    ``out_edges[v]`` / ``in_edges[v]`` (edge indices), ``succ[v]`` /
    ``pred[v]`` (distinct neighbour nodes, in edge order).

    Per edge ``e``: ``edge_src[e]``, ``edge_dst[e]``, ``edge_bytes[e]``,
    ``edge_tensor[e]`` (int tensor id), ``edge_comm[e]`` (``comm_s_by_pair``
    dict or None).  Per tensor ``t``: ``tensor_src[t]``, ``tensor_bytes[t]``,
    ``tensor_name[t]``, ``tensor_edges[t]``.

    ``origin`` (not serialised): for a coarse graph, the original graph its
    ``members`` name, when it is known in this process (set by
    :func:`celeritas_cli.registry.coarsen`, or by ``placer place`` from
    ``meta.coarsened_from_file``), so a placement made on the coarse graph can
    be judged on the original (:mod:`celeritas_cli.sim.judge`).
    """

    name: str
    meta: dict
    ids: list[str]
    op: list[str]
    compute: list[float]
    memory: list[int]
    compute_by_type: list[dict | None]
    colocation: list[str | None]
    splittable: list[list[str] | None]
    members: list[list[str] | None]
    edge_src: list[int]
    edge_dst: list[int]
    edge_bytes: list[int]
    edge_tensor: list[int]
    edge_comm: list[dict | None]
    tensor_src: list[int] = field(default_factory=list)
    tensor_bytes: list[int] = field(default_factory=list)
    tensor_name: list[str] = field(default_factory=list)
    tensor_edges: list[list[int]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    out_edges: list[list[int]] = field(default_factory=list)
    in_edges: list[list[int]] = field(default_factory=list)
    succ: list[list[int]] = field(default_factory=list)
    pred: list[list[int]] = field(default_factory=list)
    node_extra: list[dict | None] = field(default_factory=list)
    origin: "Graph | None" = field(default=None, repr=False, compare=False)
    _topo: list[int] | None = field(default=None, repr=False)
    _topo_index: list[int] | None = field(default=None, repr=False)
    _consumers: list[list[int]] | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ sizes
    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.ids)

    @property
    def m(self) -> int:
        """Number of edges."""
        return len(self.edge_src)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def is_coarse(self) -> bool:
        """True when nodes carry ``members`` (a coarse graph)."""
        return any(mb is not None for mb in self.members)

    @property
    def original_name(self) -> str:
        """Name of the graph a coarse graph was made from (itself otherwise)."""
        return str(self.meta.get("coarsened_from", self.name))

    # ------------------------------------------------------------ topology
    def topo_order(self) -> list[int]:
        """Kahn's algorithm with a FIFO queue, sources in index order.

        This is Baechi's M-TOPO order (a BFS-like queue).  The result is
        cached; ``topo_index()[v]`` is ``v``'s position in it and is the
        canonical "topological index" used to break ties everywhere.
        """
        if self._topo is None:
            indeg = [len(p) for p in self.pred]
            queue = deque(v for v in range(self.n) if indeg[v] == 0)
            order: list[int] = []
            while queue:
                v = queue.popleft()
                order.append(v)
                for s in self.succ[v]:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        queue.append(s)
            if len(order) != self.n:
                raise CycleError(f"graph {self.name!r}: {describe_cycle(self)}")
            self._topo = order
            pos = [0] * self.n
            for i, v in enumerate(order):
                pos[v] = i
            self._topo_index = pos
        return self._topo

    def topo_index(self) -> list[int]:
        """Position of every node in :meth:`topo_order`."""
        self.topo_order()
        assert self._topo_index is not None
        return self._topo_index

    def tensor_consumers(self) -> list[list[int]]:
        """Distinct consumer nodes of each tensor, in edge order (cached;
        the simulator's fan-out of a finished node)."""
        if self._consumers is None:
            dst = self.edge_dst
            cons = []
            for es in self.tensor_edges:
                if len(es) == 1:
                    cons.append([dst[es[0]]])
                    continue
                seen: list[int] = []
                for e in es:
                    if dst[e] not in seen:
                        seen.append(dst[e])
                cons.append(seen)
            self._consumers = cons
        return self._consumers

    def sources(self) -> list[int]:
        return [v for v in range(self.n) if not self.pred[v]]

    def sinks(self) -> list[int]:
        return [v for v in range(self.n) if not self.succ[v]]

    def total_memory(self) -> int:
        return sum(self.memory)

    def colocation_units(self, order: Iterable[int] | None = None) -> tuple[list[int], list[list[int]]]:
        """Colocation units: the nodes sharing a ``colocation`` value form one
        unit, every other node is a unit alone.  Units are numbered, and their
        members listed, in the order nodes appear in *order* (default: node
        index).  Returns ``(unit_of, members)``.

        Example
        -------
        >>> g = build("u", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "colocation": "p"},
        ...                 {"id": "b", "compute_s": 1, "memory_bytes": 0},
        ...                 {"id": "c", "compute_s": 1, "memory_bytes": 0, "colocation": "p"}], [])
        >>> g.colocation_units()
        ([0, 1, 0], [[0, 2], [1]])
        """
        unit_of = [-1] * self.n
        members: list[list[int]] = []
        unit_of_group: dict[str, int] = {}
        for v in (range(self.n) if order is None else order):
            c = self.colocation[v]
            if c is not None and c in unit_of_group:
                u = unit_of_group[c]
                members[u].append(v)
            else:
                u = len(members)
                members.append([v])
                if c is not None:
                    unit_of_group[c] = u
            unit_of[v] = u
        return unit_of, members

    def memory_by(self, group_of: Sequence[int], groups: int) -> list[int]:
        """Bytes of node memory per group: ``group_of[v]`` is node v's group
        (a device index, a colocation unit) in ``range(groups)``.

        Example
        -------
        >>> g = build("m", [{"id": "a", "compute_s": 1, "memory_bytes": 5},
        ...                 {"id": "b", "compute_s": 1, "memory_bytes": 7}], [])
        >>> g.memory_by([1, 1], 2)
        [0, 12]
        """
        out = [0] * groups
        for v, grp in enumerate(group_of):
            out[grp] += self.memory[v]
        return out

    def total_compute(self) -> float:
        return math.fsum(self.compute)

    def total_tensor_bytes(self) -> int:
        return sum(self.tensor_bytes)

    def original_ids(self, v: int) -> list[str]:
        """The original node ids node *v* stands for (its members, or itself)."""
        mb = self.members[v]
        return list(mb) if mb is not None else [self.ids[v]]

    def colocation_groups(self) -> dict[str, list[int]]:
        """Colocation value -> node indices (in index order)."""
        groups: dict[str, list[int]] = {}
        for v, c in enumerate(self.colocation):
            if c is not None:
                groups.setdefault(c, []).append(v)
        return groups

    # --------------------------------------------------------- conversion
    @classmethod
    def from_dict(cls, doc: Any, label: str = "graph", *, derived: bool = False) -> "Graph":
        """Validate a ``placer.graph/v1`` document and build the model.

        *derived*: the document is a derived graph that one of placer's
        transforms built from a graph already loaded (never a file): the
        JSON Schema check is skipped (a quarter of a megatron plan's
        derivation time); duplicate ids, unknown endpoints, the limits on
        values and totals and the cycle check still run.

        Raises
        ------
        InvalidInput
            Schema violation, duplicate id, unknown endpoint, self-loop,
            a number outside :mod:`~celeritas_cli.model.limits` (per value,
            or the totals of memory and tensor bytes), inconsistent tensor
            bytes, ``meta`` or an extra field nested too deeply.
        CycleError
            The graph has a cycle (the message names one).
        """
        if not derived:
            validate(doc, GRAPH_SCHEMA, label)
        # building allocates a few lists per node and edge; the cyclic collector would rescan them
        # all many times over (a third of the time on a 36k-node graph) and there are no cycles to find
        paused = gc.isenabled()
        gc.disable()
        try:
            return cls._build(doc, label)
        finally:
            if paused:
                gc.enable()

    @classmethod
    def _build(cls, doc: dict, label: str) -> "Graph":
        name = doc.get("name") or (label.rsplit("/", 1)[-1].removesuffix(".json") if label != "<stdin>" else "graph")
        meta = dict(doc.get("meta") or {})
        check_depth(meta, label, "field meta")
        nd = read_nodes(doc["nodes"], label)
        ed = read_edges(doc["edges"], nd.index, label)
        check_totals(nd, ed, label)
        g = cls(name=name, meta=meta, ids=nd.ids, op=nd.op, compute=nd.compute, memory=nd.memory,
                compute_by_type=nd.cbt, colocation=nd.coloc, splittable=nd.split, members=nd.members,
                edge_src=ed.src, edge_dst=ed.dst, edge_bytes=ed.bytes, edge_tensor=ed.tensor, edge_comm=ed.comm,
                tensor_src=ed.tsrc, tensor_bytes=ed.tbytes, tensor_name=ed.tname, tensor_edges=ed.tedges,
                index=nd.index, node_extra=nd.extra)
        g._link()
        try:
            g.topo_order()
        except CycleError as exc:
            raise CycleError(f"{label}: {describe_cycle(g)}") from exc
        return g

    def _link(self) -> None:
        n = self.n
        out_edges: list[list[int]] = [[] for _ in range(n)]
        in_edges: list[list[int]] = [[] for _ in range(n)]
        succ: list[list[int]] = [[] for _ in range(n)]
        pred: list[list[int]] = [[] for _ in range(n)]
        big: dict[tuple[int, int], set[int]] = {}  # sets for the neighbour lists of high-degree nodes
        for e, (s, d) in enumerate(zip(self.edge_src, self.edge_dst)):
            out_edges[s].append(e)
            in_edges[d].append(e)
            lst = succ[s]
            if len(lst) < 16:
                if d not in lst:
                    lst.append(d)
            elif _add_new(big, (0, s), lst, d):
                lst.append(d)
            lst = pred[d]
            if len(lst) < 16:
                if s not in lst:
                    lst.append(s)
            elif _add_new(big, (1, d), lst, s):
                lst.append(s)
        self.out_edges, self.in_edges, self.succ, self.pred = out_edges, in_edges, succ, pred
        self._topo = None
        self._topo_index = None
        self._consumers = None

    def to_dict(self) -> dict:
        """The ``placer.graph/v1`` document for this graph."""
        nodes = []
        for v in range(self.n):
            nd: dict[str, Any] = {"id": self.ids[v], "op": self.op[v], "compute_s": self.compute[v]}
            if self.compute_by_type[v]:
                nd["compute_by_type"] = self.compute_by_type[v]
            nd["memory_bytes"] = self.memory[v]
            if self.colocation[v] is not None:
                nd["colocation"] = self.colocation[v]
            if self.splittable[v]:
                nd["splittable"] = self.splittable[v]
            if self.members[v] is not None:
                nd["members"] = self.members[v]
            if self.node_extra and self.node_extra[v]:
                nd.update(self.node_extra[v])
            nodes.append(nd)
        edges = []
        for e in range(self.m):
            t = self.edge_tensor[e]
            ed: dict[str, Any] = {"src": self.ids[self.edge_src[e]], "dst": self.ids[self.edge_dst[e]],
                                  "bytes": self.edge_bytes[e]}
            if not self.tensor_name[t].startswith(f"{self.ids[self.tensor_src[t]]}->") or len(self.tensor_edges[t]) > 1:
                ed["tensor"] = self.tensor_name[t]
            if self.edge_comm[e]:
                ed["comm_s_by_pair"] = self.edge_comm[e]
            edges.append(ed)
        return {"schema": GRAPH_SCHEMA, "name": self.name, "meta": self.meta, "nodes": nodes, "edges": edges}


def build(
    name: str,
    nodes: Iterable[dict],
    edges: Iterable[dict],
    meta: dict | None = None,
) -> Graph:
    """Build a :class:`Graph` from plain node/edge dicts (validated like a file).

    Example
    -------
    >>> g = build("chain", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0},
    ...                     {"id": "b", "compute_s": 2.0, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 8}])
    >>> g.n, g.m, g.succ[0]
    (2, 1, [1])
    """
    doc = {"schema": GRAPH_SCHEMA, "name": name, "meta": meta or {}, "nodes": list(nodes), "edges": list(edges)}
    return Graph.from_dict(doc, label=name)


def _add_new(big: dict, key: tuple, lst: list, w: int) -> bool:
    """True (and remember *w*) when *w* is not in the long list *lst* yet."""
    seen = big.get(key)
    if seen is None:
        seen = big[key] = set(lst)
    if w in seen:
        return False
    seen.add(w)
    return True


def describe_cycle(g: Graph) -> str:
    """Find one cycle (iteratively, no recursion limit) and describe it."""
    n = g.n
    color = [0] * n  # 0 new, 1 on stack, 2 done
    parent = [-1] * n
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, 0)]
        color[root] = 1
        while stack:
            v, i = stack[-1]
            if i < len(g.succ[v]):
                stack[-1] = (v, i + 1)
                w = g.succ[v][i]
                if color[w] == 0:
                    color[w] = 1
                    parent[w] = v
                    stack.append((w, 0))
                elif color[w] == 1:
                    cyc = [w]
                    x = v
                    while x != w:
                        cyc.append(x)
                        x = parent[x]
                    cyc.reverse()
                    cyc = [w] + cyc[:-1] if cyc[0] != w else cyc
                    path = " -> ".join(g.ids[c] for c in cyc + [w])
                    return f"graph has a cycle: {path}"
            else:
                color[v] = 2
                stack.pop()
    return "graph has a cycle"
