"""Moirai's MILP (III-D, Eq. 4-8) as a CP-SAT model, one function per
constraint family, in the flexible-job-shop style of the OR-Tools samples.

==========================  =====================================  =============================
Moirai III-D                here                                   CP-SAT
==========================  =====================================  =============================
Eq. 4, objective            :func:`makespan_objective`             ``minimize(makespan)``
Eq. 4a, precedence          :func:`precedence`                     ``start[dst] >= end[src]``
Eq. 4b, start/end           :func:`operator_intervals`             ``end = start + sum dur*x``
Eq. 4c, one device          :func:`assignment`                     ``add_exactly_one``
Eq. 4d / 5, memory          :func:`memory_constraints`             one linear row per device
Eq. 4e / 6, non-overlap     :func:`operator_intervals`             ``add_no_overlap`` per device
Eq. 4f / 7, communication   :func:`communication_constraints`      optional transfer intervals
Eq. 4g / 8, congestion      :func:`congestion_control`             ``add_no_overlap`` per channel
==========================  =====================================  =============================

Beyond the paper (each a relaxation-preserving addition): the redundant
load cut in :func:`makespan_objective`, start windows from the data's
heads and tails, the simulator's per-producer FIFO tie rule (:func:`producer_fifo`) and the
identical-device symmetry breaking (:mod:`.symmetry`).  Variable names
(``x_u_d``, ``s_v``, ``y_t_b``, ...) follow Moirai's Table II indicators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ....errors import InvalidInput
from ....model.cluster import Cluster
from ....model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from ....model.costs import CostModel, cost_model
from ....model.graph import Graph
from .data import Problem, cp_module, problem_data
from .symmetry import identical_classes, symmetry_breaking


@dataclass
class MilpVars:
    """The variables of a model built by :func:`build_model`.

    ``x[u][d]``: presence literal of group *u* on device *d* (``None`` when
    the group cannot go there); ``start[v]``/``end[v]``: node times (units);
    ``transfers``: ``(t, b) -> (tau, y, {a: z})``; ``makespan``; ``dur[v][d]``
    and ``comm[t][a][b]`` the integer durations; ``resolution`` seconds per
    unit; ``classes`` the identical-device classes used for symmetry breaking.
    """

    resolution: float
    horizon: int
    unit_of: list[int]
    units: list[list[int]]
    x: list[list]
    start: list
    end: list
    dur: list[list[int]]
    comm: list
    transfers: dict
    makespan: object
    prefix: dict = field(default_factory=dict)
    chains: list = field(default_factory=list)
    classes: list[list[int]] = field(default_factory=list)


@dataclass
class Channels:
    """The transfer intervals by what they contend for (Eq. 8): directed
    channel ``(a, b)``, sender uplink ``up[a]``, receiver downlink ``down[b]``."""

    chan: dict[tuple[int, int], list] = field(default_factory=dict)
    up: list[list] = field(default_factory=list)
    down: list[list] = field(default_factory=list)


def node_literal(pb: Problem, x: list[list]) -> Callable[[int, int], object]:
    """``lit(v, d)``: the presence literal of node *v*'s unit on device *d*."""
    unit_of = pb.unit_of
    return lambda v, d: x[unit_of[v]][d]


def assignment(model, pb: Problem) -> list[list]:
    """Eq. 4c: every unit (colocation group or node) on exactly one device;
    ``x[u][d]`` is None where the unit does not fit."""
    x: list[list] = []
    for u in range(len(pb.units)):
        row = [model.new_bool_var(f"x_{u}_{d}") if pb.allowed[u][d] else None for d in range(pb.k)]
        model.add_exactly_one([lit for lit in row if lit is not None])
        x.append(row)
    return x


def operator_intervals(model, pb: Problem, x: list[list]) -> tuple[list, list]:
    """Eq. 4b and Eq. 6: ``end = start + dur[v][d]`` on the chosen device,
    and one optional interval per (node, device) sharing the node's start,
    no two overlapping on a device (``add_no_overlap`` replaces Eq. 6's
    big-M pairs).  Starts lie in [head, horizon - tail]."""
    lit = node_literal(pb, x)
    start, end = [], []
    dev_intervals: list[list] = [[] for _ in range(pb.k)]
    for v in range(pb.n):
        s = model.new_int_var(pb.head[v], max(pb.head[v], pb.horizon - pb.tail[v]), f"s_{v}")
        e = model.new_int_var(pb.head[v] + pb.mindur[v], pb.horizon, f"e_{v}")
        terms = []
        for d in range(pb.k):
            xl = lit(v, d)
            if xl is None:
                continue
            dev_intervals[d].append(model.new_optional_fixed_size_interval_var(s, pb.dur[v][d], xl, f"iv_{v}_{d}"))
            terms.append(pb.dur[v][d] * xl)
        model.add(e == s + sum(terms))
        start.append(s)
        end.append(e)
    for d in range(pb.k):
        model.add_no_overlap(dev_intervals[d])
    return start, end


