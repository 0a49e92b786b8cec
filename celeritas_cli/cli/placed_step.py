"""What ``placer run`` and ``placer export`` share: the options naming a
placed training step (model, batch, config, placement, graph, cluster,
device map, seed), reading them (:func:`load_inputs`), capturing and
preparing the step (:func:`prepare_step`) and writing it as Python source
(:func:`write_source`).  Both commands are thin layers over
:mod:`celeritas_cli.run`."""

from __future__ import annotations

from typing import Callable, NamedTuple

import click

from ..errors import InvalidInput
from ..model.congestion import DEFAULT_CONGESTION
from ..model.io import load_graph, load_placement
from ..model.jsonio import label_of, write_bytes
from .common import placement_cluster, seed_option, stderr_console


def parse_device_map(text: str | None) -> dict[str, str]:
    """``"gpu0=cuda:0,gpu1=cpu"`` -> ``{"gpu0": "cuda:0", "gpu1": "cpu"}`` (usage error otherwise).

    >>> parse_device_map("gpu0=cuda:0, gpu1=cpu")
    {'gpu0': 'cuda:0', 'gpu1': 'cpu'}
    """
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
        click.option("--batch-size", "-b", type=click.IntRange(min=1), default=None,
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


class Inputs(NamedTuple):
    """The resolved inputs of a placed step (:func:`load_inputs`)."""

    spec: str
    batch: int
    config: dict
    placement: object
    label: str
    graph: object | None
    graph_label: str
    cluster: object


def load_inputs(model, batch_size, config, placement_path, graph_path, cluster_path, say) -> Inputs:
    """Resolve the model / batch / config (from --graph's meta when not given), the placement,
    graph and cluster."""
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
    if graph is not None and isinstance(meta.get("batch_size"), int) and batch_size != meta["batch_size"]:
        raise click.UsageError(f"--batch-size {batch_size}, but {graph_path} holds costs for a batch of "
                               f"{meta['batch_size']} (the placement was made for it): run with -b "
                               f"{meta['batch_size']}, or profile and place the graph at batch {batch_size}")
    cluster = placement_cluster(placement, cluster_path, label)
    return Inputs(model, batch_size, cfg, placement, label, graph, label_of(graph_path) if graph_path else "graph",
                  cluster)


def prepare_step(command: str, model, batch_size, config, placement_path, graph_path, cluster_path, device_map,
                 seed, congestion: str = DEFAULT_CONGESTION) -> tuple:
    """What both commands do first: check torch, read the inputs, capture the
    step and apply the placement (:func:`celeritas_cli.run.api.prepare`).
    Returns ``(prepared, inputs, say)``; *say* prints ``placer COMMAND: ...``
    progress lines on stderr."""
    from ..profile.capture import require_torch
    from ..run.api import prepare

    require_torch()
    console = stderr_console()

    def say(msg: str) -> None:
        console.print(f"placer {command}: {msg}")

    inp = load_inputs(model, batch_size, config, placement_path, graph_path, cluster_path, say)
    pre = prepare(inp.spec, inp.batch, inp.placement, inp.cluster, label=inp.label, config=inp.config,
                  graph=inp.graph, graph_label=inp.graph_label, device_map=parse_device_map(device_map), seed=seed,
                  congestion=congestion, progress=say)
    return pre, inp, say


def check_exportable(pre, label: str) -> None:
    """Export writes one process's placed step, a pipeline or a data-parallel plan; not an fsdp plan."""
    from ..run.api import Prepared
    from ..run.data_parallel import DPPrepared
    from ..run.plan import DerivedPrepared

    from ..run.fsdp_run import FSDPPrepared

    if isinstance(pre, FSDPPrepared):
        raise InvalidInput(f"{label}: an fsdp placement is not exported (each process holds a shard of the model: "
                           f"use torch FullyShardedDataParallel); run it with placer run --backend gloo")
    if not isinstance(pre, (Prepared, DerivedPrepared, DPPrepared)):
        raise InvalidInput(f"{label}: placer export does not write this kind of placement ({type(pre).__name__}); "
                           f"run it with placer run --backend gloo")


def write_source(pre, inp: Inputs, path: str, say: Callable[[str], None] | None = None) -> None:
    """Write the placed step *pre* as Python source to *path* (``-``: stdout) and say what it wrote:
    placer's own code (:mod:`celeritas_cli.run.export`), or for a micro-batched or pipelined placement
    a ``torch.distributed.pipelining`` program where it can be (:mod:`celeritas_cli.run.derived_export`)."""
    from ..run.data_parallel import DPPrepared
    from ..run.plan import DerivedPrepared

    program = "placed.py" if path == "-" else path     # the program's name in its torchrun line
    if isinstance(pre, DerivedPrepared):
        from ..run.derived_export import export_derived

        src, what = export_derived(pre, inp.cluster, label=inp.label, algorithm=inp.placement.algorithm,
                                   program=program)
    elif type(pre) is DPPrepared:                      # not its subclass FSDPPrepared
        from ..run.pipe_export import export_dp

        src, what = export_dp(pre, inp.cluster, label=inp.label, algorithm=inp.placement.algorithm, program=program)
    else:
        from ..run.export import export_source

        src = export_source(pre.prog, inp.cluster.ids, pre.tdev, graph=pre.sim_graph.name, cluster=inp.cluster.name,
                            label=inp.label, algorithm=inp.placement.algorithm)
        what = (f"{len(pre.prog.sequence)} nodes on {len(pre.prog.devices)} device(s), {len(pre.prog.transfers)} "
                f"copies")
    write_bytes(src.encode(), path)
    if say is not None:
        say(f"wrote {'the placed step' if path == '-' else path}: {what}")
