"""Moirai's exact placement (III-D, Eq. 4-8) as a CP-SAT model.

Moirai (moirai.txt, III-D) places the operators of a coarsened graph by a
MILP solved with Gurobi: each operator on exactly one device (Eq. 4c) with a
device-specific processing time, memory per device (Eq. 5), no two operators
of one device overlapping (Eq. 6), a data flow paying a transfer only when
its endpoints are on different devices, on the directed channel between them
(Eq. 7), and no two transfers overlapping on one channel (Eq. 8); the
objective is the makespan (Eq. 4).  We solve the same problem with OR-Tools
CP-SAT in the flexible-job-shop style:

* one optional interval per (node, device) with the node's time on that
  device, sharing the node's start variable; ``add_exactly_one`` over the
  presence literals (Eq. 4c) - literals are per colocation group, so a group
  is never split;
* ``add_no_overlap`` per device (Eq. 6, replacing Moirai's big-M pairs);
* one linear memory constraint per device (Eq. 5);
* one transfer per (producer, tensor, destination device), as the simulator
  sends it (docs/design.md rule 3): literal ``y[t,b]`` = "tensor *t* must reach
  device *b*" (some consumer on *b*, producer elsewhere), one optional
  interval per source device *a* (present iff the producer is on *a*, Eq. 7's
  channel choice), starting after the producer ends; each consumer on *b*
  starts after the arrival;
* congestion as in the simulator: ``channel`` (Eq. 8) - ``add_no_overlap``
  per directed channel a->b; ``port`` - per sender uplink and per receiver
  downlink (Moirai's released code); ``none`` - transfers overlap freely;
* redundant cuts: makespan >= every device's load, node start windows from
  zero-communication heads and tails;
* symmetry breaking between identical devices (same type, speed, memory,
  and link rows/columns that swap): the j-th device of a class may only host
  a group if the (j-1)-th hosts a group of smaller topological rank.

Times are integers of ``resolution`` seconds (rounded to nearest; the default
resolution is the power of ten giving the hint's makespan 1e5-1e6 units).
The model is a relaxation of the simulator: every simulated schedule (any
order, FIFO channels) is a solution, so CP-SAT's best bound is a lower bound
on the simulated makespan of any placement under the same congestion rule
(up to the rounding).  The simulator's tie rule is modelled too: one
producer's transfers on one channel (``port``: on its uplink) leave in tensor
order.  The converse does not hold exactly: the solver may let a later
producer's transfer pass an earlier one on a channel (Moirai's Eq. 8 is a
plain either-or; FIFO between different producers would need a reified
order per pair), while the simulator serves a channel FIFO, so the replay of
the solver's schedule (its per-device order) can be later than its
objective.  That is why the result is always re-simulated and never worse
than its warm start - judged on the original graph when the graph solved is
a coarse graph whose original is known (``Graph.origin``), else on the graph
solved.  On a coarse graph the status and the bound hold for the coarse
graph only (``estimate.graph == "coarse"``): members of a coarse node run
back to back there, so the original graph's optimum may lie below the coarse
graph's "bound".

Reading chosen where the paper is silent: Moirai minimises inference latency
on the coarsened graph; we minimise the simulated makespan of whatever graph
is given (forward-only or training step), transfers follow docs/design.md (one per
producer, tensor and destination device, not one per edge as Eq. 7's data
flows), and a multi-hop pair is one channel as in the simulator.
Determinism and time: by default the search is CP-SAT's one-worker search
stopped by a deterministic-time budget (``det_time``), so the same input and
seed give the same placement; the wall clock (``time_limit``, which bounds the
whole call) only caps it, and stderr says when it did.  A model too large for
the time limit is not built (see :func:`solve`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import Infeasible, InvalidInput, MissingDependency, SolverError
from ..log import chatty
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model, downward_rank, upward_rank
from ..model.graph import Graph
from ..model.limits import TIME_MAX
from ..model.placement import Placement
from ..registry import Param, register
from ..sim.judge import original_makespan
from ..sim.links import LinkState
from ..sim.simulator import (
    CONGESTION_RULES,
    Schedule,
    check_colocation,
    lower_bound,
    run_schedule,
)

HINT_CHAIN = ("adjusting", "heft", "single-device")
TOO_LARGE = 5000      # nodes: above this the model is not built (return the hint)
LARGE = 1000          # nodes: above this warn that a proof is unlikely
HINT_SHARE = 0.5
"""Share of ``time_limit``, counted from the first heuristic, within which
warm-start heuristics are started (a cap: normally the chain takes a few
per cent of it)."""
INTERVALS_PER_SECOND = 1000
"""Largest model (optional intervals, :func:`model_size`) built per second of
``time_limit``.  Measured on a loaded 2-core machine: the 1,300-node
Transformer (21k intervals) took 1 s to build and 5-12 s to presolve, while
CP-SAT does not check its time limit inside some of those phases."""
DET_PER_SECOND = 0.05
"""Default deterministic budget: CP-SAT deterministic-time units per second
of ``time_limit``.  Measured rates of the one-worker search on a loaded
2-core machine: 0.06-0.33 units per wall second (coarse zoo graphs, 60- and
300-node layered graphs), so the budget is normally spent within 15-80 % of
the limit and the wall clock rarely decides."""


def _cp():
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - ortools is a core dependency
        raise MissingDependency("placement algorithm 'milp' needs OR-Tools: pip install ortools") from exc
    return cp_model


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- model
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


def _units(graph: Graph) -> tuple[list[int], list[list[int]]]:
    """Colocation groups and single nodes, ranked by first topological index."""
    group_unit: dict[str, int] = {}
    unit_of = [-1] * graph.n
    units: list[list[int]] = []
    for v in graph.topo_order():
        c = graph.colocation[v]
        if c is not None and c in group_unit:
            u = group_unit[c]
            units[u].append(v)
        else:
            u = len(units)
            units.append([v])
            if c is not None:
                group_unit[c] = u
        unit_of[v] = u
    return unit_of, units


def identical_classes(graph: Graph, cluster: Cluster) -> list[list[int]]:
    """Classes of interchangeable devices: same type, speed and memory, and
    swapping the two is an automorphism of the link matrices (so every
    permutation inside a class is one).  Empty when an edge has per-pair
    measured times (``comm_s_by_pair`` names devices)."""
    if any(graph.edge_comm):
        return []
    k = cluster.k
    bw, lat, devs = cluster.bandwidth, cluster.latency, cluster.devices

    def swappable(i: int, j: int) -> bool:
        if (devs[i].type, devs[i].speed, devs[i].memory) != (devs[j].type, devs[j].speed, devs[j].memory):
            return False
        for m in (bw, lat):
            if m[i][j] != m[j][i]:
                return False
            for x in range(k):
                if x in (i, j):
                    continue
                if m[i][x] != m[j][x] or m[x][i] != m[x][j]:
                    return False
        return True

    classes: list[list[int]] = []
    for d in range(k):
        for cl in classes:
            if swappable(cl[0], d):
                cl.append(d)
                break
        else:
            classes.append([d])
    return [cl for cl in classes if len(cl) > 1]


def auto_resolution(upper_s: float) -> float:
    """The power of ten that puts *upper_s* seconds at 1e5-1e6 units."""
    if not (upper_s > 0 and math.isfinite(upper_s)):
        return 1e-6
    return 10.0 ** math.floor(math.log10(upper_s / 1e5))


#: Longest integer duration given to CP-SAT.  A longer node or transfer time is
#: clamped to it: it is ~1e6 times any horizon built from a warm start (which
#: sits at 1e5-1e6 units), so such an option stays infeasible, and every sum
#: in the model stays far below CP-SAT's 2^62 (and no inf reaches int()).
UNITS_MAX = 2**40


def _to_units(x: float, res: float) -> int:
    u = x / res + 0.5
    return int(math.floor(u)) if u < UNITS_MAX else UNITS_MAX


def integer_durations(graph: Graph, cluster: Cluster, resolution: float, costs: CostModel
                      ) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Node times ``dur[v][d]`` and tensor transfer times ``comm[t][a][b]``
    in units of *resolution* seconds, rounded to nearest, at most :data:`UNITS_MAX`."""
    k, res = cluster.k, resolution
    dur = [[_to_units(costs.time[v][d], res) for d in range(k)] for v in range(graph.n)]
    comm = [[[0 if a == b else _to_units(costs.tensor_comm(t, a, b), res) for b in range(k)] for a in range(k)]
            for t in range(len(graph.tensor_src))]
    return dur, comm


