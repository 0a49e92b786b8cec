"""Execute an :class:`~.derived_program.DerivedProgram`: every derived node on its
device in the program's sequence, values between devices through a channel
of :mod:`.executor` (one process) or :mod:`.dist` (one process per device,
torch.distributed point-to-point).

* A micro-batch copy runs its captured aten op on its instance's samples,
  in the trace captured at the instance's batch size; a recompute clone
  runs it again (its readers in the backward read the clone's output).
* Parameters, buffers and Adam's moments live where the ``weights`` node
  (the owner) is, one copy per replica; other devices receive the
  parameters once per step.  The update runs once per parameter and replica
  with ``torch.optim.Adam``'s arithmetic (:func:`~celeritas_cli.profile.optim.adam_update`),
  committed when the step ends.
* Gradient accumulation: ``running + w_i * partial_i`` (:func:`scaled`),
  ``w_i`` the instance's share of the batch; a ring all-reduce runs as the
  derived graph's reduce-scatter / all-gather nodes, chunk by chunk (``k``
  chunks of the flattened gradient, by elements).
* Constants that depend on a random op (a dropout mask) are made once per
  device on the whole batch's shape, replaying the generator state the
  unplaced step saw, and each instance takes its rows: every micro-batch
  draws the mask the unplaced step drew for its samples.  BatchNorm computes
  its statistics over the micro-batch (GPipe, Huang et al. 2019, 2.2).

No deadlock for any valid schedule: every rank follows one global sequence
(:func:`~.plan.merged_sequence`: a topological order of the derived
graph that keeps every device's order, GPipe, 1F1B or interleaved alike),
sends never block, receives are posted in the order senders post them, and
a rank waits only for a value whose producer comes earlier in the
sequence, so by induction on the sequence every wait ends (:mod:`.dist`).
"""

from __future__ import annotations

import operator
import threading
from typing import Any

from .executor import Executor, bind, set_rng_state, stand_in

#: held while a random op replays a generator state (ranks run as threads in the tests share the generator)
RNG_LOCK = threading.Lock()


def scaled(t, w: float):
    """*t* times *w* (the tensor itself for ``w == 1``): the weighting of a
    micro-batch's gradient, shared with :mod:`.reference` so both round alike."""
    return t if w == 1.0 else t * w


def narrow_rows(full, meta, total: int, n: int, row: int):
    """The rows ``row:row+n`` of *full* (made for the whole batch of *total*
    samples) that a value traced as *meta* at *n* samples is: along the one
    dimension where *full* has *total* and *meta* has *n*; *full* itself when
    the shapes agree; ``None`` when neither holds.

    >>> import torch
    >>> narrow_rows(torch.arange(8).view(4, 2), torch.empty(2, 2), 4, 2, 2).tolist()
    [[4, 5], [6, 7]]
    """
    if tuple(full.shape) == tuple(meta.shape):
        return full
    if full.dim() != len(meta.shape):
        return None
    dims = [i for i, (p, q) in enumerate(zip(full.shape, meta.shape)) if p != q]
    if len(dims) == 1 and full.shape[dims[0]] == total and meta.shape[dims[0]] == n:
        return full.narrow(dims[0], row, n)
    return None


class _Ctx:
    """Where an fx node is evaluated: derived node *x* on device *d*, trace
    *view*, instance *inst*, its resolved inputs *res*."""

    __slots__ = ("x", "d", "view", "inst", "res", "memo")

    def __init__(self, x, d, view, inst, res):
        self.x, self.d, self.view, self.inst, self.res = x, d, view, inst, res
        self.memo: dict = {}


