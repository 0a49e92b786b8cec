"""Pipeline schedules as strict per-device orders over the micro-batched
graph, so the simulator replays them exactly (issue 22.3).

A schedule only orders work (Megatron-LM's ``schedules.py`` and
``torch.distributed.pipelining`` keep schedules apart from models the same
way): :func:`schedule_steps` lists, for one device (pipeline rank), its
forward ``F`` and backward ``B`` steps over ``(model chunk, micro-batch)``;
:func:`pipeline_orders` turns them into node orders of the graph that
:mod:`~celeritas_cli.transform.microbatch` (and optionally
:mod:`~celeritas_cli.transform.recompute`) derived; :func:`pipeline_plan` is
the library entry the planners call: graph, stages, devices, ``m`` and a
schedule in, a :class:`~celeritas_cli.model.placement.Placement` with its
recipe, assignment and order out.

Schedules (``p`` pipeline ranks, ``m`` micro-batches, ``v`` model chunks per
rank; virtual stage ``c * p + r`` is chunk ``c`` of rank ``r``)
-------------------------------------------------------------------------
* ``gpipe`` (GPipe, Huang et al. 2019, 2.2; ``torch.distributed.pipelining.
  ScheduleGPipe``): every rank runs the ``m`` forwards, then the ``m``
  backwards.  Every micro-batch's activations are live at once (``m`` in
  flight).
* ``1f1b`` (PipeDream-Flush, Narayanan et al. SC'21, 2.2.1, Figure 4 bottom;
  Megatron's ``forward_backward_pipelining_without_interleaving``;
  ``Schedule1F1B``): rank ``r`` runs ``w = min(p - r - 1, m)`` warm-up
  forwards, then alternates one forward and one backward, then the ``w``
  cool-down backwards: at most ``min(p - r, m)`` micro-batches in flight.
* ``interleaved`` (SC'21, 2.2.2, Figure 4 top; Megatron's
  ``forward_backward_pipelining_with_interleaving``;
  ``ScheduleInterleaved1F1B``): ``v >= 2`` chunks per rank; forward step
  ``k`` runs chunk ``(k mod p v) div p`` on micro-batch ``(k div p v) p + k
  mod p``, backward step ``k`` the chunks in reverse; ``(p - r - 1) 2 + (v -
  1) p`` warm-up forwards (all of them when ``m = p``), then 1F1B.  Megatron
  requires ``m`` to be a multiple of ``p``; so does placer.

Bubble (SC'21, Eq. 1 and 2.2.2): the idle fraction of the ideal time is
``(p - 1) / m`` for GPipe and 1F1B and ``(p - 1) / (v m)`` interleaved
(:func:`bubble_fraction`); the simulated idle time of each device is
:func:`device_idle`, and the report's ``idle_s``.

Orders (:func:`pipeline_orders`): a device runs first its once-per-step
forward nodes (``weights`` nodes, batch-independent forward nodes), then,
step by step, the nodes of ``(stage, micro-batch, pass)`` in the derived
graph's topological order (a backward step starts with the micro-batch's
recompute clones, Megatron's recomputation in the backward, and includes
its gradient accumulations), then its once-per-step backward and update
nodes: the optimizer updates after the stage's last backward.

References
----------
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC'21, 2.2.1 (1F1B, PipeDream-Flush) and 2.2.2
(interleaved schedule); Huang et al., "GPipe", NeurIPS 2019, 2.2-2.3;
PyTorch ``torch.distributed.pipelining`` (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import upward_rank
from ..model.graph import Graph
from ..model.placement import Placement
from ..transform.derivation import attach
from ..transform.microbatch import ACCUMULATE_OP, microbatch_graph, microbatch_step
from ..transform.passes import node_passes
from ..transform.recompute import recompute_graph, recompute_step
from ..transform.split_cost import DEFAULT_OVERHEAD_S
from .cuts import _device

SCHEDULES = ("gpipe", "1f1b", "interleaved")
__all__ = ["SCHEDULES", "StageMemory", "bubble_fraction", "device_idle", "hand_peak_bytes", "in_flight",
           "pipeline_orders", "pipeline_plan", "recomputable", "schedule_steps", "stage_memory"]


def schedule_steps(schedule: str, p: int, m: int, rank: int, v: int = 1) -> list[tuple[str, int, int]]:
    """Rank *rank*'s steps ``("F" | "B", chunk, micro-batch)`` in order
    (module docstring).

    Raises
    ------
    InvalidInput
        An unknown schedule, ``v != 1`` outside ``interleaved``, ``v < 2`` or
        ``m`` not a multiple of ``p`` for ``interleaved``.

    Example
    -------
    >>> [f"{k}{i}" for k, _, i in schedule_steps("1f1b", 3, 4, 0)]
    ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
    >>> [f"{k}{c}.{i}" for k, c, i in schedule_steps("interleaved", 2, 2, 1, v=2)]
    ['F0.0', 'F0.1', 'F1.0', 'F1.1', 'B1.0', 'B1.1', 'B0.0', 'B0.1']
    """
    if schedule not in SCHEDULES:
        raise InvalidInput(f"pipeline: unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    if schedule != "interleaved":
        if v != 1:
            raise InvalidInput(f"pipeline: the {schedule} schedule runs one model chunk per device; "
                               f"use interleaved for {v}")
        if schedule == "gpipe":
            return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
        w = min(p - rank - 1, m)
        out = [("F", 0, i) for i in range(w)]
        for j in range(m - w):
            out += [("F", 0, w + j), ("B", 0, j)]
        return out + [("B", 0, i) for i in range(m - w, m)]
    if v < 2:
        raise InvalidInput(f"pipeline: the interleaved schedule needs at least 2 model chunks per device, got {v}")
    if m % p:
        raise InvalidInput(f"pipeline: the interleaved schedule needs the number of micro-batches ({m}) to be a "
                           f"multiple of the pipeline depth ({p}), as Megatron-LM requires")
    total = m * v
    warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)

    def step(k: int, forward: bool) -> tuple[str, int, int]:
        chunk = (k % (p * v)) // p
        mb = (k // (p * v)) * p + k % p
        return ("F", chunk, mb) if forward else ("B", v - 1 - chunk, mb)

    out = [step(k, True) for k in range(warm)]
    for j in range(total - warm):
        out += [step(warm + j, True), step(j, False)]
    return out + [step(k, False) for k in range(total - warm, total)]


def in_flight(schedule: str, p: int, m: int, rank: int, v: int = 1) -> int:
    """The most micro-batches (chunk-micro-batches when interleaved) whose
    forward has run on rank *rank* and whose backward has not: ``m`` for
    GPipe, ``min(p - rank, m)`` for 1F1B.

    >>> [in_flight("1f1b", 4, 16, r) for r in range(4)], in_flight("gpipe", 4, 16, 0)
    ([4, 3, 2, 1], 16)
    """
    live = peak = 0
    for kind, _, _ in schedule_steps(schedule, p, m, rank, v):
        live += 1 if kind == "F" else 0
        peak = max(peak, live)
        live -= 1 if kind == "B" else 0
    return peak


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The pipeline bubble as a fraction of the ideal time: ``(p - 1) / m``
    (GPipe, 1F1B; SC'21 Eq. 1), ``(p - 1) / (v m)`` interleaved.

    >>> bubble_fraction("1f1b", 4, 16), bubble_fraction("interleaved", 4, 16, 2)
    (0.1875, 0.09375)
    """
    return (p - 1) / (m * (v if schedule == "interleaved" else 1))


