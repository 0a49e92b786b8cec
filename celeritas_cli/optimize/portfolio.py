"""The starting candidates of ``auto``: registered placers run on the graph
and on ``cpd`` coarse graphs of several granularities, each judged by the
simulator on the original graph.

A portfolio member is a :class:`Spec`: an algorithm name from the registry,
its parameters, and the graph it runs on (the input graph, or a coarse graph
``cpd`` makes with a given ``R``).  Any registered algorithm plugs in by
name; one that is not registered (or needs a missing extra) is skipped.
Which members run is decided from the graph's size and the time limit alone
(:func:`plan`), never from the clock, so a seed gives one portfolio:

* every member has an estimated cost in simulations of the input graph
  (:func:`member_cost`: a cost class :data:`COST` measured on one core, and
  for the members that replicate the graph on every device: ``data-parallel``
  builds and judges one replica of each kind (the symmetric judge,
  :mod:`~celeritas_cli.sim.symmetric`), :data:`DP_SYMMETRIC_COST` whatever
  ``k``; ``fsdp`` the same, scaled by its replica's size over data
  parallelism's (:func:`~.planners.fsdp_charge`); ``os-dpos`` runs DPOS on the whole
  data-parallel graph for
  ``1 + 2 max_ops (k - 1)`` split trials, :data:`OS_DPOS_COST` ``* k**2 *
  (1 + 2 max_ops (k - 1))``); a member runs when its estimate is at most
  :data:`MEMBER_SHARE` of the budget and the estimates of the members so
  far stay within :data:`PORTFOLIO_SHARE` of it;
* ``data-parallel`` members (the strongest single start whenever the model
  fits one device, and refined on their own derived graph) are instead
  held to :data:`DP_SHARE` of the budget, together, on top of
  :data:`PORTFOLIO_SHARE`; they are left out where the batch cannot be
  split (:func:`batch_split_refusal`: no declared batch and none assumed,
  fewer samples than devices, a coarse graph), and ``auto`` says why;
* coarse graphs aim at about ``4 k``, ``16 k`` and ``64 k`` coarse nodes for
  ``k`` devices (``R = ceil(n / target)``, ``M`` at its default), the range of
  Celeritas' Table 2 for a handful of devices; a granularity is skipped when
  the graph is not much larger than the target;
* when the budget is too small for :data:`MEMBER_SHARE` to admit even
  METIS (a huge graph: a few simulations in all), the *anchors*
  (:data:`ANCHORS`: METIS, compute- and memory-balanced, and m-TOPO - cheap
  and usually memory-feasible) run first, within :data:`ANCHOR_SHARE`;
* ``data-parallel`` members are left out, and said so, when one replica
  (its parameters, gradients and optimizer state in full plus its share of
  the activations, :func:`replica_memory`) exceeds the smallest device: the
  answer would be OOM (issue 24, N16: the data-parallel member of a 92 GiB
  model on 32 GiB devices took 7 s and was the only candidate);
* the planners (:mod:`.planners`: ``pipeline``, and ``fsdp`` - stage 3,
  charged by :func:`~.planners.fsdp_charge` and counted with the
  data-parallel members) plan the
  whole step: ``pipeline`` searches with :data:`~.planners.PLAN_SHARE` of
  the budget as its own evaluations - at most what the members before it
  leave of the portfolio's part, ``1 -`` :data:`REFINE_SHARE` - when that
  pays for one plan; both run
  right after METIS when one data-parallel replica does not fit the
  smallest device (:func:`replica_memory`: the model is memory-tight, and
  a sharded or pipelined plan is likely the answer; :data:`TIGHT_FIRST`),
  else after the data-parallel members;
* ``milp`` (Moirai's exact model) joins only for tiny problems with tight
  memory (:func:`wants_milp`), where exact packing can be the only feasible
  answer;
* ``-p algos=...`` names the members: every named algorithm runs (N19),
  except the ones auto cannot run, which :func:`plan` reports with the
  reason (``given`` needs a placement file); algorithms with a wall-clock
  ``time_limit`` of their own (``milp``, ``hierarchical``) run after the
  others with a share of the time left (:data:`TIMED`).

Ranking (issue 33.3): before anything is built, ``auto`` estimates the
members that plan the whole step (``data-parallel``, ``fsdp``,
``pipeline``, ``3d``: :mod:`celeritas_cli.algorithms.ranking`, charged
:data:`RANK_COST`); the :func:`contenders` - within :data:`RANK_MARGIN` of
the best estimate - are planned first (after METIS on the input graph, a
fraction of a simulation, so that a contender whose run outlasts the
clock still leaves an answer), best estimate first, each whatever
its share, while the whole budget pays for it (the refinement's share
included), so a member the fixed order would leave out over its share is
judged when it may be the answer.  The other members follow as above.

Every left-out member is reported with its reason (``skipped``), and
:func:`run_portfolio` also skips, and reports, a member whose estimated
time (its cost in simulations at the measured speed of simulations) does
not fit before the deadline - the clock decides only there.

On a cluster of uneven devices (types or speeds differ), ``data-parallel``
also runs with ``shares=proportional`` (batch shares by device speed: on the
zoo graphs on moirai-intra-server 17-20 % faster than equal shares, and
within memory for inception_v3 and nmt where equal shares are not), and
first: where the data-parallel share of the budget pays for one member only
(nmt: 89 evaluations in all), that is the one.

When the model fits on every device, ``dpos`` also places the
data-parallel graph itself (``dpos@data-parallel``: FastT 5.2's OS-DPOS
start - DPOS on the graph of ``k`` replicas and their all-reduce rings, as
explicit ring steps (``collectives=ring``: two ranks of one NCCL collective
cannot share a device, :meth:`~.runner.Runner.data_parallel`) -
without its operation splits, which cost ``2 (k - 1)`` DPOS runs per split
operation).  DPOS may move replica operators off their replica's device,
e.g. onto devices idle while the rings run; its cost is :data:`COST`
``["dpos"] * k`` and it counts under :data:`DP_SHARE`.  It runs only when
the data-parallel candidate was judged within :data:`DP_GATE` of the best
candidate so far (a data-parallel graph far behind, e.g. on slow links, is
not worth re-placing).

``data-parallel`` rings are DDP's 25 MiB gradient buckets by default; a
bucket waits for its last gradient, which can cost more than the latency it
saves (transformer on 4xV100-pcie: 1.78 s against 1.68 s with one ring per
gradient), so auto also tries ``bucket_mb=0`` (one all-reduce per
gradient: a collective node per gradient and replica, judged like the
bucketed one at :data:`DP_SYMMETRIC_COST`) under :data:`DP_SHARE` and the
same :data:`DP_GATE` as ``dpos@data-parallel``.

A placement made on a derived graph (``derived``, with its recipe: FastT /
FD-DPS operation splitting, data parallelism) is judged on that graph, as
``placer simulate`` does, and refined there.
"""

