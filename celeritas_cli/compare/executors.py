"""Where the cells run, each executor yielding ``(task, row)`` as cells finish:

* ``serial`` - in this process, one cell after another (``jobs=1`` and no
  time limit; the only one that sees algorithms registered at run time in
  this process on platforms without ``fork``);
* ``process`` - ``jobs`` local worker processes (``fork`` where available,
  so algorithms registered in the parent are inherited).  Each phase of a
  cell (load + coarsen, place, simulate) gets :func:`~.cell.phase_limit`;
  a worker that overruns is killed and its cell reported as ``"timeout"``;
* ``ray`` - the same cells as Ray tasks (``pip install celeritas-cli[ray]``),
  ``ray.init(address)`` from the argument or ``RAY_ADDRESS``, a local Ray
  instance when neither is set.  Graph files are shipped through Ray's
  object store, so worker nodes need no shared file system.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import InvalidInput, MissingDependency
from ..model.limits import wait_timeout
from .cell import failed_row, phase_limit, run_cell
from .tasks import Task

OnStart = Callable[[Task], None]


# --------------------------------------------------------------------------- worker processes
def _worker_main(conn) -> None:  # pragma: no cover - runs in a child process
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:  # stdout carries only the parent's output: an algorithm's prints go to stderr
        sys.stdout.flush()
        os.dup2(2, 1)
    except OSError:
        pass
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            row = run_cell(task, phase=lambda p: conn.send(("phase", p)))
            conn.send(("done", row))
        except (BrokenPipeError, EOFError, OSError):
            return


class _Worker:
    """One worker process, the cell it runs and that cell's deadline."""

    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.task: Task | None = None
        self.deadline = math.inf
        self.last_graph: str | None = None

    def kill(self) -> None:
        try:
            self.proc.kill()
        except (OSError, AttributeError):
            pass
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.kill()
        else:
            self.conn.close()


def _mp_context():
    methods = mp.get_all_start_methods()
    # fork: workers inherit the registry (algorithms registered at run time);
    # the parent runs no threads (the progress bar refreshes from the main thread).
    return mp.get_context("fork" if "fork" in methods else "spawn")


class _Pool:
    """The worker processes of :func:`run_processes` and their pending cells."""

    def __init__(self, tasks: list[Task], jobs: int, on_start: OnStart | None):
        self.ctx = _mp_context()
        self.pending = list(tasks)
        self.on_start = on_start
        self.workers: list[_Worker] = []
        for _ in range(max(1, min(jobs, len(tasks))) if tasks else 0):
            self.workers.append(_Worker(self.ctx))

    def busy(self) -> bool:
        return bool(self.pending) or any(w.task is not None for w in self.workers)

    def replace(self, i: int) -> None:
        self.workers[i].kill()
        self.workers[i] = _Worker(self.ctx)

    def dispatch(self) -> Iterator[tuple[Task, dict]]:
        """Give each idle worker a cell, preferring the next cell of the
        graph it has loaded (its cache holds it)."""
        for i, w in enumerate(self.workers):
            if w.task is None and self.pending:
                j = next((j for j, t in enumerate(self.pending) if t.graph_file == w.last_graph), 0)
                task = self.pending.pop(j)
                w.task, w.last_graph = task, task.graph_file
                w.deadline = time.monotonic() + phase_limit(task.time_limit) if task.time_limit else math.inf
                try:
                    w.conn.send(task)
                except (OSError, BrokenPipeError):
                    self.replace(i)
                    yield task, failed_row(task, "error", "worker process died before the cell started")
                    continue
                if self.on_start:
                    self.on_start(task)

    def collect(self) -> Iterator[tuple[Task, dict]]:
        """Wait for a message, a dead worker or the next deadline; yield
        the cells that finished, died or ran out of time."""
        busy = [w for w in self.workers if w.task is not None]
        if not busy:
            return
        timeout = min(w.deadline for w in busy) - time.monotonic()  # clamped: a wait of 1e7 s overflows poll()
        ready = mp_wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=wait_timeout(timeout))
        now = time.monotonic()
        for i, w in enumerate(self.workers):
            task = w.task
            if task is None:
                continue
            if w.conn in ready:
                try:
                    kind, payload = w.conn.recv()
                except (EOFError, OSError):
                    code = w.proc.exitcode if not w.proc.is_alive() else None
                    self.replace(i)
                    yield task, failed_row(task, "error", f"worker process died (exit code {code})")
                    continue
                if kind == "phase":
                    if task.time_limit:
                        w.deadline = now + phase_limit(task.time_limit)
                    continue
                w.task = None
                yield task, payload
            elif w.proc.sentinel in ready and not w.proc.is_alive():
                code = w.proc.exitcode
                self.replace(i)
                why = "killed by the OS (out of memory?)" if code == -9 else f"exit code {code}"
                yield task, failed_row(task, "error", f"worker process died ({why})")
            elif now >= w.deadline:
                self.replace(i)
                yield task, failed_row(task, "timeout", f"exceeded the time limit of {task.time_limit:g} s")

    def close(self) -> None:
        for w in self.workers:
            if w.task is not None:
                w.kill()
            else:
                w.stop()


def run_processes(tasks: list[Task], jobs: int = 1, on_start: OnStart | None = None) -> Iterator[tuple[Task, dict]]:
    """Run cells in *jobs* worker processes, yielding ``(task, row)`` as
    each finishes.  A cell whose phase overruns :func:`~.cell.phase_limit`
    is killed (``status: "timeout"``) and its worker replaced; a worker that
    dies gives ``status: "error"``.  A worker prefers the next cell of the
    graph it has loaded (its cache holds it)."""
    pool = _Pool(tasks, jobs, on_start)
    try:
        while pool.busy():
            yield from pool.dispatch()
            yield from pool.collect()
    finally:
        pool.close()


