"""``placer profile --comm-bench --processes N``: measure the transfers
``placer run --backend gloo`` makes, between N torch.distributed processes.

Each ordered pair ``a -> b`` is timed by ping-pong: ``a`` sends a float32
tensor of ``d`` bytes, ``b`` receives it and sends it back; half the round
trip is one transfer (min of ``repeats`` after ``warmup``).  The samples
(``placer.comm_samples/v1``) go to :func:`celeritas_cli.profile.commfit.fit_cluster`,
which fits t = k·d + b per pair (Celeritas 4.2.1) into a cluster file whose
devices are the processes: type ``cpu`` (the type ``placer profile --measure``
writes for CPU node times) with ``memory / N`` each, or, when the machine has
N or more GPUs, one GPU per process over NCCL (the backend ``placer run``
then uses).
"""

from __future__ import annotations

import math
import os
import time

DEFAULT_SIZES = [1024 * 4**i for i in range(9)]      # 1 KiB ... 64 MiB


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 1024**3


def bench_processes(n: int = 2, *, sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2,
                    threads: int | None = None, timeout: float = 600.0, progress=None) -> dict:
    """Measure point-to-point transfer times between *n* processes.

    Parameters
    ----------
    n : processes (>= 2), one per simulated device.
    sizes : message sizes in bytes (default 1 KiB ... 64 MiB, powers of 4).
    repeats, warmup : timed and untimed round trips per size.
    threads : torch threads per process (default: CPUs / n), recorded in ``meta``.

    Returns
    -------
    dict, a ``placer.comm_samples/v1`` document (devices ``cpu0..``, or ``gpu0..`` with NCCL).

    Raises
    ------
    InvalidInput
        Fewer than two processes, or a rank failed.
    """
    import torch

    from ..errors import InvalidInput
    from .commfit import SAMPLES_SCHEMA
    from .launch import launch

    if n < 2:
        raise InvalidInput(f"--processes must be >= 2, got {n}")
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = n_cuda >= n
    threads = threads or max(1, (os.cpu_count() or 1) // n)
    if nccl:
        from ..model.devices import device_type_of

        devices = []
        for i in range(n):
            props = torch.cuda.get_device_properties(i)
            devices.append({"id": f"gpu{i}", "type": device_type_of(props.name),
                            "memory_bytes": int(props.total_memory)})
    else:
        devices = [{"id": f"cpu{i}", "type": "cpu", "memory_bytes": _host_memory() // n} for i in range(n)]
    job = {"dist_backend": "nccl" if nccl else "gloo", "threads": threads, "timeout": timeout,
           "rank_devices": {r: (f"cuda:{r}" if nccl else "cpu") for r in range(n)},
           "sizes": sizes or DEFAULT_SIZES, "repeats": repeats, "warmup": warmup}
    if progress:
        progress(f"comm-bench: {n} processes over {job['dist_backend']}, {len(job['sizes'])} sizes up to "
                 f"{max(job['sizes']) / 2**20:.0f} MiB, every ordered pair")
    results = launch("celeritas_cli.profile.commbench", job, n, timeout=timeout, what="placer profile --comm-bench")
    samples = [s for r in results for s in r["samples"]]
    for s in samples:
        s["src"], s["dst"] = devices[s["src"]]["id"], devices[s["dst"]]["id"]
    kind = "gpu-nccl" if nccl else "cpu-gloo"
    return {"schema": SAMPLES_SCHEMA, "name": f"{n}x{kind}", "devices": devices, "samples": samples,
            "meta": {"processes": n, "dist_backend": job["dist_backend"], "threads": threads}}


def _rank(rank: int, job: dict) -> dict:
    """Ping-pong between every ordered pair; rank ``a`` records the samples of ``a -> b``."""
    import torch
    import torch.distributed as dist

    n = job["world_size"]
    dev = torch.device(job["rank_devices"][rank])
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    samples = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            dist.barrier()
            if rank not in (a, b):
                continue
            for size in job["sizes"]:
                buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=dev)
                best = math.inf
                for i in range(job["warmup"] + job["repeats"]):
                    sync()
                    t0 = time.perf_counter()
                    if rank == a:
                        dist.send(buf, b)
                        dist.recv(buf, b)
                    else:
                        dist.recv(buf, a)
                        dist.send(buf, a)
                    sync()
                    if i >= job["warmup"]:
                        best = min(best, (time.perf_counter() - t0) / 2)
                if rank == a:
                    samples.append({"src": a, "dst": b, "bytes": buf.numel() * 4, "seconds": best})
    dist.barrier()
    return {"rank": rank, "samples": samples}


if __name__ == "__main__":
    from .launch import worker_main

    worker_main(_rank)
