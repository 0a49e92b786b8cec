"""``placer export`` of a tensor-parallel plan (``place --algo megatron -p
tp=T -p pp=1``: tensor parallelism, micro-batches, optional recomputation,
data parallelism over ``D`` replicas) as one PyTorch program launched with
``torchrun --nproc-per-node T*D``.

The program builds a two-dimensional :class:`DeviceMesh` ``("dp", "tp")``
of ``D x T`` processes (``init_device_mesh``, rank ``r T + t`` is tensor
rank ``t`` of replica ``r``: Megatron-LM's order, tensor ranks innermost,
``parallel_state``), then applies
``torch.distributed.tensor.parallel.parallelize_module`` over ``mesh["tp"]``
with the plan's module styles (:func:`~.tp_run.module_plan`: the derivation's
patterns - :func:`~celeritas_cli.transform.tensor_parallel.find_patterns` on
the profiled graph - mapped to the model's module paths through the
parameters their nodes read):

=====================================  =====================================================
pattern (Shoeybi et al. 2019, 3)       torch style
=====================================  =====================================================
MLP ``fc`` / attention QKV (columns)   ``ColwiseParallel`` (attention: DTensor output)
MLP ``fc2`` / attention projection     ``RowwiseParallel``
word embedding (vocabulary-parallel)   ``RowwiseParallel(input_layouts=Replicate())``
LM head (its own ``nn.Linear``)        ``ColwiseParallel(output_layouts=Shard(-1))``, logits
                                       kept vocabulary-sharded, ``loss_parallel()``
LM head tied to the embedding          none: the root reads the split table, the logits
                                       come out vocabulary-sharded, ``loss_parallel()``
LayerNorm under sequence parallelism   ``SequenceParallel()`` (Korthikanti et al. 2022, 4.2.2)
=====================================  =====================================================

Attention heads: a fused QKV projection laid out ``[3, heads, head size]``
(GPT-2's ``c_attn``, the zoo's GPT; the 3 is its width over the hidden
size) is held as DTensor's ``_StridedShard(0, split_factor=3)``: each rank
holds its heads of Q, K and V (what Megatron-LM's head-major layout gives
with a plain column split), multiplies them locally as Megatron-LM's
column-parallel layer (its input gradient a partial sum: f's all-reduce, or
reduce-scatter, in the backward) and returns a DTensor sharded by heads, so
the model's own reshapes into heads run on global shapes and give
``Shard(heads)``: no per-rank head count is patched (torchtitan rewrites
``n_heads``; the zoo's GPT derives its head size from the input width, which
that would break).  Separate Q, K and V projections are ``ColwiseParallel``
with a DTensor output.  The CPU flash-attention kernel has no DTensor rule in
torch 2.13, so the program registers one (``register_sharding``: batch or
heads sharded; CUDA's kernels have theirs).  Any other layout still computes
the right step: DTensor redistributes what it cannot keep sharded (extra
collectives, never other numbers).

Under sequence parallelism the residual stream stays a DTensor sharded on
dimension 1 (the sequence of batch-first models) from the embedding (whose
output is reduce-scattered) to the last LayerNorm; a column-parallel input
is all-gathered, a row-parallel output reduce-scattered, as Megatron-LM.
Plain tensors that meet DTensors (a position embedding, a target) are taken
as replicated (``implicit_replication``).

The whole step runs on DTensors: every parameter the plan does not split is
a replicated DTensor, every style keeps DTensor outputs, and a partial
gradient over the tensor ranks (sequence parallelism's LayerNorm and
position-embedding gradients) is all-reduced once before Adam (Megatron-LM's
``allreduce_layernorm_grads``).  The collectives of a step are the
derivation's (checked in tests/run/test_export_tp.py with ``CommDebugMode``)
but for three deviations: ``loss_parallel``'s cross entropy all-reduces the
max, the sum of exponentials and the target logit apart (the derivation:
one collective); under sequence parallelism autograd keeps a column-parallel
layer's gathered input for its weight gradient (Megatron-LM gathers it
again: one all-gather less per layer and pass) and a row-parallel bias's
gradient is summed from the gathered output gradient (the derivation
all-reduces it before its update).

Data parallelism over ``mesh["dp"]``: every replica trains on its rows of
the global batch (the recipe's instances, :func:`~.plan.batch_layout`); each
micro-batch's loss is weighted by its share of the global batch and the
gradients accumulate, then every gradient is all-reduced (summed) over the
replica group - one all-reduce per gradient tensor as the plan's
data-parallel step, started as soon as autograd has accumulated it on the
last micro-batch (``register_post_accumulate_grad_hook``; DDP's buckets are
not used: torch's ``DistributedDataParallel`` takes no DTensor
parameters) - and Adam (``foreach=False``) updates each rank's shards.
ZeRO over ``mesh["dp"]`` (the data-parallel step's ``zero`` 1 or 2: ``-p
use_distributed_optimizer=true``, Megatron-LM's distributed optimizer; the 3d
planner may pick it): no gradient all-reduce; after the last micro-batch
``ZeroAdam`` (:data:`ZERO_SOURCE`, written into the program) flattens every
gradient's local tensor (each tensor rank shards its own part of a DTensor
over the replicas), pads it with zeros to a multiple of ``D``,
reduce-scatters it over ``mesh["dp"]``, runs ``torch.optim.Adam`` (the same
``lr``, ``betas``, ``eps``, ``foreach=False``) on this rank's shard - Adam is
element-wise, so the shard's new values are the unsharded Adam's bit for bit
given the same gradient sums, which differ only in the reduction order - and
all-gathers the updated shards back into the parameter (Rajbhandari et al.,
"ZeRO", SC'20, 5.1 P_os and 5.2 P_os+g; Megatron-LM
``--use-distributed-optimizer``).  ZeRO-1 and ZeRO-2 run the same program:
what stage 2 saves (each rank keeps only its reduced gradient shard) is
memory, not observable on the CPU.  Why not FSDP2's ``fully_shard(module,
mesh=mesh["dp"])``: it shards the parameters between steps and all-gathers
them before every forward (ZeRO-3; ``reshard_after_forward=False`` still
gathers once per step before the forward) and reduce-scatters at each
micro-batch's backward unless gradient sync is turned off for all but the
last, so its collectives are not the plan's (reduce-scatter of the
accumulated gradients, all-gather after the update, whole parameters kept);
and one small class serves the three programs alike (DTensor parameters,
``torch.distributed.pipelining`` stages, plain modules: :mod:`.pipe_export`)
where ``fully_shard`` on traced pipeline stages over gloo is untested here.
Deviation: the reduce-scatters start after the last micro-batch's backward,
not bucket by bucket during it (Megatron-LM overlaps them).

Recomputation (``-p recompute=full``): every transformer layer (the
module holding an attention and the MLP after it) runs under
``torch.utils.checkpoint`` (Megatron-LM's ``--recompute-granularity full
--recompute-method uniform --recompute-num-layers 1``); ``selective`` is
not applied (the program keeps every activation; the numbers are the same).

Deviations: mixed precision is ``torch.autocast`` of the profiled
precision without a loss scale; dropout masks are DTensor's (seeded alike
on every rank, not the unplaced step's); the sequence dimension is taken to
be dimension 1; a pipeline (``pp > 1``) is the TP x PP program of :mod:`.tp3d_export`.

References
----------
Shoeybi et al., "Megatron-LM", 2019, section 3; Narayanan et al., SC'21,
2.3; Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", 2022, 4.2.2; PyTorch ``torch.distributed.tensor.parallel``
(``parallelize_module``, ``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``loss_parallel``).
"""