def device_idle(makespan: float, device_of: Sequence[int], start: Sequence[float], finish: Sequence[float],
                k: int) -> list[float]:
    """Idle seconds of each of *k* devices in a realised schedule:
    makespan minus the time it computes (the bubble, plus waits for
    transfers)."""
    busy = [0.0] * k
    for d, s, f in zip(device_of, start, finish):
        if d >= 0 and s == s:  # skip nodes that did not run (NaN)
            busy[d] += f - s
    return [makespan - b for b in busy]


def _blocks(derived: Graph, graph: Graph, stage_of: Sequence[int]):
    """Per node of *derived*: its stage, and ``("F" | "B", micro-batch)`` or
    ``("head" | "tail", -1)``; *derived* was micro-batched from *graph*."""
    passes = node_passes(graph)
    index = graph.index
    out = []
    for x in range(derived.n):
        ex = (derived.node_extra[x] or {}) if derived.node_extra else {}
        origin = ex.get("origin", derived.ids[x])
        v = index.get(origin if isinstance(origin, str) else derived.ids[x])
        if v is None:
            raise InvalidInput(f"pipeline: node '{derived.ids[x]}' of the micro-batched graph does not come from a "
                               f"node of graph '{graph.name}'")
        if "microbatch" in ex:
            back = derived.op[x] == ACCUMULATE_OP or "recompute_of" in ex or passes[v] != "forward"
            out.append((stage_of[v], "B" if back else "F", int(ex["microbatch"])))
        else:
            out.append((stage_of[v], "head" if passes[v] == "forward" else "tail", -1))
    return out


