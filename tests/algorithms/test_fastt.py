"""FastT's DPOS and OS-DPOS (section 5, Algorithms 1-2), judged by the simulator."""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.placers.dpos import critical_path_by_rank, dpos, dpos_schedule
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel, upward_rank
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import makespan_of, simulate

from ..conftest import edge, node, training_model


@pytest.fixture
def gap_graph():
    """A(1) -> C(3) <- X(10, memory 100); D(2, memory 10) independent.

    CP = A -> C (A's edge to C is heavy in max-cost terms), on gpu0.  X fills
    gpu1's memory, so D fits only on gpu0, where C waits for X until t=10:
    D belongs in the idle slot [1, 10) on gpu0 instead of after C.
    """
    return build("gap", [node("A", 1), node("X", 10, 100), node("C", 3), node("D", 2, 10)],
                 [edge("A", "C", 20), edge("X", "C", 0)])


def test_dpos_inserts_into_idle_slot(gap_graph):
    cl = uniform(2, memory=100, bandwidth=1.0, latency=0.0)
    res = dpos_schedule(gap_graph, cl)
    ids = gap_graph.ids
    assert [ids[v] for v in res.critical_path] == ["A", "C"]
    assert [[ids[v] for v in seq] for seq in res.order] == [["A", "D", "C"], ["X"]]
    p = dpos(gap_graph, cl)
    assert p.order == {"gpu0": ["A", "D", "C"], "gpu1": ["X"]}
    rep = simulate(gap_graph, cl, p)
    assert rep["makespan_s"] == pytest.approx(13.0) == p.estimate["makespan_s"]
    assert rep["status"] == "OK" and p.estimate["status"] == "FEASIBLE"
    # appending only: D after C on gpu0 (gpu1 has no memory left): 15
    app = dpos_schedule(gap_graph, cl, insertion=False)
    assert makespan_of(gap_graph, cl, app.device_of, app.order) == pytest.approx(15.0)


def test_dpos_ranks_use_maximal_costs(gap_graph):
    cl = uniform(2, memory=100, bandwidth=1.0, latency=0.0, speeds=[1.0, 0.5])
    costs = CostModel(gap_graph, cl)
    rank = upward_rank(gap_graph, lambda v: costs.max_time[v], costs.max_comm)
    # A: max time 2 (speed 0.5) + 20 B at 1 B/s + rank(C) = 6
    assert rank[gap_graph.index["A"]] == pytest.approx(2 + 20 + 6)
    assert [gap_graph.ids[v] for v in critical_path_by_rank(gap_graph, rank)] == ["A", "C"]


def test_dpos_critical_path_device_is_fastest_on_average():
    g = build("chain", [node("a", 2), node("b", 2), node("c", 2)], [edge("a", "b", 1), edge("b", "c", 1)])
    cl = uniform(3, bandwidth=1.0, latency=0.0, speeds=[1.0, 2.0, 1.0])
    res = dpos_schedule(g, cl)
    assert res.cp_device == [1, 1, 1]
    assert simulate(g, cl, dpos(g, cl))["makespan_s"] == pytest.approx(3.0)


def test_dpos_critical_path_moves_on_when_device_is_full():
    g = build("chain", [node("a", 1, 60), node("b", 1, 60), node("c", 1, 60)],
              [edge("a", "b", 1), edge("b", "c", 1)])
    cl = uniform(2, memory=130, bandwidth=1.0, latency=0.0)
    res = dpos_schedule(g, cl)
    assert res.cp_device == [0, 0, 1] and not res.oom
    rep = simulate(g, cl, dpos(g, cl))
    assert rep["status"] == "OK" and rep["makespan_s"] == pytest.approx(4.0)


def test_dpos_reports_oom_when_nothing_fits():
    g = build("big", [node("a", 1, 500), node("b", 1, 10)], [edge("a", "b", 1)])
    p = dpos(g, uniform(2, memory=100))
    assert p.estimate["status"] == "OOM"


def test_dpos_on_layered_matches_its_estimate_without_congestion():
    g = layered(300, seed=2)
    cl = uniform(4)
    p = dpos(g, cl, congestion="none")
    rep = simulate(g, cl, p, congestion="none")  # raises on split colocation groups
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=1e-9)
    assert rep["status"] == "OK"
    assert simulate(g, cl, p)["makespan_s"] >= rep["makespan_s"] - 1e-12
    assert dpos(g, cl, congestion="none").to_dict() | {"placement_time_s": 0} == p.to_dict() | {"placement_time_s": 0}


