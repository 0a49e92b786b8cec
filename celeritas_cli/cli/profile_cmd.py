"""``placer profile``: make graph files (and cluster fits).  Thin layer over
:mod:`celeritas_cli.profile`."""

from __future__ import annotations

from dataclasses import replace

import click

from ..errors import InvalidInput
from ..profile.request import ProfileRequest, fit_lines, make, summary_line
from .common import emit, output_option, seed_option, stderr_console


def _sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 2,4,8, got {text!r}",
                                 param_hint="--batch-sizes") from None


def _config(pairs: tuple[str, ...]) -> dict:
    out: dict = {}
    for item in pairs:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--config")
        k, v = item.split("=", 1)
        for conv in (int, float):
            try:
                out[k.strip()] = conv(v)
                break
            except ValueError:
                continue
        else:
            out[k.strip()] = {"true": True, "false": False}.get(v.strip().lower(), v.strip())
    return out


@click.command("profile")
@click.option("--model", "model", metavar="NAME|module:attr|file.py:attr", default=None,
              help="Zoo model (inception_v3, nmt, transformer, tensor_holography, resnet50, gpt_1.3b, gpt_6.7b), "
                   "or module:attr / "
                   "path/to/file.py:attr, a callable returning an nn.Module with example_inputs(batch) -> forward "
                   "args, and optionally example_target(batch) and loss(output, target) [needs torch].")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=None,
              help="Batch size to capture (default: the paper's, e.g. transformer 256, inception_v3 512).")
@click.option("--phase", type=click.Choice(["training", "inference"]), default="training", show_default=True,
              help="Capture forward+loss+backward+Adam update, or the forward only.")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default=None,
              help="fp32, or mixed precision as torch.autocast trains: bf16/fp16 matmuls and attention priced at "
                   "the tensor-core peak (x 0.60), fp32 master weights and Adam state, fp16 with a loss scale; "
                   "meta.precision. Default: fp32, bf16 for the gpt_* zoo models.")
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
              help="Constructor argument of the model, e.g. --config layers=4 --config seq=32.")
@click.option("--batch-sizes", metavar="B1,B2,...", default=None,
              help="Standard Evaluation (Celeritas 4.2.1): capture (with --measure: time) at these batches (>= 2) "
                   "and fit per-node lines a + b*batch (batch_line: what data parallelism and micro-batching read); "
                   "the graph is for --target-batch, else --batch-size, else the largest of them.")
@click.option("--target-batch", type=click.IntRange(min=1), default=None,
              help="Batch size to extrapolate the graph to (a measured batch keeps its measured values).")
@click.option("--from-measurements", "measurements", metavar="FILE", default=None,
              help="Standard Evaluation from a placer.measurements/v1 JSON of per-node values at several batch "
                   "sizes (no torch; format: docs/design.md, example: examples/measurements.json).")
@click.option("--measure", is_flag=True, help="Time each node on the local device (CUDA if present, else CPU) "
                                              "instead of the roofline, min of 5 after 2 warm-ups.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads while measuring (--measure, --comm-bench --processes): on CPUs, use the threads "
                   "each `placer run --backend gloo` process gets (CPUs / processes).")
@click.option("--comm-fit", "comm_fit", metavar="FILE", default=None,
              help="Fit t = k*d + b per device pair from placer.comm_samples/v1 (bytes, seconds) samples; "
                   "writes a placer.cluster/v1 file.")
@click.option("--comm-bench", is_flag=True, help="Measure the samples for --comm-fit on this machine's CUDA GPUs "
                                                 "(needs two or more) and write the fitted cluster.")
@click.option("--processes", type=click.IntRange(min=2), default=None,
              help="With --comm-bench: measure torch.distributed transfers between this many processes instead "
                   "(gloo on CPUs, NCCL with one GPU each when there are enough): the devices of "
                   "`placer run --backend gloo`.")
@click.option("--synthetic", type=click.Choice(["layered"]), default=None,
              help="Deterministic DNN-like synthetic graph instead of a model (no torch).")
@click.option("--nodes", "-n", type=click.IntRange(1, 10_000_000), default=1000, show_default=True,
              help="Nodes of the synthetic graph.")
@seed_option
@output_option
def profile(model, batch_size, phase, precision, config, batch_sizes, target_batch, measurements, measure, threads,
            comm_fit, comm_bench, processes, synthetic, nodes, seed, output):
    """Write a placer.graph/v1 file from a PyTorch model (or a synthetic
    graph), or a placer.cluster/v1 file from transfer measurements.

    \b
    Examples:
      placer profile --model transformer --batch-size 256 > transformer.json
      placer profile --model gpt_1.3b -b 8 -o gpt.json.gz          # bf16, 24 layers, sequence 2048
      placer profile --model transformer -b 64 --precision bf16 -o t_bf16.json
      placer profile --model transformer | placer coarsen - | placer place --algo adjusting
      placer profile --model resnet50 --batch-sizes 2,4,8 --target-batch 512 -o r50_b512.json
      placer profile --model tensor_holography -b 8 --batch-sizes 4,8 --measure --threads 1 -o th.json
      placer profile --model mypkg.models:build_net --config width=2 -b 64 --phase inference
      placer profile --model examples/tiny_mlp.py:TinyMLP -b 32 -o mlp.json
      placer profile --from-measurements meas.json --target-batch 512 -o big.json
      placer profile --comm-fit samples.json -o cluster.json
      placer profile --comm-bench --processes 2 -o cpu2.json        # devices of placer run --backend gloo
      placer profile --model tensor_holography -b 2 --measure --threads 1 -o th.json
      placer profile --synthetic layered --nodes 36000 --seed 1 > g.json

    Only the JSON document goes to stdout; progress and the fit report go to stderr.
    """
    req = ProfileRequest(model=model, batch_size=batch_size, phase=phase, precision=precision,
                         target_batch=target_batch,
                         measurements=measurements, measure=measure, threads=threads, comm_fit=comm_fit,
                         comm_bench=comm_bench, processes=processes, synthetic=synthetic, nodes=nodes, seed=seed)
    if req.sources() == ["--model"] and processes is None:   # parsed only where they are used
        req = replace(req, batch_sizes=_sizes(batch_sizes), config=_config(config))
    problem = req.usage_problem()
    if problem:
        raise click.UsageError(problem)
    console = stderr_console()

    def progress(msg: str) -> None:
        console.print(f"placer profile: {msg}")

    res = make(req, progress)
    if res.kind == "cluster":
        for line in fit_lines(res.doc):
            progress(line)
    else:
        _report(res, console, progress)
    emit(res.doc, output)


def _report(res, console, progress) -> None:
    """The Standard Evaluation deviation (or why there is none) and the graph's summary, on stderr."""
    from ..profile.regression import print_deviation

    if res.table is not None:
        print_deviation(res.table, title=f"Standard Evaluation fit, per-node relative deviation ({res.how}); "
                                         f"cf. Celeritas Table 5", console=console)
    elif res.how:
        progress(f"no deviation report: {res.how}")
    try:
        progress(summary_line(res.doc))
    except InvalidInput as exc:
        raise InvalidInput(f"profile produced an invalid graph (a bug, please report): {exc}") from None
