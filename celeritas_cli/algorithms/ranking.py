"""``auto``'s cheap estimates of its whole-step members, to rank them before
any is built (issue 33.3).

The members that plan the whole training step - ``data-parallel``,
``fsdp`` and ``pipeline`` - each build and simulate a derived graph of
``k`` times the input's size or more, so the counted budget pays for few of
them; which ones it pays for must not depend on their place in a fixed
list (on GPT 1.3B over 8xA100-nvswitch the fixed order spent the
data-parallel share on ``data-parallel`` and left out ``fsdp``, 10 %
faster).  :class:`Ranking` predicts each one's step time from the models
placer already has, without building anything:

* ``data-parallel`` (equal or speed-proportional shares, 25 MiB buckets):
  one replica's forward and backward at its share of the batch on its
  device (the pipeline model's single-stage shape,
  :class:`~.pipelines.model.Model`), the all-reduce of the gradients in
  buckets (the NCCL formula of :mod:`~celeritas_cli.model.collectives`,
  which the simulator uses too) beyond what the backward hides (at
  least the last bucket's), then the once-per-step work (optimizer
  updates) in full; ``inf`` when a replica's memory at its share (the
  layer sequence's) is over its device's;
* ``fsdp`` (ZeRO stage 3): the same replica's forward and backward, the
  once-per-step work on a ``1/k`` shard, and the collectives of its units
  (:func:`~celeritas_cli.transform.fsdp_units.fsdp_plan`): each unit's
  parameters all-gathered before its forward and again before its backward
  and its gradients reduce-scattered, each by the NCCL formula (ZeRO 7.2:
  ``3 Psi`` per device against data
  parallelism's ``2 Psi``; the gradients all-reduced are the same units'
  gradient tensors in both); FSDP's prefetch overlaps them with the compute
  (FSDP 3.4), so the step is ``max(compute, communication)`` plus the
  first unit's gather and the last unit's reduce-scatter, which nothing
  overlaps; ``inf`` when a replica's ``1/k`` of the state, its activations
  and two gathered units are over its device's memory;
* ``pipeline``: the pipeline model's best cut (:meth:`~.pipelines.model.Model.cut`)
  of one 1F1B shape per pipeline depth ``1 < p <=`` :data:`RANK_DEPTH_MAX`
  dividing ``k`` (``k / p``
  replicas, the micro-batches of the search nearest ``4 p`` the batch
  allows, at least ``4 p`` where it can: Megatron-LM's bubble ``(p - 1) /
  m`` under 25 %), and of data parallelism with gradient accumulation
  (``p = 1``, 4 micro-batches where the batch allows) -
  the plans only the planner makes; its ``p = 1, m = 1`` plan is
  ``data-parallel``'s.  Every depth then has ``4 k`` micro-batches in all,
  so the node times are computed at one batch fraction (the costly part).

* ``3d``: the 3D planner's own estimate of every tensor x pipeline x data
  configuration it searches (:class:`~.pipelines.three_d.Space`: node
  times divided by ``tp`` where the tensor-parallel plan splits them, its
  collectives by the NCCL formula, the pipeline's ``m + (p - 1) / v``
  slots, the gradient all-reduce the last backward does not hide), the
  best that fits.

A plan the model says does not fit memory is estimated ``inf``.  The
estimates are 0.82-1.00 of the simulated step on the zoo (the simulator
sees the rings' and gathers' contention with the compute they overlap) and
0.97-1.10 on synthetic layered graphs, and
:data:`~celeritas_cli.optimize.portfolio.RANK_MARGIN` decides who is near
the best.  No estimate includes a cluster's per-transfer or per-ring-step
costs (``send_s``, ``collective_step_s``; zero in the bundled clusters).

Building the layer sequence and the node times costs about
:data:`~celeritas_cli.optimize.portfolio.RANK_COST` evaluations, which
``auto`` charges to its budget.
"""

from __future__ import annotations

import math

from ..errors import PlacerError
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..optimize.runner import Spec
from ..pipelining.layers import LayerSequence
from ..pipelining.params import SEARCHED_MICROBATCHES
from ..pipelining.schedules import ONE_F_ONE_B
from ..transform.batch import declared_batch, whole_samples
from ..transform.fsdp_units import fsdp_plan
from .pipelines.model import Model, Plan, Shape
from .pipelines.search import device_rank
from .pipelines.three_d import Space
from .sharding.data_parallel import DEFAULT_BUCKET_MB, proportional_shares

