"""``3d``: placer's 3D planner - data x tensor x pipeline parallelism
(Megatron-LM's PTD-P space) searched together, every candidate it keeps
judged by the simulator as the ``megatron`` row judges a configuration.

Narayanan et al. (SC'21) choose a PTD-P configuration by hand, with the
rules of their section 3 ("Takeaway #1": tensor parallelism up to the GPUs
of a server, pipelines across servers; "#2": then data parallelism;
"#3": the micro-batch size by the model's throughput and memory).  This
planner searches the space those rules span instead of applying them:

* ``tp``: powers of two dividing the GPUs of a server (of the cluster, on a
  cluster without servers) that the graph's heads, hidden size, MLP width
  and vocabulary divide (:func:`~celeritas_cli.transform.tensor_parallel.tp_refusal`);
  with ``tp > 1`` sequence parallelism on (Korthikanti et al. 2022, 4.2.2:
  the same traffic as the all-reduces, activations divided by ``tp``), or
  as ``sequence_parallel`` says;
* ``pp``: the divisors of ``GPUs / tp`` up to the transformer layers (or
  :data:`PP_MAX` without them); ``dp = GPUs / (tp pp)`` dividing the batch;
* the micro-batch size (a divisor of the replica's batch; with a pipeline
  at least ``pp`` micro-batches), the virtual stages (1, 2, 4: interleaved
  1F1B, ``m`` a multiple of ``pp``), the recomputation (none,
  selective, full) and, with ``dp > 1``, Megatron-LM's distributed
  optimizer (ZeRO-1 over the data-parallel replicas: gradients
  reduce-scattered, each replica's updates and optimizer state on ``1/dp``,
  the updated parameters all-gathered; Rajbhandari et al. SC'20 5.1) on a
  cluster of alike GPUs (the ``megatron`` row refuses it elsewhere).

Every configuration is first **estimated** (:class:`Space`, below) without
building anything - the compute of one micro-batch from the graph's own
node times at its batch fraction, each node's work divided by ``tp`` where
the tensor-parallel plan splits it
(:func:`~celeritas_cli.transform.tensor_parallel.plan_tensor_parallel`),
the tensor-parallel collectives of that plan at the micro-batch's bytes by
the NCCL formula (:meth:`~celeritas_cli.model.costs.CostModel.collective_time`,
the simulator's), the pipeline's ``(m + (pp - 1) / v)`` micro-batch slots
(Narayanan et al. 2.2.1-2.2.2), the gradient all-reduce over ``dp`` beyond
the last backward that hides it, and the once-per-step updates; memory per
GPU on the first stage as Megatron-LM's section 3.3 / Korthikanti et al.
section 4 count it: state divided by ``tp`` where split and by ``pp``, the
activations of the micro-batches in flight (``pp`` for 1F1B, Megatron-LM's
``2 (pp - 1) + (v - 1) pp + 1`` chunks interleaved), divided by ``tp``
where their layout is split or sequence-sharded, only the layers' inputs
kept under full recomputation (plus one layer's activations), the core
attention's dropped under selective.  Then the configurations the estimate
says fit are **judged** in the estimate's order with
:func:`~.megatron.megatron` (tensor-parallel, micro-batch, recompute and
data-parallel recipe steps, simulated one replica of each kind) until the
budget - counted in simulations of the input graph, the wall clock only
capping it - is spent, or ``width`` plans fit: the best judged plan is the
answer, and the estimate only orders (the first judged, though, is the
configuration cheapest to judge among those estimated within
:data:`CHEAP_MARGIN` of the best, so that a short time limit still judges a
plan near the best).

Placer's own (not in Megatron-LM's paper): the search, the estimate, the
ranking by estimate.  Refused in one line: a graph without a batch, a coarse
graph, a cluster whose GPUs no configuration covers (a batch smaller than
any ``dp``), parameters that contradict each other.

References
----------
Narayanan et al., SC'21, 2.2 (schedules, bubble ``(p - 1) / (v m)``), 3
(takeaways, 3.3 the micro-batch size), 5 (Table 1); Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022, 4
(activation memory per layer) and 5 (selective recomputation).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from ...errors import InvalidInput, PlacerError
from ...log import warn
from ...model.clock import keep_best
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.params import DEFAULT_TIME_LIMIT
from ...model.placement import Placement
from ...optimize.evaluator import Budget
from ...optimize.planners import BUILD_COST
from ...pipelining.builder import check_pipelinable
from ...pipelining.layers import times_at
from ...registry import ASSUME_BATCH, Param, evaluations_param, register, time_limit_param
from ...transform.batch import declared_batch
from ...transform.microbatch import once_nodes
from ...transform.passes import node_passes
from ...transform.split_cost import batch_profile
from ...transform.tensor_parallel import SEQ, SPLIT, find_patterns, plan_tensor_parallel, tp_refusal
from .megatron import alike_devices, device_of_rank, layer_checkpoints, megatron, selective_nodes, server_gpus
from .search import default_budget

__all__ = ["Config", "Guess", "Space", "three_d"]

#: the deepest pipeline searched on a graph without transformer layers
PP_MAX = 16
#: the largest tensor-parallel degree searched (a server of 8 GPUs)
TP_SEARCH_MAX = 8
#: virtual stages searched with a pipeline
VIRTUAL = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")
#: give up (nothing built) when the best fitting estimate is this much slower than ``beat_s``
BEAT_MARGIN = 0.05
#: the first configuration judged is the cheapest to judge of those estimated within this share of the best
#: estimate (the estimates of the best dozen are often within 3 % of each other, their derived graphs 1-12 times
#: apart: Megatron-LM's 18.4B over 256 GPUs, 6.32-6.51 s; a first judgement that fits the time limit matters more)
CHEAP_MARGIN = 0.03
#: the next judgement starts only when this many times its predicted seconds are left before the deadline
TIME_SLACK = 1.5
#: the estimate's memory must leave this share of a GPU free to be judged first (the judge decides a near fit)
FIT_SLACK = 0.98


@dataclass(frozen=True)
class Config:
    """One point of the space: Megatron-LM's arguments."""

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    microbatches: int
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    zero: bool = False  # Megatron-LM's distributed optimizer (ZeRO-1 over the dp replicas)

    def params(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch_size": self.micro_batch_size,
                "virtual_stages": self.virtual_stages, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "use_distributed_optimizer": self.zero}

    def words(self) -> str:
        out = f"TP {self.tp} × PP {self.pp} × DP {self.dp}"
        if self.pp > 1:
            out += f", 1F1B interleaved ×{self.virtual_stages}" if self.virtual_stages > 1 else ", 1F1B"
        out += f", {self.microbatches} micro-batch{'es' if self.microbatches != 1 else ''}"
        if self.sequence_parallel:
            out += ", sequence parallel"
        if self.recompute != "none":
            out += f", {self.recompute} recompute"
        if self.zero:
            out += ", ZeRO-1 distributed optimizer"
        return out


