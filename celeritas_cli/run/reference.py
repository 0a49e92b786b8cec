"""The yardsticks of ``placer run``'s numerics check: unplaced steps.

* **The unplaced step** (:func:`reference_step`): the traced step run whole
  on one device with :class:`torch.fx.Interpreter` (the trace as torch
  executes it: no placement, no view folding, no transfers), then
  ``torch.optim.Adam`` (``foreach=False``) updates a copy of the parameters
  with the gradients it returned.  The generator state just before every
  random op is recorded, so the placed step can replay it (:mod:`.executor`)
  and draw the same dropout masks.
* **Replicated plans** (data parallelism, fsdp; :func:`replica_reference`):
  the unplaced step on every replica's shard, the gradients averaged, then
  Adam.
* **Micro-batched plans** (pipelines, recomputation, hybrids): the unplaced
  step on the whole global batch (:func:`whole_reference`), which also
  keeps the constants made from random ops (the dropout masks), and the
  unplaced micro-batched step (:func:`microbatch_reference`): the traced
  step at each instance's size run whole on one device on the instance's
  rows, its random constants the rows of the whole batch's
  (:func:`~.derived_executor.narrow_rows`), the gradients weighted by the
  instances' shares and summed in the plan's order (micro-batches of a
  replica in order, then the ring all-reduce's order of replicas, chunk by
  chunk), then ``torch.optim.Adam``.  It is what GPipe computes (BatchNorm
  statistics per micro-batch, Huang et al. 2019, 2.2), independently of
  placement, transfers and schedule: a correct placed run equals it bit for
  bit.  Without BatchNorm the two agree up to float summation order: the
  loss is a mean over samples, so ``sum_i (b_i / B) grad_i`` is the whole
  batch's gradient, summed in another order.

One :class:`torch.fx.Interpreter` (:func:`interpret`) runs every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .executor import ADAM, is_random, rng_state, set_rng_state
from .derived_executor import narrow_rows, scaled


@dataclass
class Reference:
    """Loss, updated parameters (CPU) and the recorded generator states."""

    loss: Any
    params: dict[int, Any]
    rng_states: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"


def interpret(step, device, inputs, target, *, seed: int, record: set = frozenset(), override: dict | None = None,
              rng: dict | None = None, random_nodes: set | None = None):
    """Run *step*'s trace on *device* (one :class:`torch.fx.Interpreter`):
    ``(outputs, rng states before every random op, recorded values)``.

    *record*: fx node names whose values to keep; *override*: name -> value
    replacing a node's result; *rng*: name -> generator state set before
    that node (when *random_nodes* holds it)."""
    import torch

    dev = torch.device(device)
    states: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    override = override or {}

    class Interp(torch.fx.Interpreter):
        def run_node(self, n):
            if n.name in override:
                out = override[n.name]
            else:
                if n.op == "call_function" and is_random(n):
                    states[n.name] = rng_state(dev).clone()
                    if rng and n.name in rng and n in (random_nodes or ()):
                        set_rng_state(dev, rng[n.name])
                out = super().run_node(n)
            if n.name in record:
                kept[n.name] = out
            return out

        def call_function(self, target, args, kwargs):
            if "device" in kwargs:
                kwargs = dict(kwargs, device=dev)
            return super().call_function(target, args, kwargs)

        def get_attr(self, target, args, kwargs):
            return super().get_attr(target, args, kwargs).to(dev)

    n_params = step.n_params
    state = [t.to(dev, copy=True) for t in step.state]
    ins = [t.to(dev) for t in inputs]
    tgt = target.to(dev) if target is not None else None
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        out = Interp(step.tr.gm).run(state[:n_params], state[n_params:], ins, tgt)
    return out, states, kept


def reference_grads(step, device: str = "cpu", *, seed: int = 0, inputs=None, target=None):
    """The traced step of *step* run whole on *device* (optionally on other
    *inputs* / *target*): ``(loss, {parameter index: gradient}, rng_states)``,
    the generator state before every random op by fx node name."""
    inputs = step.inputs if inputs is None else inputs
    target = step.target if target is None else target
    out, states, _ = interpret(step, device, inputs, target, seed=seed)
    grads = {p: g.detach() for p, g in zip(step.tr.grad_of, out[1:]) if g is not None}
    return out[0].detach(), grads, states


def adam_reference(step, grads: dict, adam: dict | None = None) -> dict:
    """``torch.optim.Adam`` (``foreach=False``) applied to copies of *step*'s
    initial parameters with *grads*: ``{parameter index: updated value}`` (CPU)."""
    import torch

    hyper = dict(ADAM, **(adam or {}))
    tensors = []
    for p, g in grads.items():
        t = step.state[p].detach().to(g.device, copy=True)
        t.grad = g.clone()
        tensors.append(t)
    if tensors:
        torch.optim.Adam(tensors, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"], foreach=False).step()
    return {p: t.detach().cpu() for p, t in zip(grads, tensors)}


def reference_step(step, device: str = "cpu", *, seed: int = 0, adam: dict | None = None) -> Reference:
    """Run the unplaced training step of *step* (a :class:`~celeritas_cli.run.step.RealStep`) on *device*.

    Parameters
    ----------
    step : the captured step with its initial values.
    device : torch device to run on.
    seed : generator seed set before the step (random ops draw from it).
    adam : Adam hyper-parameters (default :data:`.executor.ADAM`).

    Returns
    -------
    Reference
        ``params`` maps each parameter index with a gradient to its value
        after the update.
    """
    loss, grads, states = reference_grads(step, device, seed=seed)
    return Reference(loss=loss.cpu(), params=adam_reference(step, grads, adam), rng_states=states,
                     device=str(device))


def replica_reference(pre, threads: int, say):
    """The yardstick of replicated plans (module docstring) of *pre* (a
    :class:`~.data_parallel.DPPrepared`): the unplaced step on every shard at
    *threads* torch threads, the gradients averaged, then Adam;
    ``(Reference, generator states per shard)``."""
    from .executor import torch_threads

    ref_dev = pre.tdev[pre.devices[0]]
    say(f"running the unplaced step on each of the {pre.k} shards of {pre.replica_batch} on {ref_dev}")
    losses, grads, states = [], {}, []
    with torch_threads(threads):            # the replicas' threads: same kernels, same rounding
        for inputs, target in pre.shards:
            loss, g, st = reference_grads(pre.step, ref_dev, seed=pre.step.seed, inputs=inputs, target=target)
            losses.append(loss)
            states.append(st)
            for p, t in g.items():
                grads[p] = t if p not in grads else grads[p] + t
    ref = Reference(loss=(sum(losses[1:], losses[0]) / pre.k).cpu(),
                    params=adam_reference(pre.step, {p: t / pre.k for p, t in grads.items()}, ADAM),
                    rng_states={}, device=ref_dev)
    return ref, states


def has_batchnorm(step) -> bool:
    """True when the traced step has a batch-normalisation op (statistics over the batch)."""
    return any("batch_norm" in op for op in step.sm.ops)


def whole_reference(prog, device: str = "cpu", *, seed: int = 0):
    """The unplaced step on the global batch: ``(Reference, random constants by name)``."""
    whole = prog.views[prog.layout.total]
    step = whole.step
    names = {n.name for n in whole.random}
    out, states, kept = interpret(step, device, step.inputs, step.target, seed=seed, record=names)
    grads = {p: g.detach() for p, g in zip(step.tr.grad_of, out[1:]) if g is not None}
    ref = Reference(loss=out[0].detach().cpu(), params=adam_reference(step, grads), rng_states=states,
                    device=str(device))
    return ref, kept


def microbatch_reference(prog, inputs: dict, random_values: dict, rng_states: dict, device: str = "cpu", *,
                         seed: int = 0, adam: dict | None = None) -> Reference:
    """The unplaced micro-batched step (module docstring) of the plan *prog*
    (an :class:`~.derived_program.DerivedProgram`) on the instances' rows *inputs*."""
    import torch

    from .derived_program import chunk_ranges

    lay = prog.layout
    sm = prog.sm
    grad_keys: dict[int, list] = {}                 # update node -> its base gradient key (u, k)
    whole = prog.views[lay.total]
    for w in sm.opt_param:
        for key in whole.base_keys(w):
            if key[0] == "out":
                grad_keys[w] = (key[1], key[2])
    producers = {u for u, _ in grad_keys.values()}
    acc: dict[int, dict] = {}                       # replica -> (u, k) -> weighted running sum
    loss = 0.0
    for inst in sorted(lay.sizes, key=lambda x: (x[0], x[1])):
        view = prog.views[lay.sizes[inst]]
        step = view.step
        override = {}
        for a in view.random:
            full = random_values.get(a.name)
            if full is not None:
                rows = narrow_rows(full.to(device), a.meta["val"], lay.total, lay.sizes[inst], lay.rows[inst])
                if rows is not None:
                    override[a.name] = rows
        record = {step.sm.fx_of[u].name for u in producers}
        ins, target = inputs[inst]
        out, _, kept = interpret(step, device, ins, target, seed=seed, record=record, override=override,
                                  rng=rng_states, random_nodes=view.random)
        w = lay.weight(inst)
        loss += w * float(out[0])
        mine = acc.setdefault(inst[0], {})
        for u, k in dict.fromkeys(grad_keys.values()):
            val = kept[step.sm.fx_of[u].name]
            g = scaled(val[k] if isinstance(val, (tuple, list)) else val, w)
            mine[(u, k)] = g if (u, k) not in mine else mine[(u, k)] + g
    reduced = dict(acc[0])
    if lay.k > 1:
        for keys in _ring_groups(prog):
            parts = [torch.cat([acc[r][key].reshape(-1) for key in keys]) for r in range(lay.k)]
            flat = torch.empty_like(parts[0])
            for c, (a, b) in enumerate(chunk_ranges(flat.numel(), lay.k)):
                s = parts[c][a:b]
                for j in range(1, lay.k):
                    s = s + parts[(c + j) % lay.k][a:b]
                flat[a:b] = s
            at = 0
            for key in keys:
                n = acc[0][key].numel()
                reduced[key] = flat[at:at + n].view(acc[0][key].shape)
                at += n
    grads = {sm.opt_param[w]: _through_views(whole, sm.grad_fx[w], reduced) for w in sm.opt_param}
    return Reference(loss=torch.tensor(loss), params=adam_reference(whole.step, grads, adam), device=str(device))


def _ring_groups(prog) -> list[list[tuple[int, int]]]:
    """The gradients each ring all-reduce of the plan reduces together (bucket order)."""
    out = []
    for x, act in prog.actions.items():
        if act.kind == "result" and prog.infos[x].r == 0:
            out.append(list(act.ring["keys"]))
    return sorted(out)


def _through_views(view, a, base: dict):
    """Value of fx node *a* (a gradient, or a view of one) from the base gradients *base*."""
    from torch.fx.node import map_arg

    role = view.role[a]
    if role[0] == "out":
        return base[(role[1], role[2])]
    return a.target(*map_arg(a.args, lambda n: _through_views(view, n, base)),
                    **map_arg(a.kwargs, lambda n: _through_views(view, n, base)))
