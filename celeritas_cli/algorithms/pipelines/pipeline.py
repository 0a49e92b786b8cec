"""``pipeline``: placer's pipeline planner - stages cut from a topological
order, replicated with data parallelism where that wins, micro-batched,
scheduled and recomputed as the search finds best, judged by the simulator.

What it decides (each fixed by a parameter, ``auto`` / 0 = searched):
the number of pipeline stages (``stages``) and of replicas of the whole
pipeline (``replicas``; ``stages x replicas`` = the devices), which devices
run which stage (``groups``: faster or larger devices first or last, so the
balanced cut gives them the heavier stages), the micro-batches
(``microbatches``, 1 to 64, whole samples), the schedule (``schedule``:
GPipe, 1F1B, interleaved 1F1B), activation recomputation (``recompute``:
where only it fits, never, or everywhere) and the cuts, stage by stage,
under Alpa's objective ``sum(stage time) + (m - 1) max(stage time)`` with
each stage's in-flight memory under its schedule and the traffic between
stages on the real links (:mod:`.model`); then the best plans are
simulated and their boundaries moved a few nodes at a time, each move
judged by the simulator (:mod:`.search`).

Where it goes beyond the peers (``gpipe``, ``pipedream``, ``alpa-stages``,
each a faithful row): mixed devices (each stage timed on its own device,
memory per device), real link bandwidths (the traffic of each cut),
non-chain DAGs (any cut of a topological order, the backward attributed to
its forward; :mod:`~celeritas_cli.pipelining.cuts`), two orders
(CPD-TOPO and as-late-as-possible), and a search over stages, replicas,
``m``, schedule and recomputation judged by the same simulator that judges
every row.

``zero`` (not searched): 1 shards the optimizer state over the replicas of
the pipeline (ZeRO stage 1, Megatron-LM's distributed optimizer; 2 also
the gradients; :mod:`~celeritas_cli.transform.replicate`), in every plan
with replicas.  The search's model still counts the whole optimizer state
per replica, so a shape that fits only with ZeRO is predicted not to fit
(name it with ``-p stages= replicas=`` and the simulator judges it).  The search is deterministic; its budget is counted in
simulations (``evaluations``; by default derived from ``time_limit`` and the
graph's size, like ``auto``) and the wall clock only caps it.

References
----------
Zheng et al., "Alpa", OSDI'22, 5.2 (Eq. 2, Algorithm 1); Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, 2.2 (schedules) and 3 (PTD-P); Huang et al.,
"GPipe", NeurIPS'19; Chen et al., "Training Deep Nets with Sublinear Memory
Cost", 2016; Zhang et al., Celeritas, 5.1.3 (CPD-TOPO).
"""

from __future__ import annotations

from ...errors import InvalidInput
from ...log import chatty, warn
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.clock import keep_best
from ...model.graph import Graph
from ...model.limits import TIME_MAX
from ...model.placement import Placement
from ...model.params import DEFAULT_TIME_LIMIT
from ...registry import ASSUME_BATCH, Param, evaluations_param, register, time_limit_param
from ...pipelining.builder import check_pipelinable, placement_of
from ...pipelining.params import AUTO, N_MICROBATCHES, RECOMPUTE, SCHEDULE
from ...pipelining.schedules import get_schedule
from ...sim.describe import pipeline_words
from ...transform.batch import declared_batch
from ...transform.replicate import ZERO3_REFUSED
from .search import Fixed, PipelineSearch, default_budget, estimate_of, fits_text, parse_groups, shape_fields


