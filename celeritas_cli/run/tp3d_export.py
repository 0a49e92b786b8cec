"""``placer export`` (and ``placer run``) of a TP x PP plan (``place --algo
megatron -p tp=T -p pp=P``, optionally ``dp=D``, ``virtual_stages``,
``recompute``) as one PyTorch program on a 3-D :class:`DeviceMesh`
``("dp", "pp", "tp")`` of ``D x P x T`` processes, launched with ``torchrun
--nproc-per-node T*P*D``.

The mesh (:func:`mesh_rank`): global rank ``g = t + T (r + D j)`` is tensor
rank ``t`` of pipeline rank ``j`` in replica ``r`` - Megatron-LM's order
(``parallel_state``; the megatron row's ``device_of_rank``): tensor ranks
fastest, then data, then pipeline, so a stage's tensor group is consecutive
ranks (one server) and the pipeline crosses servers.  The program builds it
as ``DeviceMesh(device, ranks, mesh_dim_names=("dp", "pp", "tp"))`` with
``ranks = arange(P D T).reshape(P, D, T).permute(1, 0, 2)``
(``init_device_mesh`` only lays ranks out row-major in the order of the
names, which would put the pipeline inside the replicas).

What the program does, dimension by dimension (torchtitan's composition:
``pipeline_llm`` splits the model into stage modules, each stage is
``parallelize_module``-d over the tensor sub-mesh, the schedule runs over the
pipeline sub-mesh):

* pp: ``torch.distributed.pipelining.pipeline(model, mb_args, split_spec)``
  splits the model at the plan's stage cut (:func:`pipe_plan`: the split
  points are the module calls where the plan's stages begin in the trace's
  forward order - the forward nodes that run per micro-batch, placed where
  tensor rank 0's first micro-batch runs them; a weight's once-per-step
  cast stays with its owner - found as :mod:`.pipe_export` finds them), stage ``s`` on
  pipeline rank ``s mod P``, run by the torch schedule class of the plan's
  recorded schedule (``Schedule1F1B``, ``ScheduleInterleaved1F1B``) over the
  plan's micro-batches (``scale_grads=False``: each micro-batch's loss is
  weighted by its share of the global batch);
* tp: every stage module (a ``GraphModule`` whose module tree mirrors the
  model's, each submodule an ``InterpreterModule``) gets, for each module of
  the TP plan it holds, a copy of the model's own module (an ``nn.Linear`` /
  ``nn.Embedding``, the types torch's styles take), then the styles of
  :mod:`.tp_export` (``ColwiseParallel``, ``RowwiseParallel``, the fused QKV
  held as ``_StridedShard``, the vocabulary-parallel embedding, the tied
  head's logits vocabulary-sharded into ``loss_parallel``) over
  ``mesh["tp"]``; every other parameter is a replicated DTensor.  The traced
  stages carry the micro-batch's global shapes (the tracer writes them into
  its views); DTensor keeps global shapes, so the traced code runs as it is.
  At a stage's boundary the activation sent to the next stage is the
  replicated DTensor's local tensor (every tensor rank sends its copy to its
  peer of the next stage, as Megatron-LM without scatter-gather), taken
  back as a replicated DTensor (``DTensor.from_local``) by the receiver,
  whose backward sums the partial input gradients over the tensor ranks
  (Megatron-LM's ``f`` all-reduce of the first column-parallel layer);
* dp: after the schedule every gradient (its local shard) is all-reduced
  (summed) over ``mesh["dp"]`` - one all-reduce per gradient, as the plan -
  and Adam (``foreach=False``) updates each rank's shards; with ZeRO stage
  1 or 2 on the data-parallel step (``-p use_distributed_optimizer=true``,
  Megatron-LM's distributed optimizer) the gradient's local tensor is
  instead reduce-scattered over ``mesh["dp"]``, Adam updates this rank's
  1/D shard of it and the shards are all-gathered back (``ZeroAdam``, the
  same class as :mod:`.tp_export`'s: why not FSDP2 there);
* a parameter two stages read (a head tied to the word embedding: the
  tracer gives the last stage its own copy) is kept on both pipeline ranks
  and its gradient summed between them (a group of the first and the last
  pipeline rank per replica and tensor rank: Megatron-LM's embedding group,
  ``_EMBEDDING_GROUP``) before Adam; the plan instead sends the weight to
  the last stage and its gradient back (the same numbers);
* recomputation (``-p recompute=full``): each transformer layer of a stage
  runs under ``torch.utils.checkpoint``.

Why DTensor and not local tensors: torch 2.13's pipelining runs stages whose
parameters are DTensors (the stage only sends and receives the boundary
tensors, which the program keeps local), and the tracer's hard-coded shapes
are the global ones DTensor computes with; Megatron-style local modules
would need every traced view rewritten to per-rank head counts.

Refused (one line, :func:`pipe_plan`): sequence parallelism with a pipeline
(the boundary activation would be sequence-sharded, the traced stages
expect the whole sequence), a recipe without a recorded schedule, stages
that are not contiguous module segments of the model (no split point),
replicas not in the symmetric form, uneven micro-batches.

Mixed precision (``torch.autocast`` of the profiled precision, no loss
scale), dropout masks (DTensor's) and the sequence dimension are as in
:mod:`.tp_export`.  Deviations: the stage cut is the plan's; torch's schedule orders each
rank's forward and backward blocks itself (the plan's orders are not
re-checked); the tied head's copy (above); the program measures the step
barrier to barrier, not per node.

References
----------
Narayanan et al., SC'21, 2.2 (1F1B, interleaved), 2.3, 3 (PTD-P, rank
order); Shoeybi et al., "Megatron-LM", 2019, section 3; PyTorch
``torch.distributed.pipelining`` (``pipeline``, ``SplitPoint``,
``Schedule1F1B``, ``ScheduleInterleaved1F1B``),
``torch.distributed.tensor.parallel`` and ``DeviceMesh``; torchtitan
(``pipeline_llm`` with ``parallelize_module`` on the pp sub-mesh).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from ..errors import InvalidInput
from .export import launch_check_source, param_shapes, torchrun_line

_TP_ID = re.compile(r"^(.*?)/tp(\d+)(?:/(mb\d+|weights|accum\d+))?(?:/rep(\d+))?$")


@dataclass
class PipePlan:
    """The pipeline dimension of a TP x PP plan (:func:`pipe_plan`)."""

    pp: int                     # pipeline ranks
    v: int                      # stages (model chunks) per pipeline rank
    schedule: str               # SCHEDULES name (the recipe's)
    torch_class: str            # torch.distributed.pipelining class
    split_points: list          # module paths where stages 1.. begin
    rows: list                  # per replica: its micro-batches (first row, samples) of the global batch
    m: int                      # micro-batches per replica
    rank_devices: list          # cluster device of global rank t + tp (r + dp j)

    @property
    def n_stages(self) -> int:
        return self.pp * self.v


def mesh_rank(t: int, r: int, j: int, tp: int, dp: int) -> int:
    """Global rank of tensor rank *t* of pipeline rank *j* in replica *r* (module docstring).

    >>> [mesh_rank(t, r, j, 2, 2) for j in (0, 1) for r in (0, 1) for t in (0, 1)]
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> mesh_rank(1, 0, 1, 2, 1)
    3
    """
    return t + tp * (r + dp * j)


def has_pipeline(placement) -> bool:
    """Whether a tensor rank of *placement* (``<id>/tp<t>`` nodes of one replica) is on more
    than one device."""
    where: dict[tuple, set] = {}
    for nid, did in placement.assignment.items():
        mt = _TP_ID.match(nid)
        if mt is not None:
            where.setdefault((mt.group(4) or "0", mt.group(2)), set()).add(did)
    return any(len(ds) > 1 for ds in where.values())


def pipe_plan(placement, cluster, graph, sm, recipe: list, *, tp: int, dp: int, sp: bool, batch: int,
              kinds: dict, label: str) -> PipePlan:
    """The pipeline of the TP x PP placement *placement* of *graph* (the captured graph; *sm* its
    step module: parameters per node): the stages' pipeline ranks and split points, the schedule,
    each replica's micro-batches, the cluster device of every mesh rank (module docstring).
    *kinds*: module path -> class name of the model's modules.

    Raises
    ------
    InvalidInput
        What the module docstring lists as refused.
    """
    from ..sim.symmetric import expand, replica_map
    from ..transform.passes import node_passes
    from .pipe_export import _replica_rows, _split_point, recorded_schedule
    from .plan import batch_layout

    if isinstance(getattr(placement, "replicas", None), dict) and "tensor" in placement.replicas:
        placement = expand(None, cluster, placement, label, ranks_only=True)  # tensor rank 0 stands for every rank
    if sp:
        raise InvalidInput(f"{label}: sequence parallelism with a pipeline is not exported (pipeline()'s stages are "
                           f"traced at whole-sequence shapes); place it with -p sequence_parallel=false")
    sched = recorded_schedule(recipe)
    if sched is None:
        raise InvalidInput(f"{label}: the recipe names no pipeline schedule (a placement made before placer "
                           f"recorded it); place it again")
    # (base id, tensor rank, replica) -> the device of its first micro-batch's copy: the forward nodes that
    # run per micro-batch make the stages (a weight's once-per-step cast stays with its owner's stage)
    dev: dict[tuple[str, int, int], str] = {}
    for nid, did in placement.assignment.items():
        mt = _TP_ID.match(nid)
        if mt is not None and mt.group(3) == "mb0":
            dev[(mt.group(1), int(mt.group(2)), int(mt.group(4) or 0))] = did
    passes = node_passes(graph)
    place = {u for u in range(graph.n) if graph.op[u] == "placeholder"}
    fwd = [u for u in range(graph.n) if passes[u] == "forward" and u not in place
           and (graph.ids[u], 0, 0) in dev]
    if not fwd:
        raise InvalidInput(f"{label}: no forward node of tensor rank 0 is placed")
    runs: list[str] = []
    stage_of: dict[int, int] = {}
    for u in fwd:
        d = dev[(graph.ids[u], 0, 0)]
        if not runs or runs[-1] != d:
            runs.append(d)
        stage_of[u] = len(runs) - 1
    by_rank = list(dict.fromkeys(runs))                 # pipeline rank j -> device of tensor rank 0
    p = len(by_rank)
    v = len(runs) // p
    if len(runs) % p or any(runs[s] != by_rank[s % p] for s in range(len(runs))):
        raise InvalidInput(f"{label}: the forward nodes of tensor rank 0 run on {' -> '.join(runs)}: not {p} "
                           f"pipeline ranks taking stages in turn (a chain of module segments)")
    if v > 1 and not sched.chunked:
        raise InvalidInput(f"{label}: {v} stages per pipeline rank but the recipe's schedule is {sched.title}")
    splits = []
    for s in range(1, p * v):
        start = next(k for k, u in enumerate(fwd) if stage_of[u] == s)
        path = _split_point(sm, fwd, stage_of, start, s, kinds)
        if path is None:
            raise InvalidInput(f"{label}: pipeline stage {s} does not start at the call of a submodule whose "
                               f"parameters are all in it, so torch.distributed.pipelining cannot split the model "
                               f"there")
        splits.append(path)
    # tensor rank t of pipeline rank j (replica 0): the device of a forward node of j's first stage
    first = [next(u for u in fwd if stage_of[u] == j) for j in range(p)]
    cell: list[list[int]] = []
    for j in range(p):
        row = []
        for t in range(tp):
            did = dev.get((graph.ids[first[j]], t, 0))
            if did is None:
                raise InvalidInput(f"{label}: the placement does not place tensor rank {t} of pipeline rank {j}")
            row.append(cluster.index[did])
        cell.append(row)
    for u in fwd:
        for t in range(tp):
            did = dev.get((graph.ids[u], t, 0))
            if did is not None and cluster.index[did] != cell[stage_of[u] % p][t]:
                raise InvalidInput(f"{label}: forward node '{graph.ids[u]}' of tensor rank {t} is not on its "
                                   f"stage's device {cluster.ids[cell[stage_of[u] % p][t]]}")
    if dp > 1:
        if getattr(placement, "replicas", None) is None:
            raise InvalidInput(f"{label}: its {dp} replicas are not in the symmetric form (a replica map); "
                               f"place it again with --algo megatron")
        rmap = replica_map(placement.replicas, cluster, dp, label)
        col = {d: k for k, d in enumerate(rmap.devices[0])}
        if any(cell[j][t] not in col for j in range(p) for t in range(tp)):
            raise InvalidInput(f"{label}: the replica map does not cover replica 0's devices")
    devices = [0] * (tp * dp * p)
    for j in range(p):
        for r in range(dp):
            for t in range(tp):
                devices[mesh_rank(t, r, j, tp, dp)] = rmap.devices[r][col[cell[j][t]]] if dp > 1 else cell[j][t]
    if len(set(devices)) != len(devices):
        raise InvalidInput(f"{label}: two of the {len(devices)} ranks share a device")
    lay = batch_layout(recipe[1:], batch, label)
    if lay.total != batch:
        raise InvalidInput(f"{label}: the recipe's global batch is {lay.total}, the graph's {batch}")
    rows, why = _replica_rows(lay, lay.k, lay.m)
    if not rows:
        raise InvalidInput(f"{label}: {why}")
    if sched.chunked and lay.m % p:
        raise InvalidInput(f"{label}: {lay.m} micro-batches per replica, not a multiple of the {p} pipeline ranks "
                           f"that torch's {sched.torch_class} needs")
    return PipePlan(pp=p, v=v, schedule=sched.name, torch_class=sched.torch_class, split_points=splits, rows=rows,
                    m=lay.m, rank_devices=devices)


_DOC = '''"""TP x PP plan of {graph} on cluster {cluster}: placement {label} ({algorithm}).

