"""Pipeline schedules: one :class:`Schedule` object per schedule, its
per-rank table of actions, and the orders of a micro-batched graph built
from it (issue 22.3, issue 32).

A schedule only orders work (Megatron-LM's ``schedules.py`` and
``torch.distributed.pipelining`` keep schedules apart from models the same
way).  Each :class:`Schedule` holds its name (the one place the name is
spelled: :data:`GPIPE`, :data:`ONE_F_ONE_B`, :data:`INTERLEAVED`, and the
registry :data:`SCHEDULES`), its steps (:meth:`Schedule.steps`: rank
``r``'s forward ``F`` and backward ``B`` actions over ``(model chunk,
micro-batch)``, :meth:`Schedule.table` the per-rank table as
``torch.distributed.pipelining`` prints it), its in-flight count, its
bubble, its shape rule (:meth:`Schedule.refusal`) and the
``torch.distributed.pipelining`` class it maps to.  The device orders of a
plan are built from the steps (:mod:`.builder`).

Schedules (``p`` pipeline ranks, ``m`` micro-batches, ``v`` model chunks per
rank; virtual stage ``c * p + r`` is chunk ``c`` of rank ``r``)
-------------------------------------------------------------------------
* GPipe (Huang et al. 2019, 2.2; ``ScheduleGPipe``): every rank runs the
  ``m`` forwards, then the ``m`` backwards.  Every micro-batch's
  activations are live at once (``m`` in flight).
* 1F1B (PipeDream-Flush, Narayanan et al. SC'21, 2.2.1, Figure 4 bottom;
  Megatron's ``forward_backward_pipelining_without_interleaving``;
  ``Schedule1F1B``): rank ``r`` runs ``w = min(p - r - 1, m)`` warm-up
  forwards, then alternates one forward and one backward, then the ``w``
  cool-down backwards: at most ``min(p - r, m)`` micro-batches in flight.
* interleaved 1F1B (SC'21, 2.2.2, Figure 4 top; Megatron's
  ``forward_backward_pipelining_with_interleaving``;
  ``ScheduleInterleaved1F1B``): ``v >= 2`` chunks per rank on ``p >= 2``
  ranks; forward step ``k`` runs chunk ``(k mod p v) div p`` on micro-batch
  ``(k div p v) p + k mod p``, backward step ``k`` the chunks in reverse;
  ``(p - r - 1) 2 + (v - 1) p`` warm-up forwards (all of them when ``m =
  p``), then 1F1B.  Megatron requires ``m`` to be a multiple of ``p``; so
  does placer.

Bubble (SC'21, Eq. 1 and 2.2.2): the idle fraction of the ideal time is
``(p - 1) / m`` for GPipe and 1F1B and ``(p - 1) / (v m)`` interleaved
(:meth:`Schedule.bubble`); the simulated idle time of each device is
:func:`device_idle`, and the report's ``idle_s``.

Blocks (:func:`stage_blocks`, :func:`block_order`): the nodes of a
micro-batched graph group into ``(stage, F | B, micro-batch)`` blocks, run
in the order of the rank's steps; inside a block a device runs the ready
node of largest upward rank.  A backward block starts with the
micro-batch's recompute clones (Megatron's recomputation in the backward),
which wait for the gradient that enters the stage
(:mod:`~celeritas_cli.transform.recompute`: a clone reads it), and includes
the micro-batch's gradient accumulations.

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
from typing import Callable, NamedTuple, Sequence

from ..errors import InvalidInput
from ..model.graph import Graph
from ..transform.microbatch import ACCUMULATE_OP
from ..transform.passes import node_passes

__all__ = ["Action", "GPIPE", "INTERLEAVED", "ONE_F_ONE_B", "SCHEDULES", "Schedule", "StageMemory", "block_order",
           "device_idle", "get_schedule", "hand_peak_bytes", "recomputable", "stage_blocks", "stage_memory"]


class Action(NamedTuple):
    """One step of a rank: ``kind`` ``"F"`` (forward) or ``"B"`` (backward)
    of model chunk ``chunk`` on micro-batch ``microbatch``."""

    kind: str
    chunk: int
    microbatch: int


def _gpipe(p: int, m: int, rank: int, v: int) -> list[Action]:
    return [Action("F", 0, i) for i in range(m)] + [Action("B", 0, i) for i in range(m)]


def _one_f_one_b(p: int, m: int, rank: int, v: int) -> list[Action]:
    w = min(p - rank - 1, m)
    out = [Action("F", 0, i) for i in range(w)]
    for j in range(m - w):
        out += [Action("F", 0, w + j), Action("B", 0, j)]
    return out + [Action("B", 0, i) for i in range(m - w, m)]


def _interleaved(p: int, m: int, rank: int, v: int) -> list[Action]:
    total = m * v
    warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)

    def step(k: int, forward: bool) -> Action:
        chunk = (k % (p * v)) // p
        mb = (k // (p * v)) * p + k % p
        return Action("F", chunk, mb) if forward else Action("B", v - 1 - chunk, mb)

    out = [step(k, True) for k in range(warm)]
    for j in range(total - warm):
        out += [step(warm + j, True), step(j, False)]
    return out + [step(k, False) for k in range(total - warm, total)]


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule (module docstring).

    Attributes
    ----------
    name : str
        What users write (``-p schedule=``) and placements record.
    title : str
        Its name in words (reports).
    torch_class : str
        The ``torch.distributed.pipelining`` class that runs it.
    chunked : bool
        Runs ``v >= 2`` model chunks per rank (interleaved), else one.
    rule : str
        The shape rule, in words (what :meth:`refusal` checks).
    reference : str
        Where it is defined.
    """

    name: str
    title: str
    torch_class: str
    chunked: bool
    rule: str
    reference: str
    _steps: Callable[[int, int, int, int], list[Action]] = field(repr=False, compare=False)

    def refusal(self, p: int, m: int, v: int = 1) -> str | None:
        """Why *p* ranks, *m* micro-batches and *v* chunks per rank break
        the shape rule (one line), or None when they keep it.

        >>> INTERLEAVED.refusal(4, 6, 2)
        'the interleaved 1F1B schedule needs the number of micro-batches (6) to be a multiple of the pipeline ranks (4): Megatron-LM interleaves whole rounds of p micro-batches (m % p == 0)'
        >>> ONE_F_ONE_B.refusal(4, 6) is None
        True
        """
        if p < 1 or m < 1:
            return f"the {self.title} schedule needs at least one rank and one micro-batch, got p={p}, m={m}"
        if not self.chunked:
            if v != 1:
                return (f"the {self.title} schedule runs one model chunk per rank, got {v}; use "
                        f"{INTERLEAVED.name} for several")
            return None
        if p < 2:
            return (f"the {self.title} schedule needs at least 2 pipeline ranks to interleave model chunks over, "
                    f"got {p} (one stage: use {ONE_F_ONE_B.name})")
        if v < 2:
            return f"the {self.title} schedule needs at least 2 model chunks per rank, got {v}"
        if m % p:
            return (f"the {self.title} schedule needs the number of micro-batches ({m}) to be a multiple of the "
                    f"pipeline ranks ({p}): Megatron-LM interleaves whole rounds of p micro-batches (m % p == 0)")
        return None

    def check(self, p: int, m: int, v: int = 1) -> None:
        """Refuse a shape that breaks the rule (:meth:`refusal`).

        Raises
        ------
        InvalidInput
            ``pipeline: <the rule that breaks>``.
        """
        why = self.refusal(p, m, v)
        if why:
            raise InvalidInput(f"pipeline: {why}")

    def steps(self, p: int, m: int, rank: int, v: int = 1) -> list[Action]:
        """Rank *rank*'s actions in order (module docstring).

        Raises
        ------
        InvalidInput
            A shape that breaks the rule (:meth:`check`), a rank outside
            ``0 .. p-1``.

        >>> [f"{a.kind}{a.microbatch}" for a in ONE_F_ONE_B.steps(3, 4, 0)]
        ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
        """
        self.check(p, m, v)
        if not 0 <= rank < p:
            raise InvalidInput(f"pipeline: rank {rank} is not one of the {p} pipeline ranks")
        return self._steps(p, m, rank, v)

    def table(self, p: int, m: int, v: int = 1) -> list[str]:
        """The per-rank table of actions, one line per rank: ``F3`` / ``B3``
        (micro-batch 3); with model chunks, torch's ``{stage}F{i}`` with the
        virtual stage ``chunk * p + rank`` in front.

        >>> GPIPE.table(2, 2)
        ['F0 F1 B0 B1', 'F0 F1 B0 B1']
        >>> INTERLEAVED.table(2, 2, 2)[1]
        '1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1'
        """
        def word(a: Action, r: int) -> str:
            return f"{a.chunk * p + r if self.chunked else ''}{a.kind}{a.microbatch}"

        return [" ".join(word(a, r) for a in self.steps(p, m, r, v)) for r in range(p)]

    def in_flight(self, p: int, m: int, rank: int, v: int = 1) -> int:
        """The most micro-batches (chunk-micro-batches when chunked) whose
        forward has run on rank *rank* and whose backward has not: ``m`` for
        GPipe, ``min(p - rank, m)`` for 1F1B.

        >>> [ONE_F_ONE_B.in_flight(4, 16, r) for r in range(4)], GPIPE.in_flight(4, 16, 0)
        ([4, 3, 2, 1], 16)
        """
        live = peak = 0
        for a in self.steps(p, m, rank, v):
            live += 1 if a.kind == "F" else 0
            peak = max(peak, live)
            live -= 1 if a.kind == "B" else 0
        return peak

    def bubble(self, p: int, m: int, v: int = 1) -> float:
        """The pipeline bubble as a fraction of the ideal time: ``(p - 1) / m``
        (GPipe, 1F1B; SC'21 Eq. 1), ``(p - 1) / (v m)`` interleaved.

        >>> ONE_F_ONE_B.bubble(4, 16), INTERLEAVED.bubble(4, 16, 2)
        (0.1875, 0.09375)
        """
        return (p - 1) / (m * (v if self.chunked else 1))

    def words(self, v: int = 1) -> str:
        """The schedule in words, with its chunks: ``"interleaved 1F1B (2
        chunks per rank)"``."""
        return f"{self.title} ({v} chunks per rank)" if self.chunked and v > 1 else self.title


