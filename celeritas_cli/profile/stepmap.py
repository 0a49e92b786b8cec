"""How a traced step maps onto graph nodes: the classification pass shared by
the graph document (:func:`.capture.trace_to_doc`) and ``placer run``.

Every fx node of the trace gets a *source* (:class:`StepMap`, ``src``):

- ``("node", v, k)``: output ``k`` of graph node ``v`` (a graph node itself,
  the ``getitem`` picking one of its outputs, or a view of either);
- ``("state", s)``: parameter / buffer ``s`` (or a view of it);
- ``("const",)``: constants made where they are used (factory ops, ops on
  constants only such as a causal mask or a dropout mask, get_attr tensors),
  and bookkeeping ops on state whose result nobody reads.

The rules are those of the :mod:`.capture` docstring (points 2 to 4); they
live here once, so that ``placer run`` executes exactly the nodes, tensors and
transfers the graph file describes.  Imports torch only inside
:func:`map_trace`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from .flops import short

#: aten ops folded into their producer (their output aliases an input).
VIEW_OPS = frozenset("""
view _unsafe_view reshape transpose t permute expand expand_as unsqueeze squeeze getitem detach alias
split split_with_sizes unbind chunk select slice narrow as_strided flatten unflatten movedim swapaxes
_reshape_alias view_as lift_fresh lift_fresh_copy contiguous unsafe_split unsafe_chunk diagonal
""".split())
#: ops that only need their inputs' shapes: constants, made where consumed.
FACTORY_OPS = frozenset("""
zeros ones full empty empty_like zeros_like ones_like full_like new_zeros new_ones new_empty new_full arange
scalar_tensor empty_strided rand randn randint rand_like randn_like tensor _tensor_constant linspace eye
""".split())


@dataclass
class StepMap:
    """The graph nodes of a trace and where every fx value comes from.

    Attributes
    ----------
    ids, ops : graph node ids and op names, in graph order.
    fx_of : graph index -> its fx node (``None`` for optimizer updates).
    src : fx node -> ``("node", v, k)`` | ``("state", s)`` | ``("const",)``.
    in_refs : graph index -> the ``(producer, output)`` pairs it reads.
    state_refs : graph index -> the state indices it reads.
    out_bytes : graph index -> bytes of each output.
    opt_param : optimizer node -> the parameter (state index) it updates.
    grad_fx : optimizer node -> the fx node of that parameter's gradient.
    owner : state index -> its owner, the first graph node reading it.
    state_names : parameter names, then buffer names.
    n_params : number of parameters (the first ``n_params`` states).
    loss : fx node of the loss (training), else ``None``.
    backward_from : graph index of the first backward node.
    """

    ids: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    fx_of: list[Any] = field(default_factory=list)
    src: dict[Any, tuple] = field(default_factory=dict)
    in_refs: list[list[tuple[int, int]]] = field(default_factory=list)
    state_refs: list[list[int]] = field(default_factory=list)
    out_bytes: list[list[int]] = field(default_factory=list)
    opt_param: dict[int, int] = field(default_factory=dict)
    grad_fx: dict[int, Any] = field(default_factory=dict)
    owner: dict[int, int] = field(default_factory=dict)
    state_names: list[str] = field(default_factory=list)
    n_params: int = 0
    loss: Any = None
    backward_from: int = 0

    def add(self, nid: str, op: str, fx, outs: list[int]) -> int:
        self.ids.append(nid)
        self.ops.append(op)
        self.fx_of.append(fx)
        self.in_refs.append([])
        self.state_refs.append([])
        self.out_bytes.append(outs)
        return len(self.ids) - 1


def nbytes(val) -> int:
    """Bytes of a tensor value (0 for anything else)."""
    try:
        return int(val.numel()) * int(val.element_size())
    except (AttributeError, RuntimeError, TypeError):
        return 0


def outputs(val) -> list:
    """Flat list of a node value's outputs (tensor or None), in index order."""
    if isinstance(val, (tuple, list)):
        return list(val)
    return [val]


def flat(x) -> list:
    """Leaves of nested lists / tuples / dicts, in order."""
    out: list = []
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        else:
            out.append(item)
    return out


def op_name(node) -> str:
    """``aten.convolution`` for an fx call of ``aten.convolution.default``."""
    tgt = node.target
    if tgt is operator.getitem:
        return "getitem"
    packet = getattr(tgt, "overloadpacket", None)
    if packet is not None:
        return f"aten.{packet.__name__}" if getattr(tgt, "namespace", "aten") == "aten" else str(packet)
    return getattr(tgt, "__name__", str(tgt))


