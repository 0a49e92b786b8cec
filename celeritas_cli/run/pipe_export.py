"""Pipelines, replicated pipelines and data-parallel plans as one torchrun
program on a ``(dp, pp)`` DeviceMesh (``placer export``), and the pipeline
schedule a placement's orders follow.

:func:`schedule_of` takes the schedule from the placement's recipe (the
``schedule`` its ``microbatch`` step records, one of
:data:`~celeritas_cli.pipelining.schedules.SCHEDULES`; never from what its
``params`` or ``estimate`` claim) and checks that the orders follow it: the
stages' ranks are the order in which the devices first run a forward node
of the captured trace, and each device's order, read as forward / backward
blocks of micro-batches, must be the rank's steps
(:meth:`~celeritas_cli.pipelining.schedules.Schedule.steps`).

:func:`why_not` says whether ``torch.distributed.pipelining`` can run the
plan as it is, exactly when all of these hold (else it names the first that
fails and ``placer export`` writes placer's own code, :mod:`.derived_export`):

1. the recipe is one ``microbatch`` step, optionally with one
   ``data-parallel`` step before or after it (:data:`RECIPES`; recomputation
   is not expressed by a pipelining schedule);
2. the recipe names the schedule and the orders follow it
   (:func:`schedule_of`), on one device per stage and replica (with model
   chunks: stage ``j`` on rank ``j mod p``);
3. every captured node's micro-batch copies, parameters and gradient
   accumulation of one replica are on one device: its stage's;
4. the stages are contiguous module segments of a chain: in the trace's
   forward order, stage ``j > 0`` starts at the first call of a submodule
   ``P`` (its parameters are all in stage ``j``; not a ``ModuleList``), the
   forward nodes between two split points are all in one stage (ops
   without parameters before ``P``'s first call belong to the stage
   before, as ``pipeline(split_spec={P: SplitPoint.BEGINNING})`` splits),
   the loss is on the last stage, and every backward node and update is on
   the stage of the forward node it is attributed to
   (:func:`~celeritas_cli.pipelining.cuts.attribution`): autograd runs
   a stage's backward where its forward ran; every replica's pipeline is
   replica 0's on its own devices;
5. every replica's micro-batches are of one size (:func:`_replica_rows`).

The program (:data:`_SOURCE`, :func:`pipelining_source`) is launched with
``torchrun --nproc-per-node dp*p`` (:func:`torchrun_line`): its processes
form ``init_device_mesh(device, (dp, p), mesh_dim_names=("dp", "pp"))``,
replica ``r``'s pipeline rank ``j`` being global rank ``r p + j`` (PTD-P's
layout, Narayanan et al. SC'21 3: the pipeline inside a data-parallel
replica).  Over ``pp`` it runs the plan's torch schedule class on the
plan's split points and micro-batches; over ``dp`` it sums the gradients
with one ``all_reduce`` of their concatenation per rank after the schedule's
step (one bucket after the last micro-batch, where the plan's ring runs and
where Megatron-LM reduces; torch's ``DistributedDataParallel`` would need
``no_sync`` for every micro-batch but the last, and its buckets are its own,
not the plan's, so the program does not use it: the plan's ``bucket_mb``
is not reproduced); a plan whose data-parallel step has ``zero`` 1 or 2
(``--algo pipeline -p zero=1|2``: Megatron-LM's distributed optimizer) runs
instead the sharded optimizer of :mod:`.tp_export` (``ZeroAdam``: every
gradient reduce-scattered over ``dp``, Adam on this rank's shard, the
shards all-gathered; its docstring says why not FSDP2), stages 1 and 2 the
same program.  A micro-batch's loss is weighted by its share of the
global batch (``scale_grads=False``), so the sum over micro-batches and
replicas is the whole batch's gradient (GPipe 2.2, a mean loss), also with
unequal replicas.  (A plain data-parallel plan is exported by
:mod:`~.fsdp_export`, with DDP.)  Deviation: the program measures the step barrier to
barrier but not per node, so ``placer calibrate`` (which fits per-node
times) cannot read it; ``placer run --node-times`` measures those.

References
----------
PyTorch ``torch.distributed.pipelining`` (``pipeline``, ``SplitPoint``,
``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``) and ``torch.distributed.device_mesh``
(``init_device_mesh``); Narayanan et al., SC'21, 2.2 (schedules) and 3
(PTD-P: data parallelism over pipelines); Huang et al., GPipe, NeurIPS'19,
2.2; Li et al., "PyTorch Distributed", VLDB'20, 3.2 (DDP's gradient
buckets, ``no_sync``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..errors import InvalidInput
from ..pipelining.schedules import SCHEDULES, Schedule
from ..transform.passes import node_passes
from .export import launch_check_source, torchrun_line


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
    paths, one per stage after the first), stage ``j``'s cluster device in
    replica 0, the schedule's name (:data:`~celeritas_cli.pipelining.schedules.SCHEDULES`), the
    micro-batches, the pipeline ranks ``p``, chunks per rank ``v``; the
    data-parallel replicas ``dp``, the cluster device of every global rank
    (``rank_devices[r * p + j]``: replica ``r``'s pipeline rank ``j``), each
    replica's micro-batches as ``(first row, samples)`` of the global batch
    of ``batch`` samples (:class:`~.plan.Layout`)."""

    split_points: list[str]
    stage_devices: list[int]
    schedule: str
    m: int
    p: int
    v: int
    dp: int = 1
    rank_devices: list[int] = field(default_factory=list)
    rows: list[list[tuple[int, int]]] = field(default_factory=list)
    batch: int = 0

    @property
    def nproc(self) -> int:
        """Processes of the program: one per mesh rank, ``dp * p``."""
        return self.dp * self.p


