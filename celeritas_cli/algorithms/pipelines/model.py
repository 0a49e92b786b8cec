"""The cost model and the stage cutter of placer's ``pipeline`` planner.

A *shape* fixes everything but the cuts: the devices of each (virtual)
stage and its lanes (``R`` replicas of the whole pipeline), ``m``
micro-batches per replica, the schedule and whether recomputation may be
used.  :func:`cut` chooses the cuts of a
:class:`~celeritas_cli.pipelining.layers.LayerSequence` for a shape, and
:func:`evaluate` predicts the step time and the memory of each device.

Step time (per replica pipeline): the schedule replayed on the stages'
times (:func:`schedule_time`) - each rank runs its steps (Megatron-LM's
orders, :meth:`~celeritas_cli.pipelining.schedules.Schedule.steps`)
one after the other, a forward when the previous stage's activation has
arrived over the link, a backward when the next stage's gradient has -
then each rank's once-per-step work (optimizer updates) and the
all-reduce of its stages' gradients over their ``R`` lanes (the NCCL
formula of model/collectives.py, per gradient or bucket).  A stage's time per micro-batch is its forward, and its
backward with the recomputed forward and the gradient accumulation, on its
device at the micro-batch's size (the split cost model).  For equal stages
and free links it is Alpa's objective ``sum_i t_i + (m - 1) max_j t_j``
(Zheng et al., OSDI'22, 5.2, Eq. 2) and Megatron-LM's bubble ``(p - 1) /
(v m)`` (Narayanan et al., SC'21, 2.2); unlike the formulas it also sees
unequal forward and backward times, warm-up, and traffic.

Memory (the time rule; :meth:`~celeritas_cli.pipelining.layers.LayerSequence.memory`):
a device holds its stages' resident state and gradient buffer and the
activations of the micro-batches in flight under the schedule (GPipe:
``m``; 1F1B: ``min(p - r, m)``;
:meth:`~celeritas_cli.pipelining.schedules.Schedule.in_flight`), with
recomputation (Chen et al. 2016; SC'21, 3.5) only the stage's input per
micro-batch plus one micro-batch's activations.

Cuts (:func:`cut`): bisection on the largest stage time ``T`` with a greedy
test - each stage in turn takes the most positions whose time is at most
``T`` and whose memory fits its device, with recomputation where only that
fits (``recompute="auto"``), leaving one position per remaining stage; the
test is exact for contiguous cuts (time and memory only grow with a stage),
so the bisection finds the least ``T`` any cut can meet.  Then, as Alpa
enumerates ``t_max`` (Algorithm 1), slightly larger ``T`` are tried too
(on mixed devices a larger ``T`` moves work to the first, faster stages
and can lower the sum) and the cut of the least ``T`` in the model wins.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from ...model.cluster import Cluster
from ...pipelining.schedules import Schedule
from ...pipelining.layers import LayerSequence
from ...transform.split_cost import COPY_BANDWIDTH_BPS

#: ``T`` above the least feasible one tried as Alpa's larger ``t_max`` (relative)
T_MAX_STEPS = (0.0, 0.02, 0.05, 0.1)
#: the model calls a device full above this share of its memory (the model is an estimate)
MEMORY_MARGIN = 0.96


@dataclass(frozen=True)
class Shape:
    """What :func:`cut` keeps fixed: ``groups[j]`` the devices (lanes) of
    virtual stage ``j`` (``p`` ranks, ``v`` chunks each), ``n_microbatches``
    (``m``) per replica pipeline, the ``schedule``, ``recompute`` (``off``, ``auto``:
    where only that fits, ``on``: every stage) and the replicas' batch
    ``shares`` (None: equal) and DDP's gradient ``bucket_mb`` (one stage
    only; 0: a ring per gradient)."""

    groups: tuple
    n_microbatches: int
    schedule: Schedule
    recompute: str = "auto"
    shares: tuple | None = None
    bucket_mb: float = 0.0

    @property
    def S(self) -> int:
        return len(self.groups)

    @property
    def R(self) -> int:
        return len(self.groups[0])

    @property
    def p(self) -> int:
        return len(dict.fromkeys(self.groups))

    @property
    def v(self) -> int:
        return self.S // self.p


@dataclass
class Plan:
    """A shape with its cuts (first position of each virtual stage), the
    stages that recompute, and the model's prediction."""

    shape: Shape
    cuts: list[int]
    rc: list[bool]
    time_s: float = math.inf
    memory: list[int] = field(default_factory=list)  # per rank (its first lane's device)
    capacity: list[int] = field(default_factory=list)
    stage_time: list[float] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(x <= MEMORY_MARGIN * c for x, c in zip(self.memory, self.capacity))

    @property
    def key(self) -> tuple:
        return (not self.fits, self.time_s)


