"""The Hierarchical Planner's training (Mirhoseini et al., ICLR 2018, section 2).

Section 2's structure, one name each:

* :class:`Policy` - the joint policy: the Grouper draws a group for every
  colocation unit, the group embeddings are built, the Placer draws a
  device per group (Figure 1); it returns the unit->device samples and
  their log-probabilities ``log p(g) + log p(d | g)``;
* :class:`Trainer` - REINFORCE with a moving-average baseline on the
  reward ``R = -sqrt(runtime)`` (section 2's cost function
  ``J(theta_g, theta_d)``): per iteration sample, simulate
  (:meth:`Trainer.evaluate`), update both networks
  (:meth:`Trainer.update`); at the end the greedy decode
  (:meth:`Trainer.final_decode`);
* :class:`Training` - the hyperparameters of one run.

The deviations (memory masks, reward scale, exploration noise, features)
are listed in :mod:`.planner` (*Deviations*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .... import log
from .budget import TrainingBudget
from .features import TYPE_DIM
from .reward import RewardEnv

BASELINE_DECAY = 0.9
"""Moving-average baseline decay (``bl_dec``)."""
GRAD_BOUND = 1.0
"""Global gradient-norm clip (``grad_bound``)."""
LOGITS_NOISE = 0.5
"""Exploration noise on the logits (``logits_std_noise``), relative to their RMS."""


@dataclass(frozen=True)
class Training:
    """Hyperparameters of one training run: ``groups`` (M, the Grouper's
    softmax width), ``hidden`` (network width), ``lr`` (Adam's learning
    rate) and ``progress`` (a progress bar on stderr)."""

    groups: int
    hidden: int
    lr: float
    progress: bool = True


class Policy:
    """The Grouper and the Placer over the fixed tensors of one graph
    (section 2, Figure 1); parameters are created Grouper first, then
    Placer, from torch's global RNG (seeded by the caller)."""

    def __init__(self, torch, hm, env: RewardEnv, feats: dict, training: Training, gen):
        graph, k, M = env.graph, env.cluster.k, training.groups
        self.torch, self.hm, self.gen, self.M = torch, hm, gen, M
        self.type_idx = torch.tensor(feats["type_idx"], dtype=torch.long)
        self.size_t = torch.tensor(feats["size"], dtype=torch.float32)
        self.node_x = torch.cat([self.size_t, torch.tensor(feats["adj"], dtype=torch.float32)], dim=1)
        self.unit_t = torch.tensor(env.unit_of, dtype=torch.long)
        self.n_units = len(env.unit_mem)
        bmax = max(graph.edge_bytes, default=0) or 1
        self.e_src = torch.tensor(graph.edge_src, dtype=torch.long)
        self.e_dst = torch.tensor(graph.edge_dst, dtype=torch.long)
        self.e_w = torch.tensor([b / bmax for b in graph.edge_bytes], dtype=torch.float32)
        self.unit_mem_t = torch.tensor(env.unit_mem, dtype=torch.float64).unsqueeze(0)
        # the masks change nothing when the whole graph fits on every device: keep the paper's draws then
        self.masked = env.oom_mode == "mask" and sum(env.unit_mem) > min(d.memory for d in env.cluster.devices)
        self.capacity_t = torch.tensor([float(d.memory) for d in env.cluster.devices], dtype=torch.float64)
        self.grouper = hm.Grouper(len(feats["types"]), TYPE_DIM, self.node_x.shape[1], training.hidden, M)
        self.placer = hm.Placer(TYPE_DIM + self.size_t.shape[1] + 1 + 2 * M, training.hidden, k)

    def parameters(self) -> list:
        return list(self.grouper.parameters()) + list(self.placer.parameters())

    def group(self, samples: int, greedy: bool, noise: float):
        """The Grouper's draw: ``(group per unit [S, U], log p [S])``; under
        memory pressure with ``oom_mode="mask"`` the masked draw."""
        torch = self.torch
        logp_unit = self.grouper(self.type_idx, self.node_x, self.unit_t, self.n_units, noise=noise,
                                 generator=self.gen)  # [U, M]
        if self.masked:
            return self.hm.masked_groups(logp_unit, self.unit_mem_t[0], float(self.capacity_t.max()),
                                         1 if greedy else samples, greedy, self.gen)
        if greedy:
            g_unit = logp_unit.argmax(dim=1).unsqueeze(0)  # [1, U]
        else:
            g_unit = torch.multinomial(logp_unit.exp(), samples, replacement=True, generator=self.gen).t()  # [S, U]
        return g_unit, logp_unit.gather(1, g_unit.t()).sum(dim=0)  # [S]

    def place(self, g_unit, greedy: bool, noise: float):
        """The Placer's draw over the group embeddings: ``(device per group
        [S, M], log p [S])``; masked to the devices a group still fits."""
        emb = self.hm.group_embeddings(g_unit[:, self.unit_t], self.grouper.type_emb(self.type_idx), self.size_t,
                                       self.e_src, self.e_dst, self.e_w, self.M)
        group_mem = None
        if self.masked:  # bytes per group of every sample, for the Placer's memory mask
            group_mem = self.torch.zeros(g_unit.shape[0], self.M, dtype=self.torch.float64).scatter_add(
                1, g_unit, self.unit_mem_t.expand(g_unit.shape[0], -1))
        return self.placer(emb, generator=self.gen, greedy=greedy, noise=noise, group_mem=group_mem,
                           capacity=self.capacity_t)

    def __call__(self, samples: int, greedy: bool, noise: float = 0.0):
        """Joint samples: ``(device per unit [S, U], log p(g) + log p(d | g) [S])``."""
        g_unit, lp_group = self.group(samples, greedy, noise)
        dev_group, lp_place = self.place(g_unit, greedy, noise)
        return self.torch.gather(dev_group, 1, g_unit), lp_group + lp_place


