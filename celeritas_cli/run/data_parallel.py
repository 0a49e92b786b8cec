"""``placer run`` on a data-parallel placement (``place --algo data-parallel``,
issue 17): one process per replica with torch.distributed, gradients
all-reduced before each replica's Adam update.

Replica ``r`` runs the step captured at the replica batch (strong scaling:
the graph's batch / k; weak: the graph's batch) on its shard of the global
batch (rows ``r*b .. (r+1)*b`` of the inputs and target), every node on its
device in the simulated order of replica 0 (all ranks follow one order, so
they start their collectives in the same order).  As soon as a gradient's
producer has run, its all-reduce starts (``async_op``, the simulator's ring
starts when the gradient is ready); a gradient that the placement's
derivation puts in a DDP bucket (``bucket_mb``) waits for the bucket's last
gradient, and the flattened bucket is all-reduced once, as DDP and the
simulated graph do.  The update waits for its all-reduce and divides by k.
The algorithm of the all-reduce is the backend's (gloo, or NCCL with one
GPU per replica), so the bytes it puts on each link are not known: the
report gives the simulated ring's next to ``null``.

Numerics: the yardstick is the unplaced step run on each replica's shard
with the gradients averaged, then ``torch.optim.Adam`` - data parallelism's
own semantics (as DDP: BatchNorm statistics and dropout masks per replica),
which differ from one step on the whole batch whenever the model has
BatchNorm; that difference is a property of data parallelism, not of the
execution, and the report says so.

References
----------
FastT (Yi et al., CoNEXT 2020) 6.2 (the DP baseline); Li et al., "PyTorch
Distributed", VLDB 2020 (DDP: bucketed all-reduce overlapping the backward
pass, local BatchNorm statistics).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from ..model.congestion import DEFAULT_CONGESTION
from .checks import default_device_map, dist_backend


@dataclass
class DPPrepared:
    """A data-parallel placement applied to a captured step (:func:`prepare_dp`)."""

    step: Any                       # RealStep at the replica batch
    k: int
    scaling: str
    replica_batch: int
    global_batch: int
    shards: list                    # per replica: (inputs, target)
    devices: list[int]              # cluster device of replica r
    sequence: list[int]             # replica 0's order, as graph node indices of step
    sim: dict
    sim_graph: Any
    tdev: dict[int, str]
    graph_from_file: bool
    sched: Any = None               # the simulator's Schedule of the data-parallel graph
    buckets: list = field(default_factory=list)     # DDP buckets: gradient tensor names (dp_buckets)


def prepare_dp(spec: str, batch: int, placement, cluster, recipe: dict, *, label: str, config: dict | None,
               graph=None, graph_label: str = "graph", device_map=None, seed: int = 0,
               congestion: str = DEFAULT_CONGESTION, progress=None, step=None) -> DPPrepared:
    """Capture the step at the graph's batch (to simulate and check the placement) and at the
    replica batch (to run), cut the global batch into shards, and find each replica's device.
    *recipe*: the ``data-parallel`` step, or the ``fsdp`` step (:mod:`.fsdp_run`: same replicas
    and shards, strong scaling)."""
    from .plan import simulated
    from .step import capture_real, example_batch

    say = progress or (lambda msg: None)
    k, scaling = int(recipe["replicas"]), recipe.get("scaling", "strong")
    made_for = recipe.get("global_batch")
    if scaling == "strong" and isinstance(made_for, int) and made_for != batch:
        raise InvalidInput(f"{label}: was made for a global batch of {made_for} samples, the run is at batch {batch}; "
                           f"run with -b {made_for}, or place the graph profiled at batch {batch}")
    uneven = recipe.get("shares") if recipe.get("shares") is not None else recipe.get("samples")
    if uneven is not None:
        raise InvalidInput(f"{label}: its replicas run uneven batch shares ({uneven}); placer run executes "
                           f"equal shares only (a batch the replicas divide)")
    if step is None:
        say(f"capturing {spec} at batch {batch} (the graph's)")
        step = capture_real(spec, batch, config=config, seed=seed)
    sim, sim_graph, sched = simulated(step, placement, cluster, label=label, graph=graph, graph_label=graph_label,
                                      congestion=congestion)
    if scaling == "strong" and batch % k:
        raise InvalidInput(f"{label}: {k} replicas cannot share a batch of {batch} evenly; use a batch size "
                           f"divisible by {k}")
    b = batch // k if scaling == "strong" else batch
    total = b * k
    rstep = step if b == batch else capture_real(spec, b, config=config, seed=seed)
    if rstep.sm.ids != step.sm.ids:
        raise InvalidInput(f"{label}: at the replica batch {b} the model traces another graph than at batch {batch} "
                           f"(use at least 2 samples per replica)")
    inputs, target = example_batch(spec, total, config=config, seed=seed, with_target=rstep.target is not None)
    shards = [(_rows(inputs, r, b, total, spec), None if target is None else _rows([target], r, b, total, spec)[0])
              for r in range(k)]
    dgraph = sched.graph
    idx = {nid: v for v, nid in enumerate(step.sm.ids)}
    devices, order = [-1] * k, []
    for v in sorted(range(dgraph.n), key=lambda v: (sched.start[v], v)):
        extra = dgraph.node_extra[v] or {}
        if "allreduce" in extra or "fsdp" in extra or "origin" not in extra:
            continue
        r = int(extra["replica"])
        devices[r] = sched.device_of[v]
        if r == 0:
            order.append(idx[extra["origin"]])
    if len(set(devices)) != k:
        raise InvalidInput(f"{label}: the {k} replicas are not on {k} distinct devices")
    tdev = default_device_map(cluster, sorted(devices), device_map)
    return DPPrepared(step=rstep, k=k, scaling=scaling, replica_batch=b, global_batch=total, shards=shards,
                      devices=devices, sequence=order, sim=sim, sim_graph=sim_graph, tdev=tdev,
                      graph_from_file=graph is not None, sched=sched, buckets=dp_buckets(dgraph))


def dp_buckets(dgraph) -> list[list[str]]:
    """The DDP buckets of a data-parallel graph (:mod:`~celeritas_cli.transform.allreduce`): per bucket
    of two or more gradients, their tensor names in bucket order (gradients reduced alone are left out).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("d", [{"id": "b0", "compute_s": 0, "memory_bytes": 0, "replica": 0,
    ...                  "allreduce": {"bucket": 0, "phase": "bucket", "of": ["x", "y"], "tensor": ["x:0", "y:0"]}}],
    ...           [])
    >>> dp_buckets(g)
    [['x:0', 'y:0']]
    """
    found = []
    for v in range(dgraph.n):
        extra = dgraph.node_extra[v] or {}
        info = extra.get("allreduce")
        if isinstance(info, dict) and extra.get("replica") == 0 and isinstance(info.get("tensor"), list) \
                and info.get("phase") in ("bucket", "all-reduce"):  # the ring form's bucket node, or the nccl one
            found.append((int(info["bucket"]), list(info["tensor"])))
    return [names for _, names in sorted(found)]


def _rows(tensors: list, r: int, b: int, total: int, spec: str) -> list:
    out = []
    for j, t in enumerate(tensors):
        if t.dim() == 0 or t.shape[0] != total:
            raise InvalidInput(f"--model {spec}: input {j} has shape {tuple(t.shape)}; data parallelism cuts the "
                               f"first dimension, which must be the batch ({total})")
        out.append(t[r * b:(r + 1) * b].clone())
    return out


class GradAllReduce:
    """Starts each gradient's all-reduce once its producer has run, or - with *buckets* (the
    simulated placement's DDP buckets, :func:`dp_buckets`) - one all-reduce of the flattened
    bucket once its last gradient is ready, as DDP does; hands the average to the update."""

    def __init__(self, prog, k: int, stage_cpu: bool, buckets: list[list[str]] | None = None):
        self.prog, self.k, self.stage = prog, k, stage_cpu
        sm = prog.sm
        self.by_producer: dict[int, list[int]] = {}
        name_of: dict[str, int] = {}
        for v in sm.opt_param:
            src = sm.src.get(sm.grad_fx[v], ("const",))
            if src[0] == "node":
                self.by_producer.setdefault(src[1], []).append(v)
                name_of[f"{sm.ids[src[1]]}:{src[2]}"] = sm.opt_param[v]
        self.members: list[list[int]] = []
        self.bucket_of: dict[int, int] = {}
        for names in buckets or []:
            ps = [name_of[x] for x in names if x in name_of]
            if len(ps) > 1:
                for p in ps:
                    self.bucket_of[p] = len(self.members)
                self.members.append(ps)
        self.pending: dict[int, tuple] = {}
        self.ready: dict[int, dict[int, object]] = {}          # bucket -> its gradients ready so far
        self.reduced: dict[int, list] = {}                     # bucket -> [averaged flat buffer, updates left]
        self.bytes = 0
        #: ("allreduce", gradient or bucket, bytes, started, wait start, wait end, done before the wait) per
        #: all-reduce, perf_counter stamps (``placer run --node-times``, :mod:`.timing`); see :meth:`take_events`
        self.events: list[tuple] = []
        self.started: dict[object, float] = {}

    def _start(self, grad, key):
        import torch.distributed as dist

        buf = grad.detach().to("cpu" if self.stage else grad.device, copy=True).contiguous()
        self.bytes += buf.numel() * buf.element_size()
        self.started[key] = time.perf_counter()
        return dist.all_reduce(buf, async_op=True), buf

    def on_node(self, v: int, d: int, runner) -> None:
        import torch

        for u in self.by_producer.get(v, ()):
            p = runner.sm.opt_param[u]
            grad = runner.value(runner.sm.grad_fx[u], d)
            b = self.bucket_of.get(p)
            if b is None:
                self.pending[p] = self._start(grad, p)
                continue
            got = self.ready.setdefault(b, {})
            got[p] = grad
            if len(got) == len(self.members[b]):
                flat = torch.cat([got[q].detach().reshape(-1) for q in self.members[b]])
                self.pending[("bucket", b)] = self._start(flat, ("bucket", b))
                del self.ready[b]

    def _wait(self, key, grad=None):
        work, buf = self.pending.pop(key) if key in self.pending else self._start(grad, key)
        t0 = time.perf_counter()
        done = work.is_completed() if hasattr(work, "is_completed") else None
        work.wait()
        name = f"bucket{key[1]}" if isinstance(key, tuple) else self.prog.sm.state_names[key]
        self.events.append(("allreduce", name, buf.numel() * buf.element_size(), self.started.pop(key, t0), t0,
                            time.perf_counter(), done))
        return buf.div_(self.k)

    def hook(self, p: int, grad):
        b = self.bucket_of.get(p)
        if b is None:
            buf = self._wait(p, grad)
        else:
            if b not in self.reduced:
                if ("bucket", b) not in self.pending:
                    raise RuntimeError(f"the update of {self.prog.sm.state_names[p]} runs before its all-reduce "
                                       f"bucket {b} is complete (order bug)")
                self.reduced[b] = [self._wait(("bucket", b)), len(self.members[b])]
            flat, left = self.reduced[b]
            off = 0
            for q in self.members[b]:
                if q == p:
                    break
                off += self.prog.step.state[q].numel()
            buf = flat[off:off + grad.numel()].view(grad.shape)
            if left == 1:
                del self.reduced[b]
            else:
                self.reduced[b][1] = left - 1
        return buf.to(grad.device) if self.stage else buf

    def take_events(self) -> list[tuple]:
        out, self.events = self.events, []
        return out


def replica_program(rank: int, job: dict, step=None):
    """What every replica's rank builds first (here and in :mod:`.fsdp_run`): the step captured at
    the replica batch (or a copy of *step*, that capture) with shard *rank* of the inputs, all of it
    on this rank's device in the shared order: ``(program, cluster device, torch device)``."""
    import dataclasses

    import torch

    from .program import Program
    from .step import worker_capture

    step = dataclasses.replace(worker_capture(job, job["batch"], step), inputs=job["shards"][rank][0],
                               target=job["shards"][rank][1])
    me = job["ranks"][rank]
    return Program(step, [me] * len(step.sm.ids), job["sequence"]), me, torch.device(job["torch_devices"][me])


