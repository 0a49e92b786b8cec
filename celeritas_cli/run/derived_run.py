"""``placer run`` on a micro-batched, pipelined, recomputed or hybrid
placement (:mod:`.plan`): the references, the run (one process, or one
per device with ``--backend gloo``), and the ``placer.run/v1`` report.

The numerics check: the placed step against the unplaced step on the whole
batch (:func:`~.reference.whole_reference`), within the run's
tolerance, when the model has no BatchNorm; against the unplaced
micro-batched step (:func:`~.reference.microbatch_reference`, GPipe's
semantics: BatchNorm statistics per micro-batch) when it has.  Both
comparisons are in the report (``microbatch.whole_batch`` and
``microbatch.per_microbatch``); the second is exact (0) for a correct run,
the first differs by float summation order only: micro-batching sums a
mean-reduced loss's gradient as ``sum_i (b_i / B) g_i`` instead of over the
whole batch at once (and a ring all-reduce adds the replicas' chunks in
ring order).  Adam's first step divides each gradient element by its own
magnitude, so the parameters' differences stay about ``lr * u`` (``u`` the
float32 rounding, 6e-8) except where a gradient element is near Adam's
``eps`` (1e-8): the default ``--rtol 1e-4 --atol 1e-5`` leaves room for
that, the whole batch's loss agrees to ``~1e-7`` relative.
"""

from __future__ import annotations

from typing import Callable

from .plan import DerivedPrepared


def placed_result(prog, measured: dict):
    """``(loss, params of replica 0, largest difference between replicas)`` of a run."""
    import torch

    lay = prog.layout
    loss = sum(lay.weight(inst) * float(measured["loss"][inst]) for inst in sorted(lay.sizes))
    params = {p: t for (r, p), t in measured["params"].items() if r == 0}
    spread = max((float((t - params[p]).abs().max()) for (r, p), t in measured["params"].items() if r), default=0.0)
    return torch.tensor(loss), params, spread


def run_derived(pre: DerivedPrepared, placement, cluster, *, label: str, backend: str, steps: int, warmup: int,
           threads: int, timeout: float, rtol: float, atol: float, congestion: str, load, seed: int = 0,
           progress: Callable[[str], None] | None = None) -> dict:
    """References, the run, the report (module docstring)."""
    from .executor import LocalChannel, measure_local, torch_threads
    from .derived_program import DerivedProgram, derived_job
    from .derived_executor import DerivedRunner
    from .reference import has_batchnorm, microbatch_reference, whole_reference
    from .report import build_report, compare

    say = progress or (lambda msg: None)
    prog = DerivedProgram(pre)
    used = prog.devices
    ref_dev = pre.tdev[used[0]]
    with torch_threads(threads):
        say(f"running the unplaced step on the batch of {pre.layout.total} and on each of the "
            f"{len(pre.layout.sizes)} micro-batches on {ref_dev} ({threads} thread(s))")
        whole, random_values = whole_reference(prog, ref_dev, seed=seed)
        per_mb = microbatch_reference(prog, pre.inputs, random_values, whole.rng_states, ref_dev, seed=seed)
        where = ", ".join(f"{cluster.ids[d]}={pre.tdev[d]}" for d in used)
        if backend == "local":
            say(f"running {pre.graph.n} derived nodes on {where} in one process: 1 checked step, {warmup - 1} more "
                f"warm-up, {steps} timed")
            channel = LocalChannel(pre.tdev)
            runner = DerivedRunner(prog, pre.tdev, prog.devices, channel, whole.rng_states, pre.inputs)
            measured = measure_local(runner, channel, steps=steps, warmup=warmup, link_seconds=False)
            dist_backend = None
        else:
            from .dist import merge_ranks, run_processes

            job = derived_job(pre, whole.rng_states, steps=steps, warmup=warmup, threads=threads, timeout=timeout)
            dist_backend = job["dist_backend"]
            say(f"starting {len(used)} processes ({dist_backend}: {where}; {threads} thread(s) each): 1 checked "
                f"step, {warmup - 1} more warm-up, {steps} timed")
            measured = merge_ranks(run_processes(job, timeout=timeout))
    loss, params, spread = placed_result(prog, measured)
    bn = has_batchnorm(pre.whole)
    c_whole = compare(loss, params, whole, rtol=rtol, atol=atol)
    c_mb = compare(loss, params, per_mb, rtol=rtol, atol=atol)
    numerics = dict(c_mb if bn else c_whole)
    if spread > atol:
        numerics["match"] = False
    numerics["match"] = bool(numerics["match"] and c_mb["match"])
    counts = {d: prog.device_of.count(d) for d in used}
    for k, row in prog.link_bytes().items():
        measured["link"].setdefault(k, [0, 0, None])
    report = build_report(step=pre.whole, counts=counts, placement=placement, label=label, cluster=cluster,
                          sim=pre.sim, sim_graph=pre.sim_graph, graph_from_file=pre.graph_from_file, tdev=pre.tdev,
                          backend=backend, dist_backend=dist_backend, threads=threads, steps=steps, warmup=warmup,
                          numerics=numerics, measured=measured, congestion=congestion, load=load,
                          extra_notes=_notes(pre, prog, bn, spread))
    report["microbatch"] = _summary(pre, prog, placement, bn, c_whole, c_mb, spread)
    return report