{summary}

'''
_SUMMARY = ("Generated by `placer export` from model {spec}{config}: {n} processes on a 3-D DeviceMesh (\"dp\", "
            "\"pp\", \"tp\") of {dp} x {pp} x {tp}; global rank t + {tp}*(r + {dp}*j) is tensor rank t of pipeline "
            "rank j in replica r (Megatron-LM's order: tensor fastest, then data, then pipeline; cluster devices "
            "{devices}).  Over \"pp\" the model is split by torch.distributed.pipelining's pipeline() at "
            "{splits} into {stages} stages (stage s on pipeline rank s mod {pp}) and run by {sched} over "
            "{m} micro-batches of {mbs} sample(s) per replica; over \"tp\" each stage module is split with "
            "parallelize_module (TP_PLAN: ColwiseParallel, RowwiseParallel, the LM head's logits "
            "vocabulary-sharded under loss_parallel), its boundary activations sent as the replicated DTensors' "
            "local tensors; over \"dp\" every gradient is all-reduced over the replicas{tied}, and Adam updates "
            "each rank's shards.{recompute}  DTensor parameters inside torch.distributed.pipelining stages "
            "(torchtitan's composition), not local Megatron-style modules: the traced stages carry global "
            "shapes, which DTensor computes with.")

_PIPE_REST = '''
def make_mesh(device):
    """The 3-D mesh ("dp", "pp", "tp"): global rank t + TP (r + DP j) is tensor rank t of pipeline
    rank j in replica r (Megatron-LM's order; init_device_mesh would lay the ranks out row-major)."""
    from torch.distributed.device_mesh import DeviceMesh

    ranks = torch.arange(DP * PP * TP).reshape(PP, DP, TP).permute(1, 0, 2)
    return DeviceMesh(device.type, ranks, mesh_dim_names=("dp", "pp", "tp"))


