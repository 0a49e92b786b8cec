"""A pipeline placement as a ``torch.distributed.pipelining`` program
(``placer export``), and the pipeline schedule a placement's orders follow.

:func:`schedule_of` takes the schedule from the placement's recipe (the
``schedule`` its ``microbatch`` step records, one of
:data:`~celeritas_cli.pipelining.schedules.SCHEDULES`; never from what its
``params`` or ``estimate`` claim) and checks that the orders follow it: the
stages' ranks are the order in which the devices first run a forward node
of the captured trace, and each device's order, read as forward / backward
blocks of micro-batches, must be the rank's steps
(:meth:`~celeritas_cli.pipelining.schedules.Schedule.steps`).

:func:`pipelining_plan` says whether ``torch.distributed.pipelining`` can run
the plan as it is, exactly when all of these hold (else :func:`why_not`
names the first that fails and ``placer export`` writes placer's own code,
:mod:`.derived_export`):

1. the recipe is one ``microbatch`` step (recomputation and data
   parallelism are not expressed by a pipelining schedule);
2. the recipe names the schedule and the orders follow it
   (:func:`schedule_of`), on one device per stage (with model chunks:
   stage ``j`` on rank ``j mod p``);
3. every captured node's micro-batch copies, parameters and gradient
   accumulation are on one device: its stage;
4. the stages are contiguous module segments of a chain: in the trace's
   forward order, stage ``j > 0`` starts at the first call of a submodule
   ``P`` (its parameters are all in stage ``j``; not a ``ModuleList``), the
   forward nodes between two split points are all in one stage (ops
   without parameters before ``P``'s first call belong to the stage
   before, as ``pipeline(split_spec={P: SplitPoint.BEGINNING})`` splits),
   the loss is on the last stage, and every backward node and update is on
   the stage of the forward node it is attributed to
   (:func:`~celeritas_cli.pipelining.cuts.attribution`): autograd runs
   a stage's backward where its forward ran.

References
----------
PyTorch ``torch.distributed.pipelining`` (``pipeline``, ``SplitPoint``,
``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``); Narayanan et al., SC'21, 2.2.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..errors import InvalidInput
from ..pipelining.schedules import SCHEDULES, Schedule
from ..transform.passes import node_passes


def _blocks(prog, passes) -> dict[int, list[tuple[str, int]]]:
    """Per device: its micro-batch blocks ``(F | B, i)`` in the order it runs them."""
    out: dict[int, list] = {d: [] for d in prog.devices}
    for x in prog.sequence:
        info = prog.infos[x]
        if info.i is None or info.kind in ("weights", "ring"):
            continue
        back = info.kind in ("accum", "recompute") or passes[info.v] != "forward"
        blk = ("B" if back else "F", info.i)
        seq = out[prog.device_of[x]]
        if not seq or seq[-1] != blk:
            seq.append(blk)
    return out


def recorded_schedule(recipe: list[dict]) -> Schedule | None:
    """The :class:`~celeritas_cli.pipelining.schedules.Schedule` the
    recipe's ``microbatch`` step names, or None (none named: a placement
    made before placer recorded it, or not a pipeline)."""
    for step in recipe:
        if step.get("transform") == "microbatch" and isinstance(step.get("schedule"), str):
            return SCHEDULES.get(step["schedule"])
    return None


def schedule_of(prog) -> tuple[dict | None, str]:
    """``({"schedule", "p", "v", "rank": {device: rank}, "replica": {device:
    r}}, "")`` when the recipe names a schedule and every device's order
    follows it (module docstring), else ``(None, why not)``."""
    lay = prog.layout
    sched = recorded_schedule(prog.pre.recipe)
    if sched is None:
        return None, "the recipe names no pipeline schedule (a placement made before placer recorded it; place it again)"
    if lay.m < 2:
        return None, "one micro-batch: no pipeline schedule to run"
    mismatch = f"the devices' orders do not follow the recipe's {sched.title} schedule"
    passes = node_passes(prog.base_graph)
    blocks = _blocks(prog, passes)
    first: dict[int, int] = {}
    replica: dict[int, int] = {}
    for x in prog.sequence:
        info = prog.infos[x]
        if info.i is not None and info.kind == "node" and passes[info.v] == "forward":
            d = prog.device_of[x]
            first[d] = min(first.get(d, info.v), info.v)
            replica.setdefault(d, info.r)
    devs = [d for d in prog.devices if blocks[d]]
    if not devs or set(devs) != set(first) or any(sum(1 for d in devs if replica[d] == r) != len(devs) // lay.k
                                                  for r in range(lay.k)):
        return None, mismatch
    p = len(devs) // lay.k
    rank = {}
    for r in range(lay.k):
        mine = sorted((d for d in devs if replica[d] == r), key=first.__getitem__)
        rank.update({d: j for j, d in enumerate(mine)})
    n_f = {d: sum(1 for k, _ in blocks[d] if k == "F") for d in devs}
    v = n_f[devs[0]] // lay.m if sched.chunked else 1
    if any(n_f[d] != v * lay.m for d in devs):
        return None, mismatch
    try:
        want = {d: [(k, i) for k, _, i in sched.steps(p, lay.m, rank[d], v)] for d in devs}
    except InvalidInput as exc:  # the shape breaks the schedule's rule
        return None, f"{mismatch}: {exc}"
    if any(_collapse(want[d]) != blocks[d] for d in devs):
        return None, mismatch
    return {"schedule": sched.name, "p": p, "v": v, "rank": rank, "replica": replica}, ""


def _collapse(seq: list) -> list:
    out: list = []
    for b in seq:
        if not out or out[-1] != b:
            out.append(b)
    return out


@dataclass
class PipeliningPlan:
    """What :func:`pipelining_source` writes: the split points (module
    paths, one per stage after the first), stage ``j``'s cluster device,
    the schedule, micro-batches, chunks per rank."""

    split_points: list[str]
    stage_devices: list[int]
    schedule: str
    m: int
    p: int
    v: int


def why_not(prog, module_kinds: dict[str, str] | None = None) -> tuple[PipeliningPlan | None, str]:
    """``(plan, "")`` when ``torch.distributed.pipelining`` can run the
    placement (module docstring), else ``(None, reason)``.  *module_kinds*:
    module path -> class name (``ModuleList`` and ``ModuleDict`` cannot be
    split points), read from the model."""
    from ..pipelining.cuts import attribution

    kinds = [s["transform"] for s in prog.pre.recipe]
    if kinds != ["microbatch"]:
        return None, f"the recipe is {' + '.join(kinds)}, not micro-batching alone"
    sched, why = schedule_of(prog)
    if sched is None:
        return None, why
    graph = prog.base_graph
    passes = node_passes(graph)
    device_of_v: dict[int, int] = {}
    for x, info in enumerate(prog.infos):
        if info.v is None:
            continue
        d = prog.device_of[x]
        if device_of_v.setdefault(info.v, d) != d:
            return None, f"node '{graph.ids[info.v]}' runs on more than one device (its micro-batches are split)"
    p, v = sched["p"], sched["v"]
    by_rank = {r: d for d, r in sched["rank"].items()}
    place = {u for u in range(graph.n) if graph.op[u] == "placeholder"}  # torch feeds the inputs to the first
    fwd = [u for u in range(graph.n) if passes[u] == "forward" and u not in place]  # stage, the target to the last
    stage_of: dict[int, int] = {}
    j = 0
    for u in fwd:  # forward nodes in trace order: stages are the runs of one device, in rank order
        while by_rank[j % p] != device_of_v[u]:
            j += 1
            if j >= p * v:
                return None, f"forward node '{graph.ids[u]}' is out of the stages' order (not a chain of segments)"
        stage_of[u] = j
    if j != p * v - 1:
        return None, f"{j + 1} forward segments for {p * v} stages"
    sm = prog.sm
    splits = []
    for s in range(1, p * v):
        head = next(u for u in fwd if stage_of[u] == s)
        start = fwd.index(head)
        path = _split_point(sm, fwd, stage_of, start, s, module_kinds or {})
        if path is None:
            return None, f"stage {s} does not start at the call of a submodule whose parameters are all in it"
        splits.append(path)
    order = sorted(place) + fwd          # the inputs first: a node reading only them is on the first stage
    cuts = [0] + [order.index(next(u for u in fwd if stage_of[u] == s)) for s in range(1, p * v)]
    att = attribution(graph, order)
    for u in range(graph.n):
        if u in place:
            continue
        want = bisect.bisect_right(cuts, att[u]) - 1
        if by_rank[want % p] != device_of_v.get(u, by_rank[want % p]):
            return None, f"{passes[u]} node '{graph.ids[u]}' is not on the device of its stage {want}"
    return PipeliningPlan(split_points=splits, stage_devices=[by_rank[s % p] for s in range(p * v)],
                          schedule=sched["schedule"], m=prog.layout.m, p=p, v=v), ""


def _split_point(sm, fwd, stage_of, start: int, s: int, kinds: dict) -> str | None:
    """The module path whose call starts stage *s* at forward position *start*
    (module docstring, point 4), or ``None``."""
    first = next((u for u in fwd[start:] if sm.state_refs[u]), None)
    if first is None or stage_of[first] != s:
        return None
    name = sm.state_names[sm.state_refs[first][0]]
    parts = name.split(".")[:-1]
    if fwd.index(first) != start:  # stage s opens with ops without parameters: torch would put them before
        return None
    for depth in range(1, len(parts) + 1):
        path = ".".join(parts[:depth])
        if kinds.get(path) in ("ModuleList", "ModuleDict"):
            continue
        users = [u for u in fwd if any(sm.state_names[t].startswith(path + ".") for t in sm.state_refs[u])]
        if all(stage_of[u] == s for u in users):
            return path
    return None


_SOURCE = '''"""Pipeline plan of {graph} on cluster {cluster}: placement {label} ({algorithm}).