class KeyedValues:
    """What the runner (:class:`DerivedRunner`) and the exporter (:class:`~.derived_export._DerivedEmitter`)
    of a derived program share: reading a value by its key on a device (:meth:`get`), and what a
    gradient node computes (:meth:`gradient_values`), each op applied by :meth:`apply` - a torch
    call, or an fx node that the exporter emits.  Subclasses set ``prog``, ``env`` and define
    :meth:`apply` and :meth:`state_value`."""

    #: what :meth:`get` says of a value read before it is there
    missing = "value {key} is read on device {d} before it arrived (order bug)"

    def apply(self, op, *args):
        raise NotImplementedError

    def state_value(self, r: int, s: int, d: int, home: int):
        """Replica *r*'s parameter or buffer *s* on device *d* (*home*: its holder's device, -1 if none)."""
        raise NotImplementedError

    def scaled(self, v, w: float):
        """*v* times *w* (*v* itself for ``w == 1``: :func:`scaled`)."""
        return v if w == 1.0 else self.apply(operator.mul, v, w)

    def get(self, key: tuple, d: int):
        """The value *key* on device *d* (local, or received before)."""
        import torch

        env = self.env[d]
        if key in env:
            return env[key]
        home = self.prog.home(key)
        if key[0] == "chunk" and home == d:
            flat = self.apply(torch.reshape, self.get(key[1], d), (-1,))
            return self.apply(torch.narrow, flat, 0, key[2], key[3] - key[2])
        if key[0] == "s" and home in (d, -1):
            return self.state_value(key[1], key[2], d, home)
        if key[0] == "v" and (key[1], None) in env:     # an output of a multi-output op kept whole
            env[key] = self.apply(operator.getitem, env[(key[1], None)], key[3])
            return env[key]
        raise RuntimeError(self.missing.format(key=key, d=d))

    def gradient_values(self, x: int, d: int) -> dict:
        """The values gradient node *x* (an accumulation or a ring step, on device *d*) makes:
        ``running + w * partial``; a bucket's flattened gradients; a reduce-scatter step's received
        partial sum plus its own chunk; an all-gather step's received chunk; the result's chunks
        concatenated and cut back into the gradients."""
        import torch

        act = self.prog.actions[x]
        get, scaled, apply = (lambda k: self.get(k, d)), self.scaled, self.apply
        if act.kind == "accum":
            return {out: apply(operator.add, scaled(get(prev), pw), scaled(get(part), w))
                    for out, prev, pw, part, w in act.parts}
        spec = act.ring
        if act.kind == "bucket":
            return {("f", x): apply(torch.cat, [apply(torch.reshape, scaled(get(k), w), (-1,))
                                                for k, w in spec["grads"]])}
        if act.kind == "reduce-scatter":
            (rk, rw), (ok, ow) = spec["recv"], spec["own"]
            return {("r", x): apply(operator.add, scaled(get(rk), rw), scaled(get(ok), ow))}
        if act.kind == "all-gather":
            return {("r", x): get(spec["recv"][0])}
        flat = apply(torch.cat, [get(k) for k, _ in sorted(spec["chunks"], key=lambda c: c[1][0])])
        out, at = {}, 0
        for (u, k), shape in zip(spec["keys"], spec["shapes"]):
            n = 1
            for s in shape:
                n *= int(s)
            part = apply(torch.narrow, flat, 0, at, n)
            out[("v", x, u, k)] = apply(torch.reshape, part, tuple(int(s) for s in shape))
            at += n
        return out


