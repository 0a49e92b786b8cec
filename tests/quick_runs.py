"""The quick runs of the registered algorithms on the sample graphs, made once per test session.

tests/algorithms/test_all_algorithms.py, tests/test_golden.py and tests/sim/test_honest_bounds.py judge
the same runs (an algorithm with its ``quick_params`` and ``seed=0`` on a sample graph and cluster),
each with its own assertions; the run and its simulation are computed here once and shared, so the
default suite pays for each only once.  The returned objects are shared: a test reads them and never
changes them.  A test that needs a second, independent run (determinism) calls the registry itself.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from celeritas_cli import registry
from celeritas_cli.model.graph import Graph
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_graphs"


#: quick runs of several CPU seconds each whose checks the same algorithm's runs on layered_60 (on the
#: default and the moirai-inter-server cluster), the coarse graph and tensor_holography make in the default
#: suite: marked slow (``make test-all`` runs them) in both files that judge them
SLOW_RUNS = {("auto", "layered_300", "4xV100-pcie"), ("pipeline", "layered_300", "4xV100-pcie"),
             ("gpipe", "layered_300", "4xV100-pcie"), ("auto", "layered_60", "moirai-intra-server"),
             ("pipeline", "layered_60", "moirai-intra-server")}


def marks(algo: str, name: str, cluster_name: str) -> list:
    """The pytest marks of the case judging the quick run of *algo* on graph *name* and the cluster."""
    return [pytest.mark.slow] if (algo, name, cluster_name) in SLOW_RUNS else []


@functools.lru_cache(maxsize=None)
def cluster(name: str):
    """The sample cluster *name* (``sample_graphs/clusters/<name>.json``)."""
    return load_cluster(str(SAMPLES / "clusters" / f"{name}.json"))


def graph_file(name: str) -> str:
    """The sample graph file of *name* (``layered_60``, ``zoo/nmt``, ``layered_1000@cpd``: the base graph)."""
    base = name.split("@")[0]
    return str(SAMPLES / (f"{base}.json.gz" if base.startswith("zoo/") else f"{base}.json"))


@functools.lru_cache(maxsize=None)
def original(name: str) -> Graph:
    """The sample graph *name* as read, before any coarsening (``@method``)."""
    return load_graph(graph_file(name))


@functools.lru_cache(maxsize=None)
def graph(name: str, cluster_name: str) -> Graph:
    """The sample graph *name*; ``base@method`` is the base graph coarsened by *method* for the cluster."""
    if "@" in name:
        return registry.coarsen(original(name), cluster(cluster_name), name.split("@")[1])
    return original(name)


def run(algo: str, name: str, cluster_name: str) -> Placement:
    """A fresh quick run of *algo* (its ``quick_params``, ``seed=0``) on graph *name* and the cluster."""
    return registry.place(graph(name, cluster_name), cluster(cluster_name), algo, seed=0,
                          params=dict(registry.get(algo).quick_params or {}))


@functools.lru_cache(maxsize=None)
def placement(algo: str, name: str, cluster_name: str) -> Placement:
    """:func:`run`, made once per session (not for ``given``, which reads a file).  A refusal
    (``InvalidInput``) is not kept: it is raised again, quickly, each time."""
    return run(algo, name, cluster_name)


def report(algo: str, name: str, cluster_name: str, on_original: bool = False) -> dict:
    """The simulator's report of :func:`placement` (made once per session), on the graph it was placed
    on, or with *on_original* on the graph before coarsening (a coarse placement judged on the fine graph)."""
    return _report(algo, name, cluster_name, on_original and "@" in name)


@functools.lru_cache(maxsize=None)
def _report(algo: str, name: str, cluster_name: str, on_original: bool) -> dict:
    g = original(name) if on_original else graph(name, cluster_name)
    return simulate(g, cluster(cluster_name), placement(algo, name, cluster_name))
