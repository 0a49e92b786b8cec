"""The Hierarchical Planner (HRL): a learned Grouper + Placer trained with
REINFORCE (Mirhoseini, Goldie, Pham, Steiner, Le, Dean, "A Hierarchical
Model for Device Placement", ICLR 2018 - papers/hierarchical-planner.txt).

It is the learned baseline Celeritas compares against ("HRL", Celeritas
section 2 and Figure 1, Tables 3-4).  The real system measures every sampled
placement on hardware; here the runtime of a sample is the simulated
makespan (:func:`celeritas_cli.sim.simulator.run_schedule`, one
:class:`~celeritas_cli.model.costs.CostModel` built once), so "training time" is
this function's wall time and ``registry.place`` reports it as the
placement time.

The pipeline per iteration (HRL section 2, Figure 1):

1. operation features (:func:`~.features.op_features`): op-type index (for a trainable
   type embedding), output sizes and number of outputs, adjacency, plus
   compute / memory / topological position (see *Deviations*);
2. the Grouper samples a group for every colocation unit;
3. group embeddings (mean type embedding, mean size features, intra/inter
   group adjacency) are fed to the Placer, which samples a device per group;
4. each of the ``samples_per_iteration`` joint samples is simulated; reward
   ``R = -sqrt(runtime)``; both networks are updated by REINFORCE with a
   moving-average baseline (HRL's cost function J(theta_g, theta_d)).

Steps 2-4 are :class:`~.training.Policy` and :class:`~.training.Trainer`.

Budget: ``iterations`` policy updates, counted, so a seed repeats (the
paper trains 1000, section 3).  By default (``iterations=0``) the count is
derived from ``time_limit`` by a fixed cost model (:mod:`.budget`): one
iteration costs one Placer decode of M steps with attention over M groups
plus ``samples_per_iteration`` simulations - measured on a loaded 2-core
machine 0.05 s for M = 13 and 1.5-2.2 s for M = 256 with 8 samples.  The
wall clock, from the call's start, only caps training (stderr says when).
Use a coarse graph (``placer coarsen``) of a few hundred nodes; the paper's
policy needed hours on real hardware (Celeritas Table 4 charges HRL 5 hours),
and a budget under 100 iterations is reported as a smoke budget (the
estimate's ``caveat``).  Under memory pressure groups and devices a unit
no longer fits in are not sampled, and what still overflows is charged by
how far (:mod:`.reward`, a deviation; ``oom_mode=fixed`` is the paper's
rule).

Deviations
----------
Readings chosen where the paper is silent (documented per the project
rules):

* Colocation: the Grouper decides per *colocation unit* (all nodes of a
  colocation group, or a lone node): a unit's logits are the mean of its
  nodes' logits and it contributes one log-probability term.  Groups map
  to one device each, so no placement ever splits a colocation group.
* OOM (deviation, ``oom_mode="mask"`` by default): HRL's released
  controller gives a failed (ResourceExhausted) placement a fixed
  runtime ``failing_signal`` (100 s); Celeritas section 2 ("HRL albeit
  sets a large penalty for OOM occurrences, it provides no solution").
  With a fixed penalty a batch of OOM samples has zero advantage and
  teaches nothing, which is how the planner collapsed under memory
  pressure (``oom_mode="fixed"`` keeps the paper's rule).  ``graded``
  charges ``oom_runtime x (1 + bytes over capacity / graph bytes)``,
  still above every feasible makespan - but measured, that alone does
  not stop the drift into overflow (the Grouper's softmax sharpens and
  piles units into few groups).  ``mask`` also samples under memory
  constraints: units in index order never join a group that would
  outgrow the largest device, and the Placer never sends a group to a
  device it no longer fits on (action masking; when nothing fits, the
  lightest group / the device with the most free memory); log-
  probabilities are those of the masked distributions, so REINFORCE
  stays unbiased for the masked policy, and a residual OOM is graded.
* Reward scale: ``R = -sqrt(r / T)`` with ``T`` the total mean compute
  time, a constant factor ``1/sqrt(T)`` on HRL's ``-sqrt(r)`` so the
  learning rate does not depend on the graph's time unit.
* Baseline: exponential moving average (decay 0.9, the released
  ``bl_dec``) of the batch-mean reward, initialised with the first
  batch's mean (the released code starts it at the failing signal);
  Adam with global gradient-norm clipping at 1.0 (``grad_bound``).
* Features: besides the paper's type / output sizes / output count /
  adjacency we give each operation its mean compute time, memory and
  topological position (our graphs are often coarse, where the op type
  says little), and each group its share of the nodes.  Group
  connectivity is weighted by edge bytes (the simulator's cost driver)
  rather than counted.
* Exploration, as in the released controller: device logits are
  squashed to ``tanh(logits)`` (``tanh_constant`` 1.0, so no device ever
  gets more than ``e / (e + (k-1)/e)`` of a group's probability) and
  Gaussian noise of 0.5 x their RMS (``logits_std_noise``) perturbs the
  Grouper's and the Placer's logits during the first 75 % of the
  iteration budget (``stop_noise_step`` 750 of 1000) - of the budget
  actually run: when the clock will stop training early, the schedule
  is laid over the iterations that fit, so the noise still stops.
* Determinism: one CPU thread (``torch.set_num_threads(1)``, restored
  afterwards), parameters seeded with ``torch.manual_seed`` inside
  ``torch.random.fork_rng`` (the caller's RNG state is untouched), all
  sampling from a private ``torch.Generator``, a counted budget.  Every
  op used (Linear, LSTM, index_add, multinomial, randn) is deterministic
  on CPU, so we do not call ``torch.use_deterministic_algorithms``, whose
  first call imports torch._inductor (~3.5 s, billed as placement time).
* Not reproduced: the distributed controllers/workers and the
  learning-rate decay of the released code.

Example
-------
``placer coarsen g.json | placer place --algo hierarchical --time-limit 60
-p samples_per_iteration=8 --simulate > p.json``
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .... import log
from ....errors import InvalidInput, MissingDependency, SolverError
from ....model.cluster import Cluster
from ....model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from ....model.costs import CostModel, cost_model
from ....model.clock import keep_best
from ....model.graph import Graph
from ....model.params import SOLVER_TIME_LIMIT
from ....model.placement import Placement
from ....registry import Param, congestion_param, register, time_limit_param
from ....sim.simulator import lower_bound
from .budget import MAX_ITERATIONS, PAPER_ITERATIONS, TrainingBudget, auto_iterations, iteration_cost_s
from .features import (
    ADJ_DIM,
    MAX_OUTPUTS,
    SIZE_DIM,
    TYPE_DIM,
    default_groups,
    op_features,
    units,
)
from .reward import OOM_MODES, RewardEnv, oom_runtime
from .training import Training, train

__all__ = ["hierarchical", "op_features", "default_groups", "oom_runtime", "units", "ADJ_DIM", "MAX_OUTPUTS",
           "SIZE_DIM", "TYPE_DIM"]

SHORT_BUDGET = 100
"""Fewer iterations than this are a smoke budget, not the paper's planner
(the estimate's ``caveat`` says so, and ``compare`` marks the cell)."""


def _caveat(done: int, samples: int) -> str | None:
    if done == 0:
        return "no training: the time limit ran out before the first iteration (the untrained policy's placement)"
    if done < SHORT_BUDGET:
        return (f"smoke budget: {done} iterations x {samples} samples, not the paper's planner "
                f"({PAPER_ITERATIONS} iterations)")
    if done < PAPER_ITERATIONS:
        return f"{done} of the paper's {PAPER_ITERATIONS} iterations"
    return None


@register(
    "hierarchical", paper="Hierarchical Planner (HRL)", section="section 2, Figure 1",
    summary="Learned Grouper (feed-forward) + seq2seq Placer (LSTM + attention) trained with REINFORCE "
            "on R=-sqrt(simulated runtime); memory-masked sampling, residual OOM penalised by how far it "
            "overflows (oom_mode=fixed: the paper's fixed penalty).",
    params={
        "groups": Param(int, 0, "number of groups M; 0 = min(256, colocation units)", min=0, max=65536),
        "iterations": Param(int, 0, "policy updates, the deterministic budget (0 = as many as fit in time_limit "
                                    "by a fixed cost model; 1000, the paper's, without a limit)", min=0,
                            max=MAX_ITERATIONS),
        "samples_per_iteration": Param(int, 8, "joint placements sampled (and simulated) per update", min=1,
                                       max=4096),
        "time_limit": time_limit_param(SOLVER_TIME_LIMIT, "wall-clock cap on the whole call (0: the paper's 1000 "
                                                       "iterations)"),
        "lr": Param(float, 0.05, "Adam learning rate", gt=0, max=10.0),
        "hidden": Param(int, 64, "hidden width of the Grouper and the Placer LSTMs", min=2, max=4096),
        "oom_penalty": Param(float, 2.0, "OOM runtime as a multiple of an upper bound on any makespan",
                             min=1.0, max=1e6),
        "oom_mode": Param(str, "mask", "mask: groups and devices a unit no longer fits in are not sampled, "
                                       "residual OOM graded (deviation); graded: the OOM runtime grows with the "
                                       "bytes over capacity (deviation); fixed: the paper's fixed penalty",
                          choices=OOM_MODES),
        "congestion": congestion_param("simulator congestion rule for the reward"),
        "progress": Param(bool, True, "show best simulated runtime on stderr"),
    },
    extra="torch",
    quick_params={"iterations": 5, "samples_per_iteration": 2, "hidden": 16, "time_limit": 20.0,
                  "progress": False},
)
def hierarchical(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                 groups: int = 0, iterations: int = 0,
                 samples_per_iteration: int = 8, time_limit: float = SOLVER_TIME_LIMIT, lr: float = 0.05, hidden: int = 64,
                 oom_penalty: float = 2.0, oom_mode: str = "mask", congestion: str = DEFAULT_CONGESTION,
                 progress: bool = True, history: list | None = None, deadline: float | None = None) -> Placement:
    """Train the Hierarchical Planner's policy on *graph* and return the best
    placement it sampled.

    Parameters
    ----------
    graph : Graph
        Usually a coarse graph (a few hundred nodes); every node is one
        operation of the paper.
    cluster : Cluster
    seed : int
        Seeds parameter initialisation and sampling (``torch.manual_seed``
        inside a forked RNG, and a private ``torch.Generator``).
    groups : int
        M, the number of groups (0: ``min(256, number of colocation units)``).
    iterations : int
        Policy updates: the deterministic budget.  0 (default): the paper's
        1000 without a time limit, else as many as fit in *time_limit* by
        :func:`~.budget.auto_iterations` (a fixed cost model of the graph's
        and the policy's sizes, so the count does not depend on the clock).
    samples_per_iteration : int
        Joint samples per update.
    time_limit : float
        Seconds, counted from the call's start (torch's import included):
        a cap, checked before every iteration (see ``TrainingBudget.may_start``);
        when it stops or reschedules training, a line on stderr says the
        result may differ between runs (``estimate.repeatable`` false).
        0: no limit.
    lr, hidden : float, int
        Adam learning rate; network width.
    oom_penalty : float
        See :func:`~.reward.oom_runtime`.
    oom_mode : {"mask", "graded", "fixed"}
        How memory is handled (:mod:`.reward`; *Notes*).
    congestion : str
        Simulator congestion rule used for the reward.
    progress : bool
        A rich progress bar with the best simulated runtime on stderr.
    history : list, optional
        Not a registry parameter: when a list is given, one dict per
        iteration is appended - ``iteration``, ``samples``, ``oom`` (samples
        over memory), ``mean_overflow`` (:func:`~.reward.overflow_fraction`
        averaged over the samples), ``noise`` and ``best_feasible_s`` (best
        feasible makespan so far, None before the first) - the learning
        curve ``benchmarks/bench_time_limits.py`` prints.
    deadline : float, optional
        The :func:`time.perf_counter` reading at which the wall clock ends
        (``registry.place`` passes the command's start + *time_limit*);
        default: *time_limit* from this call's start.

    Returns
    -------
    Placement
        The sample with the lowest simulated makespan among memory-feasible
        ones (if any; otherwise the lowest among all samples, reported with
        ``status`` ``"OOM"`` - the failure Celeritas Figure 1 shows).  The
        final greedy (arg-max) decode of the trained policy is a candidate
        too.  ``estimate`` holds ``makespan_s`` (simulated), ``status``,
        ``lower_bound_s``, ``iterations`` (done), ``iteration_budget``,
        ``samples``, ``groups``, ``oom_mode``, ``training_time_s``,
        ``best_iteration``, ``repeatable`` and a ``caveat`` below the
        paper's 1000 iterations.

    Raises
    ------
    MissingDependency
        torch is not installed.
    InvalidInput
        A negative iteration count or groups, a non-positive sample or
        hidden count.
    SolverError
        One iteration would take more than half of *time_limit* by the cost
        model (it cannot be interrupted): coarsen first.

    Notes
    -----
    The readings chosen where the paper is silent (colocation, OOM, reward
    scale, baseline, features, exploration, determinism) are listed in the
    module docstring, *Deviations*.

    References
    ----------
    Mirhoseini et al., "A Hierarchical Model for Device Placement" (ICLR
    2018), section 2 (Grouper, Placer, group embeddings, R_d = -sqrt(r),
    J(theta_g, theta_d), REINFORCE), section 3 (1000 iterations).
    Williams 1992 (REINFORCE); Bahdanau et al. 2015 (attention).
    Celeritas section 2 / Figure 1 (HRL and OOM).
    """
    t0 = time.perf_counter()
    torch = _import_torch()
    from . import model as hm

    _check_params(iterations, samples_per_iteration, hidden, groups, congestion, oom_mode, time_limit)
    costs = cost_model(graph, cluster, costs)
    env = _reward_env(graph, cluster, costs, congestion, oom_mode)
    M = groups or default_groups(graph)
    budget = _budget(graph, cluster.k, M, iterations, samples_per_iteration, time_limit, t0, deadline)
    run = _Run(graph, cluster, costs, seed, M, budget, oom_mode, t0, env.unit_of)
    if graph.n == 0 or cluster.k == 1:
        dev_unit = [0] * len(env.unit_mem)
        return run.placement(dev_unit, env.makespan(dev_unit) if graph.n else 0.0, env.fits(dev_unit),
                             {"iterations": 0, "samples": 1, "best_iteration": 0, "repeatable": True})
    env.fail_r = oom_runtime(graph, cluster, costs, oom_penalty)
    found: list[tuple] = []  # the best sample so far: the registry's answer if its time cap stops training
    keep_best(lambda: _placement(run, found[-1], budget, samples_per_iteration, clock_cut=True) if found else None)
    best = _seeded_training(torch, hm, env, op_features(graph, costs), Training(M, hidden, lr, progress), seed,
                            budget, history, found.append)
    if budget.clock_cut:
        log.warn(f"hierarchical: the wall clock (--time-limit {time_limit:g} s) cut training to {budget.done} of "
                 f"{budget.iterations} iterations, so this result may differ between runs; raise --time-limit "
                 f"or set -p iterations=N for a repeatable one")
    return _placement(run, best, budget, samples_per_iteration, budget.clock_cut)


def _placement(run: "_Run", best: tuple, budget, samples_per_iteration: int, clock_cut: bool) -> Placement:
    """The placement of the best sample ``((oom, makespan, iteration, sample), unit->device)``."""
    (oom, ms, it, _), dev_unit = best
    extra = {"iterations": budget.done, "samples": budget.n_samples, "best_iteration": it,
             "repeatable": not clock_cut}
    caveat = _caveat(budget.done, samples_per_iteration)
    if caveat:
        extra["caveat"] = caveat
    return run.placement(dev_unit, ms, not oom, extra)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise MissingDependency("algorithm 'hierarchical' needs torch: pip install -e .[torch]") from None
    return torch


def _check_params(iterations: int, samples_per_iteration: int, hidden: int, groups: int, congestion: str,
                  oom_mode: str, time_limit: float) -> None:
    if iterations < 0 or samples_per_iteration < 1 or hidden < 2:
        raise InvalidInput("'hierarchical': iterations must be >= 0 (0 = auto), samples_per_iteration >= 1 "
                           "and hidden >= 2")
    if groups < 0:
        raise InvalidInput(f"'hierarchical' parameter groups: must be >= 0 (0 = auto), got {groups}")
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"'hierarchical' parameter congestion: must be one of {', '.join(CONGESTION_RULES)}")
    if oom_mode not in OOM_MODES:
        raise InvalidInput(f"'hierarchical' parameter oom_mode: must be one of {', '.join(OOM_MODES)}")
    if time_limit < 0:
        raise InvalidInput(f"'hierarchical' parameter time_limit: must be >= 0 (0 = no limit), got {time_limit}")