from __future__ import annotations

import math
from typing import Callable

from .. import registry
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.residency import resident_list
from ..transform.split_cost import batch_profile
from .planners import PLAN_SHARE, PLANNERS, fsdp_charge, planner_charge, planner_need
from .runner import Candidate, Runner, Spec, available, run_portfolio

__all__ = ["OVER_BUDGET", "OVER_SHARE", "RANK_COST", "RANK_MARGIN", "REFINE_SHARE", "Candidate", "Runner", "Spec",
           "available", "contenders", "dp_misfit", "member_cost", "plan", "replica_memory", "run_portfolio",
           "wants_milp"]

#: rough cost of a member in simulations of the graph it runs on (measured on one core)
COST = {"metis": 1.5, "scotch": 2.0, "m-topo": 0.3, "single-device": 0.2, "data-parallel": 2.0, "heft": 5.0,
        "dpos": 5.0, "adjusting": 7.0, "m-etf": 10.0, "order-place": 2.0, "fd-dps": 4.0, "m-sct": 8.0,
        "os-dpos": 60.0}
#: data-parallel in the symmetric form (nccl collectives): one replica built to name its nodes, one of each
#: kind (at most two) built and simulated, in simulations of the input graph placed over the cluster.  Measured
#: (one run, load 2-3): 11.3 layered 5,000 nodes on 8 GPUs, 4.4 on 128, 7.2 GPT 1.3B on 128, 10.9 GPT 1.3B
#: with one all-reduce per gradient on 16 - no longer growing with k
DP_SYMMETRIC_COST = 12.0
#: os-dpos' cost per squared device count and split trial (measured as above: 3.4-4.9)
OS_DPOS_COST = 4.0
#: dpos@data-parallel and unbucketed data-parallel run only when data-parallel's makespan is at most
#: this factor over the best so far
DP_GATE = 1.5
#: cost of building one cpd coarse graph, in simulations of the input graph
CPD_COST = 5.0
#: at most this share of the evaluation budget for one member, and for the whole portfolio
MEMBER_SHARE = 0.1
PORTFOLIO_SHARE = 0.3
#: at most this share of the budget for the data-parallel members together (beside PORTFOLIO_SHARE)
DP_SHARE = 0.3
#: at least this share of the budget is the refinement's: no member - the planners (PLAN_SHARE) included - is
#: planned into it, and none starts on it (``Budget.held``; only judging a member that already ran may use it).
#: It is what PORTFOLIO_SHARE + DP_SHARE left the refinement before the planners joined (1 - 0.3 - 0.3); with
#: PLAN_SHARE on top it kept as little as 0.1, and the refinement is where auto gains over its best start (on the
#: zoo 0.05-4 %, converging in 430-960 evaluations of the default 891-1,618 on inception_v3 and resnet50)
REFINE_SHARE = 0.4
#: a member whose cheap estimate (``auto``'s ranking, :mod:`celeritas_cli.algorithms.ranking`) is within this
#: share of the best estimate is a contender: planned first, best estimate first, and judged at least once
#: whatever its share (while the whole budget pays for it).  The estimates are 0.82-1.00 of the simulated step on
#: the zoo over 4xV100-pcie, moirai-intra-server and 8xA100-nvswitch, and two members' ratios on one problem
#: differed by at most 9.6 % (tensor_holography on 8xA100-nvswitch: data-parallel 1.000, fsdp 0.912), so a member
#: truly ahead is estimated at most about 10 % behind the best estimate; the margin is that spread with room
RANK_MARGIN = 0.15
#: the estimates' cost (a layer sequence, node times at two batch fractions, a handful of pipeline cuts), in
#: evaluations: their wall time on the zoo over 8xA100-nvswitch was 18-40 evaluations' worth at the rate the
#: budget is derived from (search.EVAL_RATE; 0.13 s on tensor_holography to 0.6 s on GPT 6.7B, load 7-9).
#: Like a member, the ranking runs only when MEMBER_SHARE of the budget pays for it (else: the fixed order)
RANK_COST = 30.0
#: the reason plan() gives for a contender the whole budget cannot pay for
OVER_BUDGET = "near the best estimate, but over what is left of the whole budget"
#: the members that run right after metis when one data-parallel replica cannot fit the smallest device
TIGHT_FIRST = ("fsdp", "pipeline", "3d")
#: the members that split the batch (replicas, micro-batches, shards): left out where it cannot be split
BATCH_SPLITTERS = ("data-parallel", "dpos@data-parallel", "fsdp", "pipeline", "3d")
#: a member this cheap (its charge + its judgement, in simulations) runs even where the members before it reached
#: into the refinement's share: single-device (1.2) and m-topo (1.3), the baselines a tiny graph may need (layered
#: 60 on moirai-inter-server, 150 evaluations: all on one device, 0.79 ms, beats every other member)
FREE_MEMBER = 1.5
#: cheap members that run first, and within ANCHOR_SHARE, when MEMBER_SHARE would leave them out
ANCHORS = ("metis", "m-topo")
ANCHOR_SHARE = 0.5
#: algorithms with a wall-clock ``time_limit`` of their own: run after the others, each with at most this share
#: of the evaluations and of the time left
TIMED = ("milp", "hierarchical")
TIMED_SHARE = 0.25
#: the reason plan() gives for a member whose cost is over its share
OVER_SHARE = "over its share of the budget"
#: named algorithms auto cannot run, and why
CANNOT = {"given": "it re-evaluates a placement file (-p file=P.json), which auto cannot pass to its members; "
                   "use placer place --algo given -p file=P.json",
          "auto": "auto cannot be its own member"}
