"""The judge's memory rules: each device's memory along the realised
schedule (docs/design.md, "The simulator", item 5).

Rules
-----
``static`` - the seed papers' rule: a device holds the sum of its nodes'
``memory_bytes`` for the whole step (Moirai, constraint (4d) / Eq. (5);
Celeritas, Algorithm 2 lines 9 and 21, the available memory ``Ava_m``).

``time`` (the default) - what a framework's caching allocator holds when
it frees a tensor after its last use (issue 22; Narayanan et al., SC'21,
section 2.2: a pipeline stage holds the activations of the micro-batches
in flight, not of all of them).  Device ``d``'s live memory at time ``t``
is the sum of

* the resident bytes (``resident_bytes``,
  :mod:`celeritas_cli.model.residency`) of its nodes, for the whole step;
* for each node ``v`` on ``d``, its activation ``memory_bytes -
  resident_bytes`` from ``start(v)`` until the latest of ``finish(v)``,
  the finish of the last consumer on ``d`` of any of ``v``'s tensors, and
  the end of the last transfer of ``v``'s tensors out of ``d``;
* for each tensor received on ``d``, its bytes from the start of its
  transfer until its last consumer on ``d`` finishes.

Intervals are half-open ``[from, until)``: memory freed at ``t`` is free
for what starts at ``t``; an interval of length zero counts at its instant.
Outputs that are not kept (activation 0) are transient and not modelled,
as in the static rule.  Hence ``peak(time) <= static + received bytes``.
A graph that declares no ``resident_bytes`` is judged by the static rule,
and :func:`applied_rule` says so.

Cost: one pass over the tensors' consumers and the transfers, and one sort
of each device's ``2 (V_d + X_d)`` events: ``O((V + E) log V)``, after the
simulation and outside its event loop.

Example
-------
A chain ``a -> b`` on one device, 2 bytes resident in ``a``, activations of
4 and 3 bytes: ``a``'s activation lives until ``b`` (its consumer)
finishes, so the peak is 2 + 4 + 3 = 9 at t = 1, the static sum 9 too.
With ``b`` on another device (the byte's transfer takes 1 s): 6 on the
first (``a``'s activation lives until the transfer ends) and 3 + 1 received
byte on the second, from ``b``'s start at t = 2.

>>> from celeritas_cli.model.graph import build
>>> from celeritas_cli.model.cluster import uniform
>>> from celeritas_cli.sim.simulator import run_schedule
>>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 6, "resident_bytes": 2},
...                  {"id": "b", "compute_s": 1, "memory_bytes": 3, "resident_bytes": 0}],
...           [{"src": "a", "dst": "b", "bytes": 1}])
>>> c = uniform(2, bandwidth=1.0, latency=0.0)
>>> peaks(g, run_schedule(g, c, [0, 0]), 2)
[9, 0]
>>> prof = judge_memory(g, run_schedule(g, c, [0, 1]), 2)
>>> prof.peak, prof.peak_at, prof.static
([6, 4], [0.0, 2.0], [6, 3])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from ..errors import InvalidInput
from ..model.graph import Graph
from ..model.residency import resident_list

RULES = ("time", "static")
DEFAULT_RULE = "time"
#: points per device in ``memory_timeline`` (max-pooled beyond that)
TIMELINE_POINTS = 2000
#: entries of ``peak_live`` per device
TOP_LIVE = 5
_FREE, _ALLOC, _FREE_INSTANT = 0, 1, 2  # event order at one instant
_KINDS = ("resident", "activation", "received")


def check_rule(rule: str) -> str:
    """*rule* if it is a memory rule of the judge.

    Raises
    ------
    InvalidInput
        Any other value.
    """
    if rule not in RULES:
        raise InvalidInput(f"unknown memory rule {rule!r} (known: {', '.join(RULES)})")
    return rule


def applied_rule(graph: Graph, asked: str = DEFAULT_RULE) -> tuple[str, str | None]:
    """``(rule, note)``: the rule the judge applies to *graph* when *asked*
    for one, and why it is not the one asked (None when it is)."""
    check_rule(asked)
    if asked == "time" and resident_list(graph) is None:
        return "static", (f"graph '{graph.name}' declares no resident_bytes (an older or converted file), so "
                          f"every node's memory counts for the whole step (the static rule)")
    return asked, None


@dataclass
class MemoryProfile:
    """Per device ``d``: ``peak[d]`` (bytes, under ``rule``), ``static[d]``
    (the static sum), ``peak_at[d]`` (seconds, the first instant of the
    peak), ``live[d]`` (the largest items live then, ``{"node", "bytes",
    "kind"}`` with ``kind`` resident / activation / received, and
    ``tensor`` for a received one) and ``timeline[d]`` (``[[t, bytes],
    ...]``: from ``t`` on, ``bytes`` are live; at most
    :data:`TIMELINE_POINTS` points, max-pooled)."""

    rule: str
    note: str | None
    peak: list[int]
    static: list[int]
    peak_at: list[float]
    live: list[list[dict]] = field(default_factory=list)
    timeline: list[list[list]] = field(default_factory=list)


def _intervals(graph: Graph, sched, k: int, resident: list[int]) -> tuple[list[int], list[list[tuple]]]:
    """Resident bytes per device and, per device, the live intervals
    ``(from, until, bytes, kind, node, tensor)`` of the time rule (module
    docstring; ``kind`` 1 an activation, 2 a received tensor, -1 for no
    tensor); nodes not placed (device -1) are left out."""
    dev, start, finish, mem = sched.device_of, sched.start, sched.finish, graph.memory
    cons, tsrc = graph.tensor_consumers(), graph.tensor_src
    until = list(finish)
    for t, p in enumerate(tsrc):  # the last consumer on the producer's device
        dp = dev[p]
        u = until[p]
        for c in cons[t]:
            if dev[c] == dp and finish[c] > u:
                u = finish[c]
        until[p] = u
    spans: list[list[tuple]] = [[] for _ in range(k)]
    for tr in sched.transfers:  # the last transfer out; the received copy until its last consumer there
        t, b = tr.tensor, tr.dst_dev
        p = tsrc[t]
        if tr.end > until[p]:
            until[p] = tr.end
        if tr.nbytes > 0:
            last = max([finish[c] for c in cons[t] if dev[c] == b], default=tr.end)
            spans[b].append((tr.start, max(last, tr.end), tr.nbytes, 2, p, t))
    base = [0] * k
    for v, d in enumerate(dev):
        if d >= 0:
            base[d] += resident[v]
            act = mem[v] - resident[v]
            if act > 0:
                spans[d].append((start[v], until[v], act, 1, v, -1))
    return base, spans


def _events(spans: list[tuple], base: int) -> tuple[list[tuple], list[int]]:
    """The *spans*' events ``(t, order, bytes)`` sorted (at one instant:
    what ends, then what starts, then what lasted no time ends), and the
    live bytes before each event and after the last (``run[i]`` before
    event ``i``)."""
    ev = [(s, _ALLOC, b) for s, e, b, *_ in spans]
    ev += [(e, _FREE if e > s else _FREE_INSTANT, -b) for s, e, b, *_ in spans]
    ev.sort()
    return ev, list(accumulate([x[2] for x in ev], initial=base))


def _peak(ev: list[tuple], run: list[int]) -> tuple[int, float]:
    """``(peak, its first instant)``: the largest live count, reached after
    an event that starts something (what ends at an instant is counted
    before, what lasts no time after, so no other prefix is larger)."""
    peak = max(run)
    i = run.index(peak)
    return peak, (ev[i - 1][0] if i > 0 else 0.0)


def _timeline(ev: list[tuple], run: list[int]) -> list[list]:
    """The step function ``[[t, bytes], ...]``: the live bytes after each
    instant's events, preceded by the instant's high point when an
    instant-long interval spikes there; from ``[0, base]``."""
    points: list[list] = []
    i, n = 0, len(ev)
    while i < n:
        t = ev[i][0]
        top = None
        while i < n and ev[i][0] == t:
            if top is None and ev[i][1] == _FREE_INSTANT:
                top = run[i]  # after everything that starts at t, before the instant-long ones end
            i += 1
        live = run[i]
        if top is not None and top != live:
            points += [[t, top], [t, live]]
        elif not points or points[-1][1] != live:
            points.append([t, live])
    if not points or points[0][0] > 0:
        points.insert(0, [0.0, run[0]])
    return points


def pool(points: list, limit: int = TIMELINE_POINTS) -> list:
    """At most *limit* points of a step function: consecutive points are
    grouped and each group becomes its first time with its largest value
    (max-pooling, so the peak survives).

    >>> pool([[0, 1], [1, 5], [2, 2], [3, 4]], 2)
    [[0, 5], [2, 4]]
    """
    if len(points) <= limit:
        return points
    size = -(-len(points) // limit)
    return [[points[i][0], max(p[1] for p in points[i:i + size])] for i in range(0, len(points), size)]


def peaks(graph: Graph, sched, k: int) -> list[int] | None:
    """Each device's peak under the time rule, or None when *graph*
    declares no ``resident_bytes`` (the caller uses the static sums): the
    cheap path for a search that only needs the OOM test
    (:class:`~celeritas_cli.optimize.evaluator.Evaluator`)."""
    resident = resident_list(graph)
    if resident is None:
        return None
    base, spans = _intervals(graph, sched, k, resident)
    return [max(_events(spans[d], base[d])[1]) for d in range(k)]


def judge_memory(graph: Graph, sched, k: int, rule: str = DEFAULT_RULE) -> MemoryProfile:
    """The :class:`MemoryProfile` of *sched* (a
    :class:`~celeritas_cli.sim.simulator.Schedule` of *graph* on ``k``
    devices) under *rule*, or under the static rule when *graph* declares
    nothing (:func:`applied_rule`)."""
    rule, note = applied_rule(graph, rule)
    static = [0] * k
    for v, d in enumerate(sched.device_of):
        if d >= 0:
            static[d] += graph.memory[v]
    if rule == "static":
        return _static_profile(graph, sched, k, static, note)
    resident = resident_list(graph)
    base, spans = _intervals(graph, sched, k, resident)
    holders: list[list[int]] = [[] for _ in range(k)]
    for v, d in enumerate(sched.device_of):
        if d >= 0 and resident[v] > 0:
            holders[d].append(v)
    prof = MemoryProfile("time", None, [], static, [])
    for d in range(k):
        ev, run = _events(spans[d], base[d])
        peak, at = _peak(ev, run)
        prof.peak.append(peak)
        prof.peak_at.append(at)
        prof.timeline.append(pool(_timeline(ev, run)))
        prof.live.append(_live_at(graph, at, holders[d], spans[d], resident))
    return prof


def _static_profile(graph: Graph, sched, k: int, static: list[int], note: str | None) -> MemoryProfile:
    """Every node's memory for the whole step: the peak is the static sum
    from t = 0, the largest nodes are what is live."""
    by_dev: list[list[int]] = [[] for _ in range(k)]
    for v, d in enumerate(sched.device_of):
        if d >= 0 and graph.memory[v] > 0:
            by_dev[d].append(v)
    live = [[{"node": graph.ids[v], "bytes": graph.memory[v], "kind": "resident"}
             for v in sorted(vs, key=lambda v: (-graph.memory[v], graph.ids[v]))[:TOP_LIVE]] for vs in by_dev]
    end = sched.makespan if sched.makespan > 0 else 0.0
    timeline = [[[0.0, s]] + ([[end, s]] if end > 0 else []) for s in static]
    return MemoryProfile("static", note, list(static), static, [0.0] * k, live, timeline)


def _live_at(graph: Graph, t: float, holders: list[int], spans: list[tuple], resident: list[int]) -> list[dict]:
    """The :data:`TOP_LIVE` largest items live on a device at instant *t*
    (as :func:`_peak` counts it: after what ends at *t*, with what starts
    at *t*): the resident state of its *holders* and its live *spans*,
    largest first, ties by kind and name."""
    items = [(resident[v], 0, v, -1) for v in holders]
    for s, e, b, kind, v, tensor in spans:
        if s <= t and (e > t or e == s == t):
            items.append((b, kind, v, tensor))
    items.sort(key=lambda it: (-it[0], it[1], graph.ids[it[2]], it[3]))
    out = []
    for b, kind, v, tensor in items[:TOP_LIVE]:
        entry = {"node": graph.ids[v], "bytes": b, "kind": _KINDS[kind]}
        if tensor >= 0:
            entry["tensor"] = graph.tensor_name[tensor]
        out.append(entry)
    return out
