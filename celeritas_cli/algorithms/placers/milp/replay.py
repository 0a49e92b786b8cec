"""A simulated schedule replayed in the model's integers (the warm start).

CP-SAT accepts a hint only when it satisfies every constraint exactly, and
the model's durations are the simulator's rounded to ``resolution``
(:func:`~.data.integer_durations`): the simulated start times do not satisfy
them.  :func:`integer_schedule` replays the simulated schedule's realised
orders (per device, per channel or port) with the integer durations and
the one link model (:class:`~celeritas_cli.sim.links.LinkState`), giving a
solution of the model (Moirai III-D, Eq. 4-8 plus the FIFO tie rule) whose
makespan bounds the optimum when the placement fits memory.
"""

from __future__ import annotations

from typing import Protocol

from ....model.graph import Graph
from ....sim.links import LinkState
from ....sim.simulator import Schedule


class Replayable(Protocol):
    """What :func:`integer_schedule` needs of a warm start."""

    device_of: list[int]
    sched: Schedule


def _replay_tasks(graph: Graph, sched: Schedule) -> list[tuple]:
    """Nodes and transfers in the simulated schedule's order: ``(start,
    end, rank, kind, id)`` with kind 0 = node *v*, 1 = transfer
    ``(tensor, destination device)``; ties by topological rank, a
    producer before its transfers."""
    topo_idx = graph.topo_index()
    tasks = []
    for v in range(graph.n):
        tasks.append((sched.start[v], sched.finish[v], 2 * topo_idx[v], 0, v))
    for tr in sched.transfers:
        p = graph.tensor_src[tr.tensor]
        tasks.append((tr.start, tr.end, 2 * topo_idx[p] + 1, 1, (tr.tensor, tr.dst_dev)))
    tasks.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4] if x[3] else (x[4],)))
    return tasks


def integer_schedule(graph: Graph, hint: Replayable, dur: list[list[int]], comm: list, congestion: str, k: int
                     ) -> tuple[list[int], dict, int]:
    """Replay the hint's realised orders (device order, channel/port order of
    transfers) with the model's integer durations: a schedule that satisfies
    every constraint of the model exactly.  Returns (start per node,
    {(t, b): transfer start}, makespan)."""
    dev = hint.device_of
    ist = [0] * graph.n
    iend = [0] * graph.n
    tstart: dict[tuple[int, int], int] = {}
    tend: dict[tuple[int, int], int] = {}
    dev_free = [0] * k
    send = LinkState(k, congestion, zero=0).send
    for _, _, _, kind, ident in _replay_tasks(graph, hint.sched):
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
