"""``pipedream``: PipeDream's planner (Narayanan et al., "PipeDream:
Generalized Pipeline Parallelism for DNN Training", SOSP'19, 3.1), run
synchronously as PipeDream-Flush (1F1B with a flush, Narayanan et al.,
"Memory-Efficient Pipeline-Parallel DNN Training", ICML'21, and SC'21
2.2.1).

The planner (3.1, and ``optimizer/optimizer_graph_hierarchical.py`` of its
release) partitions a chain of ``L`` layers over ``N`` identical workers
into stages, each replicated over some workers (data parallelism inside the
stage), minimising the time of the slowest stage - in steady state an
asynchronous pipeline finishes one minibatch per slowest-stage time, with no
bubble.  With ``A(j, m)`` the slowest stage of the best pipeline of layers
``1..j`` on ``m`` workers, ``T(i -> j, m)`` layers ``i..j`` as one stage
replicated ``m`` times, ``C_i`` the activation bytes between layers ``i``
and ``i + 1`` over the bandwidth::

    T(i -> j, m) = (sum_l T_l + 4 (m - 1) |w_i..j| / (m B)) / m        (compute + weight sync, per replica)
    A(j, m) = min( T(1 -> j, m),
                   min_{i < j, 1 <= m' < m} max(A(i, m - m'), 2 C_i / m', T(i+1 -> j, m')) )

subject to the stage's stashed data fitting a worker: ``ceil((N - m) / m')``
copies of the stage's activations and weights (``NOAM``: the minibatches a
stage keeps in flight under 1F1B-RR with weight stashing) at most the
memory size.  (The released optimizer adds the transfer term only with
activation compression; the paper's equation has it, and so does this row.)

This row, on placer's graph: the layers are at most ``-p layers`` groups of
consecutive forward operators of about equal time in the graph's own
topological order (:meth:`~celeritas_cli.pipelining.layers.LayerSequence.layer_bounds`),
each with the backward work attributed to it; ``T_l`` its forward +
backward time of one micro-batch on the cluster's first device (PipeDream's
profiler measures one GPU); ``|w|`` its parameter (gradient) bytes; ``B``
the mean bandwidth between distinct devices (one network level, as
PipeDream is given), the memory size the smallest device's.  The plan runs
synchronously - PipeDream-Flush: ``m`` micro-batches (``-p microbatches``,
default ``4 N``), 1F1B, a flush, one optimizer step - because asynchronous
weight updates change the training itself; ``estimate`` reports the
asynchronous steady state separately (``async_minibatch_s``: one
micro-batch per ``A(L, N)`` seconds; ``async_batch_s``: the step's ``m``
micro-batches at that rate), never as a step time.  Stages replicated alike
are replicated pipelines; unevenly replicated stages take micro-batches
round-robin (PipeDream's 1F1B-RR, 3.3) - see
:mod:`~celeritas_cli.pipelining.builder` for how their gradients meet.

Assumptions and what placer does about them: identical devices and one
bandwidth (the simulator times each stage on its device and each transfer
on its link), a chain of layers (one topological order of the DAG), no
bubble (the synchronous run has one, which the simulator counts).
"""

from __future__ import annotations

import math

from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import ASSUME_BATCH, Param, register
from ...pipelining.cuts import stages_from_cuts
from ...pipelining.builder import check_pipelinable
from ...pipelining.layers import LayerSequence
from ...transform.batch import declared_batch
from ...pipelining.params import N_MICROBATCHES, step_microbatches
from ...pipelining.schedules import ONE_F_ONE_B
from .rows import realise

LAYERS = Param(int, 64, "layers the operator sequence is grouped into for the planner's dynamic program", min=1,
               max=1024)


def mean_bandwidth(cluster: Cluster) -> float:
    """Mean bandwidth over ordered pairs of distinct devices (bytes/s)."""
    k = cluster.k
    bws = [cluster.bandwidth[a][b] for a in range(k) for b in range(k) if a != b]
    return sum(bws) / len(bws) if bws else math.inf


def plan(compute: list[float], act: list[float], params: list[float], out_act: list[float], N: int,
         bandwidth: float, memory: float) -> tuple[float, list[int], list[int]] | None:
    """PipeDream's dynamic program (module docstring) over ``L`` layers with
    per-layer ``compute`` time, stashed ``act`` bytes, ``params`` bytes and
    ``out_act`` bytes sent to the next layer: ``(A(L, N), first layer of
    each stage, replicas of each stage)``, or None when nothing fits.

    >>> plan([1.0, 1.0, 1.0, 1.0], [0] * 4, [0] * 4, [0] * 4, 2, 1e9, 1e9)  # one stage, 2 replicas
    (2.0, [0], [2])
    >>> plan([1.0, 1.0, 1.0, 1.0], [0] * 4, [4e9, 0, 0, 0], [0] * 4, 2, 1e9, 1e18)  # weight sync: 2 stages
    (2.0, [0, 2], [1, 1])
    """
    L = len(compute)
    pc, pa, pp = [0.0], [0.0], [0.0]
    for c, a, w in zip(compute, act, params):
        pc.append(pc[-1] + c)
        pa.append(pa[-1] + a)
        pp.append(pp[-1] + w)

    def stage(i: int, j: int, m: int, copies: int) -> float | None:  # layers i..j on m replicas
        w = pp[j + 1] - pp[i]
        if copies * (pa[j + 1] - pa[i] + w) > memory:
            return None
        return (pc[j + 1] - pc[i] + 4 * (m - 1) * w / (bandwidth * m)) / m

    A: list[list[tuple | None]] = [[None] * (N + 1) for _ in range(L)]
    for j in range(L):
        for m in range(1, N + 1):
            t = stage(0, j, m, math.ceil((N - m) / m))
            if t is not None:
                A[j][m] = (t, None, m)
    for m in range(2, N + 1):
        for j in range(1, L):
            best = A[j][m]
            for k in range(j):
                for mp in range(1, m):
                    prev = A[k][m - mp]
                    if prev is None:
                        continue
                    last = stage(k + 1, j, mp, math.ceil((N - m) / mp))
                    if last is None:
                        continue
                    t = max(prev[0], last, 2.0 * out_act[k] / (bandwidth * mp))
                    if best is None or t < best[0]:
                        best = (t, (k, m - mp), mp)
            A[j][m] = best
    top = A[L - 1][N]
    if top is None:
        return None
    firsts, reps = [], []
    j, m, cur = L - 1, N, top
    while True:
        reps.append(cur[2])
        if cur[1] is None:
            firsts.append(0)
            break
        k, rest = cur[1]
        firsts.append(k + 1)
        j, m, cur = k, rest, A[k][rest]
    return top[0], firsts[::-1], reps[::-1]