from __future__ import annotations

import textwrap

from .export import LOSS_SOURCE, MODEL_SOURCE, launch_check_source, param_shapes, torchrun_line

_DOC = '''"""Tensor-parallel plan of {graph} on cluster {cluster}: placement {label} ({algorithm}).

{summary}

'''
#: the summary paragraph of the docstring (wrapped at 100 columns by :func:`tp_source`)
_SUMMARY = ("Generated by `placer export` from model {spec}{config}: {n} processes on a DeviceMesh (\"dp\", \"tp\") "
            "of {dp} x {tp} (rank r*{tp}+t is tensor rank t of replica r; cluster devices {devices}).  Over \"tp\" "
            "the model is split with torch.distributed.tensor.parallel.parallelize_module (TP_PLAN: "
            "ColwiseParallel, RowwiseParallel{sp_word}, the LM head's logits vocabulary-sharded under "
            "loss_parallel); over \"dp\" replica r trains on its rows of the global batch of {total} samples "
            "({mbs}), every gradient is all-reduced over the replicas, and Adam updates each rank's shards.{recompute}")
_LAUNCH = '''Launch it with

    {launch}

(each process on cuda:LOCAL_RANK when its host has a GPU for each of its processes, else every
process on the CPU; NCCL on GPUs, else gloo; on H hosts, torchrun --nnodes H --nproc-per-node {n}/H
--rdzv-backend c10d --rdzv-endpoint HOST:PORT on each, {n} processes in all).  Before any step every process checks the
launch (launch_check, model_check: the process count, the graph and cluster it was exported for with
--graph FILE / --cluster NAME|FILE, the model's parameter shapes and file) and stops in one line when
it is wrong.  Rank 0 then prints the first step's loss and the measured step time (the median of
--steps N timed steps after it, default 3, the slowest rank's) next to the simulated one, as
`placer run` prints them:

    step: measured 0.0123 s (median of 3), simulated 0.0100 s, measured/simulated 1.23

With PLACER_EXPORT_OUT=PREFIX each rank saves the first step's loss and the whole updated
parameters{saved} to PREFIX.<rank> (torch.save).
"""

import os
import statistics
import sys
import time

'''

