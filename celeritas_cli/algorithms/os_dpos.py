"""FastT's OS-DPOS: DPOS plus splitting of critical-path operations (FastT
section 5.2, Algorithm 2).

DPOS places the graph; the operations on the critical path are then tried,
in decreasing computation time, for a split along each of their
parallelizable dimensions into ``n = 2..k`` parts
(:func:`~celeritas_cli.scheduling.splitting.split_operation`, Algorithm 2's
``SplitOperation``), re-running DPOS on each split graph.  The best split of
an operation is kept only if it shortens the finish time; the first
operation whose best split does not is where the search stops.
"""

from __future__ import annotations

import sys

from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..model.placement import Placement
from ..registry import Param, register
from ..scheduling.splitting import DEFAULT_OVERHEAD_S, split_operation
from ..sim.simulator import critical_path, run_schedule
from .dpos import dpos_schedule


def _score(graph: Graph, cluster: Cluster, res, costs: CostModel, congestion: str):
    sched = run_schedule(graph, cluster, res.device_of, res.order, congestion=congestion, costs=costs)
    return sched.makespan, sched


@register("os-dpos", paper="FastT (Yi et al., CoNEXT 2020)", section="5.2, Algorithm 2",
          summary="OS-DPOS: DPOS, then split critical-path operations (batch/channel, n=2..k) "
                  "while the simulated makespan improves.",
          params={"max_ops": Param(int, 8, "critical-path operations tried at most (0 = all)"),
                  "overhead_s": Param(float, DEFAULT_OVERHEAD_S, "extra time of each sub-operation (s)"),
                  "congestion": Param(str, "channel", "congestion rule of DPOS's link model and of the scoring "
                                      "simulation",
                                      choices=("channel", "port", "none")),
                  "verbose": Param(bool, False, "log each trial to stderr")},
          quick_params={"max_ops": 2})
def os_dpos(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, max_ops: int = 8,
            overhead_s: float = DEFAULT_OVERHEAD_S, congestion: str = "channel",
            verbose: bool = False) -> Placement:
    """FastT Algorithm 2 (OS-DPOS).

    Reading of the paper, line by line:

    * line 3: DPOS on the input graph (the DAG given; FastT's data-parallel
      replication of a model that fits one device is not done here - give
      a replicated graph to get it).
    * line 4: the critical path *based on the placement*: the critical path
      of the simulated schedule of DPOS's placement and order
      (:func:`~celeritas_cli.sim.simulator.critical_path`).
    * line 5: sorted by decreasing computation time on the assigned device
      (ties by topological index).  Only operations with a parallelizable
      dimension (``splittable``) are candidates; the others are skipped, not
      a reason to stop (in training graphs the backward ops are heavy and
      not splittable, so the literal reading would almost never split).
      At most *max_ops* candidates are tried (0 = all): each costs
      ``len(dims)·(k-1)`` DPOS runs, so this bounds the running time.
    * line 8: every ``d`` in ``splittable`` and ``n = 2..k``; the candidate
      graph is ``SplitOperation(G_init, op, d, n)`` and DPOS places it.
    * score ("FT(o_exit)"): the simulated makespan
      (:func:`~celeritas_cli.sim.simulator.run_schedule` under *congestion*,
      following DPOS's order), not DPOS's own estimate, because the
      estimate ignores link congestion and a split adds transfers; the
      simulator is the judge the result is reported with.  Ties keep the
      first candidate (dimension in listed order, then smaller ``n``).
    * lines 9-13: keep the best split if it is strictly better than the
      current makespan (then ``G_init`` becomes the split graph), else stop.

    The result is written over the split graph's node ids and carries it in
    ``Placement.split_graph``; ``estimate.splits`` is the split list ``SP``.

    Parameters
    ----------
    graph, cluster : the problem.
    seed : int
        Unused (deterministic).
    max_ops : int
        Candidate critical-path operations tried at most (0 = all).
    overhead_s : float
        Sub-operation overhead of the split cost model
        (:mod:`celeritas_cli.scheduling.splitting`).
    congestion : str
        Congestion rule of the scoring simulation; DPOS's own link model
        (:class:`~.dpos.Links`) is ``"none"`` for ``"none"`` and
        ``"channel"`` otherwise.
    verbose : bool
        Log each trial to stderr.

    Returns
    -------
    Placement

    References
    ----------
    FastT (Yi et al., CoNEXT 2020), section 5.2, Algorithm 2.
    """
    k = cluster.k
    costs = cost_model(graph, cluster, costs)
    model = "none" if congestion == "none" else "channel"
    res = dpos_schedule(graph, cluster, costs, congestion=model)
    best_ms, sched = _score(graph, cluster, res, costs, congestion)
    cp = critical_path(graph, sched)
    topo = graph.topo_index()
    cp_sorted = sorted(cp, key=lambda v: (-costs.time[v][res.device_of[v]], topo[v]))
    candidates = [graph.ids[v] for v in cp_sorted if graph.splittable[v]]
    if max_ops > 0:
        candidates = candidates[:max_ops]
    g_cur, res_cur = graph, res
    splits: list[dict] = []
    initial = best_ms
    for nid in candidates:
        if k < 2:
            break
        v = g_cur.index[nid]
        best = None
        for dim in g_cur.splittable[v] or []:
            for parts in range(2, k + 1):
                g_new = split_operation(g_cur, nid, dim, parts, overhead_s=overhead_s)
                c_new = costs.for_graph(g_new)
                r_new = dpos_schedule(g_new, cluster, c_new, congestion=model)
                ms, _ = _score(g_new, cluster, r_new, c_new, congestion)
                if verbose:
                    print(f"os-dpos: {nid} {dim} x{parts}: {ms:.6g} s (current {best_ms:.6g} s)", file=sys.stderr)
                if best is None or ms < best[0]:
                    best = (ms, dim, parts, g_new, r_new)
        if best is None or not best[0] < best_ms:
            break
        best_ms, dim, parts, g_cur, res_cur = best
        splits.append({"node": nid, "dim": dim, "n": parts})
    p = Placement.from_indices(g_cur, cluster, res_cur.device_of, algorithm="os-dpos", order=res_cur.order,
                               seed=seed,
                               estimate={"makespan_s": best_ms, "makespan_by": "simulator",
                                         "dpos_makespan_s": res_cur.makespan,
                                         "unsplit_makespan_s": initial, "splits": splits,
                                         "status": "OOM" if res_cur.oom else "FEASIBLE"})
    if splits:
        p.split_graph = g_cur.to_dict()
    p.graph = graph.original_name
    return p
