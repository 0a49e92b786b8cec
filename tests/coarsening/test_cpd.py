"""Celeritas Optimal Operation Fusion (``cpd`` coarsening, 5.1, Algorithm 1)."""

from __future__ import annotations

import random

import pytest

from celeritas_cli import registry
from celeritas_cli.transform.contract import is_acyclic
from celeritas_cli.coarsening.cpd import (
    cpd,
    cpd_clusters,
    default_parameters,
    memory_cap,
    optimal_bp,
)
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import GiB, uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.scheduling.orders import cpd_topo

from ..conftest import edge, node


def random_dag(rng, n, p, coloc=0.0):
    nodes = []
    for i in range(n):
        nd = node(f"v{i}", c=rng.uniform(0.1, 3.0), mem=rng.randint(0, 10))
        if coloc and rng.random() < coloc:
            nd["colocation"] = f"g{rng.randint(0, 3)}"
        nodes.append(nd)
    edges = [edge(f"v{i}", f"v{j}", b=rng.randint(1, 500)) for i in range(n) for j in range(i + 1, n)
             if rng.random() < p]
    perm = list(range(n))
    rng.shuffle(perm)
    return build(f"rand{n}", [nodes[i] for i in perm], edges)


def partition_cost(g, seq, starts, c):
    seg = [0] * g.n
    bounds = list(starts) + [len(seq)]
    for k in range(len(starts)):
        for p in range(bounds[k], bounds[k + 1]):
            seg[seq[p]] = k
    return sum(c[e] for e in range(g.m) if seg[g.edge_src[e]] != seg[g.edge_dst[e]])


def brute_force(g, seq, c, R, cap):
    """Minimum of Eq. 4 summed over clusters, over every set of breakpoints."""
    n = len(seq)
    best = None
    for mask in range(1 << (n - 1)):
        starts = [0] + [i for i in range(1, n) if mask >> (i - 1) & 1]
        bounds = starts + [n]
        ok = True
        for a, b in zip(bounds, bounds[1:]):
            if b - a > R or (b - a > 1 and sum(g.memory[seq[p]] for p in range(a, b)) > cap):
                ok = False
                break
        if ok:
            cost = partition_cost(g, seq, starts, c)
            if best is None or cost < best:
                best = cost
    return best


def test_optimal_bp_matches_brute_force():
    rng = random.Random(11)
    for trial in range(150):
        n = rng.randint(1, 9)
        g = random_dag(rng, n, rng.uniform(0.1, 0.6))
        c = [rng.uniform(0.0, 5.0) for _ in range(g.m)]
        seq = cpd_topo(g, ([1.0] * g.n, c))
        R = rng.randint(1, n + 1)
        cap = rng.choice([5, 12, 25, 1000])
        starts, cost = optimal_bp(g, seq, c, R, cap)
        assert starts[0] == 0 and starts == sorted(set(starts))
        bounds = starts + [n]
        for a, b in zip(bounds, bounds[1:]):
            assert b - a <= R
            assert b - a == 1 or sum(g.memory[seq[p]] for p in range(a, b)) <= cap
        assert cost == pytest.approx(partition_cost(g, seq, starts, c), abs=1e-9)
        assert cost == pytest.approx(brute_force(g, seq, c, R, cap), abs=1e-9), trial


def test_optimal_bp_by_hand():
    # a -5- b -1- c -5- d: with R=2 the cheap cut is b|c
    g = build("c4", [node(x, mem=1) for x in "abcd"], [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    assert optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], 2, 10) == ([0, 2], 1.0)
    # R large: one cluster, no cost
    assert optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], 200, 10) == ([0], 0.0)
    # memory cap 1: every node alone, every edge cut
    assert optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], 200, 1) == ([0, 1, 2, 3], 11.0)
    # a node heavier than the cap still forms a cluster by itself
    assert optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], 200, 0) == ([0, 1, 2, 3], 11.0)
    assert optimal_bp(g, [], [], 5, 10) == ([], 0.0)
    with pytest.raises(InvalidInput):
        optimal_bp(g, [0, 1, 2, 3], [5.0, 1.0, 5.0], 0, 10)


def test_coarse_graph_always_acyclic_random_dags():
    """Lemma 2 (plus the sink-follower rule) on thousands of random DAGs."""
    rng = random.Random(2024)
    cl = uniform(3, memory=40, bandwidth=100.0, latency=0.01)
    for _ in range(2500):
        g = random_dag(rng, rng.randint(1, 14), rng.uniform(0.05, 0.5), coloc=rng.choice([0.0, 0.3, 0.8]))
        R = rng.randint(1, 8)
        M = rng.choice([0.2, 0.5, 1.0, 7.0])
        cluster_of, info = cpd_clusters(g, cl, R=R, M=M)
        assert is_acyclic(g, cluster_of)


def test_coarse_graph_contents_on_random_dags():
    rng = random.Random(5)
    cl = uniform(2, memory=30, bandwidth=100.0, latency=0.0)
    for _ in range(150):
        g = random_dag(rng, rng.randint(1, 12), rng.uniform(0.1, 0.5), coloc=0.3)
        cg = cpd(g, cl, R=rng.randint(1, 6), M=0.5)  # contract() re-validates (would raise on a cycle)
        members = [m for v in range(cg.n) for m in cg.original_ids(v)]
        assert sorted(members) == sorted(g.ids)
        assert cg.total_memory() == g.total_memory()
        assert cg.total_compute() == pytest.approx(g.total_compute())
        # colocation: all members of an original group sit in coarse nodes with one colocation value
        where = {m: v for v in range(cg.n) for m in cg.original_ids(v)}
        for grp, nodes in g.colocation_groups().items():
            vals = {cg.colocation[where[g.ids[v]]] for v in nodes}
            assert len(vals) == 1 and None not in vals, grp