def _reward_env(graph: Graph, cluster: Cluster, costs: CostModel, congestion: str, oom_mode: str) -> RewardEnv:
    """The reward side over colocation units (the Grouper's decisions)."""
    unit_of, n_units = units(graph)
    unit_mem = graph.memory_by(unit_of, n_units)
    return RewardEnv(graph, cluster, costs, congestion, unit_of, unit_mem, oom_mode=oom_mode)


def _budget(graph: Graph, k: int, M: int, iterations: int, samples: int, time_limit: float,
            t0: float, end: float | None) -> TrainingBudget:
    """The counted budget (:mod:`.budget`); :class:`SolverError` when one
    iteration, which cannot be interrupted, would take over half the limit."""
    one = iteration_cost_s(graph.n, graph.m, M, samples)
    if time_limit and k > 1 and one > 0.5 * time_limit:  # one iteration cannot be interrupted
        raise SolverError(f"hierarchical: one training iteration on graph '{graph.name}' ({graph.n} nodes, {M} "
                          f"groups) takes about {one:.2g} s, too long for --time-limit {time_limit:g} s; coarsen "
                          f"first (`placer coarsen G | placer place - --algo hierarchical`) or raise --time-limit "
                          f"to {2 * one + 1:.0f} s or more")
    return TrainingBudget(iterations or auto_iterations(graph.n, graph.m, M, samples, time_limit),
                          samples, time_limit, t0, end, first_s=one)


