"""``placer run``: execute a placement of a PyTorch training step and check
it against the unplaced step and the simulator.  Thin layer over
:mod:`celeritas_cli.run`."""

from __future__ import annotations

import sys

import click

from .common import (
    congestion_option,
    emit,
    nonnegative_finite,
    one_line,
    output_option,
    positive_seconds,
    stderr_console,
)
from .placed_step import check_exportable, load_inputs, placed_step_options, prepare_step, write_source


@click.command("run", context_settings={"max_content_width": 100})
@placed_step_options
@click.option("--backend", type=click.Choice(["local", "gloo"]), default=None,
              help="local (default): one process, explicit copies between devices; gloo: one process per device "
                   "with torch.distributed (NCCL when every device is a distinct GPU); under torchrun always "
                   "gloo, the torchrun processes being the devices.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed steps (the median is reported).")
@click.option("--warmup", type=click.IntRange(min=1), default=1, show_default=True,
              help="Warm-up steps before timing; the first one is checked against the unplaced step.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads per process (default: those --graph was measured with, else those of the "
                   "cluster's --comm-bench, else CPUs / processes for gloo and torch's default for local).")
@congestion_option("Link rule of the simulation it is compared with.")
@click.option("--rtol", type=float, default=1.0e-4, show_default=True, callback=nonnegative_finite,
              help="Relative tolerance of the check (finite, >= 0).")
@click.option("--atol", type=float, default=1.0e-5, show_default=True, callback=nonnegative_finite,
              help="Absolute tolerance of the check (finite, >= 0).")
@click.option("--timeout", type=float, default=1800.0, show_default=True, callback=positive_seconds,
              help="Seconds the gloo processes may take in all (at most 1e12).")
@click.option("--node-times", is_flag=True,
              help="Also report every node's and transfer's measured time (median of the timed steps) next to the "
                   "simulated one: the node_times section placer calibrate fits from.")
@click.option("--export", "export_path", metavar="FILE.py", default=None,
              help="Also write the placed step as Python source (as placer export --format torch).")
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json", show_default=True,
              help="json: the placer.run/v1 report; table: a summary for people on stdout.")
@output_option
def run(model, batch_size, config, placement_path, graph_path, cluster_path, device_map, seed, backend, steps,
        warmup, threads, congestion, rtol, atol, timeout, node_times, export_path, fmt, output):
    """Execute a placement of a model's training step with PyTorch, every
    operator on its placed device, and report whether the loss and updated
    parameters equal the unplaced step's (match), the measured step time
    next to the simulated one, busy time per device and bytes per link.
    Exit code 1 when the numerics do not match. Needs torch.

    A micro-batched or pipelined placement (GPipe, 1F1B or interleaved
    orders; recomputation; data parallelism x pipeline) runs node by node
    of its derived graph, micro-batches on their samples, gradients
    accumulated; the report's microbatch object says the schedule and the
    yardstick (the whole batch, or per micro-batch for BatchNorm).

    An fsdp placement (place --algo fsdp, ZeRO stages 1-3) runs with
    --backend gloo, one process per replica holding its chunk of every
    unit's parameters and Adam state (stage 3 all-gathers a unit before its
    forward and its backward), gradients reduce-scattered; the report's fsdp
    object says what was sharded.

    \b
    Examples:
      placer profile --model tensor_holography -b 2 -o th.json
      placer place th.json --algo metis --cluster 4xV100-pcie -o p.json
      placer run --graph th.json -P p.json --device-map gpu0=cpu,gpu1=cpu --format table
      placer run --model tensor_holography -b 2 -P p.json --backend gloo -o report.json
      placer run --model mypkg.models:Net --config width=2 -b 8 -P p.json --export placed.py
      placer run --graph th.json -P p.json --cluster cpu2.json --backend gloo --node-times -o r.json
      placer place th.json --algo fsdp -p stage=3 --cluster cpu2.json -o f.json
      placer run --graph th.json -P f.json --cluster cpu2.json --backend gloo --format table

    For a fair comparison of measured and simulated times on CPU processes,
    profile the graph with --measure and the cluster with --comm-bench
    (see docs/running.md).  Under torchrun (torchrun --nproc-per-node 2
    -m celeritas_cli run ...) every process runs one device, on one host or
    several; rank 0 writes the report.
    """
    from ..run.api import run_placement
    from ..run.torchrun import under_torchrun

    if under_torchrun():
        if backend == "local" or device_map:
            raise click.UsageError("under torchrun each process runs one device (cuda:LOCAL_RANK, else the CPU): "
                                   "--backend local and --device-map do not apply")
        return _torchrun(model, batch_size, config, placement_path, graph_path, cluster_path, seed, steps, warmup,
                         threads, congestion, rtol, atol, timeout, node_times, export_path, fmt, output)
    pre, inp, say = prepare_step("run", model, batch_size, config, placement_path, graph_path, cluster_path,
                                 device_map, seed, congestion)
    label = inp.label
    if export_path:
        check_exportable(pre, label)
    report = run_placement(inp.spec, inp.batch, inp.placement, inp.cluster, label=label, backend=backend or "local",
                           steps=steps, warmup=warmup, seed=seed, threads=threads, congestion=congestion, rtol=rtol,
                           atol=atol, timeout=timeout, progress=say, prepared=pre, node_times=node_times)
    _finish(report, pre, inp, export_path, fmt, output, rtol, atol, say)


