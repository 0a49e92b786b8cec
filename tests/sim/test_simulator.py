"""Hand-computed makespans for the simulator (docs/design.md semantics)."""

from __future__ import annotations

import pytest

from celeritas_cli.errors import ColocationError, InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import lower_bound, run_schedule, simulate

from ..conftest import edge, node


def P(graph, cluster, assign, order=None):
    return Placement(graph.name, cluster.name, "given", assign, order=order)


def test_empty_graph():
    g = build("empty", [], [])
    r = simulate(g, uniform(2), P(g, uniform(2), {}))
    assert r["makespan_s"] == 0.0 and r["status"] == "OK"


def test_single_node_speed():
    g = build("one", [node("a", 4.0)], [])
    c = uniform(2, speeds=[1.0, 2.0])
    assert simulate(g, c, P(g, c, {"a": "gpu1"}))["makespan_s"] == 2.0
    assert simulate(g, c, P(g, c, {"a": "gpu0"}))["makespan_s"] == 4.0


def test_chain_one_device(chain3, two_dev):
    r = simulate(chain3, two_dev, P(chain3, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu0"}))
    assert r["makespan_s"] == 6.0
    assert r["transfers"]["count"] == 0
    assert r["critical_path"] == ["a", "b", "c"]


def test_chain_split_pays_transfers(chain3, two_dev):
    # a on gpu0 [0,1], transfer 1 s -> b on gpu1 [2,4], transfer 1 s -> c on gpu0 [5,8]
    r = simulate(chain3, two_dev, P(chain3, two_dev, {"a": "gpu0", "b": "gpu1", "c": "gpu0"}))
    assert r["makespan_s"] == 8.0
    assert r["transfers"] == {"count": 2, "bytes": 200}
    assert {(ln["src"], ln["dst"]): ln["busy_s"] for ln in r["links"]} == {("gpu0", "gpu1"): 1.0,
                                                                           ("gpu1", "gpu0"): 1.0}


def test_latency_adds():
    g = build("ab", [node("a", 1), node("b", 1)], [edge("a", "b", 100)])
    c = uniform(2, bandwidth=100.0, latency=0.5)
    assert simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu1"}))["makespan_s"] == 3.5


def test_diamond_two_devices(diamond, two_dev):
    # a gpu0 [0,1]; b gpu0 [1,3]; c gpu1 waits for a's tensor: [1,2] transfer, c [2,5];
    # c->d transfer [5,6]; d on gpu0 [6,7]
    r = simulate(diamond, two_dev, P(diamond, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu1", "d": "gpu0"}))
    assert r["makespan_s"] == 7.0


def test_fork_join_three_devices(three_dev):
    g = build("fj", [node("s", 1), node("x", 4), node("y", 4), node("z", 4), node("t", 1)],
              [edge("s", "x", 100, tensor="o"), edge("s", "y", 100, tensor="o"), edge("s", "z", 100, tensor="o"),
               edge("x", "t"), edge("y", "t"), edge("z", "t")])
    assign = {"s": "gpu0", "x": "gpu0", "y": "gpu1", "z": "gpu2", "t": "gpu0"}
    # y,z start at 2 (transfer 1..2), end 6, transfers back 6..7 on separate channels; t at 7 -> 8
    assert simulate(g, three_dev, P(g, three_dev, assign))["makespan_s"] == 8.0
    # all on one device: 1 + 12 + 1
    one = {k: "gpu0" for k in assign}
    assert simulate(g, three_dev, P(g, three_dev, one))["makespan_s"] == 14.0


def test_congestion_channel_vs_none_vs_port():
    # two producers on gpu0 each send 100 B to a consumer on gpu1 at the same time
    g = build("cong", [node("a", 1), node("b", 1), node("c", 1)], [edge("a", "c"), edge("b", "c")])
    c = uniform(3, bandwidth=100.0, latency=0.0)
    g2 = build("cong2", [node("a", 1), node("b", 1), node("c", 1)], [edge("a", "c"), edge("b", "c")])
    assign = {"a": "gpu0", "b": "gpu1", "c": "gpu2"}
    # a on gpu0 [0,1], b on gpu1 [0,1]: different channels -> both arrive at 2, c [2,3]
    assert simulate(g, c, P(g, c, assign))["makespan_s"] == 3.0
    # port: both transfers need gpu2's single downlink -> second arrives at 3, c [3,4]
    assert simulate(g, c, P(g, c, assign), congestion="port")["makespan_s"] == 4.0
    # same channel: a and b both on gpu0 -> a [0,1], b [1,2]; transfers [1,2] and [2,3] serial; c [3,4]
    same = {"a": "gpu0", "b": "gpu0", "c": "gpu2"}
    assert simulate(g2, c, P(g2, c, same))["makespan_s"] == 4.0
    big = build("big", [node("a", 1), node("b", 0.0), node("c", 1)], [edge("a", "c", 300), edge("b", "c", 300)])
    both = {"a": "gpu0", "b": "gpu0", "c": "gpu1"}
    # ranks a 1 + 3 + 1 = 5, b 0 + 3 + 1 = 4: a [0, 1], b [1, 1]; 3 s transfers.
    # channel: [1, 4] then [4, 7], c [7, 8]; none: both [1, 4], c [4, 5]
    assert simulate(big, c, P(big, c, both))["makespan_s"] == 8.0
    assert simulate(big, c, P(big, c, both), congestion="none")["makespan_s"] == 5.0


def test_shared_tensor_sent_once_per_device():
    # a's single output feeds b and c, both on gpu1: one transfer
    g = build("share", [node("a", 1), node("b", 1), node("c", 1)],
              [edge("a", "b", 100, tensor="out"), edge("a", "c", 100, tensor="out")])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    r = simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu1", "c": "gpu1"}))
    assert r["transfers"]["count"] == 1
    assert r["makespan_s"] == 4.0  # a [0,1], transfer [1,2], b [2,3], c [3,4]
    # without the shared tensor id the two edges are two transfers on one channel
    g2 = build("noshare", [node("a", 1), node("b", 1), node("c", 1)], [edge("a", "b", 100), edge("a", "c", 100)])
    r2 = simulate(g2, c, P(g2, c, {"a": "gpu0", "b": "gpu1", "c": "gpu1"}))
    assert r2["transfers"]["count"] == 2
    assert r2["makespan_s"] == 4.0  # b [2,3]; second transfer [2,3], c [3,4]


def test_strict_order_forces_idle_time():
    # gpu0 must run x (waits for a transfer) before y (ready at once)
    g = build("ord", [node("a", 1), node("x", 1), node("y", 3)], [edge("a", "x", 100)])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    assign = {"a": "gpu1", "x": "gpu0", "y": "gpu0"}
    free = simulate(g, c, P(g, c, assign))["makespan_s"]
    strict = simulate(g, c, P(g, c, assign, order={"gpu0": ["x", "y"], "gpu1": ["a"]}))["makespan_s"]
    # rank order runs y [0,3] then x [3,4]; strict: idle until 2, x [2,3], y [3,6]
    assert free == 4.0
    assert strict == 6.0


def test_order_deadlock_is_reported():
    g = build("dl", [node("a", 1), node("b", 1)], [edge("a", "b")])
    c = uniform(1)
    with pytest.raises(InvalidInput, match="cannot be followed"):
        simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu0"}, order={"gpu0": ["b", "a"]}))


def test_order_must_list_assigned_nodes():
    g = build("o", [node("a", 1), node("b", 1)], [])
    c = uniform(2)
    with pytest.raises(InvalidInput, match="omits node 'b'"):
        simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu0"}, order={"gpu0": ["a"]}))
    with pytest.raises(InvalidInput, match="assigned to gpu0"):
        simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu0"}, order={"gpu1": ["a"], "gpu0": ["b"]}))


def test_heterogeneous_per_type_times():
    doc = {"schema": "placer.cluster/v1", "name": "het",
           "devices": [{"id": "v", "type": "V100", "memory_bytes": 10, "speed": 1.0},
                       {"id": "p", "type": "P100", "memory_bytes": 10, "speed": 0.5}],
           "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.0}}}
    c = Cluster.from_dict(doc)
    g = build("h", [node("a", 2.0, compute_by_type={"P100": 1.0}), node("b", 2.0)], [])
    r = simulate(g, c, P(g, c, {"a": "p", "b": "p"}))
    assert r["makespan_s"] == 5.0  # a: 1.0 by type, b: 2.0 / 0.5 = 4.0
    r = simulate(g, c, P(g, c, {"a": "v", "b": "v"}))
    assert r["makespan_s"] == 4.0


def test_directed_links_differ():
    doc = {"schema": "placer.cluster/v1", "name": "dir",
           "devices": [{"id": "x", "memory_bytes": 1}, {"id": "y", "memory_bytes": 1}],
           "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.0},
                     "pairs": [{"src": "y", "dst": "x", "bandwidth_Bps": 50.0}]}}
    c = Cluster.from_dict(doc)
    g = build("d", [node("a", 1), node("b", 1)], [edge("a", "b", 100)])
    assert simulate(g, c, P(g, c, {"a": "x", "b": "y"}))["makespan_s"] == 3.0
    assert simulate(g, c, P(g, c, {"a": "y", "b": "x"}))["makespan_s"] == 4.0


def test_multi_hop_via():
    doc = {"schema": "placer.cluster/v1", "name": "hop",
           "devices": [{"id": "a", "memory_bytes": 1}, {"id": "b", "memory_bytes": 1}, {"id": "c", "memory_bytes": 1}],
           "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.1},
                     "pairs": [{"src": "b", "dst": "c", "bandwidth_Bps": 50.0, "latency_s": 0.2},
                               {"src": "a", "dst": "c", "via": ["b"]}]}}
    c = Cluster.from_dict(doc)
    assert c.bandwidth[0][2] == 50.0
    assert c.latency[0][2] == pytest.approx(0.3)


def test_comm_override_by_pair():
    g = build("o", [node("a", 1), node("b", 1)], [edge("a", "b", 100, comm_s_by_pair={"gpu0->gpu1": 0.25})])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    assert simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu1"}))["makespan_s"] == 2.25
    assert simulate(g, c, P(g, c, {"a": "gpu1", "b": "gpu0"}))["makespan_s"] == 3.0


def test_oom_flagged_not_fatal():
    g = build("m", [node("a", 1, mem=60), node("b", 1, mem=60)], [])
    c = uniform(2, memory=100)
    r = simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu0"}))
    assert r["status"] == "OOM" and r["oom_devices"] == ["gpu0"]
    assert r["makespan_s"] == 2.0
    assert simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu1"}))["status"] == "OK"


def test_colocation_violation_invalid():
    g = build("co", [node("a", 1, colocation="w"), node("b", 1, colocation="w")], [])
    c = uniform(2)
    with pytest.raises(ColocationError, match="colocation group 'w'"):
        simulate(g, c, P(g, c, {"a": "gpu0", "b": "gpu1"}))


def test_placement_missing_or_inventing_nodes(chain3, two_dev):
    with pytest.raises(InvalidInput, match="node 'c' of graph 'chain3' has no device"):
        simulate(chain3, two_dev, P(chain3, two_dev, {"a": "gpu0", "b": "gpu0"}))
    with pytest.raises(InvalidInput, match="names node 'zz'"):
        simulate(chain3, two_dev, P(chain3, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu0", "zz": "gpu0"}))
    with pytest.raises(InvalidInput, match="unknown device 'gpu9'"):
        simulate(chain3, two_dev, P(chain3, two_dev, {"a": "gpu9", "b": "gpu0", "c": "gpu0"}))


def test_lower_bound(chain3, two_dev):
    assert lower_bound(chain3, two_dev) == 6.0  # critical path
    g = build("par", [node(f"n{i}", 1.0) for i in range(6)], [])
    assert lower_bound(g, uniform(3)) == 2.0  # work / devices
    assert lower_bound(g, uniform(2, speeds=[1.0, 2.0])) == 2.0  # 6 / (1 + 2)
    r = simulate(g, uniform(3), P(g, uniform(3), {f"n{i}": f"gpu{i % 3}" for i in range(6)}))
    assert r["makespan_s"] == 2.0 and r["makespan_over_lb"] == 1.0


def test_rank_order_prefers_longer_tail():
    # on one device both a and b are ready; b heads a long chain so it runs first
    g = build("r", [node("a", 1), node("b", 1), node("c", 5)], [edge("b", "c", 0)])
    c = uniform(1)
    s = run_schedule(g, c, [0, 0, 0])
    assert s.start[1] == 0.0 and s.device_order[0][0] == 1


def test_simultaneous_events_processed_before_dispatch():
    """gpu0 runs w [0, 1) first (rank 7 over y's 1).  At t=1 one event both
    frees gpu0 and makes x ready; x (rank 6: it feeds t, 5 s on gpu1) must
    win over y, which has waited since 0: x [1, 2), t [2, 7), y [2, 3): 7 s.
    Dispatching when gpu0 frees, before x is ready, would run y first and
    delay t to [3, 8); a ready queue in index order would too (y is listed
    first)."""
    g = build("t", [node("y", 1), node("w", 1), node("x", 1), node("t", 5)],
              [edge("w", "x", 0), edge("x", "t", 0)])
    s = run_schedule(g, uniform(2, bandwidth=1.0, latency=0.0), [0, 0, 0, 1])
    y, w, x, t = range(4)
    assert s.device_order == [[w, x, y], [t]]
    assert (s.start[x], s.start[t], s.start[y]) == (1.0, 2.0, 2.0)
    assert s.makespan == 7.0


def test_coarse_graph_placement_expands():
    from celeritas_cli.transform.contract import contract

    g = build("f", [node("a", 1), node("b", 2), node("c", 3)], [edge("a", "b"), edge("b", "c")])
    cg = contract(g, [0, 0, 1], method="test")
    assert cg.members[0] == ["a", "b"] and cg.compute[0] == 3.0
    c = uniform(2, bandwidth=100.0, latency=0.0)
    p = Placement.from_indices(cg, c, [0, 1], algorithm="x")
    assert p.assignment == {"a": "gpu0", "b": "gpu0", "c": "gpu1"}
    assert simulate(g, c, p)["makespan_s"] == simulate(cg, c, p)["makespan_s"] == 7.0
