"""m-SCT: Baechi's memory-constrained Small Communication Time scheduler.

Jeon et al., "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (m-SCT; the authors' released code, placer/m_sct.py), after Hanen & Munier's SCT algorithm for
small communication times.  Celeritas (Table 3, Table 4, section 7) and
Moirai (IV, Fig. 9) beat it; Celeritas calls it the best of Baechi's three.

m-SCT is m-ETF (:mod:`.m_etf`) plus *favourite children*:

1. **LP relaxation** (Baechi's ``FavoriteChildLPSolver``).  Variables
   ``x_uv`` in [0, 1] per edge (1 = the communication is paid, i.e. v is
   *not* u's favourite child), start times ``s_v >= 0`` and the makespan
   ``w``; minimise ``w`` subject to
   ``s_u + p_u + c_uv * x_uv <= s_v`` for every edge,
   ``sum_v x_uv >= outdeg(u) - 1`` (at most one favourite child),
   ``sum_u x_uv >= indeg(v) - 1`` (favourite child of at most one parent),
   ``s_v + p_v <= w``.  ``p_v`` is the node's mean time over devices and
   ``c_uv`` the mean transfer time of the distinct tensors u sends v
   (parallel edges are one LP edge).  Solved with OR-Tools' GLOP instead of
   Baechi's MOSEK.
2. **Rounding** with ``threshold`` (Baechi's ``round(x - threshold + 0.5)``):
   edge (u, v) is a favourite iff ``x_uv <= threshold``.  Rounding can give
   a node two favourites; edges are then taken in edge order and a later
   favourite replaces an earlier one, for the child and for the parent, so
   each node keeps at most one favourite child and one favourite parent
   (Baechi does the same, with the clean-up made consistent).
3. **The SCT rule** (Baechi's ``SCTDevice``).  A free device whose last
   node's favourite child is ready, and could start it no later than any
   other device, *waits* for it (state AWAKE) instead of taking other work,
   unless an *urgent* node's urgent time - the latest of its start times
   over all devices it may go to - has passed; then it runs the earliest
   urgent node.  Other devices behave as in m-ETF.

Large graphs: above ``lp_max_nodes`` nodes the LP is skipped (a message
says so on stderr) and favourites are chosen greedily - in topological
order, each node's favourite child is the successor it sends the most
bytes to (ties by topological index) among those without a favourite
parent yet - so the 36k-node graphs still run in seconds.
"""

from __future__ import annotations

import math

from ...errors import SolverError
from ...log import warn
from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.limits import COUNT_MAX
from ...model.placement import Placement
from ...registry import Param, congestion_param, register
from .m_etf import etf_schedule


def _lp_edges(graph: Graph, costs: CostModel) -> tuple[list[tuple[int, int]], list[float]]:
    """Distinct (u, v) pairs in edge order and the mean transfer time of
    the distinct tensors crossing each."""
    index: dict[tuple[int, int], int] = {}
    pairs: list[tuple[int, int]] = []
    comm: list[float] = []
    seen: set[tuple[int, int, int]] = set()
    for e in range(graph.m):
        u, v, t = graph.edge_src[e], graph.edge_dst[e], graph.edge_tensor[e]
        i = index.get((u, v))
        if i is None:
            i = index[(u, v)] = len(pairs)
            pairs.append((u, v))
            comm.append(0.0)
        if (u, v, t) not in seen:
            seen.add((u, v, t))
            comm[i] += costs.mean_comm(e)
    return pairs, comm


def lp_favorite_values(graph: Graph, costs: CostModel) -> tuple[list[tuple[int, int]], list[float], float]:
    """Solve the favourite-child LP relaxation (module docstring, step 1).

    Returns
    -------
    (pairs, x, w)
        The LP edges, the relaxed ``x_uv`` per edge and the relaxed makespan.

    Raises
    ------
    SolverError
        GLOP is unavailable or does not reach an optimum.
    """
    from ortools.linear_solver import pywraplp

    pairs, comm = _lp_edges(graph, costs)
    # Times in units of the longest one: x is unchanged, and GLOP stays well conditioned
    # (raw seconds from 1e-9 to 1e11 in one LP made it run for minutes).
    scale = max([*costs.mean_time, *comm]) or 1.0
    p = [t / scale for t in costs.mean_time]
    comm = [c / scale for c in comm]
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        raise SolverError("m-sct: OR-Tools' GLOP LP solver is not available; reinstall ortools")
    inf = solver.infinity()
    x = [solver.NumVar(0.0, 1.0, f"x{i}") for i in range(len(pairs))]
    s = [solver.NumVar(0.0, inf, f"s{v}") for v in range(graph.n)]
    w = solver.NumVar(0.0, inf, "w")
    outs: list[list[int]] = [[] for _ in range(graph.n)]
    ins: list[list[int]] = [[] for _ in range(graph.n)]
    for i, (u, v) in enumerate(pairs):
        solver.Add(s[u] + p[u] + comm[i] * x[i] <= s[v])
        outs[u].append(i)
        ins[v].append(i)
    for v in range(graph.n):
        if len(outs[v]) > 1:
            solver.Add(sum(x[i] for i in outs[v]) >= len(outs[v]) - 1)
        if len(ins[v]) > 1:
            solver.Add(sum(x[i] for i in ins[v]) >= len(ins[v]) - 1)
        solver.Add(s[v] + p[v] <= w)
    solver.Minimize(w)
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise SolverError(f"m-sct: GLOP ended with status {status} on the favourite-child LP of "
                          f"graph '{graph.name}'; try -p lp_max_nodes=0 to use the greedy favourites")
    return pairs, [xi.solution_value() for xi in x], w.solution_value() * scale