def stages_of(pp_rank):
    """The stage indices pipeline rank *pp_rank* runs (stage s on rank s mod PP)."""
    return [s for s in range(N_STAGES) if s % PP == pp_rank]


def my_rows(dp_rank):
    """This replica's rows of the global batch, in micro-batch order (ROWS)."""
    return torch.cat([torch.arange(a, a + n) for a, n in ROWS[dp_rank]])


def shared_groups(pipe, mesh):
    """Parameters that more than one pipeline rank holds (a head tied to the word embedding: the
    tracer gives each stage that reads it a copy), and for each the group of those pipeline ranks
    of this rank's replica and tensor rank (Megatron-LM's embedding group): ``{name: group}``.
    Every rank creates every group, in one order (torch.distributed.new_group)."""
    holders = {}
    for s in range(N_STAGES):
        for name, _ in pipe.get_stage_module(s).named_parameters():
            holders.setdefault(name, set()).add(s % PP)
    me = dist.get_rank()
    out = {}
    for name in sorted(holders):
        ranks_pp = sorted(holders[name])
        if len(ranks_pp) < 2:
            continue
        for r in range(DP):
            for t in range(TP):
                ranks = [t + TP * (r + DP * j) for j in ranks_pp]
                group = dist.new_group(ranks)
                if me in ranks:
                    out[name] = group
    return out


