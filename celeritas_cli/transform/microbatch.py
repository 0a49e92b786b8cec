"""Micro-batches as a graph transformation: the batch of a training step
split into ``m`` micro-batches of whole samples that flow through the model
one after the other, their gradients accumulated, one optimizer update per
parameter (GPipe, Huang et al., NeurIPS 2019, 2.2 "micro-batches"; the
gradient accumulation every pipeline schedule of Narayanan et al., SC'21,
2.2 relies on).  Pipeline schedules (:mod:`celeritas_cli.pipelining.cuts`)
are orders over this graph.

:func:`microbatch_graph` returns a new validated
:class:`~celeritas_cli.model.graph.Graph`; the recipe step
(:func:`microbatch_step`) is ``{"transform": "microbatch", "m": m,
"global_batch": B, "micro_batches": [b0, ...], "overhead_s": s}`` (plus
``"assume_batch": N`` when the user asserted the batch).

Structure
---------
* **Once nodes** run once per step, whatever ``m``: optimizer updates,
  all-reduce ring nodes (a data-parallel graph), ``weights`` nodes, and
  every node whose inputs are all batch-independent tensors (a transpose of
  a weight; :mod:`~celeritas_cli.transform.split_cost`).  They keep their
  id and fields.
* **Copies**: every other node ``v`` becomes ``<v>/mb<i>`` for ``i = 0..m-1``
  (fields ``microbatch`` = ``i`` and ``origin`` = ``v``; no colocation, so a
  planner may run micro-batches of one layer on different devices).  Copy
  ``i`` runs micro-batch ``b_i`` of the ``B`` samples
  (:func:`~celeritas_cli.transform.batch.whole_samples`: whole samples, the
  first ``B % m`` one larger): time :func:`~.split_cost.part_times` at
  ``f = b_i / B`` (Standard Evaluation line, roofline at the smaller shape,
  else linear plus ``overhead_s``; never better than linear), activation
  ``ceil(f * act)``, ``flops``, ``bytes_moved``, ``output_bytes`` and
  ``batch_line`` rescaled as for a data-parallel replica; a collective node
  (``collective``: a tensor-parallel all-reduce of an activation) becomes
  one collective per micro-batch, group ``<group>/mb<i>``, ``seq`` =
  ``seq m + i``, ``ceil(f * bytes)`` (a collective of once tensors, e.g.
  a gradient all-reduce, is a once node).  An edge between
  copies carries ``ceil(f * bytes)`` of a batch-dependent tensor, the whole
  of a batch-independent one.
* **Weights read once per device**: the batch-independent memory of ``v``
  that is not a kept gradient (parameters, buffers, optimizer state) lives in
  one node ``<v>/weights`` (op ``weights``, zero cost, ``v``'s
  colocation, so it stays with the update), which sends the parameters to
  every copy as one tensor ``params`` (the simulator sends a tensor to a
  device once) and forwards ``v``'s parameter reads
  (``batch_independent.state_tensors``) to their readers, as operation
  splitting does.
* **Gradient accumulation**: a tensor of ``v`` read by a once node (a
  gradient read by its update, a gradient chunk read by a ring all-reduce)
  is the sum over micro-batches.  Copy ``i >= 1``'s partial is added to the
  running sum by ``<v>/accum<i>`` (op ``accumulate_grad``, ``microbatch`` =
  ``i``, ``origin`` = ``v``, time ``3 G / 9e11``: read two, write one), a
  chain ``<v>/mb0 -> accum1 -> ... -> accum<m-1>``; the last sends every such
  tensor, under its name and bytes, to the once readers.  A chain, not the
  update reading all ``m`` partials: PyTorch accumulates into ``.grad`` as
  each micro-batch's backward ends, so one buffer (two during an add)
  stays live, where ``m`` partials waiting for the update would hold
  ``m`` times the gradient.  Memory: the kept gradient ``G`` (the part of
  ``v``'s batch-independent memory its accumulated tensors explain) is
  held by ``<v>/mb0`` (the first partial, the buffer) and by each
  ``accum<i>`` (the running sum), so under the time rule one ``G`` is live
  from the first micro-batch's backward to the update (two during an add);
  the static rule charges it ``m`` times.
* **Resident state** (``resident_bytes``, when the graph declares it): the
  ``weights`` node holds ``min(resident_bytes, its memory)``; copies and
  accumulators hold activations only (``resident_bytes`` 0).  ``pass`` is
  kept on copies; ``weights`` nodes are ``forward``, accumulators
  ``backward`` (PyTorch's ``AccumulateGrad`` runs in the backward).
* ``meta.microbatch``: ``from``, ``m``, ``global_batch``, ``micro_batches``,
  ``accumulations`` (nodes accumulated), ``gradient_bytes`` (counted once).

Composition with data parallelism
---------------------------------
* ``microbatch`` of a data-parallel graph (gradient accumulation inside
  data parallelism, the ``no_sync`` pattern of PyTorch DDP): every replica's
  batch ``B / k`` is split into ``m`` micro-batches (``micro_batches`` lists
  one replica's), the ring all-reduce nodes run once, after the last
  accumulation.  Uneven replica shares are refused.
* ``data-parallel`` of a micro-batched graph (replicated pipelines): the
  copies are replicated like any node; accumulators, ``weights`` nodes and
  the partials are batch-independent (their ``batch_independent`` field
  says so), so each replica accumulates its own micro-batches in full and
  the rings reduce the accumulated gradient.

Refused, in one line: a graph that declares no batch (``meta.batch_size``;
``assume_batch`` asserts one), a batch smaller than ``m``.

References
----------
Huang et al., "GPipe", NeurIPS 2019, 2.2 (micro-batches, gradients
accumulated and applied once at the end of the mini-batch); Narayanan et
al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, 2.2 (pipeline flushes, synchronous weight update).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA, Graph
from .batch import declared_batch, whole_samples
from .passes import declares_passes
from .size import Size, check_size
from .split_cost import COPY_BANDWIDTH_BPS, DEFAULT_OVERHEAD_S, batch_profile, part_times
from .splitting import edge_dicts, fresh_namer

ACCUMULATE_OP = "accumulate_grad"
__all__ = ["ACCUMULATE_OP", "apply_microbatch_step", "declares_resident", "microbatch_batches", "microbatch_graph",
           "microbatch_size", "microbatch_step", "once_nodes"]


def _extra(graph: Graph, v: int) -> dict:
    return (graph.node_extra[v] or {}) if graph.node_extra else {}


def _share(x: int, b: int, total: int) -> int:
    """``ceil(x * b / total)`` in integers."""
    return -(-int(x) * b // total)


def declares_resident(graph: Graph) -> bool:
    """True when a node of *graph* carries ``resident_bytes`` (the graph
    declares the time rule's data; a node without it then counts as all
    resident)."""
    return any("resident_bytes" in _extra(graph, v) for v in range(graph.n))


def microbatch_step(m: int, global_batch: int, micro_batches: list[int], overhead_s: float,
                    assume_batch: int | None = None) -> dict:
    """The recipe step of :func:`microbatch_graph`."""
    step: dict[str, Any] = {"transform": "microbatch", "m": int(m), "global_batch": int(global_batch),
                            "micro_batches": [int(b) for b in micro_batches], "overhead_s": overhead_s}
    if assume_batch is not None:
        step["assume_batch"] = int(assume_batch)
    return step


def microbatch_batches(graph: Graph, m: int, assume_batch: int | None = None) -> tuple[int, list[int]]:
    """``(global_batch, micro_batches)``: the batch *graph* declares (or
    *assume_batch*) and the ``m`` whole-sample micro-batches of one
    pipeline (of one replica's batch in a data-parallel graph).

    Raises
    ------
    InvalidInput
        ``m`` not a whole number >= 1, no declared batch, a data-parallel
        graph with uneven shares or a replica batch that is not whole, or
        a batch smaller than ``m``.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [], meta={"batch_size": 10})
    >>> microbatch_batches(g, 4)
    (10, [3, 3, 2, 2])
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise InvalidInput(f"microbatch: the number of micro-batches m must be a whole number >= 1, got {m!r}")
    total = declared_batch(graph, assume_batch, what="micro-batching")
    unit, what = total, f"microbatch: graph '{graph.name}': the batch"
    dp = graph.meta.get("data_parallel")
    if isinstance(dp, dict):
        if isinstance(dp.get("batch_fraction"), list):
            raise InvalidInput(f"microbatch: graph '{graph.name}' is data-parallel with uneven batch shares; "
                               f"micro-batch the model graph first, then replicate it")
        k = int(dp.get("replicas", 1))
        if dp.get("scaling", "strong") == "strong":
            if total % k:
                raise InvalidInput(f"microbatch: graph '{graph.name}': its batch of {total} samples over {k} "
                                   f"replicas is not a whole number of samples per replica")
            unit = total // k
        what = f"microbatch: graph '{graph.name}': the replica batch"
    return total, whole_samples(unit, m, what=what)