def _torchrun(model, batch_size, config, placement_path, graph_path, cluster_path, seed, steps, warmup, threads,
              congestion, rtol, atol, timeout, node_times, export_path, fmt, output) -> None:
    """``placer run`` in a torchrun process (:mod:`celeritas_cli.run.torchrun`): rank 0 loads the inputs,
    runs and reports; the other ranks run their device and write nothing."""
    import os

    from ..profile.capture import require_torch
    from ..run.api import prepare, run_placement
    from ..run.torchrun import Session, launcher, worker

    require_torch()
    console = stderr_console()

    def say(msg: str) -> None:
        console.print(f"placer run: {msg}")

    with Session(timeout) as session:
        if session.rank != 0:
            worker(session)
            return
        try:
            inp = load_inputs(model, batch_size, config, placement_path, graph_path, cluster_path, say)
            pre = prepare(inp.spec, inp.batch, inp.placement, inp.cluster, label=inp.label, config=inp.config,
                          graph=inp.graph, graph_label=inp.graph_label,
                          device_map={did: "cpu" for did in inp.cluster.ids}, seed=seed, congestion=congestion,
                          progress=say)
            if export_path:
                check_exportable(pre, inp.label)
            ranks = pre.prog.devices if hasattr(pre, "prog") else pre.devices     # rank r runs ranks[r]
            # (a micro-batched plan is refused by run_placement below, before any rank is given work)
            pre.tdev = {d: session.devices[r] if r < session.world else "cpu" for r, d in enumerate(ranks)}
            if threads is None:
                threads = max(1, (os.cpu_count() or 1) // max(1, session.local_world))
        except Exception as exc:
            session.abort(one_line(str(exc) or type(exc).__name__))
            raise
        say(f"torchrun: {session.world} processes ({session.kind}: {', '.join(session.devices)})")
        try:
            report = run_placement(inp.spec, inp.batch, inp.placement, inp.cluster, label=inp.label,
                                   backend="gloo", steps=steps, warmup=warmup, seed=seed, threads=threads,
                                   congestion=congestion, rtol=rtol, atol=atol, timeout=timeout, progress=say,
                                   prepared=pre, node_times=node_times, launcher=launcher(session))
        except Exception as exc:       # before the job was handed out, the other ranks still wait for it
            session.abort(one_line(str(exc) or type(exc).__name__))
            raise
        report["launcher"] = "torchrun"
        _finish(report, pre, inp, export_path, fmt, output, rtol, atol, say)


def _finish(report, pre, inp, export_path, fmt, output, rtol, atol, say) -> None:
    """Export, print or write the report; exit 1 when the numerics differ."""
    label = inp.label
    if export_path:
        write_source(pre, inp, export_path, say)
    if fmt == "table":
        from ..run.report import render_table

        render_table(report)
        if output != "-":
            emit(report, output)
    else:
        emit(report, output)
    if not report["match"]:
        print(one_line(f"Error: {label}: the placed step differs from the unplaced step (loss |diff| "
                       f"{report['loss_max_abs_diff']:.3g}, parameters max |diff| {report['params_max_abs_diff']:.3g}, "
                       f"rtol {rtol:g}, atol {atol:g})"), file=sys.stderr)
        raise SystemExit(1)