#: the recipes a torchrun program expresses: micro-batches (a pipeline), replicated pipelines
#: (micro-batched, then data-parallel: every micro-batch cut over the replicas, Narayanan et al.
#: SC'21 3), and a pipeline per replica (data-parallel, then micro-batched)
RECIPES = (["microbatch"], ["microbatch", "data-parallel"], ["data-parallel", "microbatch"])


def _replica_rows(lay, k: int, m: int) -> tuple[list[list[tuple[int, int]]], str]:
    """Per replica its micro-batches ``(first row, samples)`` in micro-batch order, and ``""``; or
    ``([], why not)`` when a replica's micro-batches differ in size: ``pipeline()`` traces the stages
    at one micro-batch's shape, and the program weighs every micro-batch of a replica alike."""
    rows = [[(lay.rows[(r, i)], lay.sizes[(r, i)]) for i in range(m)] for r in range(k)]
    for r, mine in enumerate(rows):
        if len({n for _, n in mine}) != 1:
            return [], (f"replica {r}'s micro-batches hold {[n for _, n in mine]} samples: "
                        f"the exported stages are traced at one micro-batch size")
    return rows, ""


def why_not(prog, module_kinds: dict[str, str] | None = None) -> tuple[PipeliningPlan | None, str]:
    """``(plan, "")`` when ``torch.distributed.pipelining`` (over the ``pp``
    dimension of a ``(dp, pp)`` mesh) can run the placement (module docstring;
    with ``data-parallel`` in the recipe every replica's pipeline must be
    replica 0's on its own devices), else ``(None, reason)``.
    *module_kinds*: module path -> class name (``ModuleList`` and
    ``ModuleDict`` cannot be split points), read from the model."""
    from ..pipelining.cuts import attribution

    kinds = [s["transform"] for s in prog.pre.recipe]
    if kinds not in RECIPES:
        return None, (f"the recipe is {' + '.join(kinds)}, not micro-batching alone or with one data-parallel "
                      f"step")
    sched, why = schedule_of(prog)
    if sched is None:
        return None, why
    lay = prog.layout
    rows, why = _replica_rows(lay, lay.k, lay.m)
    if not rows:
        return None, why
    graph = prog.base_graph
    passes = node_passes(graph)
    device_of_v: dict[tuple[int, int], int] = {}
    for x, info in enumerate(prog.infos):
        if info.v is None or info.kind == "ring":
            continue
        d = prog.device_of[x]
        if device_of_v.setdefault((info.v, info.r), d) != d:
            return None, f"node '{graph.ids[info.v]}' runs on more than one device (its micro-batches are split)"
    p, v = sched["p"], sched["v"]
    by_rank = [{j: d for d, j in sched["rank"].items() if sched["replica"][d] == r} for r in range(lay.k)]
    place = {u for u in range(graph.n) if graph.op[u] == "placeholder"}  # torch feeds the inputs to the first
    fwd = [u for u in range(graph.n) if passes[u] == "forward" and u not in place]  # stage, the target to the last
    stage_of: dict[int, int] = {}
    j = 0
    for u in fwd:  # forward nodes in trace order: stages are the runs of one device, in rank order
        while by_rank[0][j % p] != device_of_v[(u, 0)]:
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
    for (u, r), d in sorted(device_of_v.items()):
        if u in place:
            continue
        want = bisect.bisect_right(cuts, att[u]) - 1
        if by_rank[r][want % p] != d:
            where = f" of replica {r}" if lay.k > 1 else ""
            return None, f"{passes[u]} node '{graph.ids[u]}'{where} is not on the device of its stage {want}"
    return PipeliningPlan(split_points=splits, stage_devices=[by_rank[0][s % p] for s in range(p * v)],
                          schedule=sched["schedule"], m=lay.m, p=p, v=v, dp=lay.k,
                          rank_devices=[by_rank[r][j] for r in range(lay.k) for j in range(p)], rows=rows,
                          batch=lay.total), ""


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