def dp_rank_main(rank: int, job: dict) -> dict:
    """One replica: capture at the replica batch, take shard *rank*, run ``1 + warmup - 1 + steps`` steps."""
    import torch.distributed as dist

    from .dist import timed_steps
    from .executor import LocalChannel, Runner

    prog, me, dev = replica_program(rank, job)
    ar = GradAllReduce(prog, len(job["ranks"]), stage_cpu=job["dist_backend"] == "gloo" and dev.type == "cuda",
                       buckets=job.get("buckets"))
    timed = bool(job.get("node_times"))
    runner = Runner(prog, {me: dev}, [me], LocalChannel({me: dev}), rng_states=job["rng_states"][rank],
                    grad_hook=ar.hook, node_hook=ar.on_node, node_times=timed)
    first = runner.step()
    out: dict[str, Any] = {"rank": rank, "device": me, "loss": first["loss"].detach().cpu(),
                           "params": {p: t.detach().cpu() for p, t in runner.params().items()},
                           "allreduce_bytes": ar.bytes}
    out.update(timed_steps(runner, me, warmup=job["warmup"], steps=job["steps"], barrier=dist.barrier,
                           events=ar.take_events))
    return out


def replica_job(pre: DPPrepared, states: list, *, steps: int, warmup: int, threads: int, timeout: float,
                node_times: bool = False) -> dict:
    """What every replica's rank needs (:func:`dp_rank_main`, :func:`.fsdp_run.fsdp_rank_main`)."""
    from .checks import job_core

    job = job_core(pre.step, pre.devices, pre.tdev, states, steps=steps, warmup=warmup, threads=threads,
                   timeout=timeout)
    job.update(batch=pre.replica_batch, sequence=pre.sequence, shards=pre.shards, node_times=node_times,
               buckets=pre.buckets)
    return job


