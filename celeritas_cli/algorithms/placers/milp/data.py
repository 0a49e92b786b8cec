"""The problem data of Moirai's MILP (III-D, Table II) in CP-SAT's integers.

Moirai's model takes, for the coarsened DAG ``G = (V, E)`` (III-D, Eq. 2),
each operator's processing time on each device, each data flow's
transmission time on each channel and each device's memory.  CP-SAT takes
integers, so times are scaled by an explicit ``resolution`` (seconds per
unit, rounded to nearest) that the result records; this module computes
those integers and the bounds the model's variables are declared with
(horizon, earliest starts, tails), but builds no variable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....errors import Infeasible, InvalidInput, MissingDependency
from ....model.cluster import Cluster
from ....model.costs import CostModel, downward_rank, upward_rank
from ....model.graph import Graph

#: Longest integer duration given to CP-SAT.  A longer node or transfer time is
#: clamped to it (a relaxation: the model's time is shorter than the real one,
#: so CP-SAT's bound stays a lower bound): it is ~1e6 times any horizon built
#: from a warm start (which sits at 1e5-1e6 units), so such an option stays
#: unused, and every sum in the model stays far below CP-SAT's 2^62 (and no
#: inf reaches int()).  The resolution follows the schedule's scale, never the
#: longest option's (issue 24, N15: one link of 1e12 s latency made the grid
#: 10 s and every other time 0 units, "OPTIMAL 0 s").
UNITS_MAX = 2**40
#: Largest horizon (units): a serial horizon summing clamped times stays within CP-SAT's int64.
HORIZON_MAX = 2**52


def cp_module():
    """OR-Tools' ``cp_model`` module (imported on first use: about a second)."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - ortools is a core dependency
        raise MissingDependency("placement algorithm 'milp' needs OR-Tools: pip install ortools") from exc
    return cp_model


def units_of(graph: Graph) -> tuple[list[int], list[list[int]]]:
    """Colocation groups and single nodes ("units": what Eq. 4c places),
    ranked by first topological index: ``(unit_of[v], members[u])``.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": i, "compute_s": 1, "memory_bytes": 0, "colocation": c}
    ...                 for i, c in (("a", "w"), ("b", None), ("c", "w"))],
    ...           [{"src": "a", "dst": "b", "bytes": 1}, {"src": "b", "dst": "c", "bytes": 1}])
    >>> units_of(g)
    ([0, 1, 0], [[0, 2], [1]])
    """
    return graph.colocation_units(graph.topo_order())


def auto_resolution(upper_s: float) -> float:
    """The power of ten that puts *upper_s* seconds at 1e5-1e6 units.

    Example
    -------
    >>> auto_resolution(0.5)
    1e-06
    """
    if not (upper_s > 0 and math.isfinite(upper_s)):
        return 1e-6
    return 10.0 ** math.floor(math.log10(upper_s / 1e5))


def to_units(x: float, res: float) -> int:
    """*x* seconds in units of *res* seconds, rounded to nearest but never
    to zero for a positive time (at least one unit), at most
    :data:`UNITS_MAX` (also for inf).

    >>> to_units(2.4e-6, 1e-6), to_units(1e-12, 1e-6), to_units(0.0, 1e-6), to_units(float("inf"), 1.0) == UNITS_MAX
    (2, 1, 0, True)
    """
    if not x > 0:
        return 0
    u = x / res + 0.5
    return max(1, int(math.floor(u))) if u < UNITS_MAX else UNITS_MAX


