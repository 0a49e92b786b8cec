"""PartialSchedule (celeritas_cli/sim/partial.py): the exact schedule of a
growing partial placement, checked by hand and against the simulator."""

from __future__ import annotations

import random

import pytest

from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.generate import layered_doc
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.scheduling.orders import cpd_topo
from celeritas_cli.sim.partial import PartialSchedule
from celeritas_cli.sim.simulator import run_schedule

from ..conftest import edge, node


def place(ps: PartialSchedule, v: int, d: int) -> None:
    ps.commit(v, d, *ps.est(v, d))


def test_overtaking_transfer_delays_the_queue_by_hand(two_dev):
    """r(1) -> x(2) -> y(0.5) and r -> z(0.5); r, x on gpu0, y and z on gpu1.

    Placed in the order r, x, y, z: x->y (100 B, 1 s) is queued on channel
    0->1 at [3, 4] and y runs [4, 4.5].  z's input r->z (300 B, 3 s) became
    ready at 1, before x->y: the simulator sends it first, [1, 4], which
    pushes x->y to [4, 5] and y to [5, 5.5]; z, after y on gpu1, runs
    [5.5, 6].
    """
    g = build("ot", [node("r", 1), node("x", 2), node("y", 0.5), node("z", 0.5)],
              [edge("r", "x", 0), edge("x", "y", 100), edge("r", "z", 300)])
    ps = PartialSchedule(g, two_dev, CostModel(g, two_dev))
    for v, d in ((0, 0), (1, 0), (2, 1)):
        place(ps, v, d)
    assert (ps.start[2], ps.fin[2]) == (4.0, 4.5)
    s, _pos, plan = ps.est(3, 1)
    assert [(ts, te, over) for _k, _a, ts, te, _dur, over in plan] == [(1.0, 4.0, True)]
    ps.commit(3, 1, s, _pos, plan)
    assert ps.retimes == 1
    assert (ps.start[2], ps.fin[2]) == (5.0, 5.5)
    assert (ps.start[3], ps.fin[3]) == (5.5, 6.0)
    assert ps.makespan == 6.0
    assert ps.order() == [[0, 1], [2, 3]]
    ps.check()
    assert run_schedule(g, two_dev, ps.dev, ps.order()).makespan == 6.0


def test_port_rule_queues_on_the_receivers_downlink():
    # a on gpu0 and b on gpu2 both send 100 B to c on gpu1: channels differ, the downlink is shared
    c3 = uniform(3, bandwidth=100.0, latency=0.0)
    g = build("dl", [node("a", 1), node("b", 1), node("c", 1)], [edge("a", "c"), edge("b", "c")])
    for rule, want in (("channel", 2.0), ("port", 3.0), ("none", 2.0)):
        ps = PartialSchedule(g, c3, CostModel(g, c3), rule)
        place(ps, 0, 0)
        place(ps, 1, 2)
        assert ps.est(2, 1)[0] == want, rule


def random_graph(seed: int) -> tuple[Graph, object]:
    rng = random.Random(seed)
    doc = layered_doc(rng.randint(5, 90), seed=seed, bytes_scale=rng.choice([0.3, 1, 3]))
    if rng.random() < 0.5:  # ties at one instant: zero-length nodes and transfers
        for nd in doc["nodes"]:
            nd["compute_s"] = rng.choice([0.0, 0.001, 0.002])
        size: dict = {}
        for e in doc["edges"]:
            e["bytes"] = size.setdefault((e["src"], e.get("tensor")), rng.choice([0, 1_000_000]))
    cl = uniform(rng.choice([2, 3]), bandwidth=rng.choice([1e8, 1e9]), latency=rng.choice([0.0, 1e-5]))
    return Graph.from_dict(doc), cl


@pytest.mark.parametrize("rule", ["channel", "port", "none"])
@pytest.mark.parametrize("seed", range(12))
def test_equals_the_simulator_after_every_commit(seed, rule):
    """Random devices (and sometimes the earliest one), in CPD-TOPO order:
    after every commit the times of every placed node and transfer are the
    simulator's; with a zero re-timing budget the delays are collected and
    one simulation makes it exact again."""
    g, cl = random_graph(seed)
    costs = CostModel(g, cl)
    rng = random.Random(seed)
    for lazy in (False, True):
        ps = PartialSchedule(g, cl, costs, rule, insertion=rng.random() < 0.8)
        if lazy:
            ps.work_budget = 0
        for v in cpd_topo(g, costs):
            d = rng.randrange(cl.k) if rng.random() < 0.7 else min(range(cl.k), key=lambda x: (ps.est(v, x)[0], x))
            place(ps, v, d)
            if not lazy:
                ps.check()
        ps.check()
        assert ps.makespan == run_schedule(g, cl, ps.dev, ps.order(), congestion=rule).makespan
