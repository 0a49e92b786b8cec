"""``alpa-stages``: Alpa's inter-operator pass (Zheng et al., "Alpa:
Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", OSDI'22, 5.2), the stage slicing and submesh assignment.

Alpa minimises the latency of one iteration of ``B`` micro-batches under a
synchronous 1F1B pipeline (Eq. 2)::

    T* = min over slicings { sum_i t_i + (B - 1) max_j t_j }

with ``t_i`` the time of stage ``i`` on its submesh (the intra-operator
pass's plan).  Algorithm 1 enumerates ``t_max`` (the largest stage time,
small to large, stopping once ``(B - 1) t_max`` exceeds the best ``T*``)
and, for each, solves the dynamic program of Eq. 3 over the ``K`` layers
and the ``D`` devices::

    F(s, k, d; t_max) = min_{k <= i <= K, submesh n <= d} { t_intra(k..i, n, s) + F(s - 1, i + 1, d - n; t_max)
                                                          | t_intra(k..i, n, s) <= t_max },   F(0, K+1, 0) = 0

where ``s`` counts the stages from layer ``k`` to the end: under 1F1B the
first of them holds ``s`` micro-batches' activations, so ``t_intra`` is
infinite when the stage's weights and ``s`` micro-batches' activations do
not fit a device (5.2, "memory").  The submeshes cover the cluster
exactly; on one host they are ``(1, 2^m)`` shapes (5.2).  Inter-stage
traffic is left out of the objective (5.2: the cross-mesh resharding is
assumed small).

This row, on placer's graph: the layers are at most ``-p layers`` groups
of consecutive forward operators of about equal time in the graph's own
topological order (Alpa's operator clustering, 5.2, groups operators into
layers of about equal FLOPs), each with the backward work attributed to
it; the cluster is one host of identical devices (the first device's
times; Alpa profiles one submesh shape on identical GPUs); a stage on a
submesh of ``n`` devices is data parallel over it (Alpa's intra-operator
pass searches a space in which data parallelism is one plan; this row has
no intra-operator ILP): ``t_intra = t / n`` + a ring all-reduce of the
stage's gradients over the mean bandwidth, each device holding the stage's
weights, gradients and optimizer state, and ``s / n`` micro-batches'
activations.  ``B`` = ``-p microbatches`` (default 4 x devices).  Stages on
submeshes of one size are replicated pipelines; mixed sizes take
micro-batches round-robin (:mod:`~celeritas_cli.pipelining.builder`).

Assumptions and what placer does about them: identical devices, a chain of
layers, traffic between stages ignored; placer's simulator judges the plan
with the real devices, links and memory over time, as every row.
"""

from __future__ import annotations

import math

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import ASSUME_BATCH, Param, register
from ...pipelining.cuts import stages_from_cuts
from ...pipelining.builder import check_pipelinable
from ...pipelining.layers import LayerSequence
from ...transform.batch import declared_batch
from .pipedream import mean_bandwidth
from ...pipelining.params import N_MICROBATCHES, step_microbatches
from ...pipelining.schedules import ONE_F_ONE_B
from .rows import realise

#: Algorithm 1's enumeration skips a t_max within this factor of the last one tried
T_MAX_STEP = 1.005


def submeshes(D: int) -> list[int]:
    """Submesh sizes on one host of *D* devices: ``1, 2, 4, ...`` up to *D*.

    >>> submeshes(4), submeshes(6)
    ([1, 2, 4], [1, 2, 4])
    """
    out, n = [], 1
    while n <= D:
        out.append(n)
        n *= 2
    return out


def solve(t_intra, L: int, D: int, B: int) -> tuple[float, list[int], list[int]] | None:
    """Algorithm 1 with Eq. 3: ``t_intra(k, i, n, s)`` the time of layers
    ``k..i`` on ``n`` devices as the first of ``s`` remaining stages (or
    ``math.inf``); returns ``(T*, first layer of each stage, devices of
    each stage)`` or None.

    >>> t = lambda k, i, n, s: (i - k + 1) / n
    >>> solve(t, 4, 2, 8)  # one stage on both devices: 2 + 7 x 2
    (16.0, [0], [2])
    >>> fits = lambda k, i, n, s: math.inf if i - k + 1 > 2 else (i - k + 1) / n  # at most 2 layers fit a device
    >>> solve(fits, 4, 2, 8)
    (18.0, [0, 2], [1, 1])
    """
    sizes = submeshes(D)
    values = sorted({x for k in range(L) for i in range(k, L) for n in sizes for s in range(1, D + 1)
                     if math.isfinite(x := t_intra(k, i, n, s))})
    if not values:
        return None
    best: tuple[float, list[int], list[int]] | None = None
    last = -1.0
    for t_max in values:
        if last > 0 and t_max < last * T_MAX_STEP:
            continue
        if best is not None and (B - 1) * t_max >= best[0]:
            break
        last = t_max
        got = _dp(t_intra, L, D, sizes, t_max)
        if got is not None and (best is None or got[0] + (B - 1) * t_max < best[0]):
            best = (got[0] + (B - 1) * t_max, got[1], got[2])
    return best


