"""The captured step with real values: the trace ``placer profile`` makes,
plus the model's real initial parameters, buffers, inputs and target.

The graph is captured exactly as :func:`celeritas_cli.profile.capture.profile_model`
captures it (same fx trace, same node ids), then the model is built a second
time for real on the CPU under ``torch.manual_seed(seed)``, so every process
that captures the same model with the same seed holds bit-identical values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput


@dataclass
class RealStep:
    """One training step of a model at a batch size, captured and materialised.

    Attributes
    ----------
    spec, batch, config, seed : what was captured (``--model``, ``--batch-size``, ``--config``, ``--seed``).
    doc : the ``placer.graph/v1`` document ``placer profile`` writes for it.
    tr : the :class:`~celeritas_cli.profile.capture.Trace` (the fx graph).
    sm : the :class:`~celeritas_cli.profile.stepmap.StepMap` (fx node -> graph node).
    state : initial parameters then buffers (CPU tensors), in the trace's order.
    inputs, target : the forward arguments and the loss target (CPU).
    """

    spec: str
    batch: int
    config: dict
    seed: int
    doc: dict
    tr: Any
    sm: Any
    state: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    target: Any = None

    @property
    def n_params(self) -> int:
        return self.sm.n_params


def capture_real(spec: str, batch: int, *, config: dict | None = None, seed: int = 0) -> RealStep:
    """Capture the training step of *spec* at *batch* and materialise its values.

    Parameters
    ----------
    spec : zoo name, ``module:attr`` or ``path/to/file.py:attr``
        (:func:`~celeritas_cli.profile.models.resolve_model`).
    batch : batch size.
    config : constructor arguments of the model.
    seed : seed of the parameter initialisation and of the example inputs.

    Returns
    -------
    RealStep

    Raises
    ------
    InvalidInput
        The model cannot be resolved or traced, or building it for real gives
        other parameters than building it on the meta device.
    """
    from ..profile.capture import profile_model, require_torch
    from ..profile.models import resolve_model
    from ..profile.stepmap import map_trace

    torch = require_torch()
    config = dict(config or {})
    doc, tr = profile_model(spec, batch, config=config, keep_trace=True)
    sm = map_trace(tr)
    factory, _ = resolve_model(spec, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
        model.train(True)
        names = [k for k, _ in model.named_parameters()]
        bnames = [k for k, _ in model.named_buffers()]
        if names != tr.param_names or bnames != tr.buffer_names:
            raise InvalidInput(f"--model {spec}: building the model for real gives other parameters or buffers "
                               f"than building it on the meta device; its constructor must be deterministic")
        inputs, target = _example(model, batch, seed, tr.has_target)
    state = [p.detach().clone() for _, p in model.named_parameters()]
    state += [b.detach().clone() for _, b in model.named_buffers()]
    placeholders = [n for n in tr.gm.graph.nodes if n.op == "placeholder"]
    for ph, val in zip(placeholders, state + inputs):
        fake = ph.meta.get("val")
        if isinstance(val, torch.Tensor) and fake is not None and (tuple(fake.shape) != tuple(val.shape)
                                                                   or fake.dtype != val.dtype):
            raise InvalidInput(f"--model {spec}: {ph.name} is {tuple(val.shape)} {val.dtype} for real but was "
                               f"traced as {tuple(fake.shape)} {fake.dtype}")
    del model
    return RealStep(spec=spec, batch=batch, config=config, seed=seed, doc=doc, tr=tr, sm=sm, state=state,
                    inputs=inputs, target=target)


def _example(model, batch: int, seed: int, with_target: bool):
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        with torch.no_grad():
            inputs = list(model.example_inputs(batch))
            target = model.example_target(batch) if (with_target and hasattr(model, "example_target")) else None
    return inputs, target


def example_batch(spec: str, batch: int, *, config: dict | None = None, seed: int = 0, with_target: bool = True):
    """The forward arguments and target :func:`capture_real` makes for *spec* at *batch*
    (``(inputs, target)``, CPU): the global batch that data-parallel replicas share."""
    from ..profile.capture import build_meta, require_torch
    from ..profile.models import resolve_model

    torch = require_torch()
    factory, _ = resolve_model(spec, dict(config or {}))
    model = build_meta(factory)
    with torch.device("cpu"):
        return _example(model, batch, seed, with_target)


def worker_capture(job: dict, batch: int, step: RealStep | None = None) -> RealStep:
    """A worker process's capture of the parent's model (*job*: ``spec``, ``config``, ``seed``,
    ``ids``) at *batch*, or *step* when the caller has it: the same seed gives bit-identical
    values; a capture with other graph nodes than the parent's is refused.

    Raises
    ------
    InvalidInput
        The worker traced another graph than the parent.
    """
    if step is None:
        step = capture_real(job["spec"], batch, config=job["config"], seed=job["seed"])
    if step.sm.ids != job["ids"]:
        raise InvalidInput("the model captured in a worker process differs from the parent's capture")
    return step
