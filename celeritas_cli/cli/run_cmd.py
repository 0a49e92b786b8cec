"""``placer run``: execute a placement of a PyTorch training step and check
it against the unplaced step and the simulator.  Thin layer over
:mod:`celeritas_cli.run`."""

from __future__ import annotations

import sys

import click

from ..errors import InvalidInput
from ..model.io import bundled_cluster_names, load_graph, load_placement
from ..model.jsonio import label_of, write_bytes
from ..sim.simulator import CONGESTION_RULES
from .common import emit, get_cluster, output_option, seed_option, stderr_console


def parse_device_map(text: str | None) -> dict[str, str]:
    """``"gpu0=cuda:0,gpu1=cpu"`` -> ``{"gpu0": "cuda:0", "gpu1": "cpu"}`` (usage error otherwise)."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise click.BadParameter(f"expected DEVICE=TORCH_DEVICE pairs like gpu0=cuda:0,gpu1=cpu, got {item!r}",
                                     param_hint="--device-map")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def placed_step_options(fn):
    """Options shared by ``run`` and ``export``: the model, the placement, the graph, the cluster."""
    opts = [
        click.option("--model", "model", metavar="NAME|module:attr|file.py:attr", default=None,
                     help="The model the placement was made for (zoo name, module:attr, or path/to/file.py:attr). "
                          "Default: the one --graph was profiled from."),
        click.option("--batch-size", "-b", type=int, default=None,
                     help="Batch size to capture (default: --graph's)."),
        click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
                     help="Constructor argument of the model (default: --graph's)."),
        click.option("--placement", "-P", "placement_path", required=True, metavar="FILE|-",
                     help="The placement (placer.placement/v1) to execute."),
        click.option("--graph", "-g", "graph_path", metavar="FILE", default=None,
                     help="The graph file the placement was made for: its node ids must match the capture, and its "
                          "costs are simulated (default: the captured graph, roofline costs)."),
        click.option("--cluster", "-c", "cluster_path", metavar="FILE|NAME", default=None,
                     help="Cluster the placement was made for. Default: the placement's cluster if it is a bundled "
                          "one, else 4xV100-pcie."),
        click.option("--device-map", "device_map", metavar="DEV=TORCH,...", default=None,
                     help="Torch device of each cluster device, e.g. gpu0=cuda:0,gpu1=cpu. Default: device i -> "
                          "cuda:i when this machine has it, else cpu."),
        seed_option,
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def check_exportable(pre, label: str) -> None:
    """Export writes one process's placed step; a data-parallel placement is not one."""
    from ..run.api import Prepared

    if not isinstance(pre, Prepared):
        raise InvalidInput(f"{label}: a data-parallel placement is not exported (it is one model per process: use "
                           f"torch DistributedDataParallel); run it with placer run --backend gloo")


def load_inputs(model, batch_size, config, placement_path, graph_path, cluster_path, say):
    """Resolve the model / batch / config (from --graph's meta when not given), the placement,
    graph and cluster.  Returns ``(spec, batch, config, placement, label, graph, graph_label, cluster)``."""
    from .profile_cmd import _config

    if placement_path == "-" and graph_path == "-":
        raise click.UsageError("--placement and --graph cannot both be stdin")
    placement = load_placement(placement_path)
    label = label_of(placement_path)
    graph = load_graph(graph_path) if graph_path else None
    meta = graph.meta if graph is not None else {}
    cfg = _config(config) if config else dict(meta.get("config") or {})
    source = str(meta.get("source") or "")
    if model is None:
        if not source.startswith("profile torch:"):
            raise click.UsageError("--model is required (or --graph from `placer profile --model ...`)")
        model = source.removeprefix("profile torch:")
        say(f"model {model} (from {graph_path})")
    if batch_size is None:
        if not isinstance(meta.get("batch_size"), int):
            raise click.UsageError("--batch-size is required (or --graph from `placer profile --model ...`)")
        batch_size = meta["batch_size"]
        say(f"batch size {batch_size} (from {graph_path})")
    if cluster_path is None and placement.cluster in bundled_cluster_names():
        cluster = get_cluster(placement.cluster, quiet=True)
    else:
        cluster = get_cluster(cluster_path)
    return model, batch_size, cfg, placement, label, graph, (label_of(graph_path) if graph_path else "graph"), cluster


@click.command("run", context_settings={"max_content_width": 100})
@placed_step_options
@click.option("--backend", type=click.Choice(["local", "gloo"]), default=None,
              help="local (default): one process, explicit copies between devices; gloo: one process per device "
                   "with torch.distributed (NCCL when every device is a distinct GPU); under torchrun always "
                   "gloo, the torchrun processes being the devices.")
@click.option("--steps", type=int, default=5, show_default=True, help="Timed steps (the median is reported).")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Warm-up steps before timing; the first one is checked against the unplaced step.")
@click.option("--threads", type=int, default=None,
              help="torch threads per process (default: those --graph was measured with, else those of the "
                   "cluster's --comm-bench, else CPUs / processes for gloo and torch's default for local).")
@click.option("--congestion", type=click.Choice(CONGESTION_RULES), default="channel", show_default=True,
              help="Link rule of the simulation it is compared with.")
