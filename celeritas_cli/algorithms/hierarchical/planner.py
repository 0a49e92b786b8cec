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

1. operation features (:func:`op_features`): op-type index (for a trainable
   type embedding), output sizes and number of outputs, adjacency, plus
   compute / memory / topological position (see *Deviations*);
2. the Grouper samples a group for every colocation unit;
3. group embeddings (mean type embedding, mean size features, intra/inter
   group adjacency) are fed to the Placer, which samples a device per group;
4. each of the ``samples_per_iteration`` joint samples is simulated; reward
   ``R = -sqrt(runtime)``; both networks are updated by REINFORCE with a
   moving-average baseline (HRL's cost function J(theta_g, theta_d)).

Time budget: training stops after ``iterations`` (default 1000, the paper's
section 3) or ``time_limit`` seconds (default 60; ``placer place
--time-limit S``), whichever comes first.  One iteration costs one Placer
decode of M steps with content-based attention over M groups (O(M^2 H) per
sample) plus ``samples_per_iteration`` simulations: on one shared CPU
thread about 0.25 s for a 200-node coarse graph (M = 84 units) and about
1 s for M = 256 with 8 samples, so the default budget trains about 250
and 60 iterations respectively.  Use a coarse graph (``placer coarsen``)
of a few hundred nodes; the paper's policy needed hours on real hardware
(Celeritas Table 4 charges HRL 5 hours).

Example
-------
``placer coarsen g.json | placer place --algo hierarchical --time-limit 60
-p samples_per_iteration=8 --simulate > p.json``
"""

from __future__ import annotations

import math
import time
from typing import Any

from ...errors import InvalidInput, MissingDependency
from ...log import chatty
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.limits import TIME_MAX
from ...model.placement import Placement
from ...registry import Param, register
from ...sim.simulator import CONGESTION_RULES, lower_bound, run_schedule

MAX_OUTPUTS = 5
"""Output tensors per op encoded in the features (the released controller's
``max_num_outputs``)."""
ADJ_DIM = 20
"""Width of the adjacency feature (the released controller's ``adj_embed_dim``)."""
TYPE_DIM = 16
"""Size of the trainable op-type embedding."""
BASELINE_DECAY = 0.9
"""Moving-average baseline decay (``bl_dec``)."""
GRAD_BOUND = 1.0
"""Global gradient-norm clip (``grad_bound``)."""
LOGITS_NOISE = 0.5
"""Exploration noise on the logits (``logits_std_noise``), relative to their RMS."""
NOISE_FRACTION = 0.75
"""Noise is applied during the first 75 % of the iterations (``stop_noise_step``
750 of 1000)."""
SIZE_DIM = MAX_OUTPUTS + 4  # output sizes, output count, compute, memory, topo position


def _units(graph: Graph) -> tuple[list[int], int]:
    """Colocation units: nodes sharing a colocation value form one unit,
    every other node is its own unit; units are numbered by their first node
    index.  Returns ``(unit_of, number_of_units)``."""
    unit_of = [0] * graph.n
    seen: dict[str, int] = {}
    u = 0
    for v in range(graph.n):
        c = graph.colocation[v]
        if c is not None:
            if c in seen:
                unit_of[v] = seen[c]
                continue
            seen[c] = u
        unit_of[v] = u
        u += 1
    return unit_of, u


def op_features(graph: Graph, costs: CostModel | None = None) -> dict[str, Any]:
    """Per-operation features of HRL section 2 ("type, size and number of
    outputs, as well as connections to other operations"), pure Python.

    Parameters
    ----------
    graph : Graph
    costs : CostModel, optional
        For the mean node time (defaults to ``graph.compute``).

    Returns
    -------
    dict
        ``types`` (sorted distinct op names), ``type_idx[v]``,
        ``size[v]`` (``SIZE_DIM`` floats: the node's output tensor sizes,
        ``log1p(bytes) / log1p(largest tensor)``, largest first, up to
        ``MAX_OUTPUTS``, zero-padded; the number of outputs / the largest
        count; compute / largest; memory / largest; (topo index + 1) / n),
        ``adj[v]`` (``ADJ_DIM`` floats: the released controller's encoding,
        pairs ``(neighbour position, +1)`` for successors then ``(position,
        -1)`` for predecessors, truncated / zero-padded, with positions
        ``(topo index + 1) / n`` so 0 means "none").

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "op": "mm"},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0, "op": "relu"}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> f = op_features(g)
    >>> f["types"], f["type_idx"], f["size"][0][:MAX_OUTPUTS + 1], f["adj"][0][:4]
    (['mm', 'relu'], [0, 1], [1.0, 0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    """
    n = graph.n
    types = sorted(set(graph.op))
    tindex = {t: i for i, t in enumerate(types)}
    outs: list[list[int]] = [[] for _ in range(n)]
    for t, p in enumerate(graph.tensor_src):
        outs[p].append(graph.tensor_bytes[t])
    max_bytes = max(graph.tensor_bytes, default=0)
    lmax = math.log1p(max_bytes) if max_bytes > 0 else 1.0
    max_cnt = max((len(o) for o in outs), default=0) or 1
    comp = costs.mean_time if costs is not None else graph.compute
    cmax = max(comp, default=0.0) or 1.0
    mmax = max(graph.memory, default=0) or 1
    pos = graph.topo_index()
    size: list[list[float]] = []
    adj: list[list[float]] = []
    for v in range(n):
        sizes = sorted(outs[v], reverse=True)[:MAX_OUTPUTS]
        row = [math.log1p(b) / lmax for b in sizes] + [0.0] * (MAX_OUTPUTS - len(sizes))
        row += [len(outs[v]) / max_cnt, comp[v] / cmax, graph.memory[v] / mmax, (pos[v] + 1) / n]
        size.append(row)
        a: list[float] = []
        for s in graph.succ[v]:
            a += [(pos[s] + 1) / n, 1.0]
        for p in graph.pred[v]:
            a += [(pos[p] + 1) / n, -1.0]
        a = a[:ADJ_DIM]
        adj.append(a + [0.0] * (ADJ_DIM - len(a)))
    return {"types": types, "type_idx": [tindex[o] for o in graph.op], "size": size, "adj": adj}


def default_groups(graph: Graph) -> int:
    """HRL's number of groups M (a hyperparameter): 256, or fewer when the
    graph has fewer colocation units than that."""
    return max(1, min(256, _units(graph)[1]))


def oom_runtime(graph: Graph, cluster: Cluster, costs: CostModel, penalty: float) -> float:
    """The runtime charged to a placement that does not fit in memory
    (HRL's ``failing_signal``): ``penalty`` times an upper bound on the
    simulated makespan of *any* placement, ``sum_v max_d time(v, d) +
    sum_t (k - 1) * max_{a != c} comm(t, a, c)`` (at every instant of a
    simulation some node computes or some transfer moves, so the makespan
    never exceeds total work plus total transfer time)."""
    k = cluster.k
    work = math.fsum(costs.max_time)
    comm = 0.0
    if k > 1:
        for t in range(len(graph.tensor_src)):
            worst = max(costs.tensor_comm(t, a, c) for a in range(k) for c in range(k) if a != c)
            comm += (k - 1) * worst
    return penalty * max(work + comm, 1e-12)


@register(
    "hierarchical", paper="Hierarchical Planner (HRL)", section="section 2, Figure 1",
    summary="Learned Grouper (feed-forward) + seq2seq Placer (LSTM + attention) trained with REINFORCE "
            "on R=-sqrt(simulated runtime); OOM samples get a large fixed penalty.",
    params={
        "groups": Param(int, 0, "number of groups M; 0 = min(256, colocation units)", min=0, max=65536),
        "iterations": Param(int, 1000, "policy updates (HRL trains 1000)", min=1),
        "samples_per_iteration": Param(int, 8, "joint placements sampled (and simulated) per update", min=1,
                                       max=4096),
        "time_limit": Param(float, 60.0, "stop training after this many seconds (0 = no limit)", min=0,
                            max=TIME_MAX),
        "lr": Param(float, 0.05, "Adam learning rate", gt=0, max=10.0),
        "hidden": Param(int, 64, "hidden width of the Grouper and the Placer LSTMs", min=1, max=4096),
        "oom_penalty": Param(float, 2.0, "OOM runtime as a multiple of an upper bound on any makespan",
                             min=1.0, max=1e6),
        "congestion": Param(str, "channel", "simulator congestion rule for the reward",
                            choices=CONGESTION_RULES),
        "progress": Param(bool, True, "show best simulated runtime on stderr"),
    },
    extra="torch",
    quick_params={"iterations": 5, "samples_per_iteration": 2, "hidden": 16, "time_limit": 20.0,
                  "progress": False},
)
def hierarchical(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                 groups: int = 0, iterations: int = 1000,
                 samples_per_iteration: int = 8, time_limit: float = 60.0, lr: float = 0.05, hidden: int = 64,
                 oom_penalty: float = 2.0, congestion: str = "channel", progress: bool = True) -> Placement:
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
    iterations, samples_per_iteration : int
        Policy updates and joint samples per update.
    time_limit : float
        Seconds; training stops after the first iteration that ends past it
        (0: no limit).  Deterministic for a seed only when ``iterations``,
        not the clock, ends training.
    lr, hidden : float, int
        Adam learning rate; network width.
    oom_penalty : float
        See :func:`oom_runtime`.
    congestion : str
        Simulator congestion rule used for the reward.
    progress : bool
        A rich progress bar with the best simulated runtime on stderr.

    Returns
    -------
    Placement
        The sample with the lowest simulated makespan among memory-feasible
        ones (if any; otherwise the lowest among all samples, reported with
        ``status`` ``"OOM"`` - the failure Celeritas Figure 1 shows).  The
        final greedy (arg-max) decode of the trained policy is a candidate
        too.  ``estimate`` holds ``makespan_s``, ``status``,
        ``lower_bound_s``, ``iterations``, ``samples``, ``groups``,
        ``training_time_s`` and ``best_iteration``.

    Raises
    ------
    MissingDependency
        torch is not installed.
    InvalidInput
        A non-positive iteration / sample / hidden count or negative groups.

    Notes
    -----
    Readings chosen where the paper is silent (documented per the project
    rules):

    * Colocation: the Grouper decides per *colocation unit* (all nodes of a
      colocation group, or a lone node): a unit's logits are the mean of its
      nodes' logits and it contributes one log-probability term.  Groups map
      to one device each, so no placement ever splits a colocation group.
    * OOM: HRL's released controller gives a failed (ResourceExhausted)
      placement a fixed runtime ``failing_signal`` (100 s) instead of a
      measurement; Celeritas section 2 ("HRL albeit sets a large penalty for
      OOM occurrences, it provides no solution").  Our failing runtime is
      scale-free: :func:`oom_runtime`, ``oom_penalty`` x an upper bound on
      any simulated makespan, so an OOM sample is always worse than every
      feasible one; all OOM samples get the same reward (no gradient
      towards "less OOM", exactly the weakness Celeritas points out).
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
      iterations (``stop_noise_step`` 750 of 1000).
    * Determinism: one CPU thread (``torch.set_num_threads(1)``, restored
      afterwards), parameters seeded with ``torch.manual_seed`` inside
      ``torch.random.fork_rng`` (the caller's RNG state is untouched), all
      sampling from a private ``torch.Generator``.  Every op used (Linear,
      LSTM, index_add, multinomial, randn) is deterministic on CPU, so we do
      not call ``torch.use_deterministic_algorithms``, whose first call
      imports torch._inductor (~3.5 s, which would be billed as placement
      time).
    * Not reproduced: the distributed controllers/workers and the
      learning-rate decay of the released code.

    References
    ----------
    Mirhoseini et al., "A Hierarchical Model for Device Placement" (ICLR
    2018), section 2 (Grouper, Placer, group embeddings, R_d = -sqrt(r),
    J(theta_g, theta_d), REINFORCE), section 3 (1000 iterations).
    Williams 1992 (REINFORCE); Bahdanau et al. 2015 (attention).
    Celeritas section 2 / Figure 1 (HRL and OOM).
    """
    try:
        import torch
    except ImportError:
        raise MissingDependency("algorithm 'hierarchical' needs torch: pip install -e .[torch]") from None
    from . import model as hm

    if iterations < 1 or samples_per_iteration < 1 or hidden < 2:
        raise InvalidInput("'hierarchical': iterations, samples_per_iteration must be >= 1 and hidden >= 2")
    if groups < 0:
        raise InvalidInput(f"'hierarchical' parameter groups: must be >= 0 (0 = auto), got {groups}")
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"'hierarchical' parameter congestion: must be one of {', '.join(CONGESTION_RULES)}")

    t0 = time.perf_counter()
    n, k = graph.n, cluster.k
    costs = cost_model(graph, cluster, costs)
    unit_of, n_units = _units(graph)
    unit_mem = [0] * n_units
    for v in range(n):
        unit_mem[unit_of[v]] += graph.memory[v]
    capacity = [d.memory for d in cluster.devices]
    lb = lower_bound(graph, cluster, costs) if n else 0.0
    M = groups or default_groups(graph)
    params_used = {"groups": M}

    cache: dict[bytes, float] = {}

    def fits(dev_unit: list[int]) -> bool:
        """Whether a unit->device map respects every device's memory."""
        loads = [0] * k
        for u, d in enumerate(dev_unit):
            loads[d] += unit_mem[u]
        return all(loads[d] <= capacity[d] for d in range(k))

    def makespan(dev_unit: list[int]) -> float:
        """Simulated makespan of a unit->device map (memoised)."""
        key = bytes(dev_unit) if k < 256 else repr(dev_unit).encode()
        ms = cache.get(key)
        if ms is None:
            device_of = [dev_unit[unit_of[v]] for v in range(n)]
            ms = run_schedule(graph, cluster, device_of, congestion=congestion, costs=costs).makespan
            cache[key] = ms
        return ms

    def result(dev_unit: list[int], ms: float, ok: bool, extra: dict) -> Placement:
        device_of = [dev_unit[unit_of[v]] for v in range(n)]
        est = {"makespan_s": ms, "status": "FEASIBLE" if ok else "OOM", "lower_bound_s": lb,
               "groups": M, "training_time_s": time.perf_counter() - t0, **extra}
        return Placement.from_indices(graph, cluster, device_of, algorithm="hierarchical", seed=seed,
                                      params=params_used, estimate=est)

    if n == 0 or k == 1:
        dev_unit = [0] * n_units
        return result(dev_unit, makespan(dev_unit) if n else 0.0, fits(dev_unit),
                      {"iterations": 0, "samples": 1, "best_iteration": 0})

    feats = op_features(graph, costs)
    T_ref = math.fsum(costs.mean_time) or 1.0
    fail_r = oom_runtime(graph, cluster, costs, oom_penalty)

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            best, done, n_samples = _train(
                torch, hm, graph, feats, unit_of, n_units, M, k, iterations, samples_per_iteration,
                time_limit, lr, hidden, gen, fits, makespan, fail_r, T_ref, t0, progress)
    finally:
        torch.set_num_threads(prev_threads)
    (oom, ms, it, _), dev_unit = best
    return result(dev_unit, ms, not oom, {"iterations": done, "samples": n_samples, "best_iteration": it})


def _train(torch, hm, graph, feats, unit_of, n_units, M, k, iterations, S, time_limit, lr, hidden, gen,
           fits, makespan, fail_r, T_ref, t0, progress):
    """The REINFORCE loop; returns ``(best, iterations_done, samples)`` with
    ``best = ((oom, makespan, iteration, sample), unit->device list)``."""
    type_idx = torch.tensor(feats["type_idx"], dtype=torch.long)
    size_t = torch.tensor(feats["size"], dtype=torch.float32)
    node_x = torch.cat([size_t, torch.tensor(feats["adj"], dtype=torch.float32)], dim=1)
    unit_t = torch.tensor(unit_of, dtype=torch.long)
    bmax = max(graph.edge_bytes, default=0) or 1
    e_src = torch.tensor(graph.edge_src, dtype=torch.long)
    e_dst = torch.tensor(graph.edge_dst, dtype=torch.long)
    e_w = torch.tensor([b / bmax for b in graph.edge_bytes], dtype=torch.float32)

    grouper = hm.Grouper(len(feats["types"]), TYPE_DIM, node_x.shape[1], hidden, M)
    emb_dim = TYPE_DIM + size_t.shape[1] + 1 + 2 * M
    placer = hm.Placer(emb_dim, hidden, k)
    params = list(grouper.parameters()) + list(placer.parameters())
    opt = torch.optim.Adam(params, lr=lr)

    def policy(samples: int, greedy: bool, noise: float = 0.0):
        logp_unit = grouper(type_idx, node_x, unit_t, n_units, noise=noise, generator=gen)  # [U, M]
        if greedy:
            g_unit = logp_unit.argmax(dim=1).unsqueeze(0)  # [1, U]
        else:
            g_unit = torch.multinomial(logp_unit.exp(), samples, replacement=True, generator=gen).t()  # [S, U]
        lp_group = logp_unit.gather(1, g_unit.t()).sum(dim=0)  # [S]
        node_group = g_unit[:, unit_t]  # [S, n]
        emb = hm.group_embeddings(node_group, grouper.type_emb(type_idx), size_t, e_src, e_dst, e_w, M)
        dev_group, lp_place = placer(emb, generator=gen, greedy=greedy, noise=noise)  # [S, M]
        dev_unit = torch.gather(dev_group, 1, g_unit)  # [S, U]
        return dev_unit, lp_group + lp_place

    best: tuple | None = None
    baseline: float | None = None
    n_samples = 0
    done = 0
    bar = task = None
    if progress and chatty():  # placer compare runs cells quietly unless -v
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from ...log import stderr_console

        bar = Progress(TextColumn("hierarchical"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.description}"), console=stderr_console(), transient=False)
        bar.start()
        task = bar.add_task("best -", total=iterations)

    def consider(key, dev_unit):
        nonlocal best
        if best is None or key < best[0]:
            best = (key, list(dev_unit))

    try:
        for it in range(iterations):
            noisy = it < NOISE_FRACTION * iterations
            dev_unit_t, logp = policy(S, greedy=False, noise=LOGITS_NOISE if noisy else 0.0)
            rows = dev_unit_t.tolist()
            rewards = []
            for s, dev_unit in enumerate(rows):
                n_samples += 1
                if fits(dev_unit):
                    ms = makespan(dev_unit)
                    r = ms
                    consider((False, ms, it, s), dev_unit)
                else:
                    r = fail_r
                    if best is None or best[0][0]:  # no feasible sample yet: keep the best OOM one
                        consider((True, makespan(dev_unit), it, s), dev_unit)
                rewards.append(-math.sqrt(r / T_ref))
            mean_r = math.fsum(rewards) / len(rewards)
            b = mean_r if baseline is None else baseline
            adv = torch.tensor([r - b for r in rewards], dtype=torch.float32)
            loss = -(adv * logp).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, GRAD_BOUND)
            opt.step()
            baseline = BASELINE_DECAY * b + (1 - BASELINE_DECAY) * mean_r
            done = it + 1
            if bar is not None:
                (oom, ms, _, _) = best[0]
                bar.update(task, advance=1, description=f"best {ms:.6g} s{' (OOM)' if oom else ''}")
            if time_limit and time.perf_counter() - t0 >= time_limit:
                break
        with torch.no_grad():
            dev_unit_t, _ = policy(1, greedy=True)
        dev_unit = dev_unit_t[0].tolist()
        ok = fits(dev_unit)
        n_samples += 1
        if ok or best[0][0]:
            consider((not ok, makespan(dev_unit), done, -1), dev_unit)
    finally:
        if bar is not None:
            bar.stop()
    return best, done, n_samples