def build_model(graph: Graph, cluster: Cluster, *, resolution: float, congestion: str = "channel",
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
    Moirai (moirai.txt) III-D: objective Eq. 4, assignment Eq. 4c, memory
    Eq. 5, non-overlap Eq. 6, communication Eq. 7, congestion Eq. 8.
    """
    cp_model = _cp()
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"milp: unknown congestion rule '{congestion}' (use channel, port or none)")
    costs = cost_model(graph, cluster, costs)
    n, k = graph.n, cluster.k
    res = float(resolution)
    model = cp_model.CpModel()
    model.name = f"moirai:{graph.name}"
    unit_of, units = _units(graph)
    devs = cluster.devices

    dur, comm = integer_durations(graph, cluster, res, costs)
    unit_mem = [sum(graph.memory[v] for v in mem) for mem in units]
    allowed = [[unit_mem[u] <= devs[d].memory for d in range(k)] for u in range(len(units))]
    for u, mem in enumerate(units):
        if not any(allowed[u]):
            v = mem[0]
            what = (f"colocation group '{graph.colocation[v]}' ({len(mem)} nodes)" if graph.colocation[v] is not None
                    else f"node '{graph.ids[v]}'")
            raise Infeasible(
                f"milp: {what} needs {unit_mem[u]} bytes but the largest device has "
                f"{max(d.memory for d in devs)}; no placement fits (use a larger cluster or split the op)")

    # tensors and their consumers (deduplicated, in edge order)
    consumers: list[list[int]] = []
    for t in range(len(graph.tensor_src)):
        seen: list[int] = []
        for e in graph.tensor_edges[t]:
            c = graph.edge_dst[e]
            if c not in seen:
                seen.append(c)
        consumers.append(seen)

    mindur = [min(dur[v][d] for d in range(k) if allowed[unit_of[v]][d]) for v in range(n)]
    if horizon is None:
        horizon = sum(max(dur[v][d] for d in range(k) if allowed[unit_of[v]][d]) for v in range(n))
        for t in range(len(comm)):
            horizon += (k - 1) * max((comm[t][a][b] for a in range(k) for b in range(k)), default=0)
    horizon = max(int(horizon), 1)
    # earliest start / remaining work at the fastest allowed device, no communication
    head = [int(x) for x in downward_rank(graph, mindur.__getitem__, lambda e: 0)]
    tail = [int(x) for x in upward_rank(graph, mindur.__getitem__, lambda e: 0)]
    cp_lb = max((tail[v] + head[v] for v in range(n)), default=0)
    if cp_lb > horizon:
        horizon = cp_lb

    x: list[list] = []
    for u in range(len(units)):
        row = [model.new_bool_var(f"x_{u}_{d}") if allowed[u][d] else None for d in range(k)]
        model.add_exactly_one([lit for lit in row if lit is not None])
        x.append(row)

    def lit(v: int, d: int):
        return x[unit_of[v]][d]

    start, end = [], []
    dev_intervals: list[list] = [[] for _ in range(k)]
    for v in range(n):
        s = model.new_int_var(head[v], max(head[v], horizon - tail[v]), f"s_{v}")
        e = model.new_int_var(head[v] + mindur[v], horizon, f"e_{v}")
        terms = []
        for d in range(k):
            xl = lit(v, d)
            if xl is None:
                continue
            dev_intervals[d].append(model.new_optional_fixed_size_interval_var(s, dur[v][d], xl, f"iv_{v}_{d}"))
            terms.append(dur[v][d] * xl)
        model.add(e == s + sum(terms))
        start.append(s)
        end.append(e)
    for d in range(k):
        model.add_no_overlap(dev_intervals[d])

    # Eq. 5: memory
    for d in range(k):
        terms = [(unit_mem[u], x[u][d]) for u in range(len(units)) if x[u][d] is not None and unit_mem[u] > 0]
        if sum(m for m, _ in terms) > devs[d].memory:
            model.add(sum(m * xl for m, xl in terms) <= devs[d].memory)

    makespan = model.new_int_var(cp_lb, horizon, "makespan")
    for v in range(n):
        if not graph.succ[v]:
            model.add(makespan >= end[v])
    for d in range(k):  # redundant: a device's load
        terms = [dur[v][d] * lit(v, d) for v in range(n) if lit(v, d) is not None and dur[v][d] > 0]
        if terms:
            model.add(makespan >= sum(terms))

    # precedence (Eq. 4a) and transfers (Eq. 7)
    for e in range(graph.m):
        model.add(start[graph.edge_dst[e]] >= end[graph.edge_src[e]])
    transfers: dict[tuple[int, int], tuple] = {}
    chan: dict[tuple[int, int], list] = {}
    up: list[list] = [[] for _ in range(k)]
    down: list[list] = [[] for _ in range(k)]
    for t, p in enumerate(graph.tensor_src):
        cons = [c for c in consumers[t] if unit_of[c] != unit_of[p]]
        if not cons:
            continue
        for b in range(k):
            on_b = [c for c in cons if lit(c, b) is not None]
            srcs = [a for a in range(k) if a != b and lit(p, a) is not None]
            if not on_b or not srcs:
                continue
            y = model.new_bool_var(f"y_{t}_{b}")
            pb = lit(p, b)
            for c in on_b:
                model.add_bool_or([lit(c, b).Not(), y] + ([pb] if pb is not None else []))
            if pb is not None:
                model.add_implication(y, pb.Not())
            model.add_bool_or([y.Not()] + [lit(c, b) for c in on_b])
            tau = model.new_int_var(head[p] + mindur[p], horizon, f"tau_{t}_{b}")
            model.add(tau >= end[p])
            zs = {}
            arr_terms = []
            for a in srcs:
                z = model.new_bool_var(f"z_{t}_{a}_{b}")
                pa = lit(p, a)
                model.add_bool_or([pa.Not(), y.Not(), z])
                model.add_implication(z, pa)
                model.add_implication(z, y)
                iv = model.new_optional_fixed_size_interval_var(tau, comm[t][a][b], z, f"tr_{t}_{a}_{b}")
                zs[a] = z
                arr_terms.append(comm[t][a][b] * z)
                chan.setdefault((a, b), []).append(iv)
                up[a].append(iv)
                down[b].append(iv)
            for c in on_b:
                model.add(start[c] >= tau + sum(arr_terms)).only_enforce_if([y, lit(c, b)])
            transfers[(t, b)] = (tau, y, zs)
    if congestion == "channel":
        for key in sorted(chan):
            if len(chan[key]) > 1:
                model.add_no_overlap(chan[key])
    elif congestion == "port":
        for lst in up + down:
            if len(lst) > 1:
                model.add_no_overlap(lst)
    # the simulator's tie rule: one producer's transfers that share a channel
    # (channel) or its uplink (port) leave in tensor order (then destination
    # order); a chain of running maxima keeps this linear in their number
    chains: list[tuple[list, list]] = []
    if congestion != "none":
        out_tensors: list[list[int]] = [[] for _ in range(n)]
        for t, p in enumerate(graph.tensor_src):
            out_tensors[p].append(t)
        for p in range(n):
            if congestion == "channel":
                seqs = [[(t, b) for t in out_tensors[p] if (t, b) in transfers] for b in range(k)]
            else:
                seqs = [[(t, b) for t in out_tensors[p] for b in range(k) if (t, b) in transfers]]
            for seq in seqs:
                if len(seq) < 2:
                    continue
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
                chains.append((seq, lows))

    # symmetry breaking between identical devices
    classes = identical_classes(graph, cluster) if symmetry else []
    prefix: dict[tuple[int, int], list] = {}
    for cl in classes:
        for j in range(len(cl) - 1):
            d0, d1 = cl[j], cl[j + 1]
            # P[u] = group u or an earlier one is on d0
            prev = None
            plist = []
            for u in range(len(units)):
                xd1 = x[u][d1]
                if xd1 is not None:
                    if prev is None:
                        model.add(xd1 == 0)
                    else:
                        model.add_implication(xd1, prev)
                xd0 = x[u][d0]
                if xd0 is None:
                    plist.append(prev)
                    continue
                pu = model.new_bool_var(f"P_{d0}_{u}")
                if prev is None:
                    model.add(pu == xd0)
                else:
                    model.add_bool_or([pu.Not(), prev, xd0])
                    model.add_implication(prev, pu)
                    model.add_implication(xd0, pu)
                plist.append(pu)
                prev = pu
            prefix[(d0, d1)] = plist
    model.minimize(makespan)
    return model, MilpVars(resolution=res, horizon=horizon, unit_of=unit_of, units=units, x=x, start=start,
                           end=end, dur=dur, comm=comm, transfers=transfers, makespan=makespan, prefix=prefix,
                           classes=classes, chains=chains)


# --------------------------------------------------------------------------- hint
@dataclass
class _Hint:
    name: str
    device_of: list[int]
    order: list[list[int]] | None
    makespan: float
    fits: bool
    sched: Schedule
    sim_s: float = 0.0


def _heuristic_hint(graph: Graph, cluster: Cluster, names: Sequence[str], seed: int, congestion: str,
                    costs: CostModel, console, deadline: float = math.inf) -> tuple[_Hint | None, bool]:
    """Run each registered heuristic of *names*, simulate it, keep the best
    (memory-feasible first, then makespan, then list order).  The chain
    stops before a heuristic once ``time.perf_counter()`` is past
    *deadline*; returns ``(best, cut)`` with ``cut`` true when it did."""
    from .. import registry

    known = set(registry.names())
    best: _Hint | None = None
    for name in names:
        if name not in known or name == "milp":
            continue
        if time.perf_counter() >= deadline:
            return best, True
        try:
            p = registry.place(graph, cluster, name, seed=seed, costs=costs)
            if p.split_graph is not None:
                continue
            device_of, order = p.resolve(graph, cluster, f"{name} hint")
            check_colocation(graph, cluster, device_of, f"{name} hint")
            t_sim = time.perf_counter()
            sched = run_schedule(graph, cluster, device_of, order, congestion=congestion, costs=costs)
            sim_s = time.perf_counter() - t_sim
        except Exception as exc:  # a concurrent heuristic may fail; the chain goes on
            if console is not None:
                console.print(f"milp: hint '{name}' failed ({type(exc).__name__}: {exc}); skipped")
            continue
        loads = [0] * cluster.k
        for v, d in enumerate(device_of):
            loads[d] += graph.memory[v]
        fits = all(loads[d] <= cluster.devices[d].memory for d in range(cluster.k))
        h = _Hint(name, list(device_of), order, sched.makespan, fits, sched, sim_s)
        if console is not None:
            console.print(f"milp: hint {name}: simulated makespan {h.makespan:.6g} s"
                          + ("" if fits else " (OOM, not a fallback)"))
        if best is None or (not best.fits and fits) or (fits == best.fits and h.makespan < best.makespan):
            best = h
    return best, False


def _integer_schedule(graph: Graph, hint: _Hint, dur: list[list[int]], comm: list, congestion: str, k: int
                      ) -> tuple[list[int], dict, int]:
    """Replay the hint's realised orders (device order, channel/port order of
    transfers) with the model's integer durations: a schedule that satisfies
    every constraint of the model exactly.  Returns (start per node,
    {(t, b): transfer start}, makespan)."""
    dev = hint.device_of
    sched = hint.sched
    topo_idx = graph.topo_index()
    tasks = []  # (real start, real end, rank, kind, id)
    for v in range(graph.n):
        tasks.append((sched.start[v], sched.finish[v], 2 * topo_idx[v], 0, v))
    for tr in sched.transfers:
        p = graph.tensor_src[tr.tensor]
        tasks.append((tr.start, tr.end, 2 * topo_idx[p] + 1, 1, (tr.tensor, tr.dst_dev)))
    tasks.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4] if x[3] else (x[4],)))
    ist = [0] * graph.n
    iend = [0] * graph.n
    tstart: dict[tuple[int, int], int] = {}
    tend: dict[tuple[int, int], int] = {}
    dev_free = [0] * k
    send = LinkState(k, congestion, zero=0).send
    for _, _, _, kind, ident in tasks:
        if kind == 0:
            v = ident
            d = dev[v]
            s = dev_free[d]
            for e in graph.in_edges[v]:
                p = graph.edge_src[e]
                t = graph.edge_tensor[e]
                s = max(s, iend[p])
                if dev[p] != d:
                    s = max(s, tend[(t, d)])
            ist[v] = s
            iend[v] = s + dur[v][d]
            dev_free[d] = iend[v]
        else:
            t, b = ident
            p = graph.tensor_src[t]
            a = dev[p]
            s = send(a, b, iend[p], comm[t][a][b])
            tstart[(t, b)] = s
            tend[(t, b)] = s + comm[t][a][b]
    return ist, tstart, max(iend, default=0)


def _canonical_permutation(device_of: Sequence[int], mv: MilpVars, k: int) -> list[int]:
    """perm[d] = device the hint's device *d* becomes so that, inside each
    identical class, devices are used in order of their first group."""
    perm = list(range(k))
    for cl in mv.classes:
        first = {}
        for u, mem in enumerate(mv.units):
            d = device_of[mem[0]]
            if d in cl and d not in first:
                first[d] = u
        ranked = sorted(cl, key=lambda d: (first.get(d, len(mv.units)), d))
        for new, old in zip(cl, ranked):
            perm[old] = new
    return perm


def _add_hint(model, graph: Graph, mv: MilpVars, hint: _Hint, replay: tuple, k: int) -> None:
    """Hint every variable with the hint's integer *replay* (devices permuted
    into the symmetry-broken canonical form)."""
    ist, tstart, ims = replay
    perm = _canonical_permutation(hint.device_of, mv, k)
    dev = [perm[d] for d in hint.device_of]
    inv = [0] * k
    for old, new in enumerate(perm):
        inv[new] = old
    for u, mem in enumerate(mv.units):
        for d in range(k):
            if mv.x[u][d] is not None:
                model.add_hint(mv.x[u][d], dev[mem[0]] == d)
    for v in range(graph.n):
        model.add_hint(mv.start[v], ist[v])
        model.add_hint(mv.end[v], ist[v] + mv.dur[v][dev[v]])
    for (t, b), (tau, y, zs) in mv.transfers.items():
        p = graph.tensor_src[t]
        key = (t, inv[b])
        need = key in tstart
        model.add_hint(y, need)
        model.add_hint(tau, tstart[key] if need else ist[p] + mv.dur[p][dev[p]])
        for a, z in zs.items():
            model.add_hint(z, need and dev[p] == a)
    model.add_hint(mv.makespan, ims)
    for seq, lows in mv.chains:
        low = 0
        for (t, b), lv in zip(seq, lows):
            key = (t, inv[b])
            if key in tstart:
                low = max(low, tstart[key])
            model.add_hint(lv, low)
    for (d0, _), plist in mv.prefix.items():
        on = False
        for u, pu in enumerate(plist):
            on = on or dev[mv.units[u][0]] == d0
            if pu is not None and mv.x[u][d0] is not None:
                model.add_hint(pu, on)


# --------------------------------------------------------------------------- solve
def _callback_class():
    cp_model = _cp()

    class Progress(cp_model.CpSolverSolutionCallback):
        """Incumbent and bound to stderr on every improving solution."""

        def __init__(self, res: float, console, quiet: bool):
            super().__init__()
            self.res = res
            self.console = console
            self.quiet = quiet
            self.count = 0

        def on_solution_callback(self) -> None:
            self.count += 1
            if self.quiet:
                return
            obj = self.objective_value * self.res
            bound = self.best_objective_bound * self.res
            gap = (obj - bound) / obj if obj > 0 else 0.0
            self.console.print(f"milp: #{self.count} incumbent {obj:.6g} s, bound {bound:.6g} s, "
                               f"gap {gap:.2%}, {self.wall_time:.1f} s")

    return Progress


def model_size(graph: Graph, k: int) -> int:
    """Upper bound on the optional intervals of :func:`build_model`: one per
    (node, device) and one per (tensor, source, destination device)."""
    return graph.n * k + len(graph.tensor_src) * k * (k - 1)


def _hint_names(hint: str) -> tuple[str, ...]:
    if hint == "none":
        return ()
    if hint == "auto":
        return HINT_CHAIN
    from .. import registry

    if hint == "milp":
        raise InvalidInput("milp: hint cannot be 'milp' itself (use auto, none or a heuristic's name)")
    registry.get(hint)  # unknown name -> InvalidInput listing the known ones
    return (hint,)


def _search(cp_model, model, *, deterministic: bool, workers: int, det_budget: float, cap: float, seed: int,
            res: float, console, quiet: bool):
    """Run CP-SAT on *model*: ``(solver, status, wall_cut)``.

    Deterministic: one worker (CP-SAT's sequential search repeats exactly
    under a deterministic-time limit), no LP relaxation (measured: building
    it for a 1,300-node model took 30 s with no time check, and the
    interleaved multi-worker mode overran its wall-clock limit by 90 s), the
    search stopped by ``max_deterministic_time = det_budget``; the wall clock
    *cap* only caps it and ``wall_cut`` says when it did.  Otherwise
    *workers* in parallel until *cap* seconds.  A watchdog calls
    ``stop_search`` shortly after *cap* in case a phase ignores the limit.
    """
    solver = cp_model.CpSolver()
    prm = solver.parameters
    if deterministic:
        prm.num_workers = 1
        prm.max_deterministic_time = det_budget
        prm.linearization_level = 0
    else:
        prm.num_workers = workers
    prm.max_time_in_seconds = max(cap, 0.01)
    prm.random_seed = int(seed) % (2**31)
    prm.log_search_progress = False
    # SAT probing in presolve costs seconds on a few hundred nodes (measured:
    # 5 s of a 10 s budget on 168 nodes, before the hint is even tried)
    prm.cp_model_probing_level = 0
    watchdog = threading.Timer(1.05 * cap + 0.2, solver.stop_search)
    watchdog.daemon = True
    watchdog.start()
    try:
        status = solver.solve(model, _callback_class()(res, console, quiet))
    finally:
        watchdog.cancel()
    done = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    wall_cut = deterministic and not done and solver.deterministic_time < 0.99 * det_budget
    if wall_cut:
        console.print(f"milp: the wall clock stopped the search after {solver.wall_time:.3g} s, at "
                      f"{solver.deterministic_time:.3g} of its {det_budget:.3g} deterministic-time budget, so this "
                      f"result may differ between runs; raise --time-limit or lower -p det_time for a repeatable one")
    return solver, status, wall_cut


def _solution(graph: Graph, k: int, mv: MilpVars, solver) -> tuple[list[int], list[list[int]]]:
    """Device per node and per-device order (solver start times, ties by
    end time then topological index) of the solver's incumbent."""
    n = graph.n
    units_dev = [next(d for d in range(k) if mv.x[u][d] is not None and solver.boolean_value(mv.x[u][d]))
                 for u in range(len(mv.units))]
    device_of = [units_dev[mv.unit_of[v]] for v in range(n)]
    starts = [solver.value(mv.start[v]) for v in range(n)]
    ends = [solver.value(mv.end[v]) for v in range(n)]
    topo_idx = graph.topo_index()
    order = [sorted((v for v in range(n) if device_of[v] == d), key=lambda v: (starts[v], ends[v], topo_idx[v]))
             for d in range(k)]
    return device_of, order


