"""The plan of a sharded data-parallel graph (:mod:`~.fsdp`): which state
each node holds, the FSDP units, who reads each unit's gathered
parameters, and the order the collectives are issued in - all read from the
model's graph before anything is built, so the derived graph's size is
known in advance (:func:`fsdp_size`).

State (ZeRO, Rajbhandari et al. SC'20, section 3.1 and Figure 1: parameters,
gradients, optimizer state).  Per node ``v``, its resident bytes ``R``
(``resident_bytes``; the batch-independent memory of
:mod:`~.split_cost` in a graph that declares none) are split into

* **parameters** of a *holder* (a node that is not an update and holds
  ``batch_independent.state_bytes``, :func:`~.split_cost.batch_profile`):
  ``min(state_bytes, R)``, but no more than the gradients its group's
  updates consume (an optimizer updates parameters, and a parameter's
  gradient is as large as its master copy): sharded by stage 3;
* **buffers**: the rest of a holder's ``min(state_bytes, R)`` in a group
  whose updates consume fewer gradient bytes than it holds (BatchNorm's
  running statistics: ``placer profile`` counts a module's buffers in its
  ``state_bytes``).  FSDP flattens parameters only; buffers stay whole on
  every replica and are never gathered;
* **gradient buffers** a holder keeps resident (the synthetic generator's
  layout: parameters, gradients and two Adam moments on the layer): up to
  the bytes of the gradients its group's updates consume, sharded from
  stage 2;
* **optimizer state**: an update's resident bytes and the rest of a
  holder's, sharded from stage 1.

Holders come in two kinds, told apart by what the graph says their outputs
are, never by a node merely having no inputs.  A *source* holder's outputs
*are* its parameters (a parameter read, or the cast ``aten._to_copy`` of
fp32 master weights to the bf16 working copy of ``placer profile
--precision bf16``): it has no inputs, nothing that scales with the batch,
no ``batch_independent.state_tensors`` (which would say that only some of
its outputs carry parameters) and outputs no larger than its parameters.
In stage 3 the whole node runs on its shard and its outputs are what is
gathered.  Every other holder is a *compute* holder (``aten.addmm``,
``aten.native_layer_norm`` in the fp32 zoo graphs, and the LSTM's ``h0 @
W_hh`` ``aten.mm`` of the zoo's nmt, which has no graph inputs but a
batch-shaped output): it reads its own parameters and forwards them to
later readers (``batch_independent.state_tensors``); in stage 3 its
parameters move to the unit's flat shard, are gathered, and reach it and
its readers from the gather, and the node itself runs on its replica's
share of the batch like any other.  So what is gathered is the parameters,
in the dtype their readers use, and nothing else (one forward and one
backward gather per unit and step in stage 3).  A buffer a compute holder
forwards (BatchNorm's running statistics read by its backward) reaches the
reader, on the same replica, with the gather it waits for anyway: it adds
no bytes to the gather.

Units (PyTorch FSDP, Zhao et al. VLDB 2023, section 3.2.1 "Full
Sharding" and 4.2 "Flat Parameters": the parameters of one wrapped module
are flattened into one FlatParameter, gathered and reduce-scattered as
one).  Parameter groups (a colocation group with a holder or an update;
``param:<module path>.<name>`` in ``placer profile`` graphs) are taken in
forward order (the first forward read of their parameters, in the order one
device runs the graph, :func:`~.allreduce.ready_order`), and consecutive
groups join one unit:

* ``wrap="module"`` (default; ``transformer_auto_wrap_policy``): groups of
  one module - the module path up to its first numeric component
  (``blocks.3``, ``encoder.0``: one unit per transformer block), else its
  first component (a top-level child: ``wte``, ``ln_f``).  A group not named
  ``param:...`` (the generator's ``w:<op>``, converted files) is a unit of
  its own;
* ``wrap="size"`` (``size_based_auto_wrap_policy``): groups are appended to
  the current unit until it gathers at least ``unit_mb`` MiB.

Readers: a forward node reads the forward gather; a backward node, and a
recompute clone (:mod:`~.recompute`: activation checkpointing, where the
recomputed forward runs in the unit's backward) the backward gather; an
update reads its own shard locally.

Issue order (FSDP section 3.4 "Communication Optimizations": forward
prefetch issues the next all-gather before the current unit's forward, and
backward prefetch the next all-gather before the current unit's
reduce-scatter, because one process group's collectives run in issue order
on one NCCL stream; section 3.5 "Memory Management": the rate limiter lets
at most two units' all-gathers run ahead of the units that are still
computing).  Every collective gets a position in the one-device order:
the gathers are ordered by their first reader, and gather ``j`` is issued
just before the first reader of gather ``j - 1`` (prefetch: the next unit's
parameters are requested as the current unit starts, so in the backward a
gather is issued before the current unit's reduce-scatter, FSDP's
``BACKWARD_PRE``); a reduce-scatter just after the unit's last gradient;
the stage-1/2 all-gather of updated parameters just after the unit's last
update.  Sorted by position they form one chain (each collective waits for
the previous one), and gather ``j`` also waits for the readers of gather
``j - 2`` that come before its position (the rate limiter; a later reader
- a tied embedding read again by the LM head - keeps that unit gathered,
as FSDP keeps a shared parameter in a unit that is not resharded).  Every
added dependency goes forward in that order, so the derived graph stays
acyclic.

Example
-------
>>> from celeritas_cli.model.graph import build
>>> nd = lambda i, **kw: {"id": i, "compute_s": 1, "memory_bytes": 0, **kw}
>>> g = build("m", [nd("x"), nd("f", colocation="param:l.0.w", memory_bytes=8, resident_bytes=8,
...                             batch_independent={"state_bytes": 8}),
...                 nd("b", op="aten.mm_backward"), nd("u", op="optim.sgd", colocation="param:l.0.w")],
...           [{"src": "x", "dst": "f", "bytes": 4}, {"src": "f", "dst": "b", "bytes": 4},
...            {"src": "b", "dst": "u", "bytes": 8, "tensor": "grad"}], meta={"batch_size": 2})
>>> p = fsdp_plan(g, 3)
>>> [(u.name, u.gather_bytes, u.grad_bytes, [g.ids[c] for c, _, _ in u.fwd]) for u in p.units]
[('l.0', 8, 8, ['f'])]
>>> p.sequence
[('fwd', 0), ('bwd', 0), ('rs', 0)]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import InvalidInput
from ..model.graph import Graph
from ..model.residency import declares, memory_fields, resident_of
from .allreduce import ready_order
from .passes import node_passes
from .split_cost import batch_profile

WRAPS = ("module", "size")
#: the largest ``unit_mb`` accepted (MiB): 1 TiB, every model in one unit
UNIT_MB_MAX = 2**20
_NUMERIC = re.compile(r"^\d+$")


@dataclass
class Unit:
    """One FSDP unit.  ``fwd`` / ``bwd``: who reads its gathered parameters
    in the forward / backward pass, ``(node, tensor name, bytes)`` with
    tensor name ``""`` for a compute holder reading its own parameters and
    ``"*"`` for a gradient producer that waits for the unit's parameters
    when no backward op reads them (FSDP gathers a unit before its backward
    anyway)."""

    index: int
    name: str
    groups: list[str]
    holders: list[int] = field(default_factory=list)
    updates: list[int] = field(default_factory=list)
    grads: list[int] = field(default_factory=list)
    gather_bytes: int = 0
    shard_bytes: int = 0
    grad_bytes: int = 0
    fwd: list[tuple[int, str, int]] = field(default_factory=list)
    bwd: list[tuple[int, str, int]] = field(default_factory=list)


@dataclass
class Plan:
    """Everything :func:`~.fsdp.fsdp_graph` builds from (module docstring):
    per node ``params`` / ``grad_buf`` / ``optim`` (resident bytes by kind),
    ``buffers`` (state that is not parameters, never sharded), ``source``
    (a source holder), ``update``, ``unit_of`` (unit index of a holder or
    update, -1 elsewhere); per tensor ``edge_kind`` of its edges; the units,
    the collectives in issue order (``sequence``: ``(kind, unit)`` with kind
    ``fwd`` / ``bwd`` gather, ``rs`` reduce-scatter, ``post`` all-gather of
    updated parameters) and, for the gathers, the rate limiter's ``waits``
    (sequence index -> nodes)."""

    stage: int
    wrap: str
    units: list[Unit]
    params: list[int]
    buffers: list[int]
    grad_buf: list[int]
    optim: list[int]
    source: list[bool]
    update: list[bool]
    unit_of: list[int]
    param_tensor: dict[int, int]
    grad_tensor: dict[int, int]
    sequence: list[tuple[str, int]]
    waits: dict[int, list[int]]


def unit_key(group: str) -> str | None:
    """The module-policy unit of a parameter group ``param:<path>.<name>``
    (module docstring), or None for a group not named so.

    >>> unit_key("param:blocks.3.attn.qkv.weight"), unit_key("param:ln_f.weight"), unit_key("w:conv_1")
    ('blocks.3', 'ln_f', None)
    """
    if not group.startswith("param:"):
        return None
    parts = group[len("param:"):].split(".")
    module = parts[:-1] or parts
    for i, part in enumerate(module):
        if _NUMERIC.match(part):
            return ".".join(module[:i + 1]) if i else part
    return module[0]


def check_unit_mb(unit_mb) -> float:
    """*unit_mb* as a number of MiB, ``0 <= unit_mb <= UNIT_MB_MAX`` (0: the module policy)."""
    if isinstance(unit_mb, bool) or not isinstance(unit_mb, (int, float)) or not math.isfinite(unit_mb) \
            or not 0 <= unit_mb <= UNIT_MB_MAX:
        raise InvalidInput(f"fsdp: unit_mb must be 0 (one unit per module) .. {UNIT_MB_MAX} MiB, got {unit_mb!r}")
    return float(unit_mb)


def fsdp_plan(graph: Graph, stage: int, unit_mb: float = 0.0) -> Plan:
    """The :class:`Plan` of *graph* sharded at *stage* (1, 2 or 3) with
    units of the module policy (``unit_mb = 0``) or of about ``unit_mb`` MiB
    (module docstring)."""
    unit_mb = check_unit_mb(unit_mb)
    prof = batch_profile(graph)
    n = graph.n
    passes = node_passes(graph)
    clones: dict[int, int] = {}  # a node -> its recompute clone
    for v in range(n):
        of = (graph.node_extra[v] or {}).get("recompute_of") if graph.node_extra else None
        if isinstance(of, str) and of in graph.index:
            clones[graph.index[of]] = v
    cloned = set(clones.values())
    order = _step_order(graph, cloned)
    resident = [resident_of(graph, v) if declares(graph) else prof.fixed_memory[v] for v in range(n)]
    group = [graph.colocation[v] if graph.colocation[v] is not None else f"#{graph.ids[v]}" for v in range(n)]
    holder = [not prof.update[v] and prof.param_bytes[v] > 0 for v in range(n)]
    # gradient tensors and the group of the update consuming them
    grad_group: dict[int, str] = {}
    for e in range(graph.m):
        t = graph.edge_tensor[e]
        if prof.gradient[t] and t not in grad_group and prof.update[graph.edge_dst[e]]:
            grad_group[t] = group[graph.edge_dst[e]]
    grad_by_group: dict[str, int] = {}
    for t, g in grad_group.items():
        grad_by_group[g] = grad_by_group.get(g, 0) + graph.tensor_bytes[t]
    params, buffers, grad_buf, optim = [0] * n, [0] * n, [0] * n, [0] * n
    unclaimed = dict(grad_by_group)  # parameter bytes of a group its holders have not claimed yet
    left = dict(grad_by_group)  # gradient bytes of a group not yet found in a holder's buffers
    for v in range(n):
        if prof.update[v]:
            optim[v] = resident[v]
        elif holder[v]:
            state = min(prof.param_bytes[v], resident[v])
            params[v] = min(state, unclaimed[group[v]]) if group[v] in unclaimed else state
            if group[v] in unclaimed:
                unclaimed[group[v]] -= params[v]
            buffers[v] = state - params[v]
            extra = resident[v] - state
            grad_buf[v] = min(extra, left.get(group[v], 0))
            left[group[v]] = left.get(group[v], 0) - grad_buf[v]
            optim[v] = extra - grad_buf[v]
    outputs: list[list[int]] = [[] for _ in range(n)]
    for t, p in enumerate(graph.tensor_src):
        outputs[p].append(t)
    source = [holder[v] and not graph.in_edges[v] and prof.fixed_memory[v] >= graph.memory[v]
              and not prof.state_out[v] and sum(graph.tensor_bytes[t] for t in outputs[v]) <= params[v]
              for v in range(n)]
    gathered = {v: (outputs[v] if source[v] else prof.state_out[v]) for v in range(n) if holder[v]}
    # parameter groups in forward order
    first: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    for v in range(n):
        if holder[v] or prof.update[v]:
            members.setdefault(group[v], []).append(v)
        if holder[v]:
            reads = [c for t in gathered[v] for c in _consumers(graph, t)] if source[v] else [v]
            at = min((order[c] for c in reads), default=order[v])
            first[group[v]] = min(first.get(group[v], at), at)
    ordered = sorted(members, key=lambda g: (first.get(g, n), min(order[v] for v in members[g]), g))
    units = _wrap(graph, ordered, members, holder, source, params, gathered, unit_mb)
    unit_of = [-1] * n
    for u in units:
        for g in u.groups:
            for v in members[g]:
                unit_of[v] = u.index
                (u.holders if holder[v] else u.updates).append(v)
    by_group = {g: u.index for u in units for g in u.groups}
    grad_tensor = {t: by_group[g] for t, g in grad_group.items()}
    for t in sorted(grad_tensor):
        u = units[grad_tensor[t]]
        u.grads.append(t)
        u.grad_bytes += graph.tensor_bytes[t]
    param_tensor = {t: unit_of[v] for v in gathered for t in gathered[v]}
    late = [passes[v] == "backward" or v in cloned for v in range(n)]
    for u in units:
        _readers(graph, u, source, params, gathered, late, prof.update, clones)
    sequence, waits = _issue_order(graph, units, stage, order)
    return Plan(stage, "size" if unit_mb > 0 else "module", units, params, buffers, grad_buf, optim, source,
                prof.update, unit_of, param_tensor, grad_tensor, sequence, waits)


def _step_order(graph: Graph, cloned: set[int]) -> list[int]:
    """Each node's position in the order one device runs the step
    (:func:`~.allreduce.ready_order`), with every recompute clone moved to
    just before its first reader that is not a clone (it runs in the
    backward; a clone's dependencies only say when it *may* run).  Still a
    topological order: a clone keeps its inputs before it and its readers
    after it."""
    pos = ready_order(graph)
    if not cloned:
        return pos
    key = list(pos)
    for v in reversed(graph.topo_order()):
        if v in cloned:
            key[v] = min((key[s] for s in graph.succ[v]), default=pos[v])
    ranked = sorted(range(graph.n), key=lambda v: (key[v], v not in cloned, pos[v]))
    out = [0] * graph.n
    for i, v in enumerate(ranked):
        out[v] = i
    return out


def _consumers(graph: Graph, t: int) -> list[int]:
    return list(dict.fromkeys(graph.edge_dst[e] for e in graph.tensor_edges[t]))


def _wrap(graph: Graph, ordered: list[str], members: dict[str, list[int]], holder: list[bool], source: list[bool],
          params: list[int], gathered: dict[int, list[int]], unit_mb: float) -> list[Unit]:
    """Consecutive groups of *ordered* joined into units (module docstring)."""
    def size(g: str) -> tuple[int, int]:
        shard = sum(params[v] for v in members[g] if holder[v] and not source[v])
        out = sum(graph.tensor_bytes[t] for v in members[g] if source[v] for t in gathered[v])
        return shard + out, shard

    cap = math.ceil(unit_mb * 2**20)
    units: list[Unit] = []
    key = None
    for g in ordered:
        gb, sb = size(g)
        k = unit_key(g) if cap <= 0 else None
        if units and ((cap <= 0 and k is not None and k == key) or (cap > 0 and units[-1].gather_bytes < cap)):
            u = units[-1]
        else:
            u = Unit(len(units), (k or g.removeprefix("param:")) if cap <= 0 else f"unit{len(units)}", [])
            units.append(u)
        key = k
        u.groups.append(g)
        u.gather_bytes += gb
        u.shard_bytes += sb
    return units


def _readers(graph: Graph, u: Unit, source: list[bool], params: list[int], gathered: dict[int, list[int]],
             late: list[bool], update: list[bool], clones: dict[int, int]) -> None:
    """``u.fwd`` / ``u.bwd``: the readers of the unit's gathered parameters;
    *late* marks the nodes that run in the backward (its pass, or a
    recompute clone), *clones* maps a node to its recompute clone."""
    for v in u.holders:
        if not source[v] and params[v] > 0:
            u.fwd.append((v, "", params[v]))
            if v in clones:  # activation checkpointing: the recomputed forward reads the backward's gather
                u.bwd.append((clones[v], "", params[v]))
        for t in gathered[v]:
            name = f"{graph.ids[v]}/{graph.tensor_name[t]}"
            for c in _consumers(graph, t):
                if not update[c]:  # an update reads its own shard, locally
                    (u.bwd if late[c] else u.fwd).append((c, name, graph.tensor_bytes[t]))
    if not u.bwd and u.grads and u.gather_bytes > 0:
        for p in dict.fromkeys(graph.tensor_src[t] for t in u.grads):
            u.bwd.append((p, "*", u.gather_bytes))


def _issue_order(graph: Graph, units: list[Unit], stage: int, order: list[int]
                 ) -> tuple[list[tuple[str, int]], dict[int, list[int]]]:
    """The collectives in issue order and the rate limiter's waits (module docstring)."""
    gathers = []
    for u in units:
        if stage == 3 and u.gather_bytes > 0:
            for rank, (kind, readers) in enumerate((("fwd", u.fwd), ("bwd", u.bwd))):
                if readers:
                    gathers.append((min(order[c] for c, _, _ in readers), rank, u.index, kind))
    gathers.sort()
    items: list[tuple[tuple, tuple[str, int]]] = []
    for j, (first, _, ui, kind) in enumerate(gathers):  # prefetch: issued when the previous gather's unit starts
        items.append(((gathers[j - 1][0] if j else first, 0, j), (kind, ui)))
    for u in units:
        if u.grads:
            items.append(((max(order[graph.tensor_src[t]] for t in u.grads), 1, u.index), ("rs", u.index)))
        if stage < 3 and u.updates and u.gather_bytes > 0:
            items.append(((max(order[v] for v in u.updates), 2, u.index), ("post", u.index)))
    items.sort(key=lambda it: it[0])
    sequence = [item for _, item in items]
    at = {item: key[0] for key, item in items}
    waits: dict[int, list[int]] = {}
    seq_of = {item: j for j, item in enumerate(sequence)}
    for i in range(2, len(gathers)):
        back = gathers[i - 2]
        readers = units[back[2]].fwd if back[3] == "fwd" else units[back[2]].bwd
        item = (gathers[i][3], gathers[i][2])
        waits[seq_of[item]] = list(dict.fromkeys(c for c, _, _ in readers if order[c] < at[item]))
    return sequence, waits


def fsdp_size(graph: Graph, plan: Plan, k: int, collectives: str = "nccl", reps: int | None = None
              ) -> tuple[int, int]:
    """``(nodes, edges)`` of :func:`~.fsdp.fsdp_graph` of *graph* with *plan*
    over *k* replicas in the *collectives* form (*reps* of them built, the
    symmetric judge's; default all ``k``), counted without building it:
    every built replica holds a copy of every node and of every edge that
    is not a gradient (stages 2-3) or a read of gathered parameters (stage
    3); per stage-3 unit a shard; per collective one node (``nccl``), or a
    start (or pack), ``k - 1`` ring steps and a result (``ring``: it grows
    as ``k^2``).

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.transform.fsdp import fsdp_graph
    >>> nd = lambda i, **kw: {"id": i, "compute_s": 1, "memory_bytes": 8, "resident_bytes": 8, **kw}
    >>> g = build("m", [nd("x"), nd("f", colocation="param:l.0.w", batch_independent={"state_bytes": 8}),
    ...                 nd("b", op="aten.mm_backward"), nd("u", op="optim.sgd", colocation="param:l.0.w")],
    ...           [{"src": "x", "dst": "f", "bytes": 4}, {"src": "f", "dst": "b", "bytes": 4},
    ...            {"src": "b", "dst": "u", "bytes": 8, "tensor": "grad"}], meta={"batch_size": 4})
    >>> all(fsdp_size(g, fsdp_plan(g, 3), 4, form) == (d.n, d.m)
    ...     for form in ("nccl", "ring") for d in [fsdp_graph(g, 4, 3, collectives=form)])
    True
    >>> fsdp_size(g, fsdp_plan(g, 3), 4, "nccl", 1) == (lambda d: (d.n, d.m))(fsdp_graph(g, 4, 3, represent=[0]))
    True
    """
    r = k if reps is None else reps
    ring = collectives == "ring"
    nodes, edges = r * graph.n, 0
    shard3 = plan.stage == 3 and k > 1
    for e in range(graph.m):
        t = graph.edge_tensor[e]
        if k > 1 and plan.stage > 1 and t in plan.grad_tensor:
            continue
        if shard3 and t in plan.param_tensor and not plan.update[graph.edge_dst[e]]:
            continue
        edges += r
    if k == 1:
        return nodes, edges
    per = 0  # edges per replica of the collectives
    gathered = {i for kind, i in plan.sequence if kind in ("fwd", "bwd")}
    for i in gathered:
        nodes += r
        per += sum(len(set(graph.edge_tensor[e] for e in graph.out_edges[v]))
                   for v in plan.units[i].holders if plan.source[v])
    steps = k - 1 if ring else 0  # ring steps per replica and half-ring
    for j, (kind, i) in enumerate(plan.sequence):
        u = plan.units[i]
        nodes += r * (k + 1 if ring else 1)
        if kind in ("fwd", "bwd"):
            per += 1 + steps + (k if ring else 0) + len(u.fwd if kind == "fwd" else u.bwd)
        elif kind == "rs":
            per += len(u.grads) + 2 * steps + (1 if ring else 0) + len(u.updates)
        else:
            per += len(u.updates) + steps + (k if ring else 0)
        per += len(plan.waits.get(j, ())) + (1 if j else 0)
    return nodes, edges + r * per


def shard_time(t: float, k: int, overhead_s: float) -> float:
    """Time of work *t* done on ``1/k`` of the parameters: ``t/k + overhead_s``, never above *t*.

    >>> shard_time(8.0, 4, 0.5), shard_time(1.0, 4, 1.0)
    (2.5, 1.0)
    """
    return min(t, t / k + overhead_s) if t > 0 and k > 1 else t


def sharded_node(graph: Graph, v: int, nd: dict, plan: Plan, k: int, overhead_s: float) -> dict:
    """Node document *nd* of a replica of *v* with its state sharded ``k``
    ways at the plan's stage (ZeRO section 5; :mod:`~.fsdp` and the
    ``zero`` option of data parallelism, :mod:`~.replicate`): an update
    runs on its ``1/k`` of every parameter (:func:`shard_whole`); a
    holder keeps its parameters (stage 3: moved to the unit's shard) and
    ``1/k`` of its optimizer state and, from stage 2, of its gradient
    buffers (:func:`shard_cut`); other nodes are unchanged."""
    stage = plan.stage
    if k == 1:
        return nd
    if plan.update[v] or (plan.source[v] and stage == 3):
        return shard_whole(graph, v, nd, k, overhead_s)  # runs on its 1/k of the parameters
    if plan.source[v]:
        nd = shard_whole(graph, v, nd, 1, overhead_s)  # stages 1-2: every replica casts the whole parameter
    elif not plan.params[v]:
        return nd
    # a holder: stage 3 moves a compute holder's parameters to the unit's shard; the rest of its state is sharded
    cut = (plan.params[v] if stage == 3 else 0) + shard_cut(plan.grad_buf[v], k, stage >= 2) + \
        shard_cut(plan.optim[v], k, True)
    out = dict(nd)
    out["memory_bytes"] = max(0, nd["memory_bytes"] - cut)
    if "resident_bytes" in nd:
        out["resident_bytes"] = max(0, min(nd["resident_bytes"] - cut, out["memory_bytes"]))
    return out


def shard_whole(graph: Graph, v: int, nd: dict, f: int, overhead_s: float) -> dict:
    """*nd* with node *v*'s time, memory, resident bytes, ``flops``,
    ``bytes_moved`` and ``output_bytes`` those of *v* on ``1/f`` of its
    parameters (linear: ``t/f + overhead_s``, never above ``t``)."""
    ex = (graph.node_extra[v] if graph.node_extra else None) or {}
    out = {key: val for key, val in nd.items() if key not in ("resident_bytes", "pass")}
    out["compute_s"] = shard_time(graph.compute[v], f, overhead_s)
    if graph.compute_by_type[v]:
        out["compute_by_type"] = {t: shard_time(x, f, overhead_s) for t, x in graph.compute_by_type[v].items()}
    out["memory_bytes"] = -(-graph.memory[v] // f)
    for key in ("flops", "bytes_moved", "output_bytes"):
        x = ex.get(key)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            out[key] = x / f if isinstance(x, float) else -(-x // f)
    out.update(memory_fields(graph, v, out["memory_bytes"], -(-resident_of(graph, v) // f)))
    return out


def shard_cut(x: int, k: int, on: bool) -> int:
    """Bytes a replica no longer holds of *x* sharded ``k`` ways (when *on*)."""
    return x - -(-x // k) if on else 0
