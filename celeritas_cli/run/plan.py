"""What a placement asks ``placer run`` to execute, and the derived plans.

:func:`plan_of` reads the placement's recipe (``placement.derivation``):
a placement of the captured graph (``plain``), one ``data-parallel`` step
(:mod:`.data_parallel`), one ``fsdp`` step (:mod:`.fsdp_run`), or a
*derived* plan: micro-batches, pipelines, recomputation and data
parallelism combined (issue 23 item 5).  Other recipes (operation
splitting, a coarse base graph) are refused with one line.  Every plan is
simulated the same way (:func:`simulated`).

A derived placement's recipe has a ``microbatch`` or ``recompute`` step,
optionally with one ``data-parallel`` step before or after it: it is a
placement of the *derived* graph (:mod:`celeritas_cli.transform.derivation`).
This module reads what every derived node stands for in the captured step,
and how the recipe cuts the global batch into *instances*: replica ``r``'s
micro-batch ``i`` (GPipe, Huang et al. 2019, 2.2; replicated pipelines,
Narayanan et al. SC'21, 3.1).

What a derived node runs (:class:`NodeInfo`, read through the recipe's
steps, each one's documented fields)
-------------------------------------------------------------------
* ``node``: a micro-batch copy (``<v>/mb<i>``), a replica (``<v>/rep<r>``)
  or a once-per-step node of captured node ``v`` (an optimizer update, an
  op on parameters only): ``v``'s aten op on its instance's samples;
* ``recompute``: a clone (``<v>/recompute``): ``v``'s op run again;
* ``weights``: where a layer's parameters, buffers and optimizer state live
  (nothing to run; it sends the parameters to the copies);
* ``accum``: gradient accumulation, running sum plus micro-batch ``i``'s
  partial gradient;
* ``ring``: a step of a ring all-reduce (reduce-scatter, all-gather,
  result, bucket; :mod:`celeritas_cli.transform.allreduce`).

Instances (:func:`batch_layout`): ``k`` replicas (1 without data
parallelism) times ``m`` micro-batches (1 without micro-batching), of whole
samples: ``data-parallel`` then ``microbatch`` cuts every replica's share
(``B / k``, strong scaling) into the recorded ``micro_batches``;
``microbatch`` then ``data-parallel`` cuts every micro-batch ``b_i`` over
the replicas (:func:`~celeritas_cli.transform.batch.whole_samples`).
Instances take consecutive rows of the global batch (replica-major in the
first case, micro-batch-major in the second), and every instance's
gradients are weighted by its share of the global batch, ``n / T``: the
loss is taken to be a mean over samples, as GPipe, Megatron-LM and
``torch.distributed.pipelining`` (``scale_grads``) take it.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from ..model.congestion import DEFAULT_CONGESTION
from ..transform.batch import whole_samples

KINDS = ("node", "recompute", "weights", "accum", "ring")
EXECUTED = ("data-parallel", "microbatch", "recompute")


@dataclass
class NodeInfo:
    """What derived node runs: ``kind`` (:data:`KINDS`), the captured node
    ``v`` (``None`` for ring nodes), replica ``r`` and micro-batch ``i``
    (``None``: once per step, or no micro-batching), and a ring node's
    ``allreduce`` field."""

    kind: str
    v: int | None
    r: int = 0
    i: int | None = None
    ring: dict | None = None


@dataclass
class Layout:
    """How the recipe cuts the global batch of ``total`` samples: ``k``
    replicas, ``m`` micro-batches, ``sizes[(r, i)]`` samples and
    ``rows[(r, i)]`` the first row of each instance."""

    k: int
    m: int
    scaling: str
    dp_first: bool
    sizes: dict[tuple[int, int], int]
    rows: dict[tuple[int, int], int]
    total: int

    @property
    def instances(self) -> list[tuple[int, int]]:
        """Instances in row order."""
        return sorted(self.sizes, key=self.rows.__getitem__)

    def weight(self, inst: tuple[int, int]) -> float:
        """The instance's share of the global batch (its gradients' weight)."""
        return self.sizes[inst] / self.total


_COLLECTIVE_ID = re.compile(r"^(.*/allreduce\d*~*)/rep(\d+)$")
#: an fsdp collective of the nccl form: a unit's gather (fwd / bwd), stage-1/2 post all-gather, reduce-scatter
_FSDP_ID = re.compile(r"^(fsdp/u\d+/(fwd|bwd|post|grad))/rep(\d+)$")


def executable(placement, cluster, label: str):
    """*placement* in the form ``placer run`` executes: every replica listed
    (a symmetric plan expanded, :func:`~celeritas_cli.sim.symmetric.expand`)
    and the collectives as explicit ring steps (the recipe's ``collectives:
    ring``), which the executor runs chunk by chunk over point-to-point
    sends.  Data parallelism: each collective node ``P/rep<q>`` becomes the
    ring's ``P/bucket/rep<q>`` (a bucket), ``P/rs<s>/rep<q>``,
    ``P/ag<s>/rep<q>`` and ``P/rep<q>`` on its device, in that order where
    it stood in the device's order.  fsdp (:mod:`~celeritas_cli.transform.fsdp`):
    an all-gather ``fsdp/u<i>/<fwd|bwd|post>/rep<q>`` becomes
    ``.../start/rep<q>``, ``.../ag<s>/rep<q>`` and itself (the gathered
    unit), a reduce-scatter ``fsdp/u<i>/grad/rep<q>`` becomes
    ``.../pack/rep<q>``, ``.../rs<s>/rep<q>`` and itself (the reduced
    shard).  The simulated step ``placer run`` reports is this form's.

    >>> from types import SimpleNamespace as NS
    >>> from celeritas_cli.model.placement import Placement
    >>> p = Placement("g", "c", "data-parallel", {"w/rep0": "a", "w/allreduce0/rep0": "a", "w/rep1": "b",
    ...     "w/allreduce0/rep1": "b"}, derivation={"steps": [{"transform": "data-parallel", "replicas": 2}]})
    >>> q = executable(p, None, "p")
    >>> sorted(q.assignment), q.derivation["steps"][0]["collectives"]  # doctest: +NORMALIZE_WHITESPACE
    (['w/allreduce0/ag0/rep0', 'w/allreduce0/ag0/rep1', 'w/allreduce0/rep0', 'w/allreduce0/rep1',
      'w/allreduce0/rs0/rep0', 'w/allreduce0/rs0/rep1', 'w/rep0', 'w/rep1'], 'ring')
    >>> f = Placement("g", "c", "fsdp", {"fsdp/u0/grad/rep0": "a", "fsdp/u0/grad/rep1": "b"},
    ...               derivation={"steps": [{"transform": "fsdp", "replicas": 2, "stage": 3}]})
    >>> sorted(executable(f, None, "p").assignment)[:3]
    ['fsdp/u0/grad/pack/rep0', 'fsdp/u0/grad/pack/rep1', 'fsdp/u0/grad/rep0']
    """
    import copy

    if getattr(placement, "replicas", None) is not None:
        from ..sim.symmetric import expand

        placement = expand(None, cluster, placement, label)
    steps = (placement.derivation or {}).get("steps") or []
    dp = [i for i, st in enumerate(steps) if isinstance(st, dict) and st.get("transform") in ("data-parallel", "fsdp")]
    if not dp or steps[dp[-1]].get("collectives", "nccl") != "nccl" or placement.split_graph is not None:
        return placement
    k = int(steps[dp[-1]]["replicas"])
    fsdp = steps[dp[-1]]["transform"] == "fsdp"

    def ring(nid: str) -> list[str]:
        if fsdp:
            f = _FSDP_ID.match(nid)
            if f is None or k < 2:
                return [nid]
            prefix, what, q = f.group(1), f.group(2), f.group(3)
            if what == "grad":
                return [f"{prefix}/pack/rep{q}"] + [f"{prefix}/rs{s}/rep{q}" for s in range(k - 1)] + [nid]
            return [f"{prefix}/start/rep{q}"] + [f"{prefix}/ag{s}/rep{q}" for s in range(k - 1)] + [nid]
        m = _COLLECTIVE_ID.match(nid)
        if m is None or k < 2:
            return [nid]
        prefix, q = m.group(1), m.group(2)
        head = [f"{prefix}/bucket/rep{q}"] if re.fullmatch(r"bucket\d+/allreduce~*", prefix) else []
        return head + [f"{prefix}/{ph}{s}/rep{q}" for ph in ("rs", "ag") for s in range(k - 1)] + [nid]

    out = copy.copy(placement)
    out.derivation = {**placement.derivation, "steps": [dict(st) for st in steps]}
    out.derivation["steps"][dp[-1]]["collectives"] = "ring"
    out.assignment = {x: did for nid, did in placement.assignment.items() for x in ring(nid)}
    if placement.order is not None:
        out.order = {did: [x for nid in seq for x in ring(nid)] for did, seq in placement.order.items()}
    out.derived = None
    return out


#: a ZeRO collective of the nccl form: the bucket's reduce-scatter or its all-gather after the updates
_ZERO_ID = re.compile(r"^(.*/allreduce\d*~*)/(rs|ag)/rep(\d+)(~*)$")


def without_zero(placement) -> tuple[Any, int]:
    """``(twin, zero)``: a pipeline placement (a recipe with a ``microbatch`` step) whose
    data-parallel step shards the optimizer (``zero`` 1 or 2: Megatron-LM's distributed optimizer,
    modelled in the nccl collectives form only, so :func:`executable` cannot make ring steps of
    it) as the same plan with replicated Adam - each bucket's reduce-scatter ``P/rs/rep<q>`` becomes
    its all-reduce ``P/rep<q>`` on the same device, where it stood in the order, its all-gather
    after the updates is dropped - and the stage; any other placement as it is, with 0.  The
    stages, micro-batches and devices are the same, so the twin's program is the zero plan's but
    for the optimizer, which :mod:`.pipe_export` writes as the sharded one (``ZeroAdam``) from the
    stage (module docstring there).

    >>> from types import SimpleNamespace as NS
    >>> steps = [{"transform": "microbatch", "n": 2}, {"transform": "data-parallel", "replicas": 2, "zero": 1}]
    >>> p = NS(derivation={"steps": steps}, assignment={"a/rep0": "g0", "x/allreduce0/rs/rep0": "g0",
    ...        "x/allreduce0/ag/rep0": "g0"}, order={"g0": ["a/rep0", "x/allreduce0/rs/rep0", "x/allreduce0/ag/rep0"]})
    >>> twin, zero = without_zero(p)
    >>> zero, twin.assignment, twin.order, twin.derivation["steps"][1]
    (1, {'a/rep0': 'g0', 'x/allreduce0/rep0': 'g0'}, {'g0': ['a/rep0', 'x/allreduce0/rep0']}, {'transform': 'data-parallel', 'replicas': 2})
    >>> without_zero(NS(derivation={"steps": steps[1:]}))[1]
    0
    """
    import copy

    steps = (placement.derivation or {}).get("steps") or []
    kinds = [st.get("transform") if isinstance(st, dict) else None for st in steps]
    dp = [i for i, k in enumerate(kinds) if k == "data-parallel"]
    if "microbatch" not in kinds or not dp or not steps[dp[-1]].get("zero"):
        return placement, 0
    zero = int(steps[dp[-1]]["zero"])

    def rename(nid: str) -> str | None:
        m = _ZERO_ID.match(nid)
        if m is None:
            return nid
        return f"{m.group(1)}/rep{m.group(3)}{m.group(4)}" if m.group(2) == "rs" else None

    out = copy.copy(placement)
    out.derivation = {**placement.derivation, "steps": [dict(st) for st in steps]}
    out.derivation["steps"][dp[-1]].pop("zero")
    out.assignment = {rename(nid): did for nid, did in placement.assignment.items() if rename(nid) is not None}
    if getattr(placement, "order", None) is not None:
        out.order = {did: [rename(x) for x in seq if rename(x) is not None] for did, seq in placement.order.items()}
    if hasattr(placement, "derived"):
        out.derived = None
    return out, zero


def plan_of(placement, label: str) -> tuple[str, Any]:
    """What *placement* asks ``placer run`` to execute: ``("derived", steps)``
    (:func:`executed_recipe`), ``("fsdp", step)`` (:func:`fsdp_recipe`),
    ``("data-parallel", step)`` (:func:`dp_recipe`) or ``("plain", None)``.

    Raises
    ------
    InvalidInput
        A recipe ``placer run`` does not execute (one line naming it).

    >>> from types import SimpleNamespace as NS
    >>> plan_of(NS(derivation=None, split_graph=None), "p")
    ('plain', None)
    >>> plan_of(NS(derivation={"steps": [{"transform": "data-parallel", "replicas": 2}]}, split_graph=None), "p")[0]
    'data-parallel'
    """
    steps = executed_recipe(placement, label)
    if steps is not None:
        return "derived", steps
    recipe = fsdp_recipe(placement, label)
    if recipe is not None:
        return "fsdp", recipe
    recipe = dp_recipe(placement, label)
    return ("data-parallel", recipe) if recipe is not None else ("plain", None)


def dp_recipe(placement, label: str) -> dict | None:
    """The data-parallel step of *placement*'s derivation; ``None`` for a plain placement.

    Raises
    ------
    InvalidInput
        Another derivation (operation splitting, a coarse base): not executable.
    """
    d = placement.derivation
    if d is None and placement.split_graph is None:
        return None
    steps = (d or {}).get("steps") or []
    if len(steps) == 1 and steps[0].get("transform") == "data-parallel" and not (d or {}).get("base"):
        return steps[0]
    what = ", ".join(str(s.get("transform")) for s in steps) or "a derived graph"
    if (d or {}).get("base"):
        what += " of a coarse graph"
    raise InvalidInput(f"{label}: the placement transforms the graph ({what}); placer run executes placements "
                       f"of the captured graph, plain data parallelism and micro-batched / recomputed plans")


def fsdp_recipe(placement, label: str) -> dict | None:
    """The ``fsdp`` step of *placement*'s recipe; ``None`` when it has none.

    Raises
    ------
    InvalidInput
        An ``fsdp`` step with other steps or a coarse base graph.

    >>> from types import SimpleNamespace as NS
    >>> fsdp_recipe(NS(derivation={"steps": [{"transform": "fsdp", "replicas": 2}]}), "p")["replicas"]
    2
    >>> fsdp_recipe(NS(derivation=None), "p") is None
    True
    """
    d = placement.derivation or {}
    steps = d.get("steps") or []
    kinds = [s.get("transform") for s in steps]
    if "fsdp" not in kinds:
        return None
    if len(steps) != 1 or d.get("base"):
        what = " + ".join(str(k) for k in kinds) + (" of a coarse graph" if d.get("base") else "")
        raise InvalidInput(f"{label}: the recipe is {what}; placer run executes an fsdp step alone")
    return steps[0]


def executed_recipe(placement, label: str) -> list[dict] | None:
    """The recipe steps of *placement* when ``placer run`` executes it as a
    derived placement (a ``microbatch`` or ``recompute`` step, at most one
    ``data-parallel`` step); ``None`` for other placements.

    Raises
    ------
    InvalidInput
        A recipe that micro-batches or recomputes and also splits operations,
        starts from a coarse graph, or repeats a step.
    """
    d = placement.derivation
    steps = list((d or {}).get("steps") or [])
    kinds = [s.get("transform") for s in steps]
    if not any(k in ("microbatch", "recompute") for k in kinds):
        return None
    bad = next((k for k in kinds if k not in EXECUTED), None)
    if bad is not None or (d or {}).get("base"):
        what = f"a {bad} step" if bad is not None else "a coarse base graph"
        raise InvalidInput(f"{label}: placer run executes micro-batched, recomputed and data-parallel recipes, "
                           f"not {what}")
    for k in ("microbatch", "data-parallel"):
        if kinds.count(k) > 1:
            raise InvalidInput(f"{label}: the recipe has {kinds.count(k)} {k} steps; placer run executes one")
    dp = next((s for s in steps if s.get("transform") == "data-parallel"), None)
    if dp is not None and dp.get("shares") is not None:
        raise InvalidInput(f"{label}: placer run executes data parallelism with equal batch shares only")
    return steps


def batch_layout(steps: list[dict], batch: int, label: str = "placement") -> Layout:
    """The instances of *steps* (:func:`executed_recipe`) on a graph of
    *batch* samples (module docstring).

    Raises
    ------
    InvalidInput
        A batch that the replicas cannot share in whole samples.

    Example
    -------
    >>> mb = {"transform": "microbatch", "m": 2, "global_batch": 8, "micro_batches": [2, 2]}
    >>> dp = {"transform": "data-parallel", "replicas": 2, "scaling": "strong"}
    >>> lay = batch_layout([dp, mb], 8)
    >>> lay.instances, [lay.rows[x] for x in lay.instances]
    ([(0, 0), (0, 1), (1, 0), (1, 1)], [0, 2, 4, 6])
    >>> lay = batch_layout([dict(mb, micro_batches=[3, 3], global_batch=6), dp], 6)
    >>> [(x, lay.sizes[x]) for x in lay.instances]
    [((0, 0), 2), ((1, 0), 1), ((0, 1), 2), ((1, 1), 1)]
    """
    kinds = [s.get("transform") for s in steps]
    dp = next((s for s in steps if s.get("transform") == "data-parallel"), None)
    mb = next((s for s in steps if s.get("transform") == "microbatch"), None)
    k = int(dp["replicas"]) if dp is not None else 1
    scaling = str(dp.get("scaling", "strong")) if dp is not None else "strong"
    strong = scaling == "strong"
    dp_first = dp is not None and (mb is None or kinds.index("data-parallel") < kinds.index("microbatch"))
    mbs = [int(b) for b in mb["micro_batches"]] if mb is not None else None
    sizes: dict[tuple[int, int], int] = {}
    if mbs is None:
        if strong and batch % k:
            raise InvalidInput(f"{label}: {k} replicas cannot share a batch of {batch} evenly; use a batch size "
                               f"divisible by {k}")
        for r in range(k):
            sizes[(r, 0)] = batch // k if strong else batch
    elif dp_first or k == 1:
        for r in range(k):
            for i, b in enumerate(mbs):
                sizes[(r, i)] = b
    else:
        for i, b in enumerate(mbs):
            shares = whole_samples(b, k, what=f"{label}: micro-batch {i}") if strong else [b] * k
            for r, n in enumerate(shares):
                sizes[(r, i)] = n
    m = len(mbs) if mbs is not None else 1
    order = sorted(sizes, key=(lambda x: x) if (dp_first or mbs is None) else (lambda x: (x[1], x[0])))
    rows, at = {}, 0
    for inst in order:
        rows[inst] = at
        at += sizes[inst]
    return Layout(k=k, m=m, scaling=scaling, dp_first=dp_first, sizes=sizes, rows=rows, total=at)


def _extra(graph, x: int) -> dict:
    return (graph.node_extra[x] or {}) if graph.node_extra else {}


def node_infos(base, steps: list[dict], label: str = "placement"):
    """Rebuild the derived graph from *base* (the captured graph) step by
    step and say what each of its nodes runs (module docstring).

    Returns
    -------
    (Graph, list of NodeInfo)
    """
    from ..transform.derivation import apply_step
    from ..transform.microbatch import ACCUMULATE_OP

    graph = base
    infos = {graph.ids[v]: NodeInfo("node", v) for v in range(graph.n)}
    for step in steps:
        new = apply_step(graph, step, label)
        kind = step["transform"]
        out: dict[str, NodeInfo] = {}
        for x in range(new.n):
            nid, ex = new.ids[x], _extra(new, x)
            if kind != "data-parallel" and nid in graph.index:
                out[nid] = infos[nid]
            elif kind == "data-parallel":
                if "allreduce" in ex:
                    out[nid] = NodeInfo("ring", None, r=int(ex["replica"]), ring=dict(ex["allreduce"]))
                else:
                    src = infos[ex["origin"]]
                    out[nid] = NodeInfo(src.kind, src.v, r=int(ex["replica"]), i=src.i, ring=src.ring)
            elif kind == "recompute":
                src = infos[ex["recompute_of"]]
                out[nid] = NodeInfo("recompute", src.v, r=src.r, i=src.i)
            else:  # microbatch: copies, weights, accumulations
                src = infos[ex["origin"]]
                what = ("weights" if new.op[x] == "weights" else "accum" if new.op[x] == ACCUMULATE_OP else "node")
                i = int(ex["microbatch"]) if what != "weights" else None
                out[nid] = NodeInfo(what, src.v, r=src.r, i=i)
        graph, infos = new, out
    return graph, [infos[graph.ids[x]] for x in range(graph.n)]


def merged_sequence(graph, device_of: list[int], device_order: list[list[int]], start: list[float]) -> list[int]:
    """Every node of *graph* once, in an order that is topological and
    follows each device's order (*device_order*, the simulator's realised
    one), earliest simulated *start* first (ties: topological index).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("s", [{"id": i, "compute_s": 1, "memory_bytes": 0} for i in "abc"],
    ...           [{"src": "a", "dst": "b", "bytes": 1}])
    >>> merged_sequence(g, [0, 0, 1], [[1, 0], [2]], [0.0, 0.0, 0.0])
    Traceback (most recent call last):
    ...
    ValueError: the device orders contradict the graph
    >>> merged_sequence(g, [0, 0, 1], [[0, 1], [2]], [0.0, 1.0, 0.0])
    [0, 2, 1]
    """
    import heapq

    topo = graph.topo_index()
    need = [len(set(graph.pred[x])) for x in range(graph.n)]
    after: dict[int, int] = {}
    for seq in device_order:
        for a, b in zip(seq, seq[1:]):
            after[a] = b
            need[b] += 1
    heap = [(start[x], topo[x], x) for x in range(graph.n) if need[x] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        x = heapq.heappop(heap)[2]
        out.append(x)
        for y in list(dict.fromkeys(graph.succ[x])) + ([after[x]] if x in after else []):
            need[y] -= 1
            if need[y] == 0:
                heapq.heappush(heap, (start[y], topo[y], y))
    if len(out) != graph.n:
        raise ValueError("the device orders contradict the graph")
    return out


def simulated(step, placement, cluster, *, label: str, graph=None, graph_label: str = "graph",
              congestion: str = DEFAULT_CONGESTION) -> tuple[dict, Any, Any]:
    """*placement* simulated on the graph file *graph* (refused when it is not the captured
    *step*'s graph, :func:`~.checks.check_graph_file`) or on the captured graph:
    ``(simulation, simulated graph, the simulator's Schedule)``."""
    from ..model.graph import Graph
    from ..sim.simulator import simulate
    from .checks import check_graph_file

    if graph is not None:
        check_graph_file(step.doc, graph, graph_label)
    sim_graph = graph if graph is not None else Graph.from_dict(step.doc, step.doc["name"])
    scheds: list = []
    sim = simulate(sim_graph, cluster, placement, congestion=congestion, label=label, schedule_out=scheds)
    return sim, sim_graph, scheds[0]


@dataclass
class DerivedPrepared:
    """A derived placement applied to the captured step (:func:`prepare_derived`)."""

    batch: int                             # the graph's batch (the placement's graph was captured at it)
    steps_by_size: dict[int, Any]          # RealStep per instance size (and the global batch)
    whole: Any                             # RealStep at the global batch (the unplaced step)
    recipe: list[dict]
    layout: Layout
    graph: Any                             # the derived graph (rebuilt from the capture)
    infos: list[NodeInfo]
    device_of: list[int]                   # derived node -> cluster device
    sequence: list[int]                    # derived nodes, a global order (see merged_sequence)
    inputs: dict[tuple[int, int], tuple]   # instance -> (inputs, target): its rows
    sim: dict
    sim_graph: Any
    tdev: dict[int, str]
    graph_from_file: bool
    notes: list[str] = field(default_factory=list)
    zero: int = 0                          # ZeRO stage of the plan's data-parallel step (:func:`without_zero`)

    @property
    def devices(self) -> list[int]:
        return sorted(set(self.device_of))


def prepare_derived(spec: str, batch: int, placement, cluster, recipe: list[dict], *, label: str, config: dict | None,
               graph=None, graph_label: str = "graph", device_map=None, seed: int = 0,
               congestion: str = DEFAULT_CONGESTION,
               progress=None, step=None) -> DerivedPrepared:
    """Capture the step at the graph's batch (to check and simulate the
    placement), rebuild the derived graph, capture the step again at every
    distinct instance size, and cut the global batch into the instances' rows.

    Raises
    ------
    InvalidInput
        The placement or graph file was made for another graph, a batch the
        recipe cannot cut, a model that traces another graph at an
        instance's size, an update placed away from its parameter.
    """
    from ..model.graph import Graph
    from .checks import default_device_map
    from .step import capture_real, example_batch

    say = progress or (lambda msg: None)
    if step is None:
        say(f"capturing {spec} at batch {batch} (the graph's) with real parameters (seed {seed})")
        step = capture_real(spec, batch, config=config, seed=seed)
    sim, sim_graph, sched = simulated(step, placement, cluster, label=label, graph=graph, graph_label=graph_label,
                                      congestion=congestion)
    derived, infos = node_infos(Graph.from_dict(step.doc, step.doc["name"]), recipe, label)
    if derived.ids != sched.graph.ids:
        raise InvalidInput(f"{label}: the derived graph rebuilt from the capture differs from the simulated one; "
                           f"give the graph file the placement was made for (--graph)")
    layout = batch_layout(recipe, batch, label)
    steps_by_size = {batch: step}
    for n in sorted(set(layout.sizes.values()) | {layout.total}):
        if n not in steps_by_size:
            say(f"capturing {spec} at batch {n} (an instance's samples)")
            steps_by_size[n] = capture_real(spec, n, config=config, seed=seed)
        if steps_by_size[n].sm.ids != step.sm.ids:
            raise InvalidInput(f"{label}: at batch {n} the model traces another graph than at batch {batch} (use "
                               f"at least 2 samples per micro-batch and replica)")
    whole = steps_by_size[layout.total]
    inputs, target = example_batch(spec, layout.total, config=config, seed=seed,
                                   with_target=whole.target is not None)
    for j, t in enumerate(inputs + ([target] if target is not None else [])):
        if t.dim() == 0 or t.shape[0] != layout.total:
            raise InvalidInput(f"--model {spec}: input {j} has shape {tuple(t.shape)}; micro-batches cut the first "
                               f"dimension, which must be the batch ({layout.total})")
    rows = {inst: ([t.narrow(0, layout.rows[inst], n).clone() for t in inputs],
                   None if target is None else target.narrow(0, layout.rows[inst], n).clone())
            for inst, n in layout.sizes.items()}
    device_of = list(sched.device_of)
    _check_updates(derived, infos, device_of, step, cluster, label)
    sequence = merged_sequence(derived, device_of, sched.device_order, sched.start)
    tdev = default_device_map(cluster, sorted(set(device_of)), device_map)
    return DerivedPrepared(batch=batch, steps_by_size=steps_by_size, whole=whole, recipe=recipe, layout=layout,
                      graph=derived, infos=infos, device_of=device_of, sequence=sequence, inputs=rows, sim=sim,
                      sim_graph=sim_graph, tdev=tdev, graph_from_file=graph is not None)


def state_homes(derived, infos: list[NodeInfo], sm) -> dict[tuple[int, int], int]:
    """``(replica, state index) -> derived node`` holding it: the owner's
    ``weights`` node, else the owner itself when it runs once, else the
    owner's first micro-batch copy."""
    rank = {"weights": 0, "node": 1}
    best: dict[tuple[int, int], tuple] = {}
    for x, info in enumerate(infos):
        if info.kind not in rank or info.v is None:
            continue
        key = (rank[info.kind], -1 if info.i is None else info.i)
        for s in sm.state_refs[info.v] if info.v < len(sm.state_refs) else ():
            if sm.owner.get(s) != info.v:
                continue
            if (info.r, s) not in best or key < best[(info.r, s)][0]:
                best[(info.r, s)] = (key, x)
    return {k: v[1] for k, v in best.items()}


def _check_updates(derived, infos, device_of, step, cluster, label) -> None:
    sm = step.sm
    homes = state_homes(derived, infos, sm)
    for x, info in enumerate(infos):
        if info.kind == "node" and info.v in sm.opt_param:
            p = sm.opt_param[info.v]
            h = homes.get((info.r, p))
            if h is not None and device_of[h] != device_of[x]:
                raise InvalidInput(f"{label}: update '{derived.ids[x]}' runs on {cluster.ids[device_of[x]]} but "
                                   f"its parameter is held by '{derived.ids[h]}' on {cluster.ids[device_of[h]]}")