def _too_large(graph: Graph, k: int, time_limit: float) -> str | None:
    """The message saying the model is too large for *time_limit* (more than
    ``TOO_LARGE`` nodes, or more than ``INTERVALS_PER_SECOND`` optional
    intervals per second), or None."""
    n, size = graph.n, model_size(graph, k)
    if n <= TOO_LARGE and size <= INTERVALS_PER_SECOND * time_limit:
        return None
    need = "" if n > TOO_LARGE else f" (it needs about {size / INTERVALS_PER_SECOND:.0f} s)"
    return (f"milp: graph '{graph.name}' ({n} nodes) makes a model of up to {size} intervals, too large to "
            f"solve within --time-limit {time_limit:g} s{need}; coarsen first "
            f"(`placer coarsen G | placer place - --algo milp`)" + ("" if n > TOO_LARGE else " or raise --time-limit"))


def _hinted_model(graph: Graph, cluster: Cluster, best: _Hint | None, feasible: bool, res: float, congestion: str,
                  costs: CostModel):
    """:func:`build_model`, its horizon bounded by a memory-feasible warm
    start's integer replay, every variable hinted with that replay."""
    horizon = replay = None
    if best is not None:
        dur, comm = integer_durations(graph, cluster, res, costs)
        replay = _integer_schedule(graph, best, dur, comm, congestion, cluster.k)
        if feasible:
            horizon = replay[2]  # a memory-feasible hint bounds the optimum
    model, mv = build_model(graph, cluster, resolution=res, congestion=congestion, horizon=horizon, costs=costs)
    if best is not None:
        _add_hint(model, graph, mv, best, replay, cluster.k)
    return model, mv


