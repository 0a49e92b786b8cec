"""Placements (``placer.placement/v1``): which device runs each node, and
optionally in what order.

Fields: ``graph``, ``cluster``, ``algorithm``, ``params``, ``seed``,
``assignment`` (node id -> device id), ``order`` (optional, device id -> node
ids), ``estimate`` (the algorithm's own prediction), ``placement_time_s``,
and, when the algorithm placed a graph it derived from the input:

* ``derivation``: the recipe, ``{"steps": [...], "base": {...}}``.  Steps in
  order: ``{"transform": "data-parallel", "replicas": k, "scaling":
  "strong"|"weak", "overhead_s": s}`` (the data-parallel graph: ``k``
  replicas, ring all-reduce of the gradients,
  :mod:`celeritas_cli.transform.replicate`) and ``{"transform": "split",
  "node": id, "dim": "batch"|"channel", "n": n, "overhead_s": s}`` (one
  operation split, :mod:`celeritas_cli.transform.splitting`), and the
  ``microbatch`` and ``recompute`` steps of pipelines
  (:mod:`celeritas_cli.transform.microbatch`,
  :mod:`celeritas_cli.transform.recompute`; docs/design.md, "Pipelines").  ``base``
  (``{"graph": name, "members": [[ids], ...]}``) is present when the
  algorithm's input was a coarse graph: its nodes' members, in order.
* ``replicas`` (a symmetric plan whose recipe ends in data parallelism or
  fsdp, :mod:`celeritas_cli.sim.symmetric`): ``{"devices": [[device ids of
  replica r], ...]}``, replica ``r``'s device for each of replica 0's; the
  ``assignment`` and ``order`` then name replica 0's nodes only, so the
  file's size does not grow with the replicas.
* ``split_graph`` (only when asked, ``placer place --embed-derived``): the
  derived graph document the assignment and order refer to.  Its nodes say
  what they are: replicas carry ``replica`` and ``origin``, ring all-reduce
  nodes ``allreduce`` (producer, tensor, phase, step, chunk), split parts
  ``split_of`` and ``part``, micro-batch copies and gradient accumulations
  ``microbatch`` and ``origin``, recompute clones ``recompute_of``.  In
  memory an algorithm's placement keeps the derived graph itself
  (``derived``, never written).

The simulator rebuilds the derived graph from the graph it is given and the
recipe and rejects a ``split_graph`` that differs
(:func:`celeritas_cli.transform.derivation.rebuild`); a ``split_graph``
without a ``derivation`` is rejected.

``cluster_digest`` (:meth:`~celeritas_cli.model.cluster.Cluster.digest`) is
the fingerprint of the cluster the placement was made for, and
``cluster_file`` the file it was read from (absent for a bundled cluster):
``placer simulate`` without ``--cluster`` uses the bundled cluster the
placement names only when the digest matches, and says which file to pass
otherwise.

Algorithms work on node and device indices and build their result with
:meth:`Placement.from_indices`, which expands a coarse graph's ``members`` so
the written placement always names the original node ids (docs/design.md).  A
coarse node's order entry expands to its members in their listed order; the
coarsening methods list members in a topological order of the original
graph, so an order valid on the coarse graph stays valid on the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import InvalidInput
from .cluster import Cluster
from .estimate import Estimate
from .graph import Graph
from .jsonio import check_depth, validate

PLACEMENT_SCHEMA = "placer.placement/v1"


@dataclass
class Placement:
    """A placement over node ids.  ``assignment`` maps every node id to a
    device id; ``order`` (optional) maps device id to its node ids in
    execution order; ``estimate`` is the algorithm's own prediction, an
    :class:`~celeritas_cli.model.estimate.Estimate` saying whose makespan it
    is and on which graph (a dict given here is converted);
    ``split_graph`` (optional) is the graph document the placement refers
    to when the algorithm transformed the graph (FastT/FD-DPS splitting,
    data parallelism) and ``derivation`` the recipe that made it (module
    docstring)."""

    graph: str
    cluster: str
    algorithm: str
    assignment: dict[str, str]
    order: dict[str, list[str]] | None = None
    params: dict = field(default_factory=dict)
    seed: int | None = 0
    estimate: Estimate = field(default_factory=Estimate)
    placement_time_s: float = 0.0
    split_graph: dict | None = None
    derivation: dict | None = None
    cluster_digest: str | None = None
    cluster_file: str | None = None
    #: a symmetric plan's replica map (sim/symmetric.py): ``{"devices": [[ids of replica r], ...]}``; the
    #: assignment and order then name replica 0's nodes only
    replicas: dict | None = None
    derived: Graph | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.estimate, Estimate):
            self.estimate = Estimate.from_dict(self.estimate)

    @property
    def derived_graph(self) -> Graph | None:
        """The same as ``derived`` (the name another work package used)."""
        return self.derived

    @derived_graph.setter
    def derived_graph(self, graph: Graph | None) -> None:
        self.derived = graph

    @property
    def is_derived(self) -> bool:
        """True when the placement refers to a derived graph (a recipe, a carried or an in-memory one)."""
        return self.derivation is not None or self.split_graph is not None or self.derived is not None

    # ---------------------------------------------------------------- build
    @classmethod
    def from_indices(
        cls,
        graph: Graph,
        cluster: Cluster,
        device_of: Sequence[int],
        *,
        algorithm: str,
        order: Sequence[Sequence[int]] | None = None,
        params: dict | None = None,
        seed: int | None = 0,
        estimate: Estimate | dict | None = None,
    ) -> "Placement":
        """Build a placement from ``device_of[v]`` (device index per node of
        *graph*) and optionally ``order[d]`` (node indices per device).

        Coarse nodes are expanded to their members, so the placement is
        written over the original node ids; the estimate then says it holds
        for the coarse graph (``graph: "coarse"``, ``graph_nodes``).
        """
        if len(device_of) != graph.n:
            raise ValueError(f"device_of has {len(device_of)} entries for {graph.n} nodes")
        dev_ids = cluster.ids
        assignment: dict[str, str] = {}
        for v, d in enumerate(device_of):
            did = dev_ids[d]
            for orig in graph.original_ids(v):
                assignment[orig] = did
        ordered = None
        if order is not None:
            ordered = {}
            for d, seq in enumerate(order):
                names: list[str] = []
                for v in seq:
                    names.extend(graph.original_ids(v))
                ordered[dev_ids[d]] = names
        est = Estimate.from_dict(estimate)
        if graph.is_coarse and est.graph == "original":
            est = est.with_graph("coarse", graph.n)
        return cls(graph=graph.original_name, cluster=cluster.name, algorithm=algorithm,
                   assignment=assignment, order=ordered, params=dict(params or {}), seed=seed,
                   estimate=est, cluster_digest=cluster.digest(), cluster_file=cluster.source)

    # ------------------------------------------------------------ serialise
    def to_dict(self, *, timings: bool = True, embed_derived: bool = False) -> dict:
        """The ``placer.placement/v1`` document.  ``timings=False`` leaves out
        the wall-clock measurements (``placement_time_s`` becomes 0 and
        ``estimate`` keys ending in ``_time_s`` are dropped), so the same
        input and seed give byte-identical files.  ``embed_derived=True``
        writes the derived graph as ``split_graph`` (by default only its
        recipe, ``derivation``, from which ``simulate`` rebuilds it)."""
        estimate = self.estimate.to_dict(timings=timings)
        doc: dict[str, Any] = {
            "schema": PLACEMENT_SCHEMA,
            "graph": self.graph,
            "cluster": self.cluster,
        }
        if self.cluster_digest is not None:
            doc["cluster_digest"] = self.cluster_digest
        if self.cluster_file is not None:
            doc["cluster_file"] = self.cluster_file
        doc.update({
            "algorithm": self.algorithm,
            "params": self.params,
            "seed": self.seed,
            "assignment": self.assignment,
        })
        if self.order is not None:
            doc["order"] = self.order
        doc["estimate"] = estimate
        doc["placement_time_s"] = self.placement_time_s if timings else 0.0
        if self.derivation is not None:
            doc["derivation"] = self.derivation
        if self.replicas is not None:
            doc["replicas"] = self.replicas
        if embed_derived and self.replicas is None:
            if self.derived is not None:
                doc["split_graph"] = self.derived.to_dict()
            elif self.split_graph is not None:
                doc["split_graph"] = self.split_graph
        return doc

    @classmethod
    def from_dict(cls, doc: Any, label: str = "placement") -> "Placement":
        validate(doc, PLACEMENT_SCHEMA, label)
        for key in ("params", "estimate", "derivation"):
            check_depth(doc.get(key), label, f"field {key}")
        return cls(graph=doc.get("graph", ""), cluster=doc.get("cluster", ""),
                   cluster_digest=doc.get("cluster_digest"), cluster_file=doc.get("cluster_file"),
                   algorithm=doc.get("algorithm", "given"), assignment=dict(doc["assignment"]),
                   order={k: list(v) for k, v in doc["order"].items()} if doc.get("order") is not None else None,
                   params=dict(doc.get("params") or {}), seed=doc.get("seed"),
                   estimate=Estimate.from_dict(doc.get("estimate"), f"{label}: estimate"),
                   placement_time_s=float(doc.get("placement_time_s", 0.0)),
                   split_graph=doc.get("split_graph"), derivation=doc.get("derivation"),
                   replicas=doc.get("replicas"))

    # ---------------------------------------------------------- resolution
    def check_graph(self, graph: Graph, label: str = "placement") -> None:
        """Refuse, first, a placement made for another graph than *graph*:
        its ``graph`` names another graph and fewer than half of *graph*'s
        nodes are in its assignment (by id, or as the ``<id>/...`` of a
        derived node: ``x/rep0``, ``x/mb1``).  Without this the first
        mismatch found deep in the checks would be reported (a batch size, a
        node), not the cause.  A renamed or edited graph with the same
        nodes passes; a coarse graph or a recipe from one is checked by
        :meth:`resolve` and :func:`~celeritas_cli.transform.derivation.rebuild`.

        Raises
        ------
        InvalidInput
            The placement was made for another graph.

        Example
        -------
        >>> from celeritas_cli.model.graph import build
        >>> g = build("resnet", [{"id": i, "compute_s": 1, "memory_bytes": 0} for i in "abc"], [])
        >>> Placement("gpt", "c", "heft", {"x/rep0": "gpu0", "y/rep0": "gpu0", "a/rep0": "gpu0"}).check_graph(g, "p")
        Traceback (most recent call last):
        ...
        celeritas_cli.errors.InvalidInput: p: this placement was made for graph 'gpt', not for graph 'resnet' \
