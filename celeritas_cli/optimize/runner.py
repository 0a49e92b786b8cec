"""Running ``auto``'s portfolio members (:mod:`.portfolio` decides which).

A member is a :class:`Spec` - a registered algorithm, its parameters and
the graph it runs on (the input graph, a ``cpd`` coarse graph, or the
data-parallel graph); :class:`Runner` places it and maps the result onto
the graph it is judged on (:class:`Candidate`); :func:`run_portfolio` runs
members in order under an evaluation budget, each charged its estimated
cost before it starts, and skips - saying why - a member whose estimated
time does not fit before the deadline or for which the budget is spent.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
from dataclasses import dataclass, field
from typing import Callable

from .. import registry
from ..errors import PlacerError
from ..log import chatty, quiet, warn
from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..model.placement import Placement
from ..sim import symmetric
from ..transform.derivation import derive


@dataclass(frozen=True)
class Spec:
    """One portfolio member: ``algo`` with ``params`` on the input graph
    (``R = None``), on its ``cpd`` coarse graph of range ``R``, or (``on =
    "data-parallel"``) on its data-parallel graph.

    >>> Spec("metis").name, Spec("heft", (), 12).name, Spec("dpos", on="data-parallel").name
    ('metis', 'heft@cpd(R=12)', 'dpos@data-parallel')
    """

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


def available(name: str, named: bool = False) -> bool:
    """*name* is registered and needs no extra - or, when the user *named*
    it (``-p algos``), needs only extras that are installed (the automatic
    portfolio never waits for torch's import)."""
    if name not in registry.names():
        return False
    extra = registry.get(name).extra
    return extra is None or (named and importlib.util.find_spec(extra) is not None)


def derived_graph(p: Placement, label: str) -> Graph:
    """The derived graph a placement refers to: the object its algorithm
    built (``derived``), else parsed from a ``split_graph`` it carries."""
    if p.derived is not None:
        return p.derived
    return Graph.from_dict(p.split_graph, f"{label} (split_graph)")


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
        self._dp_compact: Placement | None = None

    def coarse_graph(self, R: int) -> Graph:
        if R not in self.coarse:
            self.coarse[R] = registry.coarsen(self.graph, self.cluster, "cpd", params={"R": R}, costs=self.costs)
        return self.coarse[R]

    def data_parallel(self) -> tuple[Graph, Placement]:
        """The data-parallel graph (equal shares) and its placement, built
        once, for the placers that move its nodes (``dpos@data-parallel``).

        Every replica is built, and its all-reduces as explicit ring steps
        (``collectives="ring"``, what ``placer run`` executes): a placer
        free to move nodes may put two ranks of one NCCL collective on one
        device, which NCCL cannot run (one rank per device) and the
        simulator's collective stream (rule 6) cannot schedule, while ring
        steps are ordinary nodes and transfers (FastT 5.2's OS-DPOS start:
        the replicas and their all-reduce rings)."""
        if self._dp is None:
            self.run(Spec("data-parallel"))
        if self._dp is None and self._dp_compact is not None:
            p = copy.copy(self._dp_compact)
            steps = [dict(s) for s in p.derivation["steps"]]
            steps[-1]["collectives"] = "ring"
            p.derivation = {**p.derivation, "steps": steps}
            p.derived = derive(self.graph, p.derivation, "data-parallel", devices=self.cluster.k,
                               cluster=self.cluster.name)
            home = [row[0] for row in p.replicas["devices"]]  # replica r runs whole on one device
            p.assignment = {p.derived.ids[v]: home[int(x["replica"])] for v, x in enumerate(p.derived.node_extra)}
            p.order, p.replicas = None, None
            self._dp = (p.derived, p)
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
        if p.replicas is not None:  # a symmetric plan: judged one replica of each kind (sim/symmetric.py)
            if spec == Spec("data-parallel") and not params:
                self._dp_compact = p
            j = symmetric.judge(g, self.cluster, p, spec.name)
            return Candidate(spec, p, j.graph, j.device_of, j.order, derived=True)
        # (the planners write the symmetric form only where it is judged so: symmetric.asymmetry is None)
        if p.split_graph is not None or p.derived is not None:
            judged = derived_graph(p, spec.name)
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
        p.split_graph, p.derivation, p.graph, p.derived = dp.split_graph, dp.derivation, dp.graph, dg
        return Candidate(spec, p, dg, device_of, order, derived=True)


def run_portfolio(runner: Runner, specs: list[tuple[Spec, float]], judge: Callable[[Candidate], bool],
                  budget, params: Callable[[Spec], dict] | None = None,
                  on_error: Callable[[Spec, Exception], None] | None = None,
                  wanted: Callable[[Spec], bool] | None = None,
                  on_skip: Callable[[Spec, str], None] | None = None,
                  resize: Callable[[Spec, float], tuple[float, str | None]] | None = None,
                  free: Callable[[Spec], bool] | None = None,
                  sure: Callable[[Spec], bool] | None = None) -> list[Candidate]:
    """Run *specs* in order, charging each its estimated cost to *budget*
    (:class:`~celeritas_cli.optimize.evaluator.Budget`) before it starts;
    *judge* scores each candidate (False when the budget is spent).  A
    member whose estimated time (:meth:`~.evaluator.Budget.seconds_for`)
    does not fit in the time left is skipped (the budget records that the
    clock decided), and so is one *wanted* answers False for (nothing
    charged), and one *resize* refuses: it answers ``(charge, why_not)``
    for a member about to start, its planned charge fitted to what is left
    of the count.  *on_skip* hears every member skipped for time or budget,
    with the reason.  A member *free* answers True for runs outside the
    count (``auto``'s contenders on a count too small for them), stopped
    only by the deadline.  A member *sure* answers True for starts whatever
    its estimated time (``auto``'s contending planners: they judge their
    first plan and stop at the deadline on their own, and the input graph's
    simulations that time them say nothing of their derived graphs')."""
    out: list[Candidate] = []
    skip = on_skip or (lambda spec, why: None)
    for i, (spec, charge) in enumerate(specs):
        outside = free is not None and free(spec)
        if outside and budget.out_of_time():
            skip(spec, "the deadline came before it could start")
            continue
        if not outside and budget.exhausted():
            why = ("the evaluation budget was spent before it could start" if budget.over_count(held=False) else
                   "the evaluations left are the refinement's" if budget.over_count() else
                   "the deadline came before it could start")
            for rest, _ in specs[i:]:
                skip(rest, why)
            break
        if not outside:  # sized and charged to the count before it starts
            if wanted is not None and not wanted(spec):
                continue
            if resize is not None:
                charge, refused = resize(spec, charge)
                if refused is not None:
                    skip(spec, refused)
                    continue
            if not budget.affordable(charge) and not (sure is not None and sure(spec)):
                skip(spec, f"needs about {budget.seconds_for(charge):.2g} s and "
                           f"{max(0.0, budget.remaining_time()):.2g} s are left before the deadline")
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