@dataclass
class Guess:
    """A configuration's estimate: step seconds and the first stage's bytes per GPU."""

    config: Config
    time_s: float
    memory_bytes: float
    capacity: float

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= FIT_SLACK * self.capacity


@dataclass
class _Split:
    """One tensor-parallel degree's per-rank sums over the graph (times at a batch fraction on demand)."""

    work: list[float]      # per node: share of its work on one rank (1 or 1/tp)
    state: float           # bytes of fixed state (parameters, gradients, optimizer state) on one rank
    act: float             # activation bytes of the non-once nodes at the whole batch, on one rank
    core_act: float        # of which the core attention's (selective recompute drops them)
    ckpt_act: float        # bytes of the layers' inputs (full recompute keeps them)
    grad: float            # gradient bytes on one rank (the data-parallel all-reduce)
    update: float          # fixed bytes of the optimizer updates on one rank (ZeRO-1 divides them by dp)
    coll: list[tuple[str, int, bool]]  # the tensor-parallel collectives: (kind, bytes at the whole batch, forward)


class Space:
    """The estimates of every configuration of *graph* on *cluster* (module docstring)."""

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel, batch: int):
        self.graph, self.cluster, self.costs, self.batch = graph, cluster, costs, batch
        self.passes = node_passes(graph)
        self.once = once_nodes(graph)
        self.prof = batch_profile(graph)
        self.pats = find_patterns(graph)
        self.layers = len(self.pats.attention)
        self.core = {graph.index[x] for x in selective_nodes(graph)} if self.layers else set()
        self.ckpt = {graph.index[x] for x in layer_checkpoints(graph)} if self.layers else set()
        self.device = min(range(cluster.k), key=lambda d: (cluster.devices[d].speed, d))  # the slowest GPU
        self.capacity = min(d.memory for d in cluster.devices)
        self._splits: dict[tuple[int, bool], _Split] = {}
        self._times: dict[float, list[float]] = {}
        self._sums: dict[tuple, tuple[float, float, float, float]] = {}
        self._coll: dict[tuple, float] = {}
        self._guesses: dict[Config, Guess] = {}

    @classmethod
    def of(cls, graph: Graph, cluster: Cluster, costs: CostModel, batch: int) -> "Space":
        """The space of *graph* under the cost model *costs* (bound to *cluster*) at *batch*, built once per
        graph object: auto's ranking and its ``3d`` member estimate the same configurations once (about a
        second on GPT 6.7B over 1,024 GPUs)."""
        memo = graph.__dict__.setdefault("_3d_spaces", {})
        hit = memo.get(batch)
        if hit is None or hit.costs is not costs or hit.cluster is not cluster:
            hit = memo[batch] = cls(graph, cluster, costs, batch)
        return hit

    # ------------------------------------------------------------ the space
    def tp_choices(self) -> list[int]:
        g = server_gpus(self.cluster)
        out = []
        tp = 1
        while tp <= min(g, TP_SEARCH_MAX, self.cluster.k):
            if g % tp == 0 and self.cluster.k % tp == 0 and (tp == 1 or (
                    self.layers and tp_refusal(self.graph, tp, self.pats) is None)):
                out.append(tp)
            tp *= 2
        return out

    def configs(self, fixed: dict) -> list[Config]:
        """Every configuration the fixed parameters (0 / ``auto`` = searched) allow, in a fixed order."""
        k, B = self.cluster.k, self.batch
        pp_max = self.layers or PP_MAX
        out = []
        for tp in ([fixed["tp"]] if fixed.get("tp") else self.tp_choices()):
            for pp in ([fixed["pp"]] if fixed.get("pp") else [p for p in range(1, pp_max + 1) if (k // tp) % p == 0]):
                if (k // tp) % pp or tp * pp > k:
                    continue
                dp = k // (tp * pp)
                if B % dp:
                    continue
                per = B // dp
                sizes = [fixed["micro_batch_size"]] if fixed.get("micro_batch_size") else \
                    [b for b in (1, 2, 4, 8, 16, 32) if per % b == 0]
                for mbs in sizes:
                    if per % mbs:
                        continue
                    m = per // mbs
                    if pp > 1 and m < pp:
                        continue
                    vs = [fixed["virtual_stages"]] if fixed.get("virtual_stages") else \
                        [v for v in VIRTUAL if v == 1 or (pp > 1 and m % pp == 0 and pp * v <= pp_max)]
                    sps = [fixed["sequence_parallel"]] if fixed.get("sequence_parallel") is not None else [tp > 1]
                    zs = [fixed["zero"]] if fixed.get("zero") is not None else \
                        [False, True] if alike_devices(self.cluster) else [False]
                    for v in vs:
                        for rc in ([fixed["recompute"]] if fixed.get("recompute") else RECOMPUTE):
                            if rc == "selective" and not self.core:
                                continue
                            for sp in sps:
                                if sp and tp < 2:
                                    continue
                                for z in zs:
                                    if z and dp < 2:
                                        continue
                                    out.append(Config(tp, pp, dp, mbs, m, v, rc, bool(sp), bool(z)))
        return out

    # ------------------------------------------------------------ the estimate
    def _node_times(self, f: float) -> list[float]:
        key = round(f, 12)
        if key not in self._times:
            g, dev = self.graph, [self.device]
            self._times[key] = [times_at(g, self.costs, self.cluster, v, f, dev, self.once[v])[0] for v in range(g.n)]
        return self._times[key]

    def split(self, tp: int, sp: bool) -> _Split:
        key = (tp, sp)
        if key not in self._splits:
            g, prof = self.graph, self.prof
            if tp > 1:
                plan = plan_tensor_parallel(g, tp, sp)
                work = [1.0 / tp if plan.work_split[v] else 1.0 for v in range(g.n)]
                sstate = [1.0 / tp if plan.state_split[v] else 1.0 for v in range(g.n)]
                sact = [1.0 / tp if plan.layout[v] in (SPLIT, SEQ) else 1.0 for v in range(g.n)]
                coll = [(c.kind, c.nbytes, bool(c.consumers) and self.passes[c.consumers[0]] == "forward")
                        for c in plan.collectives]
            else:
                work = sstate = sact = [1.0] * g.n
                coll = []
            state = act = core = ckpt = grad = update = 0.0
            for v in range(g.n):
                fixed = prof.fixed_memory[v]
                state += fixed * sstate[v]
                if self.passes[v] == "backward":
                    grad += fixed * sstate[v]
                elif self.passes[v] == "update":
                    update += fixed * sstate[v]
                if self.once[v]:
                    continue
                a = (g.memory[v] - fixed) * sact[v]
                act += a
                if v in self.core:
                    core += a
                if v in self.ckpt:
                    ckpt += a
            self._splits[key] = _Split(work, state, act, core, ckpt, grad, update, coll)
        return self._splits[key]

    def _passes(self, tp: int, sp: bool, f: float) -> tuple[float, float, float, float]:
        """One rank's forward, backward, once-per-step and core-attention forward seconds at fraction *f*."""
        key = (tp, sp, round(f, 12))
        if key not in self._sums:
            s, t = self.split(tp, sp), self._node_times(f)
            fw = bw = once = core = 0.0
            for x in range(self.graph.n):
                w = t[x] * s.work[x]
                if self.once[x]:
                    once += w
                elif self.passes[x] == "forward":
                    fw += w
                    if x in self.core:
                        core += w
                else:
                    bw += w
            self._sums[key] = (fw, bw, once, core)
        return self._sums[key]

    def _collective(self, devs: tuple[int, ...], kind: str, nbytes: int) -> float:
        key = (devs, kind, nbytes)
        if key not in self._coll:
            self._coll[key] = self.costs.collective_time(list(devs), kind, nbytes) if len(devs) > 1 else 0.0
        return self._coll[key]

    def estimate(self, c: Config) -> Guess:
        """Step seconds and first-stage bytes per GPU of *c* (module docstring; computed once)."""
        if c not in self._guesses:
            self._guesses[c] = self._estimate(c)
        return self._guesses[c]

    def _estimate(self, c: Config) -> Guess:
        tp, pp, dp, m, v = c.tp, c.pp, c.dp, c.microbatches, c.virtual_stages
        s = self.split(tp, c.sequence_parallel)
        f = c.micro_batch_size / self.batch
        fw, bw, once, core = self._passes(tp, c.sequence_parallel, f)
        tpg = tuple(device_of_rank(r, 0, 0, tp, dp) for r in range(tp))
        comm = comm_fw = 0.0
        for kind, nbytes, forward in s.coll:
            x = self._collective(tpg, kind, max(1, math.ceil(nbytes * f)))
            comm += x
            comm_fw += x if forward else 0.0
        extra = {"none": 0.0, "selective": core, "full": fw + comm_fw}[c.recompute]
        slot = (fw + bw + comm + extra) / pp
        if pp > 1:  # a stage's input and its gradient over the link to the next stage, per micro-batch
            layer_in = s.ckpt_act / max(1, self.layers) * f
            a, b = device_of_rank(0, 0, 0, tp, dp), device_of_rank(0, 0, 1, tp, dp)
            slot += 2 * self.costs.link_time(layer_in, a, b)
        pipe = (m + (pp - 1) / v) * slot
        dpg = tuple(device_of_rank(0, r, 0, tp, dp) for r in range(dp))
        grads = max(1, math.ceil(s.grad / pp))
        hidden = bw / pp  # the last micro-batch's backward overlaps the reduction of its gradients
        if c.zero:  # ZeRO-1: reduce-scatter (hidden like the all-reduce), updates on 1/dp, all-gather after them
            rs = self._collective(dpg, "reduce-scatter", grads)
            step = pipe + max(rs - hidden, 0.1 * rs) + once / pp / dp + self._collective(dpg, "all-gather", grads)
        else:
            ring = self._collective(dpg, "all-reduce", grads)
            step = pipe + max(ring - hidden, 0.1 * ring) + once / pp
        # memory: the first stage's state, its activations in flight
        flight = pp if v == 1 else min(m * v, 2 * (pp - 1) + (v - 1) * pp + 1) / v
        flight = min(flight, m)
        act = s.act * f / pp
        if c.recompute == "full":
            per = s.ckpt_act * f / pp
            act_mem = flight * per + s.act * f / max(1, self.layers or pp)
        elif c.recompute == "selective":
            act_mem = flight * (act - s.core_act * f / pp) + s.core_act * f / max(1, self.layers or pp)
        else:
            act_mem = flight * act
        state = s.state - (s.update * (1 - 1 / dp) if c.zero else 0.0)
        return Guess(c, step, state / pp + act_mem, self.capacity)


# ---------------------------------------------------------------- the planner
@register("3d", paper="placer", section="PTD-P space (Narayanan et al. SC'21 2-3) searched, estimated, "
                                        "simulator-judged",
          summary="placer's 3D planner: tensor x pipeline x data parallelism, micro-batch size, virtual stages, "
                  "sequence parallelism and recomputation searched together; estimated without building, the "
                  "best judged by the simulator as the megatron row judges a configuration.",
          params={"tp": Param(int, 0, "tensor-parallel size; 0 = search", min=0, max=1024),
                  "pp": Param(int, 0, "pipeline stages; 0 = search", min=0, max=1024),
                  "micro_batch_size": Param(int, 0, "samples each replica takes in at a time (Megatron-LM's "
                                                               "micro_batch_size); 0 = search", min=0, max=1 << 20),
                  "virtual_stages": Param(int, 0, "model chunks per pipeline GPU; 0 = search", min=0, max=64),
                  "recompute": Param(str, "auto", "activation recomputation; auto = search",
                                     choices=("auto",) + RECOMPUTE),
                  "sequence_parallel": Param(str, "auto", "sequence parallelism; auto = with tp > 1",
                                             choices=("auto", "on", "off")),
                  "use_distributed_optimizer": Param(str, "auto", "Megatron-LM's distributed optimizer (ZeRO-1 "
                                                                  "over the dp replicas); auto = search",
                                                     choices=("auto", "on", "off")),
                  "width": Param(int, 3, "stop after this many judged plans fit", min=1, max=1000),
                  "time_limit": time_limit_param(DEFAULT_TIME_LIMIT, "wall-clock cap of the search"),
                  "evaluations": evaluations_param("simulations of the input graph the search may make (0 = from "
                                                   "time_limit and the graph size, as auto)"),
                  "assume_batch": ASSUME_BATCH,
                  "beat_s": Param(float, 0.0, "give up (before building anything) when the estimate predicts no "
                                              "fitting plan within 5 % of this step time (s; auto passes its best "
                                              "so far); 0 = never", min=0, max=1e9),
                  "quiet": Param(bool, True, "no progress lines on stderr")},
          quick_params={"evaluations": 150, "width": 1})
def three_d(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, tp: int = 0,
            pp: int = 0, micro_batch_size: int = 0, virtual_stages: int = 0, recompute: str = "auto",
            sequence_parallel: str = "auto", use_distributed_optimizer: str = "auto", width: int = 3, time_limit: float = DEFAULT_TIME_LIMIT,
            evaluations: int = 0, assume_batch: int = 0, beat_s: float = 0.0, quiet: bool = True,
            deadline: float | None = None) -> Placement:
    """The best PTD-P plan the simulator confirms (module docstring).

    Returns
    -------
    Placement
        The ``megatron`` row's placement of the best judged configuration
        (``algorithm`` ``3d``), its ``estimate`` with the search's account:
        ``configurations`` estimated, ``judged`` (each with its estimate,
        simulated step and status), ``evaluations_spent``.

    Raises
    ------
    InvalidInput
        No batch, a coarse graph, no configuration (say why), every judged
        configuration refused, or ``beat_s`` not within reach (nothing built).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = three_d(layered(40, seed=1), uniform(4), evaluations=200, assume_batch=16)
    >>> p.algorithm, p.estimate["status"], p.estimate["tp"]
    ('3d', 'FEASIBLE', 1)
    """
    check_pipelinable(graph)
    costs = cost_model(graph, cluster, costs)
    assume = assume_batch or None
    batch = declared_batch(graph, assume, what="the 3D planner's data parallelism and micro-batches")
    log: Callable[[str], None] = (lambda msg: None) if quiet else warn
    start = time.perf_counter()
    end = deadline if deadline is not None else (start + time_limit if time_limit > 0 else None)
    budget: Budget = default_budget(graph, time_limit, evaluations, end)
    space = Space.of(graph, cluster, costs, batch)
    fixed = {"tp": tp, "pp": pp, "micro_batch_size": micro_batch_size, "virtual_stages": virtual_stages,
             "recompute": None if recompute == "auto" else recompute,
             "sequence_parallel": None if sequence_parallel == "auto" else sequence_parallel == "on",
             "zero": None if use_distributed_optimizer == "auto" else use_distributed_optimizer == "on"}
    if tp > 1 and not space.layers:
        raise InvalidInput(f"3d: tp={tp}: graph '{graph.name}' has no attention pattern to split")
    if tp > 1 and (why := tp_refusal(graph, tp, space.pats)):
        raise InvalidInput(f"3d: {why}")
    configs = space.configs(fixed)
    if not configs:
        raise InvalidInput(f"3d: no configuration of {cluster.k} GPUs covers graph '{graph.name}' at batch {batch} "
                           f"with the parameters given (dp = GPUs / (tp x pp) must divide the batch; a pipeline needs "
                           f"at least pp micro-batches)")
    guesses = sorted((space.estimate(c) for c in configs),
                     key=lambda q: (not q.fits, q.time_s if q.fits else q.memory_bytes, _key(q.config)))
    fitting = [q for q in guesses if q.fits]
    if fitting:  # the first judged: the cheapest to judge of those estimated within CHEAP_MARGIN of the best
        near = [q for q in fitting if q.time_s <= fitting[0].time_s * (1 + CHEAP_MARGIN)]
        first = min(near, key=lambda q: (_weight(q.config), q.time_s, _key(q.config)))
        guesses.remove(first)
        guesses.insert(0, first)
    log(f"3d: {len(configs)} configurations estimated, {len(fitting)} fit; best "
        f"{(fitting or guesses)[0].config.words()} ({(fitting or guesses)[0].time_s:.4g} s), judged first "
        f"{guesses[0].config.words()} ({guesses[0].time_s:.4g} s)")
    if beat_s > 0 and (not fitting or fitting[0].time_s > beat_s * (1 + BEAT_MARGIN)):
        best = f"best {fitting[0].time_s:.4g} s" if fitting else "none fits"
        raise InvalidInput(f"3d gave up: its estimate predicts no plan within {100 * BEAT_MARGIN:g} % of "
                           f"{beat_s:.4g} s ({best}); nothing was built")
    size = max(1, graph.n + graph.m)
    judged: list[dict] = []
    best: list[Placement] = []  # the best judged plan so far (a list: the registry's cap may ask for it)
    fits_n = 0
    per_weight = 0.0  # the most seconds per unit of derived-graph weight a judgement took so far
    best_weight = 0.0  # the weight of the best plan's judgement

    def finish(clock_cut: bool = False) -> Placement | None:
        if not best:
            return None
        p = best[0]
        p.algorithm = "3d"
        p.params = {"tp": tp, "pp": pp, "micro_batch_size": micro_batch_size, "virtual_stages": virtual_stages,
                    "recompute": recompute, "sequence_parallel": sequence_parallel,
                    "use_distributed_optimizer": use_distributed_optimizer, "width": width,
                    "evaluations": evaluations, "assume_batch": assume_batch}
        p.estimate.details.update({"configurations": len(configs), "configurations_fitting": len(fitting),
                                   "judged": list(judged), "evaluations": budget.used,
                                   "evaluation_budget": budget.limit, "evaluations_spent": round(budget.spent, 3),
                                   "clock_cut": budget.clock_cut or clock_cut})
        return p

    keep_best(lambda: finish(clock_cut=True))  # the registry's answer if its cap stops the search
    for q in guesses:
        c = q.config
        weight = _weight(c)
        if judged:
            if fits_n >= width or budget.spent + weight > budget.limit:
                break
            # room for the next judgement, and for the caller to judge the answer again (auto does)
            if end is not None and time.perf_counter() + per_weight * (TIME_SLACK * weight + best_weight) > end:
                budget.clock_cut = True
                break
            if fits_n and not q.fits:
                break
        t0 = time.perf_counter()
        try:
            p = megatron(graph, cluster, costs=costs, assume_batch=assume_batch, **c.params())
        except PlacerError as exc:
            judged.append({"plan": c.words(), "estimate_s": q.time_s, "refused": str(exc)})
            budget.charged += 1.0
            continue
        budget.charged += (1 + BUILD_COST) * (p.estimate["graph_nodes"] * 2) / size
        per_weight = max(per_weight, (time.perf_counter() - t0) / weight)
        e = p.estimate
        judged.append({"plan": c.words(), "estimate_s": q.time_s, "estimate_bytes": round(q.memory_bytes),
                       "makespan_s": e["makespan_s"], "status": e["status"]})
        log(f"3d: {c.words()}: estimated {q.time_s:.4g} s, simulated {e['makespan_s']:.4g} s {e['status']}")
        if e["status"] == "FEASIBLE":
            fits_n += 1
        if not best or _better(p, best[0]):
            best[:] = [p]
            best_weight = weight
    if not best:
        raise InvalidInput(f"3d: every configuration judged was refused ({judged[0]['refused']})")
    return finish()


def _weight(c: Config) -> float:
    """The work of judging *c*, in units of building and simulating the input graph: one copy per micro-batch,
    tensor rank 0's share of it (its split work and the parts every rank repeats), more with recomputation."""
    return (1 + BUILD_COST) * c.microbatches * (0.5 + 0.5 / c.tp) * (1.0 if c.recompute == "none" else 1.3)


def _key(c: Config) -> tuple:
    return (c.tp, c.pp, c.micro_batch_size, c.virtual_stages, RECOMPUTE.index(c.recompute), c.sequence_parallel,
            c.zero)


def _better(a: Placement, b: Placement) -> bool:
    fa, fb = a.estimate["status"] == "FEASIBLE", b.estimate["status"] == "FEASIBLE"
    if fa != fb:
        return fa
    return a.estimate["makespan_s"] < b.estimate["makespan_s"]