Generated by `placer export` as a torch.distributed.pipelining program: {stages} stages,
{schedule_words}, {m} micro-batches of the batch of {batch}, stage j on cluster device STAGE_DEVICES[j]
(rank RANK_OF[STAGE_DEVICES[j]]).  The model is split with pipeline(split_spec=SPLIT_SPEC); the
schedule is torch's {torch_class} (its own step order, the same schedule as the placement's).
Gradients are averaged over the micro-batches (scale_grads=True: a mean loss{uneven}); BatchNorm
statistics are per micro-batch.  Adam runs on each rank for its stages' parameters.

Run {p} processes, one per rank (torch.distributed's environment variables):

    torchrun --nproc-per-node {p} this_file.py

or, in your own training loop, on every rank:

    schedule, modules = build_schedule(model, rank, example_inputs)
    opt = torch.optim.Adam([q for mod in modules for q in mod.parameters()])
    loss = train_step(schedule, modules, opt, rank, inputs, target)

Edit DEVICES to run the cluster devices on other torch devices.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import SplitPoint, pipeline
from torch.distributed.pipelining import {torch_class} as SCHEDULE

MODEL, CONFIG, BATCH, SEED = {spec!r}, {config!r}, {batch!r}, {seed!r}
N_MICROBATCHES = {m}
SPLIT_SPEC = {{{splits}}}
STAGE_DEVICES = {stage_devices!r}
RANK_OF = {rank_of!r}
DEVICES = {devices!r}
LR, BETAS, EPS = {lr!r}, {betas!r}, {eps!r}


def stages_of(rank):
    """The stage indices rank *rank* runs."""
    return [j for j, d in enumerate(STAGE_DEVICES) if RANK_OF[d] == rank]


def build_schedule(model, rank, example_inputs, loss_fn=None, group=None):
    """This rank's stages of *model* and the schedule: ``(schedule, stage modules)``.
    *example_inputs*: forward arguments of the whole batch (their first micro-batch traces the split)."""
    mb = tuple(torch.tensor_split(x, N_MICROBATCHES)[0] for x in example_inputs)
    pipe = pipeline(model, mb_args=mb, split_spec=SPLIT_SPEC)
    stages = [pipe.build_stage(j, torch.device(DEVICES[STAGE_DEVICES[j]]), group) for j in stages_of(rank)]
    if loss_fn is None:
        loss_fn = model.loss if hasattr(model, "loss") else (lambda out, target: out.float().mean())
    sched = SCHEDULE(stages if len(STAGE_DEVICES) > len(RANK_OF) else stages[0], n_microbatches=N_MICROBATCHES,
                     loss_fn=loss_fn)
    return sched, [s.submod for s in stages]


def train_step(schedule, modules, opt, rank, inputs, target):
    """One step on the whole batch: the pipeline's forward and backward, then Adam.
    Returns the mean of the micro-batches' losses on the rank of the last stage, else None."""
    mine = stages_of(rank)
    first, last = 0 in mine, len(STAGE_DEVICES) - 1 in mine
    dev = torch.device(DEVICES[STAGE_DEVICES[mine[0]]])
    opt.zero_grad()
    losses = [] if last else None
    args = tuple(x.to(dev) for x in inputs) if first else ()
    schedule.step(*args, target=target.to(dev) if last else None, losses=losses)
    opt.step()
    return torch.stack(losses).mean().detach() if last else None


def main():
    from celeritas_cli.profile.models import resolve_model

    dist.init_process_group("gloo" if all(v == "cpu" for v in DEVICES.values()) else "nccl")
    rank = dist.get_rank()
    factory, _ = resolve_model(MODEL, CONFIG)
    torch.manual_seed(SEED)
    model = factory()
    torch.manual_seed(SEED + 1)
    inputs = tuple(model.example_inputs(BATCH))
    target = model.example_target(BATCH)
    schedule, modules = build_schedule(model, rank, inputs)
    opt = torch.optim.Adam([q for mod in modules for q in mod.parameters()], lr=LR, betas=BETAS, eps=EPS,
                           foreach=False)
    loss = train_step(schedule, modules, opt, rank, inputs, target)
    if loss is not None:
        print(f"rank {{rank}}: loss {{float(loss):.6f}}")
    out = os.environ.get("PLACER_EXPORT_OUT")
    if out:
        torch.save({{n: q.detach().cpu() for mod in modules for n, q in mod.named_parameters()}} | {{"loss": loss}},
                   f"{{out}}.{{rank}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def pipelining_source(plan: PipeliningPlan, prog, cluster_ids: list[str], tdev: dict[int, str], *, graph: str,
                      cluster: str, label: str, algorithm: str) -> str:
    """Python source of *plan* (:data:`_SOURCE`): run it with torchrun, or call its ``build_schedule``."""
    from .executor import ADAM

    whole = prog.pre.whole
    lay = prog.layout
    sched = SCHEDULES[plan.schedule]
    ranks = sorted({d for d in plan.stage_devices}, key=plan.stage_devices.index)
    uneven = "" if len(set(lay.sizes.values())) == 1 else (
        "; with micro-batches of unequal size this weighs each micro-batch equally, placer by its samples")
    return _SOURCE.format(graph=graph, cluster=cluster, label=label, algorithm=algorithm,
                          stages=len(plan.stage_devices), schedule_words=sched.words(plan.v), m=plan.m,
                          batch=lay.total, torch_class=sched.torch_class, p=plan.p, uneven=uneven,
                          spec=whole.spec, config=whole.config, seed=whole.seed,
                          splits=", ".join(f"{s!r}: SplitPoint.BEGINNING" for s in plan.split_points),
                          stage_devices=[cluster_ids[d] for d in plan.stage_devices],
                          rank_of={cluster_ids[d]: r for r, d in enumerate(ranks)},
                          devices={cluster_ids[d]: tdev[d] for d in ranks}, lr=ADAM["lr"], betas=ADAM["betas"],
                          eps=ADAM["eps"])


def module_kinds(spec: str, config: dict) -> dict[str, str]:
    """Module path -> class name of the model's submodules (built on the meta device)."""
    from ..profile.capture import build_meta
    from ..profile.models import resolve_model

    factory, _ = resolve_model(spec, dict(config or {}))
    return {name: type(mod).__name__ for name, mod in build_meta(factory).named_modules() if name}