#: the program's head and helpers, shared with the TP x PP program (:mod:`.tp3d_export`)
_BODY = MODEL_SOURCE + LOSS_SOURCE + '''def register_attention_rules():
    """DTensor rules for the CPU flash-attention kernels (torch has them for CUDA's): batch or
    heads sharded, the same on every input and output, or all replicated."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if fwd is None:
        return

    @register_sharding(fwd.default)
    def _fwd(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        return [([p, p], [p, p, p, None, None]) for p in (Replicate(), Shard(0), Shard(1))]

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    def _bwd(grad, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
        return [([p] * 3, [p] * 6 + [None, None]) for p in (Replicate(), Shard(0), Shard(1))]


def styles(plan=None):
    """The parallel style of each entry of *plan* (default TP_PLAN; module docstring): ``(first,
    second)``, the plans of two parallelize_module passes (the second wraps outputs the first
    already made)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel
    from torch.distributed.tensor.placement_types import _StridedShard

    class HeadsColwiseParallel(ParallelStyle):
        """Column parallelism of a fused projection laid out [split_factor, heads, head size] (Q, K, V):
        each rank holds its heads of every part (_StridedShard(0, split_factor)) and multiplies them
        locally, as Megatron-LM's column-parallel layer: the input gathered over the sequence under
        sequence parallelism (f), its gradient declared a partial sum (all-reduced, or reduce-scattered,
        by f's backward), the output a DTensor sharded by heads, so the model's reshapes into heads
        run on global shapes.  (DTensor has no matmul rule for _StridedShard: a plain ColwiseParallel
        of these weights would gather the output gradient and the weight in the backward.)"""

        def __init__(self, split_factor, input_layouts):
            super().__init__()
            self.split_factor, self.input_layouts = split_factor, input_layouts

        def _apply(self, module, mesh):
            strided = _StridedShard(0, split_factor=self.split_factor)
            for pname, param in list(module.named_parameters(recurse=False)):
                module.register_parameter(pname, torch.nn.Parameter(distribute_tensor(param.data, mesh, [strided]),
                                                                    requires_grad=param.requires_grad))
            layout, sf = self.input_layouts, self.split_factor

            def forward(x):
                if not isinstance(x, DTensor):
                    x = DTensor.from_local(x, mesh, [layout], run_check=False)
                x = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
                bias = module.bias.to_local() if module.bias is not None else None
                out = torch.nn.functional.linear(x, module.weight.to_local(), bias)
                shape = (*out.shape[:-1], out.shape[-1] * mesh.size())
                stride = tuple(int(torch.tensor(shape[k + 1:]).prod()) for k in range(len(shape)))
                return DTensor.from_local(out, mesh, [_StridedShard(out.dim() - 1, split_factor=sf)],
                                          run_check=False, shape=torch.Size(shape), stride=stride)

            module.forward = forward
            return module

    from torch.distributed.tensor.parallel import PrepareModuleOutput

    seq = Shard(1) if SEQUENCE_PARALLEL else Replicate()
    first, second = {}, {}
    for path, style, opts in (TP_PLAN if plan is None else plan):
        if style == "colwise" and opts.get("split_factor", 1) > 1:
            first[path] = HeadsColwiseParallel(opts["split_factor"], input_layouts=seq)
        elif style == "colwise":
            first[path] = ColwiseParallel(input_layouts=seq, use_local_output=False)
        elif style == "rowwise":
            first[path] = RowwiseParallel(output_layouts=seq, use_local_output=False)
        elif style == "embedding":
            first[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq, use_local_output=False)
        elif style == "head":
            first[path] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        elif style == "sequence":
            first[path] = SequenceParallel()
        elif style == "head_input":     # the tied head's input, gathered over the sequence first (Megatron)
            second[path] = PrepareModuleOutput(output_layouts=seq, desired_output_layouts=Replicate(),
                                               use_local_output=False)
        else:
            raise ValueError(f"unknown style {style!r} of {path}")
    return first, second


def replicate_rest(model, mesh):
    """Every parameter the plan does not split becomes a replicated DTensor, so that the whole
    step runs on DTensors (a plain tensor that needs a gradient never meets a DTensor)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if not isinstance(p, DTensor):
                mod.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Replicate()]),
                                                                requires_grad=p.requires_grad))


def checkpoint_layers(model, layers=None):
    """Recomputation: each of *layers* (default RECOMPUTE_LAYERS) runs under torch.utils.checkpoint."""
    from torch.utils.checkpoint import checkpoint

    for path in (RECOMPUTE_LAYERS if layers is None else layers):
        mod = model.get_submodule(path)
        fwd = mod.forward

        def run(*args, _fwd=fwd, **kw):
            return checkpoint(_fwd, *args, use_reentrant=False, **kw)

        mod.forward = run


'''

