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
    import torch

    dev = torch.device(device)
    hyper = dict(ADAM, **(adam or {}))
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
    inputs = [t.to(dev) for t in step.inputs]
    target = step.target.to(dev) if step.target is not None else None
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        out = Recorder(step.tr.gm).run(params, buffers, inputs, target)
    loss, grads = out[0], out[1:]
    updated = {}
    live = [(p, g) for p, g in zip(step.tr.grad_of, grads) if g is not None]
    tensors = []
    for p, g in live:
        t = params[p].detach().clone()
        t.grad = g.detach().clone()
        tensors.append(t)
    if tensors:
        opt = torch.optim.Adam(tensors, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"], foreach=False)
        opt.step()
    for (p, _), t in zip(live, tensors):
        updated[p] = t.detach().cpu()
    return Reference(loss=loss.detach().cpu(), params=updated, rng_states=states, device=str(dev))
