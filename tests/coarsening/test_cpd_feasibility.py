"""CPD never makes a feasible graph infeasible (issue 13.3a): a coarse
colocation unit is one original unit or weighs at most the packing bound,
and whenever the original graph has a placement that fits the devices, so
does the coarse graph (checked by exhaustive packing on small instances)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas_cli.coarsening.cpd import cpd, packing_bound
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.graph import Graph, build

from ..conftest import edge, node


def units(g: Graph) -> list[tuple[int, frozenset]]:
    """(memory, original node ids) per colocation unit of *g* (a group, or
    a node without one)."""
    out = []
    seen = set()
    groups = g.colocation_groups()
    for v in range(g.n):
        grp = g.colocation[v]
        if grp is None:
            out.append((g.memory[v], frozenset(g.original_ids(v))))
        elif grp not in seen:
            seen.add(grp)
            members = groups[grp]
            out.append((sum(g.memory[u] for u in members),
                        frozenset(i for u in members for i in g.original_ids(u))))
    return out


def packs(sizes: list[int], caps: list[int]) -> bool:
    """Exact bin packing by backtracking (largest item first)."""
    sizes = sorted(sizes, reverse=True)
    free = list(caps)

    def go(i: int) -> bool:
        if i == len(sizes):
            return True
        tried = set()
        for d in range(len(free)):
            if free[d] >= sizes[i] and free[d] not in tried:
                tried.add(free[d])
                free[d] -= sizes[i]
                if go(i + 1):
                    return True
                free[d] += sizes[i]
        return False

    return go(0)


def cluster_of(mems: list[int]) -> Cluster:
    return Cluster.from_dict({"schema": "placer.cluster/v1", "name": "c",
                              "devices": [{"id": f"gpu{i}", "type": "V100", "memory_bytes": m}
                                          for i, m in enumerate(mems)],
                              "links": {"default": {"bandwidth_Bps": 1.0e3, "latency_s": 0.0}}}, "c")


@st.composite
def instances(draw):
    n = draw(st.integers(2, 12))
    mem = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    grp = draw(st.lists(st.sampled_from([None, None, "a", "b", "c", "d"]), min_size=n, max_size=n))
    nodes = [node(f"v{i}", c=draw(st.floats(0.1, 3.0)), mem=mem[i], **({"colocation": grp[i]} if grp[i] else {}))
             for i in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=2 * n, unique=True)) if pairs else []
    edges = [edge(f"v{i}", f"v{j}", b=draw(st.integers(1, 2000))) for i, j in chosen]
    devices = draw(st.lists(st.integers(10, 90), min_size=2, max_size=3))
    R = draw(st.integers(0, n))
    M = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0, 3.0]))  # 0 = default, <= 1 fraction, > 1 bytes
    return build("h", nodes, edges), devices, R, M


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_flat_feasible_implies_coarse_feasible(inst):
    g, device_mems, R, M = inst
    cl = cluster_of(device_mems)
    cg = cpd(g, cl, R=R, M=M)
    flat = units(g)
    coarse = units(cg)
    # structure: every coarse unit is one original unit or within the packing bound
    flat_sets = {ids for _, ids in flat}
    bound = packing_bound(g, cl)
    limit = bound if bound is not None else max(device_mems)
    for m, ids in coarse:
        assert ids in flat_sets or m <= limit, (m, sorted(ids), limit)
    # the statement: flat packs => coarse packs
    if packs([m for m, _ in flat], device_mems):
        assert packs([m for m, _ in coarse], device_mems)


def test_union_of_groups_beyond_every_device_is_split():
    """The issue's case: clusters holding members of two groups each chain
    groups A, B and C into one coarse unit of 30 B, heavier than either
    device (25 B), while the graph fits (A + B on one device, C on the
    other).  The unit is split back into its groups."""
    names = [("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C"), ("b2", "B"), ("c2", "C")]
    nodes = [node(i, mem=5, colocation=grp) for i, grp in names]
    g = build("u", nodes, [edge(a, b) for (a, _), (b, _) in zip(names, names[1:])])
    cl = cluster_of([25, 25])
    assert packing_bound(g, cl) == 10
    cg = cpd(g, cl, R=2, M=100.0)  # the DP makes {a1, b1}, {a2, c1}, {b2, c2}
    assert cg.meta["cpd"]["split_units"] == 1
    assert sorted(m for m, _ in units(cg)) == [10, 10, 10]
    assert packs([m for m, _ in units(cg)], [25, 25])


def test_exact_fit_keeps_nodes_with_memory_apart():
    """A graph that fills the devices exactly (148 B on 59 + 89 B) packs
    only one way; the packing bound is 0, so only nodes without memory are
    merged (found by the property test: merging the 1 B and 2 B nodes made
    it unplaceable)."""
    mems = [0, 0, 1, 2, 29, 29, 29, 29, 29]
    g = build("exact", [node(f"v{i}", mem=m) for i, m in enumerate(mems)], [])
    cl = cluster_of([59, 89])
    assert packing_bound(g, cl) == 0
    cg = cpd(g, cl, R=9, M=1.0)
    assert sorted(m for m, _ in units(cg)) == [0, 1, 2, 29, 29, 29, 29, 29]
    assert packs([m for m, _ in units(cg)], [59, 89])
