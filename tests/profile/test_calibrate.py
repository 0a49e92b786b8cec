"""`placer calibrate` without torch: hand-made `placer run --node-times` reports of a
three-node graph on two CPU processes, every fitted number computed by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.graph import Graph
from celeritas_cli.profile.calibrate import (
    calibrate,
    dispatch_gaps,
    fit_contention,
    fit_dispatch,
    fit_op_types,
)
from celeritas_cli.run.resimulate import kendall_tau, resimulate, summary
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.model.placement import Placement

GRAPH = {"schema": "placer.graph/v1", "name": "abc", "meta": {"batch_size": 4, "source": "test"},
         "nodes": [{"id": "a", "op": "aten.mm", "compute_s": 1.0, "memory_bytes": 0},
                   {"id": "b", "op": "aten.relu", "compute_s": 1.0, "memory_bytes": 0},
                   {"id": "c", "op": "aten.relu", "compute_s": 1.0, "memory_bytes": 0}],
         "edges": [{"src": "a", "dst": "b", "bytes": 1000, "tensor": "a:0"},
                   {"src": "a", "dst": "c", "bytes": 3000, "tensor": "a:1"}]}
CLUSTER = {"schema": "placer.cluster/v1", "name": "2cpu",
           "meta": {"comm_bench": {"processes": 2, "threads": 1}},
           "devices": [{"id": "cpu0", "type": "cpu", "memory_bytes": 10**9},
                       {"id": "cpu1", "type": "cpu", "memory_bytes": 10**9}],
           "links": {"default": {"bandwidth_Bps": 1.0e4, "latency_s": 0.0}}}


def node(nid, dev, start, t):
    return {"id": nid, "device": dev, "measured_s": t, "cpu_s": t, "start_s": start}


def report(nodes, *, transfers=(), batch=4, dp=False, placement=None, allreduce=()):
    nt = {"steps": 1, "batch": batch, "hosts": {"cpu0": "h", "cpu1": "h"}, "nodes": list(nodes),
          "transfers": list(transfers)}
    if allreduce:
        nt["allreduce"] = list(allreduce)
    if placement is not None:
        nt["placement"] = placement
    doc = {"schema": "placer.run/v1", "model": "m", "batch_size": batch * (2 if dp else 1), "backend": "gloo",
           "match": True, "loss_max_abs_diff": 0.0, "params_max_abs_diff": 0.0, "measured_step_s": 0.0,
           "simulated_step_s": 1.0, "measured_over_simulated": 0.0, "devices": [], "links": [], "node_times": nt}
    if dp:
        doc["data_parallel"] = {"replicas": 2, "scaling": "strong", "replica_batch": batch, "global_batch": 2 * batch}
    return doc


SPLIT = {"schema": "placer.placement/v1", "graph": "abc", "cluster": "2cpu", "algorithm": "hand",
         "assignment": {"a": "cpu0", "b": "cpu1", "c": "cpu1"}}

#: one process: a, b and c back to back on cpu0
ALONE = report([node("a", "cpu0", 0.0, 1.0), node("b", "cpu0", 1.0, 2.0), node("c", "cpu0", 3.0, 1.0)])
#: the same with 0.5 s between the nodes in all: a dispatch gap of 0.5 / 3 per node
GAP = 0.5 / 3
GAPPY = report([node("a", "cpu0", 0.0, 1.0), node("b", "cpu0", 1.2, 2.0), node("c", "cpu0", 3.5, 1.0)])
#: two processes, every node 1.2x its time alone: a on cpu0, b and c on cpu1 (which waits 1.9 s for a:0
#: before b: outside its nodes' span); transfers of 1000 and 3000 bytes in 0.5 s and 0.7 s: latency
#: 0.4 s, bandwidth 1e4 B/s
CROWDED = report([node("a", "cpu0", 0.0, 1.2), node("b", "cpu1", 1.9, 2.4), node("c", "cpu1", 4.3, 1.2)],
                 transfers=[{"tensor": "a:0", "src": "cpu0", "dst": "cpu1", "bytes": 1000, "seconds": 0.5,
                             "waited_s": 1.9, "received_s": 1.9, "exact_steps": 1},
                            {"tensor": "a:1", "src": "cpu0", "dst": "cpu1", "bytes": 3000, "seconds": 0.7,
                             "waited_s": 0.0, "received_s": 4.3, "exact_steps": 1}],
                 placement=SPLIT)
#: data parallelism: batch 2 per replica, a at 0.6 s, b at 1.3 s, c at 0.5 s alone (1.2x crowded)
DP = report([node(f"{x}/rep{r}", f"cpu{r}", s, 1.2 * t) for r in (0, 1)
             for x, s, t in (("a", 0.0, 0.6), ("b", 1.2 * 0.6, 1.3), ("c", 1.2 * 1.9, 0.5))],
            batch=2, dp=True)


def test_dispatch_gap_is_the_span_not_spent_in_nodes_or_waits():
    assert dispatch_gaps(GAPPY["node_times"]) == {"cpu0": pytest.approx(GAP)}
    assert dispatch_gaps(CROWDED["node_times"]) == {"cpu0": 0.0, "cpu1": pytest.approx(0.0, abs=1e-12)}
    waited = json.loads(json.dumps(CROWDED["node_times"]))
    waited["nodes"][2]["start_s"] += 0.3                    # c starts 0.3 s later: waiting for a:1 ...
    waited["transfers"][1].update(waited_s=0.3, received_s=4.6)
    assert dispatch_gaps(waited)["cpu1"] == pytest.approx(0.0, abs=1e-12)
    waited["transfers"][1].update(waited_s=0.1, received_s=4.4)     # ... or 0.2 s of it dispatching
    assert dispatch_gaps(waited)["cpu1"] == pytest.approx(0.1)


def test_fit_by_hand():
    cal = calibrate(GRAPH, CLUSTER, [ALONE, CROWDED, DP], labels=["alone", "crowded", "dp"])
    s = cal.summary
    assert s["hosts"] == {"h": {"contention": pytest.approx(1.2), "nodes": 3}}
    nodes = {n["id"]: n for n in cal.graph["nodes"]}
    want = {"a": 1.0, "b": 2.0, "c": 1.0}
    for nid, t in want.items():                              # alone samples, crowded ones / 1.2: the same
        assert nodes[nid]["compute_s"] == pytest.approx(t)
        assert nodes[nid]["compute_by_type"]["cpu"] == pytest.approx(t)
    assert s["node_error"]["median"] == pytest.approx(0.0, abs=1e-9)
    # batch lines through (2, replica time) and (4, the time at the graph's batch)
    for nid, t2 in (("a", 0.6), ("b", 1.3), ("c", 0.5)):
        a, b = nodes[nid]["batch_line"]["compute_s"]
        assert nodes[nid]["batch_line"]["batch"] == 4
        assert a + 2 * b == pytest.approx(t2, rel=1e-9) and a + 4 * b == pytest.approx(want[nid], rel=1e-9)
    assert s["batch_lines"] == 3 and s["nodes_unmeasured"] == 0
    assert s["links"]["cpu0->cpu1"]["latency_s"] == pytest.approx(0.4)
    assert s["links"]["cpu0->cpu1"]["bandwidth_Bps"] == pytest.approx(1.0e4)
    pair = [p for p in cal.cluster["links"]["pairs"] if (p["src"], p["dst"]) == ("cpu0", "cpu1")]
    assert pair == [{"src": "cpu0", "dst": "cpu1", "bandwidth_Bps": pytest.approx(1e4),
                     "latency_s": pytest.approx(0.4)}]
    assert cal.cluster["hosts"] == [{"name": "h", "devices": ["cpu0", "cpu1"], "contention": pytest.approx(1.2)}]
    assert Cluster.from_dict(cal.cluster).contention == [pytest.approx(1.2)] * 2


def test_calibrated_simulation_reproduces_the_crowded_run_by_hand():
    """a 1.2 s on cpu0; a:0 (0.5 s) then a:1 (0.7 s) on the channel; b after a:0, c after b."""
    cal = calibrate(GRAPH, CLUSTER, [ALONE, CROWDED], labels=["alone", "crowded"])
    g, c = Graph.from_dict(cal.graph), Cluster.from_dict(cal.cluster)
    ta, tb, tc = 1.2, 2.4, 1.2
    rep = simulate(g, c, Placement.from_dict(SPLIT))
    assert rep["makespan_s"] == pytest.approx(max(ta + 0.5 + tb, ta + 1.2) + tc)
    rows = resimulate([CROWDED], ["crowded"], g, c)
    assert rows[0]["after_s"] == pytest.approx(rep["makespan_s"]) and rows[0]["before_s"] == 1.0


def test_a_single_batch_node_is_scaled_by_its_old_line_or_linearly():
    g = json.loads(json.dumps(GRAPH))
    g["nodes"][0]["batch_line"] = {"batch": 4, "compute_s": [1.0, 0.25]}     # t(2) / t(4) = 1.5 / 2
    cal = calibrate(g, CLUSTER, [DP], labels=["dp"])
    nodes = {n["id"]: n for n in cal.graph["nodes"]}
    gap = dispatch_gaps(DP["node_times"])["cpu0"]
    assert nodes["a"]["compute_s"] == pytest.approx((0.6 * 1.2 + gap) * 2 / 1.5)   # no contention fitted: 1.0
    assert nodes["b"]["compute_s"] == pytest.approx((1.3 * 1.2 + gap) * 2)
    assert cal.summary["scaled_linearly"] == 2 and cal.summary["hosts"]["h"]["nodes"] == 0


def test_op_type_fit_and_contention_edges():
    assert fit_op_types({"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 4.0}, {"a": "x", "b": "x"})["x"] == {
        "overhead_s": 1.0, "scale": 1.0, "nodes": 2}
    assert fit_contention([]) == {}
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0 and kendall_tau([1], [5]) == 1.0


def test_unmeasured_nodes_get_the_op_type_fit():
    rep = report([node("a", "cpu0", 0.0, 3.0)])
    cal = calibrate(GRAPH, CLUSTER, [rep], labels=["r"])
    nodes = {n["id"]: n for n in cal.graph["nodes"]}
    assert nodes["b"]["compute_by_type"]["cpu"] == pytest.approx(3.0) and cal.summary["nodes_unmeasured"] == 2


def test_bad_reports_are_refused_in_one_line():
    with pytest.raises(InvalidInput, match="no per-node times; run placer run again with --node-times"):
        calibrate(GRAPH, CLUSTER, [{**ALONE, "node_times": None}], labels=["r.json"])
    bad = report([node("zz", "cpu0", 0.0, 1.0)])
    with pytest.raises(InvalidInput, match="r.json: node 'zz' is not in graph 'abc'"):
        calibrate(GRAPH, CLUSTER, [bad], labels=["r.json"])
    bad = report([node("a", "gpu7", 0.0, 1.0)])
    with pytest.raises(InvalidInput, match="ran on device 'gpu7', which is not in cluster '2cpu'"):
        calibrate(GRAPH, CLUSTER, [bad], labels=["r.json"])
    with pytest.raises(InvalidInput, match="at least one"):
        calibrate(GRAPH, CLUSTER, [])
    with pytest.raises(InvalidInput, match="--clock"):
        calibrate(GRAPH, CLUSTER, [ALONE], clock="x")


def test_resimulate_needs_the_placement_and_summarises():
    with pytest.raises(InvalidInput, match="keeps no placement"):
        resimulate([ALONE], ["alone.json"], Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER))
    s = summary([{"measured_s": 1.0, "before_s": 2.0, "after_s": 1.1}, {"measured_s": 3.0, "before_s": 1.0,
                                                                        "after_s": 2.9}])
    assert (s["tau_before"], s["tau_after"], s["within_before"], s["within_after"]) == (-1.0, 1.0, 0, 2)


def test_cli_calibrate_writes_both_files_and_prints_the_fit(tmp_path):
    for name, doc in (("g.json", GRAPH), ("c.json", CLUSTER), ("alone.json", ALONE), ("crowded.json", CROWDED)):
        (tmp_path / name).write_text(json.dumps(doc))
    runner = CliRunner()
    r = runner.invoke(main, ["calibrate", str(tmp_path / "alone.json"), str(tmp_path / "crowded.json"), "--graph",
                             str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.json"), "--cluster-out",
                             str(tmp_path / "c2.json")])
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)
    assert g["meta"]["calibrated"]["nodes_fitted"] == 3
    assert json.loads((tmp_path / "c2.json").read_text())["hosts"][0]["contention"] == pytest.approx(1.2)
    assert "contention 1.200" in r.stderr and "latency 400000.0 us" in r.stderr
    assert "crowded.json: measured" in r.stderr and "alone.json: keeps no placement" in r.stderr
    (tmp_path / "plain.json").write_text(json.dumps({**ALONE, "node_times": None}))
    r = runner.invoke(main, ["calibrate", str(tmp_path / "plain.json"), "--graph", str(tmp_path / "g.json"),
                             "--cluster", str(tmp_path / "c.json")])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("Error: ") and "--node-times" in r.stderr


def test_cpu_clock_takes_the_thread_cpu_between_nodes_as_the_dispatch_cost():
    rep = json.loads(json.dumps(GAPPY))
    rep["node_times"]["step_cpu_s"] = {"cpu0": 4.3}        # 4.0 s in nodes, 0.3 s of executor work
    for n in rep["node_times"]["nodes"]:
        n["measured_s"] *= 2                                # waiting for a core doubled the wall times
    assert dispatch_gaps(rep["node_times"], "cpu") == {"cpu0": pytest.approx(0.1)}
    cal = calibrate(GRAPH, CLUSTER, [rep], labels=["r"], clock="cpu")
    assert [n["compute_s"] for n in cal.graph["nodes"]] == pytest.approx([1.1, 2.1, 1.1])


def _gappy(rows):
    """A report whose devices have the given dispatch gaps: per device ``(device, nodes, total gap)``,
    nodes of 1 s back to back with the gap spread between them; transfers are added by the caller."""
    nodes = []
    for dev, n, gap in rows:
        t = 0.0
        for i in range(n):
            nodes.append(node(f"{dev}n{i}", dev, t, 1.0))
            t += 1.0 + (gap / (n - 1) if n > 1 else 0.0)
    return {"node_times": {"nodes": nodes, "transfers": []}}


def test_dispatch_fit_separates_the_sender_the_bytes_and_the_receiver():
    """Hand-made gaps from g = 0.01 s per node, a send costing 0.02 s + 1e-5 s per byte and a receive
    0.03 s: one process alone (4 nodes: 0.04 s), then 2 transfers of 1000 B (sender, 2 nodes: 0.02 +
    2 * (0.02 + 0.01) = 0.08 s; receiver: 0.02 + 2 * 0.03 = 0.08 s), then 1 of 9000 B (0.02 + 0.02 + 0.09
    = 0.13 s; 0.02 + 0.03 = 0.05 s): five device runs, four unknowns, recovered exactly."""
    a = _gappy([("cpu0", 4, 0.04)])
    b = _gappy([("cpu0", 2, 0.08), ("cpu1", 2, 0.08)])
    b["node_times"]["transfers"] = [{"src": "cpu0", "dst": "cpu1", "bytes": 1000}] * 2
    c = _gappy([("cpu0", 2, 0.13), ("cpu1", 2, 0.05)])
    c["node_times"]["transfers"] = [{"src": "cpu0", "dst": "cpu1", "bytes": 9000}]
    f = fit_dispatch([a, b, c])
    assert f["per_node_s"] == pytest.approx(0.01) and f["devices"] == 5
    assert f["send_s"] == pytest.approx([0.02, 1e-5]) and f["recv_s"] == pytest.approx([0.03, 0.0])
    assert f["per_transfer_s"] == pytest.approx(0.02 + 1e-5 * (11000 / 3) + 0.03)   # at the mean size


def test_dispatch_fit_keeps_transfers_out_when_they_explain_nothing():
    """Gaps that do not grow with the transfers (the same 0.1 s per node with 0 and with 6 transfers):
    the transfer terms are zero, not negative, and the calibrated cluster gets no send_s / recv_s."""
    a = _gappy([("cpu0", 3, 0.3)])
    b = _gappy([("cpu0", 3, 0.3), ("cpu1", 3, 0.3)])
    b["node_times"]["transfers"] = [{"src": "cpu0", "dst": "cpu1", "bytes": 500}] * 6
    f = fit_dispatch([a, b])
    assert f["per_node_s"] == pytest.approx(0.1)
    assert f["send_s"] == [0.0, 0.0] and f["recv_s"] == [0.0, 0.0] and f["per_transfer_s"] == 0.0
    cal = calibrate(GRAPH, CLUSTER, [GAPPY, ALONE], labels=["gappy", "alone"])
    assert all("send_s" not in h and "recv_s" not in h for h in cal.cluster.get("hosts", []))


def test_the_transfer_costs_go_to_the_hosts_and_the_links_keep_their_fit():
    from celeritas_cli.profile.calibrate import _write_cluster, fit_links

    c = Cluster.from_dict(CLUSTER)
    links = fit_links([CROWDED], c)
    out = _write_cluster(CLUSTER, c, [CROWDED], links, {"h": {"contention": 1.1, "nodes": 2}},
                         {"send_s": [0.05, 1e-6], "recv_s": [0.02, 0.0]})
    pairs = {(p["src"], p["dst"]): p for p in out["links"]["pairs"]}
    assert pairs == {("cpu0", "cpu1"): {"src": "cpu0", "dst": "cpu1", "bandwidth_Bps": pytest.approx(1.0e4),
                                        "latency_s": pytest.approx(0.4)}}          # fitted, nothing added
    assert out["hosts"] == [{"name": "h", "devices": ["cpu0", "cpu1"], "contention": 1.1,
                             "send_s": [0.05, 1e-6], "recv_s": [0.02, 0.0]}]
    cl = Cluster.from_dict(out)
    assert cl.send_cost == [(0.05, 1e-6)] * 2 and cl.recv_cost == [(0.02, 0.0)] * 2 and cl.transfer_costs
    assert _write_cluster(CLUSTER, c, [CROWDED], {}, {})["links"]["pairs"] == []       # nothing fitted: as given


def _edited(doc: dict, edit) -> dict:
    doc = json.loads(json.dumps(doc))
    edit(doc["node_times"])
    return doc


@pytest.mark.parametrize("edit,message", [
    # D037 / D038: a transfer of no time, or of negative time (statistics.median of nothing before)
    (lambda nt: nt["transfers"][0].update(seconds=0.0), r"node_times\.transfers\[0\]\.seconds: must be above 0"),
    (lambda nt: nt["transfers"][1].update(seconds=-1.0), r"node_times\.transfers\[1\]\.seconds: must be above 0"),
    # D044 / D056: a device the cluster lacks in a transfer, in hosts, in an all-reduce (KeyError before)
    (lambda nt: nt["transfers"][1].update(src="ghost"),
     r"r\.json: node_times\.transfers\[1\]\.src names device 'ghost', which is not in cluster '2cpu'"),
    (lambda nt: nt["hosts"].update(ghost="h"), r"node_times\.hosts names device 'ghost'"),
    (lambda nt: nt.update(step_cpu_s={"ghost": 1.0}), r"node_times\.step_cpu_s names device 'ghost'"),
    (lambda nt: nt.update(allreduce=[{"device": "ghost", "tensor": "bucket0", "bytes": 8}]),
     r"node_times\.allreduce\[0\]\.device names device 'ghost'"),
    # D020: a start time that overflowed the least squares (OverflowError before)
    (lambda nt: nt["nodes"][0].update(start_s=1e300), r"node 'a' field start_s: must be at most 1e12 s"),
    (lambda nt: nt["nodes"][2].update(measured_s=1e13), r"node 'c' field measured_s: must be at most 1e12 s"),
    # D050 / D8: nodes "run at" 2^53 samples in a report of batch 4 (fitted at 3.7e-20 s before)
    (lambda nt: nt.update(batch=2**53), r"node_times\.batch is 9007199254740992 but batch_size is 4: .*inconsistent"),
])
def test_inconsistent_or_out_of_range_reports_are_refused_on_load(edit, message):
    """Round 3, D2 and D8: each was a traceback or a nonsense fit; now one line naming the report and
    the field, before anything is fitted."""
    with pytest.raises(InvalidInput, match=message):
        calibrate(GRAPH, CLUSTER, [ALONE, _edited(CROWDED, edit)], labels=["alone.json", "r.json"])


def test_a_data_parallel_report_runs_at_the_replica_batch():
    """node_times.batch of a data-parallel run is the replica's batch, not the report's batch_size."""
    calibrate(GRAPH, CLUSTER, [ALONE, DP])
    bad = json.loads(json.dumps(DP))
    bad["node_times"]["batch"] = 4      # the global batch: every node would be fitted at twice its samples
    with pytest.raises(InvalidInput, match=r"node_times\.batch is 4 but data_parallel\.replica_batch is 2"):
        calibrate(GRAPH, CLUSTER, [ALONE, bad], labels=["alone.json", "dp.json"])


def test_a_device_of_no_known_host_is_its_own_host():
    """hosts may say null (the host is unknown): such a device is alone on its host, as without the
    entry (a TypeError sorting None with host names before)."""
    unknown = _edited(CROWDED, lambda nt: nt["hosts"].update(cpu0=None, cpu1=None))
    absent = _edited(CROWDED, lambda nt: nt.update(hosts={}))
    assert calibrate(GRAPH, CLUSTER, [ALONE, unknown]).graph == calibrate(GRAPH, CLUSTER, [ALONE, absent]).graph


def test_cli_refuses_a_bad_report_in_one_line_and_writes_nothing(tmp_path):
    bad = _edited(CROWDED, lambda nt: nt["transfers"][0].update(dst="ghost"))
    for name, doc in (("g.json", GRAPH), ("c.json", CLUSTER), ("bad.json", bad)):
        (tmp_path / name).write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["calibrate", str(tmp_path / "bad.json"), "--graph", str(tmp_path / "g.json"),
                                  "--cluster", str(tmp_path / "c.json"), "-o", str(tmp_path / "out.json"),
                                  "--cluster-out", str(tmp_path / "c_out.json")])
    assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"Error: {tmp_path / 'bad.json'}: node_times.transfers[0].dst names device 'ghost', which is not in "
        f"cluster '2cpu'; give the --cluster the run used"]
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "c_out.json").exists()


def test_markup_in_a_device_id_is_printed_as_text(tmp_path):
    """Round 3, D1: a device '[/b]c0' in the cluster and the run (rich read it as a closing tag)."""
    swap = lambda s: s.replace('"cpu0"', '"[/b]c0"')  # noqa: E731
    for name, doc in (("g.json", GRAPH), ("c.json", CLUSTER), ("crowded.json", CROWDED)):
        (tmp_path / name).write_text(swap(json.dumps(doc)))
    r = CliRunner().invoke(main, ["calibrate", str(tmp_path / "crowded.json"), "--graph", str(tmp_path / "g.json"),
                                  "--cluster", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.stderr
    assert "link [/b]c0->cpu1: latency 400000.0 us" in r.stderr