class DerivedRunner(KeyedValues, Executor):
    """Runs the derived nodes of devices *mine* of *prog*, one step at a time.

    Parameters
    ----------
    prog : the :class:`~.derived_program.DerivedProgram`.
    torch_devices : cluster device -> torch device (for *mine*).
    mine : cluster devices this process runs.
    channel : :class:`~.executor.LocalChannel` or :class:`~.dist.DistChannel`.
    rng_states : fx node name (whole-batch trace) -> generator state before that random op.
    inputs : instance -> (forward inputs, target), its rows of the global batch.
    adam : Adam hyper-parameters (default :data:`~.executor.ADAM`).
    """

    def __init__(self, prog, torch_devices: dict[int, Any], mine, channel, rng_states: dict, inputs: dict,
                 adam: dict | None = None):
        import torch

        super().__init__(prog, torch_devices, mine, channel, rng_states, adam)
        self.inputs = inputs
        self.whole = prog.views[prog.layout.total]
        initial = self.whole.step.state
        self.state: dict[tuple[int, int], Any] = {}
        for (r, s), h in prog.homes.items():
            if prog.device_of[h] in self.mine:
                self.state[(r, s)] = initial[s].to(self.devs[prog.device_of[h]], copy=True)
        for x in self.seq:
            act = prog.actions[x]
            if act.kind == "update":
                key = (act.inst[0], prog.sm.opt_param[act.v])
                dev = self.devs[prog.device_of[x]]
                self.moments[key] = (torch.zeros_like(initial[key[1]], device=dev),
                                     torch.zeros_like(initial[key[1]], device=dev))
                self.steps_done[key] = 0
        self.consts: dict[tuple, Any] = {}

    # ------------------------------------------------------------ values
    def apply(self, op, *args):
        return op(*args)

    def state_value(self, r: int, s: int, d: int, home: int):
        if home == d:
            return self.state[(r, s)]
        if ((r, s), d) not in self.unowned:
            self.unowned[((r, s), d)] = self.whole.step.state[s].to(self.devs[d], copy=True)
        return self.unowned[((r, s), d)]

    def fx_value(self, a, ctx: _Ctx):
        """The value of fx node *a* (of ``ctx.view``'s trace) for ``ctx``."""
        view = ctx.view
        role = view.role.get(a, ("none",))
        kind = role[0]
        if kind in ("out", "state"):
            if a in ctx.memo:
                return ctx.memo[a]
            key, w = ctx.res[role if kind == "out" else ("state", role[1])]
            val = scaled(self.get(key, ctx.d), w)
            ctx.memo[a] = val
            return val
        if kind in ("derived", "factory"):
            if view.is_const(a):
                return self.const(a, ctx)
            if a not in ctx.memo:
                ctx.memo[a] = self.call(a, ctx)
            return ctx.memo[a]
        if kind == "attr":
            return getattr(view.step.tr.gm, a.target).to(self.devs[ctx.d])
        return None

    def call(self, fxn, ctx: _Ctx, shape_only: bool | None = None):
        """Run fx call *fxn* in *ctx* (a factory op gets stand-ins of its real inputs)."""
        view, dev = ctx.view, self.devs[ctx.d]
        if shape_only is None:
            shape_only = view.role.get(fxn, ("none",))[0] == "factory"

        args, kwargs = bind(fxn, lambda n: self.fx_value(n, ctx), dev, shape_only=shape_only, src=view.sm.src,
                            make=lambda m: stand_in(m, dev))
        if fxn.name in self.rng_states and fxn in view.random:
            with RNG_LOCK:
                set_rng_state(dev, self.rng_states[fxn.name])
                return fxn.target(*args, **kwargs)
        return fxn.target(*args, **kwargs)

    def const(self, a, ctx: _Ctx):
        """A constant of an instance's trace: a random one is the instance's
        rows of the whole batch's (:func:`narrow_rows`), else made here."""
        key = (ctx.d, ctx.inst, ctx.view is self.whole, a.name)
        if key in self.consts:
            return self.consts[key]
        val = None
        if a in ctx.view.random and ctx.inst is not None:
            full_node = self.whole.by_name.get(a.name)
            if full_node is not None and full_node in self.whole.random:
                full = self.const(full_node, _Ctx(None, ctx.d, self.whole, None, {}))
                lay = self.prog.layout
                val = narrow_rows(full, a.meta["val"], lay.total, lay.sizes[ctx.inst], lay.rows[ctx.inst])
        if val is None:
            val = self.call(a, _Ctx(ctx.x, ctx.d, ctx.view, ctx.inst, {}))
        self.consts[key] = val
        return val

    # ------------------------------------------------------------- nodes
    def run_node(self, x: int, d: int) -> None:
        prog = self.prog
        act = prog.actions[x]
        env = self.env[d]
        kind = act.kind
        if kind == "weights":
            return
        if kind in ("input", "op", "update"):
            view = prog.views[act.size]
            ctx = _Ctx(x, d, view, act.inst, act.res)
            if kind == "input":
                nid = view.sm.ids[act.v]
                ins, target = self.inputs[act.inst]
                val = target if nid == "target" else ins[int(nid.split("_")[1])]
                env[("v", x, act.v, 0)] = val.to(self.devs[d], copy=True)
            elif kind == "op":
                out = self.call(view.sm.fx_of[act.v], ctx)
                for k, o in enumerate(out if isinstance(out, (tuple, list)) else [out]):
                    env[("v", x, act.v, k)] = o
            else:
                p = view.sm.opt_param[act.v]
                key = (act.inst[0], p)
                self.update(key, self.state[key], self.fx_value(view.sm.grad_fx[act.v], ctx))
            return
        env.update(self.gradient_values(x, d))      # accumulations and ring steps

    def loss_value(self, inst):
        d, key, x = self.prog.loss_keys[inst]
        view = self.prog.views[self.prog.layout.sizes[inst]]
        role = view.role[view.sm.loss]
        ctx = _Ctx(x, d, view, inst, {role: (key, 1.0)} if role[0] == "out" else {})
        return self.fx_value(view.sm.loss, ctx)

    def send_value(self, t):
        return self.get(t.key, t.src)

    def losses(self) -> dict:
        """The losses of the instances whose loss this process computes (the step's ``"loss"``)."""
        return {inst: self.loss_value(inst).detach() for inst, (d, _, _) in self.prog.loss_keys.items()
                if d in self.mine}

    def end_step(self) -> None:
        self.consts = {}

    def params(self) -> dict[tuple[int, int], Any]:
        """``(replica, parameter) -> value`` of the parameters updated here."""
        return {key: self.state[key] for key in self.moments}