def test_dpos_channel_model_beats_congestion_free_model_under_congestion():
    g = layered(300, seed=2)
    cl = uniform(4)
    free = simulate(g, cl, dpos(g, cl, congestion="none"))["makespan_s"]
    p = dpos(g, cl)
    rep = simulate(g, cl, p)
    assert rep["makespan_s"] < free
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=0.1)


def dominant_conv():
    """in(0.1) -> conv(10, splittable) -> out(0.1): one dominant operator."""
    return build("dom", [node("in", 0.1), node("conv", 10.0, splittable=["batch", "channel"]), node("out", 0.1)],
                 [edge("in", "conv", 1000, tensor="out"), edge("conv", "out", 1000, tensor="out")],
                 meta={"batch_size": 12})


def test_os_dpos_splits_dominant_conv_on_two_devices():
    g = dominant_conv()
    cl = uniform(2, bandwidth=1e6, latency=0.0)
    base = simulate(g, cl, dpos(g, cl))["makespan_s"]
    assert base == pytest.approx(10.2)
    p = registry.place(g, cl, "os-dpos", params={"start": "dag"})
    assert p.derived is not None and p.estimate["input"] == "dag"
    assert p.derivation == {"steps": [{"transform": "split", "node": "conv", "dim": "batch", "n": 2,
                                       "overhead_s": 2e-6}]}
    assert p.estimate["splits"] == [{"node": "conv", "dim": "batch", "n": 2}]
    split = p.derived
    assert {p.assignment["conv/part0"], p.assignment["conv/part1"]} == {"gpu0", "gpu1"}
    rep = simulate(g, cl, p)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    # 0.1 + copy + 500 B slice (0.5 ms) + 5 s + overhead + 0.5 ms back + copy + 0.1
    assert rep["makespan_s"] < 0.53 * base
    assert p.graph == "dom" and split.meta["split_from"] == "dom"


def test_os_dpos_keeps_the_unsplit_graph_when_splitting_does_not_pay():
    g = dominant_conv()
    cl = uniform(2, bandwidth=100.0, latency=0.0)  # a 500-byte slice takes 5 s
    p = registry.place(g, cl, "os-dpos", params={"start": "dag"})
    assert p.derived is None and p.derivation is None and p.estimate["splits"] == []
    assert simulate(g, cl, p)["makespan_s"] == pytest.approx(10.2)


def test_os_dpos_on_layered_never_worse_than_dpos():
    g = layered(120, seed=4)
    cl = uniform(4, bandwidth=1e11)  # cheap links so that splits can pay off
    d = simulate(g, cl, dpos(g, cl))["makespan_s"]
    p = registry.place(g, cl, "os-dpos", params={"max_ops": 3, "start": "dag"})
    rep = simulate(g, cl, p)
    assert rep["makespan_s"] <= d + 1e-12
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    if p.derived is not None:
        assert isinstance(p, Placement) and p.estimate["splits"]


def test_os_dpos_starts_from_the_data_parallel_graph_when_the_model_fits():
    """FastT 5.2: the input to Algorithm 2 is the data-parallel graph when the
    model fits one device, the DAG otherwise."""
    g = training_model()
    cl = uniform(4, bandwidth=1000.0, latency=0.0, memory=10_000)
    p = registry.place(g, cl, "os-dpos")
    assert p.estimate["input"] == "data-parallel"
    # the ring form: OS-DPOS re-places single nodes, which a collective's ranks cannot follow (rule 6)
    assert p.derivation["steps"][0] == {"transform": "data-parallel", "replicas": 4, "scaling": "strong",
                                        "overhead_s": 2e-6, "global_batch": 8, "collectives": "ring"}
    sg = p.derived
    assert {sg.node_extra[v]["origin"] for v in range(sg.n) if "origin" in (sg.node_extra[v] or {})} == set(g.ids)
    dp = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})  # the strategy it starts from
    ms = simulate(g, cl, p)["makespan_s"]
    assert ms == pytest.approx(p.estimate["makespan_s"])
    assert ms <= simulate(g, cl, dp)["makespan_s"] + 1e-12  # data parallelism is the starting strategy
    assert p.estimate["data_parallel_makespan_s"] == pytest.approx(dp.estimate["makespan_s"])
    # too large for one device (1100 B > 1000 B): the model's DAG
    small = uniform(4, bandwidth=1000.0, latency=0.0, memory=1000)
    q = registry.place(g, small, "os-dpos")
    assert q.estimate["input"] == "dag" and (q.derivation is None or q.derivation["steps"][0]["transform"] == "split")
    assert registry.place(g, small, "os-dpos", params={"start": "data-parallel"}).estimate["input"] == "data-parallel"