#: the sharded optimizer of a plan with ZeRO stage 1 or 2 over the replicas (every program that has
#: a "dp" dimension: TP, TP x PP, pipeline x DP); its own source, so the pipeline program takes it too
ZERO_SOURCE = '''
class ZeroAdam:
    """Megatron-LM's distributed optimizer (ZeRO stage 1; stage 2 runs the same code, its memory
    saving - each rank keeps only its reduced gradient shard - is not observable on the CPU):
    for every parameter (a DTensor's local tensor: each tensor rank shards its own part), flattened
    and padded with zeros to a multiple of the replicas, the gradient is reduce-scattered (summed)
    over the replica group, torch.optim.Adam (the same hyper-parameters, foreach=False: the
    per-element update of the unsharded Adam) updates this rank's 1/DP shard and its moments, and
    the updated shards are all-gathered back into the parameter.  Padding gets a zero gradient, so
    it stays zero.  Not FSDP2's fully_shard(module, mesh=mesh["dp"]): that keeps the parameters
    sharded, all-gathers them before the forward and reduce-scatters at every micro-batch's
    backward, collectives the plan does not have; this keeps whole parameters, as the plan.
    Rajbhandari et al., "ZeRO", SC'20, 5.1-5.2; Megatron-LM --use-distributed-optimizer (docs:
    distrib_optimizer.md)."""

    def __init__(self, params, group, lr, betas, eps):
        self.group = group
        self.n, self.me = dist.get_world_size(group), dist.get_rank(group)
        self.params = [p for p in params if p.requires_grad]
        self.sizes, self.shards = [], []
        for p in self.params:
            local = self.local(p)
            per = -(-local.numel() // self.n)
            flat = self.padded(local.detach(), per)
            self.sizes.append(per)
            self.shards.append(torch.nn.Parameter(flat[self.me * per:(self.me + 1) * per].clone()))
        self.opt = torch.optim.Adam(self.shards, lr=lr, betas=betas, eps=eps, foreach=False)

    @staticmethod
    def local(t):
        """A DTensor's local tensor (its storage), else *t*."""
        return t._local_tensor if hasattr(t, "_local_tensor") else t

    def padded(self, t, per):
        flat = torch.zeros(per * self.n, dtype=t.dtype, device=t.device)
        flat[:t.numel()] = t.reshape(-1)
        return flat

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        works = []
        for p, shard, per in zip(self.params, self.shards, self.sizes):
            if p.grad is None:
                shard.grad = None
                continue
            shard.grad = torch.empty_like(shard)
            works.append(rs(shard.grad, self.padded(self.local(p.grad), per), group=self.group, async_op=True))
        for w in works:
            w.wait()
        self.opt.step()
        gathered = []
        for p, shard, per in zip(self.params, self.shards, self.sizes):
            out = torch.empty(per * self.n, dtype=shard.dtype, device=shard.device)
            gathered.append((p, out, ag(out, shard.detach(), group=self.group, async_op=True)))
        for p, out, w in gathered:
            w.wait()
            local = self.local(p)
            local.copy_(out[:local.numel()].view_as(local))


'''