def integer_durations(graph: Graph, cluster: Cluster, resolution: float, costs: CostModel
                      ) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Node times ``dur[v][d]`` (Moirai's device-specific processing time)
    and tensor transfer times ``comm[t][a][b]`` (the data flow's time on
    channel a->b) in units of *resolution* seconds, rounded to nearest, at
    most :data:`UNITS_MAX`."""
    k, res = cluster.k, resolution
    dur = [[to_units(costs.time[v][d], res) for d in range(k)] for v in range(graph.n)]
    comm = [[[0 if a == b else to_units(costs.tensor_comm(t, a, b), res) for b in range(k)] for a in range(k)]
            for t in range(len(graph.tensor_src))]
    return dur, comm


def choose_resolution(graph: Graph, costs: CostModel, resolution: float, upper_s: float | None) -> float:
    """Seconds per unit: *resolution* when > 0, else :func:`auto_resolution`
    of *upper_s* (the warm start's makespan; default the serial sum of the
    slowest node times).  The scale is the schedule's, not the longest
    option's: a time longer than :data:`UNITS_MAX` units (a link of 1e12 s)
    is clamped by :func:`to_units`.  A user resolution so fine that the
    schedule itself would take more than 2^39 units is :class:`InvalidInput`."""
    scale = upper_s if upper_s is not None and upper_s > 0 else sum(costs.max_time)
    res = float(resolution)
    if res <= 0:
        return auto_resolution(scale)
    if math.isfinite(scale) and scale / res >= UNITS_MAX / 2:  # CP-SAT's integers
        raise InvalidInput(f"milp: resolution {res:g} s makes the schedule ({scale:.6g} s) more than 2^39 "
                           f"units; use -p resolution={scale / (UNITS_MAX / 2):.3g} or coarser")
    return res


def rounding_seconds(graph: Graph, cluster: Cluster, res: float, costs: CostModel,
                     durations: tuple[list[list[int]], list] | None = None) -> float:
    """How far the model's integer times can put a schedule from the
    simulator's: the sum, over the tasks one schedule can hold (every node,
    and every tensor sent to at most ``min(k - 1, consumers)`` devices), of
    the largest rounding error of that task (``|units * res - seconds|``;
    clamped times, a relaxation, are left out).  CP-SAT's bound minus this
    is a lower bound on the simulated makespan of every placement, and a
    grid whose rounding is a large share of the makespan is *coarse*.

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> g = build("g", [{"id": "a", "compute_s": 1.2, "memory_bytes": 0}], [])
    >>> c = uniform(2)
    >>> round(rounding_seconds(g, c, 1.0, cost_model(g, c)), 9)
    0.2
    """
    k = cluster.k
    dur, comm = durations if durations is not None else integer_durations(graph, cluster, res, costs)

    def err(units: int, seconds: float) -> float:
        return abs(units * res - seconds) if units < UNITS_MAX else 0.0

    total = 0.0
    for v in range(graph.n):
        total += max((err(dur[v][d], costs.time[v][d]) for d in range(k)), default=0.0)
    for t in range(len(graph.tensor_src)):
        sends = min(k - 1, len({graph.edge_dst[e] for e in graph.tensor_edges[t]}))
        if sends > 0:
            total += sends * max(err(comm[t][a][b], costs.tensor_comm(t, a, b))
                                 for a in range(k) for b in range(k) if a != b)
    return total


def model_size(graph: Graph, k: int) -> int:
    """Upper bound on the optional intervals of the model: one per
    (node, device) and one per (tensor, source, destination device)."""
    return graph.n * k + len(graph.tensor_src) * k * (k - 1)


@dataclass
class Problem:
    """The integer data one model is built from.

    ``unit_of``/``units``: colocation units (:func:`units_of`);
    ``unit_mem[u]``: a unit's memory; ``allowed[u][d]``: the unit fits
    device *d* alone (else its literal is not created); ``dur``/``comm``:
    :func:`integer_durations`; ``consumers[t]``: distinct consumers of
    tensor *t* in edge order; ``mindur[v]``: fastest allowed time;
    ``head[v]``/``tail[v]``: earliest start and remaining work with no
    communication; ``cp_lb``: the longest such path; ``horizon``: upper
    bound on the makespan (units).
    """

    graph: Graph
    cluster: Cluster
    res: float
    unit_of: list[int]
    units: list[list[int]]
    unit_mem: list[int]
    allowed: list[list[bool]]
    dur: list[list[int]]
    comm: list
    consumers: list[list[int]]
    mindur: list[int]
    head: list[int]
    tail: list[int]
    cp_lb: int
    horizon: int

    @property
    def n(self) -> int:
        return self.graph.n

    @property
    def k(self) -> int:
        return self.cluster.k


def fitting_devices(graph: Graph, cluster: Cluster, units: list[list[int]]) -> tuple[list[int], list[list[bool]]]:
    """Each unit's memory and the devices it fits alone (Eq. 5 for one
    unit); raises :class:`Infeasible` naming a unit that fits none."""
    devs = cluster.devices
    unit_mem = [sum(graph.memory[v] for v in mem) for mem in units]
    allowed = [[unit_mem[u] <= devs[d].memory for d in range(cluster.k)] for u in range(len(units))]
    for u, mem in enumerate(units):
        if not any(allowed[u]):
            v = mem[0]
            what = (f"colocation group '{graph.colocation[v]}' ({len(mem)} nodes)" if graph.colocation[v] is not None
                    else f"node '{graph.ids[v]}'")
            raise Infeasible(
                f"milp: {what} needs {unit_mem[u]} bytes but the largest device has "
                f"{max(d.memory for d in devs)}; no placement fits (use a larger cluster or split the op)")
    return unit_mem, allowed


def tensor_consumers(graph: Graph) -> list[list[int]]:
    """The distinct consumers of every tensor, in edge order."""
    consumers: list[list[int]] = []
    for t in range(len(graph.tensor_src)):
        seen: list[int] = []
        for e in graph.tensor_edges[t]:
            c = graph.edge_dst[e]
            if c not in seen:
                seen.append(c)
        consumers.append(seen)
    return consumers


def serial_horizon(dur: list[list[int]], comm: list, allowed_of_node: list[list[bool]], k: int) -> int:
    """The default horizon: every node at its slowest allowed time plus
    every tensor sent to k-1 devices at its slowest channel, one after
    another."""
    horizon = sum(max(dur[v][d] for d in range(k) if allowed_of_node[v][d]) for v in range(len(dur)))
    for t in range(len(comm)):
        horizon += (k - 1) * max((comm[t][a][b] for a in range(k) for b in range(k)), default=0)
    return horizon


def problem_data(graph: Graph, cluster: Cluster, resolution: float, horizon: int | None,
                 costs: CostModel) -> Problem:
    """The :class:`Problem` for *graph* on *cluster* at *resolution*
    seconds per unit; *horizon* (units) defaults to :func:`serial_horizon`
    and is raised to the no-communication critical path when below it."""
    k, res = cluster.k, float(resolution)
    unit_of, units = units_of(graph)
    dur, comm = integer_durations(graph, cluster, res, costs)
    unit_mem, allowed = fitting_devices(graph, cluster, units)
    node_allowed = [allowed[unit_of[v]] for v in range(graph.n)]
    mindur = [min(dur[v][d] for d in range(k) if node_allowed[v][d]) for v in range(graph.n)]
    if horizon is None:
        horizon = serial_horizon(dur, comm, node_allowed, k)
    horizon = min(max(int(horizon), 1), HORIZON_MAX)
    # earliest start / remaining work at the fastest allowed device, no communication
    head = [int(x) for x in downward_rank(graph, mindur.__getitem__, lambda e: 0)]
    tail = [int(x) for x in upward_rank(graph, mindur.__getitem__, lambda e: 0)]
    cp_lb = max((tail[v] + head[v] for v in range(graph.n)), default=0)
    return Problem(graph=graph, cluster=cluster, res=res, unit_of=unit_of, units=units, unit_mem=unit_mem,
                   allowed=allowed, dur=dur, comm=comm, consumers=tensor_consumers(graph), mindur=mindur,
                   head=head, tail=tail, cp_lb=cp_lb, horizon=max(horizon, cp_lb))
