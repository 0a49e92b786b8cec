"""``placer run`` of a tensor-parallel plan (``place --algo megatron -p tp=T
-p pp=1``, optionally ``dp=D``, ``sequence_parallel``, ``recompute``): one
process per rank of a ``D x T`` mesh, each running the program that
``placer export`` writes for the plan (:mod:`.tp_export`), so the run checks
what a user launches with torchrun.

What is read from the plan (:func:`prepare_tp`; nothing a file carries is
trusted that the capture can give):

* the recipe (:func:`tp_recipe`): ``tensor-parallel`` first, then
  ``microbatch``, ``recompute`` and ``data-parallel`` steps only (what the
  megatron row writes).  A pipeline (a tensor rank's nodes on more than
  one device: ``pp > 1``) is read by :func:`~.tp3d_export.pipe_plan` and run
  as the TP x PP program (:mod:`.tp3d_export`: ``torch.distributed.pipelining``
  stages, each tensor-parallel); a ``zero`` of 1 or 2 on the data-parallel
  step (Megatron-LM's distributed optimizer) runs the programs' sharded
  optimizer (``ZeroAdam``, :mod:`.tp_export`); an ``fsdp`` step, weak
  scaling and uneven batch shares are refused in one line;
* the modules and their styles (:func:`module_plan`): the derivation's
  patterns (:func:`~celeritas_cli.transform.tensor_parallel.plan_tensor_parallel`
  of the captured graph, the same function the simulator rebuilds the plan
  with) mapped to module paths by the parameter each pattern's node reads
  (the node's ``colocation`` ``param:<name>``, its weight source's, or its
  weight tensor's ``<node>:<name>``), checked against the model's module
  types on the meta device (``nn.Linear`` for a column or row split,
  ``nn.Embedding`` for the vocabulary-parallel embedding);
* the batch (:func:`~.plan.batch_layout`): every replica's micro-batches as
  rows of the global batch, each weighted by its share;
* the devices: tensor rank ``t`` of replica 0 on the device its nodes
  (``<id>/tp<t>/...``) are placed on, replica ``r``'s from the placement's
  replica map (symmetric form) or its ``/rep<r>`` nodes.

The yardstick is the unplaced step on the whole global batch
(:func:`~.reference.reference_step`): tensor parallelism, micro-batching
with weights ``n / B`` and the sum of the replicas' gradients compute the
same step up to rounding.  A model with dropout draws other masks than the
unplaced step (DTensor's generator), so it matches only with dropout off.

References
----------
Shoeybi et al., "Megatron-LM", 2019, section 3; Narayanan et al., SC'21,
2.1-2.3; Korthikanti et al. 2022, 4.2.2.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from ..model.congestion import DEFAULT_CONGESTION

#: recipe steps a tensor-parallel plan may have after its ``tensor-parallel`` step
AFTER_TP = ("microbatch", "recompute", "data-parallel")
_TP_ID = re.compile(r"/tp(\d+)(?:/|$)")
_REP_ID = re.compile(r"/rep(\d+)$")


@dataclass
class TPPrepared:
    """A tensor-parallel plan applied to a captured step (:func:`prepare_tp`)."""

    step: Any                       # RealStep at the graph's batch (the global batch)
    tp: int
    dp: int
    sp: bool
    recipe: list
    module_plan: list               # (module path, style, options), model order (:func:`module_plan`)
    instances: list                 # (replica, first row, samples) of every micro-batch, each replica's order
    global_batch: int
    precision: str
    devices: list[int]              # cluster device of mesh rank r * tp + t
    sim: dict
    sim_graph: Any
    tdev: dict[int, str]
    graph_from_file: bool
    recompute: str | None = None    # the plan's recomputation (full, selective) or None
    recompute_layers: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    tied: bool = False              # the LM head reads the vocabulary-parallel embedding's table
    pipe: Any = None                # the pipeline of a TP x PP plan (:class:`~.tp3d_export.PipePlan`), or None
    zero: int = 0                   # ZeRO stage of the data-parallel step (1, 2: the sharded optimizer, ZeroAdam)

    @property
    def pp(self) -> int:
        """Pipeline ranks of the plan (1 without a pipeline)."""
        return self.pipe.pp if self.pipe is not None else 1

    @property
    def k(self) -> int:
        """Processes of the plan."""
        return self.tp * self.dp * self.pp


def tp_recipe(placement, label: str) -> list[dict] | None:
    """The recipe of *placement* when it is tensor-parallel (its first step ``tensor-parallel``),
    else None.

    Raises
    ------
    InvalidInput
        A tensor-parallel recipe with a step ``placer run`` / ``placer export`` do not execute with
        it (an fsdp step, operation splits, a coarse base graph), or a ``tensor-parallel`` step
        that is not the first.

    >>> from types import SimpleNamespace as NS
    >>> tp_recipe(NS(derivation=None), "p") is None
    True
    >>> steps = [{"transform": "tensor-parallel", "tp": 2}, {"transform": "data-parallel", "replicas": 2}]
    >>> [s["transform"] for s in tp_recipe(NS(derivation={"steps": steps}), "p")]
    ['tensor-parallel', 'data-parallel']
    >>> try:
    ...     tp_recipe(NS(derivation={"steps": steps + [{"transform": "fsdp"}]}), "p")
    ... except InvalidInput as exc:
    ...     print(str(exc)[:69])
    p: a tensor-parallel plan with an fsdp step (a ZeRO dimension) is not
    """
    d = placement.derivation or {}
    steps = list(d.get("steps") or [])
    kinds = [s.get("transform") if isinstance(s, dict) else None for s in steps]
    if "tensor-parallel" not in kinds:
        return None
    if kinds[0] != "tensor-parallel" or kinds.count("tensor-parallel") > 1:
        raise InvalidInput(f"{label}: the tensor-parallel step must be the recipe's first and only one "
                           f"(got {' + '.join(map(str, kinds))})")
    bad = next((k for k in kinds[1:] if k not in AFTER_TP), None)
    if bad is not None or d.get("base") or getattr(placement, "split_graph", None) is not None:
        what = (f"an {bad} step (a ZeRO dimension)" if bad == "fsdp" else f"a {bad} step" if bad is not None
                else "a coarse base graph" if d.get("base") else "split operations")
        raise InvalidInput(f"{label}: a tensor-parallel plan with {what} is not executed; placer runs "
                           f"tensor-parallel plans with micro-batches, recomputation and data parallelism")
    for k in ("microbatch", "data-parallel"):        # recompute: one step per pipeline stage
        if kinds.count(k) > 1:
            raise InvalidInput(f"{label}: the recipe has {kinds.count(k)} {k} steps; one is executed")
    return steps


# ------------------------------------------------------------------ modules
#: single-input ops a weight or an activation passes through unchanged but for its type (mixed precision)
CASTS = frozenset({"_to_copy", "to", "clone", "contiguous", "detach"})


def _short(op: str) -> str:
    return op.rsplit(".", 1)[-1]


def through_casts(graph, u: int) -> int:
    """The node whose output *u* casts (``_to_copy`` under autocast, a clone), or *u* itself."""
    for _ in range(4):
        pred = list(dict.fromkeys(graph.pred[u]))
        if _short(graph.op[u]) not in CASTS or len(pred) != 1:
            return u
        u = pred[0]
    return u


def node_param(graph, v: int, pats=None) -> str | None:
    """The name of the parameter (weight) node *v* of *graph* reads: its own ``colocation``
    ``param:<name>``, else that of a parameter source feeding it, else the name in one of its
    weight tensors (``<node>:<name>``, a tied weight forwarded by its owner), looking through
    casts (the half copies of mixed precision).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "w", "compute_s": 0, "memory_bytes": 4, "colocation": "param:fc.weight"},
    ...                 {"id": "x", "compute_s": 0, "memory_bytes": 4},
    ...                 {"id": "mm", "op": "aten.mm", "compute_s": 1, "memory_bytes": 4}],
    ...           [{"src": "w", "dst": "mm", "bytes": 4}, {"src": "x", "dst": "mm", "bytes": 4}])
    >>> node_param(g, g.index["mm"]), node_param(g, g.index["x"])
    ('fc.weight', None)
    """
    def of(u: int) -> str | None:
        c = graph.colocation[u]
        return c[len("param:"):] if isinstance(c, str) and c.startswith("param:") else None

    def named(t: int) -> str | None:
        name = graph.tensor_name[t]
        return name.split(":", 1)[1] if ":" in name and "." in name.split(":", 1)[1] else None

    if of(v):
        return of(v)
    mm = pats.matmuls.get(v) if pats is not None else None
    for u in (mm.sources if mm is not None else []) + [u for u in graph.pred[v] if not graph.in_edges[u]]:
        if of(u):
            return of(u)
    for t in (mm.weights if mm is not None else []):
        if named(t):
            return named(t)
        src = next((graph.edge_src[e] for e in range(graph.m) if graph.edge_tensor[e] == t), None)
        if src is None:
            continue
        if _short(graph.op[src]) in CASTS:     # a half copy of the weight (autocast): what it casts
            for e in graph.in_edges[src]:
                if named(graph.edge_tensor[e]):
                    return named(graph.edge_tensor[e])
            src = through_casts(graph, src)
        if of(src):
            return of(src)
    return None


def _owner(model, param: str, label: str, what: str):
    """``(module path, module)`` owning parameter *param* of *model*."""
    path = param.rsplit(".", 1)[0] if "." in param else ""
    try:
        mod = model.get_submodule(path)
    except AttributeError:
        raise InvalidInput(f"{label}: the {what} reads parameter {param}, which the model has no module for") from None
    return path, mod


def module_plan(graph, tp: int, sp: bool, model, label: str = "placement") -> tuple[list, bool, list[str]]:
    """The parallel style of every module the tensor-parallel derivation of *graph* splits
    *tp* ways (module docstring; :mod:`.tp_export` for the styles): ``(plan, tied, layers)``:
    *plan* ``[(module path, style, options)]`` in *model*'s module order (styles ``colwise``
    (option ``split_factor``: the parts of a fused projection), ``rowwise``, ``embedding``,
    ``head``, ``sequence``), then ``head_input`` (under sequence parallelism, the module whose
    output a tied LM head reads: gathered over the sequence); *tied*: the LM head reads a vocabulary-parallel
    embedding's table (no module of its own); *layers*: the module paths of the transformer
    layers (the closest module holding an attention and the MLP after it).  *model*: the
    model built on the meta device.

    Raises
    ------
    InvalidInput
        What the derivation refuses; a pattern whose node reads no named parameter, or whose
        module is not an ``nn.Linear`` (``nn.Embedding`` for the embedding).
    """
    from torch import nn

    from ..transform.tensor_parallel import SEQ, plan_tensor_parallel

    plan = plan_tensor_parallel(graph, tp, sp)
    pats = plan.pats
    styles: dict[str, tuple[str, dict]] = {}

    def add(v: int, style: str, what: str, kind=nn.Linear, **opts) -> str:
        param = node_param(graph, v, pats)
        if param is None:
            raise InvalidInput(f"{label}: the {what} '{graph.ids[v]}' reads no named parameter, so the module it "
                               f"splits cannot be found")
        path, mod = _owner(model, param, label, what)
        if not isinstance(mod, kind):
            raise InvalidInput(f"{label}: the {what} '{graph.ids[v]}' is module {path or '(root)'}, a "
                               f"{type(mod).__name__}; torch's {style} style splits an nn.{kind.__name__}")
        styles[path] = (style, opts)
        return path

    hidden = pats.dims.get("hidden")
    layers = []
    for i, (cols, row) in enumerate(pats.attention):
        paths = []
        for c in cols:
            param = node_param(graph, c, pats)
            mod = _owner(model, param, label, "attention projection")[1] if param else None
            out_f = getattr(mod, "out_features", 0)
            sf = out_f // hidden if hidden and out_f > hidden and out_f % hidden == 0 else 1
            paths.append(add(c, "colwise", "attention projection", **({"split_factor": sf} if sf > 1 else {})))
        paths.append(add(row, "rowwise", "attention output projection"))
        if i < len(pats.mlp):
            paths += [add(c, "colwise", "MLP projection") for c in pats.mlp[i][0]]
            paths.append(add(pats.mlp[i][1], "rowwise", "MLP output projection"))
            parts = [p.split(".") for p in paths]
            common = []
            for seg in zip(*parts):
                if len(set(seg)) > 1:
                    break
                common.append(seg[0])
            if common:
                layers.append(".".join(common))
    for cols, row in pats.mlp[len(pats.attention):]:
        for c in cols:
            add(c, "colwise", "MLP projection")
        add(row, "rowwise", "MLP output projection")
    emb_paths = {add(v, "embedding", "word embedding", kind=nn.Embedding) for v in pats.embeddings}
    tied = False
    if pats.head is not None:
        param = node_param(graph, pats.head, pats)
        path = _owner(model, param, label, "LM head")[0] if param else None
        if path in emb_paths:
            tied = True             # the root reads the split table (GPT's F.linear(x, wte.weight))
        else:
            add(pats.head, "head", "LM head")
    extra = []
    if tied and sp:                 # the tied head's input, all-gathered over the sequence (Megatron)
        act = pats.matmuls[pats.head].act
        src = next((graph.edge_src[e] for e in graph.in_edges[pats.head] if graph.edge_tensor[e] == act), None)
        param = node_param(graph, through_casts(graph, src)) if src is not None else None
        if param is not None:
            extra.append((_owner(model, param, label, "LM head's input")[0], "head_input", {}))
    if sp:
        for v in range(graph.n):
            if plan.layout[v] == SEQ and "norm" in graph.op[v].rsplit(".", 1)[-1] and \
                    (graph.node_extra[v] or {}).get("pass", "forward") == "forward":
                param = node_param(graph, v)
                if param is not None:
                    styles[_owner(model, param, label, "LayerNorm")[0]] = ("sequence", {})
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    out = [(path, style, dict(sorted(opts.items()))) for path, (style, opts) in
           sorted(styles.items(), key=lambda kv: order.get(kv[0], len(order)))] + extra
    return out, tied, sorted(set(layers), key=lambda p: order.get(p, len(order)))


# ------------------------------------------------------------------ prepare
def rank_devices(placement, cluster, tp: int, dp: int, label: str) -> list[int]:
    """The cluster device of every mesh rank ``r * tp + t`` (module docstring).

    Raises
    ------
    InvalidInput
        A tensor rank on more than one device (a pipeline), or two ranks on one device.
    """
    from ..sim.symmetric import replica_map

    where: dict[tuple[int, int], set[str]] = {}
    for nid, did in placement.assignment.items():
        m = _TP_ID.search(nid)
        if m is None:
            continue
        rep = _REP_ID.search(nid)
        where.setdefault((int(rep.group(1)) if rep else 0, int(m.group(1))), set()).add(did)
    for (r, t), ds in sorted(where.items()):
        if len(ds) > 1:
            raise InvalidInput(f"{label}: tensor rank {t} of replica {r} runs on {len(ds)} devices ({', '.join(sorted(ds))}): a "
                               f"pipeline, whose ranks tp3d_export.pipe_plan lays out (TP x PP)")
    if sorted(t for r, t in where if r == 0) != list(range(tp)):
        raise InvalidInput(f"{label}: the placement does not place tensor ranks 0..{tp - 1} of replica 0")
    first = [cluster.index[next(iter(where[(0, t)]))] for t in range(tp)]
    if getattr(placement, "replicas", None) is not None:
        rmap = replica_map(placement.replicas, cluster, dp, label)
        col = {d: j for j, d in enumerate(rmap.devices[0])}
        devices = [rmap.devices[r][col[first[t]]] for r in range(dp) for t in range(tp)]
    else:
        devices = []
        for r in range(dp):
            for t in range(tp):
                if (r, t) not in where:
                    raise InvalidInput(f"{label}: the placement does not place tensor rank {t} of replica {r}")
                devices.append(cluster.index[next(iter(where[(r, t)]))])
    if len(set(devices)) != len(devices):
        raise InvalidInput(f"{label}: two of the {len(devices)} ranks share a device")
    return devices


def prepare_tp(spec: str, batch: int, placement, cluster, recipe: list[dict], *, label: str,
               config: dict | None, graph=None, graph_label: str = "graph", device_map=None, seed: int = 0,
               congestion: str = DEFAULT_CONGESTION, progress=None, step=None) -> TPPrepared:
    """Capture the step at the graph's batch, simulate the plan, and read from it the mesh, the
    module styles, the micro-batches and the devices (module docstring).

    Raises
    ------
    InvalidInput
        A pipeline, weak scaling or uneven shares, the plan made for another graph, what
        :func:`module_plan` refuses.
    """
    from ..model.graph import Graph
    from ..profile.capture import build_meta
    from ..profile.models import resolve_model
    from .checks import default_device_map
    from .plan import batch_layout, simulated
    from .step import capture_real

    say = progress or (lambda msg: None)
    if isinstance(getattr(placement, "replicas", None), dict) and "tensor" in placement.replicas:
        from ..sim.symmetric import expand  # tensor rank 0 stands for every rank: list them all

        placement = expand(None, cluster, placement, label, ranks_only=True)
    tstep = recipe[0]
    tp, sp = int(tstep["tp"]), bool(tstep.get("sequence_parallel", False))
    rest = recipe[1:]
    dpst = next((s for s in rest if s.get("transform") == "data-parallel"), None)
    if dpst is not None and dpst.get("scaling", "strong") != "strong":
        raise InvalidInput(f"{label}: its replicas run weak scaling; placer runs tensor-parallel plans with strong "
                           f"scaling (the replicas share the graph's batch)")
    if dpst is not None and (dpst.get("shares") is not None or dpst.get("samples") is not None):
        raise InvalidInput(f"{label}: its replicas run uneven batch shares; placer runs equal shares only")
    zero = int(dpst.get("zero") or 0) if dpst is not None else 0
    if zero not in (0, 1, 2):
        raise InvalidInput(f"{label}: its data-parallel step has zero={dpst.get('zero')!r}; the programs run ZeRO "
                           f"stage 1 or 2 (Megatron-LM's distributed optimizer) or none")
    dp = int(dpst["replicas"]) if dpst is not None else 1
    if step is None:
        say(f"capturing {spec} at batch {batch} (the graph's) with real parameters (seed {seed})")
        step = capture_real(spec, batch, config=config, seed=seed)
    sim, sim_graph, _ = simulated(step, placement, cluster, label=label, graph=graph, graph_label=graph_label,
                                  congestion=congestion)
    from .tp3d_export import has_pipeline, pipe_plan

    base = Graph.from_dict(step.doc, step.doc["name"])
    factory, _ = resolve_model(spec, dict(config or {}))
    model = build_meta(factory)
    pipe = None
    if has_pipeline(placement):     # TP x PP (x DP): the pipeline's stages, split points, mesh ranks
        kinds = {name: type(mod).__name__ for name, mod in model.named_modules() if name}
        pipe = pipe_plan(placement, cluster, base, step.sm, recipe, tp=tp, dp=dp, sp=sp, batch=batch, kinds=kinds,
                         label=label)
        devices = pipe.rank_devices
    else:
        devices = rank_devices(placement, cluster, tp, dp, label)
    layout = batch_layout(rest, batch, label)
    if layout.total != batch:
        raise InvalidInput(f"{label}: the recipe's global batch is {layout.total}, the graph's {batch}")
    instances = [(r, layout.rows[(r, i)], layout.sizes[(r, i)]) for r in range(layout.k) for i in range(layout.m)
                 if layout.sizes.get((r, i))]
    mplan, tied, layers = module_plan(base, tp, sp, model, label)
    rc = next((s for s in rest if s.get("transform") == "recompute"), None)
    recompute = None
    if rc is not None:
        recompute = str((getattr(placement, "params", None) or {}).get("recompute") or "full")
    notes = []
    if tied:
        notes.append("the LM head reads the vocabulary-parallel embedding's table (tied): its logits stay "
                     "vocabulary-sharded into loss_parallel's cross entropy")
    tdev = default_device_map(cluster, sorted(devices), device_map)
    return TPPrepared(step=step, tp=tp, dp=dp, sp=sp, recipe=recipe, module_plan=mplan, instances=instances,
                      global_batch=layout.total, precision=str(step.doc.get("meta", {}).get("precision", "fp32")),
                      devices=devices, sim=sim, sim_graph=sim_graph, tdev=tdev, graph_from_file=graph is not None,
                      recompute=recompute, recompute_layers=layers if recompute == "full" else [], notes=notes,
                      tied=tied, pipe=pipe, zero=zero if dp > 1 else 0)


# ------------------------------------------------------------------ run
def tp_rank_main(rank: int, job: dict) -> dict:
    """One rank of ``placer run``: the exported program (``job["source"]``) run as a module, its
    ``run`` (one checked step, then the warm-up and timed ones) on this rank's device."""
    import time

    import torch

    ns: dict = {"__name__": "placer_tp_program", "__file__": "placed_tp.py"}
    exec(compile(job["source"], "placed_tp.py", "exec"), ns)     # noqa: S102 - placer's own generated program
    device = torch.device(job["rank_devices"][rank])
    more = job["warmup"] - 1 + job["steps"]
    c0 = time.process_time()
    model = ns["build_model"]()
    ns["model_check"](model)
    loss, params, walls = ns["run"](model, device, more, out=True)
    cpu = (time.process_time() - c0) / (1 + more)
    return {"rank": rank, "device": job["ranks"][rank], "loss": loss, "params": params,
            "walls": walls[job["warmup"] - 1:], "cpu": cpu}