def once_nodes(graph: Graph) -> list[bool]:
    """Nodes that run once per step however many micro-batches there are
    (module docstring): updates, ring all-reduce nodes, ``weights`` nodes
    and nodes whose inputs are all batch-independent.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("o", [{"id": "x", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "x", "dst": "u", "bytes": 4}])
    >>> once_nodes(g)
    [False, True]
    """
    prof = batch_profile(graph)
    once = [False] * graph.n
    once_t = list(prof.fixed_tensor)
    out_tensors: list[list[int]] = [[] for _ in range(graph.n)]
    for t, p in enumerate(graph.tensor_src):
        out_tensors[p].append(t)
    for v in graph.topo_order():
        ins = prof.inputs[v]  # a split part of a source reading its own parameters is still a source
        once[v] = (prof.update[v] or prof.fixed_node[v] or "allreduce" in _extra(graph, v)
                   or (graph.op[v] == "weights" and not ins)
                   or (bool(ins) and all(once_t[graph.edge_tensor[e]] for e in ins)))
        if once[v]:
            for t in out_tensors[v]:
                once_t[t] = True
    return once


def microbatch_size(graph: Graph, m: int) -> tuple[int, int]:
    """``(nodes, edges)`` of :func:`microbatch_graph` of *graph* with *m*
    micro-batches, counted without building it (a recipe is sized before
    it is built): once nodes and their edges once, every other node and
    edge ``m`` times, a ``weights`` node with an edge to each copy, and
    ``m - 1`` accumulations of two input edges per accumulated node.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("s", [{"id": "x", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "x", "dst": "u", "bytes": 4}], meta={"batch_size": 4})
    >>> microbatch_size(g, 4), (lambda d: (d.n, d.m))(microbatch_graph(g, 4))
    ((8, 7), (8, 7))
    """
    prof = batch_profile(graph)
    once = once_nodes(graph)
    cons = graph.tensor_consumers()
    grads = [-1] * graph.n  # bytes of the accumulated tensors of a copied node (-1: none)
    for t, p in enumerate(graph.tensor_src):
        if not once[p] and t not in prof.state_out[p] and any(once[d] for d in cons[t]):
            grads[p] = max(grads[p], 0) + graph.tensor_bytes[t]
    nodes = 0
    edges = sum(1 if once[d] else m for d in graph.edge_dst)
    for v in range(graph.n):
        if once[v]:
            nodes += 1
            continue
        nodes += m
        params = prof.param_bytes[v]
        if params > 0 or prof.state_out[v] or prof.fixed_memory[v] > max(grads[v], 0):
            nodes += 1
            edges += m if params > 0 else 0
        if grads[v] >= 0:
            nodes += m - 1
            edges += 2 * (m - 1)
    return nodes, edges


