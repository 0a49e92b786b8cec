"""m-TOPO: Baechi's memory-constrained topological placement.

Jeon et al., "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (m-TOPO; the authors' released code placer/m_topo.py, ``TopoUniform`` /
``TopoUniformWithColocation``).  Celeritas 4.2.2 describes its order and
its weakness (neighbours end up on different devices); Celeritas Table 3
reports it as a baseline.

Rule.  Walk the nodes in Kahn FIFO topological order
(:meth:`Graph.topo_order`, Baechi's M-TOPO order) and fill the devices one
after another, in device index order, never going back to a device once it
is left.  Each device takes nodes until the next one would push it past its
*cap*::

    cap_d = min(memory of device d, total graph memory / devices + largest unit)

(Baechi's ``required_memory // num_devices + max_op_memory``; the extra
largest unit guarantees the k caps together hold the whole graph on
uniform clusters).  Colocation groups are the units: the first member met
places and charges the whole group (Baechi's colocation variant), later
members follow it wherever it went, without charge.

Best effort.  When the walk runs past the last device (a node fits in no
remaining cap, which only happens when devices are smaller than their
share), the node goes to the device with the most free memory among those
it still fits in, or, if it fits nowhere, the one with the most free
memory (Celeritas 6.2.3's best-effort rule); the estimate then says
``OOM`` if any device is over its real memory.  No order is emitted (the
simulator's default ready-list order runs each device).
"""

from __future__ import annotations

from ...model.cluster import Cluster
from ...model.costs import CostModel
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import register
from ...scheduling.memory import DeviceMemory


def topo_caps(graph: Graph, cluster: Cluster, mem: DeviceMemory) -> list[int]:
    """Per-device caps ``min(memory_d, total / k + largest unit)``."""
    largest = max((mem.unit_memory(v) for v in range(graph.n)), default=0)
    share = graph.total_memory() // cluster.k + largest
    return [min(d.memory, share) for d in cluster.devices]


@register("m-topo", paper="Baechi (Jeon et al., SoCC 2020)",
          section="m-TOPO (released placer/m_topo.py); Celeritas 4.2.2, Table 3",
          summary="Fill devices in Kahn topological order up to total/k + largest node each, never revisiting.")
def m_topo(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None) -> Placement:
    """Place *graph* with Baechi's m-TOPO (module docstring).

    Parameters
    ----------
    graph, cluster : Graph, Cluster
    seed : int
        Unused (deterministic); recorded.

    Returns
    -------
    Placement
        Without ``order``; ``estimate.status`` is ``FEASIBLE`` or ``OOM``
        and ``estimate.caps`` the per-device caps used.

    References
    ----------
    Jeon et al., SoCC 2020 (m-TOPO); Celeritas 4.2.2.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("c", [{"id": x, "compute_s": 1, "memory_bytes": 10} for x in "abcd"],
    ...           [{"src": a, "dst": b, "bytes": 1} for a, b in ("ab", "bc", "cd")])
    >>> sorted(m_topo(g, uniform(2)).assignment.items())  # cap = 40/2 + 10 = 30
    [('a', 'gpu0'), ('b', 'gpu0'), ('c', 'gpu0'), ('d', 'gpu1')]
    """
    k = cluster.k
    mem = DeviceMemory(graph, cluster)
    caps = topo_caps(graph, cluster, mem)
    mem.cap = caps
    device_of = [-1] * graph.n
    d = 0
    for v in graph.topo_order():
        p = mem.pinned_device(v)
        if p >= 0:
            device_of[v] = p
            continue
        while d < k and not mem.fits(v, d):
            d += 1
        if d < k:
            target = d
        else:  # past the last device: best effort within real memory, then anywhere
            mem.cap = mem.real
            target = mem.fallback(v) if not any(mem.fits(v, x) for x in range(k)) else \
                min((x for x in range(k) if mem.fits(v, x)), key=lambda x: (mem.load[x] - mem.real[x], x))
            mem.cap = caps
        mem.place(v, target)
        device_of[v] = target
    return Placement.from_indices(graph, cluster, device_of, algorithm="m-topo", seed=seed,
                                  estimate={"status": mem.status(), "caps": caps})