def map_trace(tr, optimizer: str = "adam") -> StepMap:
    """Classify every fx node of trace *tr* (a :class:`.capture.Trace`).

    Parameters
    ----------
    tr : the trace.
    optimizer : ``adam`` or ``sgd`` (names the update nodes ``adam.<param>`` / ``sgd.<param>``).

    Returns
    -------
    StepMap

    Raises
    ------
    InvalidInput
        The trace's inputs do not match the model's parameters, buffers and forward arguments.
    """
    import torch

    sm = StepMap(state_names=tr.param_names + tr.buffer_names, n_params=len(tr.param_names))
    _map_placeholders(tr, sm)
    output_node = None
    for fxn in tr.gm.graph.nodes:
        if fxn.op == "output":
            output_node = fxn
        elif fxn.op == "call_function":
            _map_call(fxn, sm, torch.fx.Node, torch.Tensor)
    sm.backward_from = len(sm.ids)
    if output_node is not None and tr.grad_of:
        _add_updates(sm, tr.grad_of, flat(output_node.args), optimizer, torch.fx.Node)
    elif output_node is not None:
        outs = flat(output_node.args)
        sm.loss = outs[0] if outs and isinstance(outs[0], torch.fx.Node) else None
    # ---- parameter ownership (capture docstring, point 4): the first reader owns a state
    for v, refs in enumerate(sm.state_refs):
        for st in refs:
            sm.owner.setdefault(st, v)
    return sm


def _map_placeholders(tr, sm: StepMap) -> None:
    """Sources of the trace's inputs: parameters and buffers are state, model inputs and the
    target are graph nodes (``input_<k>``, ``target``), an absent target (inference) is a constant."""
    n_state = len(sm.state_names)
    placeholders = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    expected = n_state + tr.n_inputs + 1          # the target (None in inference) is last
    if len(placeholders) != expected:
        raise InvalidInput(f"trace has {len(placeholders)} inputs, expected {expected}; the model's forward "
                           f"arguments must be tensors")
    for k, ph in enumerate(placeholders):
        if k < n_state:
            sm.src[ph] = ("state", k)
            continue
        j = k - n_state
        if j >= tr.n_inputs and not tr.has_target:
            sm.src[ph] = ("const",)
            continue
        nid = f"input_{j}" if j < tr.n_inputs else "target"
        sm.src[ph] = ("node", sm.add(nid, "placeholder", ph, [nbytes(ph.meta.get("val"))]), 0)


def _map_call(fxn, sm: StepMap, node_type, tensor_type) -> None:
    """Classify one ``call_function`` fx node: a view of its first input, a constant, or a new graph node
    reading the nodes and states its tensor arguments come from."""
    src = sm.src
    op = op_name(fxn)
    base = short(op) if op != "getitem" else "getitem"
    tensor_args = [a for a in flat((fxn.args, fxn.kwargs)) if isinstance(a, node_type)]
    if base in VIEW_OPS:
        src[fxn] = _view_source(fxn, base, tensor_args, sm)
        return
    srcs = [src.get(a, ("const",)) for a in tensor_args]
    if base in FACTORY_OPS or all(s[0] == "const" for s in srcs):
        # constants, and ops computed from constants only (a causal mask), are made where used
        src[fxn] = ("const",)
        return
    if not fxn.users and not any(s[0] == "node" for s in srcs):
        # bookkeeping on state alone whose result nobody reads (BatchNorm's num_batches_tracked += 1)
        src[fxn] = ("const",)
        return
    outs = [nbytes(o) if isinstance(o, tensor_type) else 0 for o in outputs(fxn.meta.get("val"))]
    v = sm.add(fxn.name, op, fxn, outs)
    for s in srcs:
        if s[0] == "node" and s[1] != v and (s[1], s[2]) not in sm.in_refs[v]:
            sm.in_refs[v].append((s[1], s[2]))
        elif s[0] == "state" and s[1] not in sm.state_refs[v]:
            sm.state_refs[v].append(s[1])
    src[fxn] = ("node", v, 0)


def _view_source(fxn, base: str, tensor_args: list, sm: StepMap) -> tuple:
    """Source of a view: its first input's, or output ``k`` of a graph node for ``getitem(node, k)``."""
    first = tensor_args[0] if tensor_args else None
    s = sm.src.get(first, ("const",)) if first is not None else ("const",)
    if base == "getitem" and s[0] == "node" and isinstance(fxn.args[1], int):
        producer = sm.fx_of[s[1]]
        producer_val = producer.meta.get("val") if producer is not None else None
        if isinstance(producer_val, (tuple, list)) and first is producer:
            s = ("node", s[1], fxn.args[1])
    return s


def _add_updates(sm: StepMap, grad_of: list[int], outs: list, optimizer: str, node_type) -> None:
    """Training: the loss, where the backward pass starts, and one optimizer node per parameter with a
    gradient (*outs* = the step's outputs: the loss, then the gradients of the parameters *grad_of*)."""
    sm.loss = outs[0]
    loss_src = sm.src.get(outs[0], ("const",))
    if loss_src[0] == "node":
        sm.backward_from = loss_src[1] + 1
    kind = "adam" if optimizer == "adam" else "sgd"
    for p, g in zip(grad_of, outs[1:]):
        if not isinstance(g, node_type):
            continue
        gs = sm.src.get(g, ("const",))
        v = sm.add(f"{kind}.{sm.state_names[p]}", f"optim.{kind}", None, [])
        if gs[0] == "node":
            sm.in_refs[v].append((gs[1], gs[2]))
        sm.state_refs[v].append(p)
        sm.opt_param[v] = p
        sm.grad_fx[v] = g
