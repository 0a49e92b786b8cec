"""Pipeline and hybrid placements of captured steps, made by hand for the run tests."""

from __future__ import annotations

from celeritas_cli.model.graph import Graph
from celeritas_cli.model.placement import Placement
from celeritas_cli.pipelining.builder import pipeline_orders
from celeritas_cli.transform.derivation import apply_step, attach, data_parallel_step
from celeritas_cli.transform.microbatch import microbatch_graph, microbatch_step


def hybrid_plan(graph: Graph, cluster, stage_of: list[int], m: int, schedule: str, k: int,
                dp_first: bool = False, bucket_mb: float = 0.0) -> Placement:
    """``k`` replicas of a pipeline of ``S = max(stage_of) + 1`` stages, replica ``r``'s stage ``s`` on device
    ``r * S + s``.  Micro-batched then replicated (replicated pipelines): every device follows its pipeline's
    *schedule* (:func:`pipeline_orders`), the ring all-reduce nodes before the once-per-step tail.  Replicated
    then micro-batched (*dp_first*): no order (the simulator's rule).  *bucket_mb*: DDP buckets of the all-reduce."""
    S = max(stage_of) + 1
    dp = data_parallel_step(k, "strong", 0.0, bucket_mb=bucket_mb, collectives="ring")  # what run executes
    if dp_first:
        rep = apply_step(graph, dp)
        mb = microbatch_graph(rep, m, overhead_s=0.0)
        steps = [dp, microbatch_step(m, mb.meta["microbatch"]["global_batch"], mb.meta["microbatch"]["micro_batches"],
                                     0.0)]
        derived = mb
        order = None
    else:
        mb = microbatch_graph(graph, m, overhead_s=0.0)
        mbm = mb.meta["microbatch"]
        steps = [{**microbatch_step(m, mbm["global_batch"], mbm["micro_batches"], 0.0), "schedule": schedule}, dp]
        derived = apply_step(mb, dp)
        dev_mb, order_mb = pipeline_orders(mb, graph, stage_of, list(range(S)), S, schedule, m)
    device_of = []
    for x in range(derived.n):
        device_of.append(_device(derived, x, graph, stage_of, S, dp_first))
    if not dp_first:
        order = [[] for _ in range(k * S)]
        topo = derived.topo_index()
        rings = [[] for _ in range(k * S)]
        for x in sorted(range(derived.n), key=topo.__getitem__):
            if "allreduce" in (derived.node_extra[x] or {}):
                rings[device_of[x]].append(derived.ids[x])
        for r in range(k):
            for s in range(S):
                seq = [f"{mb.ids[x]}/rep{r}" for x in order_mb[s]]
                tail = next((j for j, nid in enumerate(seq) if _is_tail(derived, nid, mb, graph)), len(seq))
                order[r * S + s] = [derived.index[n] for n in seq[:tail] + rings[r * S + s] + seq[tail:]]
    out = Placement.from_indices(derived, cluster, device_of, algorithm="hybrid", order=order,
                                 params={"schedule": schedule, "microbatches": m, "replicas": k})
    attach(out, graph, derived, steps)
    return out


def _origin_chain(derived: Graph, x: int, graph: Graph):
    """(captured node, replica) of a derived node that is not a ring node."""
    ex = derived.node_extra[x] or {}
    nid = derived.ids[x]
    r = int(ex.get("replica", 0))
    while nid not in graph.index:
        nid = nid.rsplit("/", 1)[0]
    return graph.index[nid], r


def _device(derived, x, graph, stage_of, S, dp_first):
    ex = derived.node_extra[x] or {}
    if "allreduce" in ex:
        of = ex["allreduce"].get("of")
        of = of[0] if isinstance(of, list) else of
        if of is None:  # a step of a bucket's ring: on the replica's first stage
            return int(ex["replica"]) * S
        while of not in graph.index:
            of = of.rsplit("/", 1)[0]
        return int(ex["replica"]) * S + stage_of[graph.index[of]]
    v, r = _origin_chain(derived, x, graph)
    return r * S + stage_of[v]


def _is_tail(derived, nid, mb, graph) -> bool:
    """A once-per-step node that is not in the forward pass (an update): after the pipeline's blocks."""
    from celeritas_cli.transform.passes import node_passes

    ex = mb.node_extra[mb.index[nid.rsplit("/rep", 1)[0]]] or {}
    origin = ex.get("origin", nid.rsplit("/rep", 1)[0])
    return "microbatch" not in ex and node_passes(graph)[graph.index[origin]] != "forward"