@register("pipedream", paper="PipeDream (Narayanan et al., SOSP 2019) as PipeDream-Flush (ICML 2021)",
          section="3.1 (planner DP), 3.3 (1F1B-RR); run as 1F1B with a flush",
          summary="PipeDream's planner: a dynamic program over the layer chain with replicated stages "
                  "minimising the slowest stage (identical workers, one bandwidth), run synchronously as "
                  "PipeDream-Flush 1F1B; its asynchronous steady state is reported apart.",
          params={"microbatches": N_MICROBATCHES, "layers": LAYERS, "assume_batch": ASSUME_BATCH})
def pipedream(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
              microbatches: int = N_MICROBATCHES.default, layers: int = 64, assume_batch: int = 0) -> Placement:
    """PipeDream's plan of *graph* on *cluster*, run as PipeDream-Flush
    (module docstring).

    Parameters
    ----------
    graph : Graph
        A training graph that declares its batch.
    cluster : Cluster
    seed : int
        Unused (deterministic).
    costs : CostModel, optional
    microbatches : int
        Micro-batches of the step (PipeDream's minibatches); 0 = 4 x devices.
    layers : int
        Layers of the planner's chain.
    assume_batch : int
        The batch of a graph that declares none.

    Returns
    -------
    Placement
        Judged by the simulator (``makespan_s``, ``status``); ``estimate``
        also has the stages, their replicas and the asynchronous steady
        state (``async_minibatch_s``, ``async_batch_s``).

    Raises
    ------
    InvalidInput
        A coarse graph (:func:`~celeritas_cli.pipelining.builder.check_pipelinable`), a graph without a batch, no plan whose stages fit the memory size,
        or stages that do not form a chain.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = pipedream(layered(60, seed=1), uniform(2), assume_batch=32)
    >>> p.estimate["schedule"], sum(p.estimate["replicas"]), p.estimate["async_minibatch_s"] > 0
    ('1f1b', 2, True)
    """
    from ...errors import InvalidInput

    check_pipelinable(graph)
    costs = cost_model(graph, cluster, costs)
    batch = declared_batch(graph, assume_batch or None, what="PipeDream's micro-batches")
    n_microbatches = step_microbatches(microbatches, batch, cluster.k)
    seq = LayerSequence(graph, cluster, costs, order="topo")
    bounds = seq.layer_bounds(layers)
    f = 1.0 / n_microbatches
    t = seq.times(f)
    c = seq.class_of[0]
    L = len(bounds) - 1
    spans = list(zip(bounds, bounds[1:]))
    compute = [sum(t.stage(c, a, b)[:2]) for a, b in spans]
    act = [f * (seq.activation[b] - seq.activation[a]) for a, b in spans]
    params = [seq.gradients[b] - seq.gradients[a] for a, b in spans]
    out_act = [f * seq.cross_fwd[b] for _, b in spans]
    bw = mean_bandwidth(cluster)
    memory = min(d.memory for d in cluster.devices)
    got = plan(compute, act, params, out_act, min(cluster.k, L * cluster.k), bw, memory)
    if got is None:
        raise InvalidInput(f"pipedream: no stage of graph '{graph.name}' fits PipeDream's memory model on cluster "
                           f"'{cluster.name}' ({memory / 2**30:.1f} GiB per device)")
    slowest, firsts, reps = got
    cuts = [bounds[x] for x in firsts]
    stage_of = stages_from_cuts(graph, seq.fwd, cuts)
    est = {"async_minibatch_s": slowest, "async_batch_s": slowest * n_microbatches,
           "async_note": "PipeDream's asynchronous steady state (1F1B-RR, stale weights): one micro-batch per "
                         "async_minibatch_s; not a step time",
           "objective": "slowest stage (PipeDream SOSP'19 3.1)", "layers": L, "bandwidth_Bps": bw}
    return realise(graph, cluster, costs, stage_of, reps, n_microbatches, batch, ONE_F_ONE_B,
                   assume_batch=assume_batch or None, algorithm="pipedream",
                   params={"microbatches": n_microbatches, "layers": layers}, estimate=est)