def progress_bar(total: int):
    """A started rich progress bar on stderr and its task."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("hierarchical"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=log.stderr_console(), transient=False)
    bar.start()
    return bar, bar.add_task("best -", total=total)


class Trainer:
    """REINFORCE with a moving-average baseline (section 2; Williams 1992).

    ``best = ((oom, makespan, iteration, sample), unit->device list)``: the
    best memory-feasible sample so far (else the fastest OOM one)."""

    def __init__(self, torch, policy: Policy, env: RewardEnv, training: Training, budget: TrainingBudget,
                 history: list | None = None, on_best: Callable[[tuple], None] | None = None):
        self.torch, self.policy, self.env, self.budget, self.history = torch, policy, env, budget, history
        self.on_best = on_best or (lambda best: None)
        self.params = policy.parameters()
        self.opt = torch.optim.Adam(self.params, lr=training.lr)
        self.T_ref = math.fsum(env.costs.mean_time) or 1.0
        self.best: tuple | None = None
        self.baseline: float | None = None

    def consider(self, key: tuple, dev_unit: list[int]) -> None:
        if self.best is None or key < self.best[0]:
            self.best = (key, list(dev_unit))
            self.on_best(self.best)

    def evaluate(self, it: int, samples: list[list[int]]) -> tuple[list[float], int, float]:
        """Simulate every sample, keep the best, return the rewards
        ``R = -sqrt(r / T)`` (r the makespan or the OOM signal), the number
        of OOM samples and their summed overflow (for *history* only)."""
        env = self.env
        rewards = []
        n_oom, over = 0, 0.0
        for s, dev_unit in enumerate(samples):
            self.budget.n_samples += 1
            r, ok = env.runtime(dev_unit)
            if self.history is not None and not ok:
                n_oom += 1
                over += env.overflow(dev_unit)
            if ok:
                self.consider((False, r, it, s), dev_unit)
            elif self.best is None or self.best[0][0]:  # no feasible sample yet: keep the fastest OOM one
                self.consider((True, env.makespan(dev_unit), it, s), dev_unit)
            rewards.append(-math.sqrt(r / self.T_ref))
        return rewards, n_oom, over

    def update(self, rewards: list[float], logp) -> None:
        """One REINFORCE step on ``-(R - b) log p``, gradients clipped at
        :data:`GRAD_BOUND`; the baseline ``b`` (the first batch's mean, then
        an exponential moving average) moves toward the batch mean."""
        torch = self.torch
        mean_r = math.fsum(rewards) / len(rewards)
        b = mean_r if self.baseline is None else self.baseline
        loss = -(torch.tensor([r - b for r in rewards], dtype=torch.float32) * logp).mean()
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, GRAD_BOUND)
        self.opt.step()
        self.baseline = BASELINE_DECAY * b + (1 - BASELINE_DECAY) * mean_r

    def iteration(self, it: int) -> None:
        """Sample ``budget.samples`` joint placements (noisy during the
        noise schedule), evaluate them, update the policy."""
        budget = self.budget
        dev_unit_t, logp = self.policy(budget.samples, greedy=False, noise=LOGITS_NOISE if budget.noisy(it) else 0.0)
        rewards, n_oom, over = self.evaluate(it, dev_unit_t.tolist())
        self.update(rewards, logp)
        budget.done = it + 1
        if self.history is not None:
            self.history.append({"iteration": it, "samples": len(rewards), "oom": n_oom,
                                 "mean_overflow": over / len(rewards), "noise": budget.noisy(it),
                                 "best_feasible_s": None if self.best[0][0] else self.best[0][1]})

    def final_decode(self) -> None:
        """The trained policy's greedy (arg-max) decode, a candidate too
        (the only one when no iteration ran)."""
        with self.torch.no_grad():
            dev_unit = self.policy(1, greedy=True)[0][0].tolist()
        self.budget.n_samples += 1
        ok = self.env.fits(dev_unit)
        if self.best is None or ok or self.best[0][0]:  # no iteration ran (a slow start): the untrained decode
            self.consider((not ok, self.env.makespan(dev_unit), self.budget.done, -1), dev_unit)

    def run(self, progress: bool) -> tuple:
        """Iterate while the budget allows, then decode; returns ``best``."""
        budget = self.budget
        # placer compare runs cells quietly unless -v
        bar, task = progress_bar(budget.iterations) if progress and log.chatty() else (None, None)
        try:
            for it in range(budget.iterations):
                if not budget.may_start(it):
                    break
                self.iteration(it)
                if bar is not None:
                    (oom, ms, _, _) = self.best[0]
                    bar.update(task, advance=1, description=f"best {ms:.6g} s{' (OOM)' if oom else ''}")
            self.final_decode()
        finally:
            if bar is not None:
                bar.stop()
        return self.best


def train(torch, hm, env: RewardEnv, feats: dict, training: Training, gen, budget: TrainingBudget,
          history: list | None = None, on_best: Callable[[tuple], None] | None = None) -> tuple:
    """Build the policy and train it (the caller seeds torch's RNG and
    *gen*); returns ``best = ((oom, makespan, iteration, sample),
    unit->device list)`` and fills *budget*'s counters; *on_best* hears
    each new best as it is found."""
    policy = Policy(torch, hm, env, feats, training, gen)
    return Trainer(torch, policy, env, training, budget, history, on_best).run(training.progress)
