"""What the peers' pipeline rows (``gpipe``, ``pipedream``, ``alpa-stages``)
share: how many micro-batches they run, how their stages become devices,
and the judgement of the plan they chose by placer's simulator.

Each peer decides with its own model and objective (its module); this
module only turns the decision into a placement the simulator judges like
every other row: :func:`realise` gives stage ``s`` the next ``r_s``
devices in the cluster's order (the peers assume identical devices, so
which device gets which stage is theirs to ignore) and builds the pipeline
with :func:`~celeritas_cli.pipelining.builder.staged_plan` (stages replicated
alike: replicated pipelines; unevenly: round-robin lanes, said in
``estimate.deviation``); :func:`judged` simulates it on its derived graph
under the time memory rule, as ``placer simulate`` does.
"""

from __future__ import annotations

from typing import Sequence

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.placement import Placement
from ...optimize.evaluator import Evaluator
from ...sim.describe import pipeline_words
from ...pipelining.builder import derive_pipeline, judged_by_kind, layout, placement_of, plan_estimate, plan_shape
from ...pipelining.schedules import Schedule


def replica_microbatches(n_microbatches: int, batch: int, R: int) -> int:
    """Micro-batches per replica when the step's *n_microbatches* are
    shared by *R* replicated pipelines: every micro-batch of the global
    batch splits into *R* whole samples (the largest count ``<=
    n_microbatches / R`` for which ``batch / count`` is a multiple of *R*).

    >>> replica_microbatches(16, 256, 2), replica_microbatches(16, 16, 4)
    (8, 4)
    """
    for c in range(max(1, n_microbatches // R), 0, -1):
        if batch % c == 0 and (batch // c) % R == 0:
            return c
    raise InvalidInput(f"the batch of {batch} samples does not split into {R} replicas of whole samples")


def realise(graph, cluster: Cluster, costs: CostModel, stage_of: Sequence[int], replicas: Sequence[int],
            n_microbatches: int, batch: int, schedule: Schedule, *, recompute: Sequence[str] = (), except_last: bool = False,
            assume_batch: int | None = None, split: bool = False, algorithm: str, params: dict,
            estimate: dict) -> Placement:
    """The placement of a peer's plan (module docstring): stage ``s`` on the
    next ``replicas[s]`` devices in the cluster's order, *n_microbatches*
    micro-batches of the step.  Stages replicated alike: with *split*,
    every micro-batch is split over a stage's devices (Alpa's submesh), so
    each replica runs *n_microbatches*; without, the replicas share them
    (PipeDream's replicated stages), each running about
    ``n_microbatches / R``.

    Raises
    ------
    InvalidInput
        More devices than the cluster has, and what
        :func:`~celeritas_cli.pipelining.builder.derive_pipeline` refuses.
    """
    if sum(replicas) > cluster.k:
        raise InvalidInput(f"{algorithm}: the plan needs {sum(replicas)} devices, cluster '{cluster.name}' has "
                           f"{cluster.k}")
    groups, at = [], 0
    for r in replicas:
        groups.append(list(range(at, at + r)))
        at += r
    uniform = len(set(replicas)) == 1
    R = replicas[0] if uniform else 1
    per_replica = replica_microbatches(n_microbatches * (R if split else 1), batch, R) if R > 1 else n_microbatches
    p, v, reps = plan_shape(groups, schedule)
    d = derive_pipeline(graph, stage_of, reps, per_replica, schedule, v, recompute=recompute, except_last=except_last,
                        assume_batch=assume_batch, symmetric=judged_by_kind(cluster))
    device_of, order = layout(d, stage_of, groups, schedule, cluster.k)
    score, _ = Evaluator(d.graph, cluster, costs.for_graph(d.graph)).evaluate(device_of, order)
    est = {"makespan_s": score.makespan, "makespan_by": "simulator", "status": "FEASIBLE" if score.feasible else "OOM",
           "judge": "simulator", **plan_estimate(d, groups, cluster, schedule, per_replica), **estimate}
    rc = {s for s, _ in enumerate(groups) if any(stage_of[graph.index[x]] == s for x in recompute)} if recompute \
        else set()
    est["recomputed_stages"] = sorted(rc) if d.recomputed else []
    est["plan"] = pipeline_words(est, lambda x: cluster.devices[cluster.index[x]].type)
    return placement_of(d, cluster, device_of, order, algorithm=algorithm, seed=0, estimate=est,
                        params={"microbatches": per_replica, "schedule": schedule.name, **params}, devs=groups)