def pipeline_orders(derived: Graph, graph: Graph, stage_of: Sequence[int], stage_dev: Sequence[int], k: int,
                    schedule: str, m: int, v: int = 1) -> tuple[list[int], list[list[int]]]:
    """``(device_of, order)`` over *derived* (micro-batched from *graph*,
    whose nodes have stages *stage_of*, stage ``j`` on device
    ``stage_dev[j]``): the module docstring's orders.

    Raises
    ------
    InvalidInput
        See :func:`schedule_steps`; a stage without a device.
    """
    p = len(stage_dev) // v
    blocks = _blocks(derived, graph, stage_of)
    topo = derived.topo_index()
    device_of = []
    for x, (s, _, _) in enumerate(blocks):
        if not 0 <= s < len(stage_dev):
            raise InvalidInput(f"pipeline: node '{derived.ids[x]}' is in stage {s}, but there are {len(stage_dev)} "
                               f"stage devices")
        device_of.append(stage_dev[s])
    groups: dict[tuple, list[int]] = {}
    for x in range(derived.n):
        s, kind, i = blocks[x]
        key = (stage_dev[s], kind) if i < 0 else (s, kind, i)
        groups.setdefault(key, []).append(x)
    up = upward_rank(derived, derived.compute.__getitem__, lambda e: 0.0)
    for key, xs in groups.items():
        if len(key) == 3:
            groups[key] = _block_order(derived, xs, up, topo)
    order: list[list[int]] = [[] for _ in range(k)]
    for rank in range(p):
        d = stage_dev[rank]
        seq = sorted(groups.get((d, "head"), []), key=topo.__getitem__)
        for kind, chunk, i in schedule_steps(schedule, p, m, rank, v):
            seq += groups.get((chunk * p + rank, kind, i), [])
        seq += sorted(groups.get((d, "tail"), []), key=topo.__getitem__)
        order[d] = seq
    return device_of, order


def _block_order(graph: Graph, nodes: list[int], rank: list[float], topo: list[int]) -> list[int]:
    """*nodes* (one block) in the order one device runs them when it always
    takes the ready node of largest upward *rank* (ties: topological
    index), recompute clones first: a stage computes what the next stage
    waits for (the boundary activation, the input gradient) before what
    only its own later work or the update needs (weight gradients)."""
    inside = set(nodes)
    need = {x: sum(1 for u in graph.pred[x] if u in inside) for x in nodes}
    ex = graph.node_extra or [None] * graph.n

    def key(x: int) -> tuple:
        return ("recompute_of" not in (ex[x] or {}), -rank[x], topo[x], x)

    heap = [key(x) for x in nodes if not need[x]]
    heapq.heapify(heap)
    out = []
    while heap:
        x = heapq.heappop(heap)[-1]
        out.append(x)
        for s in graph.succ[x]:
            if s in inside:
                need[s] -= 1
                if not need[s]:
                    heapq.heappush(heap, key(s))
    return out