@register("pipeline", paper="placer", section="Alpa's objective (OSDI'22 5.2 Eq. 2) with in-flight memory, "
                                              "replicated stages, simulator-judged search",
          summary="placer's pipeline planner: stages cut from a topological order, replicated with data "
                  "parallelism where that wins, micro-batches, schedule (GPipe / 1F1B / interleaved) and "
                  "recomputation chosen by a search on mixed devices and real links, judged by the simulator.",
          params={"stages": Param(int, 0, "pipeline stages (devices of one replica); 0 = search", min=0, max=1024),
                  "replicas": Param(int, 0, "replicas of the whole pipeline (data parallelism); 0 = search",
                                    min=0, max=1024),
                  "microbatches": N_MICROBATCHES,
                  "schedule": SCHEDULE,
                  "recompute": RECOMPUTE,
                  "groups": Param(str, "", "devices of each stage, e.g. A,B|C,D (stages split by |, a stage's "
                                           "replicas by ,); empty = search"),
                  "order": Param(str, "auto", "forward order the stages are cut from",
                                 choices=("auto", "cpd", "alap", "topo")),
                  "time_limit": time_limit_param(DEFAULT_TIME_LIMIT, "wall-clock cap of the search"),
                  "evaluations": evaluations_param("simulations of the input graph the search may make (0 = from "
                                                   "time_limit and the graph size, as auto)"),
                  "assume_batch": ASSUME_BATCH,
                  "zero": Param(int, 0, "ZeRO stage over the pipeline's replicas: 0 replicated optimizer state, 1 "
                                        "sharded (Megatron-LM's distributed optimizer), 2 + gradients (3 is refused: "
                                        "ZeRO-3 over a pipeline)", min=0, max=3),
                  "beat_s": Param(float, 0.0, "give up (before building anything) when the model predicts no plan "
                                              "within 5 % of this step time (s; auto passes its best so far); "
                                              "0 = never", min=0, max=TIME_MAX),
                  "quiet": Param(bool, True, "no progress lines on stderr")},
          quick_params={"evaluations": 150})
def pipeline(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, stages: int = 0,
             replicas: int = 0, microbatches: int = N_MICROBATCHES.default, schedule: str = SCHEDULE.default,
             recompute: str = RECOMPUTE.default,
             groups: str = "", order: str = "auto", time_limit: float = DEFAULT_TIME_LIMIT, evaluations: int = 0,
             assume_batch: int = 0, zero: int = 0, beat_s: float = 0.0, quiet: bool = True,
             deadline: float | None = None) -> Placement:
    """Search for the best pipeline the simulator confirms (module docstring).

    Parameters
    ----------
    graph : Graph
        A training graph that declares its batch (``meta.batch_size``, or
        *assume_batch*).
    cluster : Cluster
    seed : int
        Unused (the search is deterministic).
    costs : CostModel, optional
    stages, replicas, microbatches, schedule, recompute, groups, order
        Fix part of the plan (module docstring); defaults search.
    time_limit, evaluations, deadline
        The budget (module docstring).
    assume_batch : int
        The batch of a graph that declares none (``--assume-batch``).
    zero : int
        ZeRO stage (0-2) of the replicas' data parallelism (module docstring).
    beat_s : float
        Give up when the model's best plan is predicted slower than this
        by more than :data:`~.search.BEAT_MARGIN` (``auto``'s
        best so far); 0 = never.
    quiet : bool
        No progress lines.

    Returns
    -------
    Placement
        Over the derived graph (micro-batched, recomputed, replicated), with
        its recipe and per-device orders; ``estimate`` holds the simulated
        ``makespan_s`` and ``status``, the ``plan`` in words, the model's
        prediction and the plans simulated.

    Raises
    ------
    InvalidInput
        A coarse graph (:func:`~celeritas_cli.pipelining.builder.check_pipelinable`), a graph without a declared batch, parameters that contradict each
        other or the cluster, or no plan at all (e.g. fewer forward nodes
        than stages).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = pipeline(layered(60, seed=1), uniform(2), evaluations=300, assume_batch=32)
    >>> p.estimate["status"], p.estimate["makespan_by"]
    ('FEASIBLE', 'simulator')
    """
    check_pipelinable(graph)
    if zero == 3:
        raise InvalidInput(f"'pipeline' parameter zero: {ZERO3_REFUSED}")
    costs = cost_model(graph, cluster, costs)
    assume = assume_batch or None
    batch = declared_batch(graph, assume, what="micro-batching a pipeline")
    fixed = Fixed(p=stages or None, R=replicas or None, n_microbatches=microbatches or None,
                  schedule=None if schedule == AUTO else get_schedule(schedule), recompute=recompute,
                  groups=parse_groups(groups, cluster), order=None if order == "auto" else order, zero=zero)
    _check(fixed, cluster, batch)
    budget = default_budget(graph, time_limit, evaluations, deadline)
    log = warn if chatty() and not quiet else None
    search = PipelineSearch(graph, cluster, costs, batch, fixed, budget, assume, log, beat_s)
    keep_best(lambda: _stopped(graph, cluster, search, seed))  # the registry's answer if its cap stops the search
    out = search.run()
    if out.best is None:  # the model left plans, but none was judged (no shape at all, none fits: said in run)
        raise InvalidInput(f"pipeline: no pipeline of graph '{graph.name}' on cluster '{cluster.name}' could be "
                           f"judged within the budget ({budget.limit:.0f} evaluations); raise -p evaluations or "
                           f"fix the plan with -p stages= microbatches=")
    if budget.clock_cut:
        warn(f"pipeline: the wall clock ({time_limit:g} s) cut the search, so another run may differ; raise "
             f"--time-limit or lower -p evaluations for a repeatable result")
    return _answer(graph, cluster, out, budget, seed)


