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
6. Costs: FLOPs from ``torch.utils.flop_counter.flop_registry`` or
   :mod:`.flops`, bytes moved = inputs + outputs, then the roofline of
   :mod:`.devices` for every device type (``compute_by_type``);
   ``compute_s`` is the V100 time.  Extra node fields ``flops``,
   ``bytes_moved`` and ``output_bytes`` keep the raw numbers.
7. What does not scale with the batch (for the split cost model,
   :mod:`celeritas_cli.scheduling.split_cost`): node field
   ``batch_independent`` = ``memory_bytes`` (owned parameters/buffers,
   kept gradients, optimizer state; all of a node not reached from a model
   input), ``state_bytes`` (owned parameters/buffers), ``bytes_moved``
   (parameter reads and gradient writes) and ``state_tensors`` (the tensors
   carrying the node's parameters to later readers).  ``splittable``
   (convolution: batch and channel; its backward and matmuls: batch) is
   only set on nodes reached from a model input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidInput, MissingDependency
from ..model.graph import GRAPH_SCHEMA
from . import devices as dev
from .flops import formula_flops, is_tensor_core_op, short
from .models import resolve_model
from .stepmap import FACTORY_OPS, VIEW_OPS, flat, map_trace, nbytes, outputs  # noqa: F401 (re-exported)

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


def trace_step(model, batch: int, phase: str = "training") -> Trace:
    """Trace one step of *model* at *batch* with make_fx on fake tensors.

    Parameters
    ----------
    model : an ``nn.Module`` built on the meta device (:func:`build_meta`).
    batch : batch size (>= 1; use >= 2 for the Standard Evaluation).
    phase : ``training`` (forward, loss, backward; optimizer added later) or ``inference``.
    """
    torch = require_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    if phase not in ("training", "inference"):
        raise InvalidInput(f"--phase must be training or inference, got {phase!r}")
    if batch < 1:
        raise InvalidInput(f"--batch-size must be >= 1, got {batch}")
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
        if not training:
            with torch.no_grad():
                return torch.func.functional_call(model, state, tuple(inputs))
        out = torch.func.functional_call(model, state, tuple(inputs))
        if hasattr(model, "loss"):
            loss = model.loss(out, target)
        else:
            loss = (out if torch.is_tensor(out) else out[0]).float().mean()
        grads = torch.autograd.grad(loss, [params[i] for i in trainable], allow_unused=True)
        return [loss] + [g for g in grads]

    with mode:
        try:
            gm = make_fx(step, tracing_mode="real", record_module_stack=True)(params, buffers, list(inputs), target)
        except (RuntimeError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidInput(f"tracing {type(model).__name__} at batch {batch} failed: {first}") from None
    return Trace(gm=gm, param_names=[k for k, _ in named_params], buffer_names=[k for k, _ in named_buffers],
                 n_inputs=len(inputs), has_target=target is not None, grad_of=trainable)


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
    import torch

    sm = map_trace(tr, optimizer)
    n_params, n_buffers = len(tr.param_names), len(tr.buffer_names)
    state_names = sm.state_names
    nodes = [{"id": nid, "op": op} for nid, op in zip(sm.ids, sm.ops)]
    fx_of, in_refs, state_refs, out_bytes = sm.fx_of, sm.in_refs, sm.state_refs, sm.out_bytes
    opt_nodes, owner, backward_from = sm.opt_param, sm.owner, sm.backward_from
    placeholders = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]

    # ---- colocation of each owner with its parameters' updates (module docstring, point 4)
    state_bytes = [0] * (n_params + n_buffers)
    state_numel = [0] * (n_params + n_buffers)
    for k, ph in enumerate(placeholders[:n_params + n_buffers]):
        state_bytes[k] = nbytes(ph.meta.get("val"))
        state_numel[k] = int(ph.meta["val"].numel()) if _is_tensor(ph.meta.get("val")) else 0
    group_of: dict[int, str] = {}            # owner node -> group name (its first owned state)
    for st in sorted(owner, key=lambda x: (owner[x], x)):
        group_of.setdefault(owner[st], "param:" + state_names[st])
    colocation: dict[int, str] = dict(group_of)
    for v, p in opt_nodes.items():
        colocation[v] = group_of[owner[p]]
    state_edges: list[list[tuple[int, int]]] = [[] for _ in nodes]   # v -> [(owner, state)]
    for v, refs in enumerate(state_refs):
        if v in opt_nodes:
            continue
        for st in refs:
            u = owner[st]
            if u != v and (u, st) not in state_edges[v]:
                state_edges[v].append((u, st))

    total_state_unowned = 0
    for s in range(n_params + n_buffers):
        if s not in owner:
            total_state_unowned += state_bytes[s]

    # ---- node fields
    kept_grad: dict[int, set[int]] = {}
    for v in opt_nodes:
        for (u, k) in in_refs[v]:
            kept_grad.setdefault(u, set()).add(k)
    # batch-dependent nodes: reached from a model input (state and constants do not depend on the batch)
    batch_dep = [False] * len(nodes)
    for v in range(len(nodes)):
        if v in opt_nodes:
            continue
        batch_dep[v] = fx_of[v] is not None and fx_of[v].op == "placeholder" or any(
            batch_dep[u] for (u, _) in in_refs[v])
    state_readers: dict[int, list[str]] = {}
    for v in range(len(nodes)):
        for (u, st) in state_edges[v]:
            tname = f"{nodes[u]['id']}:{state_names[st]}"
            if tname not in state_readers.setdefault(u, []):
                state_readers[u].append(tname)
    for v, nd in enumerate(nodes):
        fxn = fx_of[v]
        grads_kept = sum(out_bytes[v][k] for k in sorted(kept_grad.get(v, ())))
        if backward_from <= v and v not in opt_nodes:
            # backward outputs are transient, except parameter gradients (kept until the update)
            mem = grads_kept
        else:
            mem = sum(out_bytes[v])
        owned = sum(state_bytes[s] for s in state_refs[v] if owner.get(s) == v)
        read = sum(state_bytes[s] for s in state_refs[v])  # own and others' parameters this node reads
        mem += owned
        if v in opt_nodes:
            p = opt_nodes[v]
            moments = 2 if optimizer == "adam" else 0
            mem += moments * state_bytes[p]
            flops = (12 if optimizer == "adam" else 2) * state_numel[p]
            moved = (7 if optimizer == "adam" else 3) * state_bytes[p]
            dtype, tc = "float32", False
        elif fxn.op == "placeholder":
            flops, moved, dtype, tc = 0, 0, "float32", False
        else:
            flops = _flops(fxn, nd["op"])
            ins = [a.meta.get("val") for a in dict.fromkeys(
                x for x in flat((fxn.args, fxn.kwargs)) if isinstance(x, torch.fx.Node))]
            moved = sum(nbytes(a) for a in ins if _is_tensor(a)) + sum(out_bytes[v])
            dtype = _dtype_name(ins + outputs(fxn.meta.get("val")))
            tc = is_tensor_core_op(nd["op"])
        by_type = dev.times_by_type(flops, moved, dtype=dtype, tensor_core_op=tc)
        nd["compute_s"] = by_type[dev.REFERENCE]
        nd["compute_by_type"] = by_type
        nd["memory_bytes"] = int(mem)
        if v in colocation:
            nd["colocation"] = colocation[v]
        split = SPLITTABLE.get(short(nd["op"]))
        if split and batch_dep[v]:
            nd["splittable"] = split
        nd["flops"] = int(flops)
        nd["bytes_moved"] = int(moved)
        nd["output_bytes"] = int(sum(out_bytes[v]))
        fixed = {"memory_bytes": int(mem if not batch_dep[v] else owned + grads_kept),
                 "state_bytes": int(owned),
                 "bytes_moved": int(moved if not batch_dep[v] else min(moved, read + grads_kept))}
        if state_readers.get(v):
            fixed["state_tensors"] = state_readers[v]
        if any(fixed.values()):
            nd["batch_independent"] = fixed

    edges = []
    for v in range(len(nodes)):
        for (u, k) in in_refs[v]:
            edges.append({"src": nodes[u]["id"], "dst": nodes[v]["id"],
                          "bytes": int(out_bytes[u][k] if k < len(out_bytes[u]) else 0),
                          "tensor": f"{nodes[u]['id']}:{k}"})
        for (u, st) in state_edges[v]:
            edges.append({"src": nodes[u]["id"], "dst": nodes[v]["id"], "bytes": int(state_bytes[st]),
                          "tensor": f"{nodes[u]['id']}:{state_names[st]}"})
    meta = dict(meta)
    meta["parameters"] = int(sum(state_numel[:n_params]))
    meta["parameter_bytes"] = int(sum(state_bytes[:n_params]))
    if total_state_unowned:
        meta["unused_state_bytes"] = int(total_state_unowned)
    meta["cost_model"] = (f"roofline on {', '.join(dev.DEVICES)}; compute_s = {dev.REFERENCE} "
                          f"(celeritas_cli.profile.devices)")
    return {"schema": GRAPH_SCHEMA, "name": name, "meta": meta, "nodes": nodes, "edges": edges}


def profile_model(spec: str, batch: int, *, phase: str = "training", config: dict | None = None,
                  name: str | None = None, optimizer: str = "adam", keep_trace: bool = False):
    """Capture zoo model / ``module:attr`` *spec* at *batch* as a graph document.

    Returns
    -------
    dict, or ``(dict, Trace)`` with ``keep_trace`` (for :mod:`.measure`).

    Example (not run: needs torch)::

        doc = profile_model("transformer", 256)
    """
    factory, base = resolve_model(spec, config)
    model = build_meta(factory)
    tr = trace_step(model, batch, phase)
    meta = {"source": f"profile torch:{spec}", "phase": phase, "batch_size": batch}
    if config:
        meta["config"] = dict(config)
    doc = trace_to_doc(tr, name=name or f"{base}_b{batch}", meta=meta, optimizer=optimizer)
    return (doc, tr) if keep_trace else doc


def graph_stats(doc: dict, cluster=None) -> dict:
    """Nodes, edges, CCR (Celeritas Eq. 1 on *cluster*, default 4xV100-pcie) and total memory."""
    from ..model.costs import cost_model
    from ..model.graph import Graph
    from ..model.io import load_cluster

    g = Graph.from_dict(doc, doc.get("name", "graph"))
    c = cluster or load_cluster(None)
    return {"nodes": g.n, "edges": g.m, "ccr": cost_model(g, c).ccr(), "memory_bytes": g.total_memory(),
            "compute_s": math.fsum(g.compute)}
