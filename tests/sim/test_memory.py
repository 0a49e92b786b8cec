"""The judge's memory rules (docs/design.md, simulator item 5): hand-computed
peaks on tiny graphs where the time and static rules differ, the static rule
reproducing the per-device sums, a graph that declares nothing judged
statically, and invariants against a brute-force count on random graphs."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.model.io import load_graph
from celeritas_cli.model.jsonio import validate
from celeritas_cli.model.placement import Placement
from celeritas_cli.model.residency import resident_list
from celeritas_cli.optimize.evaluator import Evaluator
from celeritas_cli.sim.memory import TIMELINE_POINTS, judge_memory, peaks, pool
from celeritas_cli.sim.simulator import run_schedule, simulate

from ..conftest import SAMPLES, edge, node


def sim(g, c, assign: dict, memory="time"):
    return simulate(g, c, Placement(g.name, c.name, "given", assign), memory=memory)


def dev(report, i):
    return report["devices"][i]


@pytest.fixture
def chain():
    """a (10 B resident + 4 B activation) -> b (5) -> c (6), 1 s each, on one device."""
    return build("chain", [node("a", 1, 14, resident_bytes=10), node("b", 1, 5, resident_bytes=0),
                           node("c", 1, 6, resident_bytes=0)], [edge("a", "b"), edge("b", "c")])


def test_a_chain_whose_activations_die_early(chain):
    # a's activation lives until b finishes (t=2), b's until c finishes (t=3):
    # t=0: 10+4 = 14; t=1: +5 = 19; t=2: a's 4 freed, c's 6 added = 21; t=3: the resident 10
    c = uniform(2, memory=22, bandwidth=100.0, latency=0.0)
    r = sim(chain, c, {"a": "gpu0", "b": "gpu0", "c": "gpu0"})
    d0 = dev(r, 0)
    assert (d0["memory_bytes"], d0["peak_at_s"], d0["static_memory_bytes"]) == (21, 2.0, 25)
    assert r["memory_rule"] == "time" and r["memory_rule_note"] is None and r["status"] == "OK"
    assert d0["peak_live"] == [{"node": "a", "bytes": 10, "kind": "resident"},
                               {"node": "c", "bytes": 6, "kind": "activation"},
                               {"node": "b", "bytes": 5, "kind": "activation"}]
    assert r["memory_timeline"]["gpu0"] == [[0.0, 14], [1.0, 19], [2.0, 21], [3.0, 10]]
    assert d0["idle_s"] == 0.0 and dev(r, 1)["idle_s"] == 3.0
    # the seed papers' rule charges all 25 bytes for the whole step: OOM on a 22-byte device
    s = sim(chain, c, {"a": "gpu0", "b": "gpu0", "c": "gpu0"}, memory="static")
    assert s["status"] == "OOM" and dev(s, 0)["memory_bytes"] == 25 and s["memory_rule"] == "static"
    assert s["makespan_s"] == r["makespan_s"] == 3.0


def test_a_received_tensor_counts_from_its_transfer_until_its_last_consumer():
    # a on gpu0 [0,1]; its 100 B cross in [1,2]; b on gpu1 [2,3]: gpu1 holds 100 B from 1 and b's 5 from 2
    g = build("rx", [node("a", 1, 0, resident_bytes=0), node("b", 1, 5, resident_bytes=0)], [edge("a", "b")])
    c = uniform(2, memory=50, bandwidth=100.0, latency=0.0)
    r = sim(g, c, {"a": "gpu0", "b": "gpu1"})
    d1 = dev(r, 1)
    assert (d1["memory_bytes"], d1["peak_at_s"], d1["static_memory_bytes"]) == (105, 2.0, 5)
    assert d1["peak_live"] == [{"node": "a", "bytes": 100, "kind": "received", "tensor": "a->b#0"},
                               {"node": "b", "bytes": 5, "kind": "activation"}]
    assert r["memory_timeline"]["gpu1"] == [[0.0, 0], [1.0, 100], [2.0, 105], [3.0, 0]]
    # over the static sum by the received bytes: OOM under time, OK under static
    assert r["status"] == "OOM" and r["oom_devices"] == ["gpu1"]
    assert sim(g, c, {"a": "gpu0", "b": "gpu1"}, memory="static")["status"] == "OK"


def test_an_activation_waits_for_its_transfer_to_another_device():
    # gpu0: a [0,1], c [1,2], d [2,3], e [3,4]; a's 300 B go to b on gpu1 in [1,4], so a's activation (50)
    # lives until 4, not until its local consumer c finishes (2).  c's 20 live until d ends (3), d's 30 until
    # e ends (4).  t=2: 50+20+30 = 100; t=3: c freed, e's 40 added: 50+30+40 = 120 (static: 140)
    g = build("wait", [node("a", 1, 50, resident_bytes=0), node("b", 1, 0, resident_bytes=0),
                       node("c", 1, 20, resident_bytes=0), node("d", 1, 30, resident_bytes=0),
                       node("e", 1, 40, resident_bytes=0)],
              [edge("a", "b", 300, tensor="o"), edge("a", "c", 300, tensor="o"), edge("c", "d"), edge("d", "e")])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    r = sim(g, c, {"a": "gpu0", "b": "gpu1", "c": "gpu0", "d": "gpu0", "e": "gpu0"})
    d0, d1 = dev(r, 0), dev(r, 1)
    assert (d0["memory_bytes"], d0["peak_at_s"], d0["static_memory_bytes"]) == (120, 3.0, 140)
    assert [x["node"] for x in d0["peak_live"]] == ["a", "e", "d"]
    assert r["memory_timeline"]["gpu0"] == [[0.0, 50], [1.0, 70], [2.0, 100], [3.0, 120], [4.0, 0]]
    # gpu1 holds the received 300 B from the transfer's start (1) until b finishes (5)
    assert (d1["memory_bytes"], d1["peak_at_s"]) == (300, 1.0)
    assert r["memory_timeline"]["gpu1"] == [[0.0, 0], [1.0, 300], [5.0, 0]]


def test_resident_state_counts_from_the_start_on_a_device_whose_nodes_run_late():
    # w runs at t=5 on gpu1, but its 1000 resident bytes are held for the whole step
    g = build("late", [node("a", 5, 0, resident_bytes=0), node("w", 1, 1000, resident_bytes=1000)],
              [edge("a", "w", 0)])
    c = uniform(2, memory=999, bandwidth=100.0, latency=0.0)
    r = sim(g, c, {"a": "gpu0", "w": "gpu1"})
    d1 = dev(r, 1)
    assert (d1["memory_bytes"], d1["peak_at_s"]) == (1000, 0.0)
    assert d1["peak_live"] == [{"node": "w", "bytes": 1000, "kind": "resident"}]
    assert r["memory_timeline"]["gpu1"] == [[0.0, 1000]]
    assert r["status"] == "OOM" and d1["idle_s"] == 5.0


def test_an_instant_long_activation_counts_at_its_instant():
    g = build("z", [node("a", 0.0, 7, resident_bytes=0)], [])
    c = uniform(1)
    r = sim(g, c, {"a": "gpu0"})
    assert (dev(r, 0)["memory_bytes"], dev(r, 0)["peak_at_s"]) == (7, 0.0)
    assert r["memory_timeline"]["gpu0"] == [[0.0, 7], [0.0, 0]]


def test_a_graph_that_declares_nothing_is_judged_by_the_static_rule(chain3, two_dev):
    r = sim(chain3, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu1"})
    assert r["memory_rule"] == "static" and "declares no resident_bytes" in r["memory_rule_note"]
    asked = sim(chain3, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu1"}, memory="static")
    assert asked["memory_rule"] == "static" and asked["memory_rule_note"] is None
    validate(r, "placer.report/v1", "report")


def test_unknown_rule_is_one_line(chain3, two_dev):
    with pytest.raises(InvalidInput, match="unknown memory rule 'peak'"):
        sim(chain3, two_dev, {"a": "gpu0", "b": "gpu0", "c": "gpu0"}, memory="peak")


@pytest.mark.parametrize("algo", ["m-topo", "heft", "random"])
def test_static_rule_reproduces_the_per_device_sums(algo):
    from celeritas_cli import registry

    g = load_graph(str(SAMPLES / "layered_300.json"))
    c = uniform(4, memory=80 * 2**20)  # tight: some placements overflow
    p = registry.place(g, c, algo, seed=1)
    dev_of, _ = p.resolve(g, c, "p")
    sums = g.memory_by(dev_of, c.k)
    s, t = simulate(g, c, p, memory="static"), simulate(g, c, p)
    assert [d["memory_bytes"] for d in s["devices"]] == sums == [d["static_memory_bytes"] for d in t["devices"]]
    assert s["oom_devices"] == [c.ids[d] for d in range(c.k) if sums[d] > c.devices[d].memory]
    assert s["makespan_s"] == t["makespan_s"] and t["memory_rule"] == "time"
    validate(t, "placer.report/v1", "report")


def test_the_search_judges_feasibility_by_the_judges_rule(chain):
    c = uniform(1, memory=22)
    assert Evaluator(chain, c).evaluate([0, 0, 0])[0].overflow == 0  # peak 21
    assert Evaluator(chain, c, memory="static").evaluate([0, 0, 0])[0].overflow == 3  # 25
    assert Evaluator(chain, uniform(1, memory=20)).evaluate([0, 0, 0])[0].overflow == 1
    # a received buffer: gpu1 peaks at 105 of 50 (static 5)
    g = build("rx", [node("a", 1, 0, resident_bytes=0), node("b", 1, 5, resident_bytes=0)], [edge("a", "b")])
    ev = Evaluator(g, uniform(2, memory=50, bandwidth=100.0, latency=0.0))
    assert ev.evaluate([0, 1])[0].overflow == 55 and ev.evaluate([0, 0])[0].overflow == 0


def test_timeline_is_max_pooled_so_the_peak_survives():
    g = layered(3000, seed=2)
    c = uniform(2)
    sched = run_schedule(g, c, [v % 2 for v in range(g.n)])
    prof = judge_memory(g, sched, 2)
    for d in range(2):
        assert len(prof.timeline[d]) <= TIMELINE_POINTS
        assert max(b for _, b in prof.timeline[d]) == prof.peak[d]
    assert pool([[0, 1], [1, 5], [2, 2], [3, 4]], 2) == [[0, 5], [2, 4]]


def brute_force_peaks(g, sched, k):
    """The time rule straight from its definition, at every instant something starts (O(V * (V + X)))."""
    res = resident_list(g)
    cons = g.tensor_consumers()
    spans = [[] for _ in range(k)]
    for v in range(g.n):
        d = sched.device_of[v]
        end = sched.finish[v]
        for t, p in enumerate(g.tensor_src):
            if p == v:
                end = max([end] + [sched.finish[x] for x in cons[t] if sched.device_of[x] == d])
        end = max([end] + [tr.end for tr in sched.transfers if g.tensor_src[tr.tensor] == v])
        if g.memory[v] - res[v] > 0:
            spans[d].append((sched.start[v], end, g.memory[v] - res[v]))
    for tr in sched.transfers:
        last = max(sched.finish[x] for x in cons[tr.tensor] if sched.device_of[x] == tr.dst_dev)
        spans[tr.dst_dev].append((tr.start, max(last, tr.end), tr.nbytes))
    out = []
    for d in range(k):
        base = sum(res[v] for v in range(g.n) if sched.device_of[v] == d)
        best = base
        for s0, _, _ in spans[d]:
            live = base + sum(b for s, e, b in spans[d] if s <= s0 and (e > s0 or e == s == s0))
            best = max(best, live)
        out.append(best)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 60), seed=st.integers(0, 10**6), k=st.integers(1, 4), data=st.data())
def test_peak_invariants_on_random_graphs_and_placements(n, seed, k, data):
    g = layered(n, seed=seed)
    dev_of = data.draw(st.lists(st.integers(0, k - 1), min_size=g.n, max_size=g.n))
    c = uniform(k, bandwidth=1e9, latency=1e-6)
    sched = run_schedule(g, c, dev_of)
    prof = judge_memory(g, sched, k)
    res = resident_list(g)
    received = [0] * k
    for tr in sched.transfers:
        received[tr.dst_dev] += tr.nbytes
    for d in range(k):
        on = [v for v in range(g.n) if dev_of[v] == d]
        base = sum(res[v] for v in on)
        largest = max((g.memory[v] - res[v] for v in on), default=0)
        # peak(time) <= static + received buffers; and it holds the resident state with any one activation
        assert base + largest <= prof.peak[d] <= prof.static[d] + received[d]
        assert max(b for _, b in prof.timeline[d]) == prof.peak[d]
    assert prof.peak == peaks(g, sched, k) == brute_force_peaks(g, sched, k)
    at = prof.peak_at
    assert all(0.0 <= t <= sched.makespan or math.isclose(t, sched.makespan) for t in at)
