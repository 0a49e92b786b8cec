"""A small, independent implementation of the judge's memory-over-time rule
(CONVENTIONS "Node memory"), used as a test oracle for the pipeline hand
counts while (and after) WP "judge" builds the real one in ``sim/``.

Device d's live memory at time t: the resident bytes of its nodes (whole
step) + each node's activation (``memory_bytes - resident_bytes``) from its
start until the latest of its finish, the finish of the last consumer of its
tensors on d and the end of the last transfer of its tensors out of d + each
received tensor's bytes from the start of its transfer until its last
consumer on d finishes.  A graph that declares no ``resident_bytes`` counts
every node as all resident (the static rule).
"""

from __future__ import annotations


def resident_of(graph) -> list[int]:
    declares = any("resident_bytes" in (graph.node_extra[v] or {}) for v in range(graph.n))
    out = []
    for v in range(graph.n):
        ex = graph.node_extra[v] or {}
        out.append(min(int(ex.get("resident_bytes", graph.memory[v])), graph.memory[v]) if declares
                   else graph.memory[v])
    return out


def peaks(graph, sched, k: int) -> list[int]:
    """Peak live bytes of each of *k* devices under the time rule."""
    res = resident_of(graph)
    dev, start, finish = sched.device_of, sched.start, sched.finish
    base = [0] * k
    events: list[list[tuple[float, int]]] = [[] for _ in range(k)]
    end = list(finish)
    recv: dict[tuple[int, int], list[float]] = {}  # (tensor, device) -> [transfer start, last use]
    for tr in sched.transfers:
        src = graph.tensor_src[tr.tensor]
        end[src] = max(end[src], tr.end)
        recv[(tr.tensor, tr.dst_dev)] = [tr.start, tr.end]
    for t, src in enumerate(graph.tensor_src):
        for d in graph.tensor_consumers()[t]:
            if dev[d] == dev[src]:
                end[src] = max(end[src], finish[d])
            elif (t, dev[d]) in recv:
                r = recv[(t, dev[d])]
                r[1] = max(r[1], finish[d])
    for v in range(graph.n):
        base[dev[v]] += res[v]
        act = graph.memory[v] - res[v]
        if act:
            events[dev[v]] += [(start[v], act), (end[v], -act)]
    for (t, d), (a, b) in recv.items():
        events[d] += [(a, graph.tensor_bytes[t]), (b, -graph.tensor_bytes[t])]
    out = []
    for d in range(k):
        live = peak = 0
        for _, x in sorted(events[d], key=lambda e: (e[0], e[1])):  # frees before allocations at one instant
            live += x
            peak = max(peak, live)
        out.append(base[d] + peak)
    return out
