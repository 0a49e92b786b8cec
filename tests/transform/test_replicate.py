"""Data parallelism (FastT's DP baseline) and the split cost model, checked
by hand on tiny models and through the simulator."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.transform.contract import contract
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.devices import roofline_time
from celeritas_cli.transform.allreduce import chunk_sizes
from celeritas_cli.transform.replicate import data_parallel_graph
from celeritas_cli.transform.split_cost import (
    COPY_BANDWIDTH_BPS,
    batch_profile,
    is_update,
    part_times,
)
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node

ADD = 3 * 250 / COPY_BANDWIDTH_BPS  # one reduce-scatter add of a 250-byte chunk


def tiny(grad_bytes: int = 1000, phase: str = "training") -> Graph:
    """x (0.4 s, 400 B activation) -> f (8 s; 400 B activation + 100 B parameters)
    -> b (8 s backward; keeps its 100 B gradient... sends a grad_bytes gradient) -> u (SGD with
    200 B of state, colocated with f's parameters)."""
    nodes = [node("x", 0.4, 400), node("f", 8.0, 500, colocation="p", splittable=["batch"],
                                         batch_independent={"memory_bytes": 100, "state_bytes": 100}),
             node("b", 8.0, 100, op="aten.mm", splittable=["batch"], batch_independent={"memory_bytes": 100})]
    edges = [edge("x", "f", 400, tensor="x:0"), edge("f", "b", 400, tensor="f:0")]
    if phase == "training":
        nodes.append(node("u", 1.0, 200, op="optim.sgd", colocation="p"))
        edges.append(edge("b", "u", grad_bytes, tensor="b:0"))
    return build("tiny", nodes, edges, meta={"phase": phase, "batch_size": 8})


def test_ring_allreduce_bytes_memory_and_makespan_by_hand():
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0, memory=10_000)
    p = registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "collectives": "ring"})
    rep = simulate(g, cl, p)
    # ring of 4: each device sends 2 (k-1) = 6 chunks of 250 B = 2 (k-1)/k of the 1000-byte gradient
    assert p.estimate["allreduce_bytes_per_device"] == 2 * 3 * 1000 // 4 == 1500
    assert [(ln["src"], ln["dst"], ln["bytes"], ln["transfers"]) for ln in rep["links"]] == [
        ("gpu0", "gpu1", 1500, 6), ("gpu1", "gpu2", 1500, 6), ("gpu2", "gpu3", 1500, 6), ("gpu3", "gpu0", 1500, 6)]
    # per device: x 400/4 + f (100 parameters + 400/4) + b's 100 B gradient + u's 200 B optimizer state
    assert [d["memory_bytes"] for d in rep["devices"]] == [100 + 200 + 100 + 200] * 4
    # x 0.1 + f 2 + b 2 (linear at 1/4), 3 reduce-scatter + 3 all-gather hops of 0.25 s (3 adds), then u 1 s
    expected = 0.1 + 2 + 2 + 6 * 0.25 + 3 * ADD + 1.0
    assert rep["makespan_s"] == pytest.approx(expected, rel=1e-12)
    assert p.estimate["makespan_s"] == pytest.approx(expected, rel=1e-12)
    assert rep["status"] == "OK" and p.estimate["status"] == "FEASIBLE"


def test_two_replicas_by_hand():
    g = tiny(grad_bytes=100)
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "collectives": "ring"})
    # x 0.2, f 4, b 4; chunk 50 B: reduce-scatter 0.5 s, add, all-gather 0.5 s; u 1 s
    assert simulate(g, cl, p)["makespan_s"] == pytest.approx(0.2 + 4 + 4 + 0.5 + 3 * 50 / COPY_BANDWIDTH_BPS
                                                             + 0.5 + 1.0, rel=1e-12)
    assert p.estimate["allreduce_bytes_per_device"] == 100


