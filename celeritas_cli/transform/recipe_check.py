"""Checking a derivation recipe (``placement.derivation``) field by field,
before anything is built.

A recipe comes from a file, so nothing in it is trusted: every step is
checked against its transform's declaration (:class:`StepKind`: the fields
it may have, with a type and range check each, the required ones, a check
against the graph, the size of what it builds, the builder), and every
error names the file and the field::

    Error: p.json: field derivation.steps[0].shares[3]: must be a number, got '0.25'

:mod:`~.derivation` holds the table of step kinds (one entry per
transform); this module holds the machinery and the field checks
(:func:`integer`, :func:`number`, :func:`choice`, :func:`string`,
:func:`numbers`, :func:`integers`, :func:`strings`), so a new transform declares its step in a
few lines.

Example
-------
>>> ctx = Context("p.json", devices=4, cluster="4xV100-pcie")
>>> integer(1, at_most_devices=True)(8, ctx)
"8 is more than the 4 devices of cluster '4xV100-pcie'"
>>> numbers()([0.5, "0.5"], ctx)
"[1]: must be a number, got '0.5'"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import InvalidInput
from ..model.graph import Graph
from .size import Size

#: the most steps a recipe may have (each step rebuilds the whole graph)
MAX_STEPS = 1024
#: the top-level fields of a derivation
DERIVATION_FIELDS = ("steps", "base")


@dataclass(frozen=True)
class Context:
    """Where a recipe is checked: the file it came from (*label*) and, when
    known, the cluster it is simulated on (its device count bounds replicas
    and parts)."""

    label: str
    devices: int | None = None
    cluster: str = ""


#: a field check: the problem with a value (without the field's name), or None
Check = Callable[[Any, Context], "str | None"]


@dataclass(frozen=True)
class StepKind:
    """One transform's recipe step.

    ``fields``: every field the step may have (besides ``transform``) and its
    check; ``required``: the fields it must have; ``check(graph, step,
    ctx)``: what can only be checked against the graph the step applies to,
    ``None`` or ``(field or None, problem)``; ``size(graph, step)``: the
    nodes and edges the step would build (:mod:`~.size`), computed before
    building; ``build(graph, step)``: the derived graph; ``hint``: what to
    change when the size is over the budget.
    """

    fields: Mapping[str, Check]
    required: tuple[str, ...]
    size: Callable[[Graph, dict], Size]
    build: Callable[[Graph, dict], Graph]
    check: Callable[[Graph, dict, Context], "tuple[str | None, str] | None"] | None = None
    hint: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float))


def integer(lo: int, hi: int | None = None, *, at_most_devices: bool = False) -> Check:
    """An integer (not a bool, not a float) in ``lo..hi``; with
    *at_most_devices* also at most the cluster's device count."""
    def check(x: Any, ctx: Context) -> str | None:
        if isinstance(x, bool) or not isinstance(x, int):
            return f"must be an integer, got {_short(x)}"
        if x < lo or (hi is not None and x > hi):
            return f"must be {lo}..{hi}, got {x}" if hi is not None else f"must be at least {lo}, got {x}"
        if at_most_devices and ctx.devices is not None and x > ctx.devices:
            return f"{x} is more than the {ctx.devices} devices of cluster '{ctx.cluster}'"
        return None
    return check


def number(lo: float, hi: float) -> Check:
    """A finite number (an int or float, not a bool or string) in ``lo..hi``."""
    def check(x: Any, ctx: Context) -> str | None:
        if not _is_number(x) or not math.isfinite(x):
            return f"must be a number, got {_short(x)}"
        if not lo <= x <= hi:
            return f"must be {_num(lo)}..{_num(hi)}, got {_num(x)}"
        return None
    return check


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def choice(*values: str) -> Check:
    """One of *values*."""
    def check(x: Any, ctx: Context) -> str | None:
        return None if isinstance(x, str) and x in values else \
            f"must be one of {', '.join(values)}, got {_short(x)}"
    return check


def string() -> Check:
    """A string."""
    def check(x: Any, ctx: Context) -> str | None:
        return None if isinstance(x, str) else f"must be a string, got {_short(x)}"
    return check


def _list_of(plural: str, element: str, ok: Callable[[Any], bool]) -> Check:
    """A list whose every element passes *ok*; the messages name *plural* and *element*."""
    def check(x: Any, ctx: Context) -> str | None:
        if not isinstance(x, list):
            return f"must be a list of {plural}, got {_short(x)}"
        for i, v in enumerate(x):
            if not ok(v):
                return f"[{i}]: must be {element}, got {_short(v)}"
        return None
    return check


def numbers() -> Check:
    """A list of finite numbers (an element that is a string is refused, not coerced)."""
    return _list_of("numbers", "a number", lambda v: _is_number(v) and math.isfinite(v))


def integers(lo: int = 0) -> Check:
    """A list of integers of at least *lo* (not bools, not floats)."""
    return _list_of("integers", f"an integer of at least {lo}",
                    lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= lo)


