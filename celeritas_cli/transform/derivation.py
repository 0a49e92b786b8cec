"""How a derived graph was made, and the check that a placement's derived
graph is what its recipe gives.

Algorithms that transform the graph before placing it (``os-dpos`` and
``fd-dps --split``: operation splitting; ``data-parallel`` and ``os-dpos``
on a model that fits one device: the data-parallel graph) place the
*derived* graph.  Their placement records the recipe in
``Placement.derivation`` and carries the derived graph in
``Placement.split_graph`` (for ``placer simulate --gantt`` and for tools
that execute the placement).  The simulator never trusts that document: it
rebuilds the derived graph from the graph it is given and the recipe, with
the same functions the algorithms used (:func:`derive`), rejects a carried
``split_graph`` that differs (:func:`rebuild`), and simulates the rebuilt
graph.

The recipe — ``derivation``
---------------------------
``{"steps": [step, ...], "base": {...}}`` (``base`` only when the algorithm
placed a coarse graph).  Steps, applied in order:

* ``{"transform": "data-parallel", "replicas": k, "scaling": "strong" |
  "weak", "overhead_s": s}`` (and ``"shares": [f0, ...]``, the replicas'
  batch fractions, when they are not equal; ``"bucket_mb": x``, when the
  gradients are all-reduced in DDP buckets of ``x`` MiB, absent = 0 = one
  ring per gradient):
  :func:`~celeritas_cli.transform.replicate.data_parallel_graph`;
* ``{"transform": "split", "node": id, "dim": "batch" | "channel", "n": n,
  "overhead_s": s}``: :func:`~celeritas_cli.transform.splitting.split_operation`
  (``node`` is an id of the graph the previous steps produced);
* ``{"transform": "microbatch", "m": m, "global_batch": B, "micro_batches":
  [b0, ...], "overhead_s": s}`` (+ ``"assume_batch": N``):
  :func:`~celeritas_cli.transform.microbatch.microbatch_graph` (the recorded
  batches must be what the graph and ``m`` give);
* ``{"transform": "recompute", "nodes": [ids]}``:
  :func:`~celeritas_cli.transform.recompute.recompute_graph`.

``base`` = ``{"graph": name, "members": [[original ids of coarse node 0],
...]}``: the algorithm's input was a coarse graph with these members (in
its node order).  Given that coarse graph, :func:`rebuild` starts from it;
given the original graph, it contracts it by ``members``
(:func:`~celeritas_cli.transform.contract.contract`, the function every
coarsening method ends with), which recomputes the coarse costs from the
original ones.

Comparison: node by node in order (id, op, times, memory, colocation,
splittable, members, extra fields), then edge by edge; floating-point values
agree within a relative 1e-9 (the coarse sums may be added in another
order), everything else exactly.  ``name`` and ``meta`` are not compared
(they do not enter any cost); the rebuilt graph is what is simulated.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInput
from ..model.graph import Graph

TRANSFORMS = ("data-parallel", "split", "microbatch", "recompute")
REL_TOL = 1e-9


def data_parallel_step(replicas: int, scaling: str, overhead_s: float, shares: list[float] | None = None,
                       bucket_mb: float = 0.0) -> dict:
    """The recipe step of :func:`~.replicate.data_parallel_graph` (``shares``
    only when the batch shares are not equal, ``bucket_mb`` only when
    gradients are bucketed)."""
    step: dict[str, Any] = {"transform": "data-parallel", "replicas": int(replicas), "scaling": scaling,
                            "overhead_s": overhead_s}
    if shares is not None:
        step["shares"] = [float(x) for x in shares]
    if bucket_mb:
        step["bucket_mb"] = float(bucket_mb)
    return step


def split_step(node: str, dim: str, n: int, overhead_s: float) -> dict:
    """The recipe step of :func:`~.splitting.split_operation`."""
    return {"transform": "split", "node": node, "dim": dim, "n": int(n), "overhead_s": overhead_s}


def recipe(graph: Graph, steps: list[dict]) -> dict:
    """The ``derivation`` of *steps* applied to *graph* (the algorithm's
    input), with ``base`` when *graph* is coarse."""
    out: dict[str, Any] = {"steps": [dict(s) for s in steps]}
    if graph.is_coarse:
        out["base"] = {"graph": graph.name, "members": [graph.original_ids(v) for v in range(graph.n)]}
    return out


def attach(placement, graph: Graph, derived: Graph, steps: list[dict]) -> None:
    """Record on *placement* (made on *derived*) the recipe from *graph*, the
    algorithm's input, and the derived graph document; nothing when
    *steps* is empty (the placement is on *graph* itself)."""
    placement.graph = graph.original_name
    if not steps:
        return
    placement.derivation = recipe(graph, steps)
    placement.split_graph = derived.to_dict()


def apply_step(graph: Graph, step: dict, label: str = "derivation") -> Graph:
    """Apply one recipe step (module docstring) to *graph*.

    Raises
    ------
    InvalidInput
        An unknown transform or a step the transform rejects.
    """
    from .microbatch import apply_microbatch_step
    from .recompute import apply_recompute_step
    from .replicate import data_parallel_graph
    from .splitting import split_operation

    kind = step.get("transform")
    try:
        overhead = float(step.get("overhead_s", 2.0e-6))
        if kind == "data-parallel":
            return data_parallel_graph(graph, int(step["replicas"]), scaling=str(step.get("scaling", "strong")),
                                       overhead_s=overhead, shares=step.get("shares"),
                                       bucket_mb=_number(step.get("bucket_mb", 0.0)))
        if kind == "split":
            return split_operation(graph, str(step["node"]), str(step["dim"]), int(step["n"]), overhead_s=overhead)
        if kind in ("microbatch", "recompute"):  # transform/microbatch.py, transform/recompute.py
            return (apply_microbatch_step if kind == "microbatch" else apply_recompute_step)(graph, step, label)
    except KeyError as exc:
        raise InvalidInput(f"{label}: step {step!r} misses field {exc.args[0]}") from None
    except (TypeError, ValueError):
        raise InvalidInput(f"{label}: step {step!r} has a field of the wrong type") from None
    raise InvalidInput(f"{label}: unknown transform {kind!r} (known: {', '.join(TRANSFORMS)})")


def _number(x: Any) -> float:
    """A recipe's number: an int or float (not a bool, not a string)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(x)
    return float(x)