def memory_constraints(model, pb: Problem, x: list[list]) -> None:
    """Eq. 4d / Eq. 5: the units on a device fit its memory (a row only
    for devices that all allowed units together would overfill)."""
    for d in range(pb.k):
        terms = [(pb.unit_mem[u], x[u][d]) for u in range(len(pb.units)) if x[u][d] is not None and pb.unit_mem[u] > 0]
        capacity = pb.cluster.devices[d].memory
        if sum(m for m, _ in terms) > capacity:
            model.add(sum(m * xl for m, xl in terms) <= capacity)


def makespan_objective(model, pb: Problem, x: list[list], end: list):
    """Eq. 4's objective variable: at least every sink's end; plus the
    redundant cut makespan >= every device's load."""
    lit = node_literal(pb, x)
    ms = model.new_int_var(pb.cp_lb, pb.horizon, "makespan")
    for v in range(pb.n):
        if not pb.graph.succ[v]:
            model.add(ms >= end[v])
    for d in range(pb.k):  # redundant: a device's load
        terms = [pb.dur[v][d] * lit(v, d) for v in range(pb.n) if lit(v, d) is not None and pb.dur[v][d] > 0]
        if terms:
            model.add(ms >= sum(terms))
    return ms


def precedence(model, graph: Graph, start: list, end: list) -> None:
    """Eq. 4a: a consumer starts after its producer ends (the transfer,
    when there is one, is added by :func:`communication_constraints`)."""
    for e in range(graph.m):
        model.add(start[graph.edge_dst[e]] >= end[graph.edge_src[e]])


def _transfer(model, pb: Problem, lit, start: list, end: list, t: int, b: int, on_b: list[int], srcs: list[int],
              channels: Channels) -> tuple:
    """Eq. 7 for tensor *t* reaching device *b*: ``y`` = "some consumer
    in *on_b* is on *b* and the producer is not" (Eq. 7's first three
    inequalities), one channel literal ``z[a]`` per source device, present
    iff the producer is on *a* (the fourth and fifth), and the transfer
    interval ``[tau, tau + comm[t][a][b])`` after the producer's end, before
    every consumer on *b* (the last).  Returns ``(tau, y, {a: z})``."""
    p = pb.graph.tensor_src[t]
    y = model.new_bool_var(f"y_{t}_{b}")
    pb_lit = lit(p, b)
    for c in on_b:
        model.add_bool_or([lit(c, b).Not(), y] + ([pb_lit] if pb_lit is not None else []))
    if pb_lit is not None:
        model.add_implication(y, pb_lit.Not())
    model.add_bool_or([y.Not()] + [lit(c, b) for c in on_b])
    tau = model.new_int_var(pb.head[p] + pb.mindur[p], pb.horizon, f"tau_{t}_{b}")
    model.add(tau >= end[p])
    zs = {}
    arr_terms = []
    for a in srcs:
        z = model.new_bool_var(f"z_{t}_{a}_{b}")
        pa = lit(p, a)
        model.add_bool_or([pa.Not(), y.Not(), z])
        model.add_implication(z, pa)
        model.add_implication(z, y)
        iv = model.new_optional_fixed_size_interval_var(tau, pb.comm[t][a][b], z, f"tr_{t}_{a}_{b}")
        zs[a] = z
        arr_terms.append(pb.comm[t][a][b] * z)
        channels.chan.setdefault((a, b), []).append(iv)
        channels.up[a].append(iv)
        channels.down[b].append(iv)
    for c in on_b:
        model.add(start[c] >= tau + sum(arr_terms)).only_enforce_if([y, lit(c, b)])
    return tau, y, zs


def communication_constraints(model, pb: Problem, x: list[list], start: list, end: list) -> tuple[dict, Channels]:
    """Eq. 4f / Eq. 7, as the simulator sends tensors (docs/design.md rule
    3): one transfer per (producer, tensor, destination device), not one
    per edge.  Returns ``({(t, b): (tau, y, {a: z})}, channels)``."""
    lit = node_literal(pb, x)
    k = pb.k
    transfers: dict[tuple[int, int], tuple] = {}
    channels = Channels(up=[[] for _ in range(k)], down=[[] for _ in range(k)])
    for t, p in enumerate(pb.graph.tensor_src):
        cons = [c for c in pb.consumers[t] if pb.unit_of[c] != pb.unit_of[p]]
        if not cons:
            continue
        for b in range(k):
            on_b = [c for c in cons if lit(c, b) is not None]
            srcs = [a for a in range(k) if a != b and lit(p, a) is not None]
            if not on_b or not srcs:
                continue
            transfers[(t, b)] = _transfer(model, pb, lit, start, end, t, b, on_b, srcs, channels)
    return transfers, channels


