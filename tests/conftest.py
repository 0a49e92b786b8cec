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


def training_model():
    """A tiny training step (1100 B): x -> f (params) -> b (backward, gradient) -> u (update)."""
    return build("tm", [node("x", 0.4, 400), node("f", 8.0, 500, colocation="p", splittable=["batch"],
                                                   batch_independent={"memory_bytes": 100, "state_bytes": 100}),
                        node("b", 8.0, 100, op="aten.mm", splittable=["batch"]),
                        node("u", 1.0, 200, op="optim.sgd", colocation="p")],
                 [edge("x", "f", 400, tensor="x:0"), edge("f", "b", 400, tensor="f:0"),
                  edge("b", "u", 100, tensor="b:0")], meta={"phase": "training", "batch_size": 8})


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