class Model:
    """:func:`evaluate` and :func:`cut` for one layer sequence, with the
    quantities they share cached."""

    def __init__(self, seq: LayerSequence, cluster: Cluster, batch: int):
        self.seq, self.cluster, self.batch = seq, cluster, batch
        cnt = [0] * seq.n
        for v in range(seq.graph.n):
            if not seq.once[v] and seq.gradients[seq.att[v] + 1] > seq.gradients[seq.att[v]]:
                cnt[seq.att[v]] += 1
        self.grad_count = [0]
        for x in cnt:
            self.grad_count.append(self.grad_count[-1] + x)
        self._flight: dict[tuple, int] = {}
        self._classes: dict[tuple, list[int]] = {}

    # ------------------------------------------------------------ pieces
    def fraction(self, shape: Shape) -> float:
        """The batch fraction of one micro-batch of one replica (uneven
        shares are timed at the even share: the shares follow the devices'
        speeds, so each replica takes about as long)."""
        return 1.0 / (shape.R * shape.n_microbatches)

    def link(self, nbytes: float, a: int, b: int, tensors: int = 1) -> float:
        """*tensors* transfers of *nbytes* in all from device *a* to *b*
        (one latency each)."""
        if a == b or nbytes <= 0:
            return 0.0
        return self.seq.costs.link_time(nbytes, a, b) + (max(1, tensors) - 1) * self.cluster.latency[a][b]

    def stage_time(self, shape: Shape, j: int, a: int, b: int, rc: bool) -> float:
        """One micro-batch (forward + backward) of positions ``a .. b-1`` on
        stage *j*'s slowest lane (:meth:`stage_passes`)."""
        fw, bw, _ = self.stage_passes(shape, j, a, b, rc)
        return fw + bw

    def stage_passes(self, shape: Shape, j: int, a: int, b: int, rc: bool) -> tuple[float, float, float]:
        """``(forward, backward, weight gradients)`` of one micro-batch of
        positions ``a .. b-1`` on stage *j*'s slowest lane (a lane with an
        uneven batch share: its class's time at the even share, scaled by
        its share); the backward includes the recomputed forward and the
        gradient accumulation (``3 G`` bytes at :data:`COPY_BANDWIDTH_BPS`,
        scaled by the device's speed), which with the weight-gradient nodes
        the previous stage does not wait for (a step's nodes run by upward
        rank, the input gradient first)."""
        t = self.seq.times(self.fraction(shape))
        lanes = shape.groups[j]
        classes = self._classes.get(lanes)
        if classes is None:
            classes = self._classes[lanes] = [self.seq.class_of[x] for x in lanes]
        worst = (0.0, 0.0, 0.0)
        for i, d in enumerate(classes):
            fw, bw, _ = t.stage(d, a, b)
            wg = t.weight_gradients(d, a, b)
            bw += fw if rc else 0.0
            if shape.n_microbatches > 1:
                speed = self.cluster.devices[self.seq.class_device[d]].speed
                acc = 3.0 * (self.seq.gradients[b] - self.seq.gradients[a]) / COPY_BANDWIDTH_BPS / speed
                bw, wg = bw + acc, wg + acc
            if shape.shares is not None:
                x = shape.shares[i] * shape.R
                fw, bw, wg = fw * x, bw * x, wg * x
            if fw + bw > worst[0] + worst[1]:
                worst = (fw, bw, wg)
        return worst

    def flight(self, shape: Shape, j: int) -> int:
        """Micro-batches of virtual stage *j* in flight on its device."""
        p, v = shape.p, shape.v
        key = (shape.schedule.name, p, shape.n_microbatches, j % p, v)
        if key not in self._flight:
            self._flight[key] = math.ceil(shape.schedule.in_flight(p, shape.n_microbatches, j % p, v) / v)
        return self._flight[key]

    def stage_memory(self, shape: Shape, j: int, a: int, b: int, rc: bool) -> int:
        f = self.fraction(shape) if shape.shares is None else max(shape.shares) / shape.n_microbatches
        return self.seq.memory(a, b, f, self.flight(shape, j), rc)

    def capacity(self, shape: Shape, j: int) -> int:
        return min(self.cluster.devices[d].memory for d in shape.groups[j]) // shape.v

    def rings(self, shape: Shape, a: int, b: int) -> int:
        """All-reduce rings of positions ``a .. b-1``: one per gradient, or per bucket."""
        n = self.grad_count[b] - self.grad_count[a]
        if shape.bucket_mb:
            n = min(n, math.ceil((self.seq.gradients[b] - self.seq.gradients[a]) / (shape.bucket_mb * 2**20)))
        return n

    def allreduce(self, shape: Shape, a: int, b: int, lanes) -> float:
        """The all-reduces of the gradients of positions ``a .. b-1`` over
        the *lanes*: one per gradient or bucket, each the NCCL formula the
        simulator uses (:meth:`~celeritas_cli.model.costs.CostModel.collective_time`,
        :mod:`~celeritas_cli.model.collectives`) for an equal share of the
        bytes."""
        R = len(lanes)
        if R < 2:
            return 0.0
        g = self.seq.gradients[b] - self.seq.gradients[a]
        n = self.rings(shape, a, b)
        if n < 1 or g <= 0:
            return 0.0
        return n * self.seq.costs.collective_time(sorted(lanes), "all-reduce", int(math.ceil(g / n)))

    # ------------------------------------------------------------ evaluate
    def evaluate(self, shape: Shape, cuts: list[int], rc: list[bool]) -> Plan:
        """The model's step time and memory of *shape* cut at *cuts*: the
        schedule replayed on the stages' times (:func:`schedule_time`),
        then each rank's once-per-step work and all-reduces."""
        seq, S, p = self.seq, shape.S, shape.p
        f = self.fraction(shape)
        ends = cuts[1:] + [seq.n]
        passes = [self.stage_passes(shape, j, a, b, rc[j]) for j, (a, b) in enumerate(zip(cuts, ends))]
        xf, xb, tails, heads = [], [], [0.0] * p, [0.0] * p
        tt = seq.times(f)
        for j, (a, b) in enumerate(zip(cuts, ends)):
            lane = shape.groups[j][0]
            if j + 1 < S:
                nxt = shape.groups[j + 1][0]
                xf.append(self.link(math.ceil(f * seq.cross_fwd[b]), lane, nxt, seq.count_fwd[b]))
                xb.append(self.link(math.ceil(f * seq.cross_bwd[b]), nxt, lane, seq.count_bwd[b]))
            head = max(tt.head_time(seq.class_of[d], a, b) for d in shape.groups[j])
            once = max(tt.stage(seq.class_of[d], a, b)[2] for d in shape.groups[j]) - head
            heads[j % p] += head
            ring = self.allreduce(shape, a, b, shape.groups[j])
            if S == 1 and shape.n_microbatches == 1:  # no order: the rings run beside the backward, but for the last one
                ring = max(ring - passes[j][1], ring / max(1, self.rings(shape, a, b)))
            tails[j % p] += once + ring
        ends_at = schedule_time(shape.schedule, p, shape.v, shape.n_microbatches, [x[0] for x in passes],
                                [x[1] for x in passes], xf, xb, [x[2] for x in passes], heads)
        step = max(e + t for e, t in zip(ends_at, tails))
        mem, cap = [], []
        for r in range(p):
            chunks = range(r, S, p)
            mem.append(sum(self.stage_memory(shape, j, cuts[j], ends[j], rc[j]) for j in chunks))
            cap.append(min(self.cluster.devices[d].memory for d in shape.groups[r]))
        return Plan(shape, list(cuts), list(rc), step, mem, cap, [x[0] + x[1] for x in passes])

    # ------------------------------------------------------------------ cut
    def _greedy(self, shape: Shape, T: float) -> tuple[list[int], list[bool]] | None:
        seq, S = self.seq, shape.S
        cuts, rcs, a = [], [], 0
        modes = {"off": (False,), "on": (True,), "auto": (False, True)}[shape.recompute]
        for j in range(S):
            last = j == S - 1
            hi = seq.n if last else seq.n - (S - 1 - j)
            best_b, best_rc = a, False
            cap = MEMORY_MARGIN * self.capacity(shape, j)
            for rc in modes:
                if last:
                    b = hi if (self.stage_time(shape, j, a, hi, rc) <= T
                               and self.stage_memory(shape, j, a, hi, rc) <= cap) else a
                else:
                    b = self._largest(lambda e: self.stage_time(shape, j, a, e, rc) <= T
                                      and self.stage_memory(shape, j, a, e, rc) <= cap, a, hi)
                if b > best_b:
                    best_b, best_rc = b, rc
            if best_b <= a:
                return None
            cuts.append(a)
            rcs.append(best_rc)
            a = best_b
        return cuts, rcs

    @staticmethod
    def _largest(ok, a: int, hi: int) -> int:
        """The largest ``b`` in ``a+1 .. hi`` with ``ok(b)`` (monotone: true
        up to some ``b``), or *a*."""
        lo, top = a, hi
        while lo < top:
            mid = (lo + top + 1) // 2
            if ok(mid):
                lo = mid
            else:
                top = mid - 1
        return lo

    def cut(self, shape: Shape) -> Plan | None:
        """The cut of *shape* of least model time (module docstring), or
        None when no cut fits memory (or there are fewer positions than
        stages)."""
        seq = self.seq
        if shape.S > seq.n:
            return None
        hi = max(self.stage_time(shape, j, 0, seq.n, True) for j in range(shape.S))
        if self._greedy(shape, hi) is None:
            return None
        lo = 0.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if self._greedy(shape, mid) is None:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-4 * hi:
                break
        best = None
        for step in T_MAX_STEPS:
            got = self._greedy(shape, hi * (1 + step))
            if got is None:
                continue
            plan = self.evaluate(shape, *got)
            if best is None or plan.key < best.key:
                best = plan
        return best


