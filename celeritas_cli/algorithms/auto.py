"""``auto``: placer's own optimizer, the default of ``placer place``.

No single placement algorithm wins everywhere (issue 13: on real profiled
graphs the best of Celeritas, Moirai, FastT, Baechi, HEFT and METIS changed
from graph to graph), so ``auto`` runs the fast ones as a portfolio - on the
graph and on ``cpd`` coarse graphs of several granularities - and then
refines the best candidates with the simulator in the loop (before any
member is built, the members that plan the whole step - data parallelism,
fsdp, the pipeline planner - are ranked by a cheap estimate,
:mod:`~celeritas_cli.algorithms.ranking`, and each one near the best is
judged at least once, whatever its share of the budget): colocation units
are moved and swapped between devices along the realised critical path,
coarse units first and then their members, multilevel as in METIS'
uncoarsening refinement but with the simulated makespan of the original
graph as the objective.  Every candidate is judged by the simulator on the
graph it is given (a coarse graph's own makespan is never the user's
number), so the answer is never worse than the best starting candidate and
is memory-feasible whenever any candidate is.

Deterministic for a seed: the budget is counted in simulations
(``evaluations``; by default derived from ``time_limit`` and the graph's size),
and the wall clock only caps it - the result says so on stderr and in
``estimate.clock_cut``.  ``time_limit`` bounds the whole call (for ``placer
place`` the whole command, loading included): no member starts that is not
expected to end before the deadline, and every member left out is said with
its reason (stderr, ``estimate.skipped``) - on a 36,000-node graph with a
5 s limit, METIS and m-TOPO run and data parallelism (a replica cannot fit a
device) does not (issue 24, N16).  The machinery lives in
:mod:`celeritas_cli.optimize`; the last stderr line says the plan in words
(:mod:`celeritas_cli.sim.describe`).
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..log import Progress, chatty, warn
from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.costs import CostModel, cost_model
from ..model.clock import keep_best
from ..model.graph import Graph
from ..model.estimate import Estimate
from ..model.placement import Placement, finite_or_none
from ..optimize.portfolio import batch_split_refusal
from ..model.params import DEFAULT_TIME_LIMIT
from ..optimize.search import Search
from ..registry import ASSUME_BATCH, Param, congestion_param, evaluations_param, register, time_limit_param
from ..registry import names as registered
from ..sim.describe import MEGATRON_FIELDS, PIPELINE_FIELDS, describe_placement
from ..sim.mfu import mfu
from .ranking import Ranking


@register("auto", paper="placer", section="portfolio + simulator-in-the-loop multilevel refinement",
          summary="placer's optimizer (the default): the fast placers on the graph and on cpd coarse graphs, "
                  "then critical-path moves and swaps of colocation units judged by the simulator; never worse "
                  "than its best start.",
          params={"time_limit": time_limit_param(DEFAULT_TIME_LIMIT, "wall-clock cap of the whole search"),
                  "evaluations": evaluations_param("simulations the search may make (0 = from time_limit, or the "
                                                   f"default {DEFAULT_TIME_LIMIT:g} s when it is 0, and the graph "
                                                   "size, so the clock normally never decides)"),
                  "algos": Param(str, "", "comma-separated portfolio algorithms (default: the automatic choice); "
                                          "each named one runs, or stderr says why not"),
                  "congestion": congestion_param("congestion rule the simulator judges with"),
                  "quiet": Param(bool, False, "no progress lines on stderr"),
                  "assume_batch": ASSUME_BATCH,
                  "verify": Param(int, 0, "run the N best simulated placements with placer run on the machine the "
                                          "cluster describes and return the fastest measured (0 = off)",
                                  min=0, max=20)},
          quick_params={"evaluations": 150, "quiet": True})
def auto(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
         time_limit: float = DEFAULT_TIME_LIMIT, evaluations: int = 0, algos: str = "",
         congestion: str = DEFAULT_CONGESTION, quiet: bool = False, deadline: float | None = None,
         assume_batch: int = 0, verify: int = 0) -> Placement:
    """Search for the best placement the simulator can confirm (module docstring).

    Parameters
    ----------
    graph : Graph
        Preferably the original graph: ``auto`` coarsens by itself, and
        judges on the graph it gets.
    cluster : Cluster
    seed : int
        Seeds METIS / Scotch and the multilevel matching.
    costs : CostModel, optional
        The cost model every candidate is placed and judged under.
    time_limit : float
        Wall-clock cap in seconds for the whole search, portfolio included;
        0 = no cap (the budget is then that of the default 10 s).
    evaluations : int
        Simulation budget; 0 derives it from *time_limit* and the graph size
        (:func:`~celeritas_cli.optimize.search.default_evaluations`).
    algos : str
        Comma-separated registered algorithms to use as the portfolio; each
        runs (``milp`` and ``hierarchical`` with a share of the time limit),
        or stderr and ``estimate.skipped`` say why it cannot (``given``
        needs a placement file; an extra that is not installed).
    congestion : {"channel", "port", "none"}
        The simulator's congestion rule for every judgement.
    quiet : bool
        No progress lines (for library use; also off inside
        :func:`celeritas_cli.log.quiet`, as ``compare`` runs its cells).
        The line saying the wall clock cut the search is always printed.
    deadline : float, optional
        The :func:`time.perf_counter` reading at which the wall clock ends
        (``registry.place`` passes the command's start + *time_limit*, so
        loading counts too); default: *time_limit* from this call's start.
    assume_batch : int
        The batch the graph's costs hold for when it declares none (0 = the
        graph's own), passed to the members that split the batch.  Without
        a batch (or on a coarse graph, or with fewer samples than devices)
        the data-parallel members are left out, and a line on stderr says why.
    verify : int
        Measured in the loop (:mod:`celeritas_cli.optimize.verify`): run the
        *verify* best simulated placements with ``placer run`` and return the
        fastest measured; 0 (default) returns the simulated best.

    Returns
    -------
    Placement
        ``estimate`` records the judge, the winner and what refinement gained
        (``makespan_s`` is the simulator's on the graph given; ``mfu`` its
        model FLOPs utilisation, :mod:`~celeritas_cli.sim.mfu`), the budget's
        account (``evaluations``: simulations made; ``evaluations_spent``:
        those plus the members' estimated work, of ``evaluation_budget``),
        every candidate, and ``skipped``: each member left out, with why.

    Raises
    ------
    InvalidInput
        A negative time limit or budget, or an unknown algorithm in *algos*.

    References
    ----------
    Karypis & Kumar, SIAM J. Sci. Comput. 20(1), 1998 (multilevel refinement);
    Celeritas 5.1 (CPD coarsening), 6.1 (the simulator's transfer model).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = auto(layered(60, seed=1), uniform(2), evaluations=50, quiet=True)
    >>> p.estimate["judge"], p.estimate["makespan_s"] <= p.estimate["start_makespan_s"]
    ('simulator', True)
    """
    if not time_limit >= 0:
        raise InvalidInput(f"'auto' parameter time_limit: must be >= 0 (0 = no limit), got {time_limit}")
    if evaluations < 0:
        raise InvalidInput(f"'auto' parameter evaluations: must be >= 0, got {evaluations}")
    names = [a.strip() for a in algos.split(",") if a.strip()] or None
    if names:
        unknown = [a for a in names if a not in registered() or a == "auto"]
        if unknown:
            raise InvalidInput(f"'auto' parameter algos: unknown or not allowed: {', '.join(unknown)}")
    costs = cost_model(graph, cluster, costs)
    why = batch_split_refusal(graph, cluster, assume_batch or None)
    if why is not None and chatty() and not quiet and (names is None or "data-parallel" in names):
        warn(f"auto: data parallelism left out: {why}")
    runner = None
    if verify > 0:  # refuse a cluster that is not this machine, or a graph without a model, before searching
        from ..optimize import verify as measured

        runner = measured.runner_for(graph, cluster, log=warn if chatty() and not quiet else None)
    search = Search(graph, cluster, costs=costs, seed=seed, time_limit=time_limit, evaluations=evaluations,
                    congestion=congestion, algos=names, log=warn if chatty() and not quiet else None, notice=warn,
                    deadline=deadline, assume_batch=assume_batch or None,
                    ranking=Ranking(graph, cluster, costs, assume_batch or None))
    talk = chatty() and not quiet
    # the registry's answer if its time cap stops the search: the best candidate judged so far
    keep_best(lambda: _stopped(search, graph, cluster, seed, congestion, talk))
    out = _run(search, talk)
    if out.clock_cut:
        warn(f"auto: the wall clock ({time_limit:g} s) cut the search ({_spent(search)}), so another run may differ; "
             f"raise --time-limit or lower -p evaluations for a repeatable result")
    p = _answer(search, out, graph, cluster, seed, congestion, talk)
    if runner is not None:
        p = measured.choose_measured(p, (id(out.graph), tuple(out.device_of)), search, graph, cluster, verify,
                                     run=runner, log=warn if talk else None)
        if p.estimate.get("verified_choice") not in (None, "auto"):  # another candidate measured faster: its words
            for key in PIPELINE_FIELDS + MEGATRON_FIELDS:
                p.estimate.details.pop(key, None)
            p.estimate.details["plan"] = describe_placement(p, graph, cluster)
    return p


def _stopped(search: Search, graph: Graph, cluster: Cluster, seed: int, congestion: str,
             talk: bool) -> Placement | None:
    """The best candidate judged so far, when the registry's cap stopped the search (None: none yet)."""
    out = search.outcome()
    if out is None:
        return None
    out.clock_cut = True
    return _answer(search, out, graph, cluster, seed, congestion, talk)


def _answer(search: Search, out, graph: Graph, cluster: Cluster, seed: int, congestion: str,
            talk: bool) -> Placement:
    """The placement of the search's answer *out*, with its estimate."""
    spent = _spent(search)
    winner = out.winner.spec.name if out.winner is not None else None
    start = out.start_score.makespan if out.start_score is not None else out.score.makespan
    estimate = {
        "makespan_s": out.score.makespan,
        "makespan_by": "simulator",
        "status": "FEASIBLE" if out.score.feasible else "OOM",
        "judge": "simulator",
        "judged_on": "derived graph (derivation)" if out.graph is not graph else
                     ("coarse input graph" if graph.is_coarse else "original graph"),
        "congestion": congestion,
        "lower_bound_s": out.lower_bound,
        "makespan_over_lb": finite_or_none(out.score.makespan / out.lower_bound) if out.lower_bound > 0 else None,
        "mfu": mfu(graph, cluster, out.score.makespan),  # as the fsdp and pipeline rows say it (None without flops)
        "winner": winner,
        "refined": out.refined_from is not None,
        "start_makespan_s": start,
        "refinement_gain": finite_or_none(1.0 - out.score.makespan / start) if start > 0 else 0.0,
        "evaluations": out.evaluations,
        "evaluation_budget": search.budget.limit,
        "evaluations_spent": round(search.budget.spent, 3),
        "clock_cut": out.clock_cut,
        "candidates": out.candidates,
    }
    if out.skipped:
        estimate["skipped"] = out.skipped
    won = out.winner.placement.estimate if out.winner is not None and out.graph is not graph else {}
    # a pipeline's or a tensor x pipeline x data plan's fields, for its words
    estimate.update({key: won[key] for key in PIPELINE_FIELDS + MEGATRON_FIELDS if key in won})
    won_p = out.winner.placement if out.winner is not None else None
    if won_p is not None and won_p.replicas is not None and out.graph is not graph:  # a symmetric plan, as it came
        p = Placement(graph=graph.original_name, cluster=cluster.name, algorithm="auto",
                      assignment=dict(won_p.assignment), order=won_p.order, seed=seed, estimate=Estimate.from_dict(estimate),
                      derivation=won_p.derivation, replicas=won_p.replicas, cluster_digest=cluster.digest(),
                      cluster_file=cluster.source)
    else:
        p = Placement.from_indices(out.graph, cluster, out.device_of, algorithm="auto", order=out.order, seed=seed,
                                   estimate=estimate)
    if out.graph is not graph and p.replicas is None:  # a derived graph (splits, data parallelism): keep it
        p.derivation, p.derived = out.winner.placement.derivation, out.graph
        p.graph = graph.original_name
    p.estimate.details["plan"] = describe_placement(p, graph, cluster)  # the winner's plan in words (issue 23.4)
    if talk:
        warn(f"auto: {estimate['status'].lower()} placement, simulated makespan {out.score.makespan:.6g} s "
             f"(from {winner}{', refined' if out.refined_from else ''}: start {start:.6g} s), {spent}")
        warn(f"auto: the plan: {p.estimate['plan']}")
        if estimate["status"] == "OOM":  # say what may fit, and how to let it be searched
            warn("auto: no plan it judged fits in memory; a pipeline (which splits the model over the GPUs) may: "
                 "raise --time-limit (e.g. 120) to let the pipeline planner search, or ask it directly with "
                 "--algo pipeline (or --algo megatron -p recompute=full)")
    return p


def _spent(search: Search) -> str:
    """The budget's account in one phrase, the same wherever it is said:
    simulations made, plus the members' estimated work, of the budget."""
    b = search.budget
    return (f"{b.spent:.1f} of {b.limit:.0f} evaluations spent: {b.used} simulations + {b.charged:.1f} charged "
            f"by estimate for the placers' work and larger graphs")


def _run(search: Search, talk: bool):
    """``search.run()``; on a terminal with a progress bar on stderr (the
    evaluation budget spent, the search's lines printed above it).  Piped,
    the lines come as they are; quiet, nothing."""
    with Progress("auto", total=search.budget.limit, enabled=talk) as bar:
        if bar.mode == "bar":
            def line(msg: str) -> None:
                bar.update(completed=min(search.budget.spent, search.budget.limit))
                bar.line(msg)

            search.log = line
        return search.run()
