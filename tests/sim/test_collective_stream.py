"""Rule 6 of the simulator: collectives on their own stream (hand-computed schedules)."""

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.sim.simulator import run_schedule


def _coll(nid, group, seq, ranks=2, nbytes=100, kind="all-reduce"):
    return {"id": nid, "op": f"collective.{kind}", "compute_s": 0.0, "memory_bytes": 0,
            "collective": {"kind": kind, "group": group, "seq": seq, "bytes": nbytes, "ranks": ranks}}


def _node(nid, t):
    return {"id": nid, "compute_s": t, "memory_bytes": 0}


def _times(g, s):
    return {g.ids[v]: (s.start[v], s.finish[v]) for v in range(g.n)}


# 2 devices, bandwidth 100 B/s, no latency: a 2-rank all-reduce of 100 B is 2 * 1/2 * 100 / 100 = 1 s
C2 = uniform(2, bandwidth=100.0, latency=0.0)


def test_group_starts_when_the_last_member_is_ready_and_does_not_hold_the_compute_slot():
    g = build("t", [_node("a0", 1), _node("a1", 3), _coll("c0", "g", 0), _coll("c1", "g", 0), _node("b0", 1),
                    _node("x0", 0.5)],
              [{"src": "a0", "dst": "c0", "bytes": 100}, {"src": "a1", "dst": "c1", "bytes": 100},
               {"src": "c0", "dst": "b0", "bytes": 100}])
    # device 0: a0 [0,1], then its collective waits for a1 (device 1, until 3): [3, 4]; b0 [4, 5]
    # x0 (0.5 s) runs on device 0's compute slot while the collective waits: the stream does not hold it
    s = run_schedule(g, C2, [0, 1, 0, 1, 0, 0], order=[[0, 5, 2, 4], [1, 3]])
    t = _times(g, s)
    assert t["a0"] == (0.0, 1.0) and t["x0"] == (1.0, 1.5)
    assert t["c0"] == (3.0, 4.0) and t["c1"] == (3.0, 4.0)
    assert t["b0"] == (4.0, 5.0) and s.makespan == 5.0
    assert s.node_time[2][0] == 0.0  # a collective is no compute time on its device
    # the critical path goes through the late member's producer on the other device
    assert s.binding[2] == 1


def test_compute_overlaps_a_running_collective():
    g = build("t", [_node("a0", 1), _node("a1", 1), _coll("c0", "g", 0), _coll("c1", "g", 0), _node("x0", 0.75)],
              [{"src": "a0", "dst": "c0", "bytes": 100}, {"src": "a1", "dst": "c1", "bytes": 100},
               {"src": "a0", "dst": "x0", "bytes": 1}])
    s = run_schedule(g, C2, [0, 1, 0, 1, 0])
    t = _times(g, s)
    assert t["c0"] == (1.0, 2.0) and t["x0"] == (1.0, 1.75)
    assert s.makespan == 2.0


def test_a_stream_runs_its_collectives_in_the_order_they_are_issued():
    # "late" (seq 0) waits for a slow producer; "early" (seq 1) is issued at 0.5 s and goes first (DDP issues a
    # bucket when it is ready); at one instant seq decides
    g = build("t", [_node("s0", 4), _node("s1", 4), _coll("l0", "late", 0), _coll("l1", "late", 0),
                    _coll("e0", "early", 1), _coll("e1", "early", 1), _node("f0", 0.5), _node("f1", 0.5),
                    _coll("x0", "x", 3), _coll("x1", "x", 3), _coll("y0", "y", 2), _coll("y1", "y", 2)],
              [{"src": "s0", "dst": "l0", "bytes": 1}, {"src": "s1", "dst": "l1", "bytes": 1},
               {"src": "f0", "dst": "e0", "bytes": 1}, {"src": "f1", "dst": "e1", "bytes": 1},
               {"src": "l0", "dst": "x0", "bytes": 1}, {"src": "l1", "dst": "x1", "bytes": 1},
               {"src": "l0", "dst": "y0", "bytes": 1}, {"src": "l1", "dst": "y1", "bytes": 1}])
    s = run_schedule(g, C2, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1], order=[[6, 0], [7, 1]])
    t = _times(g, s)
    assert t["e0"] == t["e1"] == (0.5, 1.5)
    assert t["l0"] == (4.5, 5.5)
    assert t["y0"] == t["y1"] == (5.5, 6.5) and t["x0"] == (6.5, 7.5)  # issued together: seq 2 before 3


def test_group_duration_is_the_cost_models_formula_for_the_whole_group():
    c = uniform(4, bandwidth=100.0, latency=0.01)
    nodes = [_coll(f"c{i}", "g", 0, ranks=4, nbytes=400) for i in range(4)]
    g = build("t", nodes, [])
    s = run_schedule(g, c, [0, 1, 2, 3])
    # ring all-reduce over 4 ranks: 2 * 3/4 * 400 / 100 + 2 * 3 * 0.01
    assert s.makespan == pytest.approx(6.0 + 0.06, rel=1e-12)
    # a reduced graph holding one rank of a 4-rank group costs the whole group's collective
    g1 = build("t1", [_coll("c0", "g", 0, ranks=4, nbytes=400)], [])
    s1 = run_schedule(g1, c, [0], groups={"g": [0, 1, 2, 3]})
    assert s1.makespan == s.makespan


def test_bad_collectives_are_refused():
    g = build("t", [_coll("c0", "g", 0), _coll("c1", "g", 1)], [])
    with pytest.raises(InvalidInput, match="disagrees"):
        run_schedule(g, C2, [0, 1])
    g = build("t", [_coll("c0", "g", 0, ranks=3), _coll("c1", "g", 0, ranks=3)], [])
    with pytest.raises(InvalidInput, match="has 2 ranks"):
        run_schedule(g, C2, [0, 1])


def test_ranks_that_issue_in_different_orders_hang_said_in_one_line():
    # rank 0 issues X (at 0) before Y (at 1); rank 1 issues Y (at 0) before X (at 1): each waits for the other
    g = build("t", [_coll("x0", "X", 0), _coll("x1", "X", 0), _coll("y0", "Y", 1), _coll("y1", "Y", 1),
                    _node("a0", 1), _node("a1", 1)],
              [{"src": "a0", "dst": "y0", "bytes": 1}, {"src": "a1", "dst": "x1", "bytes": 1}])
    with pytest.raises(InvalidInput, match="issued it in another order") as err:
        run_schedule(g, C2, [0, 1, 0, 1, 0, 1])
    assert "\n" not in str(err.value)


def test_ranks_on_one_device_reduce_there_and_take_its_stream_once():
    # 3 ranks, two of them on device 0: the collective runs over the 2 distinct devices (1 s, as above)
    g = build("t", [_coll(f"c{i}", "g", 0, ranks=3) for i in range(3)] + [_coll(f"d{i}", "h", 1, ranks=3)
                                                                      for i in range(3)], [])
    s = run_schedule(g, C2, [0, 0, 1, 0, 0, 1])
    t = _times(g, s)
    assert t["c0"] == t["c1"] == t["c2"] == (0.0, 1.0)
    assert t["d0"] == t["d2"] == (1.0, 2.0)