def schedule_time(schedule: Schedule, p: int, v: int, m: int, fwd: list[float], bwd: list[float], xf: list[float],
                  xb: list[float], wgrad: list[float] | None = None, start: list[float] | None = None) -> list[float]:
    """When each of the *p* ranks finishes its last step of *schedule*
    (:meth:`~celeritas_cli.pipelining.schedules.Schedule.steps`),
    virtual stage ``j`` taking ``fwd[j]`` / ``bwd[j]`` per micro-batch on
    its rank, ``xf[j]`` / ``xb[j]`` to send a micro-batch's activation /
    gradient between stages ``j`` and ``j + 1`` (one transfer at a time per
    link direction, in micro-batch order, as the simulator's channels), the
    last ``wgrad[j]`` of
    a backward computing weight gradients only (its input gradient is sent
    before them), rank ``r`` free from ``start[r]`` on (its once-per-step
    forward work): the schedule replayed
    step by step (a rank runs its steps in order, each when its input has
    arrived), so warm-up, bubbles and uneven stages count as in the
    simulator, without building the graph.

    >>> from celeritas_cli.pipelining.schedules import ONE_F_ONE_B
    >>> schedule_time(ONE_F_ONE_B, 3, 1, 4, [1.0] * 3, [2.0] * 3, [0.0] * 2, [0.0] * 2)  # (m + p - 1) x 3
    [18.0, 16.0, 14.0]
    """
    S = p * v
    steps = [schedule.steps(p, m, r, v) for r in range(p)]
    done_f = [[None] * m for _ in range(S)]
    done_b = [[None] * m for _ in range(S)]  # when stage j's input gradient of micro-batch i is ready
    wgrad = wgrad or [0.0] * S
    arrive_f = [[None] * m for _ in range(S)]  # when micro-batch i's activation from stage j has arrived
    arrive_b = [[None] * m for _ in range(S)]  # when its gradient from stage j + 1 has arrived at stage j
    last_f, last_b = [0.0] * S, [0.0] * S  # one transfer at a time per link direction, in micro-batch order

    def sent(arrive, last, ready, j, i, x):
        if arrive[j][i] is None:
            arrive[j][i] = max(ready, last[j]) + x
            last[j] = arrive[j][i]
        return arrive[j][i]
    free = list(start) if start is not None else [0.0] * p
    at = [0] * p
    left = sum(len(x) for x in steps)
    while left:
        moved = False
        for r in range(p):
            while at[r] < len(steps[r]):
                kind, chunk, i = steps[r][at[r]]
                j = chunk * p + r
                if kind == "F":
                    dep = 0.0 if j == 0 else (None if done_f[j - 1][i] is None else
                                              sent(arrive_f, last_f, done_f[j - 1][i], j - 1, i, xf[j - 1]))
                else:
                    dep = done_f[j][i] if j == S - 1 else \
                        (None if done_b[j + 1][i] is None else sent(arrive_b, last_b, done_b[j + 1][i], j, i, xb[j]))
                if dep is None:
                    break
                start = max(free[r], dep)
                free[r] = start + (fwd[j] if kind == "F" else bwd[j])
                if kind == "F":
                    done_f[j][i] = free[r]
                else:
                    done_b[j][i] = free[r] - wgrad[j]
                at[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise AssertionError(f"schedule {schedule.name} deadlocks (p={p}, v={v}, m={m})")
    return free


def fixed_cuts_plan(model: Model, shape: Shape, cuts: list[int], rc: list[bool] | None = None) -> Plan:
    """:meth:`Model.evaluate` of given cuts (recomputation per stage as the
    shape says, or where only it fits for ``auto``)."""
    if rc is None:
        ends = cuts[1:] + [model.seq.n]
        rc = []
        for j, (a, b) in enumerate(zip(cuts, ends)):
            want = shape.recompute == "on" or (shape.recompute == "auto" and model.stage_memory(
                shape, j, a, b, False) > MEMORY_MARGIN * model.capacity(shape, j))
            rc.append(want)
    return model.evaluate(shape, list(cuts), rc)


def positions_to_cuts(bounds: list[int], layer_cuts: list[int]) -> list[int]:
    """Layer cuts (first layer of each stage) as position cuts.

    >>> positions_to_cuts([0, 3, 5, 9], [0, 2])
    [0, 5]
    """
    return [bounds[c] for c in layer_cuts]


def cut_at(bounds: list[int], position: int) -> int:
    """The layer a position is in.

    >>> cut_at([0, 3, 5, 9], 4)
    1
    """
    return bisect.bisect_right(bounds, position) - 1