def run_tp(pre: TPPrepared, placement, cluster, *, label: str, steps: int, warmup: int, threads: int,
           timeout: float, rtol: float, atol: float, congestion: str, load, progress=None) -> dict:
    """The unplaced step, the plan's ranks (:func:`tp_rank_main`), the ``placer.run/v1`` report
    with a ``tensor_parallel`` section."""
    import torch

    from ..profile.launch import launch
    from .checks import job_core
    from .executor import ADAM, torch_threads
    from .reference import Reference, adam_reference, reference_grads
    from .report import build_report, compare
    from .tp3d_export import tp3d_source
    from .tp_export import tp_source

    say = progress or (lambda msg: None)
    with torch_threads(threads):
        say(f"running the unplaced step on the CPU ({threads} thread(s))")
        loss, grads, _ = reference_grads(pre.step, "cpu", seed=pre.step.seed)
        ref = Reference(loss=loss.cpu(), params=adam_reference(pre.step, grads, ADAM), device="cpu")
    src = (tp3d_source if pre.pipe is not None else tp_source)(pre, cluster, label=label, algorithm=placement.algorithm)
    job = job_core(pre.step, pre.devices, pre.tdev, None, steps=steps, warmup=warmup, threads=threads,
                   timeout=timeout)
    job["source"] = src
    pipe_words = f" x {pre.pp} pipeline" if pre.pipe is not None else ""
    zero_words = (f"; ZeRO stage {pre.zero} over the replicas (gradients reduce-scattered, Adam on each rank's "
                  f"1/{pre.dp} shard, the shards all-gathered: ZeroAdam)" if pre.zero else "")
    say(f"starting {pre.k} processes: {pre.dp} replica(s){pipe_words} x {pre.tp} tensor ranks ({job['dist_backend']}, "
        f"{threads} thread(s) each): 1 checked step, {warmup - 1} more warm-up, {steps} timed")
    results = launch("celeritas_cli.run.tp_run", job, pre.k, timeout=timeout, what="placer run")
    names = pre.step.sm.state_names
    index = {names[s]: s for s in range(pre.step.sm.n_params)}
    merged: dict = {}              # a pipeline's ranks hold their stages' parameters only: their union
    for r in results:
        for n, t in r["params"].items():
            merged.setdefault(n, t)
    got = {index[n]: t for n, t in merged.items() if index.get(n) in ref.params}
    numerics = compare(torch.tensor(results[0]["loss"]), got, ref, rtol=rtol, atol=atol)
    spread = max((float((t - merged[n]).abs().max()) for r in results for n, t in r["params"].items()),
                 default=0.0)
    if spread > atol:
        numerics["match"] = False
    worst_rel = max((float(((got[p] - ref.params[p]).abs() / ref.params[p].abs().clamp_min(atol)).max())
                     for p in got), default=0.0)
    noisy = noise_note(got, ref, grads, rtol=rtol, atol=atol, names=names) if not numerics["match"] else None
    walls = [max(ws) for ws in zip(*(r["walls"] for r in results))]
    med = statistics.median(walls)
    measured = {"walls": walls, "busy": {r["device"]: med for r in results},
                "cpu": {r["device"]: r["cpu"] for r in results}, "link": {}, "link_bytes_unknown": True}
    notes = list(pre.notes) + [
        (f"tensor parallelism: a mesh of {pre.dp} replica(s){pipe_words} x {pre.tp} tensor ranks running the "
         f"program placer export writes (parallelize_module over mesh['tp']{', sequence parallel' if pre.sp else ''}"
         f"{', torch.distributed.pipelining ' + pre.pipe.torch_class + ' over mesh[' + repr('pp') + ']' if pre.pipe else ''}); the "
         f"{zero_words}; the "
         f"yardstick is the unplaced step on the global batch of {pre.global_batch}; the ranks' gathered "
         f"parameters differ by at most {spread:.3g}"),
        ("per-device busy time is the step's wall time (the program times steps, not nodes); collectives are "
         "DTensor's and torch.distributed's, bytes per link are the simulated plan's only")]
    if noisy:
        notes.append(noisy)
    if pre.precision != "fp32":
        notes.append(f"{pre.precision} mixed precision (torch.autocast): the split matmuls round their half products "
                     f"otherwise than the unplaced step, beyond rtol {rtol:g}; a model profiled in fp32 (a "
                     f"module:attr or file.py:attr spec) checks the numerics")
    counts = {d: len(pre.step.sm.ids) for d in pre.devices}
    report = build_report(step=pre.step, counts=counts, placement=placement, label=label, cluster=cluster,
                          sim=pre.sim, sim_graph=pre.sim_graph, graph_from_file=pre.graph_from_file, tdev=pre.tdev,
                          backend="gloo", dist_backend=job["dist_backend"], threads=threads, steps=steps,
                          warmup=warmup, numerics=numerics, measured=measured, congestion=congestion, load=load,
                          extra_notes=notes)
    report["plan"] = "tensor-parallel"
    report["tensor_parallel"] = {"tp": pre.tp, "dp": pre.dp, "pp": pre.pp, "sequence_parallel": pre.sp,
                                 "micro_batches": len(pre.instances) // pre.dp, "recompute": pre.recompute,
                                 "zero": pre.zero,
                                 "modules": [[p, s, o] for p, s, o in pre.module_plan],
                                 "params_max_rel_diff": worst_rel}
    return report


