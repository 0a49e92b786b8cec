"""Multilevel units for refinement: colocation-closed node sets, nested
from coarse to fine.

Level 0 are the *atoms*: a colocation group is one atom (its nodes must
share a device), every other node its own atom.  Coarser levels are built
like METIS' coarsening phase (Karypis & Kumar 1998, section 3.1, heavy-edge
matching): atoms are visited in a seeded random order and each unmatched
unit is merged with the unmatched neighbour it exchanges the most bytes
with, as long as the merged unit stays under a memory cap and a compute cap
(so a unit can always move to another device and no unit holds more than a
small share of the work).  Edges are undirected and carry the bytes of the
distinct tensors between two units.  Coarsening stops at about ``4 k``
units or when a round merges fewer than a tenth of them.

Unlike a coarse *graph*, a level needs no acyclic quotient: a unit is only
ever moved to a device as a whole, and every candidate is simulated on the
original graph.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph


@dataclass
class Level:
    """A partition of the original nodes into units: ``unit_of[v]``,
    ``members[u]`` (node indices, ascending), and per unit its memory
    ``mem[u]`` and ``boundary[u]``, the edges with exactly one end in it."""

    unit_of: list[int]
    members: list[list[int]]
    mem: list[int] = field(default_factory=list)
    boundary: list[list[int]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.members)

    def finish(self, graph: Graph) -> "Level":
        """Fill ``mem`` and ``boundary`` from *graph*; returns self."""
        self.mem = [sum(graph.memory[v] for v in mb) for mb in self.members]
        self.boundary = [[] for _ in self.members]
        uo = self.unit_of
        for e, (s, d) in enumerate(zip(graph.edge_src, graph.edge_dst)):
            a, b = uo[s], uo[d]
            if a != b:
                self.boundary[a].append(e)
                self.boundary[b].append(e)
        return self


def atoms(graph: Graph) -> Level:
    """Level 0: colocation groups as one unit each, other nodes alone."""
    return Level(*graph.colocation_units())


def _adjacency(graph: Graph, unit_of: list[int], nu: int) -> list[dict[int, float]]:
    adj: list[dict[int, float]] = [{} for _ in range(nu)]
    seen: set[tuple[int, int]] = set()
    for e in range(graph.m):
        a, b = unit_of[graph.edge_src[e]], unit_of[graph.edge_dst[e]]
        t = graph.edge_tensor[e]
        if a == b or (t, b) in seen:
            continue
        seen.add((t, b))
        w = float(graph.edge_bytes[e]) + 1.0
        adj[a][b] = adj[a].get(b, 0.0) + w
        adj[b][a] = adj[b].get(a, 0.0) + w
    return adj


def _match(adj: list[dict[int, float]], mem: list[float], work: list[float], mem_cap: float, work_cap: float,
           rng: random.Random) -> list[int]:
    """Heavy-edge matching: ``coarse[u]`` per unit, values ``0..c-1``."""
    nu = len(adj)
    visit = list(range(nu))
    rng.shuffle(visit)
    mate = [-1] * nu
    for u in visit:
        if mate[u] != -1:
            continue
        best, best_w = -1, 0.0
        for w, wt in adj[u].items():
            if mate[w] != -1 or w == u:
                continue
            if mem[u] + mem[w] > mem_cap or work[u] + work[w] > work_cap:
                continue
            if wt > best_w or (wt == best_w and w < best):
                best, best_w = w, wt
        if best == -1:
            mate[u] = u
        else:
            mate[u], mate[best] = best, u
    coarse = [-1] * nu
    c = 0
    for u in range(nu):
        if coarse[u] == -1:
            coarse[u] = coarse[mate[u]] = c
            c += 1
    return coarse


def hierarchy(graph: Graph, cluster: Cluster, costs: CostModel, *, seed: int = 0,
              min_units: int | None = None) -> list[Level]:
    """Nested levels, coarsest first, ending with the atoms (module docstring).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> g, c = layered(200, seed=1), uniform(2)
    >>> levels = hierarchy(g, c, cost_model(g, c))
    >>> levels[-1].size == atoms(g).size, levels[0].size < levels[-1].size
    (True, True)
    """
    base = atoms(graph)
    k = cluster.k
    min_units = min_units if min_units is not None else 4 * k
    mem = [float(sum(graph.memory[v] for v in mb)) for mb in base.members]
    work = [sum(costs.mean_time[v] for v in mb) for mb in base.members]
    mem_cap = max(max(mem, default=0.0), 0.5 * min(d.memory for d in cluster.devices))
    work_cap = max(max(work, default=0.0), sum(work) / (2 * k))
    rng = random.Random(seed)
    levels = [base]
    unit_of = list(base.unit_of)
    adj = _adjacency(graph, unit_of, base.size)
    while len(adj) > min_units:
        coarse = _match(adj, mem, work, mem_cap, work_cap, rng)
        nc = max(coarse) + 1
        if nc > 0.9 * len(adj):
            break
        new_mem = [0.0] * nc
        new_work = [0.0] * nc
        for u, c in enumerate(coarse):
            new_mem[c] += mem[u]
            new_work[c] += work[u]
        new_adj: list[dict[int, float]] = [{} for _ in range(nc)]
        for u, nbrs in enumerate(adj):
            cu = coarse[u]
            for w, wt in nbrs.items():
                cw = coarse[w]
                if cu != cw:
                    new_adj[cu][cw] = new_adj[cu].get(cw, 0.0) + wt
        unit_of = [coarse[u] for u in unit_of]
        mem, work, adj = new_mem, new_work, new_adj
        members: list[list[int]] = [[] for _ in range(nc)]
        for v, u in enumerate(unit_of):
            members[u].append(v)
        levels.append(Level(list(unit_of), members))
    levels.reverse()
    return [lv.finish(graph) for lv in levels]