def parallelize_stage(model, submod, mesh, device):
    """Stage module *submod* (pipeline()'s GraphModule: the model's module tree, InterpreterModules)
    split over mesh["tp"]: each TP_PLAN module it holds swapped for a copy of the model's own (the
    nn.Linear / nn.Embedding torch's styles take), the styles applied, every other parameter a
    replicated DTensor, the layers to recompute checkpointed; its floating-point inputs taken as
    replicated DTensors, its outputs handed on as local tensors (but the last stage's logits)."""
    import copy

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    held = {name for name, _ in submod.named_modules()}
    plan = [(p, s, o) for p, s, o in TP_PLAN if p in held]
    for path, _, _ in plan:
        parent, _, leaf = path.rpartition(".")
        setattr(submod.get_submodule(parent) if parent else submod, leaf, copy.deepcopy(model.get_submodule(path)))
    submod.to(device)
    tp = mesh["tp"]
    first, second = styles(plan)
    if first:
        parallelize_module(submod, tp, first)
    if second:
        parallelize_module(submod, tp, second)
    replicate_rest(submod, tp)
    checkpoint_layers(submod, [p for p in RECOMPUTE_LAYERS if p in held])
    fwd = submod.forward

    def forward(*args, _fwd=fwd, last=submod is LAST):
        args = [DTensor.from_local(a, tp, [Replicate()], run_check=False)
                if torch.is_tensor(a) and not isinstance(a, DTensor) and a.is_floating_point() else a for a in args]
        out = _fwd(*args)
        if last:
            return out
        local = lambda x: x.redistribute(tp, [Replicate()]).to_local() if isinstance(x, DTensor) else x  # noqa: E731
        return tuple(local(x) for x in out) if isinstance(out, tuple) else local(out)

    submod.forward = forward
    return submod


