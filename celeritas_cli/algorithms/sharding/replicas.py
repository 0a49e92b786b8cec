"""What the replicating planners (``data-parallel``, ``fsdp``) share: their
plan written in the symmetric form and judged as ``placer simulate`` judges
it (:mod:`~celeritas_cli.sim.symmetric`)."""

from __future__ import annotations

from ...model.cluster import Cluster
from ...model.graph import Graph
from ...model.placement import Placement
from ...sim.simulator import run_schedule
from ...sim.symmetric import judge
from ...transform.derivation import recipe


def planned(graph: Graph, cluster: Cluster, costs, algorithm: str, rep0_ids: list[str], devs: list[int],
            steps: list[dict], seed: int | None):
    """A replicating planner's plan in the symmetric form, judged: the
    placement (replica 0's nodes *rep0_ids* on ``devs[0]``, replica ``r`` on
    ``devs[r]``, the recipe *steps* from *graph*), the :class:`~celeritas_cli.sim.symmetric.Judged`
    copies, their schedule and cost model - the way ``placer simulate``
    judges the file (data-parallel and fsdp use it)."""
    p = Placement(graph=graph.original_name, cluster=cluster.name, algorithm=algorithm,
                  assignment={nid: cluster.ids[devs[0]] for nid in rep0_ids}, seed=seed,
                  derivation=recipe(graph, steps), replicas={"devices": [[cluster.ids[d]] for d in devs]},
                  cluster_digest=cluster.digest(), cluster_file=cluster.source)
    j = judge(graph, cluster, p, algorithm)
    c2 = costs.for_graph(j.graph)
    return p, j, run_schedule(j.graph, cluster, j.device_of, None, costs=c2, groups=j.groups), c2


def replica_loads(judged: list[int], devs: list[int], kind_of: list[int], k: int) -> list[int]:
    """Per device of the cluster (*k*), the judged copies' figure *judged*
    given to every replica of their kind (replica ``r`` on ``devs[r]``)."""
    loads = [0] * k
    for r, rs in enumerate(kind_of):
        loads[devs[r]] = judged[devs[rs]]
    return loads