def test_ring_structure_is_self_describing():
    d = data_parallel_graph(tiny(), 4, overhead_s=0.0, collectives="ring")
    extra = {d.ids[v]: d.node_extra[v] for v in range(d.n)}
    assert extra["f/rep2"]["replica"] == 2 and extra["f/rep2"]["origin"] == "f"
    assert d.colocation[d.index["u/rep3"]] == "p/rep3" == d.colocation[d.index["f/rep3"]]
    ring = [nid for nid, ex in extra.items() if ex and "allreduce" in ex]
    assert len(ring) == 4 * 3 * 2 + 4  # reduce-scatter and all-gather nodes per step and replica, and results
    rs = extra["b/allreduce0/rs1/rep2"]["allreduce"]
    assert rs == {"of": "b", "tensor": "b:0", "phase": "reduce-scatter", "bytes": 1000, "step": 1, "chunk": 0}
    # the update of replica q reads the reduced gradient on q, under the gradient's name
    (e,) = d.in_edges[d.index["u/rep1"]]
    assert d.ids[d.edge_src[e]] == "b/allreduce0/rep1" and d.edge_bytes[e] == 1000
    assert d.meta["data_parallel"]["gradients"] == 1


def test_chunks_of_an_uneven_gradient():
    assert chunk_sizes(1002, 4) == [251, 251, 250, 250]
    d = data_parallel_graph(tiny(grad_bytes=1002), 4, collectives="ring")
    assert d.meta["data_parallel"]["allreduce_bytes_per_device"] == 2 * 3 * 1002 // 4


def test_inference_graph_has_nothing_to_all_reduce():
    g = tiny(phase="inference")
    cl = uniform(4, bandwidth=1000.0, latency=0.0)
    p = registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "collectives": "ring"})
    rep = simulate(g, cl, p)
    assert rep["links"] == [] and p.estimate["gradient_bytes"] == 0
    assert rep["makespan_s"] == pytest.approx(0.1 + 2 + 2)


def test_oom_is_reported_like_any_placement():
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0, memory=500)
    p = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    assert p.estimate["status"] == "OOM" and p.estimate["oom_devices"] == cl.ids
    assert simulate(g, cl, p)["status"] == "OOM"


def test_devices_and_weak_scaling():
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0)
    p = registry.place(g, cl, "data-parallel", params={"devices": "gpu3,gpu1", "overhead_s": 0.0})
    assert p.replicas == {"devices": [["gpu3"], ["gpu1"]]} and p.estimate["replicas"] == 2
    assert set(p.assignment.values()) == {"gpu3"}  # replica 0's nodes (sim/symmetric.py)
    assert registry.place(g, cl, "data-parallel", params={"devices": "3"}).estimate["devices"] == ["gpu0", "gpu1",
                                                                                                    "gpu2"]
    with pytest.raises(InvalidInput, match="unknown device 'gpu9'"):
        registry.place(g, cl, "data-parallel", params={"devices": "gpu9"})
    with pytest.raises(InvalidInput, match="5 replicas but cluster"):
        registry.place(g, cl, "data-parallel", params={"devices": "5"})
    w = registry.place(g, cl, "data-parallel", params={"scaling": "weak", "overhead_s": 0.0})
    assert w.estimate["global_batch"] == 32
    # every replica runs the whole batch: 0.4 + 8 + 8, the ring, the update
    assert simulate(g, cl, w)["makespan_s"] == pytest.approx(16.4 + 1.5 + 3 * ADD + 1.0)


