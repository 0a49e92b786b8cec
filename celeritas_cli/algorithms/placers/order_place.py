"""Celeritas' Order-Place: fill devices in CPD-TOPO order up to their memory.

Celeritas 5.2 and 6.2.3: "for the coarse graphs created by operation
fusion, we place nodes in CPD-TOPO order on one device until reaching its
memory limit, then move on to the next device."  Usually run on the output
of ``placer coarsen --method cpd``; it works on any graph.
"""

from __future__ import annotations

from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import Param, register
from ...scheduling.memory import DeviceMemory
from ...scheduling.orders import cpd_topo
from ...sim.simulator import lower_bound, run_schedule

#: graphs up to this many nodes get a simulated makespan in the estimate
SIMULATE_MAX_NODES = 50_000


def placement_estimate(graph: Graph, cluster: Cluster, device_of: list[int], costs: CostModel,
                       used: list[int], extra: dict | None = None, order=None,
                       congestion: str = DEFAULT_CONGESTION) -> dict:
    """The estimate block shared by Order-Place and Adjusting Placement:
    memory status, the simulated makespan of *device_of* on *graph* (under
    *congestion*, by default the simulator's default; skipped on huge
    graphs) and the lower bound."""
    ok = not cluster.over_capacity(used)
    est: dict = {"status": "FEASIBLE" if ok else "OOM"}
    if graph.n <= SIMULATE_MAX_NODES:
        est["makespan_s"] = run_schedule(graph, cluster, device_of, order, congestion=congestion,
                                         costs=costs).makespan
        est["makespan_by"] = "simulator"
        est["lower_bound_s"] = lower_bound(graph, cluster, costs)
    est["memory_bytes"] = {cluster.ids[d]: used[d] for d in range(cluster.k)}
    if extra:
        est.update(extra)
    return est


@register("order-place", paper="Celeritas", section="5.2, 6.2.3 (Order-Place)",
          summary="Fill devices one after another in CPD-TOPO order up to their memory (run on a coarse graph).",
          params={"fill": Param(float, 1.0, "fraction of each device's memory to fill before moving on",
                                gt=0, max=1.0)})
def order_place(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                fill: float = 1.0) -> Placement:
    """Order-Place (Celeritas 5.2): walk the CPD-TOPO sequence and put each
    node on the current device while it fits, else move on to the next one.

    Colocation groups are placed as a unit: the group's first node in the
    sequence takes the whole group's memory on its device, and the other
    members go to that device (TensorFlow/Baechi's "first member decides"
    rule, Celeritas 6.1, with the memory reserved up front so the later
    members cannot overflow it).  When no device from the current one on
    has room, the best-effort rule of Celeritas 5.2 / 6.4 applies: the
    device with the lowest memory usage (ties: lowest index), and the
    estimate's status is ``OOM``.

    Parameters
    ----------
    graph : Graph
        Usually a coarse graph (``placer coarsen``); any graph works.
    cluster : Cluster
    seed : int
        Unused (deterministic).
    fill : float
        Fraction of each device's memory to use before moving on (1.0 = the
        paper's rule).  Memory feasibility is judged against full capacity.

    Returns
    -------
    Placement
        Over the original node ids; estimate with the simulated makespan.

    References
    ----------
    Celeritas 5.2 (Order-Place), 6.2.3, Table 3.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 6}
    >>> g = build("c", [nd("a"), nd("b"), nd("c")],
    ...           [{"src": "a", "dst": "b", "bytes": 1}, {"src": "b", "dst": "c", "bytes": 1}])
    >>> order_place(g, uniform(2, memory=12)).assignment
    {'a': 'gpu0', 'b': 'gpu0', 'c': 'gpu1'}
    """
    costs = cost_model(graph, cluster, costs)
    k = cluster.k
    seq = cpd_topo(graph, costs)
    mem = DeviceMemory(graph, cluster, cap=[int(dv.memory * fill) for dv in cluster.devices])
    device_of = [0] * graph.n
    cur = 0
    for v in seq:
        p = mem.pinned_device(v)
        if p >= 0:  # a later member of a placed colocation group
            device_of[v] = p
            continue
        d = cur
        while d < k and not mem.fits(v, d):
            d += 1
        if d < k:
            cur = d
        else:  # best effort: lowest memory usage (not DeviceMemory's default "most_free")
            d = mem.fallback(v, rule="least_used")
        device_of[v] = d
        mem.place(v, d)
    est = placement_estimate(graph, cluster, device_of, costs, mem.load)
    return Placement.from_indices(graph, cluster, device_of, algorithm="order-place", seed=seed,
                                  params={"fill": fill}, estimate=est)