#: the rest of the TP program (the 3D program, :mod:`.tp3d_export`, has its own)
_TP_REST = '''
def parallelize(model, mesh, device):
    """Apply the plan to *model* on *mesh* ("dp", "tp"): the TP styles over mesh["tp"], the layers
    to recompute; returns the gradient all-reduce of the replicas (or None with one replica, or
    under ZeRO, whose optimizer reduce-scatters the gradients itself: ZeroAdam)."""
    from torch.distributed.tensor.parallel import parallelize_module

    register_attention_rules()
    model.to(device)
    first, second = styles()
    parallelize_module(model, mesh["tp"], first)
    if second:
        parallelize_module(model, mesh["tp"], second)
    replicate_rest(model, mesh["tp"])
    checkpoint_layers(model)
    return GradAllReduce(model, mesh["dp"]) if DP > 1 and not ZERO else None


class GradAllReduce:
    """Every gradient (its local shard) summed over the replica group as soon as autograd has
    accumulated it on the last micro-batch (one all-reduce per gradient tensor, async)."""

    def __init__(self, model, dp_mesh):
        self.group, self.works, self.armed = dp_mesh.get_group(), [], False
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, p):
        if self.armed:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            self.works.append(dist.all_reduce(g, group=self.group, async_op=True))

    def wait(self):
        for w in self.works:
            w.wait()
        self.works = []


def my_rows(dp_rank):
    """This replica's micro-batches: ``[(first row, samples)]`` of the global batch (INSTANCES)."""
    return [(row, n) for r, row, n in INSTANCES if r == dp_rank]


def train_step(model, opt, allreduce, batches, device):
    """One step: every micro-batch's loss weighted by its share of the global batch, gradients
    accumulated, all-reduced over the replicas, Adam.  Returns this replica's weighted loss."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import loss_parallel

    opt.zero_grad(set_to_none=True)
    total = torch.zeros(1, dtype=torch.float64, device=device)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    for i, (inputs, target, weight) in enumerate(batches):
        if allreduce is not None:
            allreduce.armed = i == len(batches) - 1
        with implicit_replication(), loss_parallel():
            with torch.autocast(device.type, dtype=half or torch.bfloat16, enabled=half is not None):
                out = model(*inputs)
                loss = step_loss(model, out, target)
            (loss * weight).backward()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
        total += float(loss.detach()) * weight
    if allreduce is not None:
        allreduce.wait()
    for p in model.parameters():    # partial sums over the tensor ranks (sequence parallelism's LayerNorm
        g = p.grad                  # gradients, Megatron's allreduce_layernorm_grads): reduced once, not per op
        if isinstance(g, DTensor) and any(q.is_partial() for q in g.placements):
            p.grad = g.redistribute(g.device_mesh, p.placements)
    opt.step()
    return total


def full_parameters(model):
    """Every parameter whole (a gather of the tensor shards: every rank calls it), on the CPU."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().cpu().clone()
    return out


def setup(model, device):
    """The mesh, the plan applied to *model* (built and checked), Adam (ZeroAdam under ZeRO) and this
    rank's micro-batches."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (DP, TP), mesh_dim_names=("dp", "tp"))
    inputs, target = example_batch(model)
    batches = []
    for row, n in my_rows(mesh["dp"].get_local_rank()):
        batches.append((tuple(x[row:row + n].to(device) for x in inputs),
                        None if target is None else target[row:row + n].to(device), n / GLOBAL_BATCH))
    allreduce = parallelize(model, mesh, device)
    if ZERO and DP > 1:         # the distributed optimizer: Adam on this rank's 1/DP shard of every parameter
        opt = ZeroAdam(model.parameters(), mesh["dp"].get_group(), LR, BETAS, EPS)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, foreach=False)
    return model, opt, allreduce, batches, mesh


def run(model, device, steps, out=None):
    """The first step and *steps* timed ones of *model* (built_model(), checked) on this rank:
    ``(the step's loss, whole parameters after the first step when *out*, else None, wall
    seconds of the timed steps)``."""
    model, opt, allreduce, batches, mesh = setup(model, device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    mine = train_step(model, opt, allreduce, batches, device)
    dist.all_reduce(mine, group=mesh["dp"].get_group())       # the weighted losses of the replicas
    loss = float(mine)
    params = full_parameters(model) if out else None
    walls = []
    for _ in range(int(steps)):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        train_step(model, opt, allreduce, batches, device)
        sync()
        wall = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        walls.append(float(wall))
    return loss, params, walls


#: the ranks in words, for the first step's line
RANKS = f"{DP} replica(s) of {TP} tensor ranks"
'''