GPIPE = Schedule("gpipe", "GPipe", "ScheduleGPipe", False, "one model chunk per rank",
                 "Huang et al., GPipe, NeurIPS 2019, 2.2", _gpipe)
ONE_F_ONE_B = Schedule("1f1b", "1F1B", "Schedule1F1B", False, "one model chunk per rank",
                       "Narayanan et al., SC'21, 2.2.1 (PipeDream-Flush)", _one_f_one_b)
INTERLEAVED = Schedule("interleaved", "interleaved 1F1B", "ScheduleInterleaved1F1B", True,
                       "at least 2 pipeline ranks, at least 2 model chunks per rank, and the micro-batches a "
                       "multiple of the ranks (m % p == 0, Megatron-LM)",
                       "Narayanan et al., SC'21, 2.2.2", _interleaved)
#: every schedule by name
SCHEDULES: dict[str, Schedule] = {s.name: s for s in (GPIPE, ONE_F_ONE_B, INTERLEAVED)}


def get_schedule(schedule: str | Schedule) -> Schedule:
    """The :class:`Schedule` named *schedule* (or *schedule* itself).

    Raises
    ------
    InvalidInput
        An unknown name, with the known ones.

    >>> get_schedule("1f1b") is ONE_F_ONE_B
    True
    """
    if isinstance(schedule, Schedule):
        return schedule
    found = SCHEDULES.get(schedule) if isinstance(schedule, str) else None
    if found is None:
        raise InvalidInput(f"pipeline: unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    return found


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


def stage_blocks(derived: Graph, graph: Graph, stage_of: Sequence[int]) -> list[tuple[int, str, int]]:
    """Per node of *derived* (micro-batched from *graph*, whose nodes have
    stages *stage_of*): ``(stage, "F" | "B", micro-batch)``, or ``(stage,
    "head" | "tail", -1)`` for once-per-step forward / backward nodes.

    Raises
    ------
    InvalidInput
        A node of *derived* that comes from no node of *graph*.
    """
    passes = node_passes(graph)
    index = graph.index
    out = []
    for x in range(derived.n):
        ex = (derived.node_extra[x] or {}) if derived.node_extra else {}
        origin = ex.get("origin", derived.ids[x])
        v = index.get(origin if isinstance(origin, str) else derived.ids[x])
        if v is None:  # a once node keeps its id, and the origin of an earlier derivation (tensor parallelism)
            v = index.get(derived.ids[x])
        if v is None:
            raise InvalidInput(f"pipeline: node '{derived.ids[x]}' of the micro-batched graph does not come from a "
                               f"node of graph '{graph.name}'")
        if "microbatch" in ex:
            back = derived.op[x] == ACCUMULATE_OP or "recompute_of" in ex or passes[v] != "forward"
            out.append((stage_of[v], "B" if back else "F", int(ex["microbatch"])))
        else:
            out.append((stage_of[v], "head" if passes[v] == "forward" else "tail", -1))
    return out


def block_order(graph: Graph, nodes: list[int], rank: list[float], topo: list[int]) -> list[int]:
    """*nodes* (one block) in the order one device runs them when it always
    takes the ready node of largest upward *rank* (ties: topological
    index), recompute clones first (they wait for the gradient that enters
    the stage, which they read): a stage computes what the next stage waits
    for (the boundary activation, the input gradient) before what only its
    own later work or the update needs (weight gradients)."""
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
    blocks = stage_blocks(derived, graph, stage_of)
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


def hand_peak_bytes(schedule: str | Schedule, p: int, m: int, rank: int, activation: Sequence[int], resident: int,
                    gradients: int = 0, v: int = 1) -> int:
    """The hand count of a device's peak memory along its schedule: its
    *resident* bytes, the *gradients* it accumulates (one buffer, from the
    first backward on), and ``activation[c]`` bytes for every
    chunk-``c`` micro-batch in flight (1F1B: ``min(p - rank, m)``, GPipe:
    ``m``; :meth:`Schedule.in_flight`), counted at the start of each backward step.

    >>> hand_peak_bytes(ONE_F_ONE_B, 4, 16, 0, [10], 100, 7), hand_peak_bytes(GPIPE, 4, 16, 0, [10], 100, 7)
    (147, 267)
    """
    live = [0] * v
    peak = resident
    started = False
    for kind, c, _ in get_schedule(schedule).steps(p, m, rank, v):
        if kind == "F":
            live[c] += 1
            peak = max(peak, resident + (gradients if started else 0) + sum(n * a for n, a in zip(live, activation)))
        else:
            started = True
            peak = max(peak, resident + gradients + sum(n * a for n, a in zip(live, activation)))
            live[c] -= 1
    return peak