def _seeded_training(torch, hm, env: RewardEnv, feats: dict, training: Training, seed: int,
                     budget: TrainingBudget, history: list | None, on_best=None):
    """:func:`~.training.train` on one CPU thread, parameters seeded inside
    a forked RNG (the caller's state untouched), sampling from a private
    generator; the thread count is restored afterwards."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            return train(torch, hm, env, feats, training, gen, budget, history, on_best)
    finally:
        torch.set_num_threads(prev_threads)


@dataclass
class _Run:
    """What every placement of one call records."""

    graph: Graph
    cluster: Cluster
    costs: CostModel
    seed: int
    M: int
    budget: TrainingBudget
    oom_mode: str
    t0: float
    unit_of: list[int]

    def placement(self, dev_unit: list[int], ms: float, ok: bool, extra: dict) -> Placement:
        graph, n = self.graph, self.graph.n
        device_of = [dev_unit[self.unit_of[v]] for v in range(n)]
        est = {"makespan_s": ms, "makespan_by": "simulator", "status": "FEASIBLE" if ok else "OOM",
               "lower_bound_s": lower_bound(graph, self.cluster, self.costs) if n else 0.0, "groups": self.M,
               "iteration_budget": self.budget.iterations, "oom_mode": self.oom_mode,
               "training_time_s": time.perf_counter() - self.t0, **extra}
        return Placement.from_indices(graph, self.cluster, device_of, algorithm="hierarchical", seed=self.seed,
                                      params={"groups": self.M, "iterations": self.budget.iterations},
                                      estimate=est)