def strings() -> Check:
    """A list of strings."""
    return _list_of("strings", "a string", lambda v: isinstance(v, str))


def field_error(ctx: Context, where: str, problem: str) -> InvalidInput:
    """``<file>: field <where>: <problem>`` (``[i]: ...`` problems join the field path)."""
    if problem.startswith("["):
        index, _, rest = problem.partition(": ")
        return InvalidInput(f"{ctx.label}: field {where}{index}: {rest}")
    return InvalidInput(f"{ctx.label}: field {where}: {problem}")


def check_recipe(derivation: Any, kinds: Mapping[str, StepKind], ctx: Context) -> list[tuple[dict, StepKind]]:
    """Check the shape of *derivation* and every step's fields (types,
    ranges, required fields, no unknown field), before anything is built;
    returns the steps with their kinds.

    Raises
    ------
    InvalidInput
        ``<file>: field derivation.steps[i].<field>: <problem>``.
    """
    if not isinstance(derivation, dict):
        raise InvalidInput(f"{ctx.label}: field derivation: must be an object, got {_short(derivation)}")
    for key in derivation:
        if key not in DERIVATION_FIELDS:
            raise InvalidInput(f"{ctx.label}: field derivation.{key}: not a field of a derivation "
                               f"(its fields: {', '.join(DERIVATION_FIELDS)})")
    steps = derivation.get("steps", [])
    if not isinstance(steps, list):
        raise InvalidInput(f"{ctx.label}: field derivation.steps: must be a list of steps, got {_short(steps)}")
    if len(steps) > MAX_STEPS:
        raise InvalidInput(f"{ctx.label}: field derivation.steps: {len(steps)} steps, at most {MAX_STEPS} "
                           f"(each step rebuilds the whole graph)")
    out = []
    for i, step in enumerate(steps):
        where = f"derivation.steps[{i}]"
        if not isinstance(step, dict):
            raise InvalidInput(f"{ctx.label}: field {where}: must be an object, got {_short(step)}")
        name = step.get("transform")
        if name not in kinds:
            raise InvalidInput(f"{ctx.label}: field {where}.transform: unknown transform {_short(name)} "
                               f"(known: {', '.join(kinds)})")
        kind = kinds[name]
        for key in step:
            if key != "transform" and key not in kind.fields:
                raise InvalidInput(f"{ctx.label}: field {where}.{key}: not a field of a {name} step "
                                   f"(its fields: {', '.join(kind.fields)})")
        for key in kind.required:
            if key not in step:
                raise InvalidInput(f"{ctx.label}: field {where}.{key}: missing (a {name} step needs "
                                   f"{', '.join(kind.required)})")
        for key, check in kind.fields.items():
            if key in step:
                problem = check(step[key], ctx)
                if problem:
                    raise field_error(ctx, f"{where}.{key}", problem)
        out.append(({**kind.defaults, **step}, kind))
    return out


def check_base(graph: Graph, base: Any, ctx: Context) -> list[int]:
    """``cluster_of`` of the coarse graph ``base.members`` describes over
    *graph*, checked: every member a node of *graph*, listed once, every
    node listed, no empty group, and the grouping acyclic (a cyclic one
    would be no coarse graph at all).

    Raises
    ------
    InvalidInput
        ``<file>: field derivation.base.members[c][j]: ...`` and the like.
    """
    from .contract import is_acyclic

    where = "derivation.base"
    if not isinstance(base, dict):
        raise InvalidInput(f"{ctx.label}: field {where}: must be an object, got {_short(base)}")
    members = base.get("members")
    if not isinstance(members, list):
        raise InvalidInput(f"{ctx.label}: field {where}.members: must be a list of lists of node ids")
    if "graph" in base and not isinstance(base["graph"], str):
        raise InvalidInput(f"{ctx.label}: field {where}.graph: must be a string, got {_short(base['graph'])}")
    cluster_of = [-1] * graph.n
    for c, group in enumerate(members):
        if not isinstance(group, list) or not group:
            raise InvalidInput(f"{ctx.label}: field {where}.members[{c}]: must be a non-empty list of node ids")
        for j, nid in enumerate(group):
            v = graph.index.get(nid) if isinstance(nid, str) else None
            if v is None:
                raise InvalidInput(f"{ctx.label}: field {where}.members[{c}][{j}]: {_short(nid)} is not a node of "
                                   f"graph '{graph.name}'")
            if cluster_of[v] != -1:
                raise InvalidInput(f"{ctx.label}: field {where}.members[{c}][{j}]: node '{nid}' is listed twice")
            cluster_of[v] = c
    missing = [graph.ids[v] for v in range(graph.n) if cluster_of[v] == -1]
    if missing:
        raise InvalidInput(f"{ctx.label}: field {where}.members: does not list node '{missing[0]}' of graph "
                           f"'{graph.name}'")
    if not is_acyclic(graph, cluster_of):
        raise InvalidInput(f"{ctx.label}: field {where}.members: this grouping of graph '{graph.name}' has a cycle "
                           f"between its groups, so it is no coarse graph of it")
    return cluster_of