(only 1 of its 3 nodes are in the placement); simulate it with the graph it was made for, or make one for this \
graph with `placer place GRAPH`
        """
        if not self.graph or self.graph in (graph.name, graph.original_name) or graph.is_coarse or \
                isinstance(self.derivation, dict) and self.derivation.get("base") is not None:
            return
        named = set(self.assignment) | {nid.split("/", 1)[0] for nid in self.assignment}
        seen = sum(1 for nid in graph.ids if nid in named)
        if 2 * seen < graph.n:
            raise InvalidInput(f"{label}: this placement was made for graph '{self.graph}', not for graph "
                               f"'{graph.name}' (only {seen:,} of its {graph.n:,} nodes are in the placement); "
                               f"simulate it with the graph it was made for, or make one for this graph with "
                               f"`placer place GRAPH`")

    def resolve(self, graph: Graph, cluster: Cluster, label: str = "placement"
                ) -> tuple[list[int], list[list[int]] | None]:
        """Map this placement onto *graph*'s node indices and *cluster*'s
        device indices: ``(device_of, order_or_None)``.

        *graph* may be the original graph or a coarse graph made from it
        (then every member of a coarse node must be on one device).

        Raises
        ------
        InvalidInput
            A node missing from the assignment, an invented node, an unknown
            device, a coarse node whose members disagree, or an order that
            does not list exactly the nodes assigned to each device.
        """
        dev_index = cluster.index
        coarse = graph.is_coarse
        if coarse:
            expected = {orig: v for v in range(graph.n) for orig in graph.original_ids(v)}
        else:
            expected = graph.index
        for nid, did in self.assignment.items():
            if nid not in expected:
                raise InvalidInput(f"{label}: assignment names node '{nid}', which is not in graph '{graph.name}'")
            if did not in dev_index:
                raise InvalidInput(
                    f"{label}: node '{nid}' is assigned to unknown device '{did}' "
                    f"(cluster '{cluster.name}' has {', '.join(cluster.ids)})")
        device_of = [-1] * graph.n
        for orig, v in expected.items():
            did = self.assignment.get(orig)
            if did is None:
                raise InvalidInput(f"{label}: node '{orig}' of graph '{graph.name}' has no device in the assignment")
            d = dev_index[did]
            if device_of[v] == -1:
                device_of[v] = d
            elif device_of[v] != d:
                raise InvalidInput(
                    f"{label}: members of coarse node '{graph.ids[v]}' are on different devices "
                    f"({cluster.ids[device_of[v]]} and {did}); simulate the original graph instead")
        order = None
        if self.order is not None:
            order = [[] for _ in range(cluster.k)]
            seen = [False] * graph.n
            counts = [0] * cluster.k
            for v in range(graph.n):
                counts[device_of[v]] += 1
            for did, seq in self.order.items():
                if did not in dev_index:
                    raise InvalidInput(f"{label}: order names unknown device '{did}'")
                d = dev_index[did]
                last = -1
                for nid in seq:
                    v = expected.get(nid)
                    if v is None:
                        raise InvalidInput(f"{label}: order of {did} names node '{nid}', which is not in the graph")
                    if device_of[v] != d:
                        raise InvalidInput(
                            f"{label}: order of {did} lists node '{nid}', which is assigned to "
                            f"{cluster.ids[device_of[v]]}")
                    if coarse:
                        if v == last:
                            continue
                        if seen[v]:
                            raise InvalidInput(f"{label}: order of {did} interleaves members of coarse node "
                                               f"'{graph.ids[v]}'")
                    elif seen[v]:
                        raise InvalidInput(f"{label}: order of {did} lists node '{nid}' twice")
                    seen[v] = True
                    order[d].append(v)
                    last = v
            for d in range(cluster.k):
                if len(order[d]) != counts[d]:
                    missing = next(graph.ids[v] for v in range(graph.n) if device_of[v] == d and not seen[v])
                    raise InvalidInput(
                        f"{label}: order of {cluster.ids[d]} omits node '{missing}' assigned to it")
        return device_of, order

    def device_loads(self, graph: Graph, cluster: Cluster) -> list[int]:
        device_of, _ = self.resolve(graph, cluster)
        return graph.memory_by(device_of, cluster.k)


def finite_or_none(x: float) -> float | None:
    """JSON has no infinity: map non-finite floats to None."""
    return x if math.isfinite(x) else None
