"""The ``auto`` search: portfolio, then multilevel refinement with the
simulator in the loop, under one evaluation budget.

1. **Portfolio** (:mod:`~celeritas_cli.optimize.portfolio`): registered
   placers on the input graph and on ``cpd`` coarse graphs; each result is
   simulated on the input graph (or on the derived graph it carries).
2. **Refinement** (:mod:`~celeritas_cli.optimize.refine`): starting from
   the best candidates in turn (distinct assignments, best first), units of
   the multilevel hierarchy (:mod:`~celeritas_cli.optimize.levels`) are
   moved and swapped along the realised critical path, coarse units first.
3. **Answer**: the best placement seen, by ``(bytes over memory,
   makespan)``; so it is never worse than the best portfolio candidate, and
   feasible whenever any candidate was.

The budget is counted in simulations (:class:`~celeritas_cli.optimize.evaluator.Budget`):
``evaluations`` when given, else derived from the time limit and the graph
size alone (:func:`default_evaluations`), so the same input, seed and limit
give the same answer; the wall clock only caps the search - until the
``deadline`` the caller passes (``placer place``: the command's start + the
limit, :func:`celeritas_cli.registry.deadline`) - and the result says when
it did (``estimate.clock_cut``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .. import registry
from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..sim.simulator import lower_bound
from .evaluator import Budget, Evaluator, Score
from .levels import Level, hierarchy
from .portfolio import DP_GATE, Candidate, Runner, Spec, plan, run_portfolio, unbucketed, wants_milp
from .refine import State, refine

#: simulated nodes + edges per second assumed by :func:`default_evaluations`
EVAL_RATE = 2.5e5
#: share of the time limit the finishing steps may need (writing the answer)
RESERVE = 0.04
#: auto's time limit in seconds; with time limit 0 (no wall clock) the budget is this one's
DEFAULT_TIME_LIMIT = 10.0


def default_evaluations(graph: Graph, time_limit: float) -> int:
    """Simulations the search may make when ``evaluations`` is not given:
    about what one core simulates of this graph in *time_limit* seconds
    (:data:`EVAL_RATE` nodes + edges per second), at least 20.  Depends on
    the graph's size and the limit only, never on the clock.

    >>> from celeritas_cli.model.generate import layered
    >>> default_evaluations(layered(1000, seed=0), 10.0) > default_evaluations(layered(4000, seed=0), 10.0)
    True
    """
    return max(20, int(time_limit * EVAL_RATE / max(1, graph.n + graph.m)))


@dataclass
class Outcome:
    """The search's answer and its account."""

    graph: Graph  # the graph device_of refers to (input graph or a derived one)
    device_of: list[int]
    order: list[list[int]] | None
    score: Score
    winner: Candidate | None
    start_score: Score | None  # best portfolio candidate
    refined_from: str | None
    candidates: list[dict] = field(default_factory=list)
    evaluations: int = 0
    clock_cut: bool = False
    lower_bound: float = 0.0  # simulator's lower_bound of ``graph`` (the graph the answer runs)


class _Problem:
    """One graph the search simulates: evaluator and (lazily) its levels."""

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, congestion: str, seed: int,
                 budget: Budget, weight: float = 1.0):
        self.graph = graph
        self.ev = Evaluator(graph, cluster, costs.for_graph(graph), congestion, budget, weight)
        self.seed = seed
        self._levels: list[Level] | None = None

    @property
    def levels(self) -> list[Level]:
        if self._levels is None:
            self._levels = hierarchy(self.graph, self.ev.cluster, self.ev.costs, seed=self.seed)
        return self._levels


