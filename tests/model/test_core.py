"""Loading and validation: every rejection is one line naming the file, the
node/field and the problem."""

from __future__ import annotations

import orjson
import pytest

from celeritas_cli.errors import CycleError, InvalidInput
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.costs import CostModel, upward_rank
from celeritas_cli.model.generate import layered, layered_doc
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.model.placement import Placement
from celeritas_cli.scheduling.timeline import Timeline

from ..conftest import CLUSTERS, SAMPLES, edge, node


def gdoc(nodes, edges, **kw):
    return {"schema": "placer.graph/v1", "name": "t", "nodes": nodes, "edges": edges, **kw}


def reject(doc, match, exc=InvalidInput):
    with pytest.raises(exc, match=match) as info:
        Graph.from_dict(doc, "g.json")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("g.json: ")
    return msg


def test_schema_tag_checked():
    reject({"schema": "placer.cluster/v1", "devices": [], "links": {}}, "is a placer.cluster/v1 document")
    reject({"nodes": []}, "field schema is None")
    reject([1, 2], "expected a JSON object")


def test_missing_and_bad_fields_name_the_node():
    reject(gdoc([{"id": "a", "memory_bytes": 0}], []), r"node 'a': missing field compute_s")
    reject(gdoc([node("a", -1.0)], []), r"node 'a' field compute_s: must be at least 0")
    reject(gdoc([node("a", 1.0, mem=-5)], []), r"node 'a' field memory_bytes")
    reject(gdoc([node("a", 1.0, mem=1.5)], []), r"node 'a' field memory_bytes: must be integer")
    reject(gdoc([node("a"), node("b")], [{"src": "a", "dst": "b", "bytes": -1}]), r"edge a->b \(#0\) field bytes")


def test_non_finite_numbers():
    reject(gdoc([node("a", float("nan"))], []), "node 'a' field compute_s: must be a finite number")
    reject(gdoc([node("a", float("inf"))], []), "node 'a' field compute_s: must be at most 1e12 s")
    reject(gdoc([node("a", 1.0, compute_by_type={"V100": float("inf")})], []), "compute_by_type.V100")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_literal_in_file_names_node_and_field(tmp_path, literal):
    f = tmp_path / "g.json"
    f.write_text('{"schema": "placer.graph/v1", "nodes": [{"id": "a", "compute_s": 1, "memory_bytes": 0},'
                 f'{{"id": "b", "compute_s": 1, "memory_bytes": 0, "compute_by_type": {{"V100": {literal}}}}}], '
                 '"edges": []}')
    with pytest.raises(InvalidInput, match=rf"g.json: node 'b' field compute_by_type.V100: {literal} is not a "
                                           rf"finite number"):
        load_graph(f)


def test_duplicates_unknown_endpoints_self_loops():
    reject(gdoc([node("a"), node("a")], []), "node 'a' is defined twice")
    reject(gdoc([node("a")], [edge("a", "zz")]), "unknown destination node 'zz'")
    reject(gdoc([node("a")], [edge("zz", "a")]), "unknown source node 'zz'")
    reject(gdoc([node("a")], [edge("a", "a")]), "self-loop on node 'a'")


def test_cycle_named():
    msg = reject(gdoc([node("a"), node("b"), node("c"), node("d")],
                      [edge("d", "a"), edge("a", "b"), edge("b", "c"), edge("c", "a")]),
                 "cycle", CycleError)
    assert "a -> b -> c -> a" in msg


def test_tensor_bytes_must_agree():
    reject(gdoc([node("a"), node("b"), node("c")],
                [edge("a", "b", 10, tensor="t"), edge("a", "c", 20, tensor="t")]), "tensor 't' of node 'a'")


def test_cluster_rejections():
    base = {"schema": "placer.cluster/v1", "devices": [{"id": "x", "memory_bytes": 1}],
            "links": {"default": {"bandwidth_Bps": 1.0}}}
    Cluster.from_dict(base)
    with pytest.raises(InvalidInput, match="device 'x' is defined twice"):
        Cluster.from_dict({**base, "devices": [{"id": "x", "memory_bytes": 1}] * 2}, "c.json")
    with pytest.raises(InvalidInput, match=r"c.json: link pair x->y field dst: unknown device 'y'"):
        Cluster.from_dict({**base, "links": {"default": {"bandwidth_Bps": 1.0},
                                             "pairs": [{"src": "x", "dst": "y", "bandwidth_Bps": 1.0}]}}, "c.json")
    with pytest.raises(InvalidInput, match="bandwidth_Bps"):
        Cluster.from_dict({**base, "links": {"default": {"bandwidth_Bps": 0}}}, "c.json")
    with pytest.raises(InvalidInput, match="missing field bandwidth_Bps"):
        Cluster.from_dict({**base, "links": {"default": {"latency_s": 0}}}, "c.json")


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(InvalidInput, match="nope.json: no such file"):
        load_graph(tmp_path / "nope.json")
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(InvalidInput, match="bad.json: not valid JSON"):
        load_graph(f)
    f.write_text("")
    with pytest.raises(InvalidInput, match="empty input"):
        load_graph(f)