def noise_note(got: dict, ref, grads: dict, *, rtol: float, atol: float, names: list[str]) -> str | None:
    """When every element off the unplaced step is one whose gradient there is below 10x Adam's
    ``eps`` (zero in exact arithmetic: a key bias, since softmax ignores a constant added to every
    key), a note saying so: the first Adam update divides such a gradient's rounding noise by its
    own size, so any other order of the same sums moves it by up to ``lr``."""
    import torch

    from .executor import ADAM

    off, worst = [], 0.0
    for p in sorted(got):
        want = ref.params[p]
        bad = ~torch.isclose(got[p].to(want.dtype), want, rtol=rtol, atol=atol)
        if not bool(bad.any()):
            continue
        if p not in grads:
            return None
        g = float(grads[p].to(want.dtype)[bad].abs().max())
        if g >= 10 * ADAM["eps"]:
            return None
        off.append(f"{names[p]} ({int(bad.sum())} of {want.numel()})")
        worst = max(worst, g)
    if not off:
        return None
    return (f"off the unplaced step: elements of {', '.join(off)} only, whose gradients there are at most "
            f"{worst:.3g} (below 10x Adam's eps {ADAM['eps']:g}; zero in exact arithmetic, as a key bias's): "
            f"Adam's first update amplifies their rounding noise, which any other order of the same sums changes")


if __name__ == "__main__":
    from ..profile.launch import worker_main

    worker_main(tp_rank_main)