@click.option("--rtol", type=float, default=1.0e-4, show_default=True, help="Relative tolerance of the check.")
@click.option("--atol", type=float, default=1.0e-5, show_default=True, help="Absolute tolerance of the check.")
@click.option("--timeout", type=float, default=1800.0, show_default=True,
              help="Seconds the gloo processes may take in all.")
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

    \b
    Examples:
      placer profile --model tensor_holography -b 2 -o th.json
      placer place th.json --algo metis --cluster 4xV100-pcie -o p.json
      placer run --graph th.json -P p.json --device-map gpu0=cpu,gpu1=cpu --format table
      placer run --model tensor_holography -b 2 -P p.json --backend gloo -o report.json
      placer run --model mypkg.models:Net --config width=2 -b 8 -P p.json --export placed.py
      placer run --graph th.json -P p.json --cluster cpu2.json --backend gloo --node-times -o r.json

    For a fair comparison of measured and simulated times on CPU processes,
    profile the graph with --measure and the cluster with --comm-bench
    (see README, "placer run").  Under torchrun (torchrun --nproc-per-node 2
    -m celeritas_cli run ...) every process runs one device, on one host or
    several; rank 0 writes the report.
    """
    from ..profile.capture import require_torch
    from ..run.torchrun import under_torchrun

    require_torch()
    console = stderr_console()

    def say(msg: str) -> None:
        console.print(f"placer run: {msg}")

    if under_torchrun():
        if backend == "local" or device_map:
            raise click.UsageError("under torchrun each process runs one device (cuda:LOCAL_RANK, else the CPU): "
                                   "--backend local and --device-map do not apply")
        return _torchrun(model, batch_size, config, placement_path, graph_path, cluster_path, seed, steps, warmup,
                         threads, congestion, rtol, atol, timeout, node_times, export_path, fmt, output, say)
    backend = backend or "local"
    spec, batch, cfg, placement, label, graph, glabel, cluster = load_inputs(
        model, batch_size, config, placement_path, graph_path, cluster_path, say)
    from ..run.api import prepare, run_placement

    pre = prepare(spec, batch, placement, cluster, label=label, config=cfg, graph=graph, graph_label=glabel,
                  device_map=parse_device_map(device_map), seed=seed, congestion=congestion, progress=say)
    if export_path:
        check_exportable(pre, label)
    report = run_placement(spec, batch, placement, cluster, label=label, backend=backend, steps=steps,
                           warmup=warmup, seed=seed, threads=threads, congestion=congestion, rtol=rtol, atol=atol,
                           timeout=timeout, progress=say, prepared=pre, node_times=node_times)
    _finish(report, pre, placement, cluster, label, export_path, fmt, output, rtol, atol, say)


def _torchrun(model, batch_size, config, placement_path, graph_path, cluster_path, seed, steps, warmup, threads,
              congestion, rtol, atol, timeout, node_times, export_path, fmt, output, say) -> None:
    """``placer run`` in a torchrun process (:mod:`celeritas_cli.run.torchrun`): rank 0 loads the inputs,
    runs and reports; the other ranks run their device and write nothing."""
    from ..run.api import prepare, run_placement
    from ..run.torchrun import Session, launcher, worker

    with Session(timeout) as session:
        if session.rank != 0:
            worker(session)
            return
        try:
            spec, batch, cfg, placement, label, graph, glabel, cluster = load_inputs(
                model, batch_size, config, placement_path, graph_path, cluster_path, say)
            pre = prepare(spec, batch, placement, cluster, label=label, config=cfg, graph=graph, graph_label=glabel,
                          device_map={did: "cpu" for did in cluster.ids}, seed=seed, congestion=congestion,
                          progress=say)
            if export_path:
                check_exportable(pre, label)
            ranks = pre.prog.devices if hasattr(pre, "prog") else pre.devices     # rank r runs ranks[r]
            pre.tdev = {d: session.devices[r] if r < session.world else "cpu" for r, d in enumerate(ranks)}
            if threads is None and session.local_world > 0:
                import os

                threads = max(1, (os.cpu_count() or 1) // session.local_world)
        except Exception as exc:
            session.abort(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise
        say(f"torchrun: {session.world} processes ({session.kind}: {', '.join(session.devices)})")
        report = run_placement(spec, batch, placement, cluster, label=label, backend="gloo", steps=steps,
                               warmup=warmup, seed=seed, threads=threads, congestion=congestion, rtol=rtol,
                               atol=atol, timeout=timeout, progress=say, prepared=pre, node_times=node_times,
                               launcher=launcher(session))
        report["launcher"] = "torchrun"
        _finish(report, pre, placement, cluster, label, export_path, fmt, output, rtol, atol, say)


def _finish(report, pre, placement, cluster, label, export_path, fmt, output, rtol, atol, say) -> None:
    """Export, print or write the report; exit 1 when the numerics differ."""
    if export_path:
        from ..run.export import export_source

        src = export_source(pre.prog, cluster.ids, pre.tdev, graph=pre.sim_graph.name, cluster=cluster.name,
                            label=label, algorithm=placement.algorithm)
        write_bytes(src.encode(), export_path)
        say(f"wrote the placed step to {export_path}")
    if fmt == "table":
        from ..run.report import render_table

        render_table(report)
        if output != "-":
            emit(report, output)
    else:
        emit(report, output)
    if not report["match"]:
        print(f"Error: {label}: the placed step differs from the unplaced step (loss |diff| "
              f"{report['loss_max_abs_diff']:.3g}, parameters max |diff| {report['params_max_abs_diff']:.3g}, "
              f"rtol {rtol:g}, atol {atol:g})", file=sys.stderr)
        raise SystemExit(1)