def microbatch_graph(graph: Graph, m: int, *, overhead_s: float = DEFAULT_OVERHEAD_S,
                     assume_batch: int | None = None) -> Graph:
    """The micro-batched graph of *graph* with *m* micro-batches (module
    docstring).

    Parameters
    ----------
    graph : Graph
        A graph that declares its batch (``meta.batch_size``), plain,
        coarse, split or data-parallel.
    m : int
        Number of micro-batches, ``1 <= m <= batch``.
    overhead_s : float
        Extra time of a copy whose time is scaled linearly
        (:func:`~.split_cost.part_times`).
    assume_batch : int, optional
        The batch the graph's costs hold for, when it declares none.

    Returns
    -------
    Graph

    Raises
    ------
    InvalidInput
        See :func:`microbatch_batches`; a derived graph over the budget
        (:func:`~.size.check_size`, before anything is built).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("m", [{"id": "x", "compute_s": 4.0, "memory_bytes": 400},
    ...                 {"id": "w", "compute_s": 8.0, "memory_bytes": 500, "colocation": "p",
    ...                  "batch_independent": {"memory_bytes": 100, "state_bytes": 100}},
    ...                 {"id": "g", "compute_s": 8.0, "memory_bytes": 100,
    ...                  "batch_independent": {"memory_bytes": 100}},
    ...                 {"id": "u", "op": "optim.sgd", "compute_s": 1.0, "memory_bytes": 0, "colocation": "p"}],
    ...           [{"src": "x", "dst": "w", "bytes": 400}, {"src": "w", "dst": "g", "bytes": 400},
    ...            {"src": "g", "dst": "u", "bytes": 100}], meta={"batch_size": 4})
    >>> d = microbatch_graph(g, 2, overhead_s=0.0)
    >>> [d.ids[v] for v in range(d.n)]  # doctest: +NORMALIZE_WHITESPACE
    ['x/mb0', 'x/mb1', 'w/weights', 'w/mb0', 'w/mb1', 'g/mb0', 'g/mb1', 'g/accum1', 'u']
    >>> d.compute[d.index["w/mb1"]], d.memory[d.index["w/mb1"]], d.memory[d.index["w/weights"]]
    (4.0, 200, 100)
    """
    total, mbs = microbatch_batches(graph, m, assume_batch)
    check_size(Size(*microbatch_size(graph, m)), f"micro-batching graph '{graph.name}' into {m}",
               "fewer micro-batches (-p microbatches=)")
    unit = sum(mbs)
    return _Builder(graph, mbs, unit, overhead_s).build(total)