def pipeline_plan(graph: Graph, cluster: Cluster, stage_of: Sequence[int], stage_devices: Sequence[int | str], m: int,
                  schedule: str = "1f1b", *, recompute: Sequence[str] | None = None,
                  overhead_s: float = DEFAULT_OVERHEAD_S, assume_batch: int | None = None,
                  algorithm: str = "pipeline", params: dict | None = None, seed: int | None = 0) -> Placement:
    """The pipeline placement of *graph*: micro-batched (and recomputed),
    each stage on its device, ordered by *schedule*.

    Parameters
    ----------
    graph : Graph
        The model's training graph (the recipe starts from it).
    cluster : Cluster
    stage_of : list of int
        Stage of every node of *graph* (:func:`~.pipeline.balanced_stages`,
        :func:`~.pipeline.stages_from_cuts`), ``0..S-1``; checked to form a
        chain.
    stage_devices : list of int or str
        Device of each stage.  ``gpipe`` / ``1f1b``: ``S`` distinct devices.
        ``interleaved``: ``S = p v`` stages, stage ``j`` on the device of
        stage ``j mod p`` (the ``p`` first are distinct).
    m : int
        Micro-batches (whole samples each; ``interleaved``: a multiple of ``p``).
    schedule : str
        ``gpipe``, ``1f1b`` or ``interleaved``.
    recompute : list of str, optional
        Ids of forward nodes of *graph* whose activations are recomputed in
        the backward (every micro-batch's copy; a recipe step after
        ``microbatch``).  Only nodes whose activations are read by the
        backward of their own stage are recomputed (:func:`recomputable`;
        Megatron recomputes inside a stage): an activation the next stage's
        backward reads is kept there, received, and a clone on this stage
        would make that backward wait for this one.  One ``recompute``
        step per stage, so a clone reads the clones of its own stage and
        the forward outputs of the stages before it (their checkpoints).
    overhead_s, assume_batch
        Passed to :func:`~celeritas_cli.transform.microbatch.microbatch_graph`.
    algorithm, params, seed
        Written into the placement.

    Returns
    -------
    Placement
        Over the micro-batched graph (``derivation`` + ``derived``),
        with ``order``; its ``estimate`` says the schedule, stages, devices,
        micro-batches and the ideal bubble fraction, and no makespan (the
        simulator judges it).

    Raises
    ------
    InvalidInput
        Stages that do not form a chain, a stage without a device, devices
        not distinct where required, and what :func:`schedule_steps` and
        :func:`~celeritas_cli.transform.microbatch.microbatch_graph` refuse.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.pipelining.cuts import balanced_stages
    >>> g = layered(40, seed=1)
    >>> c = uniform(2)
    >>> st = balanced_stages(g, c, [0, 1])
    >>> p = pipeline_plan(g, c, st.stage_of, [0, 1], 4, assume_batch=8)
    >>> p.derivation["steps"][0]["micro_batches"], p.estimate["bubble_fraction"]
    ([2, 2, 2, 2], 0.25)
    """
    from .cuts import check_chain

    devs = [_device(cluster, d) for d in stage_devices]
    if len(stage_of) != graph.n:
        raise InvalidInput(f"pipeline: stage_of has {len(stage_of)} entries for the {graph.n} nodes of graph "
                           f"'{graph.name}'")
    S = len(devs)
    bad = next((v for v in range(graph.n) if not 0 <= stage_of[v] < S), None)
    if bad is not None:
        raise InvalidInput(f"pipeline: node '{graph.ids[bad]}' is in stage {stage_of[bad]}, but there are {S} "
                           f"stage devices")
    v = 1
    p = S
    if schedule == "interleaved":
        p = len(dict.fromkeys(devs))
        if S % p or devs[:p] != list(dict.fromkeys(devs)) or any(devs[j] != devs[j % p] for j in range(S)):
            raise InvalidInput("pipeline: the interleaved schedule needs stage j on the device of stage j mod p, "
                               "the first p stage devices distinct")
        v = S // p
    elif len(set(devs)) != S:
        raise InvalidInput(f"pipeline: the {schedule} schedule needs one device per stage; use interleaved for "
                           f"several stages per device")
    check_chain(graph, stage_of)
    schedule_steps(schedule, p, m, 0, v)  # refuse a bad schedule before building the graph
    derived = microbatch_graph(graph, m, overhead_s=overhead_s, assume_batch=assume_batch)
    mb = derived.meta["microbatch"]
    steps = [microbatch_step(m, mb["global_batch"], mb["micro_batches"], overhead_s, assume_batch)]
    keep = recomputable(graph, stage_of, recompute or [])
    for s in sorted({stage_of[graph.index[x]] for x in keep}):  # one step per stage: a clone reads
        ids = [x for x in keep if stage_of[graph.index[x]] == s]  # clones of its own stage only
        steps.append(recompute_step(ids))
        derived = recompute_graph(derived, ids)
    device_of, order = pipeline_orders(derived, graph, stage_of, devs, cluster.k, schedule, m, v)
    estimate = {"graph": "split", "graph_nodes": derived.n, "schedule": schedule, "stages": S, "pipeline_devices": p,
                "virtual_stages": v, "microbatches": m, "micro_batches": mb["micro_batches"],
                "stage_devices": [cluster.ids[d] for d in devs], "bubble_fraction": bubble_fraction(schedule, p, m, v),
                "recomputed": len(derived.meta.get("recompute", []))}
    par = {"stages": S, "microbatches": m, "schedule": schedule, **(params or {})}
    out = Placement.from_indices(derived, cluster, device_of, algorithm=algorithm, order=order, params=par,
                                 seed=seed, estimate=estimate)
    attach(out, graph, derived, steps)
    return out


@dataclass
class StageMemory:
    """The terms of a stage's hand count (:func:`stage_memory`):
    ``resident`` bytes held all step (``resident_bytes`` of its nodes; all
    of ``memory_bytes`` in a graph that declares none, the static rule, and
    once-per-step tensors it receives, such as parameters read from another
    stage), ``activation[i]``: bytes micro-batch ``i`` keeps from its
    forward to its backward (activations its backward reads, and forward
    tensors it receives that its backward reads), and ``gradients``: the
    gradient accumulation buffer (one per parameter)."""

    resident: int = 0
    activation: list[int] = field(default_factory=list)
    gradients: int = 0