# --------------------------------------------------------------------------- Ray
def _ray_cell(task: Task, graph_bytes: bytes) -> dict:  # pragma: no cover - runs on a Ray worker
    return run_cell(task, graph_bytes=graph_bytes)


def import_ray():
    """Import ray or raise :class:`MissingDependency` saying how to get it."""
    try:
        import ray  # type: ignore
    except ImportError:
        raise MissingDependency("--executor ray needs Ray: pip install 'celeritas-cli[ray]' (or pip install ray)") \
            from None
    return ray


def _ray_init(ray, address: str | None) -> bool:
    """Connect to Ray (or start a local instance); True when this call did."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False,
                 logging_level="ERROR")
    except Exception as exc:  # ConnectionError, RuntimeError, ...
        raise InvalidInput(ray_error(address, exc)) from None
    return True


def ray_error(address: str | None, exc: BaseException) -> str:
    """One line saying why Ray could not be reached or started, and what to do.

    Example
    -------
    >>> ray_error("auto", ConnectionError("Could not find any running Ray instance. Please specify ..."))
    "--ray-address auto: no running Ray cluster found on this machine; start one with 'ray start --head' (docs/compare.md: Ray), or leave --ray-address out to start a local Ray for this run"
    >>> "(the last one it knew, 10.0.0.2:6379, is gone)" in ray_error(
    ...     "auto", ConnectionError("Failed to connect to Ray cluster at 10.0.0.2:6379"))
    True
    >>> ray_error("10.0.0.9:6379", RuntimeError("timed out\\nmore"))
    'cannot start or reach Ray at 10.0.0.9:6379: timed out'
    """
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if address == "auto" and ("running Ray instance" in first or "Failed to connect" in first):
        gone = f" (the last one it knew, {first.rsplit(' at ', 1)[-1]}, is gone)" if " at " in first else ""
        return (f"--ray-address auto: no running Ray cluster found on this machine{gone}; start one with "
                f"'ray start --head' (docs/compare.md: Ray), or leave --ray-address out to start a local Ray for this run")
    return f"cannot start or reach Ray at {address or 'a new local instance'}: {first}"


def run_ray(tasks: list[Task], jobs: int | None = None, address: str | None = None,
            on_start: OnStart | None = None) -> Iterator[tuple[Task, dict]]:
    """Run cells as Ray tasks (one CPU each), at most *jobs* in flight
    (default: the cluster's CPU count), yielding ``(task, row)`` as each
    finishes.  ``ray.init(address)`` with *address*, else ``RAY_ADDRESS``,
    else a local instance.  A cell running longer than three phase limits
    is cancelled (``status: "timeout"``)."""
    ray = import_ray()
    started_here = _ray_init(ray, address)
    try:
        if jobs is None or jobs < 1:
            jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_cell)
        graph_refs: dict[str, Any] = {}
        pending = list(tasks)
        inflight: dict[Any, tuple[Task, float]] = {}
        while pending or inflight:
            while pending and len(inflight) < jobs:
                task = pending.pop(0)
                if task.graph_file not in graph_refs:
                    try:
                        graph_refs[task.graph_file] = ray.put(Path(task.graph_file).read_bytes())
                    except OSError as exc:
                        yield task, failed_row(task, "error", f"load: {task.graph_file}: {exc.strerror}")
                        continue
                ref = remote.remote(task, graph_refs[task.graph_file])
                limit = 3 * phase_limit(task.time_limit) if task.time_limit else math.inf
                inflight[ref] = (task, time.monotonic() + limit)
                if on_start:
                    on_start(task)
            if inflight:
                yield from _ray_collect(ray, inflight)
    finally:
        if started_here:  # disconnect (stops the instance only when we started a local one)
            ray.shutdown()


def _ray_collect(ray, inflight: dict) -> Iterator[tuple[Task, dict]]:
    """Wait for one Ray cell or the next deadline; yield what finished or
    ran out of time (cancelled)."""
    soonest = min(d for _, d in inflight.values()) - time.monotonic()
    done, _ = ray.wait(list(inflight), num_returns=1, timeout=wait_timeout(soonest))
    for ref in done:
        task, _ = inflight.pop(ref)
        try:
            row = ray.get(ref)
        except Exception as exc:
            row = failed_row(task, "error", f"ray: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        yield task, row
    now = time.monotonic()
    for ref, (task, deadline) in list(inflight.items()):
        if now >= deadline:
            ray.cancel(ref, force=True)
            inflight.pop(ref)
            yield task, failed_row(task, "timeout", f"exceeded the time limit of {task.time_limit:g} s")


# --------------------------------------------------------------------------- choice
def run_tasks(tasks: list[Task], *, jobs: int = 1, executor: str = "auto", ray_address: str | None = None,
              on_start: OnStart | None = None) -> Iterator[tuple[Task, dict]]:
    """Run *tasks* with the chosen executor (``auto``: ``serial`` for one
    job without a time limit, else ``process``); yields ``(task, row)`` in
    completion order.

    Raises
    ------
    InvalidInput
        An unknown executor, or Ray that cannot be reached.
    MissingDependency
        ``ray`` without Ray installed.
    """
    if executor == "auto":
        executor = "serial" if jobs <= 1 and not any(t.time_limit for t in tasks) else "process"
    if executor == "serial":
        for t in tasks:
            if on_start:
                on_start(t)
            yield t, run_cell(t)
    elif executor == "process":
        yield from run_processes(tasks, jobs, on_start)
    elif executor == "ray":
        yield from run_ray(tasks, jobs if jobs > 1 else None, ray_address, on_start)
    else:
        raise InvalidInput(f"unknown executor '{executor}' (use process or ray)")
