"""Capture a PyTorch training step (or inference) as a placer graph.

torch is imported lazily, inside the functions, so importing this module
costs nothing without torch; every entry point raises
:class:`~celeritas_cli.errors.MissingDependency` when torch is missing.

How a model becomes a graph (Celeritas 4.2.1 and 6.1; FastT section 4):

1. The model is built under ``torch.device("meta")`` (parameters have shapes
   but no storage), then parameters, buffers and inputs are re-created as
   fake tensors (``FakeTensorMode``) and the whole step is traced with
   ``make_fx``: forward, loss, ``torch.autograd.grad`` (the backward ops) for
   training, the forward alone under ``no_grad`` for inference.  Nothing is
   allocated, whatever the batch size.
2. Every aten call of the trace is a node (id = the fx name, e.g.
   ``convolution_3``; op = ``aten.convolution``), except view-like ops
   (view, reshape, transpose, expand, getitem, t, permute, unsqueeze,
   split, detach, ...) which are folded into their producer: a consumer of a
   view reads the producer's tensor, and factory ops with no data input
   (``zeros``, ``ones_like``, ...) which are constants materialised where
   they are used, and bookkeeping ops that read only state and whose result
   nobody uses (BatchNorm's ``num_batches_tracked += 1``).  Model inputs are ``input_<k>`` / ``target`` nodes.
3. One producer output is one ``tensor`` (``"<node>:<k>"``), shared by all
   its consumers; edge ``bytes`` = that output's numel x element size.
4. Parameters and buffers are not nodes: each is owned by the first node
   that reads it, which holds its bytes and is colocated with the
   parameter's optimizer update (``colocation = "param:<first owned
   name>"``): TensorFlow's colocation of a variable with its ``ApplyAdam``
   (Celeritas 6.1).  Later readers (the backward matmul that needs the
   weight, a tied embedding) get an edge from the owner carrying the
   parameter (tensor ``"<owner>:<param name>"``), as a TensorFlow variable
   read crosses devices.  Colocating every reader instead would chain the
   forward and backward halves of all layers into one group once a
   coarsener merges clusters.  Training adds one ``optim.adam`` node per
   parameter (TensorFlow's ApplyAdam, or torch's fused Adam), fed by the
   gradient's producer, holding Adam's two moments (2 x parameter bytes).
5. ``memory_bytes`` = owned parameters/buffers/optimizer state + the
   node's kept outputs: every output of a forward node (activations live
   until the backward pass uses them; all outputs in inference), and of a
   backward node only the parameter gradients it produces (kept until the
   update); other backward outputs are transient and hold nothing for the
   whole step.  The forward part is everything traced up to the loss.
   ``resident_bytes`` is the resident part (owned parameters and buffers,
   optimizer state: held for the whole step); the rest of ``memory_bytes``
   is activation (kept outputs, kept gradients).  ``pass`` is ``forward``
   (model inputs and everything up to the loss), ``backward`` (after the
   loss) or ``update`` (the optimizer nodes).
6. Costs: FLOPs from ``torch.utils.flop_counter.flop_registry`` or
   :mod:`.flops`, bytes moved = inputs + outputs, then the roofline of
   :mod:`.devices` for every device type (``compute_by_type``);
   ``compute_s`` is the V100 time.  Extra node fields ``flops``,
   ``bytes_moved`` and ``output_bytes`` keep the raw numbers.
7. What does not scale with the batch (for the split cost model,
   :mod:`celeritas_cli.transform.split_cost`): node field
   ``batch_independent`` = ``memory_bytes`` (owned parameters/buffers,
   kept gradients, optimizer state; all of a node not reached from a model
   input), ``state_bytes`` (owned parameters/buffers), ``bytes_moved``
   (parameter reads and gradient writes) and ``state_tensors`` (the tensors
   carrying the node's parameters to later readers).  ``splittable``
   (convolution: batch and channel; its backward and matmuls: batch) is
   only set on nodes reached from a model input.
8. Precision (``--precision``, ``meta.precision``): ``fp32`` traces the
   step as written.  ``bf16`` / ``fp16`` trace the forward and the loss
   under ``torch.autocast`` (torch's automatic mixed precision, its CPU op
   policy: matmuls, convolutions and attention on half tensors, other ops
   in their input's type): parameters, their gradients and Adam's moments
   stay fp32 (master weights), each weight is cast to a half copy where it
   is used (an ``_to_copy`` node; its half output is an activation, kept
   for the backward pass as autograd keeps it).  ``fp16`` adds the loss
   scale of torch's ``GradScaler`` (the loss times :data:`LOSS_SCALE`, each
   gradient times its inverse before the update: ``unscale_``); ``bf16``
   needs none.  Half matmuls and attention are priced at the tensor-core
   peak times :data:`celeritas_cli.model.devices.TENSOR_CORE_EFFICIENCY`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidInput, MissingDependency
from ..model.graph import GRAPH_SCHEMA
from ..model import devices as dev
from .flops import formula_flops, is_tensor_core_op, short
from .models import resolve_model
from .stepmap import FACTORY_OPS, VIEW_OPS, flat, map_trace, nbytes, outputs  # noqa: F401 (re-exported)

#: ``--precision`` -> the autocast dtype (``None``: no autocast).
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
#: fp16 loss scale: ``torch.amp.GradScaler``'s initial scale (2^16); the capture keeps it constant.
LOSS_SCALE = 2.0**16

SPLITTABLE = {"convolution": ["batch", "channel"], "convolution_backward": ["batch"],
              "mm": ["batch"], "addmm": ["batch"], "bmm": ["batch"], "baddbmm": ["batch"]}


def require_torch():
    """Import torch or raise :class:`MissingDependency` with the fix."""
    try:
        import torch
    except ImportError:
        raise MissingDependency("profiling PyTorch models needs torch: pip install -e .[torch]") from None
    return torch


# ------------------------------------------------------------------ models
def build_meta(factory: Callable):
    """Instantiate *factory* with parameters on the meta device (no storage)."""
    torch = require_torch()
    try:
        with torch.device("meta"):
            model = factory()
    except InvalidInput:
        raise
    except Exception as exc:  # the user's constructor failed: one line, not a traceback
        raise InvalidInput(f"building the model failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise InvalidInput(f"the model factory returned {type(model).__name__}, expected a torch.nn.Module")
    if not hasattr(model, "example_inputs"):
        raise InvalidInput(f"model {type(model).__name__} has no example_inputs(batch_size) method; add one "
                           f"returning the forward arguments (see placer profile --help)")
    return model


# ----------------------------------------------------------------- capture
@dataclass
class Trace:
    """The raw fx trace and what each placeholder stands for."""

    gm: Any
    param_names: list[str]
    buffer_names: list[str]
    n_inputs: int
    has_target: bool
    grad_of: list[int] = field(default_factory=list)   # output k (after loss) -> param index
    precision: str = "fp32"


def trace_step(model, batch: int, phase: str = "training", precision: str = "fp32") -> Trace:
    """Trace one step of *model* at *batch* with make_fx on fake tensors.

    Parameters
    ----------
    model : an ``nn.Module`` built on the meta device (:func:`build_meta`).
    batch : batch size (>= 1; use >= 2 for the Standard Evaluation).
    phase : ``training`` (forward, loss, backward; optimizer added later) or ``inference``.
    precision : ``fp32``, or ``bf16`` / ``fp16`` mixed precision (module docstring, point 8).
    """
    torch = require_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    if phase not in ("training", "inference"):
        raise InvalidInput(f"--phase must be training or inference, got {phase!r}")
    if batch < 1:
        raise InvalidInput(f"--batch-size must be >= 1, got {batch}")
    if precision not in PRECISIONS:
        raise InvalidInput(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    half = getattr(torch, PRECISIONS[precision]) if PRECISIONS[precision] else None
    training = phase == "training"
    model.train(training)
    named_params = [(k, p) for k, p in model.named_parameters()]
    named_buffers = [(k, b) for k, b in model.named_buffers()]
    mode = FakeTensorMode()
    with mode:
        params = [torch.empty(p.shape, dtype=p.dtype, requires_grad=training and p.requires_grad)
                  for _, p in named_params]
        buffers = [torch.empty(b.shape, dtype=b.dtype) for _, b in named_buffers]
        inputs = tuple(model.example_inputs(batch))
        target = model.example_target(batch) if (training and hasattr(model, "example_target")) else None
    names = [k for k, _ in named_params] + [k for k, _ in named_buffers]
    trainable = [i for i, (_, p) in enumerate(named_params) if training and p.requires_grad]

    def step(params, buffers, inputs, target):
        state = dict(zip(names, list(params) + list(buffers)))
        with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=half is not None):
            if not training:
                with torch.no_grad():
                    return torch.func.functional_call(model, state, tuple(inputs))
            out = torch.func.functional_call(model, state, tuple(inputs))
            if hasattr(model, "loss"):
                loss = model.loss(out, target)
            else:
                loss = (out if torch.is_tensor(out) else out[0]).float().mean()
        if precision == "fp16":            # GradScaler: a scaled loss, gradients unscaled before the update
            loss = loss * LOSS_SCALE
        grads = torch.autograd.grad(loss, [params[i] for i in trainable], allow_unused=True)
        if precision == "fp16":
            grads = tuple(g if g is None else g * (1.0 / LOSS_SCALE) for g in grads)
        return [loss] + [g for g in grads]

    with mode:
        try:
            gm = make_fx(step, tracing_mode="real", record_module_stack=True)(params, buffers, list(inputs), target)
        except (RuntimeError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidInput(f"tracing {type(model).__name__} at batch {batch} failed: {first}") from None
    return Trace(gm=gm, param_names=[k for k, _ in named_params], buffer_names=[k for k, _ in named_buffers],
                 n_inputs=len(inputs), has_target=target is not None, grad_of=trainable,
                 precision=precision)


def _is_tensor(val) -> bool:
    import torch

    return isinstance(val, torch.Tensor)


def _flops(node, op: str) -> int:
    """FLOPs of one fx node: torch's flop registry first, then :mod:`.flops`."""
    from torch.fx.node import map_arg
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    args = map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = map_arg(node.kwargs, lambda n: n.meta.get("val"))
    if packet is not None and packet in flop_registry:
        try:
            return int(flop_registry[packet](*args, out_val=node.meta.get("val"), **kwargs))
        except Exception:  # noqa: BLE001 - a formula that cannot read these args: fall back
            pass
    in_shapes = [tuple(a.shape) for a in flat(args) if _is_tensor(a)]
    out_shapes = [tuple(o.shape) for o in outputs(node.meta.get("val")) if _is_tensor(o)]
    kernel = None
    if short(op) in ("max_pool2d_with_indices", "avg_pool2d", "max_pool2d_with_indices_backward",
                     "avg_pool2d_backward"):
        ks = args[2] if short(op).endswith("backward") and len(args) > 2 else (args[1] if len(args) > 1 else None)
        if isinstance(ks, (list, tuple)) and all(isinstance(k, int) for k in ks):
            kernel = tuple(ks) if len(ks) > 1 else (ks[0], ks[0])
    return formula_flops(op, in_shapes, out_shapes, kernel=kernel)


