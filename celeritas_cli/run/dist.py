"""``placer run --backend gloo``: one process per used device, cross-device
tensors sent with :mod:`torch.distributed` point-to-point operations.

Each rank captures the same step (same seed: bit-identical values), builds
the same :class:`~celeritas_cli.run.program.Program` from the placement the
parent sends, and runs its device's nodes in the program's sequence (the
placement's order, or the simulator's when it has none).  A tensor is sent
(``isend``) as soon as its producer finishes; a receive is waited for just
before the first node that reads it.

No deadlock for any valid placement: every rank follows the same global
sequence (a topological order of the graph, the simulated start order),
sends never block, and a rank only waits for a tensor whose producer comes
earlier in that sequence; by induction on the sequence every wait ends.
Receives are posted in the order their sender posts the sends (the transfer
tags are numbered in that order), which NCCL requires (it matches
point-to-point operations by order, not by tag): with gloo all receives are
posted when the step starts, with NCCL lazily, one sender's receives in order
up to the one needed.  With gloo, CUDA tensors are staged through the CPU.

The wire format is the traced layout: a tensor whose traced strides are a
permutation of a contiguous layout travels as that permuted, contiguous
view, so the receiver's copy has the strides the trace (and the unplaced
step) has.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from ..profile.launch import launch, worker_main


def _perm(meta) -> list[int] | None:
    """Dimensions ordered so that *meta*'s layout is contiguous, or ``None`` when it is not dense."""
    import torch

    dims = sorted(range(meta.dim()), key=lambda i: (-meta.stride(i), -meta.shape[i]))
    probe = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype, device="meta")
    return dims if probe.permute(dims).is_contiguous() else None


def wire_buffer(meta, device):
    """``(tensor, contiguous view to receive into)`` laid out like traced value *meta*."""
    import torch

    perm = _perm(meta)
    if perm is None:
        buf = torch.empty(tuple(meta.shape), dtype=meta.dtype, device=device)
        return buf, buf
    buf = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype, device=device)
    return buf, buf.permute(perm)


def wire_view(value, meta):
    """A contiguous tensor holding *value* in the layout of traced value *meta* (no copy when it already is)."""
    perm = _perm(meta)
    if perm is None:
        return value.contiguous()
    if tuple(value.stride()) != tuple(meta.stride()):
        buf, view = wire_buffer(meta, value.device)
        buf.copy_(value)
        return view
    return value.permute(perm)


class Peers:
    """Point-to-point operations on the default process group (public :mod:`torch.distributed` calls)."""

    def send(self, tensor, dst: int, tag: int):
        import torch.distributed as dist

        return dist.isend(tensor, dst, tag=tag)

    def recv(self, tensor, src: int, tag: int):
        import torch.distributed as dist

        return dist.irecv(tensor, src, tag=tag)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


class DistChannel:
    """The :class:`~celeritas_cli.run.executor.Runner` channel of one rank.

    Parameters
    ----------
    prog : the program.
    peers : object with ``send(tensor, dst, tag)``, ``recv(tensor, src, tag)`` returning works.
    rank_of : cluster device index -> rank.
    me : this rank's cluster device.
    device : this rank's torch device.
    prepost : post every receive when the step starts (gloo) instead of lazily (NCCL).
    stage_cpu : send and receive CPU copies (gloo with CUDA tensors).
    """

    def __init__(self, prog, peers, rank_of: dict[int, int], me: int, device, *, prepost: bool, stage_cpu: bool):
        import torch

        self.prog, self.peers, self.rank_of, self.me = prog, peers, rank_of, me
        self.device = torch.device(device)
        self.prepost, self.stage = prepost, stage_cpu
        self.incoming: dict[int, list[int]] = {}
        for t in prog.transfers:                   # already in the order senders post them
            if t.dst == me:
                self.incoming.setdefault(t.src, []).append(t.index)
        self.slot = {ti: i for lst in self.incoming.values() for i, ti in enumerate(lst)}
        self.link: dict[tuple[int, int], list] = {}
        self._reset()

    def _reset(self) -> None:
        self.posted: dict[int, tuple] = {}
        self.next = {src: 0 for src in self.incoming}
        self.sent: list[tuple] = []
        #: ("send", transfer, posted at) and ("recv", transfer, wait start, wait end, arrived before the wait),
        #: perf_counter stamps (``placer run --node-times``, :mod:`.timing`)
        self.events: list[tuple] = []

    def _post(self, ti: int) -> None:
        t = self.prog.transfers[ti]
        buf, view = wire_buffer(t.meta, "cpu" if self.stage else self.device)
        work = self.peers.recv(view, self.rank_of[t.src], t.index)
        self.posted[ti] = (work, buf)

    def begin(self) -> None:
        self._reset()
        if self.prepost:
            for src, lst in self.incoming.items():
                for ti in lst:
                    self._post(ti)
                self.next[src] = len(lst)

    def fetch(self, t):
        lst = self.incoming[t.src]
        while self.next[t.src] <= self.slot[t.index]:
            self._post(lst[self.next[t.src]])
            self.next[t.src] += 1
        work, buf = self.posted.pop(t.index)
        t0 = time.perf_counter()
        done = _completed(work)
        work.wait()
        self.events.append(("recv", t.index, t0, time.perf_counter(), done))
        return buf.to(self.device) if self.stage else buf

    def send(self, t, value) -> None:
        wire = wire_view(value, t.meta)
        if self.stage:
            wire = wire.cpu()
        self.events.append(("send", t.index, time.perf_counter()))
        work = self.peers.send(wire, self.rank_of[t.dst], t.index)
        self.sent.append((work, wire))
        row = self.link.setdefault((t.src, t.dst), [0, 0])
        row[0] += wire.numel() * wire.element_size()
        row[1] += 1

    def end(self) -> None:
        for work, _ in self.sent:
            work.wait()
        self.sent = []


