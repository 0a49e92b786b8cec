"""Shared fixtures: tiny literal graphs and clusters."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_graphs"
CLUSTERS = SAMPLES / "clusters"


def node(nid, c=1.0, mem=0, **kw):
    return {"id": nid, "compute_s": c, "memory_bytes": mem, **kw}


def edge(s, d, b=100, **kw):
    return {"src": s, "dst": d, "bytes": b, **kw}


@pytest.fixture
def chain3():
    """a(1) -> b(2) -> c(3), 100-byte tensors."""
    return build("chain3", [node("a", 1), node("b", 2), node("c", 3)], [edge("a", "b"), edge("b", "c")])


@pytest.fixture
def diamond():
    """a(1) -> {b(2), c(3)} -> d(1); a's output is one tensor."""
    return build("diamond", [node("a", 1), node("b", 2), node("c", 3), node("d", 1)],
                 [edge("a", "b", tensor="out"), edge("a", "c", tensor="out"), edge("b", "d"), edge("c", "d")])


@pytest.fixture
def two_dev():
    """2 devices, 100 B/s, no latency: a 100-byte tensor takes 1 s."""
    return uniform(2, bandwidth=100.0, latency=0.0)


@pytest.fixture
def three_dev():
    return uniform(3, bandwidth=100.0, latency=0.0)
