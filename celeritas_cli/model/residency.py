"""Which part of a node's memory is resident state and which is an
activation, and which pass of the step the node belongs to
(docs/design.md, "Node memory").

* ``resident_bytes`` (node field, ``0 <= resident_bytes <= memory_bytes``):
  the part of ``memory_bytes`` held on the node's device for the whole step
  - parameters, buffers, optimizer state.  The rest, ``memory_bytes -
  resident_bytes``, is the node's *activation*: its kept outputs (forward
  outputs saved for the backward pass, gradients kept until the update),
  live only for a part of the step (the judge's ``time`` rule,
  :mod:`celeritas_cli.sim.memory`).
* ``pass``: ``"forward"``, ``"backward"`` or ``"update"`` (the optimizer
  step).

A graph *declares* the time rule's data when at least one node carries
``resident_bytes``; in such a graph a node without it counts as all
resident (the static rule's view of it).  A graph that declares nothing is
judged by the static rule.

Example
-------
>>> from celeritas_cli.model.graph import build
>>> g = build("r", [{"id": "w", "compute_s": 1, "memory_bytes": 10, "resident_bytes": 8},
...                 {"id": "x", "compute_s": 1, "memory_bytes": 5}], [])
>>> declares(g), resident_list(g)
(True, [8, 5])
>>> resident_list(build("s", [{"id": "x", "compute_s": 1, "memory_bytes": 5}], [])) is None
True
"""

from __future__ import annotations

from typing import Any

RESIDENT = "resident_bytes"
PASS = "pass"
#: the values of a node's ``pass`` field
PASSES = ("forward", "backward", "update")


def _extra(graph: Any, v: int) -> dict | None:
    return graph.node_extra[v] if graph.node_extra else None


def declares(graph: Any) -> bool:
    """True when some node of *graph* carries ``resident_bytes``."""
    return resident_list(graph) is not None


def resident_list(graph: Any) -> list[int] | None:
    """Resident bytes of every node (a node without the field: all of its
    ``memory_bytes``), or None when *graph* declares none (computed once per
    graph object: graphs are not mutated after loading)."""
    cache = graph.__dict__
    if "_resident" not in cache:
        extras = graph.node_extra or []
        if any(ex and RESIDENT in ex for ex in extras):
            mem = graph.memory
            cache["_resident"] = [int(ex[RESIDENT]) if ex and RESIDENT in ex else mem[v]
                                  for v, ex in enumerate(extras)]
        else:
            cache["_resident"] = None
    return cache["_resident"]


def resident_of(graph: Any, v: int) -> int:
    """Resident bytes of node *v* (all of its memory when it does not say)."""
    ex = _extra(graph, v)
    return int(ex[RESIDENT]) if ex and RESIDENT in ex else graph.memory[v]


def pass_of(graph: Any, v: int) -> str | None:
    """The ``pass`` of node *v*, or None."""
    ex = _extra(graph, v)
    return ex.get(PASS) if ex else None


def memory_fields(graph: Any, v: int, memory: int, resident: int) -> dict:
    """The ``resident_bytes`` / ``pass`` fields of a node made from node *v*
    of *graph* (a replica, a split part, a coarse node) holding *memory*
    bytes of which *resident* are resident state: empty when *graph*
    declares nothing; the resident bytes capped at *memory*; *v*'s pass
    when it has one.

    >>> from celeritas_cli.model.graph import build
    >>> g = build("r", [{"id": "w", "compute_s": 1, "memory_bytes": 10, "resident_bytes": 8,
    ...                  "pass": "forward"}], [])
    >>> memory_fields(g, 0, 6, 8)
    {'resident_bytes': 6, 'pass': 'forward'}
    """
    out: dict[str, Any] = {}
    if declares(graph):
        out[RESIDENT] = max(0, min(int(resident), int(memory)))
    p = pass_of(graph, v)
    if p is not None:
        out[PASS] = p
    return out