_SOURCE = '''"""{title} of {graph} on cluster {cluster}: placement {label} ({algorithm}).

Generated by `placer export`.  Launch it from the directory `placer profile` ran in (it builds the
model {spec}{config_words} as profile did), one process per rank:

    {torchrun}

Each process takes cuda:LOCAL_RANK when the machine has that GPU (NCCL), else the CPU (gloo: the
line above runs as it is on a CPU-only machine); `--device cpu` forces the CPU.  The processes form
the {dp} x {p} DeviceMesh init_device_mesh(..., (DP, PP), mesh_dim_names=("dp", "pp")): global rank
r * PP + j is replica r's pipeline rank j, on cluster device RANK_DEVICES[r * PP + j].
{pipeline_words}
Gradients: every micro-batch's loss is weighted by its share of the batch of {batch} (the loss is a
mean over samples), so the micro-batches' gradients add up to the whole batch's (scale_grads=False);
after the step the gradients of each stage are summed over the dp dimension by one explicit
all_reduce of their flattened concatenation on the mesh's "dp" group (one DDP bucket, once, after
the last micro-batch's backward, as the plan's recipe and Megatron-LM's PTD-P do; DDP itself would
all-reduce at every micro-batch's backward unless wrapped in no_sync).  Then Adam, on each rank for
its stages' parameters.  BatchNorm statistics are per micro-batch; dropout masks are torch's.
{zero_words}
It runs 1 + --warmup + --steps steps (default 1 + 1 + 5); rank 0 prints the loss of the first
(`--save PREFIX` writes each rank's parameters after it, and the loss, to PREFIX.RANK) and the
measured step (median of the timed steps, barrier to barrier) next to the simulated one, as
`placer run` does; `--report FILE` writes them as JSON with placer.run/v1's
field names.  Started with another process count, or with a model whose parameters are not the
profiled ones, it stops in one line before any step.
"""

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
{imports}
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch's own, when splitting

MODEL, CONFIG, BATCH, SEED = {spec!r}, {config!r}, {batch!r}, {seed!r}
DP, PP, N_MICROBATCHES = {dp}, {p}, {m}
#: per replica: its micro-batches as (first row, samples) of the global batch
ROWS = {rows!r}
SPLIT_SPEC = {{{splits}}}
#: cluster device of every stage (replica 0), of every global rank
STAGE_DEVICES = {stage_devices!r}
RANK_DEVICES = {rank_devices!r}
#: (name, shape) of every parameter of the profiled model
PARAMETERS = {params}
SIMULATED_STEP_S = {simulated!r}
LR, BETAS, EPS = {lr!r}, {betas!r}, {eps!r}
TORCHRUN = {torchrun!r}
{zero_table}

def stages_of(pp_rank):
    """The stage indices pipeline rank *pp_rank* runs (stage j on rank j mod PP)."""
    return [j for j in range(len(STAGE_DEVICES)) if j % PP == pp_rank]


def build_model():
    """The model, as `placer profile --model MODEL` built it (zoo name, module:attr, file.py:attr)."""
    if ":" not in MODEL:
        from celeritas_cli.profile.zoo import ZOO  # the zoo's models come with placer
        return ZOO[MODEL].factory(**CONFIG)
    left, attr = MODEL.rsplit(":", 1)
    if left.endswith(".py") or "/" in left or os.sep in left:
        path = os.path.abspath(os.path.expanduser(left))
        if not os.path.isfile(path):
            sys.exit(f"{{MODEL}}: no such file {{path}}; run this program from the directory placer profile ran in")
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location(f"placer_model_{{os.path.basename(path)[:-3]}}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(left)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part)
    return factory(**CONFIG)


def check_model(model):
    """Stop in one line when *model*'s parameters are not those of the profiled graph."""
    got = [[n, list(q.shape)] for n, q in model.named_parameters()]
    if got != PARAMETERS:
        diff = next((f"{{g[0]}} is {{g[1]}}, was {{w[0]}} {{w[1]}}" for g, w in zip(got, PARAMETERS) if g != w),
                    f"{{len(got)}} parameters, was {{len(PARAMETERS)}}")
        sys.exit(f"{{MODEL}} no longer builds the profiled model ({{diff}}): profile, place and export it again")


def loss_of(model, scale, has_target):
    """The model's loss as placer profile took it (its `loss(output, target)`, else the mean of the
    output or of its first element) times *scale*."""
    if hasattr(model, "loss"):
        return lambda out, target=None: model.loss(out, target if has_target else None) * scale
    return lambda out, target=None: (out if torch.is_tensor(out) else out[0]).float().mean() * scale


def build_schedule(model, pp_rank, mb_inputs, device, loss_fn, group=None):
    """This rank's stages of *model* and the schedule: ``(schedule, stage modules)``.
    *mb_inputs*: the forward arguments of one micro-batch (they trace the split)."""
    pipe = pipeline(model, mb_args=tuple(mb_inputs), split_spec=SPLIT_SPEC)
    stages = [pipe.build_stage(j, device, group) for j in stages_of(pp_rank)]
    sched = SCHEDULE(stages if len(stages) > 1 else stages[0], n_microbatches=N_MICROBATCHES, loss_fn=loss_fn,
                     scale_grads=False)
    return sched, [s.submod for s in stages]


def train_step(schedule, modules, opt, pp_rank, inputs, target, dp_group, loss_fn):
    """One step on this replica's rows: the pipeline (or, with one stage, the micro-batches in turn),
    the gradients summed over the dp group, Adam.  Returns this rank's share of the batch's loss
    (its micro-batches' weighted losses on the last stage, else 0)."""
    opt.zero_grad()
    total = torch.zeros((), dtype=torch.float64)
    if schedule is None:
        for mb in range(N_MICROBATCHES):
            xs = [torch.tensor_split(x, N_MICROBATCHES)[mb] for x in inputs]
            t = torch.tensor_split(target, N_MICROBATCHES)[mb] if target is not None else None
            loss = loss_fn(modules[0](*xs), t)
            loss.backward()
            total += loss.detach().double().cpu()
    else:
        first, last = pp_rank == 0, pp_rank == PP - 1
        losses = [] if last else None
        schedule.step(*(inputs if first else ()), target=target if last else None, losses=losses)
        if last:
            total += sum(float(x.detach()) for x in losses)
    if DP > 1 and not ZERO:     # under ZeRO the optimizer reduce-scatters them (ZeroAdam.step)
        grads = [q.grad for mod in modules for q in mod.parameters() if q.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            at = 0
            for g in grads:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
    opt.step()
    return total


def train(model, device, n_steps, keep=False):
    """*n_steps* steps of *model* (built under SEED and checked) on this rank, the process group
    joined: the mesh, this replica's rows, the stages and the schedule, Adam (ZeroAdam under ZeRO).
    Returns ``(the first step's loss, this rank's parameters after it when *keep*, else None, the
    wall seconds of every step)``."""
    mesh = init_device_mesh(device.type, (DP, PP), mesh_dim_names=("dp", "pp"))
    dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    torch.manual_seed(SEED + 1)
    with torch.no_grad():
        whole = list(model.example_inputs(BATCH))
        whole_target = model.example_target(BATCH) if hasattr(model, "example_target") else None
    mine = ROWS[dp_rank]
    rows = torch.cat([torch.arange(a, a + n) for a, n in mine])
    inputs = [x.index_select(0, rows).to(device) for x in whole]
    target = whole_target.index_select(0, rows).to(device) if whole_target is not None else None
    loss_fn = loss_of(model, mine[0][1] / BATCH, whole_target is not None)
    if PP > 1 and target is None:       # torch's schedule hands its loss_fn a chunk of some target
        target = torch.zeros(len(rows), device=device)
    if PP > 1:
        schedule, modules = build_schedule(model, pp_rank, [torch.tensor_split(x, N_MICROBATCHES)[0] for x in inputs],
                                           device, loss_fn, mesh.get_group("pp"))
    else:
        schedule, modules = None, [model.to(device)]
    params = [q for mod in modules for q in mod.parameters()]
    dp_group = mesh.get_group("dp") if DP > 1 else None
    if ZERO and DP > 1:     # the distributed optimizer: Adam on this rank's 1/DP shard of every parameter
        opt = ZeroAdam(params, dp_group, LR, BETAS, EPS)
    else:
        opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    times, loss, first = [], None, None
    for s in range(n_steps):
        dist.barrier()
        t0 = time.perf_counter()
        share = train_step(schedule, modules, opt, pp_rank, inputs, target, dp_group, loss_fn)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if s == 0:
            dist.all_reduce(share)          # the shares of every replica's last stage: the batch's loss
            loss = float(share)
            if keep:
                first = {{n: q.detach().cpu().clone() for mod in modules for n, q in mod.named_parameters()}}
    return loss, first, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the first and the warm-up ones")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--save", metavar="PREFIX", default=os.environ.get("PLACER_EXPORT_OUT"))
    ap.add_argument("--report", metavar="FILE")
    ap.add_argument("--graph", metavar="FILE", help="the graph file: checked against the one the plan was made for")
    ap.add_argument("--cluster", metavar="FILE|NAME", help="checked against the cluster the plan was made for")
    args = ap.parse_args()
    if "WORLD_SIZE" not in os.environ:
        sys.exit(f"start this program with torchrun, one process per rank: {{TORCHRUN}}")
    if int(os.environ["WORLD_SIZE"]) != DP * PP:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"torchrun started {{os.environ['WORLD_SIZE']}} processes but the plan has {{DP * PP}} ranks "
                  f"({{DP}} replica(s) x {{PP}} pipeline rank(s)): {{TORCHRUN}}", file=sys.stderr)
        sys.exit(1)
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device != "cpu" and torch.cuda.is_available() and local < torch.cuda.device_count()
    if args.device == "cuda" and not cuda:
        sys.exit(f"--device cuda: this machine has no GPU cuda:{{local}}")
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", DP * PP))))
    device = torch.device(f"cuda:{{local}}" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = build_model()
    model.train(True)
    check_model(model)
    loss, first, times = train(model, device, 1 + args.warmup + args.steps, keep=bool(args.save))
    if args.save:
        torch.save(first | {{"loss": torch.tensor(loss)}}, f"{{args.save}}.{{rank}}")
    timed = times[1 + args.warmup:] or times
    measured = statistics.median(timed)
    if rank == 0:
        ratio = measured / SIMULATED_STEP_S if SIMULATED_STEP_S > 0 else None
        print(f"loss {{loss:.6f}} after the first step (the mean over the batch of {{BATCH}})")
        print(f"step: measured {{measured:.6g}} s (median of {{len(timed)}}), simulated {{SIMULATED_STEP_S:.6g}} s"
              + (f", measured/simulated {{ratio:.2f}}" if ratio else ""))
        if args.report:
            with open(args.report, "w") as f:
                json.dump({{"model": MODEL, "batch_size": BATCH, "processes": DP * PP, "dist_backend":
                           "nccl" if cuda else "gloo", "launcher": "torchrun", "loss": loss, "steps": len(timed),
                           "warmup": 1 + args.warmup, "measured_step_s": measured, "measured_steps_s": timed,
                           "simulated_step_s": SIMULATED_STEP_S, "measured_over_simulated": ratio}}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def describe(plan: PipeliningPlan, program: str, zero: int = 0) -> str:
    """One line saying what :func:`pipelining_source` wrote for *plan* and how to launch it (*zero*:
    the ZeRO stage of its replicas)."""
    what = (f"a torch.distributed.pipelining program ({plan.schedule}, {len(plan.stage_devices)} stages split at "
            f"{', '.join(plan.split_points)}, {plan.m} micro-batches" + (f", x {plan.dp} replicas" if plan.dp > 1 else "")
            + (f", ZeRO-{zero} over them (Adam sharded)" if zero and plan.dp > 1 else ""))
    return f"{what} on a {plan.dp} x {plan.p} (dp, pp) DeviceMesh; {torchrun_line(plan.nproc, program)})"


def pipelining_source(plan: PipeliningPlan, prog, cluster_ids: list[str], tdev: dict[int, str] | None = None, *,
                      graph: str, cluster: str, label: str, algorithm: str, program: str = "placed.py",
                      fingerprint: dict | None = None) -> str:
    """Python source of *plan* (:data:`_SOURCE`), a program for ``torchrun --nproc-per-node
    plan.nproc`` (:func:`torchrun_line`; *program*: its file name in that line).  *prog*: the
    :class:`~.derived_program.DerivedProgram` (or anything with ``.pre``, the prepared placement:
    its unplaced step ``whole`` or ``step``, and its simulation).  *tdev* is not used: each
    process takes its own device (the program's docstring).  The program carries the launch checks
    of :func:`~.export.launch_check_source` (*fingerprint*: the graph file, cluster and model file it
    was exported for; the process count and the parameter shapes always)."""
    from .executor import ADAM
    from .tp_export import ZERO_SOURCE, zero_table

    pre = prog.pre
    zero = int(getattr(pre, "zero", 0) or 0) if plan.dp > 1 else 0
    whole = getattr(pre, "whole", None) or pre.step
    sm = whole.sm
    params = [[sm.state_names[s], list(whole.state[s].shape)] for s in range(sm.n_params)]
    line = torchrun_line(plan.nproc, program)
    sched = SCHEDULES[plan.schedule]
    title = "Pipeline plan" if plan.dp == 1 else "Pipeline x data-parallel plan"
    imports = ("from torch.distributed.pipelining import SplitPoint, pipeline\n"
               f"from torch.distributed.pipelining import {sched.torch_class} as SCHEDULE\n")
    pipeline_words = (f"Over the pp dimension: torch.distributed.pipelining, the model split with\npipeline(..., "
                      f"split_spec=SPLIT_SPEC) into {len(plan.stage_devices)} stages (stage j on pipeline rank "
                      f"j mod PP), {sched.words(plan.v)}\n(torch's {sched.torch_class}: its own step order, the "
                      f"placement's schedule), {plan.m} micro-batches per replica.\n")
    splits = ", ".join(f"{s!r}: SplitPoint.BEGINNING" for s in plan.split_points)
    config = whole.config or {}
    src = _SOURCE.format(title=title, graph=graph, cluster=cluster, label=label, algorithm=algorithm,
                          spec=whole.spec, config_words=f" with config {config}" if config else "",
                          torchrun=line, dp=plan.dp, p=plan.p, batch=plan.batch, pipeline_words=pipeline_words,
                          imports=imports, config=config, seed=whole.seed, m=plan.m, rows=plan.rows, splits=splits,
                          stage_devices=[cluster_ids[d] for d in plan.stage_devices],
                          rank_devices=[cluster_ids[d] for d in plan.rank_devices], params=_wrap(params),
                         simulated=float(pre.sim["makespan_s"]), lr=ADAM["lr"], betas=ADAM["betas"], eps=ADAM["eps"],
                         zero_table=zero_table(zero), zero_words=_zero_doc(zero, plan.dp))
    checks = launch_check_source(processes=plan.nproc, launch=line, fingerprint=fingerprint,
                                 parameters=[(n, tuple(shape)) for n, shape in params])
    src = src.replace("\ndef main():\n", "\n" + checks + "\n\n" + ZERO_SOURCE.lstrip("\n") + "\ndef main():\n", 1)
    # the shared checks (graph file, --cluster, model file) after the program's own process-count check
    src = src.replace('    local = int(os.environ.get("LOCAL_RANK", 0))\n',
                      '    launch_check()\n    local = int(os.environ.get("LOCAL_RANK", 0))\n', 1)
    return src.replace("    check_model(model)\n", "    check_model(model)\n    model_check(model)\n", 1)


def _zero_doc(zero: int, dp: int) -> str:
    """The program docstring's words on ZeRO (wrapped at 100 columns), or "".

    >>> _zero_doc(0, 2)
    ''
    >>> _zero_doc(1, 2).split()[:3]
    ['ZeRO', 'stage', '1']
    """
    import textwrap

    if not zero or dp < 2:
        return ""
    words = (f"ZeRO stage {zero} (Megatron-LM's distributed optimizer): no all_reduce; instead every gradient, "
             f"flattened and padded to a multiple of {dp}, is reduce-scattered over \"dp\", Adam updates this "
             f"rank's 1/{dp} shard and its moments, and the shards are all-gathered back into the parameter "
             f"(ZeroAdam; not FSDP2's fully_shard, which would gather the parameters before the forward and "
             f"reduce-scatter at every micro-batch: not the plan's collectives).  Stages 1 and 2 run this same "
             f"program: what stage 2 saves (only the reduced gradient "
             f"shard kept) is memory, not observable on the CPU.")
    return textwrap.fill(words, 100, break_on_hyphens=False) + "\n"


def _wrap(items: list) -> str:
    text = repr(items)
    if len(text) <= 100:
        return text
    return "[\n" + "".join(f"    {x!r},\n" for x in items) + "]"


def module_kinds(spec: str, config: dict) -> dict[str, str]:
    """Module path -> class name of the model's submodules (built on the meta device)."""
    from ..profile.capture import build_meta
    from ..profile.models import resolve_model

    factory, _ = resolve_model(spec, dict(config or {}))
    return {name: type(mod).__name__ for name, mod in build_meta(factory).named_modules() if name}
