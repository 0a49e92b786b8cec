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
  for the members that replicate the graph on every device - data
  parallelism, OS-DPOS - a factor growing with the device count ``k``:
  ``data-parallel`` builds and judges ``k`` replicas plus ``k``-step rings,
  :data:`DP_COST` ``* k**2``; ``os-dpos`` runs DPOS on that graph for
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
* ``milp`` (Moirai's exact model) joins only for tiny problems with tight
  memory (:func:`wants_milp`), where exact packing can be the only feasible
  answer.

On a cluster of uneven devices (types or speeds differ), ``data-parallel``
also runs with ``shares=proportional`` (batch shares by device speed: on the
zoo graphs on moirai-intra-server 17-20 % faster than equal shares, and
within memory for inception_v3 and nmt where equal shares are not).

When the model fits on every device, ``dpos`` also places the
data-parallel graph itself (``dpos@data-parallel``: FastT 5.2's OS-DPOS
start - DPOS on the graph of ``k`` replicas and their all-reduce rings -
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
gradient), so auto also tries ``bucket_mb=0`` (one ring per gradient, a
graph about ``1 + k/2`` times larger: :data:`UNBUCKETED_FACTOR`) under
:data:`DP_SHARE` and the same :data:`DP_GATE` as ``dpos@data-parallel``.

A placement made on a derived graph (``derived``, with its recipe: FastT /
FD-DPS operation splitting, data parallelism) is judged on that graph, as
``placer simulate`` does, and refined there.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass, field
from typing import Callable

from .. import registry
from ..errors import PlacerError
from ..log import chatty, quiet, warn
from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..model.placement import Placement

#: rough cost of a member in simulations of the graph it runs on (measured on one core)
COST = {"metis": 1.5, "scotch": 2.0, "m-topo": 0.3, "single-device": 0.2, "data-parallel": 2.0, "heft": 5.0,
        "dpos": 5.0, "adjusting": 7.0, "m-etf": 10.0, "order-place": 2.0, "fd-dps": 4.0, "m-sct": 8.0,
        "os-dpos": 60.0}
#: data-parallel's cost per squared device count, in simulations of the input graph (measured with 25 MiB
#: buckets on layered graphs of 1,000 nodes on 4, 8 and 16 devices: 0.38, 0.21, 0.21 k**2)
DP_COST = 0.25
#: os-dpos' cost per squared device count and split trial (measured as above: 3.4-4.9)
OS_DPOS_COST = 4.0
#: data-parallel with one ring per gradient (bucket_mb=0) costs about 1 + k * this times the bucketed one
#: (graph sizes of the zoo models: 3x, 5x, 9x on 4, 8, 16 devices)
UNBUCKETED_FACTOR = 0.5
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
#: members run on each coarse graph, in this order
COARSE = ("metis", "m-etf", "adjusting", "heft", "dpos", "order-place")
#: target coarse nodes per device of the coarse granularities
GRANULARITY = (4, 16, 64)
#: the order members are offered in: an algorithm on the input graph, or ``16`` for the coarse graph of
#: about 16 nodes per device (all of :data:`COARSE` on it).  Partitioners, data parallelism (when
#: registered) and list schedulers on coarse graphs first (cheap, strong starts), then list schedulers on
#: the input graph, then the rest.
PRIORITY = ("metis", "data-parallel", "dpos@data-parallel", 16, "dpos", "heft", "adjusting", 4, 64, "scotch", "m-etf",
            "single-device", "fd-dps", "m-topo", "order-place", "m-sct", "os-dpos")
MILP_MAX_NODES = 40


@dataclass(frozen=True)
class Spec:
    """One portfolio member: ``algo`` with ``params`` on the input graph
    (``R = None``), on its ``cpd`` coarse graph of range ``R``, or (``on =
    "data-parallel"``) on its data-parallel graph."""

    algo: str
    params: tuple = ()
    R: int | None = None
    on: str | None = None

    @property
    def name(self) -> str:
        label = self.algo
        if self.params:
            label += "(" + ",".join(f"{k}={v}" for k, v in self.params) + ")"
        if self.on is not None:
            return f"{label}@{self.on}"
        return label if self.R is None else f"{label}@cpd(R={self.R})"


@dataclass
class Candidate:
    """A portfolio member's result: its placement and how the simulator
    judged it (``device_of`` / ``order`` over the nodes of the graph it is
    simulated on - the input graph, or the derived graph it carries)."""

    spec: Spec
    placement: Placement
    graph: Graph
    device_of: list[int]
    order: list[list[int]] | None
    derived: bool = False
    score: object = None
    extra: dict = field(default_factory=dict)


def _available(name: str) -> bool:
    if name not in registry.names():
        return False
    return registry.get(name).extra is None


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
    if not _available("milp") or cluster.k < 2:
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

    >>> member_cost(Spec("metis"), 8), member_cost(Spec("data-parallel"), 8)
    (1.5, 16.0)
    >>> member_cost(Spec("os-dpos", (("max_ops", 1),)), 4)
    448.0
    """
    if spec.algo == "data-parallel":
        cost = max(COST["data-parallel"], DP_COST * k * k)
        return cost * (1 + UNBUCKETED_FACTOR * k) if unbucketed(spec) else cost
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


def plan(graph: Graph, cluster: Cluster, budget: float, names: list[str] | None = None, *,
         split_batch: bool = True) -> list[tuple[Spec, float]]:
    """The portfolio for *graph* and an evaluation *budget* (module
    docstring): ``(spec, charge)`` pairs in the order they run, *charge* the
    member's estimated cost in simulations of the input graph (its own
    judgement not included; the first member of a coarse graph also pays for
    building it).  Members are offered in :data:`PRIORITY` order; one over
    :data:`MEMBER_SHARE` of the budget, or one that would take the portfolio
    over :data:`PORTFOLIO_SHARE`, is left out (data-parallel members:
    :data:`DP_SHARE` together).  *names* restricts it to those algorithms,
    and then every one of them runs, whatever its cost, charged at most its
    share.  ``split_batch=False`` leaves out the members that split the
    batch (:func:`batch_split_refusal`)."""
    size = max(1, graph.n + graph.m)
    k = cluster.k
    per_node = (graph.n + graph.m) / graph.n if graph.n else 1.0
    coarse_R = granularities(graph, cluster)
    offers: list[list[tuple[Spec, float]]] = []
    for item in PRIORITY:
        if not split_batch and item in ("data-parallel", "dpos@data-parallel"):
            continue
        if item == "dpos@data-parallel":
            if max(graph.total_memory(), 1) <= cluster.min_memory() and k > 1:
                spec = Spec("dpos", on="data-parallel")
                offers.append([(spec, member_cost(spec, k))])
        elif isinstance(item, str):
            if not _available(item):
                continue
            offers.append([(Spec(item), member_cost(Spec(item), k))])
            if item == "metis" and graph.total_memory() > 0.5 * cluster.total_memory():
                offers.append([(Spec("metis", (("weights", "memory"),)), COST["metis"])])
            if item == "data-parallel" and len({(d.type, d.speed) for d in cluster.devices}) > 1:
                # uneven devices: batch shares by device speed (data_parallel.proportional_shares)
                spec = Spec("data-parallel", (("shares", "proportional"),))
                offers.append([(spec, member_cost(spec, k))])
            if item == "data-parallel" and k > 1:
                spec = Spec("data-parallel", (("bucket_mb", 0.0),))
                offers.append([(spec, member_cost(spec, k))])
        elif item in coarse_R:
            R = coarse_R[item]
            shrink = min(1.0, per_node * math.ceil(graph.n / R) / size)
            offers.append([(Spec(algo, (), R), COST.get(algo, 10.0) * shrink) for algo in COARSE])
    out: list[tuple[Spec, float]] = []
    spent = dp_spent = 0.0
    for members in offers:
        built = False
        for spec, charge in members:
            if (names and spec.algo not in names) or not _available(spec.algo):
                continue
            if spec.on is not None and not any(o == Spec(spec.on) for o, _ in out):
                continue  # its base graph is built by that member, which must run first
            if spec.R is not None and not built:
                charge += CPD_COST
            dp = spec.algo == "data-parallel" or spec.on == "data-parallel"
            if dp:
                over = dp_spent + charge + 1 > DP_SHARE * budget
            else:
                over = charge + 1 > MEMBER_SHARE * budget or spent + charge + 1 > PORTFOLIO_SHARE * budget
            if over and not names:
                continue
            if over:  # named: runs whatever its cost, charged at most its share (so it can still be judged)
                charge = min(charge, max(0.0, (DP_SHARE if dp else MEMBER_SHARE) * budget - 1))
            built = built or spec.R is not None
            if dp:
                dp_spent += charge + 1
            else:
                spent += charge + 1
            out.append((spec, charge))
    return out


class Runner:
    """Runs portfolio members on the input graph and its cpd coarse graphs
    (built once each), under one cost model."""

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, seed: int = 0,
                 assume_batch: int | None = None):
        self.graph = graph
        self.cluster = cluster
        self.costs = costs
        self.seed = seed
        self.assume_batch = assume_batch  # passed to the members that take it (--assume-batch)
        self.coarse: dict[int, Graph] = {}
        self._dp: tuple[Graph, Placement] | None = None

    def coarse_graph(self, R: int) -> Graph:
        if R not in self.coarse:
            self.coarse[R] = registry.coarsen(self.graph, self.cluster, "cpd", params={"R": R}, costs=self.costs)
        return self.coarse[R]

    def data_parallel(self) -> tuple[Graph, Placement]:
        """The data-parallel graph (equal shares) and its placement, built once."""
        if self._dp is None:
            self.run(Spec("data-parallel"))
        assert self._dp is not None
        return self._dp

    def run(self, spec: Spec, params: dict | None = None) -> Candidate:
        """Place with *spec* and map the result onto the graph it is judged on.

        Raises
        ------
        PlacerError
            The algorithm failed (the caller skips the member).
        """
        if spec.on == "data-parallel":
            return self._on_data_parallel(spec, params)
        g = self.graph if spec.R is None else self.coarse_graph(spec.R)
        said = io.StringIO()
        try:  # a member's own lines are not auto's: shown (prefixed) only when chatty
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said), quiet():
                p = registry.place(g, self.cluster, spec.algo, seed=self.seed,
                                   params={**self._assumed(spec.algo), **dict(spec.params), **(params or {})},
                                   costs=self.costs.for_graph(g))
        finally:
            if chatty():
                for line in said.getvalue().splitlines():
                    warn(f"auto: {spec.name}: {line}")
        if p.derived is not None:
            judged = p.derived
            device_of, order = p.resolve(judged, self.cluster, spec.name)
            if spec == Spec("data-parallel") and not params:
                self._dp = (judged, p)
            return Candidate(spec, p, judged, device_of, order, derived=True)
        device_of, order = p.resolve(self.graph, self.cluster, spec.name)
        return Candidate(spec, p, self.graph, device_of, order)


    def _assumed(self, algo: str) -> dict:
        """``assume_batch`` for a member that takes it."""
        return {"assume_batch": self.assume_batch} if self.assume_batch and "assume_batch" in \
            registry.get(algo).params else {}

    def _on_data_parallel(self, spec: Spec, params: dict | None) -> Candidate:
        """*spec*'s algorithm on the data-parallel graph; the placement
        carries that graph's recipe, so ``placer simulate`` rebuilds it."""
        dg, dp = self.data_parallel()
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()), quiet():
            p = registry.place(dg, self.cluster, spec.algo, seed=self.seed,
                               params={**dict(spec.params), **(params or {})}, costs=self.costs.for_graph(dg))
        device_of, order = p.resolve(dg, self.cluster, spec.name)
        p.derived, p.derivation, p.graph = dp.derived, dp.derivation, dp.graph
        return Candidate(spec, p, dg, device_of, order, derived=True)