def _stopped(graph: Graph, cluster: Cluster, search, seed: int) -> Placement | None:
    """The best plan simulated so far, when the registry's cap stopped the search (None: none yet)."""
    if search.best is None:
        return None
    search.budget.clock_cut = True
    return _answer(graph, cluster, search.outcome(), search.budget, seed)


def _answer(graph: Graph, cluster: Cluster, out, budget, seed: int) -> Placement:
    """The placement of the search's best plan, with its estimate."""
    best = out.best
    est = estimate_of(out, cluster, budget)
    est.update({"makespan_s": best.score.makespan, "makespan_by": "simulator", "status": fits_text(best.score),
                "judge": "simulator"})
    est.update(_shape_fields(best, cluster))
    zero = _zero_of(best)
    if zero:
        est["zero"] = zero
        est["plan"] = pipeline_words(est, lambda d: cluster.devices[cluster.index[d]].type) or est["plan"]
    par = {"stages": best.plan.shape.p, "replicas": best.plan.shape.R, "microbatches": best.plan.shape.n_microbatches,
           "schedule": best.plan.shape.schedule.name}
    return placement_of(best.derived, cluster, best.device_of, best.order, algorithm="pipeline", params=par,
                        seed=seed, estimate=est, devs=[list(g) for g in best.plan.shape.groups])


def _zero_of(best) -> int:
    """The ZeRO stage of the best plan's data-parallel step (0: none, or no replicas)."""
    last = best.derived.steps[-1]
    return int(last.get("zero", 0)) if last.get("transform") == "data-parallel" else 0


def _shape_fields(best, cluster: Cluster) -> dict:
    d = best.derived
    return {**shape_fields(best.plan.shape, cluster, best.plan.rc), "micro_batches": d.micro_batches,
            "recomputed": d.recomputed, "graph": "split", "graph_nodes": d.graph.n}


def _check(fixed: Fixed, cluster: Cluster, batch: int) -> None:
    """Refuse parameters that cannot go together, in one line."""
    if fixed.groups is not None:
        p, R = len(fixed.groups), len(fixed.groups[0])
        if fixed.p is not None and fixed.p != p:
            raise InvalidInput(f"'pipeline' parameters stages={fixed.p} and groups ({p} stages) disagree")
        if fixed.R is not None and fixed.R != R:
            raise InvalidInput(f"'pipeline' parameters replicas={fixed.R} and groups ({R} per stage) disagree")
    else:
        p, R = fixed.p or 1, fixed.R or 1
        if p * R > cluster.k:
            raise InvalidInput(f"'pipeline' parameters: {p} stages x {R} replicas need {p * R} devices, cluster "
                               f"'{cluster.name}' has {cluster.k}")
        if fixed.p is not None and fixed.R is not None and p * R != cluster.k:
            raise InvalidInput(f"'pipeline' parameters: stages x replicas must use the {cluster.k} devices of "
                               f"cluster '{cluster.name}' (or name them with -p groups=)")
        if (fixed.p and cluster.k % fixed.p) or (fixed.R and cluster.k % fixed.R):
            raise InvalidInput(f"'pipeline' parameters: {fixed.p or fixed.R} does not divide the {cluster.k} "
                               f"devices of cluster '{cluster.name}'; name the devices with -p groups=")
    if fixed.n_microbatches is not None and fixed.n_microbatches * (fixed.R or 1) > batch:
        raise InvalidInput(f"'pipeline' parameter microbatches: {fixed.n_microbatches} micro-batches x "
                           f"{fixed.R or 1} replicas need at least that many samples; the batch is {batch}")
