"""FastT's OS-DPOS: DPOS plus splitting of critical-path operations (FastT
section 5.2, Algorithm 2).

The input graph is FastT's: when the model fits one device, the
data-parallel graph (the model replicated once per device, each replica on
``1/k`` of the batch, gradients ring-all-reduced,
:func:`~celeritas_cli.transform.replicate.data_parallel_graph`); otherwise
the model's DAG.  DPOS places it; the operations on the critical path are
then tried, in decreasing computation time, for a split along each of their
parallelizable dimensions into ``n = 2..k`` parts
(:func:`~celeritas_cli.transform.splitting.split_operation`, Algorithm 2's
``SplitOperation``), re-running DPOS on each split graph.  The best split of
an operation is kept only if it shortens the finish time; the first
operation whose best split does not is where the search stops.

Splitting the batch is physically possible only where the graph declares
it (``meta.batch_size``, or ``assume_batch``) and only in whole samples
(:mod:`celeritas_cli.transform.admit`): on a graph without a batch, with
fewer samples than devices, or a coarse one, the data-parallel input is not
taken (``start=auto``: the DAG, ``estimate.data_parallel_skipped`` says why;
``start=data-parallel`` refuses in one line), and a batch split into ``n``
parts is tried only where ``n`` divides the samples the node runs on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...errors import InvalidInput
from ...model.limits import COUNT_MAX
from ...model.placement import Placement
from ...registry import ASSUME_BATCH, Param, congestion_param, overhead_param, register
from ...transform.admit import dp_batch, dp_refusal, split_refusal
from ...transform.derivation import attach, data_parallel_step, split_step
from ...transform.recipe_check import MAX_STEPS
from ...transform.replicate import data_parallel_graph
from ...transform.split_cost import DEFAULT_OVERHEAD_S, splittable_dims
from ...transform.splitting import split_operation
from ...sim.simulator import critical_path, run_schedule
from ..sharding.data_parallel import replica_devices
from .dpos import dpos_schedule

STARTS = ("auto", "dag", "data-parallel", "best")


@dataclass
class _Plan:
    device_of: list[int]
    order: list[list[int]] | None  # None: the simulator's own order (pure data parallelism)
    makespan: float  # DPOS's own estimate (or the simulated one for the data-parallel start)
    oom: bool


def _score(graph: Graph, cluster: Cluster, plan, costs: CostModel, congestion: str):
    sched = run_schedule(graph, cluster, plan.device_of, plan.order, congestion=congestion, costs=costs)
    return sched.makespan, sched


def _oom(graph: Graph, cluster: Cluster, device_of: list[int]) -> bool:
    return bool(cluster.over_capacity(graph.memory_by(device_of, cluster.k)))


def start_graph(graph: Graph, cluster: Cluster, start: str, overhead_s: float,
                assume_batch: int | None = None) -> tuple[Graph, list[dict], str | None]:
    """FastT 5.2's input to Algorithm 2, its recipe steps and why the
    data-parallel graph was not taken (or None): the data-parallel graph
    with one replica per device when *start* is ``data-parallel`` (refused
    in one line where it cannot be built: a graph without a declared batch,
    a batch smaller than the devices, a coarse graph, over the size
    budget; :func:`~celeritas_cli.transform.admit.dp_refusal`), or ``auto``,
    the model fits one device (its total memory is at most the largest
    device's) and the data-parallel graph can be built; the DAG itself
    otherwise."""
    k = cluster.k
    fits = graph.total_memory() <= max(d.memory for d in cluster.devices)
    if k < 2 or start == "dag" or (start == "auto" and not fits):
        return graph, [], None
    why = dp_refusal(graph, k, assume_batch)
    if why is not None:
        if start == "data-parallel":
            raise InvalidInput(f"os-dpos parameter start=data-parallel: {why}")
        return graph, [], why
    batch, samples = dp_batch(graph, k, "strong", None, assume_batch)
    shares = None if len(set(samples or [0])) == 1 else [b / batch for b in samples]
    # the ring form: OS-DPOS re-places single nodes, and an all-reduce's ranks moved onto one device or issued
    # in different orders would be a collective NCCL cannot run (simulator rule 6); ring steps are plain nodes
    return (data_parallel_graph(graph, k, overhead_s=overhead_s, shares=shares, assume_batch=assume_batch,
                                collectives="ring"),
            [data_parallel_step(k, "strong", overhead_s, shares, global_batch=batch, assume_batch=assume_batch,
                                collectives="ring")],
            None)


@register("os-dpos", paper="FastT (Yi et al., CoNEXT 2020)", section="5.2, Algorithm 2",
          summary="OS-DPOS: DPOS, then split critical-path operations (batch/channel, n=2..k) "
                  "while the simulated makespan improves.",
          params={"max_ops": Param(int, 8, "critical-path operations tried at most (0 = all)", min=0, max=COUNT_MAX),
                  "overhead_s": overhead_param("extra time of each sub-operation (s)"),
                  "congestion": congestion_param("congestion rule of DPOS's link model and of the "
                                      "scoring simulation"),
                  "start": Param(str, "auto", "input graph: auto = the data-parallel graph when the model fits one "
                                 "device (FastT 5.2), else the DAG; dag; data-parallel; best = run from both and "
                                 "keep the faster (not in the paper)", choices=STARTS),
                  "verbose": Param(bool, False, "log each trial to stderr"),
                  "assume_batch": ASSUME_BATCH},
          quick_params={"max_ops": 2})
def os_dpos(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, max_ops: int = 8,
            overhead_s: float = DEFAULT_OVERHEAD_S, congestion: str = DEFAULT_CONGESTION, start: str = "auto",
            verbose: bool = False, assume_batch: int = 0) -> Placement:
    """FastT Algorithm 2 (OS-DPOS).

    Reading of the paper, line by line:

    * input (section 5.2, "The input graph to Alg. 2 is decided as
      follows"): *start* ``auto`` takes the data-parallel graph (one replica
      per device, strong scaling, :func:`start_graph`) when the model's
      total memory fits the largest device, the DAG otherwise; ``dag`` and
      ``data-parallel`` force one.  ``best`` (an addition, not the paper's):
      run Algorithm 2 from both and keep the faster result (memory-feasible
      first), ``estimate.inputs_tried`` recording both.  Starting from the
      data-parallel graph can end slower than from the DAG when
      communication dominates (e.g. ``layered_60`` on 4xV100-pcie: 1.14 ms
      against 0.81 ms), because DPOS rarely regroups replicas.
    * line 3: DPOS on the input graph.  On the data-parallel graph, FastT
      "adopt[s] data parallelism as our start deployment strategy": the
      pure data-parallel placement (replica ``r`` on device ``r``, as
      ``data-parallel`` places it) is the starting ``S``
      and ``FT_old`` when it fits memory and finishes earlier than DPOS's
      placement of that graph, so OS-DPOS never ends worse than data
      parallelism on a model that fits.
    * line 4: the critical path *based on the placement*: the critical path
      of the simulated schedule of DPOS's placement and order
      (:func:`~celeritas_cli.sim.simulator.critical_path`).
    * line 5: sorted by decreasing computation time on the assigned device
      (ties by topological index).  Only operations with a parallelizable
      dimension are candidates (:func:`~celeritas_cli.transform.split_cost.splittable_dims`:
      the node's ``splittable`` list, with backward ops split along the
      batch only - their partial weight gradients are summed - and no
      batch split of a batch-independent op); the others are skipped, not a
      reason to stop (most ops of a training graph are not splittable, so
      the literal reading would almost never split).
      At most *max_ops* candidates are tried (0 = all): each costs
      ``len(dims)·(k-1)`` DPOS runs, so this bounds the running time.
    * line 8: every allowed ``d`` and ``n = 2..k``; the candidate
      graph is ``SplitOperation(G_init, op, d, n)`` and DPOS places it.
    * score ("FT(o_exit)"): the simulated makespan
      (:func:`~celeritas_cli.sim.simulator.run_schedule` under *congestion*,
      following DPOS's order), not DPOS's own estimate, because the
      estimate ignores link congestion and a split adds transfers; the
      simulator is the judge the result is reported with.  Ties keep the
      first candidate (dimension in listed order, then smaller ``n``).
    * lines 9-13: keep the best split if it is strictly better than the
      current makespan (then ``G_init`` becomes the split graph), else stop.

    The result is written over the derived graph's node ids and keeps it
    in ``Placement.derived`` with its recipe in ``Placement.derivation``
    (the data-parallel step, then the splits); ``estimate.splits`` is the
    split list ``SP``, ``estimate.input`` the input graph (``dag`` or
    ``data-parallel``) and ``estimate.start`` the starting strategy
    (``dpos`` or ``data-parallel``).

    Parameters
    ----------
    graph, cluster : the problem.
    seed : int
        Unused (deterministic).
    max_ops : int
        Candidate critical-path operations tried at most (0 = all).
    overhead_s : float
        Sub-operation overhead of the split cost model
        (:mod:`celeritas_cli.transform.splitting`).
    congestion : str
        Congestion rule of the scoring simulation and of DPOS's own link
        model (:class:`~celeritas_cli.sim.links.InputArrivals`).
    start : str
        ``auto``, ``dag``, ``data-parallel`` or ``best`` (see above).
    verbose : bool
        Log each trial to stderr.
    assume_batch : int
        The batch the graph's costs hold for when it declares none (0 = the
        graph's own); recorded in the recipe.

    Returns
    -------
    Placement

    Raises
    ------
    InvalidInput
        ``start=data-parallel`` where the data-parallel graph cannot be
        built (no declared batch, fewer samples than devices, a coarse
        graph, over the derived-graph budget).

    References
    ----------
    FastT (Yi et al., CoNEXT 2020), section 5.2, Algorithm 2.
    """
    costs = cost_model(graph, cluster, costs)
    assumed = assume_batch or None
    if start == "best":
        why = dp_refusal(graph, cluster.k, assumed) if cluster.k > 1 else "one device"
        runs = [_search(graph, cluster, costs, s, max_ops, overhead_s, congestion, verbose, assumed)
                for s in (("dag", "data-parallel") if why is None else ("dag",))]
        best = min(runs, key=lambda r: (r[3]["status"] == "OOM", r[3]["makespan_s"]))
        best[3]["inputs_tried"] = {r[3]["input"]: r[3]["makespan_s"] for r in runs}
        if why is not None:
            best[3]["data_parallel_skipped"] = why
    else:
        best = _search(graph, cluster, costs, start, max_ops, overhead_s, congestion, verbose, assumed)
    g_cur, plan, steps, estimate = best
    p = Placement.from_indices(g_cur, cluster, plan.device_of, algorithm="os-dpos", order=plan.order,
                               seed=seed, estimate=estimate)
    attach(p, graph, g_cur, steps)
    return p


def split_options(graph: Graph, v: int, k: int, assume_batch: int | None = None) -> list[tuple[str, int]]:
    """Line 8's ``(d, n)`` for node *v*: every allowed dimension in listed
    order (:func:`~celeritas_cli.transform.split_cost.splittable_dims`) and
    ``n = 2..k``, leaving out the batch splits whose parts would not be equal
    whole samples of the batch the node runs on (a graph that declares no
    batch has none to split: :func:`~celeritas_cli.transform.admit.split_refusal`)."""
    return [(dim, n) for dim in splittable_dims(graph, v) for n in range(2, k + 1)
            if split_refusal(graph, v, dim, n, assume_batch) is None]


def _search(graph: Graph, cluster: Cluster, costs: CostModel, start: str, max_ops: int, overhead_s: float,
            congestion: str, verbose: bool, assume_batch: int | None = None) -> tuple[Graph, _Plan, list[dict], dict]:
    """Algorithm 2 from the input graph *start* chooses (:func:`os_dpos`);
    returns the final graph, its plan, the recipe steps and the estimate."""
    k = cluster.k
    g0, steps, skipped = start_graph(graph, cluster, start, overhead_s, assume_batch)
    c0 = costs.for_graph(g0)
    r0 = dpos_schedule(g0, cluster, c0, congestion=congestion)
    plan = _Plan(r0.device_of, r0.order, r0.makespan, r0.oom)
    best_ms, sched = _score(g0, cluster, plan, c0, congestion)
    estimate: dict = {"input": "data-parallel" if steps else "dag", "start": "dpos"}
    if skipped is not None:
        estimate["data_parallel_skipped"] = skipped
    if steps:
        dev_dp = replica_devices(g0, list(range(k)))
        dp = _Plan(dev_dp, None, 0.0, _oom(g0, cluster, dev_dp))
        dp.makespan, dp_sched = _score(g0, cluster, dp, c0, congestion)
        estimate["data_parallel_makespan_s"] = dp.makespan
        if (dp.oom, dp.makespan) < (plan.oom, best_ms):
            plan, best_ms, sched = dp, dp.makespan, dp_sched
            estimate["start"] = "data-parallel"
    cp = critical_path(g0, sched)
    topo = g0.topo_index()
    cp_sorted = sorted(cp, key=lambda v: (-c0.time[v][plan.device_of[v]], topo[v]))
    candidates = [g0.ids[v] for v in cp_sorted if split_options(g0, v, k, assume_batch)]
    if max_ops > 0:
        candidates = candidates[:max_ops]
    candidates = candidates[:MAX_STEPS - len(steps)]  # a recipe has at most MAX_STEPS steps
    g_cur, plan_cur = g0, plan
    splits: list[dict] = []
    initial = best_ms
    for nid in candidates:
        if k < 2:
            break
        v = g_cur.index[nid]
        best = None
        for dim, parts in split_options(g_cur, v, k, assume_batch):
            g_new = split_operation(g_cur, nid, dim, parts, overhead_s=overhead_s, assume_batch=assume_batch)
            c_new = costs.for_graph(g_new)
            r_new = dpos_schedule(g_new, cluster, c_new, congestion=congestion)
            ms, _ = _score(g_new, cluster, r_new, c_new, congestion)
            if verbose:
                print(f"os-dpos: {nid} {dim} x{parts}: {ms:.6g} s (current {best_ms:.6g} s)", file=sys.stderr)
            if best is None or ms < best[0]:
                best = (ms, dim, parts, g_new, _Plan(r_new.device_of, r_new.order, r_new.makespan, r_new.oom))
        if best is None or not best[0] < best_ms:
            break
        best_ms, dim, parts, g_cur, plan_cur = best
        splits.append({"node": nid, "dim": dim, "n": parts})
        steps.append(split_step(nid, dim, parts, overhead_s, assume_batch if "batch_size" not in g0.meta else None))
    estimate.update({"makespan_s": best_ms, "makespan_by": "simulator", "dpos_makespan_s": plan_cur.makespan,
                     "unsplit_makespan_s": initial,
                     "splits": splits, "status": "OOM" if plan_cur.oom else "FEASIBLE"})
    return g_cur, plan_cur, steps, estimate