def _dtype_name(vals) -> str:
    for v in vals:
        if _is_tensor(v) and v.is_floating_point():
            return str(v.dtype).removeprefix("torch.")
    return "float32"


def trace_to_doc(tr: Trace, *, name: str, meta: dict, optimizer: str = "adam") -> dict:
    """Turn a :class:`Trace` into a ``placer.graph/v1`` document (see the module docstring).

    Parameters
    ----------
    tr : the trace.
    name : graph name.
    meta : written to ``meta`` (source, phase, batch size ...).
    optimizer : ``adam`` (2 moments per parameter) or ``sgd`` (no state).
    """
    sm = map_trace(tr, optimizer)
    nodes = [{"id": nid, "op": op} for nid, op in zip(sm.ids, sm.ops)]
    n_state = len(tr.param_names) + len(tr.buffer_names)
    placeholders = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    state_bytes, state_numel = _state_sizes(placeholders[:n_state], n_state)
    colocation = _colocation(sm)
    state_edges = _state_edges(sm)
    batch_dep = _batch_dependent(sm)
    state_readers = _state_readers(sm, state_edges)
    kept_grad: dict[int, set[int]] = {}      # node -> its outputs an optimizer update reads (kept gradients)
    for v in sm.opt_param:
        for (u, k) in sm.in_refs[v]:
            kept_grad.setdefault(u, set()).add(k)
    for v, nd in enumerate(nodes):
        _fill_node(nd, v, sm, optimizer=optimizer, state_bytes=state_bytes, state_numel=state_numel,
                   kept=sum(sm.out_bytes[v][k] for k in sorted(kept_grad.get(v, ()))),
                   batch_dep=batch_dep[v], readers=state_readers.get(v), colocation=colocation.get(v))
    edges = _edges(sm, state_edges, state_bytes)
    meta = dict(meta)
    meta.setdefault("precision", tr.precision)
    return {"schema": GRAPH_SCHEMA, "name": name, "meta": _meta(meta, sm, state_bytes, state_numel),
            "nodes": nodes, "edges": edges}