def congestion_control(model, rule: str, channels: Channels) -> None:
    """Eq. 4g / Eq. 8 under the simulator's rule: ``channel`` - no two
    transfers overlap on a directed channel a->b (the paper's); ``port`` -
    none on a sender's uplink or a receiver's downlink (Moirai's released
    code); ``none`` - transfers overlap freely."""
    if rule == "channel":
        for key in sorted(channels.chan):
            if len(channels.chan[key]) > 1:
                model.add_no_overlap(channels.chan[key])
    elif rule == "port":
        for lst in channels.up + channels.down:
            if len(lst) > 1:
                model.add_no_overlap(lst)


def _fifo_chain(model, horizon: int, transfers: dict, seq: list[tuple[int, int]]) -> list:
    """Transfers *seq* leave in order: each starts no earlier than the
    running maximum ``L`` of the present earlier ones' starts."""
    lows = []
    low = None
    for i, key in enumerate(seq):
        tau, y, _ = transfers[key]
        if low is not None:
            model.add(tau >= low).only_enforce_if(y)
        if i == len(seq) - 1:
            break
        nxt = model.new_int_var(0, horizon, f"L_{key[0]}_{key[1]}")
        if low is not None:
            model.add(nxt >= low)
        model.add(nxt >= tau).only_enforce_if(y)
        lows.append(nxt)
        low = nxt
    return lows


def producer_fifo(model, pb: Problem, rule: str, transfers: dict) -> list[tuple[list, list]]:
    """The simulator's tie rule (docs/design.md, beyond Moirai): one
    producer's transfers that share a channel (``channel``) or its uplink
    (``port``) leave in tensor order (then destination order); a chain of
    running maxima keeps this linear in their number.  Returns the chains
    ``(seq, lows)`` for hinting."""
    chains: list[tuple[list, list]] = []
    if rule == "none":
        return chains
    out_tensors: list[list[int]] = [[] for _ in range(pb.n)]
    for t, p in enumerate(pb.graph.tensor_src):
        out_tensors[p].append(t)
    for p in range(pb.n):
        if rule == "channel":
            seqs = [[(t, b) for t in out_tensors[p] if (t, b) in transfers] for b in range(pb.k)]
        else:
            seqs = [[(t, b) for t in out_tensors[p] for b in range(pb.k) if (t, b) in transfers]]
        for seq in seqs:
            if len(seq) >= 2:
                chains.append((seq, _fifo_chain(model, pb.horizon, transfers, seq)))
    return chains


def build_model(graph: Graph, cluster: Cluster, *, resolution: float, congestion: str = DEFAULT_CONGESTION,
                horizon: int | None = None, costs: CostModel | None = None, symmetry: bool = True):
    """Build the CP-SAT model of Moirai III-D for *graph* on *cluster*.

    Parameters
    ----------
    graph, cluster : Graph, Cluster
        A (coarse) graph of at most a few thousand nodes, and the devices.
    resolution : float
        Seconds per integer time unit; durations are rounded to nearest.
    congestion : {"channel", "port", "none"}
        Transfer contention rule, as in the simulator (Moirai Eq. 8 is
        ``channel``).
    horizon : int, optional
        Upper bound on the makespan in units (e.g. from a heuristic); by
        default the serial bound Σ max node time + Σ (k-1) max transfer time.
    costs : CostModel, optional
        Reused cost model.
    symmetry : bool
        Add the identical-device symmetry breaking.

    Returns
    -------
    (CpModel, MilpVars)

    Raises
    ------
    Infeasible
        A colocation group (or node) fits on no device.

    References
    ----------
    Moirai (moirai.txt) III-D: objective Eq. 4, precedence Eq. 4a, start/end
    Eq. 4b, assignment Eq. 4c, memory Eq. 4d/5, non-overlap Eq. 4e/6,
    communication Eq. 4f/7, congestion Eq. 4g/8.
    """
    cp_model = cp_module()
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"milp: unknown congestion rule '{congestion}' (use channel, port or none)")
    costs = cost_model(graph, cluster, costs)
    model = cp_model.CpModel()
    model.name = f"moirai:{graph.name}"
    pb = problem_data(graph, cluster, resolution, horizon, costs)
    x = assignment(model, pb)
    start, end = operator_intervals(model, pb, x)
    memory_constraints(model, pb, x)
    ms = makespan_objective(model, pb, x, end)
    precedence(model, graph, start, end)
    transfers, channels = communication_constraints(model, pb, x, start, end)
    congestion_control(model, congestion, channels)
    chains = producer_fifo(model, pb, congestion, transfers)
    classes = identical_classes(graph, cluster) if symmetry else []
    prefix = symmetry_breaking(model, pb, x, classes)
    model.minimize(ms)
    return model, MilpVars(resolution=pb.res, horizon=pb.horizon, unit_of=pb.unit_of, units=pb.units, x=x,
                           start=start, end=end, dur=pb.dur, comm=pb.comm, transfers=transfers, makespan=ms,
                           prefix=prefix, classes=classes, chains=chains)
