"""``placer run`` and ``placer export``: from a placement to PyTorch.

One stack serves every plan: plain placements of the captured graph,
data parallelism, fsdp (ZeRO 1-3), and *derived* plans (micro-batches,
pipelines with GPipe / 1F1B / interleaved orders, recomputation, and their
hybrids with data parallelism).

========================  ==================================================
stage                     modules
========================  ==================================================
what runs                 :mod:`.plan` (:func:`~.plan.plan_of`: plain,
                          data-parallel, fsdp or derived; the derived
                          plan's instances, node meanings and order; one
                          simulation), :mod:`.step` (the capture with real
                          values), :mod:`.checks` (graph, devices, jobs)
the placed program        :mod:`.program` (device of every value, order,
                          transfers: :class:`~.program.TransferPlan`),
                          :mod:`.derived_program` (the same for a derived
                          graph)
execution                 :mod:`.executor` (one step loop,
                          :class:`~.executor.Executor`; the plain
                          :class:`~.executor.Runner`; copies in one
                          process), :mod:`.derived_executor`, :mod:`.dist`
                          (one process per device: torch.distributed
                          point-to-point sends, one rank main)
yardsticks                :mod:`.reference` (the unplaced steps: whole,
                          per replica, per micro-batch; one fx Interpreter)
plan drivers              :mod:`.api` (the entry; plain runs),
                          :mod:`.data_parallel`, :mod:`.fsdp_run`,
                          :mod:`.derived_run`, :mod:`.torchrun`
report                    :mod:`.report` (``placer.run/v1``), :mod:`.timing`
                          (``--node-times``), :mod:`.resimulate`
export                    :mod:`.export` (the generated module's frame; the
                          plain step), :mod:`.derived_export`,
                          :mod:`.pipe_export` (``torch.distributed.pipelining``)
========================  ==================================================

The training step ``placer profile`` captures is captured again with real
parameters, the placement is applied to it, and it is executed in one
process with explicit copies between devices (``local``) or one process per
device (``gloo``; NCCL on GPUs), checked against the unplaced step and
compared with the simulator, or written as Python source (torch.fx code
generation).  A data-parallel or fsdp placement runs one rank per replica,
each with a runner whose hooks all-reduce (or reduce-scatter and gather)
the gradients.  A derived placement runs node by node of its derived graph
and is exported as a ``torch.distributed.pipelining`` program where it can
be, else as placer's own code.  Other placements that transform the graph
(operation splitting, a coarse ``base``) are refused with one line.

Importing this package never imports torch; :func:`run_placement`,
:func:`prepare` and :func:`export_source` need it.

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