def setup(model, device):
    """The mesh, the stages of this rank (split, parallelized, in torch's schedule), Adam, the
    groups of shared parameters, this replica's batch: a dict."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    from torch.distributed.pipelining import schedules

    import logging
    import warnings

    global LAST
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch's own, when splitting
    logging.getLogger("torch.distributed.pipelining._IR").setLevel(logging.ERROR)     # "Skipping device modification"
    register_attention_rules()
    mesh = make_mesh(device)
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    inputs, target = example_batch(model)
    rows = my_rows(dp_rank)
    inputs = [x.index_select(0, rows) for x in inputs]
    target = target.index_select(0, rows) if target is not None else None
    mb = [torch.tensor_split(x, N_MICROBATCHES)[0].to(device) for x in inputs]
    model.to(device)                # traced on the device it runs on (the trace keeps the devices it saw)
    pipe = pipeline(model, mb_args=tuple(mb), split_spec={p: SplitPoint.BEGINNING for p in SPLIT_POINTS})
    shared = shared_groups(pipe, mesh)
    LAST = pipe.get_stage_module(N_STAGES - 1)
    stages = []
    for s in stages_of(pp_rank):
        parallelize_stage(model, pipe.get_stage_module(s), mesh, device)
        stages.append(pipe.build_stage(s, device, mesh["pp"].get_group()))
    weight = ROWS[dp_rank][0][1] / GLOBAL_BATCH
    has_target = target is not None
    if target is None:              # torch's schedule hands its loss_fn a chunk of some target
        target = torch.zeros(len(rows))

    def loss_fn(out, tgt):
        return step_loss(model, out, tgt if has_target else None) * weight

    cls = getattr(schedules, SCHEDULE)
    sched = cls(stages if len(stages) > 1 else stages[0], n_microbatches=N_MICROBATCHES, loss_fn=loss_fn,
                scale_grads=False)
    modules = [st.submod for st in stages]
    params = [p for mod in modules for p in mod.parameters()]
    if ZERO and DP > 1:     # the distributed optimizer: Adam on this rank's 1/DP shard of every parameter
        opt = ZeroAdam(params, mesh["dp"].get_group(), LR, BETAS, EPS)
    else:
        opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    return {"mesh": mesh, "sched": sched, "modules": modules, "opt": opt, "shared": shared,
            "inputs": [x.to(device) for x in inputs], "target": target.to(device), "pp_rank": pp_rank}


def train_step(job, device):
    """One step: the schedule over this replica's micro-batches, every gradient summed over the
    replicas (and a shared parameter's over its pipeline ranks), Adam (under ZeRO: the shared
    parameter's sum first, then ZeroAdam's reduce-scatter over the replicas, Adam on the shard,
    all-gather).  Returns this rank's share
    of the batch's loss (its weighted micro-batch losses on the last stage's tensor rank 0, else 0)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import loss_parallel

    mesh, opt = job["mesh"], job["opt"]
    opt.zero_grad(set_to_none=True)
    first, last = job["pp_rank"] == 0, job["pp_rank"] == PP - 1
    losses = [] if last else None
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    with implicit_replication(), loss_parallel():
        with torch.autocast(device.type, dtype=half or torch.bfloat16, enabled=half is not None):
            job["sched"].step(*(job["inputs"] if first else ()), target=job["target"] if last else None,
                              losses=losses)
    total = torch.zeros(1, dtype=torch.float64, device=device)
    if last and mesh["tp"].get_local_rank() == 0:
        total += sum(float((x.full_tensor() if isinstance(x, DTensor) else x).detach()) for x in losses)
    named = [(n, p) for mod in job["modules"] for n, p in mod.named_parameters() if p.grad is not None]
    for _, p in named:              # each gradient laid out as its parameter (partial sums over the tensor
        g = p.grad                  # ranks reduced once, a replicated gradient of a sharded weight sliced)
        if isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(g.device_mesh, p.placements)
    local = lambda g: g.to_local() if isinstance(g, DTensor) else g          # noqa: E731
    if DP > 1 and not ZERO:     # under ZeRO the optimizer reduce-scatters them (ZeroAdam.step)
        works = [dist.all_reduce(local(p.grad), group=mesh["dp"].get_group(), async_op=True) for _, p in named]
        for w in works:
            w.wait()
    for n, p in named:
        if n in job["shared"]:
            dist.all_reduce(local(p.grad), group=job["shared"][n])
    opt.step()
    return total