#: FSDP's stage inside auto (the fsdp row's default, FULL_SHARD)
FSDP_STAGE = 3
#: the pipeline's shapes are estimated with at least this many micro-batches per pipeline rank
MICRO_PER_RANK = 4
#: the deepest pipeline the ranking estimates: one model cut costs about a second over 1,024 GPUs (GPT
#: 1.3B), and deeper pipelines of the zoo's models estimate slower (at 16, 32, 64 stages 1.8, 5.4, 14 s
#: against 1.4 s at 8 for GPT 1.3B over 1,024 A100s); the planner itself searches every depth
RANK_DEPTH_MAX = 8


def fits(plan: Plan) -> bool:
    """The model's memory of *plan* within the devices' capacity (not the
    planner's own safety margin: the judge decides a near fit)."""
    return all(x <= c for x, c in zip(plan.memory, plan.capacity))


class Ranking:
    """``ranking(spec)``: the estimated step time of ``auto``'s member
    *spec* in seconds (``inf``: the model says it does not fit memory), or
    None for a member without a model (operator placers, members on coarse
    or derived graphs, variants ``auto`` gates on another member's result).
    The layer sequence is built on the first call, once.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> r = Ranking(layered(60, seed=1), uniform(4))
    >>> r(Spec("data-parallel")) > 0, r(Spec("fsdp")) > 0, r(Spec("metis"))
    (True, True, None)
    """

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel | None = None,
                 assume_batch: int | None = None):
        self.graph, self.cluster, self.costs, self.assume = graph, cluster, costs, assume_batch
        self._seq: LayerSequence | None = None
        self._model: Model | None = None
        self._memo: dict[Spec, float | None] = {}
        self._fsdp: list | None = None

    def __call__(self, spec: Spec) -> float | None:
        if spec not in self._memo:
            try:
                self._memo[spec] = self._estimate(spec)
            except PlacerError:  # no batch, no forward pass, a coarse graph: no model (the member says why)
                self._memo[spec] = None
        return self._memo[spec]

    # ------------------------------------------------------------ pieces
    def _estimate(self, spec: Spec) -> float | None:
        params = dict(spec.params)
        if spec.R is not None or spec.on is not None or self.cluster.k < 2 or self.graph.is_coarse:
            return None
        if spec.algo == "data-parallel" and params.get("bucket_mb", DEFAULT_BUCKET_MB) == DEFAULT_BUCKET_MB:
            return self.dp_time(params.get("shares") == "proportional")
        if spec.algo == "fsdp" and not params:
            return self.fsdp_time(False)
        if spec.algo == "fsdp" and params == {"shares": "proportional"}:
            return self.fsdp_time(True)
        if spec.algo == "pipeline" and not params:
            return self.pipeline_time()
        if spec.algo == "3d" and not params:
            return self.three_d_time()
        return None

    @property
    def batch(self) -> int:
        return declared_batch(self.graph, self.assume, what="estimating data parallelism")

    @property
    def model(self) -> Model:
        if self._model is None:
            self._seq = LayerSequence(self.graph, self.cluster, self.costs, order="cpd")
            self._model = Model(self._seq, self.cluster, self.batch)
        return self._model

    def _shares(self, proportional: bool, devs: list[int]) -> tuple | None:
        """The replicas' batch fractions (None: equal), as the members split it."""
        if not proportional:
            return None
        weights = proportional_shares(self.graph, self.model.seq.costs, devs)
        if weights is None:
            return None
        samples = whole_samples(self.batch, len(devs), weights)
        return tuple(s / self.batch for s in samples)

    def _dp_shape(self, proportional: bool) -> Shape:
        devs = list(range(self.cluster.k))
        return Shape((tuple(devs),), 1, ONE_F_ONE_B, "off", self._shares(proportional, devs), DEFAULT_BUCKET_MB)

    def _replica(self, proportional: bool) -> tuple[float, float, float, Shape]:
        """One replica's forward, backward and once-per-step time on the
        slowest device at its share of the batch, and its shape."""
        model, k = self.model, self.cluster.k
        shape = self._dp_shape(proportional)
        fw, bw, _ = model.stage_passes(shape, 0, 0, model.seq.n, False)
        t = model.seq.times(model.fraction(shape))
        once = max(t.stage(model.seq.class_of[d], 0, model.seq.n)[2] for d in range(k))
        return fw, bw, once, shape

    def _units(self):
        if self._fsdp is None:
            self._fsdp = fsdp_plan(self.graph, FSDP_STAGE).units
        return self._fsdp

    def _step(self, kind: str, nbytes: float, steps: int = 1) -> float:
        """One collective of *kind* of *nbytes* over all devices, in *steps*
        equal pieces: the NCCL formula every planner and the simulator use
        (:meth:`~celeritas_cli.model.costs.CostModel.collective_time`)."""
        devs = list(range(self.cluster.k))
        return steps * self.model.seq.costs.collective_time(devs, kind, int(math.ceil(nbytes / steps)))

    def dp_time(self, proportional: bool) -> float:
        """Data parallelism's step (module docstring): forward, backward,
        the all-reduce of the gradients (a reduce-scatter and an all-gather,
        in 25 MiB buckets) beyond what the backward hides (at least the last
        bucket's), then the optimizer update in full."""
        fw, bw, once, shape = self._replica(proportional)
        seq, k = self.model.seq, self.cluster.k
        shares = shape.shares or (1.0 / k,) * k
        if any(seq.memory(0, seq.n, x, 1) > self.cluster.devices[d].memory for d, x in enumerate(shares)):
            return math.inf  # a replica over its device's memory at its share of the batch
        grads = [b for u in self._units() for b in self._grad_sizes(u)]
        total = sum(grads)
        buckets = max(1, min(len(grads), math.ceil(total / (DEFAULT_BUCKET_MB * 2**20))))
        ring = self._step("all-reduce", total, buckets)
        return fw + bw + max(ring - bw, ring / buckets) + once

    def _grad_sizes(self, unit) -> list[int]:
        return [self.graph.tensor_bytes[t] for t in unit.grads]

    def fsdp_time(self, proportional: bool) -> float:
        """FSDP stage 3's step (module docstring); ``inf`` when a replica's
        memory - its ``1/k`` of the state, its activations at its share of
        the batch, two units gathered (the one running and the one
        prefetched, FSDP 3.4) - is over its device's."""
        fw, bw, once, shape = self._replica(proportional)
        compute = fw + bw + once / self.cluster.k
        units = self._units()
        seq, k = self.model.seq, self.cluster.k
        state = seq.resident[seq.n] + seq.gradients[seq.n]
        gathered = 2 * max((u.gather_bytes for u in units), default=0)
        for d, x in enumerate(shape.shares or (1.0 / k,) * k):
            if seq.memory(0, seq.n, x, 1) - state + state / k + gathered > self.cluster.devices[d].memory:
                return math.inf
        if not units:
            return compute
        comm = math.fsum(2 * self._step("all-gather", u.gather_bytes) + self._step("reduce-scatter", u.grad_bytes)
                         for u in units)
        return max(compute, comm) + self._step("all-gather", units[0].gather_bytes) + \
            self._step("reduce-scatter", units[-1].grad_bytes)

    def three_d_time(self) -> float:
        """The 3D planner's best estimate that fits (:class:`~.pipelines.three_d.Space`: tensor x pipeline x
        data parallelism, its own model, the one the planner orders its judgements by); ``inf`` if none."""
        space = Space.of(self.graph, self.cluster, cost_model(self.graph, self.cluster, self.costs), self.batch)
        guesses = [space.estimate(c) for c in space.configs({})]
        return min((q.time_s for q in guesses if q.fits), default=math.inf)

    def pipeline_time(self) -> float:
        """The pipeline planner's plans beyond ``data-parallel``'s (module docstring)."""
        model, k, batch = self.model, self.cluster.k, self.batch
        ranked = device_rank(model.seq, self.cluster)
        best = math.inf
        for p in range(1, min(k, RANK_DEPTH_MAX) + 1):
            if k % p:
                continue
            R = k // p
            allowed = [m for m in SEARCHED_MICROBATCHES if m * R <= batch and not (R > 1 and batch % m) and (p > 1 or m > 1)]
            if not allowed:
                continue
            wanted = MICRO_PER_RANK * p  # R m = 4 k micro-batches in all: one batch fraction for every depth
            m = min(allowed, key=lambda m: (m < wanted, abs(m - wanted)))
            groups = tuple(tuple(ranked[s * R:(s + 1) * R]) for s in range(p))
            plan = model.cut(Shape(groups, m, ONE_F_ONE_B, "auto", None, DEFAULT_BUCKET_MB if p == 1 else 0.0))
            if plan is not None and fits(plan):
                best = min(best, plan.time_s)
        return best
