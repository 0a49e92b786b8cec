"""`placer run --node-times` and what placer calibrate does with it, on real (tiny) runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import validate  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.profile.calibrate import calibrate  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.reference import reference_step  # noqa: E402
from celeritas_cli.run.resimulate import resimulate  # noqa: E402
from celeritas_cli.run.timing import section  # noqa: E402

from .test_run import MLP, mlp_split, run, run_ranks_in_threads, step_of  # noqa: E402


def test_local_node_times_add_up_to_the_busy_times_and_carry_the_simulation():
    c = uniform(2)
    rep = run(MLP, 2, mlp_split(), c, steps=1, node_times=True)
    validate(rep, "placer.run/v1", "report")
    nt = rep["node_times"]
    ids = step_of(MLP, 2).sm.ids
    assert sorted(n["id"] for n in nt["nodes"]) == sorted(ids) and nt["steps"] == 1 and nt["batch"] == 2
    for d in rep["devices"]:                # one timed step: the per-node rows and the device total are one clock
        mine = [n["measured_s"] for n in nt["nodes"] if n["device"] == d["id"]]
        assert sum(mine) == pytest.approx(d["measured_busy_s"], rel=1e-9, abs=1e-12)
    g = Graph.from_dict(step_of(MLP, 2).doc)
    costs = cost_model(g, c)
    for n in nt["nodes"]:                   # simulated_s is the simulator's time of the node on its device
        assert n["simulated_s"] == pytest.approx(costs.time[g.ids.index(n["id"])][c.index[n["device"]]])
        assert n["measured_s"] > 0 and n["start_s"] >= 0
    assert {(t["src"], t["dst"]) for t in nt["transfers"]} == {("gpu0", "gpu1"), ("gpu1", "gpu0")}
    assert all(t["seconds"] is not None and t["seconds"] >= 0 and t["exact_steps"] == 1 for t in nt["transfers"])
    assert sum(t["bytes"] for t in nt["transfers"]) == sum(ln["bytes"] for ln in rep["links"])
    p = Placement.from_dict(nt["placement"])
    assert p.assignment == mlp_split().assignment
    assert resimulate([rep], ["r"], g, c)[0]["after_s"] == pytest.approx(rep["simulated_step_s"])


def test_single_device_run_calibrates_to_its_measured_span():
    """One process, one timed step: every gap between nodes is dispatch overhead, so after
    calibration the simulated step is the measured span of the nodes, exactly."""
    c = uniform(2)
    ids = step_of(MLP, 2).sm.ids
    p = Placement("tinymlp_b2", c.name, "single", {nid: "gpu0" for nid in ids})
    rep = run(MLP, 2, p, c, steps=1, node_times=True)
    nodes = rep["node_times"]["nodes"]
    span = max(n["start_s"] + n["measured_s"] for n in nodes) - min(n["start_s"] for n in nodes)
    doc = step_of(MLP, 2).doc
    cal = calibrate(doc, c.to_dict(), [rep], labels=["r"])
    g = Graph.from_dict(cal.graph)
    assert cal.summary["nodes_fitted"] == len(ids)
    assert all(h == {"contention": 1.0, "nodes": 0} for h in cal.summary["hosts"].values())
    assert resimulate([rep], ["r"], g, c)[0]["after_s"] == pytest.approx(span, rel=1e-9)


def test_gloo_ranks_record_transfers_with_one_clock():
    pre = api.prepare(MLP, 2, mlp_split(), uniform(2), step=step_of(MLP, 2))
    ref = reference_step(pre.step)
    job_kw = {"node_times": True}
    m = run_ranks_in_threads(pre, ref, steps=2, **job_kw)
    info = {t.index: (pre.prog.tensor_name(t), t.src, t.dst, t.nbytes) for t in pre.prog.transfers}
    sec = section(m["timing"], node_id=lambda v, d: pre.step.sm.ids[v], device_id=lambda d: f"gpu{d}", batch=2,
                  transfers=info, sched=pre.sched, sim_graph=pre.sim_graph)
    assert sec["steps"] == 2 and sec["same_host"] and len(sec["nodes"]) == len(pre.step.sm.ids)
    assert len(sec["transfers"]) == len(pre.prog.transfers) == 3
    for t in sec["transfers"]:      # posted before received; exact or bounded in every step
        assert t["received_s"] >= t["sent_s"] and t["exact_steps"] + (t["bound_s"] is not None) >= 1
        assert t["simulated_s"] > 0


def test_section_by_hand():
    """Two ranks on one host; rank 1 starts its step 1 s later; a transfer posted at 2 s (rank 0's
    clock) that rank 1 waited for from 2.5 to 3.5 s took 1.5 s; in step 2 the wait took 10 us: it had
    arrived (gloo's works never say so themselves): a bound."""
    r0 = {"device": 0, "host": "h", "timing": [
        {"t_start": 100.0, "nodes": [(0, 0, 1.0, 1.0, 0.9)], "events": [("send", 0, 102.0)]},
        {"t_start": 200.0, "nodes": [(0, 0, 1.0, 1.0, 0.9)], "events": [("send", 0, 202.0)]}]}
    r1 = {"device": 1, "host": "h", "timing": [
        {"t_start": 101.0, "nodes": [(1, 1, 2.5, 2.0, 2.0)], "events": [("recv", 0, 102.5, 103.5, False)]},
        {"t_start": 201.0, "nodes": [(1, 1, 2.5, 2.0, 2.0)], "events": [("recv", 0, 203.0, 203.00001, False)]}]}
    sec = section([r0, r1], node_id=lambda v, d: "ab"[v], device_id=lambda d: f"d{d}", batch=4,
                  transfers={0: ("a:0", 0, 1, 8)})
    assert [(n["id"], n["start_s"], n["measured_s"], n["cpu_s"]) for n in sec["nodes"]] == [
        ("a", 1.0, 1.0, 0.9), ("b", 3.5, 2.0, 2.0)]
    t = sec["transfers"][0]
    assert (t["seconds"], t["exact_steps"], t["bound_s"], t["sent_s"]) == (1.5, 1, 1.0, 2.0)
    other = section([r0, {**r1, "host": "g"}], node_id=lambda v, d: "ab"[v], device_id=lambda d: f"d{d}",
                    batch=4, transfers={0: ("a:0", 0, 1, 8)})
    assert not other["same_host"] and other["transfers"][0]["seconds"] is None    # no common clock


@pytest.mark.slow
def test_data_parallel_buckets_run_as_simulated_and_are_timed():
    from celeritas_cli import registry

    from .test_run import CNN

    g = Graph.from_dict(step_of(CNN, 4).doc)
    p = registry.place(g, uniform(2), "data-parallel")
    rep = run(CNN, 4, p, uniform(2), backend="gloo", steps=2, timeout=300, node_times=True)
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0
    nt = rep["node_times"]
    assert nt["batch"] == 2 and {n["id"].rsplit("/rep", 1)[1] for n in nt["nodes"]} == {"0", "1"}
    ar = nt["allreduce"]
    assert [a["tensor"] for a in ar] == ["bucket0", "bucket0"] and ar[0]["bytes"] == ar[1]["bytes"] > 0
    assert all(a["exposed_s"] >= 0 for a in ar)