def _summary(pre, prog, placement, bn: bool, c_whole: dict, c_mb: dict, spread: float) -> dict:
    from .pipe_export import schedule_of

    lay = pre.layout
    sched, _ = schedule_of(prog)
    pick = ("loss_max_abs_diff", "params_max_abs_diff", "match")
    return {"recipe": [s["transform"] for s in pre.recipe], "replicas": lay.k, "micro_batches": lay.m,
            "global_batch": lay.total, "instance_batches": [lay.sizes[i] for i in lay.instances],
            "schedule": sched["schedule"] if sched else None, "stages": sched["p"] * sched["v"] if sched else None,
            "recomputed": sum(1 for i in prog.infos if i.kind == "recompute"),
            "derived_nodes": prog.graph.n, "transfers": len(prog.transfers),
            "yardstick": "per micro-batch" if bn else "whole batch",
            "whole_batch": {k: c_whole[k] for k in pick}, "per_microbatch": {k: c_mb[k] for k in pick},
            "replica_spread": spread}


def _notes(pre, prog, bn: bool, spread: float) -> list[str]:
    lay = pre.layout
    notes = [f"micro-batched run: {len(lay.sizes)} instances ({lay.k} replica(s) x {lay.m} micro-batch(es)) of "
             f"{sorted(set(lay.sizes.values()))} samples, gradients weighted by each one's share of the batch of "
             f"{lay.total} (a mean loss) and accumulated; dropout masks are the unplaced step's rows"]
    if bn:
        notes.append("the model has BatchNorm: its statistics are per micro-batch (GPipe), so the yardstick is the "
                     "unplaced step run on each micro-batch with the gradients accumulated; the whole batch's step "
                     "differs (microbatch.whole_batch)")
    else:
        notes.append("the yardstick is the unplaced step on the whole batch; micro-batching changes the float "
                     "summation order only (microbatch.per_microbatch is the exact check)")
    if lay.k > 1:
        notes.append(f"data parallelism: the ring all-reduce runs as the derived graph's nodes, chunked by elements "
                     f"(the simulator chunks bytes: ring links may differ by a few bytes); replicas' parameters "
                     f"differ by at most {spread:.3g}")
    return notes


# ------------------------------------------------------------------ ZeRO over a pipeline's replicas
def pipe_rank_main(rank: int, job: dict) -> dict:
    """One rank of ``placer run`` of a pipeline whose replicas shard the optimizer: the exported
    ``torch.distributed.pipelining`` program (``job["source"]``, :mod:`.pipe_export`) run as a
    module, its ``train`` (the checked step, then the warm-up and timed ones) on this rank's device
    in the process group :func:`~celeritas_cli.profile.launch.worker_main` joined."""
    import time

    import torch

    ns: dict = {"__name__": "placer_pipe_program", "__file__": "placed_pipe.py"}
    exec(compile(job["source"], "placed_pipe.py", "exec"), ns)     # noqa: S102 - placer's own generated program
    device = torch.device(job["rank_devices"][rank])
    torch.manual_seed(ns["SEED"])
    model = ns["build_model"]()
    model.train(True)
    ns["check_model"](model)
    n = job["warmup"] + job["steps"]
    c0 = time.process_time()
    loss, params, walls = ns["train"](model, device, n, keep=True)
    return {"rank": rank, "device": job["ranks"][rank], "loss": loss, "params": params,
            "walls": walls[job["warmup"]:], "cpu": (time.process_time() - c0) / n}