def _dp(t_intra, L: int, D: int, sizes: list[int], t_max: float):
    """Eq. 3 for one ``t_max``: ``(sum of stage times, firsts, devices)``."""
    INF = math.inf
    # F[s][k][d]: best sum for layers k..L-1 in s stages on exactly d devices
    F = [[[INF] * (D + 1) for _ in range(L + 1)] for _ in range(D + 1)]
    choice: dict[tuple, tuple] = {}
    F[0][L][0] = 0.0
    for s in range(1, D + 1):
        for k in range(L - 1, -1, -1):
            for d in range(1, D + 1):
                best, arg = INF, None
                for i in range(k, L):
                    for n in sizes:
                        if n > d:
                            break
                        rest = F[s - 1][i + 1][d - n]
                        if rest == INF:
                            continue
                        t = t_intra(k, i, n, s)
                        if t <= t_max and t + rest < best:
                            best, arg = t + rest, (i, n)
                F[s][k][d] = best
                if arg is not None:
                    choice[(s, k, d)] = arg
    s_best = min(range(1, D + 1), key=lambda s: (F[s][0][D], s))
    if F[s_best][0][D] == INF:
        return None
    firsts, devs, k, d = [], [], 0, D
    for s in range(s_best, 0, -1):
        i, n = choice[(s, k, d)]
        firsts.append(k)
        devs.append(n)
        k, d = i + 1, d - n
    return F[s_best][0][D], firsts, devs


@register("alpa-stages", paper="Alpa (Zheng et al., OSDI 2022)", section="5.2 (inter-operator pass: Eq. 2-3, "
                                                                        "Algorithm 1)",
          summary="Alpa's inter-operator pass: stages and submeshes by dynamic programming minimising "
                  "sum(stage time) + (B-1) max(stage time) under 1F1B, memory through the number of succeeding "
                  "stages; identical devices, traffic between stages ignored; stages on submeshes data-parallel.",
          params={"microbatches": N_MICROBATCHES,
                  "layers": Param(int, 16, "layers the operator sequence is clustered into", min=1, max=256),
                  "assume_batch": ASSUME_BATCH})
def alpa_stages(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                microbatches: int = N_MICROBATCHES.default, layers: int = 16, assume_batch: int = 0) -> Placement:
    """Alpa's stages of *graph* on *cluster* (module docstring).

    Parameters
    ----------
    graph : Graph
        A training graph that declares its batch.
    cluster : Cluster
    seed : int
        Unused (deterministic).
    costs : CostModel, optional
    microbatches : int
        ``B``; 0 = 4 x devices.
    layers : int
        ``K``, the layers of the operator clustering.
    assume_batch : int
        The batch of a graph that declares none.

    Returns
    -------
    Placement
        Judged by the simulator; ``estimate.alpa_objective_s`` is Alpa's ``T*``.

    Raises
    ------
    InvalidInput
        A coarse graph (:func:`~celeritas_cli.pipelining.builder.check_pipelinable`), a graph without a batch, or no slicing whose stages fit memory.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = alpa_stages(layered(60, seed=1), uniform(2), assume_batch=32)
    >>> p.estimate["schedule"], sum(p.estimate["replicas"]) <= 2
    ('1f1b', True)
    """
    check_pipelinable(graph)
    costs = cost_model(graph, cluster, costs)
    batch = declared_batch(graph, assume_batch or None, what="Alpa's micro-batches")
    n_microbatches = step_microbatches(microbatches, batch, cluster.k)  # Alpa's B
    seq = LayerSequence(graph, cluster, costs, order="topo")
    bounds = seq.layer_bounds(layers)
    L = len(bounds) - 1
    f = 1.0 / n_microbatches
    t = seq.times(f)
    c = seq.class_of[0]
    bw = mean_bandwidth(cluster)
    memory = min(d.memory for d in cluster.devices)
    D = cluster.k

    def t_intra(k: int, i: int, n: int, s: int) -> float:
        a, b = bounds[k], bounds[i + 1]
        if n > 1 and n_microbatches % n:
            return math.inf
        mem = (seq.resident[b] - seq.resident[a]) + (seq.gradients[b] - seq.gradients[a]) + \
            math.ceil(s * f / n * (seq.activation[b] - seq.activation[a]))
        if mem > memory:
            return math.inf
        fw, bwd, _ = t.stage(c, a, b)
        grads = seq.gradients[b] - seq.gradients[a]
        return (fw + bwd) / n + (2 * (n - 1) / n * grads / bw if n > 1 else 0.0)

    got = solve(t_intra, L, D, n_microbatches)
    if got is None:
        raise InvalidInput(f"alpa-stages: no slicing of graph '{graph.name}' fits Alpa's memory model on cluster "
                           f"'{cluster.name}' ({memory / 2**30:.1f} GiB per device)")
    objective, firsts, devs = got
    stage_of = stages_from_cuts(graph, seq.fwd, [bounds[x] for x in firsts])
    est = {"alpa_objective_s": objective, "objective": "sum(stage time) + (B-1) max(stage time) (Alpa OSDI'22 "
           "Eq. 2)", "layers": L, "submeshes": devs}
    return realise(graph, cluster, costs, stage_of, devs, n_microbatches, batch, ONE_F_ONE_B,
                   assume_batch=assume_batch or None, split=True, algorithm="alpa-stages",
                   params={"microbatches": n_microbatches, "layers": layers}, estimate=est)
