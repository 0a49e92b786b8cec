"""``placer run`` and ``placer export``: from a placement to PyTorch.

The training step ``placer profile`` captures is captured again with real
parameters (:mod:`.step`), the placement is applied to it (:mod:`.program`:
device of every value, execution order, transfers), and it is

- executed (:mod:`.executor`): in one process with explicit copies between
  devices (``local``), or one process per device with torch.distributed
  point-to-point sends (:mod:`.dist`, ``gloo``; NCCL on GPUs);
- checked against the unplaced step (:mod:`.reference`) and compared with
  the simulator (:mod:`.report`, the ``placer.run/v1`` document);
- or written as Python source (:mod:`.export`, torch.fx code generation).

Importing this package never imports torch; :func:`run_placement`,
:func:`prepare` and :func:`export_source` need it.

A plain data-parallel placement (one ``data-parallel`` derivation step) runs
one rank per replica (:mod:`.data_parallel`): each runs the step captured at
its share of the batch with a :class:`.executor.Runner` whose ``grad_hook``
all-reduces each gradient before its update.  A placement whose recipe
micro-batches or recomputes (pipelines, GPipe / 1F1B / interleaved orders,
optionally with data parallelism: hybrids) runs node by node of its derived
graph (:mod:`.plan`, :mod:`.derived_program`, :mod:`.derived_executor`,
:mod:`.derived_run`) and is exported as a
``torch.distributed.pipelining`` program where it can be (:mod:`.pipe_export`),
else as placer's own code (:mod:`.derived_export`).  Other placements that
transform the graph (operation splitting, a coarse ``base``) are refused
with one line.

References
----------
Celeritas 6.1-6.2 (placed TensorFlow steps on 4 V100s), FastT section 6 and
the Hierarchical Planner section 3 (placements measured on hardware).
"""

from __future__ import annotations

__all__ = ["run_placement", "prepare", "export_source"]


def __getattr__(name: str):
    if name in ("run_placement", "prepare"):
        from . import api

        return getattr(api, name)
    if name == "export_source":
        from .export import export_source

        return export_source
    raise AttributeError(name)