def solve(graph: Graph, cluster: Cluster, *, time_limit: float = 60.0, workers: int = 8, seed: int = 0,
          resolution: float = 0.0, congestion: str = "channel", hint: str = "auto",
          quiet: bool = False, deterministic: bool = True, det_time: float = 0.0,
          costs: CostModel | None = None) -> Placement:
    """Place *graph* on *cluster* with the CP-SAT model of :func:`build_model`.

    Parameters
    ----------
    time_limit : float
        Wall-clock budget in seconds for the whole call: the OR-Tools import,
        the warm-start heuristics (started only within ``HINT_SHARE`` of it),
        model building, the search (what is left,
        minus a reserve for the final simulations) and the result.  A model
        larger than ``INTERVALS_PER_SECOND`` x *time_limit* optional
        intervals (:func:`model_size`) is not built: the best warm start is
        returned with a message saying to coarsen first (or
        :class:`SolverError` when there is none).
    workers : int
        CP-SAT search workers when ``deterministic`` is false, capped at
        ``os.cpu_count()`` (the deterministic search uses one).
    seed : int
        CP-SAT ``random_seed`` and the heuristics' seed.
    resolution : float
        Seconds per integer unit; 0 = automatic (:func:`auto_resolution` of
        the hint's makespan, or of the serial bound).
    congestion : {"channel", "port", "none"}
        As the simulator; the placement is scored under the same rule.
    hint : str
        ``auto`` (best of adjusting, heft, single-device, whichever are
        registered), ``none``, or one algorithm's name.
    quiet : bool
        No progress lines (warnings about size and missing solutions still
        go to stderr).
    deterministic : bool
        Reproducible search (the project's "same input and seed, same
        output"): the search stops at a counted budget, CP-SAT's
        deterministic time ``det_time`` (see :func:`_search`); the wall
        clock only caps it, and when it does a line on stderr says the
        result may differ between runs (``estimate.repeatable`` false).
        ``deterministic=False`` searches with ``workers`` in parallel until
        the wall-clock budget; then only a proven optimum's objective is
        repeatable.
    det_time : float
        The deterministic budget in CP-SAT deterministic-time units (about
        seconds of one core of a fast machine); 0 = ``DET_PER_SECOND`` x
        *time_limit*.

    Returns
    -------
    Placement
        With a per-device ``order`` (solver start times, ties by topological
        index) and ``estimate``: ``status`` (CP-SAT's status, except that
        OPTIMAL is downgraded to FEASIBLE when the returned placement's
        simulated makespan does not meet the proven bound within the
        rounding - never FEASIBLE called optimal), ``solver_status``,
        ``makespan_s`` (simulated makespan of the returned placement,
        ``makespan_by: "simulator"``), ``objective_s``, ``best_bound_s``,
        ``gap``, ``resolution_s``, ``hint`` / ``hint_makespan_s``,
        ``source`` (``solver`` or ``hint``), ``det_time`` /
        ``det_time_used``, ``repeatable`` and a ``note`` when the hint was
        returned.  Status, makespan and bounds hold for the graph solved:
        on a coarse graph ``estimate.graph`` is ``"coarse"`` (labelled
        "OPTIMAL (coarse graph)"), and when the original graph is known
        (``graph.origin``) ``original_makespan_s`` is the returned
        placement's makespan on it (``hint_original_makespan_s`` the warm
        start's).

    Raises
    ------
    Infeasible
        CP-SAT proves that no placement fits (memory), or a group fits on no
        device.
    SolverError
        No solution within the budget (or a model too large for it) and no
        memory-feasible heuristic.

    Notes
    -----
    Never worse than the warm start: the solver's placement is returned only
    when it simulates no slower than the best memory-feasible heuristic - on
    the original graph when it is known (a placement that is optimal for a
    coarse graph may lose to a heuristic on the original), else on the graph
    solved.

    References
    ----------
    Moirai (moirai.txt) III-D, Eq. 4-8; the OR-Tools flexible job-shop
    sample for the interval formulation.
    """
    t0 = time.perf_counter()
    cp_model = _cp()  # the import (about a second) counts against the limit
    console = _console()
    quiet = quiet or not chatty()  # placer compare runs cells quietly unless -v
    if congestion not in CONGESTION_RULES:
        raise InvalidInput(f"milp: unknown congestion rule '{congestion}' (use channel, port or none)")
    if not time_limit > 0:
        raise InvalidInput(f"milp: time_limit must be > 0 seconds, got {time_limit}")
    if det_time < 0:
        raise InvalidInput(f"milp: det_time must be >= 0 (0 = automatic), got {det_time}")
    workers = 1 if deterministic else max(1, min(int(workers), os.cpu_count() or 1))
    det_budget = det_time if det_time > 0 else DET_PER_SECOND * time_limit
    n, k = graph.n, cluster.k
    costs = cost_model(graph, cluster, costs)
    params = {"workers": workers, "congestion": congestion}
    if deterministic:
        params["det_time"] = det_budget
    if n == 0:
        return Placement.from_indices(graph, cluster, [], algorithm="milp", order=[[] for _ in range(k)],
                                      params=params, seed=seed,
                                      estimate={"status": "OPTIMAL", "makespan_s": 0.0, "makespan_by": "simulator",
                                                "objective_s": 0.0, "best_bound_s": 0.0, "gap": 0.0})
    if graph.total_memory() > cluster.total_memory():
        raise Infeasible(f"milp: graph '{graph.name}' needs {graph.total_memory()} bytes but cluster "
                         f"'{cluster.name}' has {cluster.total_memory()} in all; no placement fits")
    names = _hint_names(hint)
    best, chain_cut = (_heuristic_hint(graph, cluster, names, seed, congestion, costs, None if quiet else console,
                                       deadline=time.perf_counter() + HINT_SHARE * time_limit)
                         if names else (None, False))
    if chain_cut:
        console.print(f"milp: the wall clock cut the warm-start chain after {HINT_SHARE:.0%} of --time-limit "
                      f"{time_limit:g} s, so this result may differ between runs")
    fallback = best if best is not None and best.fits else None
    t_orig = time.perf_counter()
    fb_orig = (original_makespan(graph, cluster, fallback.device_of, fallback.order, congestion=congestion,
                                 costs=costs) if fallback is not None else None)
    orig_s = time.perf_counter() - t_orig if graph.origin is not None else 0.0
    base_est = {"congestion": congestion, "lower_bound_s": lower_bound(graph, cluster, costs),
                "makespan_by": "simulator"}
    if fb_orig is not None:
        base_est["hint_original_makespan_s"] = fb_orig

    def from_hint(status: str, why: str, note: str, extra: dict | None = None) -> Placement:
        assert fallback is not None
        est = {**base_est, "status": status, "makespan_s": fallback.makespan, "source": "hint",
               "hint": fallback.name, "hint_makespan_s": fallback.makespan, "note": note,
               "repeatable": bool(deterministic and not chain_cut)}
        if fb_orig is not None:
            est["original_makespan_s"] = fb_orig
        est.update(extra or {})
        est["source"] = "hint"
        est["caveat"] = f"the warm start '{fallback.name}', not a solver solution ({why})"
        return Placement.from_indices(graph, cluster, fallback.device_of, algorithm="milp",
                                      order=fallback.order, params=params, seed=seed, estimate=est)

    msg = _too_large(graph, k, time_limit)
    if msg:
        console.print(msg)
        if fallback is None:
            raise SolverError(msg)
        return from_hint("UNKNOWN", "model too large for the time limit",
                         f"model not built ({n} nodes, {model_size(graph, k)} intervals); "
                         f"returned hint '{fallback.name}'")
    if n > LARGE:
        console.print(f"milp: {n} nodes is large for CP-SAT; expect no optimality proof within {time_limit:g} s "
                      f"(consider `placer coarsen` first)")
    res = float(resolution)
    if res <= 0:
        upper = best.makespan if best is not None else sum(costs.max_time)
        res = auto_resolution(upper)
    longest = max([0.0, *costs.max_time, *(costs.max_comm(e) for e in range(graph.m))])
    if longest / res >= UNITS_MAX / 2:  # CP-SAT's integers: keep every duration below 2^39 units
        if resolution > 0:
            raise InvalidInput(f"milp: resolution {res:g} s makes the longest time ({longest:.6g} s) more than "
                               f"2^39 units; use -p resolution={longest / (UNITS_MAX / 2):.3g} or coarser")
        res = 10.0 ** math.ceil(math.log10(longest / (UNITS_MAX / 2)))
    params["resolution"] = res
    model, mv = _hinted_model(graph, cluster, best, fallback is not None, res, congestion, costs)
    # the result needs a simulation of the graph solved and one of the original; the
    # caller needs a moment to write it and exit (placer place: limit + 10 % + 1 s in all)
    reserve = 2.0 * (best.sim_s if best is not None else 0.0) + 2.0 * orig_s + 0.02 * time_limit \
        + min(0.5, 0.05 * time_limit)
    cap = t0 + time_limit - reserve - time.perf_counter()
    if cap <= 0.0:
        msg = f"milp: no time left for the search within --time-limit {time_limit:g} s; coarsen first or raise it"
        console.print(msg)
        if fallback is None:
            raise SolverError(msg)
        return from_hint("UNKNOWN", "no time left to search",
                         f"no time left to search; returned hint '{fallback.name}'", {"repeatable": False})
    solver, status, wall_cut = _search(cp_model, model, deterministic=deterministic, workers=workers,
                                       det_budget=det_budget, cap=cap, seed=seed, res=res, console=console,
                                       quiet=quiet)
    status_name = solver.status_name(status)
    search = {"resolution_s": res, "solve_time_s": time.perf_counter() - t0,
              "repeatable": bool(deterministic and not wall_cut and not chain_cut)}
    if deterministic:
        search["det_time_used"] = solver.deterministic_time
    if status == cp_model.INFEASIBLE:
        caps = ", ".join(f"{d.id} {d.memory}" for d in cluster.devices)
        raise Infeasible(f"milp: CP-SAT proved no placement of '{graph.name}' fits the devices' memory "
                         f"(needs {graph.total_memory()} bytes in all; capacities: {caps}); "
                         f"use more or larger devices")
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"milp: CP-SAT rejected the model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        msg = (f"milp: CP-SAT found no solution for {n} nodes within {solver.wall_time:.3g} s; "
               f"run `placer coarsen` first or raise --time-limit")
        console.print(msg)
        if fallback is None:
            raise SolverError(msg)
        return from_hint(status_name, "no solution within the budget",
                         f"no solver solution; returned hint '{fallback.name}'", search)
    return _result(graph, cluster, mv, solver, status == cp_model.OPTIMAL, status_name, best, fallback, fb_orig,
                   {**base_est, **search}, params, seed, congestion, costs, console, quiet)