def derive(graph: Graph, derivation: dict, label: str = "derivation") -> Graph:
    """The derived graph: *graph* (the base, see :func:`base_graph`) with the
    recipe's steps applied in order."""
    for step in derivation.get("steps") or []:
        graph = apply_step(graph, step, label)
    return graph


def base_graph(graph: Graph, derivation: dict, label: str) -> Graph:
    """The graph the recipe starts from: *graph*, or *graph* contracted by
    ``base.members`` when the algorithm placed a coarse graph and *graph*
    is the original."""
    base = derivation.get("base")
    if not base or graph.is_coarse:
        return graph
    from .contract import contract

    members = base.get("members") or []
    cluster_of = [-1] * graph.n
    for c, group in enumerate(members):
        for nid in group:
            v = graph.index.get(nid)
            if v is None:
                raise InvalidInput(f"{label}: derivation base names node '{nid}', which is not in graph '{graph.name}'")
            if cluster_of[v] != -1:
                raise InvalidInput(f"{label}: derivation base lists node '{nid}' twice")
            cluster_of[v] = c
    missing = [graph.ids[v] for v in range(graph.n) if cluster_of[v] == -1]
    if missing:
        raise InvalidInput(f"{label}: derivation base does not cover node '{missing[0]}' of graph '{graph.name}'")
    return contract(graph, cluster_of, name=str(base.get("graph") or f"{graph.name}@coarse"))


def rebuild(graph: Graph, derivation: dict | None, carried: dict | None, label: str = "placement") -> Graph:
    """The derived graph a placement refers to, rebuilt from *graph* and the
    recipe; a *carried* ``split_graph`` must match it.

    Raises
    ------
    InvalidInput
        A carried graph without a recipe, a recipe that cannot be applied,
        or a carried graph that differs from the rebuilt one (the message
        names the first node or edge that does not match).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}],
    ...           [{"src": "a", "dst": "c", "bytes": 100}])
    >>> d = {"steps": [split_step("c", "batch", 2, 0.0)]}
    >>> doc = derive(g, d).to_dict()
    >>> rebuild(g, d, doc).n
    4
    >>> doc["nodes"][2]["compute_s"] = 0.002
    >>> rebuild(g, d, doc)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: ...split_graph node 'c/part0' does not derive ...: compute_s is 0.002, ...
    """
    if derivation is None:
        raise InvalidInput(f"{label}: the placement carries a split_graph but no derivation, so placer cannot check "
                           f"that it derives from graph '{graph.name}'; re-run placer place to get one")
    derived = derive(base_graph(graph, derivation, label), derivation, label)
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