class Search:
    """One run of the optimizer (see the module docstring)."""

    def __init__(self, graph: Graph, cluster: Cluster, *, costs: CostModel | None = None, seed: int = 0,
                 time_limit: float = DEFAULT_TIME_LIMIT, evaluations: int = 0, congestion: str = DEFAULT_CONGESTION,
                 algos: list[str] | None = None, log: Callable[[str], None] | None = None,
                 deadline: float | None = None):
        self.t0 = time.perf_counter()
        self.graph, self.cluster, self.seed = graph, cluster, seed
        self.costs = cost_model(graph, cluster, costs)
        self.time_limit = time_limit or DEFAULT_TIME_LIMIT  # what the counted budgets derive from
        self.congestion = congestion
        self.algos = algos
        self.log = log or (lambda msg: None)
        limit = evaluations if evaluations > 0 else default_evaluations(graph, self.time_limit)
        end = deadline if deadline is not None else registry.deadline(time_limit, self.t0)
        self.budget = Budget(limit, None if end is None else end - time_limit * RESERVE)
        self.main = _Problem(graph, cluster, self.costs, congestion, seed, self.budget)
        self.derived: dict[int, _Problem] = {}
        self.candidates: list[Candidate] = []
        self._last_log = self.t0

    # ------------------------------------------------------------ helpers
    def _problem(self, cand: Candidate) -> _Problem:
        if not cand.derived:
            return self.main
        key = id(cand.graph)
        if key not in self.derived:
            weight = (cand.graph.n + cand.graph.m) / max(1, self.graph.n + self.graph.m)
            self.derived[key] = _Problem(cand.graph, self.cluster, self.costs, self.congestion, self.seed,
                                         self.budget, weight)
        return self.derived[key]

    def _judge(self, cand: Candidate) -> bool:
        # a member that ran is judged even past the deadline (one simulation): its work is paid for,
        # and dropping it could lose the best start; the count still refuses it
        res = self._problem(cand).ev.evaluate(cand.device_of, cand.order, clock=False)
        if res is None:
            return False
        cand.score = res[0]
        self.candidates.append(cand)
        self.log(f"auto: candidate {cand.spec.name}: {_fmt(cand.score)} (placed in "
                 f"{cand.placement.placement_time_s:.2f} s, {self.budget.spent:.0f} evaluations spent)")
        return True

    def progress(self, msg: str) -> None:
        now = time.perf_counter()
        if now - self._last_log >= 1.0:
            self._last_log = now
            self.log(f"auto: {now - self.t0:5.1f} s, {self.budget.used} evaluations: {msg}")

    # ------------------------------------------------------------- phases
    def portfolio(self) -> None:
        runner = Runner(self.graph, self.cluster, self.costs, self.seed)
        specs = plan(self.graph, self.cluster, self.budget.limit, self.algos)
        skipped = lambda s, e: self.log(f"auto: candidate {s.name} skipped: {e}")  # noqa: E731
        run_portfolio(runner, specs, self._judge, self.budget, on_error=skipped, wanted=self._wanted)
        feasible = any(c.score.feasible for c in self.candidates)
        where = wants_milp(self.graph, self.cluster, {R: g.n for R, g in runner.coarse.items()}, feasible)
        if where is not None and (self.algos is None or "milp" in self.algos) and not self.budget.exhausted():
            milp = {"time_limit": max(1.0, 0.3 * self.time_limit), "workers": 1, "congestion": self.congestion,
                    "hint": "none" if feasible else "auto"}
            charge = 0.25 * (self.budget.limit - self.budget.spent)
            run_portfolio(runner, [(Spec("milp", (), where or None), charge)], self._judge, self.budget,
                          lambda spec: milp, on_error=skipped)

    def _wanted(self, spec: Spec) -> bool:
        """A member on the data-parallel graph, and data parallelism with one
        ring per gradient, run only when the (bucketed) data-parallel
        candidate is within :data:`~.portfolio.DP_GATE` of the best so far."""
        if spec.on != "data-parallel" and not unbucketed(spec):
            return True
        base = [c.score for c in self.candidates if c.spec == Spec("data-parallel")]
        best = min((c.score for c in self.candidates), key=lambda s: (s.overflow, s.makespan), default=None)
        return bool(base) and base[0].feasible == best.feasible and base[0].makespan <= DP_GATE * best.makespan

    def starts(self) -> list[tuple[Candidate, State]]:
        """Refinement starts: candidates best first, distinct assignments,
        (see :meth:`_start_state` for their order)."""
        ranked = sorted(range(len(self.candidates)),
                        key=lambda i: (self.candidates[i].score.overflow, self.candidates[i].score.makespan, i))
        seen: set[tuple] = set()
        out = []
        for i in ranked:
            cand = self.candidates[i]
            key = (id(cand.graph), tuple(cand.device_of))
            if key in seen:
                continue
            seen.add(key)
            out.append(cand)
        return out

    def _start_state(self, cand: Candidate, prob: _Problem) -> State | None:
        """The refinement start of *cand*: its assignment under the
        simulator's own order, or - when the candidate came with an order
        that does better - in order mode (module :mod:`.refine`)."""
        res = prob.ev.evaluate(cand.device_of)
        if res is None:
            return None
        dyn = State(list(cand.device_of), prob.ev.loads(cand.device_of), res[0], res[1])
        if cand.order is None or not cand.score.better(dyn.score):
            return dyn
        res = prob.ev.evaluate(cand.device_of, cand.order)
        if res is None:
            return dyn
        return State(list(cand.device_of), dyn.load, res[0], res[1], [list(s) for s in cand.order])

    def refine_all(self) -> tuple[Candidate | None, State | None]:
        """Refine from each start in turn; a refinement that reaches a state
        an earlier one accepted stops there (it would end the same way)."""
        best_c, best_s = None, None
        visited: set[tuple[int, bytes]] = set()
        for cand in self.starts():
            if self.budget.exhausted():
                break
            prob = self._problem(cand)
            state = self._start_state(cand, prob)
            if state is None:
                break
            name = cand.spec.name

            def on_accept(st: State, name=name, prob=prob) -> bool:
                self.progress(f"refining {name}: {_fmt(st.score)}")
                key = (id(prob), prob.ev.key(st.dev, st.order))
                if key in visited:
                    return False
                visited.add(key)
                return True

            state = refine(prob.ev, prob.levels, state, on_accept)
            if best_s is None or state.score.better(best_s.score):
                best_c, best_s = cand, state
        return best_c, best_s

    def run(self) -> Outcome:
        self.portfolio()
        if not self.candidates:  # no budget at all: the cheapest placer, judged once
            self.budget.limit = self.budget.spent + 1
            self.budget.deadline = None
            run_portfolio(Runner(self.graph, self.cluster, self.costs, self.seed), [(Spec("m-topo"), 0.0)],
                          self._judge, self.budget)
        start = min(self.candidates, key=lambda c: (c.score.overflow, c.score.makespan))
        self.log(f"auto: best start {start.spec.name}: {_fmt(start.score)}; refining "
                 f"({self.budget.limit - self.budget.spent:.0f} evaluations left)")
        ref_c, ref_s = self.refine_all()
        rows = [{"name": c.spec.name, "makespan_s": c.score.makespan,
                 "status": "FEASIBLE" if c.score.feasible else "OOM"} for c in self.candidates]
        out = Outcome(graph=start.graph, device_of=start.device_of, order=start.order, score=start.score,
                      winner=start, start_score=start.score, refined_from=None, candidates=rows)
        if ref_s is not None and ref_s.score.better(start.score):
            out.graph, out.device_of, out.order, out.score = ref_c.graph, ref_s.dev, ref_s.order, ref_s.score
            out.winner, out.refined_from = ref_c, ref_c.spec.name
        # the bound of the graph the answer runs (a derived graph's parts beat the original's critical path)
        out.lower_bound = lower_bound(out.graph, self.cluster, self._problem(out.winner).ev.costs)
        out.evaluations = self.budget.used
        # a member whose own search the wall clock ended (e.g. milp) makes the answer unrepeatable too
        unrepeatable = any(c.placement.estimate.get("repeatable") is False for c in self.candidates)
        out.clock_cut = self.budget.clock_cut or unrepeatable
        return out


def _fmt(score: Score) -> str:
    txt = f"{score.makespan:.6g} s"
    return txt if score.feasible else f"{txt} (OOM by {score.overflow / 2**20:.0f} MiB)"
