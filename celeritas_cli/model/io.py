"""Loading graphs, clusters and placements from files (``-`` = stdin), and
the bundled default cluster."""

from __future__ import annotations

import os
from importlib import resources

from ..errors import InvalidInput
from .cluster import Cluster
from .graph import Graph
from .jsonio import label_of, loads, read_json
from .placement import Placement

DEFAULT_CLUSTER = "4xV100-pcie"


def load_graph(path: str | os.PathLike) -> Graph:
    """Read and validate a graph file (``-`` = stdin)."""
    return Graph.from_dict(read_json(path, "placer.graph/v1"), label_of(path))


def load_cluster(path: str | os.PathLike | None) -> Cluster:
    """Read a cluster file; ``None`` gives the default 4xV100-32GB PCIe
    cluster (Celeritas 6.2.1).  The name of a bundled cluster
    (:func:`bundled_cluster_names`, ``placer clusters``) works too.

    Raises
    ------
    InvalidInput
        Neither a file nor a bundled name (the message lists the bundled
        ones), or an invalid cluster document.
    """
    if path is None:
        return bundled_cluster(DEFAULT_CLUSTER)
    p = str(path)
    if p != "-" and not os.path.exists(p):
        if p in bundled_cluster_names():
            return bundled_cluster(p)
        raise InvalidInput(f"{p}: no such file, and no bundled cluster of that name "
                           f"(bundled: {', '.join(bundled_cluster_names())}; `placer clusters` describes them)")
    cluster = Cluster.from_dict(read_json(path, "placer.cluster/v1"), label_of(path))
    if p != "-":
        cluster.source = p
    return cluster


def bundled_cluster_names() -> list[str]:
    """Names of the clusters shipped in ``celeritas_cli/data/``, sorted."""
    root = resources.files("celeritas_cli").joinpath("data")
    return sorted(f.name.removesuffix(".json") for f in root.iterdir() if f.name.endswith(".json"))


def bundled_cluster(name: str) -> Cluster:
    """The bundled cluster *name*.

    Raises
    ------
    InvalidInput
        Unknown name (the message lists the bundled ones).

    Example
    -------
    >>> bundled_cluster("8xH100-nvswitch").k
    8
    """
    if name not in bundled_cluster_names():
        raise InvalidInput(f"unknown cluster '{name}' (bundled: {', '.join(bundled_cluster_names())})")
    data = resources.files("celeritas_cli").joinpath("data").joinpath(f"{name}.json").read_bytes()
    return Cluster.from_dict(loads(data, name), name)


def load_placement(path: str | os.PathLike) -> Placement:
    """Read and validate a placement file (``-`` = stdin)."""
    return Placement.from_dict(read_json(path, "placer.placement/v1"), label_of(path))