def _result(graph: Graph, cluster: Cluster, mv: MilpVars, solver, optimal: bool, status_name: str,
            best: _Hint | None, fallback: _Hint | None, fb_orig: float | None, est: dict, params: dict, seed: int,
            congestion: str, costs: CostModel, console, quiet: bool) -> Placement:
    """The placement to return: the solver's, or the warm start when that
    simulates faster (on the original graph when it is known)."""
    k, res = cluster.k, mv.resolution
    device_of, order = _solution(graph, k, mv, solver)
    sim = run_schedule(graph, cluster, device_of, order, congestion=congestion, costs=costs).makespan
    sim_orig = original_makespan(graph, cluster, device_of, order, congestion=congestion, costs=costs)
    obj = solver.objective_value * res
    bound = solver.best_objective_bound * res
    gap = (obj - bound) / obj if obj > 0 else 0.0
    est.update({"status": status_name, "solver_status": status_name, "objective_s": obj, "best_bound_s": bound,
                "gap": gap})
    if best is not None:
        est["hint"] = best.name
        est["hint_makespan_s"] = best.makespan
    where = " (coarse graph)" if graph.is_coarse else ""
    if not quiet:
        console.print(f"milp: {status_name}{where} objective {obj:.6g} s, bound {bound:.6g} s, gap {gap:.2%}; "
                      f"simulated {sim:.6g} s" + (f", hint {best.makespan:.6g} s" if best is not None else "")
                      + (f"; on the original graph {sim_orig:.6g} s" if sim_orig is not None else ""))
    # OPTIMAL describes the returned placement only when its simulated
    # makespan meets the proven bound (up to the rounding of every task)
    tol = res * (graph.n + len(graph.tensor_src))

    def honest(ms: float) -> str:
        return "OPTIMAL" if optimal and ms <= bound + tol else "FEASIBLE"

    judged_orig = sim_orig is not None and fb_orig is not None
    if fallback is not None and ((fb_orig < sim_orig) if judged_orig else (fallback.makespan < sim)):
        on = "on the original graph " if judged_orig else ""
        mine, theirs = (sim_orig, fb_orig) if judged_orig else (sim, fallback.makespan)
        est.update({"solver_makespan_s": sim, "status": honest(fallback.makespan), "source": "hint",
                    "note": f"solver's placement simulates to {mine:.6g} s {on}, worse than hint "
                            f"'{fallback.name}' ({theirs:.6g} s); returned the hint".replace(" ,", ",")})
        if sim_orig is not None:
            est["solver_original_makespan_s"] = sim_orig
        est["makespan_s"] = fallback.makespan
        est["caveat"] = f"the warm start '{fallback.name}': the solver's placement simulated slower {on}".strip()
        if fb_orig is not None:
            est["original_makespan_s"] = fb_orig
        return Placement.from_indices(graph, cluster, fallback.device_of, algorithm="milp", order=fallback.order,
                                      params=params, seed=seed, estimate=est)
    est.update({"status": honest(sim), "makespan_s": sim, "source": "solver"})
    if sim_orig is not None:
        est["original_makespan_s"] = sim_orig
    return Placement.from_indices(graph, cluster, device_of, algorithm="milp", order=order, params=params, seed=seed,
                                  estimate=est)


