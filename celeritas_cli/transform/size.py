"""How large a derived graph will be, said before it is built, and the
budget it must fit.

Every graph rewrite of :mod:`celeritas_cli.transform` states the size of
what it builds from the size of its input, before building anything
(:func:`~.admit.data_parallel_size`, :func:`~.admit.split_size`;
a recipe step's ``size`` in :mod:`~.derivation`), and refuses in one line
when that size is over the budget: a recipe forged with a million
replicas, or data parallelism over 1,024 devices, is answered at once
instead of growing until the machine runs out of memory.

The budget: at most :data:`MAX_DERIVED_NODES` nodes, :data:`EDGES_PER_NODE`
times as many edges, and :data:`CELLS_PER_NODE` times as many node-device
pairs (the cost model keeps a time for every node on every device, so on
more than 64 devices the node budget shrinks to ``64 N / devices``).  What
a derived graph costs placer while it is built, placed and simulated was
measured on data-parallel graphs (``layered_60`` with 64-256 replicas, a
36,000-node synthetic graph on 8 devices): about :data:`NODE_RAM` bytes per
node, :data:`EDGE_RAM` per edge and :data:`CELL_RAM` per node and device,
so the default budget keeps a derivation within a few GiB (data
parallelism of ``layered_60`` on 256 devices, 146,432 nodes: 1.9 GB).
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
from ..model.clock import check_time

#: the largest derived graph built by default (nodes); ``--max-derived-nodes`` changes it
MAX_DERIVED_NODES = 1_000_000
#: edges allowed per node of the budget (a data-parallel graph has about 2 edges per node)
EDGES_PER_NODE = 4
#: node-device pairs allowed per node of the budget (the cost model's times)
CELLS_PER_NODE = 64
#: placer's memory per node, per edge and per node and device of a derived graph over a whole ``place``
#: (bytes, measured: module docstring)
NODE_RAM = 1100
EDGE_RAM = 550
CELL_RAM = 32

_BUDGET: ContextVar[int] = ContextVar("max_derived_nodes", default=MAX_DERIVED_NODES)


@dataclass(frozen=True)
class Size:
    """Nodes and edges of a graph (or of one a rewrite would build)."""

    nodes: int
    edges: int

    def ram_bytes(self, devices: int = 1) -> int:
        """About how much memory placer needs for such a graph on *devices*
        devices (:data:`NODE_RAM`, :data:`EDGE_RAM`, :data:`CELL_RAM`)."""
        return self.nodes * (NODE_RAM + CELL_RAM * devices) + self.edges * EDGE_RAM


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


def node_limit(devices: int | None = None) -> int:
    """Nodes a derived graph may have on *devices* devices under the budget in force."""
    limit = _BUDGET.get()
    return min(limit, CELLS_PER_NODE * limit // devices) if devices else limit


def over_budget(size: Size, devices: int | None = None) -> bool:
    """True when *size* (on *devices* devices, when known) exceeds the budget in force."""
    return size.nodes > node_limit(devices) or size.edges > EDGES_PER_NODE * _BUDGET.get()


def check_size(size: Size, what: str, hint: str = "", devices: int | None = None) -> None:
    """Refuse to build a graph of *size* (placed on *devices* devices, when
    known) over the budget.  Every rewrite calls it before it builds, so it
    also checks the registry's time cap (:func:`~celeritas_cli.model.clock.check_time`):
    no derived graph is built past it.

    Raises
    ------
    InvalidInput
        ``"<what> would build a derived graph of N nodes and M edges (about
        X GiB in placer), over the budget of B nodes and E edges
        (--max-derived-nodes)"`` plus *hint* (what to change).
    """
    check_time()
    if not over_budget(size, devices):
        return
    gib = size.ram_bytes(devices or 1) / 2**30
    on = f" on {devices} devices" if devices and node_limit(devices) < _BUDGET.get() else ""
    raise InvalidInput(f"{what} would build a derived graph of {size.nodes:,} nodes and {size.edges:,} edges "
                       f"(about {gib:,.1f} GiB in placer), over the budget of {node_limit(devices):,} nodes{on} "
                       f"and {EDGES_PER_NODE * _BUDGET.get():,} edges (--max-derived-nodes)"
                       + (f"; {hint}" if hint else ""))
