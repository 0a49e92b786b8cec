"""``placer export``: write a placement of a PyTorch training step as Python
source (torch.fx code generation) to call in a training loop.  Thin layer
over :mod:`celeritas_cli.run.export`."""

from __future__ import annotations

import click

from .placed_step import check_exportable, placed_step_options, prepare_step, write_source


@click.command("export", context_settings={"max_content_width": 100})
@placed_step_options
@click.option("--format", "fmt", type=click.Choice(["torch"]), default="torch", show_default=True,
              help="torch: a Python module with placed_step() and a PlacedStep class (torch.fx code generation), a "
                   "torch.distributed.pipelining program for a pipeline of module segments, or an FSDP2 program for "
                   "an fsdp plan (both launched with torchrun).")
@click.option("-o", "--output", "output", metavar="FILE.py", default="-", show_default=True,
              help="Where to write the source, atomically (- = stdout).")
def export(model, batch_size, config, placement_path, graph_path, cluster_path, device_map, seed, fmt, output):
    """Write the placed training step of a model as Python source: every
    operator on its placed device, explicit copies between devices, the Adam
    update of each parameter on its device. Needs torch.

    \b
    Examples:
      placer export --graph th.json -P p.json --format torch -o placed.py
      placer export --model tensor_holography -b 2 -P p.json --device-map gpu0=cuda:0,gpu1=cuda:1 -o placed.py

    \b
    Then, in your training loop:
      import placed
      step = placed.PlacedStep(model)      # moves parameters and buffers to their devices
      loss = step(x, target=y)             # forward, backward and Adam, placed

    A pipeline placement whose stages are contiguous segments of the model's
    submodules (one microbatch step, GPipe / 1F1B / interleaved orders) is
    written as a torch.distributed.pipelining program instead (run it with
    torchrun); other micro-batched or hybrid placements as placer's own code.
    An fsdp plan (place --algo fsdp, -p stage=1|2|3) is written as one
    program on a DeviceMesh: FSDP2 fully_shard per unit of the plan (stage 3
    reshard_after_forward=True, stage 2 False), stage 1 as DDP with
    ZeroRedundancyOptimizer. stderr says what was written, and for a program
    of several processes the exact torchrun line:

    \b
      placer place g.json --algo fsdp -p stage=3 --cluster c.json -o fsdp.json
      placer export --graph g.json -P fsdp.json --cluster c.json -o fsdp.py
      torchrun --nproc-per-node 2 fsdp.py

    Every program checks its launch before the first step and stops in one
    line when it is wrong: another process count than the plan's, another
    graph file (--graph FILE, or the exported-from file where it still is)
    or cluster (--cluster), a model whose parameter names or shapes differ
    from the profiled graph's, or a model file changed since the export.
    """
    pre, inp, say = prepare_step("export", model, batch_size, config, placement_path, graph_path, cluster_path,
                                 device_map, seed)
    check_exportable(pre, inp.label)
    write_source(pre, inp, output, say)