def replica_report(pre: DPPrepared, placement, cluster, results: list[dict], numerics: dict, notes: list[str], *,
                   label: str, steps: int, warmup: int, threads: int, congestion: str, load,
                   node_times: bool = False) -> dict:
    """The ``placer.run/v1`` report of replicated ranks' *results* (the slowest rank's wall time per step)."""
    from .report import build_report

    ranks = pre.devices
    measured = {"walls": [max(ws) for ws in zip(*(r["walls"] for r in results))],
                "busy": {r["device"]: statistics.median(r["busy"]) for r in results},
                "cpu": {r["device"]: statistics.median(r["cpu"]) for r in results},
                "link": {}, "link_bytes_unknown": True}
    counts = {d: len(pre.step.sm.ids) for d in sorted(ranks)}
    report = build_report(step=pre.step, counts=counts, placement=placement, label=label, cluster=cluster,
                          sim=pre.sim, sim_graph=pre.sim_graph, graph_from_file=pre.graph_from_file, tdev=pre.tdev,
                          backend="gloo", dist_backend=dist_backend(pre.tdev, ranks), threads=threads, steps=steps,
                          warmup=warmup, numerics=numerics, measured=measured, congestion=congestion, load=load,
                          extra_notes=notes)
    if node_times:
        from .timing import placement_doc, section

        rep_of = {d: r for r, d in enumerate(ranks)}
        ids = pre.step.sm.ids
        report["node_times"] = section([{"device": r["device"], "host": r.get("host"), "timing": r.get("timing", [])}
                                        for r in results],
                                       node_id=lambda v, d: f"{ids[v]}/rep{rep_of[d]}",
                                       device_id=lambda d: cluster.ids[d], batch=pre.replica_batch,
                                       sched=pre.sched, sim_graph=pre.sched.graph if pre.sched else None)
        report["node_times"]["placement"] = placement_doc(placement)
    return report