def recomputable(graph: Graph, stage_of: Sequence[int], ids: Sequence[str]) -> list[str]:
    """The ids of *ids* (forward nodes of *graph*) whose activations only
    backward nodes of their own stage read, in the order given, each once.

    Raises
    ------
    InvalidInput
        An id that is not a node of *graph*.

    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, p: {"id": i, "compute_s": 1, "memory_bytes": 8, "pass": p}
    >>> g = build("r", [nd("a", "forward"), nd("b", "forward"), nd("db", "backward"), nd("da", "backward")],
    ...           [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "db", "bytes": 8},
    ...            {"src": "a", "dst": "db", "bytes": 8}, {"src": "db", "dst": "da", "bytes": 8}])
    >>> recomputable(g, [0, 1, 1, 0], ["a", "b"])
    ['b']
    """
    passes = node_passes(graph)
    out = []
    for nid in dict.fromkeys(ids):
        v = graph.index.get(nid)
        if v is None:
            raise InvalidInput(f"pipeline: recompute names node '{nid}', which is not in graph '{graph.name}'")
        readers = [graph.edge_dst[e] for e in graph.out_edges[v] if passes[graph.edge_dst[e]] == "backward"]
        if all(stage_of[d] == stage_of[v] for d in readers):
            out.append(nid)
    return out


def stage_memory(derived: Graph, graph: Graph, stage_of: Sequence[int], device_of: Sequence[int],
                 stages: int) -> list[StageMemory]:
    """The :class:`StageMemory` of each of *stages* stages of a pipeline
    placement: *derived* micro-batched from *graph* (stages *stage_of*),
    its nodes on devices *device_of*."""
    blocks = _blocks(derived, graph, stage_of)
    m = int(derived.meta.get("microbatch", {}).get("m", 1))
    out = [StageMemory(activation=[0] * m) for _ in range(stages)]
    ex = derived.node_extra or [None] * derived.n
    cons = derived.tensor_consumers()
    tensors: list[list[int]] = [[] for _ in range(derived.n)]
    for t, src in enumerate(derived.tensor_src):
        tensors[src].append(t)
    for x, (s, kind, i) in enumerate(blocks):
        e = ex[x] or {}
        res = min(int(e.get("resident_bytes", derived.memory[x])), derived.memory[x])
        out[s].resident += res
        if kind == "B" and e.get("microbatch") == 0 and derived.op[x] != ACCUMULATE_OP:
            bi = e.get("batch_independent")
            out[s].gradients += bi.get("memory_bytes", 0) if isinstance(bi, dict) else 0
        if kind == "F" and any(blocks[d][1] == "B" and device_of[d] == device_of[x] for t in tensors[x]
                               for d in cons[t]):
            out[s].activation[i] += derived.memory[x] - res
    for t, src in enumerate(derived.tensor_src):
        if blocks[src][1] not in ("F", "head"):
            continue
        for dev in dict.fromkeys(device_of[d] for d in cons[t] if device_of[d] != device_of[src]):
            readers = [d for d in cons[t] if device_of[d] == dev]
            back = [d for d in readers if blocks[d][1] == "B"]
            if blocks[src][1] == "head":
                out[blocks[readers[0]][0]].resident += derived.tensor_bytes[t]
            elif back:
                s, _, i = blocks[back[0]]
                out[s].activation[i] += derived.tensor_bytes[t]
    return out


def hand_peak_bytes(schedule: str, p: int, m: int, rank: int, activation: Sequence[int], resident: int,
                    gradients: int = 0, v: int = 1) -> int:
    """The hand count of a device's peak memory along its schedule: its
    *resident* bytes, the *gradients* it accumulates (one buffer, from the
    first backward on), and ``activation[c]`` bytes for every
    chunk-``c`` micro-batch in flight (1F1B: ``min(p - rank, m)``, GPipe:
    ``m``; :func:`in_flight`), counted at the start of each backward step.

    >>> hand_peak_bytes("1f1b", 4, 16, 0, [10], 100, 7), hand_peak_bytes("gpipe", 4, 16, 0, [10], 100, 7)
    (147, 267)
    """
    live = [0] * v
    peak = resident
    started = False
    for kind, c, _ in schedule_steps(schedule, p, m, rank, v):
        if kind == "F":
            live[c] += 1
            peak = max(peak, resident + (gradients if started else 0) + sum(n * a for n, a in zip(live, activation)))
        else:
            started = True
            peak = max(peak, resident + gradients + sum(n * a for n, a in zip(live, activation)))
            live[c] -= 1
    return peak