def full_parameters(modules):
    """Every parameter of this rank's stages whole (a gather of the tensor shards: every tensor rank
    of the stage calls it), on the CPU."""
    out = {}
    for mod in modules:
        for name, p in mod.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = t.detach().cpu().clone()
    return out


def run(model, device, steps, out=None):
    """The first step and *steps* timed ones of *model* (build_model(), checked) on this rank:
    ``(the step's loss, whole parameters of this rank's stages after the first step when *out*,
    else None, wall seconds of the timed steps)``."""
    job = setup(model, device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    mine = train_step(job, device)
    dist.all_reduce(mine)               # the last stage's tensor rank 0 of every replica: the batch's loss
    loss = float(mine)
    params = full_parameters(job["modules"]) if out else None
    walls = []
    for _ in range(int(steps)):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        train_step(job, device)
        sync()
        wall = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        walls.append(float(wall))
    return loss, params, walls


#: the ranks in words, for the first step's line
RANKS = f"{DP} replica(s) of {PP} pipeline x {TP} tensor ranks"
'''


def tp3d_source(pre, cluster, *, label: str, algorithm: str, fingerprint: dict | None = None,
                path: str = "-") -> str:
    """The program of the TP x PP plan *pre* (:class:`~.tp_run.TPPrepared` with ``pipe``, a
    :class:`PipePlan`) on *cluster* (module docstring): its docstring with the torchrun line for
    *path*, the plan's tables, the launch checks and the step.  The same inputs give the same bytes."""
    from ..pipelining.schedules import SCHEDULES
    from .executor import ADAM
    from .tp_export import _BODY, _LAUNCH, _MAIN, ZERO_SOURCE, zero_table, zero_words

    step, pipe = pre.step, pre.pipe
    n = pre.k
    launch = torchrun_line(n, path)
    config = f" with config {step.config}" if step.config else ""
    sizes = sorted({s for row in pipe.rows for _, s in row})
    recompute = (f"  Recomputation: {', '.join(pre.recompute_layers)} run under torch.utils.checkpoint."
                 if pre.recompute_layers else
                 ("  Recomputation (selective) is not applied: the program keeps every activation."
                  if pre.recompute else ""))
    sched = SCHEDULES[pipe.schedule]
    summary = _SUMMARY.format(spec=step.spec, config=config, n=n, dp=pre.dp, pp=pipe.pp, tp=pre.tp,
                              devices=", ".join(cluster.ids[d] for d in pre.devices),
                              splits=", ".join(pipe.split_points), stages=pipe.n_stages,
                              sched=f"{pipe.torch_class} ({sched.words(pipe.v)})", m=pipe.m,
                              mbs="/".join(map(str, sizes)),
                              tied=" (a parameter held by two pipeline ranks, the tied LM head's, also over them)"
                              if pre.tied else "", recompute=recompute + zero_words(pre.zero, pre.dp))
    doc = (_DOC.format(graph=pre.sim_graph.name, cluster=cluster.name, label=label, algorithm=algorithm,
                       summary=textwrap.fill(summary, 100, break_on_hyphens=False))
           + _LAUNCH.format(n=n, launch=launch, saved=" of its stages"))
    plan_lines = "".join(f"    ({p!r}, {s!r}, {o!r}),\n" for p, s, o in pre.module_plan)
    tables = (f"MODEL, CONFIG, GLOBAL_BATCH, SEED = {step.spec!r}, {dict(step.config or {})!r}, "
              f"{pre.global_batch!r}, {step.seed!r}\n"
              f"#: the profiled precision (bf16 / fp16: torch.autocast, no loss scale)\n"
              f"PRECISION = {pre.precision!r}\n"
              f"#: the mesh: DP replicas x PP pipeline ranks x TP tensor ranks; the cluster device of global rank\n"
              f"#: t + TP * (r + DP * j)\n"
              f"DP, PP, TP = {pre.dp!r}, {pipe.pp!r}, {pre.tp!r}\n"
              f"RANK_DEVICES = {[cluster.ids[d] for d in pre.devices]!r}\n"
              f"SEQUENCE_PARALLEL = False\n"
              f"{zero_table(pre.zero)}"
              f"#: the stages: pipeline() splits the model where each of SPLIT_POINTS begins; stage s on pipeline\n"
              f"#: rank s mod PP; torch's schedule class and its micro-batches per replica\n"
              f"SPLIT_POINTS = {pipe.split_points!r}\n"
              f"N_STAGES = {pipe.n_stages!r}\n"
              f"SCHEDULE, N_MICROBATCHES = {pipe.torch_class!r}, {pipe.m!r}\n"
              f"#: per replica: its micro-batches as (first row, samples) of the global batch\n"
              f"ROWS = {pipe.rows!r}\n"
              f"#: (module path, style, options) over mesh['tp'], in the model's module order\n"
              f"TP_PLAN = [\n{plan_lines}]\n"
              f"#: transformer layers run under torch.utils.checkpoint (recompute=full)\n"
              f"RECOMPUTE_LAYERS = {pre.recompute_layers!r}\n"
              f"#: the simulated step of the plan (placer's simulator, seconds)\n"
              f"SIMULATED_STEP_S = {float(pre.sim['makespan_s'])!r}\n"
              f"LR, BETAS, EPS = {ADAM['lr']!r}, {ADAM['betas']!r}, {ADAM['eps']!r}\n"
              f"LAST = None       # the last stage's module (setup)\n\n")
    checks = launch_check_source(processes=n, launch=launch, fingerprint=fingerprint, parameters=param_shapes(step))
    return doc + tables + checks + _BODY.lstrip("\n") + ZERO_SOURCE.lstrip("\n") + _PIPE_REST.lstrip("\n") + _MAIN