#: every TP program's main(): the launch, the process group, the step, the report line placer calibrate reads
_MAIN = '''

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    launch_check(argv)
    steps = os.environ.get("PLACER_STEPS") or _option(argv, "--steps") or "3"
    if not steps.isdigit():
        _wrong(f"--steps {steps}: expected the number of timed steps after the first (0 or more)")
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    model = build_model()
    model_check(model)          # before the process group: a wrong model file stops every rank alike
    # one GPU per process of this host, else every process on the CPU (one backend for all ranks)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("nccl" if cuda else "gloo")
    out = os.environ.get("PLACER_EXPORT_OUT")
    loss, params, walls = run(model, device, steps, out)
    if out:
        torch.save({"loss": loss, "params": params}, f"{out}.{rank}")
    if rank == 0:
        print(f"loss {loss:.6f} (first step, over {RANKS})")
        if walls:
            med = statistics.median(walls)
            ratio = f", measured/simulated {med / SIMULATED_STEP_S:.2f}" if SIMULATED_STEP_S > 0 else ""
            print(f"step: measured {med:.6g} s (median of {len(walls)}), simulated {SIMULATED_STEP_S:.6g} s{ratio}")
        sys.stdout.flush()
    dist.barrier()              # every rank done before any tears its connections down (gloo aborts otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def zero_table(zero: int) -> str:
    """The program's ``ZERO`` line: the ZeRO stage of its data-parallel step (0: Adam replicated).

    >>> zero_table(1).splitlines()[-1]
    'ZERO = 1'
    """
    return (f"#: ZeRO stage over mesh['dp'] (1, 2: Megatron-LM's distributed optimizer, ZeroAdam; 0: Adam on every\n"
            f"#: replica); stages 1 and 2 run the same program\n"
            f"ZERO = {int(zero)!r}\n")


def zero_words(zero: int, dp: int) -> str:
    """The docstring's sentence on a sharded optimizer, or "".

    >>> zero_words(0, 2), zero_words(2, 1)
    ('', '')
    """
    if not zero or dp < 2:
        return ""
    return (f"  ZeRO stage {zero} (Megatron-LM's distributed optimizer): instead of the all-reduce, each gradient "
            f"is reduce-scattered over \"dp\" (flattened, padded to a multiple of {dp}), Adam updates this "
            f"rank's 1/{dp} shard and its moments, and the shards are all-gathered back into the parameter "
            f"(ZeroAdam, not FSDP2's fully_shard, which would gather the parameters before the forward and "
            f"reduce-scatter at every micro-batch: not the plan's collectives; a DTensor's local tensor is what is "
            f"sharded).  Stages 1 and 2 run this same program: "
            f"stage 2's memory saving (only the reduced gradient shard kept) is not observable on the CPU.")


def tp_source(pre, cluster, *, label: str, algorithm: str, fingerprint: dict | None = None,
              path: str = "-") -> str:
    """The program of the tensor-parallel plan *pre* (:class:`~.tp_run.TPPrepared`) on *cluster*
    (module docstring): its docstring with the torchrun line for *path*, the plan's tables
    (``TP_PLAN``, ``INSTANCES``, ...), the launch checks (:func:`~.export.launch_check_source`) and
    the step.  The same inputs give the same bytes."""
    from .executor import ADAM

    step = pre.step
    n = pre.tp * pre.dp
    launch = torchrun_line(n, path)
    config = f" with config {step.config}" if step.config else ""
    sizes = sorted({s for _, _, s in pre.instances})
    per = len(pre.instances) // pre.dp
    mbs = (f"{per} micro-batch{'es' if per > 1 else ''} of {'/'.join(map(str, sizes))} sample(s) each, gradients "
           f"accumulated")
    recompute = (f"  Recomputation: {', '.join(pre.recompute_layers)} run under torch.utils.checkpoint."
                 if pre.recompute_layers else
                 ("  Recomputation (selective) is not applied: the program keeps every activation."
                  if pre.recompute else ""))
    summary = _SUMMARY.format(spec=step.spec, config=config, n=n, dp=pre.dp, tp=pre.tp,
                              devices=", ".join(cluster.ids[d] for d in pre.devices), total=pre.global_batch,
                              mbs=mbs, sp_word=", SequenceParallel" if pre.sp else "",
                              recompute=recompute + zero_words(pre.zero, pre.dp))
    doc = (_DOC.format(graph=pre.sim_graph.name, cluster=cluster.name, label=label, algorithm=algorithm,
                       summary=textwrap.fill(summary, 100, break_on_hyphens=False))
           + _LAUNCH.format(n=n, launch=launch, saved=""))
    plan_lines = "".join(f"    ({p!r}, {s!r}, {o!r}),\n" for p, s, o in pre.module_plan)
    inst_lines = "".join(f"    {x!r},\n" for x in pre.instances)
    tables = (f"MODEL, CONFIG, GLOBAL_BATCH, SEED = {step.spec!r}, {dict(step.config or {})!r}, "
              f"{pre.global_batch!r}, {step.seed!r}\n"
              f"#: the profiled precision (bf16 / fp16: torch.autocast, no loss scale)\n"
              f"PRECISION = {pre.precision!r}\n"
              f"#: the mesh: DP replicas x TP tensor ranks; the cluster device of each rank\n"
              f"DP, TP = {pre.dp!r}, {pre.tp!r}\n"
              f"RANK_DEVICES = {[cluster.ids[d] for d in pre.devices]!r}\n"
              f"SEQUENCE_PARALLEL = {pre.sp!r}\n"
              f"{zero_table(pre.zero)}"
              f"#: (module path, style, options) over mesh['tp'], in the model's module order\n"
              f"TP_PLAN = [\n{plan_lines}]\n"
              f"#: (replica, first row, samples) of every micro-batch, in the order each replica runs them\n"
              f"INSTANCES = [\n{inst_lines}]\n"
              f"#: transformer layers run under torch.utils.checkpoint (recompute=full)\n"
              f"RECOMPUTE_LAYERS = {pre.recompute_layers!r}\n"
              f"#: the simulated step of the plan (placer's simulator, seconds)\n"
              f"SIMULATED_STEP_S = {float(pre.sim['makespan_s'])!r}\n"
              f"LR, BETAS, EPS = {ADAM['lr']!r}, {ADAM['betas']!r}, {ADAM['eps']!r}\n\n")
    checks = launch_check_source(processes=n, launch=launch, fingerprint=fingerprint, parameters=param_shapes(step))
    return doc + tables + checks + _BODY.lstrip("\n") + ZERO_SOURCE.lstrip("\n") + _TP_REST.lstrip("\n") + _MAIN
