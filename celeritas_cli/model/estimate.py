"""The ``estimate`` of a placement: what the algorithm predicts, and on what.

docs/design.md: "``estimate`` is the algorithm's own prediction and solver
status.  Reports never quote it as the result: the result is what
``simulate`` computes."  An
estimate is only useful when it says where its numbers come from, so the
typed record :class:`Estimate` carries, next to ``makespan_s`` and
``status`` (their meaning unchanged):

* ``makespan_by`` - ``"model"`` when ``makespan_s`` comes from the
  algorithm's own schedule model (HEFT's, m-ETF's, DPOS's timetable, ...),
  ``"simulator"`` when the algorithm ran the simulator
  (:func:`celeritas_cli.sim.simulator.run_schedule`) on its result;
* ``graph`` - the graph that ``makespan_s``, ``status`` and any bound hold
  for: ``"original"`` (the graph the user gave), ``"coarse"`` (a coarse
  graph made from it: its optimum is not the original graph's) or
  ``"split"`` (a graph derived from it - split operations, data-parallel
  replicas - carried by the placement as ``split_graph``);
  ``graph_nodes`` its node count when it is not the original.

Everything else an algorithm reports (solver bound, gap, iterations, ...)
is kept in ``details`` and written as flat keys beside the typed ones, so the
JSON document keeps its shape::

    {"makespan_s": 0.53, "status": "OPTIMAL", "makespan_by": "simulator",
     "graph": "coarse", "graph_nodes": 26, "best_bound_s": 0.5, ...}

The record reads like a mapping (``est["status"]``, ``est.get("gap")``), so
callers that read keys keep working; it is built with :meth:`Estimate.from_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import InvalidInput

MAKESPAN_BY = ("model", "simulator")
GRAPH_KINDS = ("original", "coarse", "split")
_TYPED = ("makespan_s", "status", "makespan_by", "graph", "graph_nodes", "lower_bound_s")


@dataclass(eq=False)
class Estimate(Mapping):
    """An algorithm's prediction for its placement, with its provenance.

    Attributes
    ----------
    makespan_s : float or None
        Predicted makespan in seconds (None: the algorithm predicts none).
    status : str or None
        The algorithm's status (``FEASIBLE``, ``OOM``, ``OPTIMAL``, ...),
        for the graph named by ``graph``.
    makespan_by : {"model", "simulator"} or None
        Whose makespan ``makespan_s`` is (None when there is none).
    graph : {"original", "coarse", "split"}
        The graph the makespan, status and bounds hold for.
    graph_nodes : int or None
        Node count of that graph when it is not the original.
    lower_bound_s : float or None
        The simulator's lower bound on that graph, when reported.
    details : dict
        Algorithm-specific fields (written as flat keys).

    Example
    -------
    >>> e = Estimate.from_dict({"makespan_s": 2.0, "status": "OPTIMAL", "gap": 0.0})
    >>> e.makespan_by, e.graph, e["gap"]
    ('model', 'original', 0.0)
    >>> e.with_graph("coarse", 12).label()
    'OPTIMAL (coarse graph)'
    """

    makespan_s: float | None = None
    status: str | None = None
    makespan_by: str | None = None
    graph: str = "original"
    graph_nodes: int | None = None
    lower_bound_s: float | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.makespan_by is not None and self.makespan_by not in MAKESPAN_BY:
            raise ValueError(f"estimate: makespan_by must be one of {MAKESPAN_BY}, got {self.makespan_by!r}")
        if self.graph not in GRAPH_KINDS:
            raise ValueError(f"estimate: graph must be one of {GRAPH_KINDS}, got {self.graph!r}")
        if self.makespan_s is not None and self.makespan_by is None:
            # docs/design.md: the estimate is the algorithm's own prediction
            self.makespan_by = "model"

    # ------------------------------------------------------------- build
    @classmethod
    def from_dict(cls, doc: Mapping | None, label: str = "estimate") -> "Estimate":
        """An :class:`Estimate` from a flat mapping (an algorithm's dict, or
        the ``estimate`` object of a placement file).  A makespan without
        ``makespan_by`` is the algorithm's own model's (docs/design.md).

        Raises
        ------
        InvalidInput
            ``makespan_by`` or ``graph`` has a value not listed above.
        """
        if isinstance(doc, Estimate):
            return doc.copy()
        doc = dict(doc or {})
        typed: dict[str, Any] = {}
        for key in _TYPED:
            if key in doc:
                typed[key] = doc.pop(key)
        if typed.get("graph") is None:
            typed.pop("graph", None)
        for key, allowed in (("makespan_by", MAKESPAN_BY), ("graph", GRAPH_KINDS)):
            if key in typed and typed[key] is not None and typed[key] not in allowed:
                raise InvalidInput(f"{label}: {key} must be one of {', '.join(allowed)}, got {typed[key]!r}")
        return cls(**typed, details=doc)

    def copy(self) -> "Estimate":
        return Estimate(self.makespan_s, self.status, self.makespan_by, self.graph, self.graph_nodes,
                        self.lower_bound_s, dict(self.details))

    def with_graph(self, kind: str, nodes: int | None = None) -> "Estimate":
        """This estimate, said to hold for a graph of *kind* (``original``,
        ``coarse`` or ``split``) with *nodes* nodes."""
        out = self.copy()
        out.graph = kind
        out.graph_nodes = None if kind == "original" else nodes
        out.__post_init__()
        return out

    # ------------------------------------------------------------- read
    def label(self) -> str | None:
        """The status with the graph it holds for when that is not the
        original, e.g. ``"OPTIMAL (coarse graph)"``; None without status."""
        if self.status is None:
            return None
        return self.status if self.graph == "original" else f"{self.status} ({self.graph} graph)"

    def to_dict(self, *, timings: bool = True) -> dict:
        """The flat JSON object (typed keys first, None-valued ones left
        out); ``timings=False`` drops keys ending in ``_time_s``."""
        out: dict[str, Any] = {}
        for key in _TYPED:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key, value in self.details.items():
            if key not in out:
                out[key] = value
        if not timings:
            out = {k: v for k, v in out.items() if not k.endswith("_time_s")}
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