def test_layered_graph_updates_are_recognised_and_reduced():
    g = layered(200, seed=3)
    updates = [v for v in range(g.n) if is_update(g, v)]
    prof = batch_profile(g)
    assert updates and sum(prof.gradient) == len(updates)
    cl = uniform(4)
    p = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    rep = simulate(g, cl, p)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    assert p.estimate["gradient_bytes"] == sum(g.tensor_bytes[t] for t in range(len(g.tensor_src)) if prof.gradient[t])
    # only the ring crosses devices: every link of the ring carries 2 (k-1)/k of the gradient bytes
    ring = [(f"gpu{i}", f"gpu{(i + 1) % 4}") for i in range(4)]
    assert [(ln["src"], ln["dst"]) for ln in rep["links"]] == sorted(ring)
    per_device = p.estimate["allreduce_bytes_per_device"]  # 2 (k-1)/k G, up to a byte per uneven chunk
    assert all(abs(ln["bytes"] - per_device) <= 2 * len(updates) for ln in rep["links"])
    # each of the 2 (k-1) steps moves every chunk once: 2 (k-1) G over all links
    assert sum(ln["bytes"] for ln in rep["links"]) == 2 * 3 * p.estimate["gradient_bytes"]
    assert rep["makespan_s"] >= p.estimate["allreduce_bytes_per_device"] / 1.0e10


def test_coarse_graph_is_not_replicated_and_a_forged_base_is_caught_the_same_way():
    """Issue 24.2 (N13): on a coarse graph gradients and updates are no longer told apart, so the
    all-reduce silently disappeared; data parallelism refuses coarse input, and a recipe whose base
    regroups the graph is refused by simulate the same way."""
    g = tiny()
    cg = contract(g, [0, 0, 1, 1], method="test")  # b (the gradient) and u (the update) in one node
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    with pytest.raises(InvalidInput, match="graph 'tiny@test' is coarse: .* replicate the original graph 'tiny'"):
        registry.place(cg, cl, "data-parallel")
    p = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    assert p.derived.meta["data_parallel"]["gradients"] == 1
    p.derivation = {**p.derivation, "base": {"graph": "tiny@test", "members": [["x", "f"], ["b", "u"]]}}
    with pytest.raises(InvalidInput, match=r"^p.json: derivation.steps\[0\] \(data-parallel\): graph 'tiny@test' is "
                                           r"coarse"):
        simulate(g, cl, p, label="p.json")
    p.derivation["base"]["members"] = [["x", "b"], ["f", "u"]]  # x -> f -> b -> u: a cycle between the groups
    with pytest.raises(InvalidInput, match=r"field derivation.base.members: this grouping .* has a cycle"):
        simulate(g, cl, p, label="p.json")


def test_forged_data_parallel_graph_is_rejected():
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0, memory=500)
    p = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    forged = copy.deepcopy(p.to_dict(embed_derived=True)["split_graph"])
    for nd in forged["nodes"]:
        nd["memory_bytes"] //= 4  # hide the OOM
    p.split_graph = forged
    with pytest.raises(InvalidInput, match="split_graph node 'x/rep0' does not derive from graph 'tiny': "
                                           "memory_bytes is 25, the derivation gives 100"):
        simulate(g, cl, p)


def test_cli_place_simulate_and_a_forged_file(tmp_path):
    gpath = tmp_path / "tiny.json"
    gpath.write_text(json.dumps(tiny().to_dict()))
    r = CliRunner().invoke(main, ["place", str(gpath), "--algo", "data-parallel", "-p", "collectives=ring", "--no-timings", "--embed-derived"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["derivation"]["steps"][0]["transform"] == "data-parallel"
    ppath = tmp_path / "p.json"
    ppath.write_text(r.stdout)
    ok = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(ppath)])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["makespan_s"] == pytest.approx(doc["estimate"]["makespan_s"])
    for nd in doc["split_graph"]["nodes"]:
        nd["compute_s"] *= 0.001
    ppath.write_text(json.dumps(doc))
    bad = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(ppath)])
    assert bad.exit_code == 1 and bad.stdout == ""
    assert "does not derive from graph 'tiny'" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------ split cost model