def _state_sizes(placeholders: list, n_state: int) -> tuple[list[int], list[int]]:
    """Bytes and element counts of every parameter and buffer (placeholders in state order)."""
    state_bytes = [0] * n_state
    state_numel = [0] * n_state
    for k, ph in enumerate(placeholders):
        state_bytes[k] = nbytes(ph.meta.get("val"))
        state_numel[k] = int(ph.meta["val"].numel()) if _is_tensor(ph.meta.get("val")) else 0
    return state_bytes, state_numel


def _colocation(sm) -> dict[int, str]:
    """Colocation of each owner with its parameters' updates (module docstring, point 4):
    node -> ``param:<first owned state name>``."""
    owner = sm.owner
    group_of: dict[int, str] = {}            # owner node -> group name (its first owned state)
    for st in sorted(owner, key=lambda x: (owner[x], x)):
        group_of.setdefault(owner[st], "param:" + sm.state_names[st])
    colocation: dict[int, str] = dict(group_of)
    for v, p in sm.opt_param.items():
        colocation[v] = group_of[owner[p]]
    return colocation


def _state_edges(sm) -> list[list[tuple[int, int]]]:
    """Per node, the ``(owner, state)`` pairs it reads from another node (parameter reads cross devices)."""
    state_edges: list[list[tuple[int, int]]] = [[] for _ in sm.ids]
    for v, refs in enumerate(sm.state_refs):
        if v in sm.opt_param:
            continue
        for st in refs:
            u = sm.owner[st]
            if u != v and (u, st) not in state_edges[v]:
                state_edges[v].append((u, st))
    return state_edges