def test_memory_cap_per_cluster():
    g = layered(800, seed=3)
    cl = uniform(4, memory=8 * GiB)
    cap = memory_cap(cl, 0.05)
    assert cap == int(0.05 * 8 * GiB)
    assert memory_cap(cl, 12345.0) == 12345
    cluster_of, info = cpd_clusters(g, cl, R=1000, M=0.05)
    seg_mem: dict[int, int] = {}
    seg_n: dict[int, int] = {}
    for v, c in enumerate(cluster_of):
        if c < info["segments"]:
            seg_mem[c] = seg_mem.get(c, 0) + g.memory[v]
            seg_n[c] = seg_n.get(c, 0) + 1
    assert all(seg_mem[c] <= cap or seg_n[c] == 1 for c in seg_mem)
    with pytest.raises(InvalidInput):
        memory_cap(cl, -1.0)


def test_table2_style_reduction_on_layered_graph():
    g = layered(6000, seed=1)
    cl = uniform(4)  # 4 x 32 GiB, PCIe-like 10 GB/s
    cg = registry.coarsen(g, cl, "cpd", params={"R": "200"})
    assert g.n / cg.n > 20
    ccr0, ccr1 = CostModel(g, cl).ccr(), CostModel(cg, cl).ccr()
    assert ccr1 < ccr0 / 2
    assert cg.meta["coarsened_from"] == g.name and cg.meta["coarsening"] == "cpd"
    # the sink-follower rule keeps colocation groups small: one cluster plus its followers
    groups = cg.colocation_groups()
    assert groups and max(len(v) for v in groups.values()) <= 2


def test_deterministic():
    g = layered(1500, seed=4)
    cl = uniform(4)
    assert cpd(g, cl).to_dict() == cpd(g, cl).to_dict()


def test_bad_parameters():
    g = layered(50)
    with pytest.raises(InvalidInput, match="R: must be >= 0"):
        registry.coarsen(g, uniform(2), "cpd", params={"R": "-1"})
    with pytest.raises(InvalidInput):
        registry.coarsen(g, uniform(2), "cpd", params={"R": "x"})
    with pytest.raises(InvalidInput, match="parameter M"):
        registry.coarsen(g, uniform(2), "cpd", params={"M": "-0.5"})


def test_registered():
    assert "cpd" in registry.coarsener_names()
    entry = registry.get_coarsener("cpd")
    assert entry.params["R"].default == 0 and entry.params["M"].default == 0  # 0 = default_parameters


@pytest.mark.parametrize("n", [1, 2, 3])
def test_tiny_graphs(n):
    g = build("t", [node(f"v{i}") for i in range(n)],
              [edge(f"v{i}", f"v{i + 1}") for i in range(n - 1)])
    cg = cpd(g, uniform(2), R=200)
    assert cg.n == 1 and cg.members[0] == g.ids
    assert cpd(g, uniform(2)).n == n  # the default R keeps a few nodes per device: nothing to merge


def test_default_parameters_rule():
    # R = min(200, ceil(n / 3k)); M = 0.25 unless the packing bound is lower
    assert default_parameters(layered(36000), uniform(4)) == (200, 0.25)
    assert default_parameters(layered(60), uniform(4)) == (5, 0.25)
    assert default_parameters(layered(60), uniform(2)) == (10, 0.25)
    g = layered(300, seed=2)
    total = g.total_memory()
    tight = uniform(2, memory=int(total * 0.55))  # slack 10% of the graph: bound 0.05 T per device
    R, M = default_parameters(g, tight)
    assert R == 50 and M == pytest.approx((2 * int(total * 0.55) - total) // 2 / int(total * 0.55))
    assert M < 0.25
    # explicit R / M still override the defaults, R = 0 / M = 0 take them
    cg = cpd(g, uniform(4), R=0, M=0)
    assert cg.meta["cpd"]["R"] == default_parameters(g, uniform(4))[0]
    assert cpd(g, uniform(4), R=7).meta["cpd"]["R"] == 7


@pytest.mark.parametrize("path", ["layered_300.json", "zoo/tensor_holography.json.gz", "zoo/resnet50.json.gz"])
def test_default_keeps_a_few_coarse_nodes_per_device(path):
    from celeritas_cli.model.io import load_cluster, load_graph

    from ..conftest import SAMPLES

    g = load_graph(SAMPLES / path)
    cl = load_cluster("4xV100-pcie")
    cg = cpd(g, cl)
    assert 3 * cl.k <= cg.n <= g.n


def test_all_sink_follower_case():
    # two colocated sinks fed by a long chain; with R=1 they cannot share the
    # anchor's cluster, so the later one joins a follower node
    nodes = [node("a", colocation="w"), node("b"), node("c"), node("u", colocation="w")]
    edges = [edge("a", "b"), edge("b", "c"), edge("c", "u")]
    g = build("f", nodes, edges)
    cluster_of, info = cpd_clusters(g, uniform(2), R=1, M=1.0)
    assert info["detached_sinks"] == 1
    assert is_acyclic(g, cluster_of)
    cg = cpd(g, uniform(2), R=1)
    assert cg.n == 4
    assert len({cg.colocation[v] for v in range(cg.n) if cg.colocation[v]}) == 1