def test_part_time_from_the_standard_evaluation_line_never_beats_linear():
    g = build("l", [node("a", 8.0, batch_line={"batch": 8, "compute_s": [4.0, 0.5]}),
                    node("b", 8.0, batch_line={"batch": 8, "compute_s": [-8.0, 2.0]}),
                    node("c", 8.0)], [])
    assert part_times(g, 0, 0.25)[0] == pytest.approx(5.0)        # 4 + 0.5 * 2
    assert part_times(g, 1, 0.25)[0] == pytest.approx(2.0)        # the line says -4: clamped to linear
    assert part_times(g, 2, 0.25, overhead_s=0.5)[0] == pytest.approx(2.5)  # linear + one launch
    assert part_times(g, 2, 1.0)[0] == 8.0


def test_part_time_from_the_roofline_at_the_smaller_shape():
    flops, moved, fixed = 4.0e12, 2.0e9, 1.0e9
    t = roofline_time(flops, moved, "V100")                        # compute bound: 4e12 / 14e12
    mem_bound = roofline_time(1.0e9, moved, "V100")
    meta = {"cost_model": "roofline on V100 (celeritas_cli.model.devices)"}
    g = build("r", [node("a", t, flops=int(flops), bytes_moved=int(moved),
                         batch_independent={"bytes_moved": int(fixed)}),
                    node("m", mem_bound, flops=int(1e9), bytes_moved=int(moved),
                         batch_independent={"bytes_moved": int(fixed)})], [], meta=meta)
    assert part_times(g, 0, 0.25)[0] == pytest.approx(roofline_time(flops / 4, fixed + (moved - fixed) / 4, "V100"))
    # memory bound: the parameter bytes do not shrink with the batch
    assert part_times(g, 1, 0.25)[0] == pytest.approx(roofline_time(1e9 / 4, fixed + (moved - fixed) / 4, "V100"))
    assert part_times(g, 1, 0.25)[0] > mem_bound / 4


def test_given_re_evaluates_a_data_parallel_placement(tmp_path):
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0)
    p = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    path = tmp_path / "dp.json"
    path.write_text(json.dumps(p.to_dict()))
    q = registry.place(g, cl, "given", params={"file": str(path)})
    assert q.derivation == p.derivation and q.assignment == p.assignment
    assert simulate(g, cl, q)["makespan_s"] == pytest.approx(simulate(g, cl, p)["makespan_s"])


# ------------------------------------------------------ shares=proportional
def test_proportional_shares_by_hand_and_through_the_recipe():
    # a (4 s, 400 B activation) -> b (4 s), no optimizer, on a 1x and a 3x device.  Equal shares: the
    # slow replica takes 2 + 2 = 4 s.  Proportional: shares 1/4 and 3/4, both replicas take 1 + 1 = 2 s
    # = (4 + 4) / (1 + 3), the work bound of any derivation: optimal.
    g = build("ab", [node("a", 4.0, 400), node("b", 4.0)], [edge("a", "b", 100)], meta={"batch_size": 4})
    cl = uniform(2, bandwidth=100.0, latency=0.0, speeds=[1.0, 3.0])
    eq = registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "collectives": "ring"})
    pr = registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "shares": "proportional",
                                                        "collectives": "ring"})
    # the nccl form (a symmetric plan of 2 kinds) gives the same: there are no gradients to reduce
    assert registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "shares": "proportional"}
                          ).estimate["makespan_s"] == pytest.approx(2.0, rel=1e-12)
    assert eq.estimate["makespan_s"] == 4.0 and "shares" not in eq.derivation["steps"][0]
    assert pr.estimate["shares"] == pytest.approx([0.25, 0.75])
    assert pr.derivation["steps"][0]["shares"] == pr.estimate["shares"]
    rep = simulate(g, cl, pr)  # rebuilt from the recipe's shares
    assert rep["makespan_s"] == pytest.approx(2.0, rel=1e-12) == pr.estimate["makespan_s"]
    bounds = {b["name"]: b["value_s"] for b in rep["lower_bounds"]}
    assert bounds["work_any_derivation"] == 2.0 and rep["lower_bound_s"] <= rep["makespan_s"]
    # a's activation is its 100-byte output (the other 300 B do not scale): 300 + share x 100
    assert [d["memory_bytes"] for d in rep["devices"]] == [300 + 25, 300 + 75]
    # the recipe's shares are checked: other shares give another graph than the one carried
    forged = copy.deepcopy(pr)
    forged.split_graph = pr.derived.to_dict()  # as carried by a file written with --embed-derived
    forged.derivation["steps"][0]["shares"] = [0.5, 0.5]
    with pytest.raises(InvalidInput, match="does not derive"):
        simulate(g, cl, forged)