def test_os_dpos_best_start_keeps_the_faster_input():
    g = layered(60, seed=1)
    cl = uniform(4)
    runs = {s: simulate(g, cl, registry.place(g, cl, "os-dpos", params={"start": s, "max_ops": 2}))["makespan_s"]
            for s in ("dag", "data-parallel")}
    p = registry.place(g, cl, "os-dpos", params={"start": "best", "max_ops": 2})
    assert simulate(g, cl, p)["makespan_s"] == pytest.approx(min(runs.values()))
    assert p.estimate["inputs_tried"] == pytest.approx(runs)


def test_registered():
    names = registry.names()
    assert {"dpos", "os-dpos", "fd-dps", "data-parallel"} <= set(names)
    assert registry.get("os-dpos").quick_params


def random_layered_dag(n: int, ccr: float, seed: int, cluster) -> Graph:
    """A classic random layered DAG (Topcuoglu et al. 2002 style): layers of
    about sqrt(n) nodes, each node fed by 1-3 nodes of the two layers above,
    ~1 ms nodes, tensor sizes scaled to the target CCR (Celeritas Eq. 1)."""
    import math
    import random

    rng = random.Random(seed)
    width = max(1, round(math.sqrt(n)))
    layers, idx = [], 0
    while idx < n:
        w = min(n - idx, max(1, int(rng.uniform(0.5, 1.5) * width)))
        layers.append(list(range(idx, idx + w)))
        idx += w
    nodes = [node(f"n{i}", c=rng.uniform(0, 2e-3)) for i in range(n)]
    pairs = set()
    for li in range(1, len(layers)):
        for v in layers[li]:
            pairs.add((rng.choice(layers[li - 1]), v))
            for _ in range(rng.randint(0, 2)):
                pairs.add((rng.choice(layers[rng.randint(max(0, li - 2), li - 1)]), v))
    g = build("probe", nodes, [edge(f"n{a}", f"n{b}", 1) for a, b in sorted(pairs)])
    costs = CostModel(g, cluster)
    per_edge = ccr * sum(costs.mean_time) / g.m
    size = int((per_edge - cluster.latency[0][1]) * cluster.bandwidth[0][1])
    return build("probe", nodes, [edge(f"n{a}", f"n{b}", int(size * rng.uniform(0.5, 1.5))) for a, b in sorted(pairs)])


def test_dpos_versus_heft_depends_on_the_judges_congestion_rule():
    """Issue 18.8: "DPOS is 5-6x worse than HEFT on layered graphs with CCR
    30".  It is when the placements are judged without congestion while
    DPOS plans for the simulator's default channel rule (its default): it
    keeps work on the critical-path device to avoid queueing that the judge
    does not charge.  Planned for the rule it is judged by, DPOS is at least
    as good as HEFT: far better under ``channel`` (HEFT's contention-free
    plan saturates the links), equal under ``none``."""
    from celeritas_cli.model.io import load_cluster

    cl = load_cluster("4xV100-pcie")
    g = random_layered_dag(200, 30.0, 0, cl)
    assert CostModel(g, cl).ccr() == pytest.approx(30.0, rel=0.1)
    d_channel = registry.place(g, cl, "dpos")
    d_none = registry.place(g, cl, "dpos", params={"congestion": "none"})
    heft = registry.place(g, cl, "heft")

    def ms(p, rule):
        return simulate(g, cl, p, congestion=rule)["makespan_s"]

    assert ms(d_channel, "channel") < 0.8 * ms(heft, "channel")
    assert ms(d_channel, "none") > 1.3 * ms(heft, "none")  # the reported symptom: mismatched rules
    assert ms(d_none, "none") <= 1.02 * ms(heft, "none")