def _batch_dependent(sm) -> list[bool]:
    """Nodes reached from a model input (state and constants do not depend on the batch)."""
    batch_dep = [False] * len(sm.ids)
    for v in range(len(sm.ids)):
        if v in sm.opt_param:
            continue
        batch_dep[v] = sm.fx_of[v] is not None and sm.fx_of[v].op == "placeholder" or any(
            batch_dep[u] for (u, _) in sm.in_refs[v])
    return batch_dep


def _state_readers(sm, state_edges) -> dict[int, list[str]]:
    """Owner node -> the tensors (``<owner>:<state name>``) carrying its state to later readers."""
    state_readers: dict[int, list[str]] = {}
    for v in range(len(sm.ids)):
        for (u, st) in state_edges[v]:
            tname = f"{sm.ids[u]}:{sm.state_names[st]}"
            if tname not in state_readers.setdefault(u, []):
                state_readers[u].append(tname)
    return state_readers


def _work(nd: dict, v: int, sm, optimizer: str, state_bytes, state_numel) -> tuple[int, int, str, bool]:
    """FLOPs, bytes moved, dtype and tensor-core use of graph node *v* (module docstring, point 6)."""
    import torch

    if v in sm.opt_param:
        p = sm.opt_param[v]
        flops = (12 if optimizer == "adam" else 2) * state_numel[p]
        moved = (7 if optimizer == "adam" else 3) * state_bytes[p]
        return flops, moved, "float32", False
    fxn = sm.fx_of[v]
    if fxn.op == "placeholder":
        return 0, 0, "float32", False
    flops = _flops(fxn, nd["op"])
    ins = [a.meta.get("val") for a in dict.fromkeys(
        x for x in flat((fxn.args, fxn.kwargs)) if isinstance(x, torch.fx.Node))]
    moved = sum(nbytes(a) for a in ins if _is_tensor(a)) + sum(sm.out_bytes[v])
    return flops, moved, _dtype_name(ins + outputs(fxn.meta.get("val"))), is_tensor_core_op(nd["op"])


def _fill_node(nd: dict, v: int, sm, *, optimizer: str, state_bytes, state_numel, kept: int, batch_dep: bool,
               readers: list[str] | None, colocation: str | None) -> None:
    """Costs, memory, ``splittable`` and ``batch_independent`` of graph node *v* (module docstring, 5-7);
    *kept* = bytes of its outputs kept as parameter gradients."""
    owner = sm.owner
    refs = sm.state_refs[v]
    if sm.backward_from <= v and v not in sm.opt_param:
        # backward outputs are transient, except parameter gradients (kept until the update)
        mem = kept
    else:
        mem = sum(sm.out_bytes[v])
    owned = sum(state_bytes[s] for s in refs if owner.get(s) == v)
    read = sum(state_bytes[s] for s in refs)  # own and others' parameters this node reads
    mem += owned
    resident = owned
    if v in sm.opt_param:
        resident += (2 if optimizer == "adam" else 0) * state_bytes[sm.opt_param[v]]
        mem += resident - owned
    flops, moved, dtype, tc = _work(nd, v, sm, optimizer, state_bytes, state_numel)
    by_type = dev.times_by_type(flops, moved, dtype=dtype, tensor_core_op=tc)
    nd["compute_s"] = by_type[dev.REFERENCE]
    nd["compute_by_type"] = by_type
    nd["memory_bytes"] = int(mem)
    nd["resident_bytes"] = int(resident)
    nd["pass"] = "update" if v in sm.opt_param else ("backward" if sm.backward_from <= v else "forward")
    if colocation is not None:
        nd["colocation"] = colocation
    split = SPLITTABLE.get(short(nd["op"]))
    if split and batch_dep:
        nd["splittable"] = split
    nd["flops"] = int(flops)
    nd["bytes_moved"] = int(moved)
    nd["output_bytes"] = int(sum(sm.out_bytes[v]))
    fixed = {"memory_bytes": int(mem if not batch_dep else owned + kept),
             "state_bytes": int(owned),
             "bytes_moved": int(moved if not batch_dep else min(moved, read + kept))}
    if readers:
        fixed["state_tensors"] = readers
    if any(fixed.values()):
        nd["batch_independent"] = fixed


