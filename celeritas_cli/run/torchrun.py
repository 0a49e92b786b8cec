"""``placer run`` launched by torchrun: the torchrun processes are the ranks.

``torchrun --nproc-per-node N -m celeritas_cli run ...`` (or ``torchrun
--nnodes H --nproc-per-node N ...`` on each of H hosts) starts the command
once per process with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set (PyTorch's env:// rendezvous).
Every process joins the default process group from them (:class:`Session`);
its device is ``cuda:LOCAL_RANK`` when its host has that GPU, else the CPU;
all processes learn every rank's device (NCCL when every rank is a GPU,
else gloo, CUDA tensors staged through the CPU as ``--backend gloo`` does).

Rank 0 does what ``placer run --backend gloo`` does - capture, simulate, the
unplaced reference step, the report - but instead of starting processes it
hands the job to the others (:func:`launcher`: one broadcast, then its own
share, then one gather of every rank's result); rank ``r`` runs the
placement's ``r``-th used device (a replica under data parallelism) exactly
as a process started by :func:`~celeritas_cli.profile.launch.launch` does
(:func:`~celeritas_cli.run.dist.rank_main`,
:func:`~celeritas_cli.run.data_parallel.dp_rank_main`), and writes nothing.
``WORLD_SIZE`` must equal the number of devices the placement uses.  When
rank 0 stops before handing out the job (bad input), it tells the others,
which stop with one line too (:meth:`Session.abort`).

Example (not run: starts processes)::

    torchrun --nproc-per-node 2 -m celeritas_cli run --graph g.json -P p.json --cluster cpu2.json -o r.json
"""

from __future__ import annotations

import datetime
import os
import traceback
from typing import Any

from ..errors import InvalidInput

#: the variables torchrun sets for every process (env:// rendezvous)
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: rank function of each module :func:`~celeritas_cli.profile.launch.launch` would start
_RANK_FUNCTIONS = {"celeritas_cli.run.dist": ("celeritas_cli.run.dist", "rank_main"),
                   "celeritas_cli.run.data_parallel": ("celeritas_cli.run.data_parallel", "dp_rank_main")}


def under_torchrun(environ: dict | None = None) -> bool:
    """True when this process was started by torchrun (every variable of :data:`ENV` is set).

    >>> under_torchrun({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    True
    >>> under_torchrun({"RANK": "0"})
    False
    """
    env = os.environ if environ is None else environ
    return all(k in env for k in ENV)


def local_device(local_rank: int) -> str:
    """``cuda:LOCAL_RANK`` when this host has that GPU, else ``cpu``."""
    import torch

    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return f"cuda:{local_rank}"
    return "cpu"


class Session:
    """This process in the torchrun job: joins the default process group (env://) and learns
    every rank's device.  Use as a context manager (the group is destroyed on exit)."""

    def __init__(self, timeout: float = 1800.0):
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.device = local_device(self.local_rank)
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=timeout))
        got: list[Any] = [None] * self.world
        dist.all_gather_object(got, self.device)
        self.devices: list[str] = list(got)
        self.kind = "nccl" if all(d.startswith("cuda") for d in self.devices) else "gloo"
        self.launched = False

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def abort(self, message: str) -> None:
        """Rank 0 failed before handing out the job: tell the waiting ranks (they raise with *message*)."""
        import torch.distributed as dist

        if self.rank == 0 and not self.launched:
            self.launched = True
            dist.broadcast_object_list([None, message], src=0)


def launcher(session: Session):
    """Rank 0's stand-in for :func:`~celeritas_cli.profile.launch.launch`: hand *job* to the torchrun
    ranks, run rank 0's share here, gather every rank's result.

    Raises
    ------
    InvalidInput
        ``WORLD_SIZE`` differs from the ranks the job needs, or a rank failed.
    """
    import torch.distributed as dist

    def run(module: str, job: dict, n: int, *, timeout: float, what: str = "placer run") -> list[dict]:
        if n != session.world:
            msg = (f"torchrun started {session.world} processes but the placement uses {n} device(s); start "
                   f"torchrun with --nproc-per-node {n} (or that many processes in all)")
            session.abort(msg)
            raise InvalidInput(msg)
        job = dict(job, world_size=n, dist_backend=session.kind,
                   torch_devices={d: session.devices[r] for r, d in enumerate(job["ranks"])},
                   rank_devices={r: session.devices[r] for r in range(n)})
        session.launched = True
        dist.broadcast_object_list([module, job], src=0)
        mine = _run_rank(module, 0, job)
        got: list[Any] = [None] * n
        dist.gather_object(mine, got, dst=0)
        for r, res in enumerate(got):
            if res is None or "error" in res:
                raise InvalidInput(f"{what}: rank {r} failed: {(res or {}).get('error', 'no result')}")
        return got

    return run


def worker(session: Session) -> None:
    """What ranks other than 0 do: wait for the job, run their share, send the result to rank 0.

    Raises
    ------
    InvalidInput
        Rank 0 stopped before handing out a job, or this rank failed.
    """
    import torch.distributed as dist

    box: list[Any] = [None, None]
    dist.broadcast_object_list(box, src=0)
    module, job = box
    if module is None:
        raise InvalidInput(f"rank 0 stopped: {job}")
    res = _run_rank(module, session.rank, job)
    dist.gather_object(res, None, dst=0)
    if "error" in res:
        raise InvalidInput(f"placer run: rank {session.rank} failed: {res['error']}")


def _run_rank(module: str, rank: int, job: dict) -> dict:
    """The rank function of *module* on this process (threads as the job says); an exception
    becomes ``{"error": one line}``, as :func:`~celeritas_cli.profile.launch.worker_main` reports it."""
    import importlib

    import torch

    saved = torch.get_num_threads()
    try:
        if job.get("threads"):
            torch.set_num_threads(job["threads"])
        mod, fn = _RANK_FUNCTIONS[module]
        return getattr(importlib.import_module(mod), fn)(rank, job)
    except Exception as exc:  # noqa: BLE001 - reported as one line by rank 0
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"rank": rank, "error": f"{type(exc).__name__}: {first}", "traceback": traceback.format_exc()}
    finally:
        torch.set_num_threads(saved)
