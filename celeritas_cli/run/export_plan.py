"""Which exporter writes a prepared plan (``placer export``): :func:`export_program`
dispatches to placer's own code (:mod:`.export`), the micro-batched / pipelined
exporters (:mod:`.derived_export`) or the torchrun programs of data-parallel
and fsdp plans (:mod:`.fsdp_export`).  Kept apart from :mod:`.export`, whose
helpers (the launch checks, :func:`~.export.torchrun_line`) every exporter
imports, so that no two modules import each other."""

from __future__ import annotations

import re

from ..errors import InvalidInput
from .export import export_source, torchrun_line


def export_program(pre, cluster, *, label: str, algorithm: str, fingerprint: dict | None = None,
                   path: str = "-") -> tuple[str, str, str | None]:
    """The program ``placer export`` writes for the prepared plan *pre* (:func:`~.api.prepare`):
    ``(source, what it is, the torchrun line or None for a one-process module)``.

    * a plain placement: placer's own code (:func:`export_source`), one process;
    * a micro-batched, pipelined or hybrid one: a ``torch.distributed.pipelining`` program or
      placer's own code (:func:`~.derived_export.export_derived`);
    * an fsdp plan: an FSDP2 / ZeRO program on a DeviceMesh (:func:`~.fsdp_export.fsdp_source`),
      launched with torchrun; a plain data-parallel one: the same program with DDP;
    * a tensor-parallel plan (TP, TP x DP): a ``parallelize_module`` program on a ("dp", "tp")
      DeviceMesh (:func:`~.tp_export.tp_source`), launched with torchrun;
    * a TP x PP (x DP) plan: ``torch.distributed.pipelining`` stages each split with
      ``parallelize_module`` on a ("dp", "pp", "tp") DeviceMesh (:func:`~.tp3d_export.tp3d_source`).

    Raises
    ------
    InvalidInput
        A plan the exporters cannot write (one line saying why).
    """
    from .api import Prepared
    from .data_parallel import DPPrepared
    from .fsdp_run import FSDPPrepared
    from .plan import DerivedPrepared
    from .tp_run import TPPrepared

    name = pre.sim_graph.name
    if isinstance(pre, TPPrepared) and pre.pipe is not None:
        from .tp3d_export import tp3d_source

        src = tp3d_source(pre, cluster, label=label, algorithm=algorithm, fingerprint=fingerprint, path=path)
        return src, (f"a TP x PP program (torch.distributed.pipelining stages, each split with parallelize_module, "
                     f"on a DeviceMesh of {pre.dp} replica(s) x {pre.pp} pipeline x {pre.tp} tensor ranks, "
                     f"{pre.pipe.torch_class}, {pre.pipe.m} micro-batches{_zero(pre)})"), torchrun_line(pre.k, path)
    if isinstance(pre, TPPrepared):
        from .tp_export import tp_source

        src = tp_source(pre, cluster, label=label, algorithm=algorithm, fingerprint=fingerprint, path=path)
        sp = ", sequence parallel" if pre.sp else ""
        return src, (f"a tensor-parallel program (parallelize_module on a DeviceMesh of {pre.dp} replica(s) x "
                     f"{pre.tp} tensor ranks{sp}, {len(pre.module_plan)} modules split{_zero(pre)})"), \
            torchrun_line(pre.k, path)
    if isinstance(pre, FSDPPrepared):
        from .fsdp_export import fsdp_source

        src = fsdp_source(pre, cluster, label=label, algorithm=algorithm, fingerprint=fingerprint, path=path)
        line = torchrun_line(pre.k, path)
        return src, (f"an FSDP program (ZeRO stage {pre.stage}, {len(pre.units)} unit(s), {pre.k} replicas of "
                     f"batch {pre.replica_batch} on a DeviceMesh)"), line
    if isinstance(pre, DerivedPrepared):
        from .derived_export import export_derived

        src, what = export_derived(pre, cluster, label=label, algorithm=algorithm, fingerprint=fingerprint,
                                   program="placed.py" if path in ("-", "") else path)
        nproc = re.search(r"torchrun --nproc-per-node (\d+)", what)
        return src, what, torchrun_line(int(nproc.group(1)), path) if nproc else None
    if isinstance(pre, DPPrepared):
        from .fsdp_export import fsdp_source

        src = fsdp_source(pre, cluster, label=label, algorithm=algorithm, fingerprint=fingerprint, path=path)
        return src, (f"a DistributedDataParallel program ({pre.k} replicas of batch {pre.replica_batch} on a "
                     f"DeviceMesh)"), torchrun_line(pre.k, path)
    if not isinstance(pre, Prepared):
        raise InvalidInput(f"{label}: placer export cannot write this plan ({type(pre).__name__})")
    src = export_source(pre.prog, cluster.ids, pre.tdev, graph=name, cluster=cluster.name, label=label,
                        algorithm=algorithm, fingerprint=fingerprint)
    return src, (f"{len(pre.prog.sequence)} nodes on {len(pre.prog.devices)} device(s), {len(pre.prog.transfers)} "
                 f"copies"), None


def _zero(pre) -> str:
    """The description's words on a sharded optimizer over the replicas (ZeRO-1/2), or ""."""
    return f", ZeRO-{pre.zero} over the replicas (Adam sharded)" if getattr(pre, "zero", 0) else ""


def check_exportable(pre, label: str) -> None:
    """Refuse, before a run, what :func:`export_program` cannot write (one line)."""
    from .api import Prepared
    from .data_parallel import DPPrepared
    from .plan import DerivedPrepared
    from .tp_run import TPPrepared

    if not isinstance(pre, (Prepared, DerivedPrepared, DPPrepared, TPPrepared)):
        raise InvalidInput(f"{label}: placer export cannot write this plan ({type(pre).__name__})")
