"""The search of placer's ``pipeline`` planner (:mod:`.pipeline`).

1. **Shapes**: for each forward order (CPD-TOPO and as-late-as-possible,
   :mod:`~celeritas_cli.pipelining.layers`), each split of the ``k``
   devices into ``p`` pipeline ranks times ``R`` replicas (``p R = k``),
   each arrangement of the devices (fastest devices first, or last:
   sorted by the model's time on them, then memory; stage ``s`` takes the
   ``s``-th group of ``R``, so a stage's lanes are alike where the cluster
   allows), each ``m`` of
   :data:`~celeritas_cli.pipelining.params.SEARCHED_MICROBATCHES` that whole
   samples allow, each schedule of
   :data:`~celeritas_cli.pipelining.schedules.SCHEDULES` whose shape rule
   the shape keeps (:meth:`~celeritas_cli.pipelining.schedules.Schedule.refusal`),
   with recomputation where only it fits; a schedule with model chunks
   (interleaved) with 2, 4 or 8 of them per device.  A single-rank shape
   (``p = 1``) is
   data parallelism with gradient accumulation over ``m`` micro-batches; on
   mixed devices its replicas' batch shares follow their speed.
2. **Cuts**: :meth:`~.model.Model.cut` (Alpa's objective with
   in-flight memory and traffic) gives each shape its cut and predicted
   time.
3. **Judge**: shapes in the model's order - first the best of each
   ``(p, R)``, then the rest - are built
   (:func:`~celeritas_cli.pipelining.builder.derive_pipeline`) and simulated
   by the judge on their derived graph, while the budget lasts.
4. **Moves**: the best simulated plan's cuts are moved a few positions at a
   time, each move simulated, an improvement kept (hill climbing; the
   derived graph is reused when no stage recomputes).

The budget is counted in simulations of the input graph (the model's phase
:data:`MODEL_COST`, a derived graph of ``x`` times the input's size ``x``,
building it :data:`BUILD_COST` times that); the wall clock only caps it
(between the two orders of the model's phase, and before each build and
simulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ...errors import InvalidInput, PlacerError
from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.graph import Graph
from ...model.params import DEFAULT_BUCKET_MB  # single-stage (data-parallel) shapes' buckets, besides one ring each
from ...optimize.evaluator import Budget, Evaluator, Score
from ...pipelining.builder import Derived, derive_pipeline, judged_by_kind, layout
from ...pipelining.cuts import stages_from_cuts
from ...pipelining.params import SEARCHED_MICROBATCHES
from ...pipelining.schedules import ONE_F_ONE_B, SCHEDULES, Schedule, recomputable
from ...pipelining.layers import LayerSequence
from ...sim.describe import pipeline_words
from ...transform.batch import whole_samples
from .model import Model, Plan, Shape

#: building a derived graph costs about this many simulations of it (measured on the zoo transformer: 3.5)
BUILD_COST = 3.0
#: model chunks per device tried by a schedule with chunks (interleaved; Megatron-LM's v)
CHUNKS = (2, 4, 8)
#: forward orders tried
ORDERS = ("cpd", "alap")
#: derived graphs kept for reuse (plans of one m and replication share one)
KEEP_DERIVED = 3
#: the model's phase (node times at every micro-batch size, every shape cut) costs about this many simulations
#: of the input graph (measured on the zoo: 10-25)
MODEL_COST = 20.0
#: ``beat_s``: give up when the model's best plan is predicted more than this much slower
BEAT_MARGIN = 0.05
#: share of the budget the first simulations may take; the rest is for moving boundaries
JUDGE_SHARE = 0.6
#: share of ``time_limit`` the default budget is sized for: the search's evaluations (derived graphs built and
#: simulated, the model's phase) run at 0.2-0.75 of auto's rate (layered_300 on moirai-intra-server: 4-5.4 ms of
#: CPU per evaluation on the shared 2-core machine at load 3.5, 9 ms at load 9), and a default run must end before
#: the default limit with room for a loaded machine, or the clock cuts it and the output differs run to run
#: (issue 33, D11: 1,291 evaluations took 9.6-10 s there at load 3.5)
FIT_SHARE = 0.25


@dataclass
class Trial:
    """A plan the judge simulated."""

    plan: Plan
    seq: LayerSequence
    derived: Derived
    device_of: list[int]
    order: list[list[int]]
    score: Score
    stage_of: list[int]


@dataclass
class Fixed:
    """What the user fixed (``None``: searched)."""

    p: int | None = None
    R: int | None = None
    n_microbatches: int | None = None
    schedule: Schedule | None = None
    recompute: str = "auto"
    groups: list[list[int]] | None = None
    order: str | None = None
    zero: int = 0  # ZeRO stage over the replicas (transform/replicate.py), not searched


@dataclass
class Outcome:
    best: Trial | None
    tried: list[dict] = field(default_factory=list)
    moves: int = 0
    model_shapes: int = 0


def device_rank(seq: LayerSequence, cluster: Cluster) -> list[int]:
    """Devices fastest first (the whole step's time on the device's class),
    then largest memory, then index."""
    t = seq.times(1.0)
    total = [t.fwd[c][-1] + t.bwd[c][-1] + t.once[c][-1] for c in range(len(seq.class_keys))]
    return sorted(range(cluster.k), key=lambda d: (total[seq.class_of[d]], -cluster.devices[d].memory, d))


def shapes(seq: LayerSequence, cluster: Cluster, batch: int, fixed: Fixed,
           why: list[str] | None = None) -> list[Shape]:
    """Every shape of the search (module docstring) that *fixed* allows;
    *why* (a list) gets ``(rank, line)`` for each kind of shape left out
    and why (the contradiction to name when none is left): rank 0 for a
    contradiction, 1 where only the search's own range (micro-batch counts
    larger than the batch allows) ran out."""
    out = []
    why = [] if why is None else why

    def skip(reason: str, rank: int = 0) -> None:
        if (rank, reason) not in why:
            why.append((rank, reason))

    k = cluster.k
    ranked = device_rank(seq, cluster)
    if fixed.groups is not None:
        layouts = [(len(dict.fromkeys(map(tuple, fixed.groups))), len(fixed.groups[0]),
                    [tuple(g) for g in fixed.groups])]
    else:
        layouts = []
        for p in range(1, k + 1):
            if k % p or (fixed.p is not None and p != fixed.p):
                continue
            R = k // p
            if fixed.R is not None and R != fixed.R:
                continue
            fwd = [tuple(ranked[s * R:(s + 1) * R]) for s in range(p)]
            layouts.append((p, R, fwd))
            if p > 1 and len(set(seq.class_of)) > 1:
                layouts.append((p, R, fwd[::-1]))
    for p, R, groups in layouts:
        mixed = len({seq.class_of[d] for d in groups[0]}) > 1
        for m in (SEARCHED_MICROBATCHES if fixed.n_microbatches is None else (fixed.n_microbatches,)):
            searched = int(fixed.n_microbatches is None)
            if m * R > batch:
                skip(f"{m} micro-batches x {R} replicas need at least {m * R} samples, the batch has {batch}",
                     searched)
                continue
            if R > 1 and batch % m:
                skip(f"the batch of {batch} does not split into {m} micro-batches of whole samples", searched)
                continue
            b = batch // m  # samples per micro-batch, split over the R replicas
            share_sets: list[tuple | None] = [None] if R == 1 or b % R == 0 else []
            if not share_sets and not (mixed and p == 1):
                skip(f"a micro-batch of {b} samples does not split into {R} equal replica shares of whole samples "
                     f"(batch {batch} over {m} micro-batch{'es' * (m > 1)}; data-parallel takes unequal shares)")
            if R > 1 and mixed and p == 1:
                t = seq.times(1.0)
                speed = [1.0 / max(1e-30, t.fwd[seq.class_of[d]][-1] + t.bwd[seq.class_of[d]][-1]) for d in groups[0]]
                share_sets.insert(0, tuple(x / b for x in whole_samples(b, R, speed)))
            for schedule in SCHEDULES.values():
                if (fixed.schedule is not None and schedule != fixed.schedule) or \
                        (p == 1 and schedule != ONE_F_ONE_B and fixed.schedule is None):
                    continue
                for v in (CHUNKS if schedule.chunked else (1,)):
                    refusal = schedule.refusal(p, m, v)
                    if refusal or p * v > seq.n:
                        skip(refusal or f"{p * v} stages need at least as many forward layers; graph has {seq.n}")
                        continue
                    for shares in share_sets:
                        for bucket in ((DEFAULT_BUCKET_MB, 0.0) if p == 1 and R > 1 else (0.0,)):
                            out.append(Shape(tuple(groups) * v, m, schedule, fixed.recompute, shares, bucket))
    return out


class PipelineSearch:
    """One run of the search (module docstring)."""

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, batch: int, fixed: Fixed, budget: Budget,
                 assume_batch: int | None = None, log: Callable[[str], None] | None = None, beat_s: float = 0.0):
        self.graph, self.cluster, self.costs, self.batch = graph, cluster, costs, batch
        self.beat_s = beat_s
        self.fixed, self.budget, self.assume = fixed, budget, assume_batch
        self.log = log or (lambda msg: None)
        self.size = max(1, graph.n + graph.m)
        self._derived: dict[tuple, Derived] = {}
        self.tried: list[dict] = []
        self.why: list[tuple[int, str]] = []  # why shapes were left out (:func:`shapes`)
        self.shape_count = 0
        self.best: Trial | None = None  # the best simulated plan so far (the registry's answer at the cap)
        self.moved = 0
        self.shapes = 0

    def outcome(self) -> Outcome:
        """The search's state as its answer (also when the cap stops it)."""
        return Outcome(self.best, self.tried, self.moved, self.shapes)

    # ------------------------------------------------------------- model
    def ranked(self) -> list[tuple[Plan, LayerSequence]]:
        plans = []
        seq = None
        for name in ((self.fixed.order,) if self.fixed.order else ORDERS):
            if plans and self.budget.out_of_time():  # the clock ends the model's phase (said: clock_cut)
                break
            seq = LayerSequence(self.graph, self.cluster, self.costs, order=name, share=seq)
            model = Model(seq, self.cluster, self.batch)
            for shape in shapes(seq, self.cluster, self.batch, self.fixed, self.why):
                self.shape_count += 1
                plan = model.cut(shape)
                if plan is not None:
                    plans.append((plan, seq))
        plans.sort(key=lambda x: (x[0].key, x[0].shape.S, x[0].shape.n_microbatches))
        first: dict[tuple, int] = {}
        for i, (plan, _) in enumerate(plans):
            first.setdefault((plan.shape.p, plan.shape.R), i)
        lead = sorted(first.values())
        return [plans[i] for i in lead] + [x for i, x in enumerate(plans) if i not in set(lead)]

    # ------------------------------------------------------------- judge
    def _stage_of(self, seq: LayerSequence, cuts: list[int]) -> list[int]:
        return stages_from_cuts(self.graph, seq.fwd, cuts)

    def _recompute(self, seq: LayerSequence, stage_of: list[int], rc: list[bool]) -> list[str]:
        want = [self.graph.ids[v] for v in seq.fwd if rc[stage_of[v]]]
        return recomputable(self.graph, stage_of, want) if want else []

    def derive(self, plan: Plan, stage_of: list[int], seq: LayerSequence) -> Derived | None:
        shape = plan.shape
        ids = self._recompute(seq, stage_of, plan.rc)
        # one recompute step per stage: the derived graph depends on the stage of each recomputed node
        key = (shape.n_microbatches, tuple(len(g) for g in shape.groups), shape.shares, shape.bucket_mb,
               tuple((x, stage_of[self.graph.index[x]]) for x in ids))
        if key in self._derived:
            self._derived[key] = self._derived.pop(key)  # most recently used last
        else:
            guess = self._weight_guess(shape)
            first = not self.tried  # the first plan is built whatever its clock says (the registry's cap holds)
            if self.budget.over_count(guess * (1 + BUILD_COST)) or \
                    (not first and not self.budget.affordable(BUILD_COST * guess)):
                return None
            self.budget.charge(BUILD_COST * guess)
            d = derive_pipeline(self.graph, stage_of, [len(g) for g in shape.groups], shape.n_microbatches, shape.schedule,
                                shape.v, recompute=ids, assume_batch=self.assume, shares=shape.shares,
                                bucket_mb=shape.bucket_mb, symmetric=judged_by_kind(self.cluster),
                                zero=self.fixed.zero)
            self._derived[key] = d
            while len(self._derived) > KEEP_DERIVED:  # derived graphs are large
                self._derived.pop(next(iter(self._derived)))
        return self._derived[key]

    def _weight_guess(self, shape: Shape) -> float:
        # one replica of each kind is built (sim/symmetric.py: at most two kinds of replicas)
        return shape.n_microbatches * min(shape.R, 2) * 1.1

    def judge(self, plan: Plan, seq: LayerSequence) -> Trial | None:
        try:
            stage_of = self._stage_of(seq, plan.cuts)
            d = self.derive(plan, stage_of, seq)
            if d is None:
                return None
            device_of, order = layout(d, stage_of, [list(g) for g in plan.shape.groups], plan.shape.schedule,
                                      self.cluster.k)
        except PlacerError as exc:
            self.log(f"pipeline: {describe_shape(plan.shape, self.cluster)} skipped: {exc}")
            return None
        weight = (d.graph.n + d.graph.m) / self.size
        ev = Evaluator(d.graph, self.cluster, self.costs.for_graph(d.graph), budget=self.budget, weight=weight)
        res = ev.evaluate(device_of, order, clock=bool(self.tried))
        if res is None:
            return None
        trial = Trial(plan, seq, d, device_of, order, res[0], stage_of)
        self.tried.append({"plan": describe_shape(plan.shape, self.cluster), "order": seq.order_name,
                           "model_s": plan.time_s, "makespan_s": res[0].makespan,
                           "status": "FEASIBLE" if res[0].feasible else "OOM"})
        self.log(f"pipeline: {self.tried[-1]['plan']} ({seq.order_name}): model {plan.time_s:.4g} s, simulated "
                 f"{res[0].makespan:.4g} s{'' if res[0].feasible else ' OOM'}")
        return trial

    # ------------------------------------------------------------- moves
    def moves(self, best: Trial) -> tuple[Trial, int]:
        """Hill-climb the cuts of *best* (module docstring)."""
        seq, shape = best.seq, best.plan.shape
        model = Model(seq, self.cluster, self.batch)
        count = 0
        improved = True
        while improved and not self.budget.exhausted():
            improved = False
            cuts = best.plan.cuts
            for j in range(1, len(cuts)):
                span = (cuts[j + 1] if j + 1 < len(cuts) else seq.n) - cuts[j - 1]
                for delta in sorted({max(1, span // 16), max(1, span // 64), 1}, reverse=True):
                    for sign in (1, -1):
                        new = list(cuts)
                        new[j] += sign * delta
                        if not (new[j - 1] < new[j] < (new[j + 1] if j + 1 < len(new) else seq.n)):
                            continue
                        plan = model.evaluate(shape, new, best.plan.rc)
                        trial = self.judge(plan, seq)
                        if trial is None:
                            if self.budget.exhausted():
                                return best, count
                            continue
                        count += 1
                        self.moved = count
                        if trial.score.better(best.score):
                            best = self.best = trial
                            improved = True
                            break
                    if improved:
                        break
                if improved:
                    break
        return best, count

    def nothing_to_judge(self) -> str:
        """Why the model left no plan to judge, in one line: the parameters
        that contradict each other or the graph (no shape at all), or
        memory (every shape puts a stage over its device's memory)."""
        where = f"graph '{self.graph.name}' on cluster '{self.cluster.name}'"
        if not self.shape_count:
            first = min((rank for rank, _ in self.why), default=0)
            lines = [line for rank, line in self.why if rank == first]
            return f"pipeline: no plan of {where} keeps the parameters: {'; '.join(lines[:2])}"
        most = max(d.memory for d in self.cluster.devices) / 2**30
        how = ("without recomputation (-p recompute=off); allow it (-p recompute=auto) or use more devices"
               if self.fixed.recompute == "off" else "even with activation recomputation; use more devices or "
               "devices with more memory")
        return (f"pipeline: no plan of {where} fits memory: in each of the {self.shape_count} shapes tried a stage "
                f"needs more than its device's memory (at most {most:.3g} GiB) {how}")

    def run(self) -> Outcome:
        self.budget.charge(MODEL_COST)
        ranked = self.ranked()
        if not ranked:
            raise InvalidInput(self.nothing_to_judge())
        self.shapes = len(ranked)
        if self.beat_s > 0:
            fits = [plan.time_s for plan, _ in ranked if plan.fits]
            if not fits or min(fits) > self.beat_s * (1 + BEAT_MARGIN):
                best = f"its best {min(fits):.4g} s" if fits else "no plan fits memory"
                raise InvalidInput(f"pipeline gave up: its model predicts no plan within {100 * BEAT_MARGIN:g} % of "
                                   f"{self.beat_s:.4g} s ({best}); nothing was built")
        best: Trial | None = None
        for plan, seq in ranked:
            if (best is not None and self.budget.exhausted()) or \
                    (best is not None and self.budget.spent > JUDGE_SHARE * self.budget.limit):
                break
            if best is not None and best.score.feasible and not plan.fits:
                continue
            trial = self.judge(plan, seq)
            if trial is not None and (best is None or trial.score.better(best.score)):
                best = self.best = trial
        if best is not None:
            self.best, self.moved = self.moves(best)
        return self.outcome()


def shape_fields(shape: Shape, cluster: Cluster, rc: list[bool] | None = None) -> dict:
    """The estimate fields of a plan of *shape*
    (:data:`~celeritas_cli.sim.describe.PIPELINE_FIELDS`)."""
    out = {"schedule": shape.schedule.name, "stages": shape.S, "pipeline_devices": shape.p,
           "virtual_stages": shape.v, "replicas": [len(g) for g in shape.groups], "microbatches": shape.n_microbatches,
           "stage_devices": [[cluster.ids[x] for x in g] for g in shape.groups],
           "recomputed_stages": [j for j, r in enumerate(rc or []) if r]}
    if shape.shares is not None:
        out["shares_by_speed"] = True
    if shape.p == 1 and shape.R > 1:
        out["bucket_mb"] = shape.bucket_mb
    return out


def describe_shape(shape: Shape, cluster: Cluster, rc: list[bool] | None = None) -> str:
    """A plan of *shape* in words (:func:`~celeritas_cli.sim.describe.pipeline_words`).

    >>> from celeritas_cli.model.cluster import uniform
    >>> describe_shape(Shape(((0,), (1,)), 8, ONE_F_ONE_B), uniform(2), [False, False])
    '2-stage 1F1B, 8 micro-batches, stages 2xV100, recompute off'
    """
    return pipeline_words(shape_fields(shape, cluster, rc), lambda d: cluster.devices[cluster.index[d]].type) or ""


def parse_groups(text: str, cluster: Cluster) -> list[list[int]] | None:
    """``"A,B|C,D"``: the devices of each stage, ``|`` between stages and
    ``,`` between a stage's replicas; empty = search.

    >>> from celeritas_cli.model.cluster import uniform
    >>> parse_groups("gpu0,gpu1|gpu2,gpu3", uniform(4)), parse_groups("", uniform(4))
    ([[0, 1], [2, 3]], None)
    """
    text = text.strip()
    if not text or text == "auto":
        return None
    out = []
    for part in text.split("|"):
        ids = [x.strip() for x in part.split(",") if x.strip()]
        if not ids:
            raise InvalidInput(f"'pipeline' parameter groups: stage {len(out)} has no device in {text!r}")
        for did in ids:
            if did not in cluster.index:
                raise InvalidInput(f"'pipeline' parameter groups: unknown device '{did}' (cluster '{cluster.name}' "
                                   f"has {', '.join(cluster.ids)})")
        out.append([cluster.index[x] for x in ids])
    if len({len(g) for g in out}) != 1:
        raise InvalidInput(f"'pipeline' parameter groups: every stage needs the same number of devices, got {text!r}")
    flat = [d for g in out for d in g]
    if len(set(flat)) != len(flat):
        raise InvalidInput(f"'pipeline' parameter groups: a device is in two stages in {text!r}")
    return out


def estimate_of(out: Outcome, cluster: Cluster, budget: Budget) -> dict:
    """The placement's ``estimate`` (without the judge's numbers)."""
    best = out.best
    assert best is not None
    return {"plan": describe_shape(best.plan.shape, cluster, best.plan.rc), "order": best.seq.order_name,
            "model_makespan_s": best.plan.time_s, "model_memory_bytes": best.plan.memory,
            "shapes": out.model_shapes, "simulated": len(out.tried), "boundary_moves": out.moves,
            "evaluations": budget.used, "evaluation_budget": budget.limit,
            "evaluations_spent": round(budget.spent, 3), "clock_cut": budget.clock_cut,
            "candidates": out.tried[:16]}


def default_budget(graph: Graph, time_limit: float, evaluations: int, deadline: float | None) -> Budget:
    """*evaluations*, or (0) what fits :data:`FIT_SHARE` of *time_limit*
    (:func:`~celeritas_cli.optimize.search.default_evaluations`), so the
    default run is not cut by the clock and its output is repeatable."""
    from ...optimize.search import DEFAULT_TIME_LIMIT, default_evaluations

    limit = evaluations if evaluations > 0 else \
        default_evaluations(graph, FIT_SHARE * (time_limit or DEFAULT_TIME_LIMIT))
    return Budget(limit, deadline)


def fits_text(score: Score) -> str:
    return "FEASIBLE" if score.feasible else "OOM"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else math.inf
