"""``placer run`` as a library call: capture, check, simulate, execute, compare.

:func:`run_placement` is what the command and the tests call; it returns
the ``placer.run/v1`` report (:mod:`.report`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.congestion import DEFAULT_CONGESTION
from ..model.graph import Graph
from ..model.placement import Placement
from .checks import check_graph_file, check_same_graph, default_device_map

__all__ = ["BACKENDS", "Prepared", "check_graph_file", "check_same_graph", "default_device_map", "default_threads",
           "dist_job", "prepare", "run_placement"]

BACKENDS = ("local", "gloo")


def _sequence(step, graph: Graph, sched) -> list[int]:
    """Graph node indices of the capture in simulated start order (ties: topological index)."""
    topo = graph.topo_index()
    order = sorted(range(graph.n), key=lambda v: (sched.start[v], topo[v]))
    mine = {nid: v for v, nid in enumerate(step.sm.ids)}
    return [mine[graph.ids[v]] for v in order]


def default_threads(backend: str, n_ranks: int, threads: int | None, graph: Graph, cluster: Cluster) -> int:
    """torch threads per process: *threads*, else those the graph's node times were measured
    with (``meta.measured.threads``), else those of the cluster's ``--comm-bench --processes``,
    else (gloo) CPUs / processes or (local) torch's default."""
    if threads is not None:
        if threads < 1:
            raise InvalidInput(f"--threads must be >= 1, got {threads}")
        return threads
    for meta, key in (((graph.meta or {}).get("measured"), "threads"),
                      (((cluster.doc or {}).get("meta") or {}).get("comm_bench"), "threads")):
        if isinstance(meta, dict) and isinstance(meta.get(key), int) and meta[key] >= 1:
            return meta[key]
    import torch

    if backend == "gloo":
        return max(1, (os.cpu_count() or 1) // n_ranks)
    return torch.get_num_threads()


@dataclass
class Prepared:
    """A placement applied to a captured step, simulated (:func:`prepare`)."""

    step: Any
    prog: Any
    sim: dict
    sim_graph: Graph
    tdev: dict[int, str]
    graph_from_file: bool
    sched: Any = None               # the simulator's Schedule (per-node simulated times for --node-times)


def prepare(spec: str, batch: int, placement: Placement, cluster: Cluster, *, label: str = "placement",
            config: dict | None = None, graph: Graph | None = None, graph_label: str = "graph",
            device_map: dict[str, str] | None = None, seed: int = 0, congestion: str = DEFAULT_CONGESTION,
            progress: Callable[[str], None] | None = None, step=None):
    """Capture *spec* at *batch* with real values (or take *step*, an earlier
    :func:`~celeritas_cli.run.step.capture_real` of it), check that *placement*
    (and *graph*) were made for that graph, simulate it, and build the
    :class:`~celeritas_cli.run.program.Program` in the simulated start order.
    A data-parallel placement gives a :class:`~celeritas_cli.run.data_parallel.DPPrepared`
    instead of a :class:`Prepared`.  A pipeline whose replicas shard the optimizer (``zero``) is
    prepared through its replicated-Adam twin (:func:`~.plan.without_zero`), its ``zero`` and
    simulation the plan's own.

    Raises
    ------
    InvalidInput
        Placement or graph made for another graph, an invalid placement, a bad device map.
    """
    from .plan import executable, plan_of, simulated, without_zero
    from .program import Program
    from .step import capture_real

    say = progress or (lambda msg: None)
    from .tp_run import prepare_tp, tp_recipe

    tp_steps = tp_recipe(placement, label)
    if tp_steps is not None:        # tensor parallelism (+ micro-batches, recomputation, data parallelism)
        return prepare_tp(spec, batch, placement, cluster, tp_steps, label=label, config=config, graph=graph,
                          graph_label=graph_label, device_map=device_map, seed=seed, congestion=congestion,
                          progress=progress, step=step)
    zero_plan = placement
    placement, zero = without_zero(placement)     # a pipeline with ZeRO: its replicated-Adam twin, and the stage
    placement = executable(placement, cluster, label)
    kind, recipe = plan_of(placement, label)
    if kind != "plain":
        kw = dict(label=label, config=config, graph=graph, graph_label=graph_label, device_map=device_map, seed=seed,
                  congestion=congestion, progress=progress, step=step)
        if kind == "derived":       # micro-batches, pipelines, recomputation (+ data parallelism)
            from .plan import prepare_derived

            pre = prepare_derived(spec, batch, placement, cluster, recipe, **kw)
            if zero:                # the exported program shards Adam (pipe_export); the simulated step is the plan's
                pre.zero = zero
                pre.sim, pre.sim_graph, _ = simulated(pre.steps_by_size[batch], zero_plan, cluster, label=label,
                                                      graph=graph, graph_label=graph_label, congestion=congestion)
            return pre
        if kind == "fsdp":          # sharded data parallelism
            from .fsdp_run import prepare_fsdp

            return prepare_fsdp(spec, batch, placement, cluster, recipe, **kw)
        from .data_parallel import prepare_dp

        return prepare_dp(spec, batch, placement, cluster, recipe, **kw)
    if step is None:
        say(f"capturing {spec} at batch {batch} with real parameters (seed {seed})")
        step = capture_real(spec, batch, config=config, seed=seed)
    check_same_graph(step.doc, placement, label)
    sim, sim_graph, sched = simulated(step, placement, cluster, label=label, graph=graph, graph_label=graph_label,
                                      congestion=congestion)
    device_of = [cluster.index[placement.assignment[nid]] for nid in step.sm.ids]
    prog = Program(step, device_of, _sequence(step, sim_graph, sched))
    tdev = default_device_map(cluster, prog.devices, device_map)
    return Prepared(step=step, prog=prog, sim=sim, sim_graph=sim_graph, tdev=tdev, graph_from_file=graph is not None,
                    sched=sched)


def run_placement(spec: str, batch: int, placement: Placement, cluster: Cluster, *, label: str = "placement",
                  config: dict | None = None, graph: Graph | None = None, graph_label: str = "graph",
                  device_map: dict[str, str] | None = None, backend: str = "local", steps: int = 5,
                  warmup: int = 1, seed: int = 0, threads: int | None = None, congestion: str = DEFAULT_CONGESTION,
                  rtol: float = 1.0e-4, atol: float = 1.0e-5, timeout: float = 1800.0,
                  progress: Callable[[str], None] | None = None, prepared: Prepared | None = None,
                  node_times: bool = False, launcher: Callable | None = None) -> dict:
    """Execute *placement* of the training step of model *spec* at *batch* and
    compare it with the unplaced step and with the simulator.

    Parameters
    ----------
    spec, batch, config, seed : the model (:func:`~celeritas_cli.run.step.capture_real`).
    placement, label : the placement and its name in messages.
    cluster : the cluster the placement was made for (devices, links for the simulation).
    graph, graph_label : the graph file the placement was made for (its costs are
        simulated); default: the captured graph (roofline costs).
    device_map : cluster device id -> torch device (default: ``cuda:i`` if present, else ``cpu``).
    backend : ``local`` (one process, copies between devices) or ``gloo`` (one process per device;
        NCCL when every device is a distinct GPU).
    steps, warmup : timed steps (median reported) and warm-up steps (>= 1; the first step is the
        one checked against the unplaced step).
    threads : torch intra-op threads per process (gloo default: CPUs / processes).
    congestion : the simulator's link rule.
    rtol, atol : tolerance of the numerics check (``torch.allclose`` semantics).
    timeout : seconds the gloo processes may take in all.
    progress : callable taking one line, for progress on stderr.
    prepared : the result of :func:`prepare` when the caller already has it.
    node_times : also report every node's and transfer's measured time next to the simulated one
        (the ``node_times`` section, :mod:`.timing`; what ``placer calibrate`` reads).
    launcher : starts the gloo ranks (:func:`~celeritas_cli.profile.launch.launch`'s signature); under
        torchrun the ranks are the torchrun processes (:mod:`.torchrun`).

    Returns
    -------
    dict, the ``placer.run/v1`` report (:mod:`.report`).

    Raises
    ------
    InvalidInput
        Placement or graph made for another graph, bad device map, a failed worker.

    Example (not run: needs torch)::

        report = run_placement("tensor_holography", 2, placement, cluster, backend="gloo")
        assert report["match"]
    """
    from .report import build_report, compare, load_average

    say = progress or (lambda msg: None)
    if backend not in BACKENDS:
        raise InvalidInput(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if steps < 1 or warmup < 1:
        raise InvalidInput(f"--steps and --warmup must be >= 1, got {steps} and {warmup}")
    pre = prepared or prepare(spec, batch, placement, cluster, label=label, config=config, graph=graph,
                              graph_label=graph_label, device_map=device_map, seed=seed, congestion=congestion,
                              progress=progress)
    from .plan import DerivedPrepared
    from .tp_run import TPPrepared

    if isinstance(pre, TPPrepared):
        return _run_tp(pre, placement, cluster, label=label, backend=backend, steps=steps, warmup=warmup,
                       threads=threads, timeout=timeout, rtol=rtol, atol=atol, congestion=congestion,
                       progress=progress, node_times=node_times, launcher=launcher)
    if isinstance(pre, DerivedPrepared):
        from .derived_run import run_derived

        if launcher is not None:
            raise InvalidInput(f"{label}: under torchrun placer run executes plain and data-parallel placements; "
                               f"run a micro-batched or pipelined plan with --backend gloo")
        if pre.zero:                # ZeRO over the pipeline's replicas: the exported program's ranks
            from .derived_run import run_zero_pipeline
            from .report import load_average

            if backend != "gloo":
                raise InvalidInput(f"{label}: a pipeline whose replicas shard the optimizer (zero={pre.zero}) runs "
                                   f"with --backend gloo (one process per rank)")
            n = len(pre.devices)
            report = run_zero_pipeline(pre, placement, cluster, label=label, steps=steps, warmup=warmup,
                                       threads=default_threads("gloo", n, threads, pre.sim_graph, cluster),
                                       timeout=timeout, rtol=rtol, atol=atol, congestion=congestion,
                                       load=load_average(), progress=progress)
            if node_times:
                _keep_plan(report, placement, "pipelines with ZeRO")
            return report
        n_threads = default_threads(backend, len(pre.devices), threads, pre.sim_graph, cluster)
        report = run_derived(pre, placement, cluster, label=label, backend=backend, steps=steps, warmup=warmup,
                        threads=n_threads, timeout=timeout, rtol=rtol, atol=atol, congestion=congestion,
                        load=load_average(), seed=seed, progress=progress)
        if node_times:
            _keep_plan(report, placement, "micro-batched or pipelined plans (plain and data-parallel placements "
                                          "only)")
        report["plan"] = "micro-batched"
        return report
    from .fsdp_run import FSDPPrepared

    if isinstance(pre, FSDPPrepared):
        return _run_fsdp(pre, placement, cluster, label=label, backend=backend, steps=steps, warmup=warmup,
                         threads=threads, timeout=timeout, rtol=rtol, atol=atol, congestion=congestion,
                         progress=progress, node_times=node_times, launcher=launcher)
    if not isinstance(pre, Prepared):
        return _run_data_parallel(pre, placement, cluster, label=label, backend=backend, steps=steps, warmup=warmup,
                                  threads=threads, timeout=timeout, rtol=rtol, atol=atol, congestion=congestion,
                                  progress=progress, node_times=node_times, launcher=launcher)
    step, prog, tdev = pre.step, pre.prog, pre.tdev
    n_threads = default_threads(backend, len(prog.devices), threads, pre.sim_graph, cluster)
    load = load_average()
    ref, measured, dist_backend = _execute(pre, cluster, backend=backend, steps=steps, warmup=warmup, seed=seed,
                                           threads=n_threads, timeout=timeout, say=say, node_times=node_times,
                                           launcher=launcher)
    numerics = compare(measured["loss"], measured["params"], ref, rtol=rtol, atol=atol)
    counts = {d: prog.device_of.count(d) for d in prog.devices}
    report = build_report(step=step, counts=counts, placement=placement, label=label, cluster=cluster, sim=pre.sim,
                          sim_graph=pre.sim_graph, graph_from_file=pre.graph_from_file, tdev=tdev, backend=backend,
                          dist_backend=dist_backend, threads=n_threads, steps=steps, warmup=warmup,
                          numerics=numerics, measured=measured, congestion=congestion, load=load)
    report["plan"] = "placement"
    if node_times:
        from .timing import placement_doc, section

        info = {t.index: (prog.tensor_name(t), t.src, t.dst, t.nbytes) for t in prog.transfers}
        report["node_times"] = section(measured["timing"], node_id=lambda v, d: step.sm.ids[v],
                                       device_id=lambda d: cluster.ids[d], batch=step.batch, transfers=info,
                                       sched=pre.sched, sim_graph=pre.sim_graph)
        report["node_times"]["placement"] = placement_doc(placement)
    return report


def _execute(pre: Prepared, cluster: Cluster, *, backend: str, steps: int, warmup: int, seed: int, threads: int,
             timeout: float, say: Callable[[str], None], node_times: bool = False, launcher=None):
    """Run the unplaced reference step, then the placed step (one process, or one per device);
    returns ``(reference, measured, dist_backend or None)``.  torch's thread count is restored after."""
    from .executor import LocalChannel, Runner, measure_local, torch_threads
    from .reference import reference_step

    prog, tdev, used = pre.prog, pre.tdev, pre.prog.devices
    ref_dev = tdev[used[0]]
    with torch_threads(threads):
        say(f"running the unplaced step on {ref_dev} ({threads} thread(s))")
        ref = reference_step(pre.step, ref_dev, seed=seed)
        where = ", ".join(f"{cluster.ids[d]}={tdev[d]}" for d in used)
        if backend == "local":
            say(f"running {len(prog.sequence)} nodes on {where} in one process: 1 checked step, "
                f"{warmup - 1} more warm-up, {steps} timed")
            channel = LocalChannel(tdev)
            runner = Runner(prog, tdev, prog.devices, channel, rng_states=ref.rng_states, node_times=node_times)
            return ref, measure_local(runner, channel, steps=steps, warmup=warmup, node_times=node_times), None
        from .dist import merge_ranks, run_processes

        job = dist_job(pre, ref.rng_states, steps=steps, warmup=warmup, threads=threads, timeout=timeout,
                       node_times=node_times)
        say(f"starting {len(used)} processes ({job['dist_backend']}: {where}; {threads} thread(s) each): "
            f"1 checked step, {warmup - 1} more warm-up, {steps} timed")
        return ref, merge_ranks(run_processes(job, timeout=timeout, launcher=launcher)), job["dist_backend"]


def _run_data_parallel(pre, placement, cluster, *, label, backend, steps, warmup, threads, timeout, rtol, atol,
                       congestion, progress, node_times=False, launcher=None) -> dict:
    from .data_parallel import run_dp
    from .report import load_average

    if backend != "gloo":
        raise InvalidInput(f"{label}: a data-parallel placement runs with --backend gloo (one process per replica)")
    n_threads = default_threads("gloo", pre.k, threads, pre.sim_graph, cluster)
    report = run_dp(pre, placement, cluster, label=label, steps=steps, warmup=warmup, threads=n_threads,
                    timeout=timeout, rtol=rtol, atol=atol, congestion=congestion, load=load_average(),
                    progress=progress, node_times=node_times, launcher=launcher)
    report["batch_size"] = pre.global_batch if pre.scaling == "strong" else pre.replica_batch
    report["plan"] = "data-parallel"
    report["data_parallel"] = {"replicas": pre.k, "scaling": pre.scaling, "replica_batch": pre.replica_batch,
                               "global_batch": pre.global_batch}
    return report


def _run_fsdp(pre, placement, cluster, *, label, backend, steps, warmup, threads, timeout, rtol, atol, congestion,
              progress, node_times, launcher) -> dict:
    from .fsdp_run import run_fsdp
    from .report import load_average

    if backend != "gloo":
        raise InvalidInput(f"{label}: an fsdp placement runs with --backend gloo (one process per replica)")
    if launcher is not None:
        raise InvalidInput(f"{label}: under torchrun placer run executes plain and data-parallel placements; run an "
                           f"fsdp plan with --backend gloo")
    report = run_fsdp(pre, placement, cluster, label=label, steps=steps, warmup=warmup,
                      threads=default_threads("gloo", pre.k, threads, pre.sim_graph, cluster), timeout=timeout,
                      rtol=rtol, atol=atol, congestion=congestion, load=load_average(), progress=progress)
    report["plan"] = "fsdp"
    if node_times:
        _keep_plan(report, placement, "fsdp plans")
    return report


def _run_tp(pre, placement, cluster, *, label, backend, steps, warmup, threads, timeout, rtol, atol, congestion,
            progress, node_times, launcher) -> dict:
    from .report import load_average
    from .tp_run import run_tp

    if backend != "gloo":
        raise InvalidInput(f"{label}: a tensor-parallel plan runs with --backend gloo (one process per rank)")
    if launcher is not None:
        raise InvalidInput(f"{label}: under torchrun placer run executes plain and data-parallel placements; run a "
                           f"tensor-parallel plan with --backend gloo, or launch the program placer export writes")
    report = run_tp(pre, placement, cluster, label=label, steps=steps, warmup=warmup,
                    threads=default_threads("gloo", pre.k, threads, pre.sim_graph, cluster), timeout=timeout,
                    rtol=rtol, atol=atol, congestion=congestion, load=load_average(), progress=progress)
    if node_times:
        _keep_plan(report, placement, "tensor-parallel plans")
    return report


def _keep_plan(report: dict, placement, what: str) -> None:
    """``--node-times`` of a plan whose executor times no nodes: say so, and keep the plan that ran
    (``ran_placement``) so that it can be simulated again under calibrated files."""
    from .timing import placement_doc

    report["notes"].append(f"--node-times: per-node times are not recorded for {what}; ran_placement keeps the plan")
    report["ran_placement"] = placement_doc(placement)


def dist_job(pre: Prepared, rng_states: dict, *, steps: int, warmup: int, threads: int, timeout: float,
             node_times: bool = False) -> dict:
    """What every rank of ``--backend gloo`` needs (:func:`celeritas_cli.run.dist.rank_main`): the
    model to capture, the placement as device and sequence lists, the torch device of each rank,
    the generator states to replay.  NCCL when every device is a distinct GPU, else gloo."""
    from .checks import job_core

    prog = pre.prog
    job = job_core(pre.step, prog.devices, pre.tdev, rng_states, steps=steps, warmup=warmup, threads=threads,
                   timeout=timeout)
    job.update(batch=pre.step.batch, device_of=prog.device_of, sequence=prog.sequence, node_times=node_times)
    return job