#: members run on each coarse graph, in this order
COARSE = ("metis", "m-etf", "adjusting", "heft", "dpos", "order-place")
#: target coarse nodes per device of the coarse granularities
GRANULARITY = (4, 16, 64)
#: the order members are offered in: an algorithm on the input graph, or ``16`` for the coarse graph of
#: about 16 nodes per device (all of :data:`COARSE` on it).  Partitioners, data parallelism (when
#: registered) and list schedulers on coarse graphs first (cheap, strong starts), then list schedulers on
#: the input graph, then the rest; the 3D planner last (it runs early where the ranking makes it a contender, or
#: where a replica does not fit memory: :data:`TIGHT_FIRST`).
PRIORITY = ("metis", "data-parallel", "fsdp", "dpos@data-parallel", "pipeline", 16, "dpos", "heft", "adjusting", 4, 64,
            "scotch", "m-etf", "single-device", "fd-dps", "m-topo", "order-place", "m-sct", "os-dpos", "3d")
MILP_MAX_NODES = 40
#: a named ``milp`` (-p algos=milp) runs on the input graph up to this size, else on the largest coarse graph
#: within it
MILP_NAMED_MAX_NODES = 200


def granularities(graph: Graph, cluster: Cluster) -> dict[int, int]:
    """``cpd`` range R of the coarse graph of about *t* nodes per device, for
    each *t* of :data:`GRANULARITY` where the graph is much larger."""
    out = {}
    for per_device in GRANULARITY:
        target = per_device * cluster.k
        if graph.n >= 3 * target:
            out[per_device] = math.ceil(graph.n / target)
    return out


