"""How a derived graph was made, and the check that a placement's derived
graph is what its recipe gives.

Algorithms that transform the graph before placing it (``os-dpos`` and
``fd-dps --split``: operation splitting; ``data-parallel`` and ``os-dpos``
on a model that fits one device: the data-parallel graph) place the
*derived* graph.  Their placement records the recipe in
``Placement.derivation`` and keeps the derived graph in memory
(``Placement.derived``); the file carries it as ``split_graph`` only when
asked (``placer place --embed-derived``, for tools that want the document).
The simulator never trusts a file: it rebuilds the derived graph from the
graph it is given and the recipe, with the same functions the algorithms
used (:func:`derive`), rejects a carried ``split_graph`` that differs
(:func:`rebuild`), and simulates the rebuilt graph.

The recipe — ``derivation``
---------------------------
``{"steps": [step, ...], "base": {...}}`` (``base`` only when the algorithm
placed a coarse graph).  Steps, applied in order:

* ``{"transform": "data-parallel", "replicas": k, "scaling": "strong" |
  "weak", "overhead_s": s}`` (and ``"shares": [f0, ...]``, the replicas'
  batch fractions in whole samples, when they are not equal;
  ``"bucket_mb": x``, when the gradients are all-reduced in DDP buckets of
  ``x`` MiB, absent = 0 = one ring per gradient; ``"global_batch": B``, the
  batch strong scaling divided, which the graph must hold costs for;
  ``"assume_batch": B`` when the user asserted the batch of a graph that
  declares none; ``"collectives": "ring"`` for explicit ring steps, absent =
  ``nccl``, one collective node per replica and bucket; ``"zero": 1 | 2``,
  ZeRO's sharded optimizer state (and gradients) over the replicas,
  absent = 0; 3 is refused, see :data:`~.replicate.ZERO3_REFUSED`):
  :func:`~celeritas_cli.transform.replicate.data_parallel_graph`;
* ``{"transform": "split", "node": id, "dim": "batch" | "channel", "n": n,
  "overhead_s": s}`` (and ``"assume_batch"`` as above):
  :func:`~celeritas_cli.transform.splitting.split_operation` (``node`` is
  an id of the graph the previous steps produced);
* ``{"transform": "microbatch", "m": m, "global_batch": B, "micro_batches":
  [b0, ...], "overhead_s": s}`` (+ ``"assume_batch": N``, and ``"schedule":
  name``, the pipeline schedule the orders follow, which the build ignores):
  :func:`~celeritas_cli.transform.microbatch.microbatch_graph` (the recorded
  batches must be what the graph and ``m`` give);
* ``{"transform": "recompute", "nodes": [ids]}``:
  :func:`~celeritas_cli.transform.recompute.recompute_graph`;
* ``{"transform": "fsdp", "replicas": k, "stage": 1 | 2 | 3, "global_batch":
  B, "overhead_s": s}`` (+ ``"unit_mb": x``, ``"samples": [b0, ...]``,
  ``"assume_batch": N``, and ``"collectives": "ring"`` for explicit ring
  steps, absent = ``nccl``, one collective node per replica and
  collective): :func:`~celeritas_cli.transform.fsdp.fsdp_graph` (the
  recorded batch must be the graph's);
* ``{"transform": "tensor-parallel", "tp": k, "sequence_parallel": bool}``:
  :func:`~celeritas_cli.transform.tensor_parallel.tensor_parallel_graph`.

``base`` = ``{"graph": name, "members": [[original ids of coarse node 0],
...]}``: the algorithm's input was a coarse graph with these members (in
its node order).  Given that coarse graph, :func:`rebuild` starts from it;
given the original graph, it contracts it by ``members``
(:func:`~celeritas_cli.transform.contract.contract`, the function every
coarsening method ends with), which recomputes the coarse costs from the
original ones.  A grouping that does not cover the graph exactly once, or
whose groups form a cycle, is refused; data parallelism refuses a coarse
graph (:func:`~.admit.check_replicable`), so a ``base`` cannot remove the
gradient all-reduce either.

Checking (nothing in a file is trusted): :data:`STEPS` declares every
transform's step - its fields with a type and range check each, the
required ones, a check against the graph it applies to, the size of what
it builds and the builder (:class:`~.recipe_check.StepKind`).  :func:`derive`
checks every step's fields first, then for each step in turn checks it
against the graph, states its size and refuses it over the derived-graph
budget (:mod:`~.size`) before building it.  Errors name the file and the
field (``p.json: field derivation.steps[0].shares[3]: must be a number, got
'0.25'``); ``replicas`` and ``n`` may not exceed the cluster's devices.  A
new transform adds one :class:`~.recipe_check.StepKind` entry to
:data:`STEPS`: its fields (checks from :mod:`~.recipe_check`), ``required``,
``defaults``, ``check``, ``size`` (nodes and edges from the input graph,
before building) and ``build``.

Comparison: node by node in order (id, op, times, memory, colocation,
splittable, members, extra fields), then edge by edge; floating-point values
agree within a relative 1e-9 (the coarse sums may be added in another
order), everything else exactly.  ``name`` and ``meta`` are not compared
(they do not enter any cost); the rebuilt graph is what is simulated.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..errors import InvalidInput
from ..model.graph import Graph
from ..model.limits import TIME_MAX
from .admit import DIMENSIONS, check_shares, replica_samples, split_refusal, split_size
from .allreduce import BUCKET_MB_MAX, COLLECTIVE_FORMS
from .batch import BATCH_MAX, declared_batch
from .fsdp import fsdp_step_build, fsdp_step_check, fsdp_step_size
from .fsdp_units import UNIT_MB_MAX
from .microbatch import microbatch_batches, microbatch_graph, microbatch_size
from .recipe_check import (
    Context,
    StepKind,
    check_base,
    check_recipe,
    choice,
    integer,
    integers,
    number,
    numbers,
    string,
    strings,
)
from .recompute import recompute_graph, recompute_size, resolve_nodes
from .replicate import SCALINGS, ZERO3_REFUSED, data_parallel_graph, dp_size
from .size import Size, check_size
from .split_cost import DEFAULT_OVERHEAD_S
from .splitting import split_operation
from .tensor_parallel import TP_MAX, boolean, rank_ids, tp_step_build, tp_step_check, tp_step_size

REL_TOL = 1e-9


def data_parallel_step(replicas: int, scaling: str, overhead_s: float, shares: list[float] | None = None,
                       bucket_mb: float = 0.0, *, global_batch: int | None = None,
                       assume_batch: int | None = None, collectives: str = "nccl", zero: int = 0) -> dict:
    """The recipe step of :func:`~.replicate.data_parallel_graph` (``shares``
    only when the batch shares are not equal, ``bucket_mb`` only when
    gradients are bucketed, ``global_batch`` the batch strong scaling
    divided, ``assume_batch`` only when the user asserted it, ``zero`` only
    when the optimizer state is sharded)."""
    step: dict[str, Any] = {"transform": "data-parallel", "replicas": int(replicas), "scaling": scaling,
                            "overhead_s": overhead_s}
    if shares is not None:
        step["shares"] = [float(x) for x in shares]
    if bucket_mb:
        step["bucket_mb"] = float(bucket_mb)
    if global_batch is not None:
        step["global_batch"] = int(global_batch)
    if assume_batch is not None:
        step["assume_batch"] = int(assume_batch)
    if collectives != "nccl":
        step["collectives"] = collectives
    if zero:
        step["zero"] = int(zero)
    return step


def split_step(node: str, dim: str, n: int, overhead_s: float, assume_batch: int | None = None) -> dict:
    """The recipe step of :func:`~.splitting.split_operation` (``assume_batch``
    only for a batch split of a graph that declares no batch)."""
    step: dict[str, Any] = {"transform": "split", "node": node, "dim": dim, "n": int(n), "overhead_s": overhead_s}
    if assume_batch is not None and dim == "batch":
        step["assume_batch"] = int(assume_batch)
    return step


def recipe(graph: Graph, steps: list[dict]) -> dict:
    """The ``derivation`` of *steps* applied to *graph* (the algorithm's
    input), with ``base`` when *graph* is coarse."""
    out: dict[str, Any] = {"steps": [dict(s) for s in steps]}
    if graph.is_coarse:
        out["base"] = {"graph": graph.name, "members": [graph.original_ids(v) for v in range(graph.n)]}
    return out


def attach(placement, graph: Graph, derived: Graph, steps: list[dict]) -> None:
    """Record on *placement* (made on *derived*) the recipe from *graph*, the
    algorithm's input, and keep the derived graph in memory
    (``placement.derived``; written as ``split_graph`` only on request,
    ``place --embed-derived``); nothing when *steps* is empty (the
    placement is on *graph* itself)."""
    placement.graph = graph.original_name
    if not steps:
        return
    placement.derivation = recipe(graph, steps)
    placement.derived = derived


# ------------------------------------------------------------------ the step table
def _strip(msg: str) -> str:
    return msg.split(": ", 1)[1] if msg.startswith(("data-parallel: ", "split: ", "fsdp: ")) else msg


def _dp_check(graph: Graph, step: dict, ctx: Context) -> tuple[str | None, str] | None:
    """Fields of a data-parallel step that need the graph: ``shares`` (``k``
    fractions summing to 1, whole samples of the batch), ``global_batch``
    (the graph's batch)."""
    k, strong = step["replicas"], step["scaling"] == "strong"
    zero = step.get("zero", 0)
    if zero == 3:
        return "zero", ZERO3_REFUSED
    if zero and step.get("collectives", "nccl") != "nccl":
        return "zero", (f"ZeRO (zero={zero}) is modelled in the nccl collectives form only, not with collectives: "
                        f"ring (placer run and placer export, which execute explicit ring steps, do not run it)")
    shares = step.get("shares")
    if shares is not None:
        if not strong:
            return "shares", "batch shares need strong scaling (weak: every replica runs the whole batch)"
        if len(shares) != k:
            return "shares", f"must list one batch fraction per replica ({k}), got {len(shares)}"
        try:
            shares = check_shares(shares, k)
        except InvalidInput:
            return "shares", f"must be {k} positive batch fractions summing to 1, got {_short(shares)}"
    if not strong or k < 2:
        return None
    try:
        batch = declared_batch(graph, step.get("assume_batch"),
                               what=f"data parallelism over {k} replicas (each on a share of the batch)")
    except InvalidInput as exc:
        return None, str(exc)
    if "global_batch" in step and step["global_batch"] != batch:
        return "global_batch", (f"the placement was made for a batch of {step['global_batch']} samples, graph "
                                f"'{graph.name}' holds costs for {batch}")
    try:
        replica_samples(batch, k, shares)
    except InvalidInput as exc:
        return ("shares" if shares is not None else "replicas"), _strip(str(exc))
    return None


def _dp_build(graph: Graph, step: dict, represent: list[int] | None = None) -> Graph:
    return data_parallel_graph(graph, step["replicas"], scaling=step["scaling"], overhead_s=step["overhead_s"],
                               shares=step.get("shares"), bucket_mb=step.get("bucket_mb", 0.0),
                               assume_batch=step.get("assume_batch"), collectives=step.get("collectives", "nccl"),
                               represent=represent, zero=step.get("zero", 0))


def _split_check(graph: Graph, step: dict, ctx: Context) -> tuple[str | None, str] | None:
    v = graph.index.get(step["node"])
    if v is None:
        return "node", f"graph '{graph.name}' has no node '{step['node']}'"
    why = split_refusal(graph, v, step["dim"], step["n"], step.get("assume_batch"))
    return (None, _strip(why)) if why else None


def _split_build(graph: Graph, step: dict) -> Graph:
    return split_operation(graph, step["node"], step["dim"], step["n"], overhead_s=step["overhead_s"],
                           assume_batch=step.get("assume_batch"))


def _mb_check(graph: Graph, step: dict, ctx: Context) -> tuple[str | None, str] | None:
    """The recorded batches of a microbatch step must be what the graph and ``m`` give."""
    if isinstance(graph.meta.get("fsdp"), dict):
        return None, f"graph '{graph.name}' is sharded (fsdp): gradient accumulation under FSDP is not modelled"
    try:
        total, mbs = microbatch_batches(graph, step["m"], step.get("assume_batch"))
    except InvalidInput as exc:
        return None, _strip(str(exc))
    if step["global_batch"] != total:
        return "global_batch", f"is {step['global_batch']}, graph '{graph.name}' gives {total}"
    if step["micro_batches"] != mbs:
        return "micro_batches", (f"is {_short(step['micro_batches'])}, graph '{graph.name}' with m={step['m']} "
                                 f"gives {mbs}")
    return None


def _recompute_check(graph: Graph, step: dict, ctx: Context) -> tuple[str | None, str] | None:
    try:
        resolve_nodes(graph, step["nodes"])
    except InvalidInput as exc:
        return "nodes", _strip(str(exc))
    return None


_OVERHEAD = number(0, TIME_MAX)
_BATCH = integer(1, BATCH_MAX)

#: every recipe step: its fields and their checks, what it builds and how large that is (:mod:`.recipe_check`);
#: a new transform adds its entry here
STEPS: dict[str, StepKind] = {
    "data-parallel": StepKind(
        fields={"replicas": integer(1, at_most_devices=True), "scaling": choice(*SCALINGS), "overhead_s": _OVERHEAD,
                "shares": numbers(), "bucket_mb": number(0, BUCKET_MB_MAX), "global_batch": _BATCH,
                "assume_batch": _BATCH, "collectives": choice(*COLLECTIVE_FORMS), "zero": integer(0, 3)},
        required=("replicas",), defaults={"scaling": "strong", "overhead_s": DEFAULT_OVERHEAD_S},
        check=_dp_check, build=_dp_build,
        size=lambda g, st: dp_size(g, st["replicas"], st.get("bucket_mb", 0.0), st.get("collectives", "nccl"),
                                   zero=st.get("zero", 0)),
        hint="fewer replicas, or larger gradient buckets (bucket_mb)"),
    "split": StepKind(
        fields={"node": string(), "dim": choice(*DIMENSIONS), "n": integer(2, at_most_devices=True),
                "overhead_s": _OVERHEAD, "assume_batch": _BATCH},
        required=("node", "dim", "n"), defaults={"overhead_s": DEFAULT_OVERHEAD_S},
        check=_split_check, build=_split_build,
        size=lambda g, st: split_size(g, g.index[st["node"]], st["dim"], st["n"]), hint="fewer parts"),
    "microbatch": StepKind(  # transform/microbatch.py (WP "pipe")
        fields={"m": integer(1), "global_batch": _BATCH, "micro_batches": integers(1), "overhead_s": _OVERHEAD,
                "assume_batch": _BATCH, "schedule": string()},
        required=("m", "global_batch", "micro_batches"), defaults={"overhead_s": DEFAULT_OVERHEAD_S},
        check=_mb_check, size=lambda g, st: Size(*microbatch_size(g, st["m"])), hint="fewer micro-batches",
        build=lambda g, st: microbatch_graph(g, st["m"], overhead_s=st["overhead_s"],
                                             assume_batch=st.get("assume_batch"))),
    "recompute": StepKind(  # transform/recompute.py (WP "pipe")
        fields={"nodes": strings(), "segments": boolean}, required=("nodes",), check=_recompute_check,
        size=lambda g, st: Size(*recompute_size(g, st["nodes"], st.get("segments", False))),
        hint="fewer recomputed nodes",
        build=lambda g, st: recompute_graph(g, st["nodes"], segments=st.get("segments", False))),
    "fsdp": StepKind(  # transform/fsdp.py (WP "fsdp")
        fields={"replicas": integer(1, at_most_devices=True), "stage": integer(1, 3), "global_batch": _BATCH,
                "overhead_s": _OVERHEAD, "unit_mb": number(0, UNIT_MB_MAX), "samples": integers(1),
                "assume_batch": _BATCH, "collectives": choice(*COLLECTIVE_FORMS)},
        required=("replicas", "stage", "global_batch"), defaults={"overhead_s": DEFAULT_OVERHEAD_S},
        check=fsdp_step_check, size=fsdp_step_size, build=fsdp_step_build,
        hint="fewer replicas, or larger units (unit_mb)"),
    "tensor-parallel": StepKind(  # transform/tensor_parallel.py (issue 35)
        fields={"tp": integer(1, TP_MAX, at_most_devices=True), "sequence_parallel": boolean},
        required=("tp",), defaults={"sequence_parallel": False},
        check=tp_step_check, size=tp_step_size, build=tp_step_build, hint="a smaller tp"),
}
TRANSFORMS = tuple(STEPS)


def derive(graph: Graph, derivation: Any, label: str = "derivation", *, devices: int | None = None,
           cluster: str = "", represent: list[int] | None = None, tensor_ranks: list[int] | None = None) -> Graph:
    """The derived graph: *graph* (the base, see :func:`base_graph`) with the
    recipe's steps applied in order.  Every step's fields are checked
    first (:func:`~.recipe_check.check_recipe`); then each step is checked
    against the graph it applies to, sized (:mod:`~.size`) and only then
    built (:func:`apply_step`).  *devices* (the cluster's device count, when
    known) bounds ``replicas`` and ``n``.  *represent*: build only these
    replicas of the last (data-parallel or fsdp) step (:func:`represented`).
    *tensor_ranks*: build only these ranks of the tensor-parallel step, and
    of every later recompute step only their nodes
    (:func:`tensor_represented`).

    Raises
    ------
    InvalidInput
        ``<label>: field derivation.steps[i].<field>: ...`` or
        ``<label>: derivation.steps[i] (<transform>): ...``.
    """
    ctx = Context(label, devices, cluster)
    steps = check_recipe(derivation, STEPS, ctx)
    tp = None
    for i, (step, kind) in enumerate(steps):
        if tensor_ranks is not None:
            tp = step["tp"] if step["transform"] == "tensor-parallel" else tp
            step, kind = tensor_represented(step, kind, tensor_ranks, tp, f"{label}: derivation.steps[{i}]")
        if represent is not None and i == len(steps) - 1:
            kind = represented(step, kind, represent, label)
        graph = _apply(graph, i, step, kind, ctx)
    if tensor_ranks is not None and tp is None:
        raise InvalidInput(f"{label}: only a recipe with a tensor-parallel step can be judged one tensor rank at a time")
    return graph


def tensor_represented(step: dict, kind: StepKind, ranks: list[int], tp: int | None,
                       where: str) -> tuple[dict, StepKind]:
    """A step of a recipe built with only the tensor *ranks* (the symmetric
    judge, :mod:`~celeritas_cli.sim.symmetric`): the tensor-parallel step
    builds them alone; a recompute step after it lists their nodes alone,
    and must list the same nodes on every rank (:func:`~.tensor_parallel.rank_ids`)."""
    if step["transform"] == "tensor-parallel":
        return step, replace(kind, size=lambda g, st: tp_step_size(g, st, len(ranks)),
                             build=lambda g, st: tp_step_build(g, st, ranks))
    if step["transform"] == "recompute" and tp is not None:
        ids, why = rank_ids(step["nodes"], tp, ranks)
        if why:
            raise InvalidInput(f"{where} (recompute): {why}; judge it in full (placer simulate --full-sim)")
        return {**step, "nodes": ids}, kind
    return step, kind


def derive_last(prefix: Graph, derivation: Any, label: str = "derivation", *, devices: int | None = None,
                cluster: str = "", represent: list[int] | None = None) -> Graph:
    """The last step of *derivation* applied to *prefix*, the graph its
    other steps give (:func:`derive` of them): checked, sized and built as
    :func:`derive` does, so a caller that needs that graph anyway (the
    symmetric judge) does not build it twice."""
    ctx = Context(label, devices, cluster)
    steps = check_recipe(derivation, STEPS, ctx)
    step, kind = steps[-1]
    if represent is not None:
        kind = represented(step, kind, represent, label)
    return _apply(prefix, len(steps) - 1, step, kind, ctx)


def represented(step: dict, kind: StepKind, reps: list[int], label: str) -> StepKind:
    """The last step of a recipe built for the symmetric judge
    (:mod:`~celeritas_cli.sim.symmetric`): a data-parallel or fsdp step in
    the nccl form with only the replicas *reps* built, sized as such."""
    if step["transform"] not in ("data-parallel", "fsdp") or step.get("collectives", "nccl") != "nccl":
        raise InvalidInput(f"{label}: only a recipe that ends in data parallelism or fsdp (nccl collectives) can be "
                           f"judged one replica of each kind at a time")
    if step["transform"] == "fsdp":
        return replace(kind, size=lambda g, st: fsdp_step_size(g, st, len(reps)),
                       build=lambda g, st: fsdp_step_build(g, st, reps))
    return replace(kind, size=lambda g, st: dp_size(g, st["replicas"], st.get("bucket_mb", 0.0), "nccl", len(reps),
                                                     st.get("zero", 0)),
                   build=lambda g, st: _dp_build(g, st, reps))


def apply_step(graph: Graph, step: Any, label: str = "derivation", *, devices: int | None = None,
               cluster: str = "") -> Graph:
    """Apply one recipe step to *graph*, checked and sized as :func:`derive`
    does (its messages say ``derivation.steps[0]``).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}], [],
    ...           meta={"batch_size": 8})
    >>> apply_step(g, split_step("c", "batch", 2, 0.0)).n
    2
    """
    ctx = Context(label, devices, cluster)
    ((st, kind),) = check_recipe({"steps": [step]}, STEPS, ctx)
    return _apply(graph, 0, st, kind, ctx)


def check_step(graph: Graph, i: int, step: dict, kind: StepKind, ctx: Context) -> None:
    """Step *i* (fields already checked by :func:`~.recipe_check.check_recipe`)
    against the graph it applies to, in one line naming the field.

    Raises
    ------
    InvalidInput
        ``<label>: field derivation.steps[i].<field>: ...`` or
        ``<label>: derivation.steps[i] (<transform>): ...``.
    """
    if kind.check is not None:
        problem = kind.check(graph, step, ctx)
        if problem:
            name, why = problem
            where = f"derivation.steps[{i}]"
            raise InvalidInput(f"{ctx.label}: field {where}.{name}: {why}" if name else
                               f"{ctx.label}: {where} ({step['transform']}): {why}")


def _apply(graph: Graph, i: int, step: dict, kind: StepKind, ctx: Context) -> Graph:
    """Step *i* (fields already checked): against *graph* (:func:`check_step`), sized, then built."""
    where, label = f"derivation.steps[{i}]", ctx.label
    check_step(graph, i, step, kind, ctx)
    check_size(kind.size(graph, step), f"{label}: {where} ({step['transform']})", kind.hint, ctx.devices)
    try:
        return kind.build(graph, step)
    except InvalidInput as exc:
        raise InvalidInput(f"{label}: {where} ({step['transform']}): {_strip(str(exc))}") from None


def base_graph(graph: Graph, derivation: Any, label: str) -> Graph:
    """The graph the recipe starts from: *graph*, or *graph* contracted by
    ``base.members`` when the algorithm placed a coarse graph and *graph*
    is the original (the grouping checked: :func:`~.recipe_check.check_base`)."""
    base = derivation.get("base") if isinstance(derivation, dict) else None
    if base is None or graph.is_coarse:
        return graph
    from .contract import contract

    cluster_of = check_base(graph, base, Context(label))
    return contract(graph, cluster_of, name=str(base.get("graph") or f"{graph.name}@coarse"))


def rebuild(graph: Graph, derivation: dict | None, carried: dict | None, label: str = "placement", *,
            devices: int | None = None, cluster: str = "", represent: list[int] | None = None) -> Graph:
    """The derived graph a placement refers to, rebuilt from *graph* and the
    recipe (:func:`derive`); a *carried* ``split_graph`` must match it.

    Raises
    ------
    InvalidInput
        A carried graph without a recipe, a recipe that cannot be applied
        (the message names the file and the field), or a carried graph that
        differs from the rebuilt one (the message names the first node or
        edge that does not match).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}],
    ...           [{"src": "a", "dst": "c", "bytes": 100}], meta={"batch_size": 8})
    >>> d = {"steps": [split_step("c", "batch", 2, 0.0)]}
    >>> doc = derive(g, d).to_dict()
    >>> rebuild(g, d, doc).n
    4
    >>> doc["nodes"][2]["compute_s"] = 0.002
    >>> rebuild(g, d, doc)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: ...split_graph node 'c/part0' does not derive ...: compute_s is 0.002, ...
    >>> rebuild(g, {"steps": [split_step("c", "batch", 3, 0.0)]}, None, "p.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: p.json: derivation.steps[0] (split): node 'c' runs on 8 samples, which ...
    """
    if derivation is None:
        raise InvalidInput(f"{label}: the placement carries a split_graph but no derivation, so placer cannot check "
                           f"that it derives from graph '{graph.name}'; re-run placer place to get one")
    derived = derive(base_graph(graph, derivation, label), derivation, label, devices=devices, cluster=cluster,
                     represent=represent)
    if carried is not None:
        diff = first_difference(derived.to_dict(), carried)
        if diff:
            where, why = diff
            raise InvalidInput(f"{label}: split_graph {where} does not derive from graph '{graph.name}': {why}")
    return derived


def first_difference(expected: dict, given: Any) -> tuple[str, str] | None:
    """Where and how *given* (a graph document) first differs from
    *expected*: ``("node 'x'", "compute_s is ...")``, ``("edge a->b (#i)",
    ...)`` or ``("document", ...)``; ``None`` when they agree."""
    if not isinstance(given, dict) or not isinstance(given.get("nodes"), list) or not isinstance(
            given.get("edges"), list):
        return "document", "it is not a graph document with nodes and edges"
    en, gn = expected["nodes"], given["nodes"]
    for i, a in enumerate(en):
        if i >= len(gn):
            return f"node '{a['id']}'", "it is missing"
        b = gn[i]
        if a == b:  # the common case, at C speed
            continue
        if not isinstance(b, dict) or b.get("id") != a["id"]:
            got = b.get("id") if isinstance(b, dict) else b
            return f"node #{i}", f"it is '{got}', the derivation gives '{a['id']}'"
        why = _dict_diff(a, b)
        if why:
            return f"node '{a['id']}'", why
    if len(gn) > len(en):
        extra = gn[len(en)]
        return f"node '{extra.get('id') if isinstance(extra, dict) else extra}'", "the derivation has no such node"
    ee, ge = expected["edges"], given["edges"]
    for i, a in enumerate(ee):
        where = f"edge {a['src']}->{a['dst']} (#{i})"
        if i >= len(ge):
            return where, "it is missing"
        b = ge[i]
        if a == b:
            continue
        why = _dict_diff(a, b) if isinstance(b, dict) else "it is not an edge"
        if why:
            return where, why
    if len(ge) > len(ee):
        return f"edge #{len(ee)}", "the derivation has no such edge"
    return None


def _dict_diff(a: dict, b: dict) -> str | None:
    keys = list(a) + [x for x in b if x not in a]
    for key in keys:
        if key not in b:
            return f"field {key} is missing"
        if key not in a:
            return f"field {key} is not in the derivation"
        va, vb = a[key], b[key]
        if not _same(va, vb):
            return f"{key} is {_short(vb)}, the derivation gives {_short(va)}"
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=0.0) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."
