"""The one link model (celeritas_cli/sim/links.py): hand-computed occupancy,
and the simulator's transfers checked against the rule independently."""

from __future__ import annotations

import random

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.sim.links import (
    CONGESTION_RULES,
    InputArrivals,
    LinkState,
    LinkTimeline,
    check_congestion,
    fifo_key,
)
from celeritas_cli.sim.simulator import run_schedule

from ..conftest import edge, node


def test_check_congestion_names_the_rules():
    assert check_congestion("none") == "none"
    with pytest.raises(InvalidInput, match="channel, port, none"):
        check_congestion("fifo")
    with pytest.raises(InvalidInput):
        LinkState(2, "both")


def test_channel_serialises_one_direction_only():
    ls = LinkState(3, "channel")
    assert ls.send(0, 1, 0.0, 2.0) == 0.0
    assert ls.send(0, 1, 1.0, 2.0) == 2.0      # waits for 0->1
    assert ls.send(1, 0, 1.0, 2.0) == 1.0      # the reverse channel is free
    assert ls.send(0, 2, 1.0, 2.0) == 1.0      # another channel from the same sender is free
    assert ls.start(0, 1, 0.0) == 4.0


def test_port_serialises_sender_uplink_and_receiver_downlink():
    ls = LinkState(3, "port")
    assert ls.send(0, 1, 0.0, 2.0) == 0.0
    assert ls.send(0, 2, 0.0, 2.0) == 2.0      # 0's uplink busy until 2
    assert ls.send(2, 1, 0.0, 1.0) == 2.0      # 1's downlink busy until 2
    assert ls.send(1, 0, 0.0, 1.0) == 0.0      # 1's uplink and 0's downlink are free
    assert ls.start(2, 0, 0.5) == 3.0          # 2's uplink until 3, 0's downlink until 1


def test_none_never_waits():
    ls = LinkState(2, "none")
    assert [ls.send(0, 1, 1.0, 5.0) for _ in range(3)] == [1.0, 1.0, 1.0]
    assert ls.resources(0, 1) == ()


def test_plan_is_tentative_until_committed():
    ls = LinkState(2, "channel")
    plan = ls.plan(1, [(0.0, 0, 1.0), (0.5, 0, 1.0)])
    assert [(s, e) for _, s, e in plan] == [(0.0, 1.0), (1.0, 2.0)]
    assert ls.start(0, 1, 0.0) == 0.0
    ls.commit(1, plan)
    assert ls.start(0, 1, 0.0) == 2.0


def test_integer_zero_keeps_integer_times():
    ls = LinkState(2, "port", zero=0)
    s = ls.send(0, 1, 0, 3)
    assert s == 0 and isinstance(s, int) and isinstance(ls.send(0, 1, 1, 2), int)


def test_link_timeline_keeps_fifo_order_and_detects_overtaking():
    tl = LinkTimeline(2, "channel")
    late = fifo_key(5.0, 7, 7, 1)
    tl.reserve(0, 1, late, 5.0, 6.0)
    early = fifo_key(1.0, 3, 3, 1)
    # ready at 1, 3 s long: it goes before the transfer ready at 5 and overlaps it
    assert tl.earliest(0, 1, early, 1.0) == 1.0
    assert tl.overtakes(0, 1, early, 1.0, 4.0) is False
    assert tl.overtakes(0, 1, early, 1.0, 5.5) is True
    # a transfer ready after the one at 5 queues behind it
    assert tl.earliest(0, 1, fifo_key(5.5, 8, 8, 1), 5.5) == 6.0
    # ties on ready time go by producer index
    assert tl.earliest(0, 1, fifo_key(5.0, 9, 9, 1), 5.0) == 6.0
    assert tl.earliest(0, 1, fifo_key(5.0, 2, 2, 1), 5.0) == 5.0
    tl.rebuild([(0, 1, early, 1.0, 2.0)])
    assert tl.earliest(0, 1, late, 5.0) == 5.0 and tl.keys[1] == [early]


def test_input_arrivals_queue_and_reuse_sent_tensors():
    # a, b on gpu0 feed c and d on gpu1; a's tensor is shared
    g = build("j", [node("a", 1), node("b", 2), node("c", 1), node("d", 1)],
              [edge("a", "c", tensor="o"), edge("a", "d", tensor="o"), edge("b", "c"), edge("b", "d", b=50)])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    ia = InputArrivals(g, CostModel(g, c), "channel")
    finish = [1.0, 2.0, 0.0, 0.0]
    dev = [0, 0, -1, -1]
    r, plan = ia.ready(2, 1, finish, dev)
    assert r == 3.0                              # a's tensor 1->2, b's tensor 2->3
    assert sorted((s, e) for _, _, s, e in plan) == [(1.0, 2.0), (2.0, 3.0)]
    ia.commit(1, plan)
    # d reuses a's tensor (already on gpu1 at 2) and queues b's second tensor behind it: 3 -> 3.5
    assert ia.ready(3, 1, finish, dev)[0] == 3.5
    assert ia.ready(3, 0, finish, dev)[0] == 2.0   # everything local on gpu0
    none = InputArrivals(g, CostModel(g, c), "none")
    assert none.ready(2, 1, finish, dev)[0] == 3.0  # max(1 + 1, 2 + 1)


@pytest.mark.parametrize("rule", CONGESTION_RULES)
@pytest.mark.parametrize("seed", range(3))
def test_simulator_transfers_obey_the_rule(rule, seed):
    """Independent check of the simulator's link use: each transfer starts
    at or after it is ready, one transfer per (tensor, destination), and no
    two transfers sharing a resource of the rule overlap; FIFO: on a shared
    resource, the one ready first (ties by producer, tensor) goes first."""
    rng = random.Random(seed)
    g = layered(80, seed=seed)
    c = uniform(3, bandwidth=2e8, latency=1e-5)
    dev = [rng.randrange(3) for _ in range(g.n)]
    for members in g.colocation_groups().values():
        for v in members[1:]:
            dev[v] = dev[members[0]]
    sched = run_schedule(g, c, dev, congestion=rule)
    keys = set()
    by_res: dict = {}
    for tr in sched.transfers:
        p = g.tensor_src[tr.tensor]
        assert tr.ready == sched.finish[p] and tr.start >= tr.ready
        assert (tr.tensor, tr.dst_dev) not in keys
        keys.add((tr.tensor, tr.dst_dev))
        res = {"channel": [("c", tr.src_dev, tr.dst_dev)], "port": [("u", tr.src_dev), ("d", tr.dst_dev)],
               "none": []}[rule]
        for r in res:
            by_res.setdefault(r, []).append(((tr.ready, p, tr.tensor, tr.dst_dev), tr.start, tr.end))
    for items in by_res.values():
        items.sort()
        for (_, s0, e0), (_, s1, _) in zip(items, items[1:]):
            assert s1 >= e0 - 1e-15 and s1 >= s0
    if rule != "none":
        assert by_res, "the placement should make some transfers"


def test_partial_placement_runs_only_placed_nodes(chain3, two_dev):
    # a on gpu0, b on gpu1, c not placed yet: a 0-1, transfer 1-2, b 2-4; no transfer for c
    s = run_schedule(chain3, two_dev, [0, 1, -1], [[0], [1]])
    assert s.makespan == 4.0 and len(s.transfers) == 1
    assert s.finish[2] != s.finish[2]  # NaN