def wants_milp(graph: Graph, cluster: Cluster, coarse_sizes: dict[int, int], feasible: bool) -> int | None:
    """Where ``milp`` joins: ``0`` for the input graph, ``R`` for a coarse
    graph, None for not at all.  Only for tiny problems (at most
    :data:`MILP_MAX_NODES` nodes) whose memory is tight: no other candidate
    fits, or the graph needs more than 70 % of the cluster's memory - where
    packing exactly can be the only way to fit."""
    if not available("milp") or cluster.k < 2:
        return None
    if feasible and graph.total_memory() <= 0.7 * cluster.total_memory():
        return None
    if graph.n <= MILP_MAX_NODES:
        return 0
    small = [R for R, n in coarse_sizes.items() if n <= MILP_MAX_NODES]
    return min(small) if small else None


def unbucketed(spec: Spec) -> bool:
    """Data parallelism with one all-reduce ring per gradient (``bucket_mb=0``)."""
    return spec.algo == "data-parallel" and dict(spec.params).get("bucket_mb", None) == 0.0


def member_cost(spec: Spec, k: int) -> float:
    """Estimated cost of running *spec* on the graph it runs on, in
    simulations of that graph, for *k* devices (module docstring).

    >>> member_cost(Spec("metis"), 8), member_cost(Spec("data-parallel"), 8), member_cost(Spec("data-parallel"), 1024)
    (1.5, 12.0, 12.0)
    >>> member_cost(Spec("os-dpos", (("max_ops", 1),)), 4)
    448.0
    """
    if spec.algo == "data-parallel":  # the symmetric judge: the same cost for any k, bucketed or not
        return DP_SYMMETRIC_COST if k > 1 else COST["data-parallel"]
    if spec.algo == "fsdp":  # as data-parallel; plan() scales it by the graphs' sizes (planners.fsdp_charge)
        return DP_SYMMETRIC_COST if k > 1 else COST["data-parallel"]
    if spec.on == "data-parallel":
        return COST.get(spec.algo, 10.0) * k
    if spec.algo == "os-dpos":
        ops = dict(spec.params).get("max_ops", registry.get("os-dpos").params["max_ops"].default)
        ops = ops or 64  # 0 = every critical-path operation
        return max(COST["os-dpos"], OS_DPOS_COST * k * k * (1 + 2 * ops * max(0, k - 1)))
    return COST.get(spec.algo, 10.0)


