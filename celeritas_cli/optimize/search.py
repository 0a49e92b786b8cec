"""The ``auto`` search: portfolio, then multilevel refinement with the
simulator in the loop, under one evaluation budget.

1. **Portfolio** (:mod:`~celeritas_cli.optimize.portfolio`): registered
   placers on the input graph and on ``cpd`` coarse graphs; each result is
   simulated on the input graph (or on the derived graph it carries).
2. **Refinement** (:mod:`~celeritas_cli.optimize.refine`): starting from
   the best candidates in turn (distinct assignments, best first; among
   those within :data:`REFINE_TIE` of the best, the one on the smallest
   graph first), units of the multilevel hierarchy
   (:mod:`~celeritas_cli.optimize.levels`) are moved and swapped along the
   realised critical path, coarse units first.  At least
   :data:`~celeritas_cli.optimize.portfolio.REFINE_SHARE` of the budget is
   the refinement's: the portfolio is planned within the rest, and no
   member starts on it (``Budget.held``).
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

The time limit bounds the whole call - for ``placer place`` the whole
command, loading included.  No piece of work starts that is not expected
to end before the deadline: a portfolio member is sized before it starts
(its cost in simulations at the measured speed of simulations,
:meth:`~celeritas_cli.optimize.evaluator.Budget.affordable`), and so is
building the refinement's levels (:data:`LEVELS_COST`) and every
refinement simulation; :data:`RESERVE` of the limit plus
:data:`FINISH_COST` simulations' worth of time is kept for the answer's
bound and its document.  What is skipped is said, with the reason.
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
from ..model.params import DEFAULT_TIME_LIMIT  # auto's; with time limit 0 (no wall clock) the budget is this one's
from ..sim.simulator import lower_bound
from .evaluator import Budget, Evaluator, Score
from .levels import Level, hierarchy
from .planners import PLANNERS, planner_need, planner_params
from .portfolio import (
    ANCHORS,
    DP_GATE,
    MEMBER_SHARE,
    MILP_NAMED_MAX_NODES,
    OVER_SHARE,
    RANK_COST,
    RANK_MARGIN,
    REFINE_SHARE,
    TIMED,
    TIMED_SHARE,
    Candidate,
    Runner,
    Spec,
    available,
    batch_split_refusal,
    plan,
    run_portfolio,
    unbucketed,
    wants_milp,
)
from .refine import State, refine

#: simulated nodes + edges per second assumed by :func:`default_evaluations`
EVAL_RATE = 2.5e5
#: share of the time limit kept at least for the finishing steps (writing the answer)
RESERVE = 0.04
#: the finishing steps (the answer's lower bound, its placement document, writing it, the interpreter freeing
#: the graph at exit), in simulations of the input graph (measured: 0.1 + 0.08 + 0.02 on a 36,000-node graph;
#: the exit 0.4-0.8 of a simulation on 200,000 nodes, more on a loaded machine)
FINISH_COST = 1.0
#: building the refinement's levels (heavy-edge matching), in simulations of the graph refined
#: (measured 3.6 on a 36,000-node graph)
LEVELS_COST = 4.0
#: a member with a time limit of its own (milp, hierarchical) is not started with less than this many seconds
TIMED_MIN_S = 1.0
#: refinement starts this close to the best start (relative makespan) count as tied, and the one on the smallest
#: graph is refined first: what refinement gains is of this order (on the zoo 0.05-4 %), so a tie is not decided
#: by the start's score, and a graph w times smaller gets w times the simulations of the same evaluations
#: (inception_v3 on moirai-intra-server: fsdp's 6.2x graph, 0.12 % ahead, gains nothing in 370 evaluations where
#: data parallelism's 4.5x graph gains 0.5 %)
REFINE_TIE = 0.01


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
    refine_spent: float = 0.0  # evaluations the refinement spent (the rest: the portfolio's)
    skipped: list[dict] = field(default_factory=list)  # members that did not run: {"name", "why"}


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
    """One run of the optimizer (see the module docstring).

    *deadline* (a :func:`time.perf_counter` reading) is when the whole call
    must be done; default: *time_limit* from the start of the search (none
    for a limit of 0).  *log* hears progress; *notice* hears what
    qualifies the answer whatever the verbosity (a named member that did
    not run, and why)."""

    def __init__(self, graph: Graph, cluster: Cluster, *, costs: CostModel | None = None, seed: int = 0,
                 time_limit: float = DEFAULT_TIME_LIMIT, evaluations: int = 0, congestion: str = DEFAULT_CONGESTION,
                 algos: list[str] | None = None, log: Callable[[str], None] | None = None,
                 notice: Callable[[str], None] | None = None, deadline: float | None = None,
                 assume_batch: int | None = None, ranking: Callable[[Spec], float | None] | None = None):
        self.t0 = time.perf_counter()
        self.graph, self.cluster, self.seed = graph, cluster, seed
        self.costs = cost_model(graph, cluster, costs)
        self.time_limit = time_limit or DEFAULT_TIME_LIMIT  # what the counted budgets derive from
        self.congestion = congestion
        self.algos = algos
        self.assume_batch = assume_batch
        self.log = log or (lambda msg: None)
        self.notice = notice or self.log
        limit = evaluations if evaluations > 0 else default_evaluations(graph, self.time_limit)
        end = deadline if deadline is not None else registry.deadline(time_limit, self.t0)
        prior = max(1, graph.n + graph.m) / EVAL_RATE
        self.budget = Budget(limit, None if end is None else end - time_limit * RESERVE, sim_prior_s=prior,
                             reserve=FINISH_COST)
        self.main = _Problem(graph, cluster, self.costs, congestion, seed, self.budget)
        self.derived: dict[int, _Problem] = {}
        self.candidates: list[Candidate] = []
        self.skipped: list[dict] = []
        self.portfolio_spent: float | None = None  # evaluations spent when the portfolio ended
        self._charges: dict[Spec, float] = {}
        self.ranking = ranking  # cheap estimates of the members (plan's contenders), or None: the fixed order
        self._free = False  # the contenders run outside the count (a count too small for the ranking's share)
        self.near: dict[Spec, float] = {}
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
        if cand.spec in self._charges:  # a planner: pay back what its own budget left unspent
            self._refund(cand.spec, cand.placement.estimate.get("evaluations_spent"))
        free = self._free and cand.spec in self.near  # a contender outside the count (_portfolio)
        res = self._problem(cand).ev.evaluate(cand.device_of, cand.order, clock=False, force=free)
        if res is None:
            return False
        cand.score = res[0]
        self.candidates.append(cand)
        self.log(f"auto: candidate {cand.spec.name}: {_fmt(cand.score)} (placed in "
                 f"{cand.placement.placement_time_s:.2f} s, {self.budget.spent:.0f} evaluations spent)")
        return True

    def _skip(self, name: str, why: str, say: bool = True) -> None:
        """Record (``estimate.skipped``) and say a member that did not run;
        a named one (``-p algos``) is said whatever the verbosity."""
        self.skipped.append({"name": name, "why": why})
        named = self.algos is not None and name.split("(")[0].split("@")[0] in self.algos
        if say or named:
            (self.notice if named else self.log)(f"auto: candidate {name} skipped: {why}")

    def progress(self, msg: str) -> None:
        now = time.perf_counter()
        if now - self._last_log >= 1.0:
            self._last_log = now
            self.log(f"auto: {now - self.t0:5.1f} s, {self.budget.used} simulations: {msg}")

    # ------------------------------------------------------------- phases
    def portfolio(self) -> None:
        """Plan and run the members (module :mod:`.portfolio`) with the
        refinement's share of the budget held (:data:`~.portfolio.REFINE_SHARE`;
        less what the contenders planned beyond the portfolio's part take)."""
        self.budget.held = REFINE_SHARE * self.budget.limit
        try:
            self._portfolio()
        finally:
            self.budget.held = 0.0

    def _portfolio(self) -> None:
        runner = Runner(self.graph, self.cluster, self.costs, self.seed, self.assume_batch)
        notes: list[tuple[str, str]] = []
        split = batch_split_refusal(self.graph, self.cluster, self.assume_batch) is None
        # the estimates cost about RANK_COST evaluations of work: where a member's share pays for them they are
        # counted like a member; where the count is smaller (a big graph on many devices: issue 33.3, nmt on
        # 8xA100-nvswitch, 89 evaluations) they and the contenders they name run outside the count - a member
        # they rank near the best is judged once whatever the count; the clock caps them
        rank = (self.ranking is not None and self.algos is None and split and self.cluster.k > 1 and
                RANK_COST + 1 <= self.budget.limit and self.budget.affordable(RANK_COST))
        self._free = rank and RANK_COST + 1 > MEMBER_SHARE * self.budget.limit
        if rank and not self._free:  # counted before the members are planned
            self.budget.charge(RANK_COST)
        near: dict = {}
        specs = plan(self.graph, self.cluster, self.budget.limit, self.algos, [] if self._free else notes,
                     split_batch=split, estimate=self.ranking if rank else None, near=near,
                     spent_before=RANK_COST if rank and not self._free else 0.0)
        if self._free:  # the contenders first, outside the count; the others planned as without the ranking
            rest = plan(self.graph, self.cluster, self.budget.limit, self.algos, notes, split_batch=split)
            planned = dict(rest)  # a planner contender searches with the evaluations it was planned (uncharged)
            specs = [(spec, planned.get(spec, 0.0)) for spec in sorted(near, key=near.get)] + \
                [x for x in rest if x[0] not in near]
            notes[:] = [(n, why) for n, why in notes if n not in {s.name for s in near}]
        self.near.update(near)
        if self.near:
            self._hold_for_refinement(specs)
            self.log(f"auto: near the best cheap estimate (within {100 * RANK_MARGIN:g} %), planned first "
                     f"(after metis): " +
                     ", ".join(f"{spec.name} {x:.4g} s" for spec, x in sorted(self.near.items(), key=lambda kv: kv[1])))
        over = [name for name, why in notes if why.startswith(OVER_SHARE)]
        for name, why in notes:
            self._skip(name, why, say=not why.startswith(OVER_SHARE))
        if over:  # one line for the members the count leaves out (estimate.skipped has each one's cost)
            plain = [x for x in over if "@cpd" not in x]
            coarse = len(over) - len(plain)
            self.log(f"auto: {len(over)} members left out, each over its share of the {self.budget.limit:.0f} "
                     f"evaluations: {', '.join(plain)}" + (f" and {coarse} on coarse graphs" if coarse else ""))
        failed = lambda s, e: self._failed(s, e)  # noqa: E731
        self._charges = {spec: charge for spec, charge in specs if spec.algo in PLANNERS}
        run_portfolio(runner, specs, self._judge, self.budget, self._params, on_error=failed, wanted=self._wanted,
                      on_skip=lambda s, why: self._skip(s.name, why), resize=self._resize,
                      free=(lambda s: s in self.near) if self._free else None,
                      sure=lambda s: s in self.near and s.algo in PLANNERS)
        self._timed(runner, failed)

    def _hold_for_refinement(self, specs: list[tuple[Spec, float]]) -> None:
        """Hold for the refinement what the planned contenders leave of the
        budget: its share, less what they were planned beyond the
        portfolio's part (the members after them keep within the part)."""
        last = max((i for i, (spec, _) in enumerate(specs) if spec in self.near), default=-1)
        planned = RANK_COST + sum(charge + 1 for _, charge in specs[:last + 1])
        self.budget.held = max(0.0, self.budget.limit - max((1 - REFINE_SHARE) * self.budget.limit, planned))

    def _params(self, spec: Spec) -> dict:
        """A planner's parameters (:func:`~.planners.planner_params`): its
        evaluations, the time left, and the best feasible makespan so far
        to beat (it gives up, at no evaluation, when its model predicts
        nothing near it)."""
        if spec not in self._charges:
            return {}
        best = min((c.score.makespan for c in self.candidates if c.score.feasible), default=0.0)
        if spec in self.near:  # a contender judges its first plan, whatever its model says of the best so far
            best = 0.0
        params = planner_params(spec, self._charges[spec], self.budget.remaining_time(), best)
        self.log(f"auto: {spec.name} searches with {params['evaluations']} of the {self.budget.limit:.0f} evaluations")
        return params

    def _resize(self, spec: Spec, charge: float) -> tuple[float, str | None]:
        """A planner's planned *charge* fitted, as it starts, to what the
        portfolio has left of its part (the budget less the held
        refinement's share: judging a derived graph can cost more than
        planned), or why it no longer runs (that pays for no plan; a named
        one, ``-p algos``, runs whatever is left).  Another member starts
        while one evaluation of the part is left (``Budget.exhausted``), so
        the refinement's share loses at most one member's estimate error."""
        if spec not in self._charges:
            return charge, None
        left = self.budget.limit - self.budget.held - self.budget.spent - 1
        # and to the time left: a planner's charge in evaluations of the input graph, at the measured speed (on a
        # large cluster one evaluation takes long: GPT 1.3B over 1,024 GPUs, about 1 s; the planner searches what
        # the clock pays for instead of being skipped)
        if self.budget.used and self.budget.deadline is not None:
            per = self.budget.sim_time()
            if per > 0:
                left = min(left, self.budget.remaining_time() / per - 1)
        charge = self._charges[spec] = max(0.0, min(charge, left))
        if spec in self.near:  # a contender judges its first plan whatever its count says (metis already answered)
            charge = self._charges[spec] = max(charge, planner_need(self.cluster.k))
        if charge < planner_need(self.cluster.k) and not (self.algos is not None and spec.algo in self.algos):
            return charge, (f"the portfolio's part of the budget has {max(0.0, left):.0f} evaluations left, too few "
                            f"for its model and one plan; the rest ({REFINE_SHARE:g} of the budget) is the "
                            f"refinement's")
        return charge, None

    def _refund(self, spec: Spec, spent) -> None:
        """Settle a planner's charge with what it spent: the part it did
        not spend is paid back, what it spent beyond it (its first plan is
        judged whatever its count says) is charged."""
        used = float(spent) if isinstance(spent, (int, float)) else self._charges[spec]
        self.budget.charged += used - self._charges[spec]
        self._charges[spec] = used

    def _failed(self, spec: Spec, exc: Exception) -> None:
        if spec in self._charges:  # a planner that gave up or failed spent (almost) nothing of its charge
            self._refund(spec, 0.0)
        self._skip(spec.name, f"it failed: {exc}" if "gave up" not in str(exc) else str(exc))

    def _timed(self, runner: Runner, failed) -> None:
        """The members with a wall-clock limit of their own (:data:`~.portfolio.TIMED`):
        ``milp`` where :func:`~.portfolio.wants_milp` says (or wherever it
        is named), ``hierarchical`` when named; each with a time limit
        derived from ``time_limit`` alone (0.3 of it, named ones sharing 0.8
        of it), capped by the time left, and :data:`~.portfolio.TIMED_SHARE`
        of the evaluations left."""
        feasible = any(c.score.feasible for c in self.candidates)
        named = [a for a in TIMED if self.algos is not None and a in self.algos]
        todo: list[Spec] = []
        if "milp" in named:
            todo.append(Spec("milp", (), self._milp_graph(runner)))
        elif self.algos is None:
            where = wants_milp(self.graph, self.cluster, {R: g.n for R, g in runner.coarse.items()}, feasible)
            if where is not None:
                todo.append(Spec("milp", (), where or None))
        todo += [Spec(a) for a in named if a != "milp"]
        for spec in todo:
            if not available(spec.algo, named=spec.algo in named):
                continue  # said by plan
            seconds = 0.8 * self.time_limit / len(named) if named else 0.3 * self.time_limit
            left = self.budget.remaining_time()
            if self.budget.exhausted() or left < TIMED_MIN_S:
                self._skip(spec.name, f"needs at least {TIMED_MIN_S:g} s and {max(0.0, left):.2g} s are left "
                                      f"before the deadline" if left < TIMED_MIN_S else "the budget is spent")
                continue
            if seconds > left:
                seconds = left
                self.budget.clock_cut = True
            params = {"time_limit": max(TIMED_MIN_S, seconds), "congestion": self.congestion}
            if spec.algo == "milp":
                params.update({"workers": 1, "hint": "none" if feasible else "auto"})
            elif spec.algo == "hierarchical":
                params["progress"] = False
            charge = TIMED_SHARE * max(0.0, self.budget.limit - self.budget.held - self.budget.spent)
            run_portfolio(runner, [(spec, charge)], self._judge, self.budget, lambda _s, p=params: p,
                          on_error=failed)

    def _milp_graph(self, runner: Runner) -> int | None:
        """Where a named ``milp`` runs: the input graph up to
        :data:`~.portfolio.MILP_NAMED_MAX_NODES` nodes, else the largest
        ``cpd`` coarse graph within that size (``R``)."""
        if self.graph.n <= MILP_NAMED_MAX_NODES:
            return None
        R = -(-self.graph.n // max(1, MILP_NAMED_MAX_NODES // 2))
        while runner.coarse_graph(R).n > MILP_NAMED_MAX_NODES:
            R *= 2
        return R

    def _wanted(self, spec: Spec) -> bool:
        """A member on the data-parallel graph, and data parallelism with one
        ring per gradient, run only when the (bucketed) data-parallel
        candidate is within :data:`~.portfolio.DP_GATE` of the best so far."""
        if spec.on != "data-parallel" and not unbucketed(spec):
            return True
        base = [c.score for c in self.candidates if c.spec == Spec("data-parallel")]
        best = min((c.score for c in self.candidates), key=lambda s: (s.overflow, s.makespan), default=None)
        return bool(base) and base[0].feasible == best.feasible and base[0].makespan <= DP_GATE * best.makespan

    def starts(self) -> list[Candidate]:
        """Refinement starts: candidates best first, distinct assignments;
        the ones tied with the best (:data:`REFINE_TIE`, same bytes over
        memory) smallest graph first (see :meth:`_start_state` for their
        order)."""
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
        if not out:
            return out
        best = out[0].score
        tied = [c for c in out if c.score.overflow == best.overflow and
                c.score.makespan <= best.makespan * (1 + REFINE_TIE)]
        tied.sort(key=lambda c: c.graph.n + c.graph.m)  # stable: by score within one size
        return tied + out[len(tied):]

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
        an earlier one accepted stops there (it would end the same way).
        Building a graph's levels (:data:`LEVELS_COST`) starts only when it
        fits in the time left."""
        best_c, best_s = None, None
        visited: set[tuple[int, bytes]] = set()
        for cand in self.starts():
            if self.budget.exhausted():
                break
            if cand.placement.replicas is not None:
                continue  # a symmetric plan: moving one copy's nodes would break the copies' symmetry
            prob = self._problem(cand)
            if prob._levels is None and not self.budget.affordable(LEVELS_COST * prob.ev.weight):
                self.log(f"auto: refinement of {cand.spec.name} skipped: its levels need about "
                         f"{self.budget.seconds_for(LEVELS_COST * prob.ev.weight):.2g} s and "
                         f"{max(0.0, self.budget.remaining_time()):.2g} s are left before the deadline")
                break
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
        self.portfolio_spent = self.budget.spent
        if not self.candidates:  # nothing ran: a cheap placer, judged once, whatever the budget says
            fallback = next(a for a in (*ANCHORS, "m-topo") if available(a))
            if self.algos is not None:
                self.notice(f"auto: none of {', '.join(self.algos)} gave a candidate; the answer is {fallback}'s")
            self.budget.limit = self.budget.spent + 1
            self.budget.deadline = None
            run_portfolio(Runner(self.graph, self.cluster, self.costs, self.seed, self.assume_batch),
                          [(Spec(fallback), 0.0)],
                          self._judge, self.budget)
        start = self.best_candidate()
        self.log(f"auto: best start {start.spec.name}: {_fmt(start.score)}; refining "
                 f"({self.budget.limit - self.budget.spent:.0f} of {self.budget.limit:.0f} evaluations left)")
        ref_c, ref_s = self.refine_all()
        out = self.outcome(ref_c, ref_s)
        assert out is not None
        return out

    def best_candidate(self) -> Candidate:
        """The best candidate judged (least memory overflow, then makespan)."""
        return min(self.candidates, key=lambda c: (c.score.overflow, c.score.makespan))

    def outcome(self, ref_c: Candidate | None = None, ref_s: State | None = None) -> Outcome | None:
        """The answer: the best candidate judged so far, or the refinement's
        best state of *ref_c* when better; None before any candidate.  Also
        what ``auto`` answers when the registry's time cap stops the search
        (:func:`~celeritas_cli.model.clock.keep_best`)."""
        if not self.candidates:
            return None
        start = self.best_candidate()
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
        out.refine_spent = self.budget.spent - (self.portfolio_spent if self.portfolio_spent is not None else
                                                self.budget.spent)
        # a member whose own search the wall clock ended (e.g. milp) makes the answer unrepeatable too
        unrepeatable = any(c.placement.estimate.get("repeatable") is False for c in self.candidates)
        out.clock_cut = self.budget.clock_cut or unrepeatable
        out.skipped = self.skipped
        return out


def _fmt(score: Score) -> str:
    txt = f"{score.makespan:.6g} s"
    return txt if score.feasible else f"{txt} (OOM by {score.overflow / 2**20:.0f} MiB)"