def test_proportional_shares_on_identical_devices_are_equal_and_weak_is_refused():
    g = tiny()
    cl = uniform(4, bandwidth=1000.0, latency=0.0)
    eq = registry.place(g, cl, "data-parallel")
    pr = registry.place(g, cl, "data-parallel", params={"shares": "proportional"})
    assert pr.assignment == eq.assignment and pr.derivation == eq.derivation and "shares" not in pr.estimate
    with pytest.raises(InvalidInput, match="shares: proportional needs scaling=strong"):
        registry.place(g, cl, "data-parallel", params={"shares": "proportional", "scaling": "weak"})
    with pytest.raises(InvalidInput, match="3 positive batch fractions"):
        data_parallel_graph(g, 3, shares=[0.5, 0.5], collectives="ring")


# ------------------------------------------------------ bucket_mb (DDP gradient bucketing)
def three(sizes=(100, 100, 100), k_time: float = 6.0) -> Graph:
    """A backward chain b3 -> b2 -> b1 (6 s each at the whole batch), b_i sending a gradient g_i of
    sizes[3 - i] bytes to its own SGD update u_i (0 s): gradients become ready g3, g2, g1."""
    nodes = [node("b3", k_time), node("b2", k_time), node("b1", k_time)]
    edges = [edge("b3", "b2", 0, tensor="d3"), edge("b2", "b1", 0, tensor="d2")]
    for i, gb in zip((3, 2, 1), sizes):
        nodes.append(node(f"u{i}", 0.0, op="optim.sgd", colocation=f"p{i}"))
        edges.append(edge(f"b{i}", f"u{i}", gb, tensor=f"g{i}"))
    return build("three", nodes, edges, meta={"phase": "training", "batch_size": 24})


def _place(g, cl, mb):
    return registry.place(g, cl, "data-parallel", params={"overhead_s": 0.0, "bucket_mb": mb, "collectives": "ring"})


MIB = 2**20