def _completed(work) -> bool | None:
    """Whether a receive had arrived before it was waited for (``None``: the backend does not say)."""
    try:
        return bool(work.is_completed())
    except (AttributeError, RuntimeError):
        return None


# ------------------------------------------------------------------ ranks
def timed_steps(runner, me: int, *, warmup: int, steps: int, barrier: Callable[[], None],
                events: Callable[[], list] | None = None) -> dict:
    """The loop every rank runs after its first (checked) step - here and in
    :mod:`.data_parallel`: ``warmup - 1`` more warm-up steps, then *steps*
    timed ones, each after *barrier* (the ranks start every step together).
    Returns ``{"walls": [...], "busy": [...], "cpu": [...]}`` of the timed
    steps on device *me* (wall, busy and CPU seconds per step); with the
    runner's ``node_times`` also ``host`` and ``timing`` (one
    :func:`.timing.record` per timed step, with the events *events* returns:
    data parallelism's all-reduces)."""
    out: dict[str, Any] = {"walls": [], "busy": [], "cpu": []}
    timed = getattr(runner, "node_times", False)
    if timed:
        from .timing import host

        out.update(host=host(), timing=[])
    for i in range(warmup - 1 + steps):
        barrier()
        if events is not None:
            events()                                  # drop the previous step's
        res = runner.step()
        if i >= warmup - 1:
            out["walls"].append(res["wall_s"])
            out["busy"].append(res["busy"][me])
            out["cpu"].append(res["cpu"][me])
            if timed:
                from .timing import record

                out["timing"].append(record(res, events() if events is not None else ()))
    return out


def rank_main(rank: int, job: dict, *, step=None, prog=None, peers=None) -> dict:
    """Everything one rank of a placed program does: build the program (unless *prog* is given: a
    plain :class:`~.program.Program` of the capture, or *step*; a derived program,
    :func:`~.derived_program.program_from_job`, when the job has a ``recipe``), run
    ``1 + warmup + steps`` steps, return its results.

    The first step starts from the initial values and is the one whose loss
    and parameters are checked; the timed steps follow the warm-up, each
    after a barrier.
    """
    import torch

    me = job["ranks"][rank]
    dev = torch.device(job["torch_devices"][me])
    peers = peers or Peers()
    if "recipe" in job:
        from .derived_program import program_from_job
        from .derived_executor import DerivedRunner

        prog = prog or program_from_job(job)

        def runner_of(channel):
            return DerivedRunner(prog, {me: dev}, [me], channel, job["rng_states"], job["inputs"])
    else:
        from .executor import Runner
        from .program import Program
        from .step import worker_capture

        prog = prog or Program(worker_capture(job, job["batch"], step), job["device_of"], job["sequence"])

        def runner_of(channel):
            return Runner(prog, {me: dev}, [me], channel, rng_states=job["rng_states"], adam=job.get("adam"),
                          node_times=bool(job.get("node_times")))
    from .executor import cpu_loss

    rank_of = {d: r for r, d in enumerate(job["ranks"])}
    channel = DistChannel(prog, peers, rank_of, me, dev, prepost=job["dist_backend"] == "gloo",
                          stage_cpu=job["dist_backend"] == "gloo" and dev.type == "cuda")
    runner = runner_of(channel)
    first = runner.step()
    out: dict[str, Any] = {"rank": rank, "device": me, "loss": cpu_loss(first["loss"]),
                           "params": {p: t.detach().cpu() for p, t in runner.params().items()},
                           "link": {k: list(v) for k, v in channel.link.items()}}
    out.update(timed_steps(runner, me, warmup=job["warmup"], steps=job["steps"], barrier=peers.barrier))
    return out


def merge_ranks(results: list[dict]) -> dict:
    """One measurement from the ranks' results: the step time is the slowest rank's, per step; the
    loss the one rank's that computes it (a plain program) or every instance's (a derived one)."""
    from .executor import median

    losses = [r["loss"] for r in results if r["loss"] is not None]
    if losses and isinstance(losses[0], dict):
        loss: Any = {i: v for lo in losses for i, v in lo.items()}
    else:
        loss = losses[0] if losses else None
    params: dict = {}
    link: dict = {}
    for r in results:
        params.update(r["params"])
        for k, row in r["link"].items():
            link[k] = [row[0], row[1], None]
    walls = [max(ws) for ws in zip(*(r["walls"] for r in results))]
    busy = {r["device"]: statistics.median(r["busy"]) for r in results}
    cpu = {r["device"]: median(r["cpu"]) for r in results}
    return {"loss": loss, "params": params, "walls": walls, "busy": busy, "cpu": cpu, "link": link,
            "rank_walls": {r["device"]: r["walls"] for r in results},
            "timing": [{"device": r["device"], "host": r.get("host"), "timing": r.get("timing", [])} for r in results]}


def run_processes(job: dict, *, timeout: float, launcher=None) -> list[dict]:
    """One process per rank of *job* (:func:`rank_main`); their results by rank.  *launcher* has
    :func:`~celeritas_cli.profile.launch.launch`'s signature (default: it; under torchrun the
    processes already run: :mod:`.torchrun`)."""
    job = dict(job, rank_devices={r: job["torch_devices"][d] for r, d in enumerate(job["ranks"])})
    return (launcher or launch)("celeritas_cli.run.dist", job, len(job["ranks"]), timeout=timeout, what="placer run")


if __name__ == "__main__":
    worker_main(rank_main)
