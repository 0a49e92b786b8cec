"""How large a derived graph will be, said before it is built, and the
budget it must fit.

Every graph rewrite of :mod:`celeritas_cli.transform` states the size of
what it builds from the size of its input, before building anything
(:func:`~.replicate.data_parallel_size`, :func:`~.splitting.split_size`;
a recipe step's ``size`` in :mod:`~.derivation`), and refuses in one line
when that size is over the budget: a recipe forged with a million
replicas, or data parallelism over 1,024 devices, is answered at once
instead of growing until the machine runs out of memory.

The budget: at most :data:`MAX_DERIVED_NODES` nodes and
:data:`EDGES_PER_NODE` times as many edges.  A derived graph costs placer
about :data:`NODE_RAM` bytes per node and :data:`EDGE_RAM` per edge while
it is built, placed and simulated (measured on data-parallel graphs of
``layered_60`` with 64-256 replicas: 0.6-0.8 KiB per node or edge for the
graph being built, about 4 KiB per node or edge over a whole ``placer
place``), so the default budget keeps a derivation within a few GiB.
``placer place`` and ``placer simulate`` take ``--max-derived-nodes N`` to
raise or lower it (:func:`derived_budget`).

Example
-------
>>> check_size(Size(10, 20), "a split")
>>> with derived_budget(5):
...     check_size(Size(10, 20), "a split")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
celeritas_cli.errors.InvalidInput: a split would build a derived graph of 10 nodes and 20 edges..., over the budget of 5 nodes...
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from ..errors import InvalidInput

#: the largest derived graph built by default (nodes); ``--max-derived-nodes`` changes it
MAX_DERIVED_NODES = 1_000_000
#: edges allowed per node of the budget (a data-parallel graph has about 2 edges per node)
EDGES_PER_NODE = 4
#: placer's memory per node and per edge of a derived graph over a whole ``place`` (bytes, measured)
NODE_RAM = 4096
EDGE_RAM = 4096

_BUDGET: ContextVar[int] = ContextVar("max_derived_nodes", default=MAX_DERIVED_NODES)


@dataclass(frozen=True)
class Size:
    """Nodes and edges of a graph (or of one a rewrite would build)."""

    nodes: int
    edges: int

    @property
    def ram_bytes(self) -> int:
        """About how much memory placer needs for such a graph (:data:`NODE_RAM`, :data:`EDGE_RAM`)."""
        return self.nodes * NODE_RAM + self.edges * EDGE_RAM

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "edges": self.edges, "ram_bytes": self.ram_bytes}


def max_derived_nodes() -> int:
    """The node budget in force (:data:`MAX_DERIVED_NODES` unless :func:`derived_budget` changed it)."""
    return _BUDGET.get()


@contextmanager
def derived_budget(max_nodes: int | None) -> Iterator[None]:
    """Within the block, derived graphs may have up to *max_nodes* nodes
    (``None``: the default)."""
    if max_nodes is None:
        yield
        return
    if max_nodes < 1:
        raise InvalidInput(f"the derived-graph budget must be at least 1 node, got {max_nodes}")
    token = _BUDGET.set(int(max_nodes))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def over_budget(size: Size) -> bool:
    """True when *size* exceeds the budget in force."""
    limit = _BUDGET.get()
    return size.nodes > limit or size.edges > EDGES_PER_NODE * limit


def check_size(size: Size, what: str, hint: str = "") -> None:
    """Refuse to build a graph of *size* over the budget.

    Raises
    ------
    InvalidInput
        ``"<what> would build a derived graph of N nodes and M edges (about
        X GiB in placer), over the budget of B nodes (--max-derived-nodes)"``
        plus *hint* (what to change).
    """
    if not over_budget(size):
        return
    limit = _BUDGET.get()
    gib = size.ram_bytes / 2**30
    raise InvalidInput(f"{what} would build a derived graph of {size.nodes:,} nodes and {size.edges:,} edges "
                       f"(about {gib:,.1f} GiB in placer), over the budget of {limit:,} nodes and "
                       f"{EDGES_PER_NODE * limit:,} edges (--max-derived-nodes)" + (f"; {hint}" if hint else ""))