def test_model_arrays_and_tensors():
    g = build("g", [node("a"), node("b"), node("c")],
              [edge("a", "b", 8, tensor="o"), edge("a", "c", 8, tensor="o"), edge("b", "c", 4)])
    assert g.succ == [[1, 2], [2], []] and g.pred == [[], [0], [0, 1]]
    assert g.edge_tensor == [0, 0, 1] and g.tensor_bytes == [8, 4]
    assert g.topo_order() == [0, 1, 2]
    again = Graph.from_dict(g.to_dict(), "rt")
    assert again.to_dict() == g.to_dict()


def test_round_trip_samples_and_clusters():
    for f in sorted(SAMPLES.glob("*.json")):
        g = load_graph(f)
        assert Graph.from_dict(orjson.loads(orjson.dumps(g.to_dict())), "rt").to_dict() == g.to_dict()
    names = {f.stem for f in CLUSTERS.glob("*.json")}
    assert {"4xV100-pcie", "moirai-inter-server", "moirai-intra-server"} <= names
    inter = load_cluster(CLUSTERS / "moirai-inter-server.json")
    a, b = inter.index["A"], inter.index["B"]
    assert inter.bandwidth[a][b] == pytest.approx(44.26e9 / 8) and inter.bandwidth[b][a] == pytest.approx(42.39e9 / 8)
    assert load_cluster(None).name == "4xV100-pcie"
    assert load_cluster("moirai-intra-server").k == 4


def test_generator_deterministic_and_exact_size():
    for n in (1, 2, 7, 50, 333):
        assert layered(n, seed=5).n == n
    assert layered_doc(200, seed=3) == layered_doc(200, seed=3)
    assert layered_doc(200, seed=3) != layered_doc(200, seed=4)
    g = layered(2000, seed=1)
    ccr = CostModel(g, load_cluster(None)).ccr()
    assert 10 <= ccr <= 60
    assert g.colocation_groups() and any(g.splittable)


def test_upward_rank_hand():
    g = build("d", [node("a", 1), node("b", 2), node("c", 3), node("d", 1)],
              [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d")])
    r = upward_rank(g, lambda v: g.compute[v], lambda e: 1.0)
    assert r == [1 + 1 + 3 + 1 + 1, 2 + 1 + 1, 3 + 1 + 1, 1]


def test_timeline_insertion():
    tl = Timeline(2)
    tl.reserve(0, 0.0, 1.0, "a")
    tl.reserve(0, 5.0, 6.0, "b")
    assert tl.earliest_start(0, 0.0, 4.0) == 1.0
    assert tl.earliest_start(0, 0.0, 4.5) == 6.0
    assert tl.earliest_start(0, 2.0, 4.0) == 6.0
    assert tl.earliest_start(0, 0.0, 4.0, insertion=False) == 6.0
    tl.reserve(0, 1.0, 5.0, "c")
    assert tl.order(0) == ["a", "c", "b"]
    assert tl.earliest_start(1, 3.0, 1.0) == 3.0


def test_placement_round_trip(chain3, two_dev):
    p = Placement.from_indices(chain3, two_dev, [0, 1, 0], algorithm="x", order=[[0, 2], [1]],
                               estimate={"makespan_s": 8.0})
    q = Placement.from_dict(p.to_dict())
    assert q.resolve(chain3, two_dev) == ([0, 1, 0], [[0, 2], [1]])


def test_cross_check_with_networkx():
    """Independent code path: networkx agrees on acyclicity, longest path and
    the quotient graphs coarse.is_acyclic judges."""
    import random

    import networkx as nx

    from celeritas_cli.transform.contract import is_acyclic

    g = layered(400, seed=9)
    G = nx.DiGraph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(zip(g.edge_src, g.edge_dst))
    assert nx.is_directed_acyclic_graph(G)
    pos = g.topo_index()
    assert all(pos[s] < pos[d] for s, d in G.edges)
    for v in G.nodes:
        G.nodes[v]["w"] = g.compute[v]
    # longest path with node weights = the simulator's critical-path bound on one fast device
    top = {}
    for v in nx.topological_sort(G):
        top[v] = max((top[p] for p in G.predecessors(v)), default=0.0) + g.compute[v]
    from celeritas_cli.sim.simulator import lower_bound

    assert lower_bound(g, uniform_cluster(1000)) == max(top.values())
    rng = random.Random(1)
    for _ in range(30):
        part = [rng.randrange(8) for _ in range(g.n)]
        Q = nx.quotient_graph(G, [{v for v in range(g.n) if part[v] == c} for c in sorted(set(part))])
        assert is_acyclic(g, [sorted(set(part)).index(p) for p in part]) == nx.is_directed_acyclic_graph(Q)


def uniform_cluster(k):
    from celeritas_cli.model.cluster import uniform

    return uniform(k)
