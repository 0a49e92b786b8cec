"""Start one Python process per rank and collect what each returns.

``launch(module, job, n)`` writes *job* to a temporary file and runs
``python -m <module> <job file> <rank>`` for every rank (so the caller's
``__main__`` is never re-imported, unlike ``multiprocessing``'s spawn), with
the package and the current directory on ``PYTHONPATH``.  The module calls
:func:`worker_main`, which initialises the default :mod:`torch.distributed`
process group (a file store next to the job file), runs the rank's function
and saves its result dict, or the error as one line.  The parent polls for
the results, and terminates the remaining ranks when one fails or the
timeout passes.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable

from ..errors import InvalidInput


def launch(module: str, job: dict, n: int, *, timeout: float, what: str = "placer") -> list[dict]:
    """Run ``python -m module`` as *n* ranks of *job*; return their results by rank.

    *job* must carry ``dist_backend`` and ``timeout`` (seconds for one collective or receive).

    Raises
    ------
    InvalidInput
        A rank failed (its first error line), died without a result, or the
        ranks did not finish within *timeout* seconds.
    """
    import torch

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.getcwd(), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="placer-ranks-") as tmp:
        path = os.path.join(tmp, "job.pt")
        torch.save(dict(job, world_size=n), path)
        procs, logs = [], []
        try:
            for r in range(n):
                log = open(f"{path}.{r}.log", "wb")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, "-m", module, path, str(r)], stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT, env=env))
            return _collect(procs, path, n, timeout, what)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()


def _collect(procs, path: str, n: int, timeout: float, what: str) -> list[dict]:
    import torch

    deadline = time.monotonic() + timeout
    results: dict[int, dict] = {}
    while len(results) < n:
        for r, proc in enumerate(procs):
            if r in results:
                continue
            if os.path.exists(f"{path}.{r}"):
                results[r] = torch.load(f"{path}.{r}", weights_only=False)
                if "error" in results[r]:
                    raise InvalidInput(f"{what}: rank {r} failed: {results[r]['error']}")
            elif proc.poll() is not None:
                tail = _tail(f"{path}.{r}.log")
                raise InvalidInput(f"{what}: rank {r} exited with code {proc.returncode} without a result"
                                   f"{': ' + tail if tail else ' (killed, or out of memory?)'}")
        if len(results) < n:
            if time.monotonic() > deadline:
                raise InvalidInput(f"{what}: the {n} processes did not finish within {timeout:.0f} s")
            time.sleep(0.05)
    return [results[r] for r in range(n)]


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def worker_main(fn: Callable[[int, dict], dict]) -> None:
    """Body of a rank process (``sys.argv``: job file, rank): set the threads and
    the CUDA device, join the process group, run ``fn(rank, job)``, save its result."""
    import torch

    path, rank = sys.argv[1], int(sys.argv[2])
    try:
        job = torch.load(path, weights_only=False)
        if job.get("threads"):
            torch.set_num_threads(job["threads"])
        dev = (job.get("rank_devices") or {}).get(rank)
        if dev is not None and torch.device(dev).type == "cuda":
            torch.cuda.set_device(torch.device(dev))
        import torch.distributed as dist

        dist.init_process_group(job["dist_backend"], init_method=f"file://{path}.store", rank=rank,
                                world_size=job["world_size"], timeout=datetime.timedelta(seconds=job["timeout"]))
        try:
            out = fn(rank, job)
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported by the parent as one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        out = {"rank": rank, "error": f"{type(exc).__name__}: {first}", "traceback": traceback.format_exc()}
    torch.save(out, f"{path}.{rank}.tmp")
    os.replace(f"{path}.{rank}.tmp", f"{path}.{rank}")