def round_favorites(n: int, pairs: list[tuple[int, int]], x: list[float], threshold: float) -> list[int]:
    """Favourite child per node from relaxed ``x`` (module docstring, step 2).

    Example
    -------
    >>> round_favorites(3, [(0, 1), (0, 2)], [0.2, 0.4], 0.5)  # the later edge wins
    [2, -1, -1]
    """
    fav = [-1] * n
    parent = [-1] * n
    for (u, v), xv in zip(pairs, x):
        if xv > threshold + 1e-9:
            continue
        old = fav[u]
        if old >= 0:
            parent[old] = -1
        q = parent[v]
        if q >= 0:
            fav[q] = -1
        fav[u] = v
        parent[v] = u
    return fav


def greedy_favorites(graph: Graph) -> list[int]:
    """Greedy favourites for graphs too large for the LP: in topological
    order, each node's favourite is the successor it sends the most bytes
    to, ties by topological index, skipping successors already taken."""
    ti = graph.topo_index()
    fav = [-1] * graph.n
    taken = [False] * graph.n
    for u in graph.topo_order():
        sent: dict[int, int] = {}
        seen: set[tuple[int, int]] = set()
        for e in graph.out_edges[u]:
            v, t = graph.edge_dst[e], graph.edge_tensor[e]
            if (v, t) not in seen:
                seen.add((v, t))
                sent[v] = sent.get(v, 0) + graph.edge_bytes[e]
        cands = [(-b, ti[v], v) for v, b in sent.items() if not taken[v]]
        if cands:
            v = min(cands)[2]
            fav[u] = v
            taken[v] = True
    return fav


@register("m-sct", paper="Baechi (Jeon et al., SoCC 2020)",
          section="m-SCT (released placer/m_sct.py); Celeritas Table 3; Moirai IV",
          summary="m-ETF plus LP-chosen favourite children kept on their parent's device (GLOP).",
          params={"threshold": Param(float, 0.5, "round x_uv <= threshold to 'favourite child'", min=0.0, max=1.0),
                  "lp_max_nodes": Param(int, 5000, "above this many nodes use greedy favourites, not the LP",
                                        min=0, max=COUNT_MAX),
                  "congestion": congestion_param("link rule of m-ETF's data-ready times (as m-etf)")})
def m_sct(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, threshold: float = 0.5,
          lp_max_nodes: int = 5000, congestion: str = DEFAULT_CONGESTION) -> Placement:
    """Place and order *graph* with Baechi's m-SCT (module docstring).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    seed : int
        Unused (deterministic); recorded.
    threshold : float
        LP rounding threshold (Baechi's default 0.5).
    lp_max_nodes : int
        Graphs with more nodes use the greedy favourite rule.
    congestion : {"channel", "port", "none"}
        Link rule of the data-ready times (default: the simulator's);
        ``placer compare --congestion`` passes its judge's rule.

    Returns
    -------
    Placement
        With ``order``; ``estimate`` has the scheduler's makespan, status,
        the LP's relaxed makespan (``lp_makespan_s``) and how favourites
        were chosen (``favorites``: ``lp`` or ``greedy``); with greedy
        favourites a ``caveat`` says the result is not Baechi's m-SCT as
        published (``compare`` marks the cell and lists it under the table).

    Raises
    ------
    SolverError
        The LP solver fails.

    References
    ----------
    Jeon et al., SoCC 2020 (m-SCT); Hanen & Munier, Discrete Appl. Math. 1995.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> m_sct(layered(30), uniform(2)).estimate["favorites"]
    'lp'
    """
    costs = cost_model(graph, cluster, costs)
    estimate: dict = {}
    if graph.n <= lp_max_nodes and graph.m > 0:
        pairs, x, w = lp_favorite_values(graph, costs)
        fav = round_favorites(graph.n, pairs, x, threshold)
        estimate["lp_makespan_s"] = w
        how = "lp"
    else:
        if graph.m > 0:
            warn(f"m-sct: graph '{graph.name}' has {graph.n} nodes > lp_max_nodes={lp_max_nodes}; "
                 f"using greedy favourite children (heaviest out-edge) instead of the LP")
            estimate["caveat"] = (f"greedy favourite children (more than lp_max_nodes={lp_max_nodes} nodes), "
                                  f"not Baechi's LP")
        fav = greedy_favorites(graph)
        how = "greedy"
    res = etf_schedule(graph, cluster, costs, favorite=fav, congestion=congestion)
    estimate.update({"makespan_s": res.makespan, "status": res.status, "favorites": how,
                     "favorite_edges": sum(1 for f in fav if f >= 0)})
    if not math.isfinite(res.makespan):
        estimate["makespan_s"] = None
    return Placement.from_indices(graph, cluster, res.device_of, order=res.order, algorithm="m-sct",
                                  seed=seed, params={"threshold": threshold, "congestion": congestion},
                                  estimate=estimate)