def batch_split_refusal(graph: Graph, cluster: Cluster, assume_batch: int | None = None) -> str | None:
    """Why the members that split the batch (data parallelism, DPOS on the
    data-parallel graph) cannot run on *graph*, or None: no declared batch
    (and none assumed), fewer samples than devices, a coarse graph
    (:func:`~celeritas_cli.transform.admit.dp_refusal`).  ``plan`` leaves them
    out and ``auto`` says why on stderr."""
    from ..transform.admit import dp_refusal

    return dp_refusal(graph, cluster.k, assume_batch, sized=False) if cluster.k > 1 else None


def replica_memory(graph: Graph, k: int) -> int:
    """Bytes one replica of ``data-parallel`` (equal shares, strong
    scaling) holds under the static rule, without building it: every node's
    batch-independent memory (parameters, gradients, optimizer state) in
    full plus ``ceil(1/k)`` of its activations, as
    :func:`~celeritas_cli.transform.replicate.data_parallel_graph` builds
    it (the all-reduce ring nodes hold none).

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.transform.replicate import data_parallel_graph
    >>> g = build("m", [{"id": "x", "compute_s": 4.0, "memory_bytes": 400},
    ...                 {"id": "w", "compute_s": 8.0, "memory_bytes": 500, "colocation": "p",
    ...                  "batch_independent": {"memory_bytes": 100, "state_bytes": 100}},
    ...                 {"id": "g", "compute_s": 8.0, "memory_bytes": 100},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1.0, "memory_bytes": 0, "colocation": "p"}],
    ...           [{"src": "x", "dst": "w", "bytes": 400}, {"src": "w", "dst": "g", "bytes": 400},
    ...            {"src": "g", "dst": "u", "bytes": 100}], meta={"batch_size": 8})
    >>> d = data_parallel_graph(g, 2)
    >>> replica_memory(g, 2), sum(d.memory[v] for v in range(d.n) if d.ids[v].endswith("/rep0"))
    (600, 600)
    """
    prof = batch_profile(graph)
    total = 0
    for v in range(graph.n):
        fixed = prof.fixed_memory[v]
        act = graph.memory[v] - fixed
        total += fixed + (-(-act // k) if k > 1 and not prof.fixed_node[v] else act)
    return total


def dp_misfit(graph: Graph, cluster: Cluster, spec: Spec) -> str | None:
    """Why the data-parallel member *spec* cannot fit memory under the
    rule the judge applies, or None; a sound test, never leaving out a
    member that could fit.  Time rule (the graph declares
    ``resident_bytes``): every replica holds the model's resident state in
    full for the whole step, so its peak is at least that - over the
    smallest device, no split of the batch fits.  Static rule, equal
    shares: one replica (:func:`replica_memory`) exceeds the smallest
    device; uneven shares (``shares=proportional``): no split of the batch
    fits - a device holds less than the batch-independent memory ``F``
    every replica holds, or the devices' room beyond ``F`` is less than the
    activations ``A`` to share (``sum(M_d - F) < A``).

    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = layered(60, seed=1)  # declares resident_bytes: the time rule
    >>> dp_misfit(g, uniform(4, memory=2**40), Spec("data-parallel")) is None
    True
    >>> dp_misfit(g, uniform(4, memory=2**20), Spec("data-parallel"))[:36]
    "every replica holds the model's resi"
    """
    k = cluster.k
    prof = batch_profile(graph)
    resident = resident_list(graph)
    if resident is not None:
        held = sum(min(resident[v], graph.memory[v] if prof.fixed_node[v] else prof.fixed_memory[v])
                   for v in range(graph.n))
        if held <= cluster.min_memory():
            return None
        return (f"every replica holds the model's resident state ({held / 2**30:.3g} GiB of parameters, buffers "
                f"and optimizer state) for the whole step and the smallest device holds "
                f"{cluster.min_memory() / 2**30:.3g} GiB")
    if dict(spec.params).get("shares", "equal") == "equal":
        need = replica_memory(graph, k)
        if need <= cluster.min_memory():
            return None
        return (f"one replica needs {need / 2**30:.3g} GiB (parameters and optimizer state in full, 1/{k} of the "
                f"activations) and the smallest device holds {cluster.min_memory() / 2**30:.3g} GiB")
    fixed = sum(prof.fixed_memory[v] if not prof.fixed_node[v] else graph.memory[v] for v in range(graph.n))
    act = graph.total_memory() - fixed
    room = sum(max(0, d.memory - fixed) for d in cluster.devices)
    if fixed <= cluster.min_memory() and room >= act:
        return None
    return (f"every replica holds {fixed / 2**30:.3g} GiB of parameters and optimizer state and the devices' room "
            f"beyond it ({room / 2**30:.3g} GiB) cannot hold the {act / 2**30:.3g} GiB of activations")


def _offers(graph: Graph, cluster: Cluster, split_batch: bool = True) -> list[list[tuple[Spec, float]]]:
    """Every member auto would consider, grouped (a coarse graph's members
    together), in :data:`PRIORITY` order, with its :func:`member_cost`;
    without the members that split the batch when *split_batch* is False
    (:func:`batch_split_refusal`)."""
    size = max(1, graph.n + graph.m)
    k = cluster.k
    per_node = (graph.n + graph.m) / graph.n if graph.n else 1.0
    coarse_R = granularities(graph, cluster)
    offers: list[list[tuple[Spec, float]]] = []
    priority = list(PRIORITY)
    if replica_memory(graph, k) > cluster.min_memory():  # memory-tight: a replica does not fit, so the planners
        for item in TIGHT_FIRST[::-1]:                   # that shard or cut the model run right after metis
            priority.remove(item)
            priority.insert(1, item)
    for item in priority:
        if not split_batch and item in BATCH_SPLITTERS:
            continue
        if item == "dpos@data-parallel":
            if max(graph.total_memory(), 1) <= cluster.min_memory() and k > 1:
                spec = Spec("dpos", on="data-parallel")
                offers.append([(spec, member_cost(spec, k))])
        elif isinstance(item, str):
            if not available(item):
                continue
            uneven = len({(d.type, d.speed) for d in cluster.devices}) > 1
            cost = member_cost(Spec(item), k)  # fsdp: scaled in plan() by the counted sizes (planners.fsdp_charge)
            if item in ("data-parallel", "fsdp") and uneven:
                # uneven devices: batch shares by device speed first (data_parallel.proportional_shares): 17-20 %
                # faster on the zoo on moirai-intra-server, and within memory where equal shares are not
                offers.append([(Spec(item, (("shares", "proportional"),)), cost)])
            offers.append([(Spec(item), cost)])
            if item == "metis" and graph.total_memory() > 0.5 * cluster.total_memory():
                offers.append([(Spec("metis", (("weights", "memory"),)), COST["metis"])])
            if item == "data-parallel" and k > 1:
                spec = Spec("data-parallel", (("bucket_mb", 0.0),))
                offers.append([(spec, member_cost(spec, k))])
        elif item in coarse_R:
            R = coarse_R[item]
            shrink = min(1.0, per_node * math.ceil(graph.n / R) / size)
            offers.append([(Spec(algo, (), R), COST.get(algo, 10.0) * shrink) for algo in COARSE])
    return offers


def _named_offers(graph: Graph, cluster: Cluster, names: list[str], offers: list, say) -> list:
    """*offers* plus the named algorithms :data:`PRIORITY` does not offer
    (run on the input graph), less those auto cannot run (said)."""
    offered = {spec.algo for group in offers for spec, _ in group}
    out = list(offers)
    for name in names:
        if name in CANNOT:
            say(name, CANNOT[name])
        elif not available(name, named=True):
            extra = registry.get(name).extra if name in registry.names() else None
            say(name, f"needs the '{extra}' extra (pip install -e .[{extra}])" if extra else "not registered")
        elif name not in offered and name not in TIMED:
            out.append([(Spec(name), member_cost(Spec(name), cluster.k))])
    return out


def contenders(offers: list[list[tuple[Spec, float]]], estimate: Callable[[Spec], float | None]) -> dict[Spec, float]:
    """The offered members near the best cheap estimate: ``{spec:
    estimate}`` for each member *estimate* knows (finite: the model says it
    fits) within :data:`RANK_MARGIN` of the best one.

    >>> offers = [[(Spec("metis"), 1.5)], [(Spec("data-parallel"), 24.0)], [(Spec("fsdp"), 24.0)],
    ...           [(Spec("pipeline"), 20.0)]]
    >>> near = contenders(offers, {Spec("data-parallel"): 1.1, Spec("fsdp"): 1.0, Spec("pipeline"): 1.2}.get)
    >>> sorted(spec.name for spec in near)  # within 15 % of fsdp's 1.0 s
    ['data-parallel', 'fsdp']
    """
    est = {}
    for group in offers:
        for spec, _ in group:
            x = estimate(spec) if spec.R is None and spec.on is None else None
            if x is not None and math.isfinite(x):
                est[spec] = x
    best = min(est.values(), default=math.inf)
    return {spec: x for spec, x in est.items() if x <= (1 + RANK_MARGIN) * best}


def plan(graph: Graph, cluster: Cluster, budget: float, names: list[str] | None = None,
         skipped: list[tuple[str, str]] | None = None, *, split_batch: bool = True,
         estimate: Callable[[Spec], float | None] | None = None, near: dict[Spec, float] | None = None,
         spent_before: float = 0.0) -> list[tuple[Spec, float]]:
    """The portfolio for *graph* and an evaluation *budget* (module
    docstring): ``(spec, charge)`` pairs in the order they run, *charge* the
    member's estimated cost in simulations of the input graph (its own
    judgement not included; the first member of a coarse graph also pays for
    building it).  Members are offered in :data:`PRIORITY` order; one over
    :data:`MEMBER_SHARE` of the budget, or one that would take the portfolio
    over :data:`PORTFOLIO_SHARE`, is left out (data-parallel members:
    :data:`DP_SHARE` together; the :data:`ANCHORS`, when the budget is
    tight: :data:`ANCHOR_SHARE`, and first), and so is one that would take
    the members together into the refinement's :data:`REFINE_SHARE`; a
    planner gets at most what the members before it leave of the
    portfolio's part (:func:`~.planners.planner_charge`).  *names*
    restricts it to those
    algorithms, and then every one of them runs, whatever its cost, charged
    at most its share (:data:`TIMED` members are run by the search, not
    planned here).  *skipped* collects ``(member, reason)`` for every member
    left out.  ``split_batch=False`` leaves out the members that split the
    batch (:func:`batch_split_refusal`; ``auto`` says why in one line).

    *estimate* (``auto``'s :class:`~celeritas_cli.algorithms.ranking.Ranking`)
    ranks the members it has a model for; the :func:`contenders` - within
    :data:`RANK_MARGIN` of the best estimate - are planned first (after
    ``metis`` on the input graph), best estimate first, each whatever its share, as long as the members before
    it leave enough of the whole *budget* (the refinement's share included;
    a planner: at least what its model and one plan need), and written to
    *near*; the other members follow in :data:`PRIORITY` order under the
    shares.  Not with *names* (every named member runs anyway).
    *spent_before*: evaluations already spent (the estimates), counted in
    the portfolio's part."""
    k = cluster.k
    notes: list[tuple[str, str]] = skipped if skipped is not None else []
    say = lambda name, why: notes.append((name, why))  # noqa: E731
    offers = _offers(graph, cluster, split_batch)
    if names:
        offers = _named_offers(graph, cluster, names, offers, say)
    ranked = contenders(offers, estimate) if estimate is not None and not names else {}
    if near is not None:
        near.update(ranked)
    if ranked:  # the contenders first, best estimate first (ties in PRIORITY order: the sort is stable), after
        # metis on the input graph (a fraction of a simulation): an answer whatever a contender's run costs
        first = [g for g in offers[:1] if g[0][0] == Spec("metis")]
        offers = first + sorted((g for g in offers if g[0][0] in ranked), key=lambda g: ranked[g[0][0]]) + \
            [g for g in offers[len(first):] if g[0][0] not in ranked]
    tight = not names and COST["metis"] + 1 > MEMBER_SHARE * budget
    if tight:  # a huge graph: the cheap, usually feasible partitioners first
        offers.sort(key=lambda group: group[0][0].algo not in ANCHORS or group[0][0].R is not None)
    out: list[tuple[Spec, float]] = []
    spent = dp_spent = plan_spent = 0.0
    part = (1 - REFINE_SHARE) * budget  # the portfolio's part: the rest is the refinement's
    scale: float | None = None  # fsdp's charge over data-parallel's (planners.fsdp_charge), counted once
    for members in offers:
        built = False
        for spec, charge in members:
            if (names and spec.algo not in names) or not available(spec.algo, named=bool(names)):
                continue
            if spec.on is not None and not any(o == Spec(spec.on) for o, _ in out):
                if not names or spec.on in names:
                    say(spec.name, f"its base, {spec.on}, does not run")
                continue  # its base graph is built by that member, which must run first
            if spec.R is not None and not built:
                charge += CPD_COST
            used = spent_before + spent + dp_spent + plan_spent
            if spec.algo in PLANNERS:  # a budget of its own, out of what the members before it leave of the part
                room = part - used
                if spec not in ranked:  # the planners share PLAN_SHARE of the budget (a contender may take more)
                    room = min(room, PLAN_SHARE * budget - plan_spent)
                if spec in ranked:  # a contender: at least its model and one plan, while the whole budget pays
                    room = max(room, min(budget - used, planner_need(k) + 1))
                charge, why = planner_charge(spec, budget, k, room)
                if why is None or names:
                    plan_spent += charge + 1
                    out.append((spec, charge))
                else:
                    say(spec.name, f"{OVER_BUDGET} ({max(0.0, budget - used):.3g} of {budget:.0f} evaluations "
                                   f"left; its model and one plan need about {planner_need(k) + 1:.3g})"
                        if spec in ranked else why)
                continue
            dp = spec.algo in ("data-parallel", "fsdp") or spec.on == "data-parallel"
            anchor = tight and spec.algo in ANCHORS and spec.R is None
            if spec in ranked:  # a contender: whatever its share, while the whole budget pays for it
                share = 1.0
                if spec.algo == "fsdp":
                    scale = fsdp_charge(graph, k, 1.0) if scale is None else scale
                    charge *= scale
                over = used + charge + 1 > budget
            elif dp:
                share = DP_SHARE
                over = dp_spent + charge + 1 > DP_SHARE * budget
                if spec.algo == "fsdp" and not over:  # counting walks the graph: only for a member that may run
                    if scale is None:
                        scale = fsdp_charge(graph, k, 1.0)
                    charge *= scale
                    over = dp_spent + charge + 1 > DP_SHARE * budget
            elif anchor:
                share = ANCHOR_SHARE
                over = spent + charge + 1 > ANCHOR_SHARE * budget
            else:
                share = MEMBER_SHARE
                over = charge + 1 > MEMBER_SHARE * budget or spent + charge + 1 > PORTFOLIO_SHARE * budget
            if not anchor and spec not in ranked and charge + 1 > FREE_MEMBER:  # the refinement's share (the
                over = over or used + charge + 1 > part  # anchors' graph is too large for refinement's levels
                # anyway; a contender may take it; a member of one simulation or so costs it nothing that matters)
            if over and not names:
                say(spec.name, f"{OVER_BUDGET} (costs about {charge + 1:.3g}; {max(0.0, budget - used):.3g} of "
                               f"{budget:.0f} evaluations left)" if spec in ranked else
                    f"{OVER_SHARE} (costs about {charge + 1:.3g} of the {budget:.0f} evaluations)")
                continue
            if over:  # named: runs whatever its cost, charged at most its share (so it can still be judged)
                charge = min(charge, max(0.0, share * budget - 1))
            if spec.algo == "data-parallel" and not names and k > 1:
                misfit = dp_misfit(graph, cluster, spec)
                if misfit:
                    say(spec.name, misfit)
                    continue
            built = built or spec.R is not None
            if dp:
                dp_spent += charge + 1
            else:
                spent += charge + 1
            out.append((spec, charge))
    return out