def _edges(sm, state_edges, state_bytes) -> list[dict]:
    """Data edges (one per producer output read), then each node's parameter reads from their owners."""
    ids = sm.ids
    edges = []
    for v in range(len(ids)):
        for (u, k) in sm.in_refs[v]:
            edges.append({"src": ids[u], "dst": ids[v],
                          "bytes": int(sm.out_bytes[u][k] if k < len(sm.out_bytes[u]) else 0),
                          "tensor": f"{ids[u]}:{k}"})
        for (u, st) in state_edges[v]:
            edges.append({"src": ids[u], "dst": ids[v], "bytes": int(state_bytes[st]),
                          "tensor": f"{ids[u]}:{sm.state_names[st]}"})
    return edges


def _meta(meta: dict, sm, state_bytes, state_numel) -> dict:
    """The caller's *meta* plus parameter counts, unused state and the cost model used."""
    meta = dict(meta)
    n_params = sm.n_params
    meta["parameters"] = int(sum(state_numel[:n_params]))
    meta["parameter_bytes"] = int(sum(state_bytes[:n_params]))
    unowned = sum(b for s, b in enumerate(state_bytes) if s not in sm.owner)
    if unowned:
        meta["unused_state_bytes"] = int(unowned)
    meta["cost_model"] = (f"roofline on {', '.join(dev.DEVICES)}; compute_s = {dev.REFERENCE} "
                          f"(celeritas_cli.model.devices)")
    if meta.get("precision", "fp32") != "fp32":
        meta["cost_model"] += (f"; {meta['precision']} matmuls and attention at "
                               f"{dev.TENSOR_CORE_EFFICIENCY:.0%} of the tensor-core peak")
    return meta


def profile_model(spec: str, batch: int, *, phase: str = "training", config: dict | None = None,
                  name: str | None = None, optimizer: str = "adam", keep_trace: bool = False,
                  precision: str | None = None):
    """Capture zoo model / ``module:attr`` *spec* at *batch* as a graph document,
    in *precision* (``fp32`` / ``bf16`` / ``fp16``; default: the zoo entry's,
    ``bf16`` for the GPTs, else ``fp32``).

    Returns
    -------
    dict, or ``(dict, Trace)`` with ``keep_trace`` (for :mod:`.measure`).

    Example (not run: needs torch)::

        doc = profile_model("transformer", 256)
    """
    factory, base = resolve_model(spec, config)
    precision = precision or default_precision(spec)
    model = build_meta(factory)
    tr = trace_step(model, batch, phase, precision)
    meta = {"source": f"profile torch:{spec}", "phase": phase, "batch_size": batch, "precision": precision}
    if config:
        meta["config"] = dict(config)
    doc = trace_to_doc(tr, name=name or f"{base}_b{batch}", meta=meta, optimizer=optimizer)
    return (doc, tr) if keep_trace else doc


def default_precision(spec: str) -> str:
    """The precision a zoo model is captured in by default (``fp32`` for other models)."""
    from .zoo import ZOO

    return ZOO[spec].precision if spec in ZOO else "fp32"


def graph_stats(doc: dict, cluster=None) -> dict:
    """Nodes, edges, CCR (Celeritas Eq. 1 on *cluster*, default 4xV100-pcie) and total memory."""
    from ..model.costs import cost_model
    from ..model.graph import Graph
    from ..model.io import load_cluster

    g = Graph.from_dict(doc, doc.get("name", "graph"))
    c = cluster or load_cluster(None)
    return {"nodes": g.n, "edges": g.m, "ccr": cost_model(g, c).ccr(), "memory_bytes": g.total_memory(),
            "compute_s": math.fsum(g.compute)}
