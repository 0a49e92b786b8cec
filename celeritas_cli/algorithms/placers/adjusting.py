"""Celeritas' Adjusting Placement (section 5.2, Algorithm 2), with the data
transmission of section 6.1 as tasks on the links.

Nodes are visited in CPD-TOPO order.  Each one stays on the device of the
previous node, ``d_k``, unless another device's earliest start time (EST,
Eq. 7, with insertion into idle slots) is earlier by more than
``back_cost`` (Eq. 8, the longest transfer of its outputs back to ``d_k``)
- condition Eq. 9.  The EST counts the queueing of the node's input
transfers on the links under the congestion rule (Celeritas 6.1: "we treat
the data transmission process as an additional task"), so Algorithm 2's
schedule is the simulator's.  A device without room for the node has EST =
+inf; when every device is full, the device with the lowest memory usage
takes it (best effort).  Run it on the coarse graph of ``placer coarsen``.

The code follows Algorithm 2's lines: :func:`adjusting` (lines 3-5 and
23-24), :func:`adjusting_schedule` (the loop, lines 6-22),
:func:`_choose_device` (lines 8-20 for one node) and :func:`back_cost`
(line 7, Eq. 8); comp_EST (lines 25-34) is
:meth:`~celeritas_cli.sim.partial.PartialSchedule.est`.

Transfers as tasks (6.1).  An input from another device is a transfer
task on the links of the congestion rule
(:class:`~celeritas_cli.sim.links.LinkTimeline`): it becomes ready when
its producer finishes, a tensor crosses to a device once, and with
``congestion="channel"`` (default, the simulator's) or ``"port"`` it
waits in the simulator's first-in first-out order for the links, in an
idle gap when one is long enough; ``pre_t`` is the end of the last
input transfer (or the finish of a local producer).  With
``congestion="none"`` a transfer never waits: ``pre_t = max Fin_t[p] +
I(d_p) c_{p,i}``, the literal Eq. 7.  Either way Algorithm 2's schedule
is the one the simulator runs under that rule: placed nodes keep their
per-device order and their times are the simulator's, so with
``order=True`` the estimate's ``schedule_makespan_s`` equals the
simulated makespan.

Readings and deviations where the paper is silent or differs:

* ``c_{p,i}`` is the transfer time of the tensor over the link
  ``dev(p) -> d`` (``CostModel.tensor_comm``); ``back_cost = max over
  out-edges of c`` over the link ``d_1 -> d_k`` (Eq. 8, no queueing);
  the first node has no ``d_k`` and takes ``d_1``.
* The paper fixes ``Fin_t`` of a placed node once.  A transfer that
  became ready before transfers already queued on its link but is
  planned after them (its consumer comes later in CPD-TOPO order) goes
  first in the simulator and delays them; then the placed part is
  re-timed by the simulator (counted in the estimate's ``retimes``),
  so ``Fin_t`` stays the real finish time.  The EST of the node being
  placed does not include such delays of other transfers.
* The paper writes ``argmin Ava_m`` for the best-effort device but says
  "the device with the lowest memory usage"; the text is followed
  (fewest bytes used).
* Colocation: a group is a unit - its first node in the sequence
  reserves the whole group's memory on the device chosen for it (EST is
  +inf where the group does not fit), later members go to that device
  (Celeritas 6.1 "first member decides", as in Baechi).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...model.cluster import Cluster
from ...model.congestion import DEFAULT_CONGESTION
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import Param, congestion_param, register
from ...scheduling.memory import DeviceMemory
from ...scheduling.orders import cpd_topo
from ...sim.partial import PartialSchedule
from .order_place import placement_estimate

INF = math.inf


@register("adjusting", paper="Celeritas", section="5.2, Algorithm 2 (Eq. 7-9); 6.1 (transfers as tasks)",
          summary="CPD-TOPO order; stay on the previous node's device unless another starts it earlier "
                  "by more than the cost of sending results back (run on a coarse graph).",
          params={"insertion": Param(bool, True, "insert into idle slots when computing EST (Eq. 7)"),
                  "order": Param(bool, False, "also write each device's execution order (the EST schedule)"),
                  "congestion": congestion_param("link rule of the EST's transfers (6.1): channel / "
                                      "port queue them as the simulator does; none = the literal Eq. 7")})
def adjusting(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None, insertion: bool = True,
              order: bool = False, congestion: str = DEFAULT_CONGESTION) -> Placement:
    """Adjusting Placement (Celeritas Algorithm 2; the module docstring has
    the transfers-as-tasks model of 6.1 and the readings where the paper is
    silent).

    For node ``v_i`` of the CPD-TOPO sequence (lines 3-4) and each device
    ``d``: ``pre_t`` = the time every input of ``v_i`` is on ``d`` and
    ``EST(d) = max(pre_t, d_ava[d])`` where ``d_ava`` is the start of the
    first idle slot of ``d`` after ``pre_t`` long enough for ``v_i`` (Eq. 7,
    :meth:`~celeritas_cli.scheduling.timeline.Timeline.slot`).  With ``d_k``
    the device of ``v_{i-1}`` and ``d_1`` the device with the smallest EST
    (ties: lowest index), ``v_i`` goes to ``d_1`` if ``EST(d_k) - EST(d_1) >
    back_cost`` (Eq. 9), else to ``d_k`` if it has room, else (every device
    full) to the device with the lowest memory usage (best effort).

    Parameters
    ----------
    graph : Graph
        Usually a coarse graph; any graph works (O(k (V + E)) plus the slot
        searches, plus one simulation of the placed part per re-time).
    cluster : Cluster
    seed : int
        Unused (deterministic).
    insertion : bool
        Insertion-based EST (the paper's rule); False appends only.
    order : bool
        Write the per-device order of the EST schedule into the placement
        (the simulator then follows it strictly and its makespan is
        ``schedule_makespan_s``).  Default off: the paper's output is a
        device per node (the simulator then orders by upward rank).
    congestion : {"channel", "port", "none"}
        Link rule of the transfers in the EST (default: the simulator's
        default).  The estimate's ``makespan_s`` is simulated under it.

    Returns
    -------
    Placement
        Over the original node ids of a coarse graph (line 23).

    References
    ----------
    Celeritas 5.2, Eq. 7-9, Algorithm 2; 6.1 (colocation, transfers as tasks).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> nd = lambda i: {"id": i, "compute_s": 1.0, "memory_bytes": 0}
    >>> g = build("fork", [nd("r"), nd("a"), nd("b")],
    ...           [{"src": "r", "dst": "a", "bytes": 10}, {"src": "r", "dst": "b", "bytes": 10}])
    >>> p = adjusting(g, uniform(2, bandwidth=100.0, latency=0.0), order=True)
    >>> sorted(set(p.assignment.values()))   # b moves: 1.1 start beats 2.0 by > 0
    ['gpu0', 'gpu1']
    >>> p.estimate["schedule_makespan_s"] == p.estimate["makespan_s"] == 2.1
    True
    """
    costs = cost_model(graph, cluster, costs)
    run = adjusting_schedule(graph, cluster, costs, cpd_topo(graph, costs), insertion, congestion)
    sch = run.schedule
    per_dev = sch.order() if order else None
    est_doc = placement_estimate(graph, cluster, sch.dev, costs, run.memory.load,
                                 {"schedule_makespan_s": sch.makespan, "device_changes": run.moves,
                                  "best_effort_nodes": run.best_effort, "retimes": sch.retimes,
                                  "congestion": congestion}, order=per_dev, congestion=congestion)
    return Placement.from_indices(graph, cluster, sch.dev, algorithm="adjusting", seed=seed, order=per_dev,
                                  params={"insertion": insertion, "order": order, "congestion": congestion},
                                  estimate=est_doc)


@dataclass
class AdjustingRun:
    """What :func:`adjusting_schedule` leaves: the EST schedule of the
    placed nodes (``schedule.dev`` is the placement), the memory in use
    (``Ava_m``), how many nodes left the previous node's device and how many
    went to a full device (best effort)."""

    schedule: PartialSchedule
    memory: DeviceMemory
    moves: int
    best_effort: int


def adjusting_schedule(graph: Graph, cluster: Cluster, costs: CostModel, seq: list[int], insertion: bool,
                       congestion: str) -> AdjustingRun:
    """Algorithm 2 lines 5-22: place the nodes of *seq* one by one, each on
    the device :func:`_choose_device` picks, and add it to the EST schedule
    (line 21: memory, line 22: ``Fin_t``)."""
    mem = DeviceMemory(graph, cluster)  # line 5: Ava_m
    sch = PartialSchedule(graph, cluster, costs, congestion, insertion)
    dk = -1
    moves = best_effort = 0
    for v in seq:
        forced = mem.pinned_device(v)
        if forced >= 0:  # a later member of a placed colocation group
            d = forced
            s, pos, plan = sch.est(v, d)
        else:
            d, (s, pos, plan), fallback, dk = _choose_device(graph, costs, sch, mem, v, dk)
            best_effort += fallback
            if d != dk:
                moves += 1
            mem.place(v, d)
        sch.commit(v, d, s, pos, plan)
        dk = d
    return AdjustingRun(sch, mem, moves, best_effort)


def _choose_device(graph: Graph, costs: CostModel, sch: PartialSchedule, mem: DeviceMemory, v: int, dk: int
                   ) -> tuple[int, tuple, bool, int]:
    """Algorithm 2 lines 8-20 for node *v* after a node on *dk* (-1 for the
    first node): ``(device, its EST entry, best effort?, d_k)``.

    Lines 8-12: EST on every device, +inf where *v* does not fit.  Line 14:
    ``d_1`` = smallest EST (ties: lowest index); the first node takes it.
    Lines 19-20: every EST infinite: the least used device.  Lines 15-18
    (Eq. 9): ``d_1`` when ``EST(d_k) - EST(d_1) > back_cost``, else ``d_k``;
    a full ``d_k`` has ``EST = +inf`` and so loses to ``d_1``.
    """
    ests = [sch.est(v, x) if mem.fits(v, x) else (INF, 0, []) for x in range(mem.k)]
    d1 = min(range(mem.k), key=lambda x: (ests[x][0], x))
    if dk < 0:
        dk = d1
    if ests[d1][0] == INF:  # all devices are out of memory: best effort, lowest usage
        d = mem.fallback(v, rule="least_used")
        return d, sch.est(v, d), True, dk
    if ests[dk][0] == INF:  # d_k full: earliest device with room (Eq. 9 with EST(d_k) = inf)
        return d1, ests[d1], False, dk
    back = back_cost(graph, costs, v, d1, dk) if d1 != dk else 0.0
    d = d1 if ests[dk][0] - ests[d1][0] > back else dk  # Eq. 9
    return d, ests[d], False, dk


def back_cost(graph: Graph, costs: CostModel, v: int, d1: int, dk: int) -> float:
    """Eq. 8 / Algorithm 2 line 7: the longest transfer of *v*'s outputs
    over the link ``d1 -> dk`` (0 without out-edges)."""
    back = 0.0
    for e in graph.out_edges[v]:
        c = costs.comm(e, d1, dk)
        if c > back:
            back = c
    return back
