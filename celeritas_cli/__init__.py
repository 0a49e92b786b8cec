"""placer: decide which GPU runs each operator of a large dataflow graph.

The library API that the CLI (``placer``) is a thin layer over::

    from celeritas_cli import load_graph, load_cluster, place, simulate
    g = load_graph("sample_graphs/layered_1k.json")
    c = load_cluster("sample_graphs/clusters/4xV100-pcie.json")
    p = place(g, c, "adjusting")
    report = simulate(g, c, p)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    ColocationError,
    CycleError,
    Infeasible,
    InvalidInput,
    MissingDependency,
    PlacerError,
    SolverError,
)
from .model.cluster import Cluster, Device  # noqa: E402
from .model.graph import Graph  # noqa: E402
from .model.io import load_cluster, load_graph, load_placement  # noqa: E402
from .model.placement import Placement  # noqa: E402
from .registry import coarsen, place  # noqa: E402
from .sim.simulator import simulate  # noqa: E402

__all__ = [
    "Cluster", "Device", "Graph", "Placement", "PlacerError", "InvalidInput", "CycleError",
    "ColocationError", "Infeasible", "SolverError", "MissingDependency", "load_graph",
    "load_cluster", "load_placement", "place", "coarsen", "simulate", "__version__",
]
