"""Model FLOPs utilisation (MFU) of a simulated step.

MFU is the measure large-model training reports its efficiency in
(PaLM, Chowdhery et al. 2022, Appendix B; Megatron-LM, Narayanan et al.
2021 section 5.1 and Korthikanti et al. 2022 section 6, who count the same
quantity as "model FLOPs"): the FLOPs the *model* needs for one step,
divided by the step time and by the peak FLOP/s of the devices it ran on::

    MFU = model FLOPs / (makespan x sum over devices of peak(precision))

* **Model FLOPs** are the ``flops`` recorded on the nodes of the graph the
  user gave (``placer profile`` writes them: matmuls, attention, pointwise
  ops, the optimizer update), counted on that graph, not on the graph a
  plan runs: a data-parallel replica, a split part, a micro-batch copy or a
  recomputed forward does not add model FLOPs (recomputation raises the
  *hardware* FLOPs, not the model's), and all-reduce steps have none.
* **Peak** is the datasheet rate of each device's type at the graph's
  ``meta.precision`` (:meth:`celeritas_cli.model.devices.DeviceSpec.precision_peak`:
  the tensor-core bf16 / fp16 peak, fp32 for fp32 graphs or absent
  ``precision``), not the derated rate the roofline charges: MFU is
  reported against the peak, as the papers do.

MFU is ``None`` when a node of the graph records no ``flops`` (coarse
graphs, converted files, the synthetic generator), when a device type is
not in the device table (no datasheet peak), or when the makespan is 0.

Example
-------
>>> from celeritas_cli.model.graph import build
>>> from celeritas_cli.model.cluster import uniform
>>> g = build("g", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0, "flops": 19.5e12}], [])
>>> mfu(g, uniform(2, dtype="A100"), 2.0)      # 19.5 TFLOP in 2 s on 2 x 19.5 TFLOP/s (fp32)
0.25
"""

from __future__ import annotations

import math

from ..model.cluster import Cluster
from ..model.devices import DEVICES
from ..model.graph import Graph


def model_flops(graph: Graph) -> float | None:
    """The sum of the nodes' ``flops``, or ``None`` when a node records none.

    >>> from celeritas_cli.model.graph import build
    >>> model_flops(build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "flops": 6},
    ...                         {"id": "b", "compute_s": 1, "memory_bytes": 0, "flops": 4}], []))
    10.0
    """
    extra = graph.node_extra
    if graph.n == 0 or not extra:
        return None
    values = [(ex or {}).get("flops") for ex in extra]
    if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f >= 0
               for f in values):
        return None
    return math.fsum(values)


def peak_flops(graph: Graph, cluster: Cluster) -> float | None:
    """Sum of the devices' datasheet peaks at the graph's ``meta.precision`` (``None``: a device type
    without a datasheet entry)."""
    precision = (graph.meta or {}).get("precision", "fp32")
    if any(d.type not in DEVICES for d in cluster.devices):
        return None
    return math.fsum(DEVICES[d.type].precision_peak(precision) for d in cluster.devices)


def mfu(graph: Graph, cluster: Cluster, makespan_s: float) -> float | None:
    """Model FLOPs utilisation of a step of *graph* (the graph given, module docstring) that took
    *makespan_s* on *cluster*."""
    flops = model_flops(graph)
    peak = peak_flops(graph, cluster)
    if flops is None or peak is None or not makespan_s > 0 or not math.isfinite(makespan_s):
        return None
    return flops / (makespan_s * peak)