def run_portfolio(runner: Runner, specs: list[tuple[Spec, float]], judge: Callable[[Candidate], bool],
                  budget, params: Callable[[Spec], dict] | None = None,
                  on_error: Callable[[Spec, Exception], None] | None = None,
                  wanted: Callable[[Spec], bool] | None = None) -> list[Candidate]:
    """Run *specs* in order, charging each its estimated cost to *budget*
    (:class:`~celeritas_cli.optimize.evaluator.Budget`); *judge* scores each
    candidate (False when the budget is spent).  A member the time left
    cannot pay for is skipped (the budget records that the clock decided),
    and so is one *wanted* answers False for (nothing charged)."""
    out: list[Candidate] = []
    for spec, charge in specs:
        if budget.exhausted():
            break
        if wanted is not None and not wanted(spec):
            continue
        if not budget.affordable(charge):
            continue
        budget.charge(charge)
        try:
            cand = runner.run(spec, params(spec) if params else None)
        except PlacerError as exc:
            if on_error is not None:
                on_error(spec, exc)
            continue
        except Exception as exc:  # a bug in one member must not cost the user the answer; say it
            warn(f"auto: candidate {spec.name} failed ({type(exc).__name__}: {exc}); skipped - please report it")
            continue
        if not judge(cand):
            break
        out.append(cand)
    return out
