"""The unplaced step, the yardstick of ``placer run``'s numerics check.

The traced step runs whole on one device with :class:`torch.fx.Interpreter`
(the trace as torch executes it: no placement, no view folding, no
transfers), then ``torch.optim.Adam`` (``foreach=False``) updates a copy of
the parameters with the gradients it returned.  The generator state just
before every random op is recorded, so the placed step can replay it
(:mod:`.executor`) and draw the same dropout masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .executor import ADAM, is_random, rng_state


@dataclass
class Reference:
    """Loss, updated parameters (CPU) and the recorded generator states."""

    loss: Any
    params: dict[int, Any]
    rng_states: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"


def reference_grads(step, device: str = "cpu", *, seed: int = 0, inputs=None, target=None):
    """The traced step of *step* run whole on *device* (optionally on other
    *inputs* / *target*): ``(loss, {parameter index: gradient}, rng_states)``,
    the generator state before every random op by fx node name."""
    import torch

    dev = torch.device(device)
    states: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op == "call_function" and is_random(n):
                states[n.name] = rng_state(dev).clone()
            return super().run_node(n)

        def call_function(self, target, args, kwargs):
            if "device" in kwargs:
                kwargs = dict(kwargs, device=dev)
            return super().call_function(target, args, kwargs)

        def get_attr(self, target, args, kwargs):
            return super().get_attr(target, args, kwargs).to(dev)

    n_params = step.n_params
    state = [t.to(dev, copy=True) for t in step.state]
    params, buffers = state[:n_params], state[n_params:]
    inputs = [t.to(dev) for t in (step.inputs if inputs is None else inputs)]
    target = step.target if target is None else target
    target = target.to(dev) if target is not None else None
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        out = Recorder(step.tr.gm).run(params, buffers, inputs, target)
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