def run_dp(pre: DPPrepared, placement, cluster, *, label: str, steps: int, warmup: int, threads: int,
           timeout: float, rtol: float, atol: float, congestion: str, load, progress=None,
           node_times: bool = False, launcher=None) -> dict:
    """Reference (per-shard unplaced steps, gradients averaged, Adam), the replicas, the report."""
    import torch

    from ..profile.launch import launch
    from .reference import replica_reference
    from .report import compare

    say = progress or (lambda msg: None)
    ref, states = replica_reference(pre, threads, say)
    job = replica_job(pre, states, steps=steps, warmup=warmup, threads=threads, timeout=timeout,
                      node_times=node_times)
    backend = job["dist_backend"]
    say(f"starting {pre.k} replicas ({backend}, batch {pre.replica_batch} each, {threads} thread(s)): 1 checked "
        f"step, {warmup - 1} more warm-up, {steps} timed")
    results = (launcher or launch)("celeritas_cli.run.data_parallel", job, pre.k, timeout=timeout,
                                   what="placer run")
    loss = sum(float(r["loss"]) for r in results) / pre.k
    spread = max((float((r["params"][p] - results[0]["params"][p]).abs().max()) for r in results[1:]
                  for p in results[0]["params"]), default=0.0)
    numerics = compare(torch.tensor(loss), results[0]["params"], ref, rtol=rtol, atol=atol)
    if spread > atol:
        numerics["match"] = False
    notes = [f"data parallelism: {pre.k} replicas ({pre.scaling} scaling) of batch {pre.replica_batch} "
             f"(global batch {pre.global_batch}); the yardstick is the unplaced step on each shard with the "
             f"gradients averaged (BatchNorm statistics and dropout per replica, as DDP); replicas' parameters "
             f"differ by at most {spread:.3g}",
             f"the all-reduce is torch.distributed's ({backend} picks the algorithm): "
             f"{results[0]['allreduce_bytes']} gradient bytes per replica reduced; bytes per link are the "
             f"simulated ring's only"]
    return replica_report(pre, placement, cluster, results, numerics, notes, label=label, steps=steps, warmup=warmup,
                          threads=threads, congestion=congestion, load=load, node_times=node_times)


if __name__ == "__main__":
    from ..profile.launch import worker_main

    worker_main(dp_rank_main)