class _Builder:
    """One micro-batching in progress (nodes and edges in graph order)."""

    def __init__(self, graph: Graph, mbs: list[int], unit: int, overhead_s: float):
        self.g, self.mbs, self.unit, self.overhead_s = graph, mbs, unit, overhead_s
        self.m = len(mbs)
        self.prof = batch_profile(graph)
        self.once = once_nodes(graph)
        self.fresh = fresh_namer(graph)
        self.docs = graph.to_dict()["nodes"]
        self.resident = declares_resident(graph)
        self.passes = declares_passes(graph)
        self.nodes: list[dict] = []
        self.edges: list[dict] = []
        n = graph.n
        self.copies: list[list[str]] = [[] for _ in range(n)]
        self.weights: list[str | None] = [None] * n
        self.last: list[str | None] = [None] * n  # who sends v's accumulated tensors
        self.tensors: list[list[int]] = [[] for _ in range(n)]
        for t, p in enumerate(graph.tensor_src):
            self.tensors[p].append(t)
        cons = graph.tensor_consumers()
        self.state = [set(self.prof.state_out[v]) for v in range(n)]
        # tensors of a copied node read by a once node: summed over micro-batches
        self.accumulated = [[t for t in self.tensors[v] if t not in self.state[v]
                             and any(self.once[d] for d in cons[t])] if not self.once[v] else []
                            for v in range(n)]
        self.param_edges: list[tuple[int, str, int]] = []  # (v, tensor name, bytes): weights -> every copy
        self.acc_bytes = 0
        self.acc_nodes = 0

    def build(self, total: int) -> Graph:
        g = self.g
        for v in range(g.n):
            if self.once[v]:
                self.nodes.append(self.docs[v])
            else:
                self._copy(v)
        self._edges()
        meta = dict(g.meta)
        meta["microbatch"] = {"from": g.name, "m": self.m, "global_batch": total, "micro_batches": list(self.mbs),
                              "accumulations": self.acc_nodes, "gradient_bytes": self.acc_bytes}
        name = f"{g.name}+mb{self.m}"
        return Graph.from_dict({"schema": GRAPH_SCHEMA, "name": name, "meta": meta, "nodes": self.nodes,
                                "edges": self.edges}, label=name, derived=True)

    def _copy(self, v: int) -> None:
        g, prof, m = self.g, self.prof, self.m
        vid = g.ids[v]
        extra = _extra(g, v)
        fixed = prof.fixed_memory[v]
        grads = sum(g.tensor_bytes[t] for t in self.accumulated[v])
        keep = min(fixed, grads)  # the kept gradient: the accumulation buffer
        rest = fixed - keep  # parameters, buffers, optimizer state: held once
        params = prof.param_bytes[v]
        if params > 0 or self.state[v] or rest > 0:
            self._weights(v, rest, params, extra)
        fixed_out = sum(g.tensor_bytes[t] for t in self.tensors[v] if prof.fixed_tensor[t])
        partial = _fresh_tensor("grad_partial", {g.tensor_name[t] for t in self.tensors[v]})
        for i, b in enumerate(self.mbs):
            cid = self.fresh(f"{vid}/mb{i}")
            self.copies[v].append(cid)
            self.nodes.append(self._copy_doc(v, i, b, keep if i == 0 else 0, fixed_out,
                                             partial if self.accumulated[v] else None, extra, cid))
        if not self.accumulated[v]:
            return
        self.acc_nodes += 1
        self.acc_bytes += grads
        self.last[v] = self.copies[v][0]
        for i in range(1, m):
            aid = self.fresh(f"{vid}/accum{i}")
            nd: dict[str, Any] = {"id": aid, "op": ACCUMULATE_OP, "compute_s": 3.0 * grads / COPY_BANDWIDTH_BPS,
                                  "memory_bytes": int(keep), "batch_independent": {"memory_bytes": int(keep)},
                                  "microbatch": i, "origin": vid}
            if "replica" in extra:
                nd["replica"] = extra["replica"]
            self._fields(nd, 0, "backward")
            self.nodes.append(nd)
            prev = self.last[v]
            self.edges.append({"src": prev, "dst": aid, "bytes": grads, "tensor": partial if i == 1 else "grad_sum"})
            self.edges.append({"src": self.copies[v][i], "dst": aid, "bytes": grads, "tensor": partial})
            self.last[v] = aid

    def _weights(self, v: int, rest: int, params: int, extra: dict) -> None:
        g = self.g
        wid = self.fresh(f"{g.ids[v]}/weights")
        self.weights[v] = wid
        names = [g.tensor_name[t] for t in self.tensors[v] if t in self.state[v]]
        pname = _fresh_tensor("params", set(names))
        bi: dict[str, Any] = {"memory_bytes": int(rest), "state_bytes": int(params)}
        if names or params > 0:
            bi["state_tensors"] = names + ([pname] if params > 0 else [])
        nd: dict[str, Any] = {"id": wid, "op": "weights", "compute_s": 0.0, "memory_bytes": int(rest)}
        if g.colocation[v] is not None:
            nd["colocation"] = g.colocation[v]
        nd["batch_independent"] = bi
        nd["origin"] = g.ids[v]
        if "replica" in extra:
            nd["replica"] = extra["replica"]
        self._fields(nd, min(int(extra.get("resident_bytes", g.memory[v])), int(rest)), "forward")
        self.nodes.append(nd)
        if params > 0:
            self.param_edges.append((v, pname, int(params)))

    def _fields(self, nd: dict, resident: int, pass_: str) -> None:
        """``resident_bytes`` and ``pass`` of a new node, when the graph declares them."""
        if self.resident:
            nd["resident_bytes"] = max(0, min(resident, nd["memory_bytes"]))
        if self.passes:
            nd["pass"] = pass_

    def _copy_doc(self, v: int, i: int, b: int, keep: int, fixed_out: int, partial: str | None, extra: dict,
                  cid: str) -> dict:
        g, unit = self.g, self.unit
        frac = b / unit
        act = g.memory[v] - self.prof.fixed_memory[v]
        c, by = part_times(g, v, frac, overhead_s=self.overhead_s)
        nd: dict[str, Any] = {"id": cid, "op": g.op[v], "compute_s": c}
        if by:
            nd["compute_by_type"] = by
        nd["memory_bytes"] = int(keep) + _share(act, b, unit)
        if g.splittable[v]:
            nd["splittable"] = list(g.splittable[v])
        out = {k: val for k, val in extra.items() if k not in ("resident_bytes", "origin", "microbatch")}
        old_bi = extra.get("batch_independent") if isinstance(extra.get("batch_independent"), dict) else {}
        if frac < 1.0:
            if isinstance(out.get("flops"), (int, float)):
                out["flops"] = int(round(out["flops"] * frac))
            if isinstance(out.get("bytes_moved"), (int, float)):
                mf = old_bi.get("bytes_moved", 0)
                out["bytes_moved"] = int(round(mf + (out["bytes_moved"] - mf) * frac))
            if isinstance(out.get("output_bytes"), int):
                out["output_bytes"] = fixed_out + _share(max(0, out["output_bytes"] - fixed_out), b, unit)
        line = out.get("batch_line")
        if isinstance(line, dict):
            line = {k: val for k, val in line.items() if k != "memory_bytes"}
            if isinstance(line.get("batch"), (int, float)):
                line["batch"] = line["batch"] * frac
            out["batch_line"] = line
        bi: dict[str, Any] = {"memory_bytes": int(keep)}
        if isinstance(old_bi.get("bytes_moved"), (int, float)):
            bi["bytes_moved"] = old_bi["bytes_moved"]
        if partial is not None:
            bi["state_tensors"] = [partial]  # a partial gradient is whole whatever the batch
        out["batch_independent"] = bi
        nd.update(out)
        nd["microbatch"] = i
        nd["origin"] = g.ids[v]
        c = nd.get("collective")
        if isinstance(c, dict):  # each micro-batch's collective is its own group, of its micro-batch's bytes
            nbytes = c.get("bytes")
            nd["collective"] = {**c, "group": f"{c.get('group')}/mb{i}",
                                "seq": c["seq"] * self.m + i if isinstance(c.get("seq"), int) else c.get("seq"),
                                "bytes": _share(nbytes, b, unit) if isinstance(nbytes, int) else nbytes}
        if self.resident:
            nd["resident_bytes"] = 0
        return nd

    def _edges(self) -> None:
        g, once, m = self.g, self.once, self.m
        for e, ed in enumerate(edge_dicts(g)):
            s, d, t = g.edge_src[e], g.edge_dst[e], g.edge_tensor[e]
            if once[s]:
                if once[d]:
                    self.edges.append(ed)
                else:
                    self.edges.extend({**ed, "dst": c} for c in self.copies[d])
                continue
            if t in self.state[s]:
                dsts = [g.ids[d]] if once[d] else self.copies[d]
                self.edges.extend({**ed, "src": self.weights[s], "dst": x} for x in dsts)
            elif once[d]:
                self.edges.append({**ed, "src": self.last[s]})
            else:
                fixed = self.prof.fixed_tensor[t]
                for i, b in enumerate(self.mbs):
                    out = {**ed, "src": self.copies[s][i], "dst": self.copies[d][i]}
                    if not fixed and m > 1:
                        out["bytes"] = _share(ed["bytes"], b, self.unit)
                        if out["bytes"] != ed["bytes"]:
                            out.pop("comm_s_by_pair", None)
                    self.edges.append(out)
        for v, name, params in self.param_edges:
            self.edges.extend({"src": self.weights[v], "dst": c, "bytes": params, "tensor": name}
                              for c in self.copies[v])


