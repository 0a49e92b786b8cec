"""Topological orders: M-TOPO, DFS-TOPO, CPD-TOPO (Celeritas 4.2.2, 5.1.3)."""

from __future__ import annotations

import random

import pytest

from celeritas_cli.errors import CycleError
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.scheduling.orders import (
    cpd_topo,
    cut_edges,
    dfs_topo,
    m_topo,
    tlevel_blevel,
)

from ..conftest import edge, node


def is_topological(g, order):
    pos = {v: i for i, v in enumerate(order)}
    return sorted(order) == list(range(g.n)) and all(pos[s] < pos[d] for s, d in zip(g.edge_src, g.edge_dst))


def figure3():
    """The shape of Celeritas Figure 3: four independent sources a1..a4,
    each feeding its own child b1..b4 (many 0-indegree nodes, as in Tensor
    Holography).  Node file order lists all sources first."""
    nodes = [node(f"a{i}") for i in range(1, 5)] + [node(f"b{i}") for i in range(1, 5)]
    edges = [edge(f"a{i}", f"b{i}") for i in range(1, 5)]
    return build("figure3", nodes, edges)


def ids(g, order):
    return [g.ids[v] for v in order]


def random_dag(rng, n, p):
    nodes = [node(f"v{i}", c=rng.uniform(0.1, 3.0), mem=rng.randint(0, 10)) for i in range(n)]
    edges = [edge(f"v{i}", f"v{j}", b=rng.randint(1, 500)) for i in range(n) for j in range(i + 1, n)
             if rng.random() < p]
    perm = list(range(n))
    rng.shuffle(perm)  # file order != a topological order
    return build(f"rand{n}", [nodes[i] for i in perm], edges)


def test_figure3_m_topo_cuts_edges_dfs_topo_does_not():
    g = figure3()
    assert ids(g, m_topo(g)) == ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]
    assert ids(g, dfs_topo(g)) == ["a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4"]
    # placing the sequence on two devices, four nodes each (4.2.2)
    assert cut_edges(g, m_topo(g), 2) == 4
    assert cut_edges(g, dfs_topo(g), 2) == 0
    assert cut_edges(g, cpd_topo(g), 2) == 0


def test_cpd_topo_follows_critical_path_first():
    # r -> {light(1), heavy(5)} -> j: heavy is on the critical path, so it
    # comes right after r; roots by decreasing cpath: r2 (cpath 10) before r.
    g = build("fork", [node("r", 1), node("light", 1), node("heavy", 5), node("j", 1), node("r2", 10)],
              [edge("r", "light"), edge("r", "heavy"), edge("light", "j"), edge("heavy", "j")])
    assert ids(g, cpd_topo(g)) == ["r2", "r", "heavy", "light", "j"]
    assert ids(g, dfs_topo(g)) == ["r", "light", "heavy", "j", "r2"]


def test_tlevel_blevel_by_hand(diamond, two_dev):
    # a(1) -> {b(2), c(3)} -> d(1); every edge 100 B over 100 B/s = 1 s
    tl, bl = tlevel_blevel(diamond, CostModel(diamond, two_dev))
    assert tl == pytest.approx([0.0, 2.0, 2.0, 6.0])
    assert bl == pytest.approx([7.0, 4.0, 5.0, 1.0])
    cp = [a + b for a, b in zip(tl, bl)]
    assert cp == pytest.approx([7.0, 6.0, 7.0, 7.0])  # a -> c -> d is critical, b is not
    # without costs: compute only
    tl0, bl0 = tlevel_blevel(diamond)
    assert tl0 == [0.0, 1.0, 1.0, 4.0] and bl0 == [5.0, 3.0, 4.0, 1.0]


def test_empty_and_single():
    g1 = build("one", [node("a")], [])
    for f in (m_topo, dfs_topo, cpd_topo):
        assert f(g1) == [0]
    g0 = build("empty", [], [])
    for f in (m_topo, dfs_topo, cpd_topo):
        assert f(g0) == []


def test_orders_are_topological_on_random_dags():
    rng = random.Random(7)
    c = uniform(3)
    for _ in range(200):
        g = random_dag(rng, rng.randint(1, 25), rng.uniform(0.0, 0.4))
        for order in (m_topo(g), dfs_topo(g), cpd_topo(g), cpd_topo(g, CostModel(g, c))):
            assert is_topological(g, order)


def test_orders_deterministic_and_scale():
    g = layered(3000, seed=2)
    cm = CostModel(g, uniform(4))
    a, b = cpd_topo(g, cm), cpd_topo(g, cm)
    assert a == b and is_topological(g, a)
    assert is_topological(g, dfs_topo(g))


def test_deep_chain_needs_no_recursion():
    n = 20000
    g = build("chain", [node(f"v{i}") for i in range(n)], [edge(f"v{i}", f"v{i + 1}") for i in range(n - 1)])
    assert cpd_topo(g) == list(range(n))
    assert dfs_topo(g) == list(range(n))


def test_cycle_is_rejected_on_load():
    with pytest.raises(CycleError):
        build("cyc", [node("a"), node("b")], [edge("a", "b"), edge("b", "a")])
