"""The issue's headline check (issue 22, "Done when"): the zoo Transformer
as a 4-stage pipeline on moirai-intra-server (2xV100-32GB + 2xP100-16GB),
16 micro-batches, stages a contiguous cut of the CPD-TOPO order balanced by
time: 1F1B simulates at <= 2.10 s (and its GPipe twin too), and the
per-stage peaks match the hand count of activations in flight."""

from __future__ import annotations

import pytest

from celeritas_cli.model.graph import Graph
from celeritas_cli.model.io import bundled_cluster, load_graph
from celeritas_cli.pipelining.cuts import balanced_stages
from celeritas_cli.pipelining.builder import staged_plan
from celeritas_cli.pipelining.schedules import hand_peak_bytes, stage_memory
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.split_cost import batch_profile

from ..conftest import SAMPLES
from .time_rule import peaks

#: two pipelines of the zoo transformer (seconds); the same checks on small chains, in the default suite:
#: test_pipeline_schedule.py (hand-computed makespans, hand count of activations, 1F1B holds less than GPipe)
pytestmark = pytest.mark.slow

DEVICES = ["A", "B", "C", "D"]  # stages 2xV100 | 2xP100
M = 16


def declaring(g: Graph) -> Graph:
    """*g* with ``resident_bytes`` (until the zoo graphs carry it, WP "llm"): parameters, buffers and
    optimizer state are resident, a kept gradient is an activation."""
    if any("resident_bytes" in (x or {}) for x in g.node_extra):
        return g
    prof = batch_profile(g)
    doc = g.to_dict()
    for v, nd in enumerate(doc["nodes"]):
        grads = sum(g.tensor_bytes[t] for t in prof.gradient_out[v])
        nd["resident_bytes"] = g.memory[v] if prof.update[v] else prof.fixed_memory[v] - min(prof.fixed_memory[v],
                                                                                           grads)
    return Graph.from_dict(doc)


@pytest.fixture(scope="module")
def runs():
    g = declaring(load_graph(SAMPLES / "zoo" / "transformer.json.gz"))
    c = bundled_cluster("moirai-intra-server")
    st = balanced_stages(g, c, DEVICES)
    out = {}
    for schedule in ("1f1b", "gpipe"):
        p = staged_plan(g, c, st.stage_of, DEVICES, M, schedule)
        p.split_graph = None  # simulate rebuilds it from the recipe either way
        got: list = []
        report = simulate(g, c, p, schedule_out=got)
        sched = got[0]
        mem = stage_memory(sched.graph, g, st.stage_of, sched.device_of, 4)
        hand = [hand_peak_bytes(schedule, 4, M, r, [max(mem[r].activation)], mem[r].resident, mem[r].gradients)
                for r in range(4)]
        out[schedule] = (report, hand, peaks(sched.graph, sched, 4))
    return out


def test_transformer_4_stage_pipelines_simulate_under_2_10_s(runs):
    one, gpipe = runs["1f1b"][0]["makespan_s"], runs["gpipe"][0]["makespan_s"]
    assert one <= 2.10 and gpipe <= 2.10
    assert one < gpipe  # the stages' forward and backward are not equally heavy: 1F1B overlaps them better


def test_transformer_peaks_match_the_hand_count_and_1f1b_holds_less(runs):
    for schedule in ("1f1b", "gpipe"):
        _, hand, oracle = runs[schedule]
        for h, o in zip(hand, oracle):
            assert abs(o - h) <= 0.1 * h, (schedule, hand, oracle)
    assert all(a < b for a, b in zip(runs["1f1b"][2], runs["gpipe"][2]))
    assert max(runs["1f1b"][2][2:]) < 16 * 2**30  # 1F1B's stages fit the 16 GB P100s


def test_transformer_judge_peaks_match_the_hand_count(runs):
    for schedule in ("1f1b", "gpipe"):
        report, hand, _ = runs[schedule]
        assert report["memory_rule"] == "time"
        for d, h in zip(report["devices"], hand):
            assert abs(d["memory_bytes"] - h) <= 0.1 * h, (schedule, d["id"], d["memory_bytes"], h)
    assert runs["1f1b"][0]["status"] == "OK"
    assert all(a["memory_bytes"] < b["memory_bytes"] for a, b in zip(runs["1f1b"][0]["devices"],
                                                                      runs["gpipe"][0]["devices"]))