def run_zero_pipeline(pre: DerivedPrepared, placement, cluster, *, label: str, steps: int, warmup: int,
                      threads: int, timeout: float, rtol: float, atol: float, congestion: str, load,
                      progress: Callable[[str], None] | None = None) -> dict:
    """``placer run`` of a pipeline whose data-parallel step has ``zero`` 1 or 2 (*pre* prepared
    through its replicated-Adam twin, :func:`~.plan.without_zero`): one process per mesh rank, each
    running the program ``placer export`` writes for it (:func:`~.pipe_export.pipelining_source`,
    its ``ZeroAdam``: gradients reduce-scattered over the replicas, Adam on each rank's shard, the
    shards all-gathered), as ``placer run`` runs tensor-parallel plans (:mod:`.tp_run`); the
    yardstick is the unplaced step on the whole batch.  placer's own executor (:func:`run_derived`)
    runs the derived graph's ring all-reduce and replicated Adam, not the plan's sharded optimizer,
    so it is not used.

    Raises
    ------
    InvalidInput
        ``torch.distributed.pipelining`` cannot run the plan (:func:`~.pipe_export.why_not`), a
        failed rank.
    """
    import statistics

    import torch

    from ..errors import InvalidInput
    from ..profile.launch import launch
    from .checks import job_core
    from .derived_program import DerivedProgram
    from .executor import ADAM, torch_threads
    from .pipe_export import module_kinds, pipelining_source, why_not
    from .reference import Reference, adam_reference, has_batchnorm, reference_grads
    from .report import build_report, compare

    say = progress or (lambda msg: None)
    whole = pre.whole
    prog = DerivedProgram(pre)
    plan, why = why_not(prog, module_kinds(whole.spec, whole.config))
    if plan is None:
        raise InvalidInput(f"{label}: its replicas shard the optimizer (zero={pre.zero}), which placer runs in the "
                           f"torch.distributed.pipelining program only, and that cannot run this plan: {why}")
    src = pipelining_source(plan, prog, cluster.ids, graph=pre.sim_graph.name, cluster=cluster.name, label=label,
                            algorithm=placement.algorithm)
    with torch_threads(threads):
        say(f"running the unplaced step on the CPU ({threads} thread(s))")
        loss, grads, _ = reference_grads(whole, "cpu", seed=whole.seed)
        ref = Reference(loss=loss.cpu(), params=adam_reference(whole, grads, ADAM), device="cpu")
    job = job_core(whole, plan.rank_devices, pre.tdev, None, steps=steps, warmup=warmup, threads=threads,
                   timeout=timeout)
    job["source"] = src
    say(f"starting {plan.nproc} processes: {plan.dp} replica(s) x {plan.p} pipeline rank(s) ({job['dist_backend']}, "
        f"{threads} thread(s) each): 1 checked step, {warmup - 1} more warm-up, {steps} timed")
    results = launch("celeritas_cli.run.derived_run", job, plan.nproc, timeout=timeout, what="placer run")
    names = whole.sm.state_names
    index = {names[s]: s for s in range(whole.sm.n_params)}
    merged: dict = {}               # each rank holds its stages' parameters: their union, replica 0's first
    for r in results:
        for n, t in r["params"].items():
            merged.setdefault(n, t)
    got = {index[n]: t for n, t in merged.items() if index.get(n) in ref.params}
    numerics = compare(torch.tensor(results[0]["loss"]), got, ref, rtol=rtol, atol=atol)
    spread = max((float((t - merged[n]).abs().max()) for r in results for n, t in r["params"].items()), default=0.0)
    if spread > atol:
        numerics["match"] = False
    worst_rel = max((float(((got[p] - ref.params[p]).abs() / ref.params[p].abs().clamp_min(atol)).max())
                     for p in got), default=0.0)
    walls = [max(ws) for ws in zip(*(r["walls"] for r in results))]
    med = statistics.median(walls)
    measured = {"walls": walls, "busy": {r["device"]: med for r in results},
                "cpu": {r["device"]: r["cpu"] for r in results}, "link": {}, "link_bytes_unknown": True}
    notes = [(f"ZeRO stage {pre.zero} over {plan.dp} replicas of a {plan.p}-rank pipeline ({plan.schedule}, "
              f"{plan.m} micro-batches): the processes run the torch.distributed.pipelining program placer export "
              f"writes, its ZeroAdam reduce-scattering every gradient over the replicas, updating each rank's "
              f"1/{plan.dp} shard and all-gathering it; the yardstick is the unplaced step on the batch of "
              f"{plan.batch}; the ranks' copies of a parameter differ by at most {spread:.3g}; the largest "
              f"difference relative to max(|value|, atol) is {worst_rel:.3g}"),
             ("per-device busy time is the step's wall time (the program times steps, not nodes); the collectives "
              "are torch.distributed's, bytes per link are the simulated plan's only")]
    if has_batchnorm(whole):
        notes.append("the model has BatchNorm: its statistics are per micro-batch in the pipeline, so the whole "
                     "batch's step differs")
    counts = {d: len(whole.sm.ids) for d in plan.rank_devices}
    report = build_report(step=whole, counts=counts, placement=placement, label=label, cluster=cluster, sim=pre.sim,
                          sim_graph=pre.sim_graph, graph_from_file=pre.graph_from_file, tdev=pre.tdev,
                          backend="gloo", dist_backend=job["dist_backend"], threads=threads, steps=steps,
                          warmup=warmup, numerics=numerics, measured=measured, congestion=congestion, load=load,
                          extra_notes=notes)
    report["plan"] = "micro-batched"
    report["pipelining"] = {"dp": plan.dp, "pp": plan.p, "stages": len(plan.stage_devices), "schedule": plan.schedule,
                            "micro_batches": plan.m, "zero": pre.zero, "params_max_rel_diff": worst_rel}
    return report


if __name__ == "__main__":
    from ..profile.launch import worker_main

    worker_main(pipe_rank_main)