@register("milp", paper="Moirai", section="III-D, Eq. 5-8",
          summary="Exact placement + schedule by CP-SAT (Moirai's MILP), warm-started; for coarse graphs.",
          params={
              "time_limit": Param(float, 60.0, "wall-clock limit in seconds for the whole call", gt=0,
                                  max=TIME_MAX),
              "workers": Param(int, 8, "CP-SAT workers when deterministic=false (capped at the CPU count)", min=1,
                               max=1024),
              "resolution": Param(float, 0.0, "seconds per integer time unit (0 = automatic)", min=0,
                                 max=TIME_MAX),
              "congestion": Param(str, "channel", "transfer contention rule, as the simulator",
                                  choices=("channel", "port", "none")),
              "hint": Param(str, "auto", "warm start: auto, none, or an algorithm name"),
              "deterministic": Param(bool, True, "reproducible search (one worker, deterministic-time budget); "
                                                 "false = parallel workers until the wall clock"),
              "det_time": Param(float, 0.0, "deterministic budget in CP-SAT deterministic-time units "
                                            f"(0 = {DET_PER_SECOND:g} x time_limit)", min=0, max=TIME_MAX),
          },
          quick_params={"time_limit": 5}, uses_origin=True)
def milp(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
         time_limit: float = 60.0, workers: int = 8,
         resolution: float = 0.0, congestion: str = "channel", hint: str = "auto",
         deterministic: bool = True, det_time: float = 0.0) -> Placement:
    """Moirai's exact placement (III-D) solved by CP-SAT; see :func:`solve`.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> p = milp(g, uniform(2, bandwidth=100.0, latency=0.0), time_limit=5, workers=1, hint="none")
    >>> p.estimate["status"], p.estimate["makespan_s"]
    ('OPTIMAL', 3.0)
    """
    return solve(graph, cluster, time_limit=time_limit, workers=workers, seed=seed, resolution=resolution,
                 congestion=congestion, hint=hint, deterministic=deterministic, det_time=det_time, costs=costs)