def _fresh_tensor(name: str, taken: set[str]) -> str:
    """*name*, with ``~`` appended until no tensor of the producer has it."""
    while name in taken:
        name += "~"
    return name


def apply_microbatch_step(graph: Graph, step: dict, label: str) -> Graph:
    """Apply a recorded ``microbatch`` step to *graph*, after checking that
    its ``global_batch`` and ``micro_batches`` are what *graph* and ``m``
    give (a recipe that records other batches is refused, like a
    ``split_graph`` that does not derive from its recipe).

    Raises KeyError, TypeError or ValueError for a missing field or one of
    the wrong type (the caller words them), InvalidInput when the recorded
    batches differ or :func:`microbatch_graph` refuses.
    """
    m = step["m"]
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(m)
    assume = step.get("assume_batch")
    if assume is not None and (isinstance(assume, bool) or not isinstance(assume, int)):
        raise TypeError(assume)
    overhead = float(step.get("overhead_s", DEFAULT_OVERHEAD_S))
    if not math.isfinite(overhead) or overhead < 0:
        raise ValueError(overhead)
    total, mbs = microbatch_batches(graph, m, assume)
    if step["global_batch"] != total or step["micro_batches"] != mbs:
        raise InvalidInput(f"{label}: microbatch step records global_batch {step['global_batch']!r} and "
                           f"micro_batches {step['micro_batches']!r}, but graph '{graph.name}' with m={m} gives "
                           f"{total} and {mbs}")
    return microbatch_graph(graph, m, overhead_s=overhead, assume_batch=assume)