@pytest.mark.parametrize("k", [2, 3])
def test_bucket_bytes_and_node_count_by_hand(k):
    g = three((100, 200, 301))
    cl = uniform(k, bandwidth=1000.0, latency=0.0)
    per, one = _place(g, cl, 0), _place(g, cl, 1.0)  # 1 MiB holds all 601 bytes: one bucket
    assert one.estimate["buckets"] == 1 and one.estimate["bucket_mb"] == 1.0 and "buckets" not in per.estimate
    # the bucket's ring: 2 (k-1)/k of its 601 bytes per device; per gradient, the floors add up to less
    assert one.estimate["allreduce_bytes_per_device"] == 2 * (k - 1) * 601 // k == {2: 601, 3: 801}[k]
    assert per.estimate["allreduce_bytes_per_device"] == sum(2 * (k - 1) * x // k for x in (100, 200, 301))
    rep = simulate(g, cl, one)
    # every link of the ring carries the bucket's 2 (k-1) chunks, in 2 (k-1) transfers
    assert sum(ln["bytes"] for ln in rep["links"]) == 2 * (k - 1) * 601
    assert all(ln["transfers"] == 2 * (k - 1) for ln in rep["links"]) and len(rep["links"]) == k
    # 6 nodes per replica; a ring is k (2k-2) reduce-scatter/all-gather nodes + k results, a bucket adds k
    # bucket nodes: per gradient 6k + 3 k (2k-1), bucketed 6k + k + k (2k-2) + k
    assert per.derived.n == 6 * k + 3 * k * (2 * k - 1) == {2: 30, 3: 63}[k]
    assert one.derived.n == 6 * k + 2 * k * k == {2: 20, 3: 36}[k]


def test_bucketing_wins_where_latency_dominates_by_hand():
    # link latency 10 s, bandwidth ~infinite.  k=2: b's run 3 s each; g3 is ready at 3, g1 at 9.
    # Per gradient: the channel gpu0->gpu1 carries 3 reduce-scatter and 3 all-gather transfers of 10 s
    # back to back from t=3 (FIFO): 3 + 6 x 10 = 63.  One bucket: ready at 9, one reduce-scatter and one
    # all-gather step: 9 + 2 x 10 = 29.  (Plus the bytes / 1e12 and the adds, 3 x chunk / COPY_BANDWIDTH.)
    g = three()
    cl = uniform(2, bandwidth=1e12, latency=10.0)
    per, one = _place(g, cl, 0), _place(g, cl, 1.0)
    add50, add150 = 3 * 50 / COPY_BANDWIDTH_BPS, 3 * 150 / COPY_BANDWIDTH_BPS
    assert per.estimate["makespan_s"] == pytest.approx(63.0, abs=1e-8)
    assert one.estimate["makespan_s"] == pytest.approx(9 + 2 * (10 + 150 / 1e12) + add150, rel=1e-13)
    assert per.estimate["makespan_s"] > 63.0 + add50
    # k=3: b's 2 s each.  Per gradient 12 transfers of 10 s on each channel from t=2: 122; bucketed
    # ready at 6, 2 (k-1) = 4 steps: 46
    cl3 = uniform(3, bandwidth=1e12, latency=10.0)
    assert _place(g, cl3, 0).estimate["makespan_s"] == pytest.approx(122.0, abs=1e-8)
    assert _place(g, cl3, 1.0).estimate["makespan_s"] == pytest.approx(46.0, abs=1e-8)


def test_bucketing_loses_when_the_bucket_waits_for_its_last_gradient_by_hand():
    # no latency, 100 B/s: a 50-byte chunk takes 0.5 s.  k=2, b's 3 s each.  Per gradient: g3's
    # reduce-scatter transfer 3-3.5 and g2's 6-6.5 overlap the backward; its adds wait for the device
    # (b1 outranks them) until 9; g1's transfer 9-9.5, then the three all-gather transfers queue on the
    # channel: 9.5-10, 10-10.5, 10.5-11.  One bucket of 300 B waits for g1 (9): its 150-byte chunks take
    # 1.5 s each way: 9 + 1.5 + add + 1.5 = 12.
    g = three()
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    per, one = _place(g, cl, 0), _place(g, cl, 1.0)
    assert per.estimate["makespan_s"] == pytest.approx(11.0, rel=1e-12)
    assert one.estimate["makespan_s"] == pytest.approx(12.0 + 3 * 150 / COPY_BANDWIDTH_BPS, rel=1e-12)


def test_buckets_follow_the_ready_order_and_close_at_the_cap():
    g = three((100, 200, 301))
    # g3 (100) + g2 (200) reach a 300-byte cap: the bucket closes; g1 alone
    d = data_parallel_graph(g, 2, bucket_mb=300 / MIB, collectives="ring")
    info = d.node_extra[d.index["bucket0/allreduce/bucket/rep1"]]["allreduce"]
    assert info == {"bucket": 0, "of": ["b3", "b2"], "tensor": ["g3", "g2"], "phase": "bucket", "bytes": 300}
    assert "b1/allreduce0/rep0" in d.index  # a bucket of one gradient is that gradient's ring
    assert d.meta["data_parallel"]["buckets"] == 2
    # the bucket's result feeds both updates with their own gradient, under its name
    res = d.index["bucket0/allreduce/rep1"]
    assert sorted((d.ids[d.edge_dst[e]], d.edge_bytes[e], d.tensor_name[d.edge_tensor[e]])
                  for e in d.out_edges[res]) == [("u2/rep1", 200, "g2"), ("u3/rep1", 100, "g3")]
    # a cap below every gradient: the per-gradient graph, node for node and edge for edge
    small = data_parallel_graph(g, 3, bucket_mb=1 / MIB, collectives="ring").to_dict()
    per = data_parallel_graph(g, 3, collectives="ring").to_dict()
    assert small["nodes"] == per["nodes"] and small["edges"] == per["edges"]


def test_a_gradient_made_after_an_update_of_the_bucket_starts_a_new_bucket():
    # u3 -> b1: g1's producer runs after g3's update, so g1 cannot join g3's bucket (a cycle)
    doc = three().to_dict()
    doc["edges"].append({"src": "u3", "dst": "b1", "bytes": 0, "tensor": "step"})
    g = Graph.from_dict(doc)
    d = data_parallel_graph(g, 2, bucket_mb=1.0, collectives="ring")
    assert d.meta["data_parallel"]["buckets"] == 2 and "b1/allreduce0/rep0" in d.index
    assert d.node_extra[d.index["bucket0/allreduce/bucket/rep0"]]["allreduce"]["of"] == ["b3", "b2"]


def test_bucket_recipe_round_trip_and_forgeries_through_the_cli(tmp_path):
    gpath = tmp_path / "three.json"
    gpath.write_text(json.dumps(three().to_dict()))
    cl = ["--cluster", "8xA100-nvswitch"]
    r = CliRunner().invoke(main, ["place", str(gpath), "--algo", "data-parallel", "-p", "bucket_mb=1", "-p", "collectives=ring", *cl,
                                  "--no-timings", "--embed-derived"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["derivation"]["steps"][0]["bucket_mb"] == 1.0 and doc["estimate"]["buckets"] == 1
    ppath = tmp_path / "p.json"
    ppath.write_text(r.stdout)
    ok = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(ppath), *cl])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["makespan_s"] == pytest.approx(doc["estimate"]["makespan_s"], rel=1e-12)
    # 8 replicas x 6 nodes, then the bucket nodes where the recipe's bucket_mb=0 gives g3's ring
    for value, message in ((0, "split_graph node #48 does not derive from graph 'three': it is "
                               "'bucket0/allreduce/bucket/rep0', the derivation gives 'b3/allreduce0/rs0/rep0'"),
                           (-1, "p.json: field derivation.steps[0].bucket_mb: must be at least 0"),
                           ("1", "p.json: field derivation.steps[0].bucket_mb: must be number")):
        forged = copy.deepcopy(doc)
        forged["derivation"]["steps"][0]["bucket_mb"] = value
        ppath.write_text(json.dumps(forged))
        bad = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(ppath), *cl])
        assert bad.exit_code == 1 and bad.stdout == "", (value, bad.output)
        assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (value, bad.stderr)
    # without the recipe's bucket_mb the carried bucketed graph does not derive: rejected, not re-bucketed
    forged = copy.deepcopy(doc)
    del forged["derivation"]["steps"][0]["bucket_mb"]
    ppath.write_text(json.dumps(forged))
    bad = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(ppath), *cl])
    assert bad.exit_code == 1 and "does not derive from graph 'three'" in bad.stderr
    usage = CliRunner().invoke(main, ["place", str(gpath), "--algo", "data-parallel", "-p", "bucket_mb=-2"])
    assert usage.exit_code in (1, 2) and usage.stdout == "" and "bucket_mb" in usage.stderr
