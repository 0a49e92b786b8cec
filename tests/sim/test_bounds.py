"""Lower bounds of the simulate report (issue 18.10): the classic bound
(critical path, work / devices) and the memory-cut bound, which adds the
communication that memory forces; both must stay below every simulated
makespan they claim to hold for."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import cost_model
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.bounds import edge_path_weights, lower_bounds, memory_cut_bound
from celeritas_cli.sim.simulator import lower_bound, run_schedule, simulate

from ..conftest import edge, node


def test_hand_computed_cut_bound_is_the_optimum():
    # a(1) -> b(2), 6 bytes each on 10-byte devices: they must be apart, so
    # every fitting placement pays the 1 s transfer: 1 + 1 + 2 = 4 (the
    # classic bound says max(3, 1.5) = 3)
    g = build("ab", [node("a", 1, mem=6), node("b", 2, mem=6)], [edge("a", "b", 100)])
    c = uniform(2, memory=10, bandwidth=100.0, latency=0.0)
    assert lower_bound(g, c) == 3.0
    assert memory_cut_bound(g, c) == (4.0, 0)
    p = Placement("ab", c.name, "given", {"a": "gpu0", "b": "gpu1"})
    rep = simulate(g, c, p)
    assert rep["makespan_s"] == 4.0 == rep["tight_lower_bound_s"]
    assert rep["tight_lower_bound_from"] == "memory_cut" and rep["makespan_over_tight_lb"] == 1.0
    assert [b["name"] for b in rep["lower_bounds"]] == ["path_and_work", "memory_cut"]
    assert rep["lower_bound_s"] == 3.0 and rep["makespan_over_lb"] == pytest.approx(4 / 3)
    # an OOM placement may beat it: the report then falls back to the classic bound
    oom = simulate(g, c, Placement("ab", c.name, "given", {"a": "gpu0", "b": "gpu0"}))
    assert oom["status"] == "OOM" and oom["makespan_s"] == 3.0
    assert oom["tight_lower_bound_s"] == 3.0 and oom["tight_lower_bound_from"] == "path_and_work"


def test_cut_bound_picks_the_heaviest_connected_overflow_and_respects_colocation():
    # chain a -> b -> c -> d; only {a,b,c,d} overflows (cap 25, 4 x 10): the
    # cheapest of the three edges sets the bound; colocation keeps b, c
    # together, so their edge can never be cut and does not count
    g = build("chain", [node("a", 1, mem=10), node("b", 1, mem=10, colocation="g"),
                        node("c", 1, mem=10, colocation="g"), node("d", 1, mem=10)],
              [edge("a", "b", 100), edge("b", "c", 1), edge("c", "d", 300)])
    c = uniform(2, memory=25, bandwidth=100.0, latency=0.0)
    w = edge_path_weights(g, cost_model(g, c))
    assert w == pytest.approx([4 + 1, 4 + 0.01, 4 + 3])
    bound, e = memory_cut_bound(g, c)
    # {b, c} start merged (20 B); d joins over c->d (30 B > 25): the bound is 7
    assert (bound, e) == (pytest.approx(7.0), 2)
    assert memory_cut_bound(g, uniform(2, memory=40)) == (0.0, None)  # fits on one device
    assert memory_cut_bound(g, uniform(2, memory=15)) == (0.0, None)  # the group fits nowhere


def _rand_graph(draw_edges, mems, times, nbytes):
    n = len(mems)
    nodes = [node(f"n{i}", times[i], mem=mems[i]) for i in range(n)]
    edges = [edge(f"n{i}", f"n{j}", nbytes[(i * 7 + j) % len(nbytes)]) for i, j in draw_edges]
    return build("r", nodes, edges)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 6), data=st.data())
def test_no_bound_exceeds_a_simulated_makespan_it_holds_for(n, data):
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = data.draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
    mems = data.draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    times = data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=n, max_size=n))
    nbytes = data.draw(st.lists(st.sampled_from([10, 50, 100, 400]), min_size=1, max_size=4))
    k = data.draw(st.integers(2, 3))
    cap = data.draw(st.integers(max(mems), max(sum(mems), max(mems)) + 1))
    speeds = data.draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=k, max_size=k))
    congestion = data.draw(st.sampled_from(["channel", "port", "none"]))
    g = _rand_graph(chosen, mems, times, nbytes)
    c = uniform(k, memory=cap, bandwidth=100.0, latency=0.01, speeds=speeds)
    costs = cost_model(g, c)
    bounds = {b["name"]: b["value_s"] for b in lower_bounds(g, c, costs)}
    for dev in itertools.product(range(k), repeat=n):
        loads = [sum(m for m, d in zip(mems, dev) if d == x) for x in range(k)]
        fits = all(ld <= cap for ld in loads)
        ms = run_schedule(g, c, dev, congestion=congestion, costs=costs).makespan
        assert bounds["path_and_work"] <= ms + 1e-9
        if fits:
            assert bounds.get("memory_cut", 0.0) <= ms + 1e-9, (dev, bounds, ms)


@pytest.mark.parametrize("step,words", [
    ({"transform": "microbatch", "m": 2, "global_batch": 8, "micro_batches": [4, 4], "overhead_s": 0.0},
     "2 micro-batches of 4 samples (global batch 8) of tm, gradients accumulated"),
    ({"transform": "fsdp", "replicas": 2, "stage": 3, "global_batch": 8, "overhead_s": 0.0},
     "sharded data parallelism (ZeRO stage 3, FSDP): 2 replicas of tm, each on 1/2 of the batch, "),
])
def test_bounds_of_a_derived_plan_name_its_steps(step, words):
    """Round 3, D10: a micro-batched or fsdp plan's bounds said they held for "the derived graph that
    was run (no steps)"; they name the recipe in the plan's words (sim/describe.py), and the bound
    holds for the plan's makespan."""
    from celeritas_cli.transform.derivation import derive

    from ..conftest import training_model

    g = training_model()
    c = uniform(2, bandwidth=100.0, latency=0.0)
    derived = derive(g, {"steps": [step]})
    assign = {derived.ids[v]: f"gpu{(derived.node_extra[v] or {}).get('replica', 0)}" for v in range(derived.n)}
    rep = simulate(g, c, Placement("tm", c.name, "given", assign, derivation={"steps": [step]}))
    first = rep["lower_bounds"][0]
    assert first["name"] == "path_and_work"
    assert first["holds_for"].startswith(f"every placement of the derived graph that was run ({words}")
    assert "no steps" not in first["holds_for"]
    assert first["value_s"] <= rep["makespan_s"]
    assert rep["lower_bounds"][-1]["name"] == "work_any_derivation"
    assert "micro-batches" in rep["lower_bounds"][-1]["holds_for"] and "fsdp" in rep["lower_bounds"][-1]["holds_for"]
