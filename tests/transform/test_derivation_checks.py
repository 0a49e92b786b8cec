"""Derived graphs that cannot lie (issue 24: N08-N13, batch splitting only where
the graph declares its batch): recipes checked field by field, sized before
they are built, and data parallelism refused where it would drop the
gradient all-reduce."""

from __future__ import annotations

import copy

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.admit import data_parallel_size, split_size
from celeritas_cli.transform.derivation import STEPS, data_parallel_step, derive, rebuild, split_step
from celeritas_cli.transform.replicate import data_parallel_graph
from celeritas_cli.transform.size import derived_budget
from celeritas_cli.transform.split_cost import splittable_dims
from celeritas_cli.transform.splitting import split_operation

from ..conftest import edge, node, training_model


def _dp_placement(g, k=4, **params):
    cl = uniform(k, bandwidth=1000.0, latency=0.0, memory=10**9)
    return registry.place(g, cl, "data-parallel", params=params), cl


# ---------------------------------------------------------------- sizes before building
@pytest.mark.parametrize("k,bucket_mb", [(1, 0.0), (2, 0.0), (3, 0.0), (4, 25.0), (5, 1e-4), (8, 25.0)])
def test_data_parallel_size_is_the_built_graph_size(k, bucket_mb):
    """Two code paths: the size counted from the input graph and the graph actually built."""
    g = layered(80, seed=3)
    size = data_parallel_size(g, k, bucket_mb)
    built = data_parallel_graph(g, k, bucket_mb=bucket_mb)
    assert (size.nodes, size.edges) == (built.n, built.m)


def test_split_size_is_the_built_graph_size():
    g = layered(60, seed=2)
    checked = 0
    for v in range(g.n):
        for dim in splittable_dims(g, v):
            for n in (2, 4):
                size = split_size(g, v, dim, n)
                built = split_operation(g, g.ids[v], dim, n)
                assert (size.nodes, size.edges) == (built.n, built.m), (g.ids[v], dim, n)
                checked += 1
    assert checked > 10


def test_a_million_replicas_are_refused_before_anything_is_built():
    """N08: the recipe with 1,000,000 replicas grew past 2 GB; now sized first (k^2 ring nodes then; k collective nodes per bucket now)."""
    g = training_model()
    with pytest.raises(InvalidInput, match=r"^p.json: derivation.steps\[0\] \(data-parallel\) would build a "
                                           r"derived graph of 5,000,000 nodes"):
        derive(g, {"steps": [data_parallel_step(10**6, "weak", 0.0)]}, "p.json")
    # with a cluster, replicas beyond its devices are refused at once, naming the field
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].replicas: 1000000 is more than the 4 "
                                           r"devices of cluster 'c'"):
        derive(g, {"steps": [data_parallel_step(10**6, "strong", 0.0)]}, "p.json", devices=4, cluster="c")
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].n: 10000000 is more than the 4 devices"):
        derive(g, {"steps": [split_step("b", "batch", 10**7, 0.0)]}, "p.json", devices=4, cluster="c")
    ch = build("ch", [node("a", 1.0), node("c", 4.0, splittable=["channel"])], [edge("a", "c")])
    with pytest.raises(InvalidInput, match=r"^p.json: derivation.steps\[0\] \(split\) would build a derived graph "
                                           r"of 10,000,001 nodes"):
        derive(ch, {"steps": [split_step("c", "channel", 10**7, 0.0)]}, "p.json")


def test_data_parallel_on_1024_devices_refuses_in_one_line_and_the_budget_is_a_knob():
    """N09: the ring form grows as k^2 per bucket (2(k-1) steps on every replica); k = 1024 is
    over the budget.  The nccl form (the default) is one collective node per replica and bucket."""
    g = layered(60, seed=7)
    size = data_parallel_size(g, 1024, 25.0, "ring")
    assert size.nodes == 1024 * 60 + 1024 * (2 * 1023 + 1) + 1024  # 60-node replicas + one bucket's ring
    with pytest.raises(InvalidInput, match=r"data-parallel: 1024 replicas of graph 'layered_n60_s7' would build a "
                                           r"derived graph of 2,158,592 nodes .* over the budget of 62,500 nodes on "
                                           r"1024 devices .*; use fewer replicas"):
        data_parallel_graph(g, 1024, bucket_mb=25.0, assume_batch=4096, collectives="ring")
    assert data_parallel_size(g, 1024, 25.0).nodes == 1024 * 60 + 1024  # one collective per replica: in budget
    with derived_budget(10):
        with pytest.raises(InvalidInput, match="over the budget of 10 nodes"):
            data_parallel_graph(g, 2)
    assert data_parallel_graph(g, 2).n == data_parallel_size(g, 2).nodes  # the default budget is back


# ---------------------------------------------------------------- errors name the file and the field
def _recipe_error(g, derivation, devices=4) -> str:
    with pytest.raises(InvalidInput) as err:
        rebuild(g, derivation, None, "p.json", devices=devices, cluster="4xV100")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("p.json: ")
    return msg


@pytest.mark.parametrize("field,value,expected", [
    ("shares", [0.5, 0.5], "field derivation.steps[0].shares: must list one batch fraction per replica (4), got 2"),
    ("shares", [0.25, 0.25, 0.25, "0.25"], "field derivation.steps[0].shares[3]: must be a number, got '0.25'"),
    ("shares", [0.25, 0.25, 0.25, 0.2], "field derivation.steps[0].shares: must be 4 positive batch fractions "
                                        "summing to 1"),
    ("shares", [0.125, 0.125, 0.375, 0.375], None),  # 1, 1, 3, 3 of 8 samples: whole
    ("shares", [0.1, 0.15, 0.375, 0.375], "field derivation.steps[0].shares: shares[0] = 0.1 is 0.8 samples"),
    ("bucket_mb", -1, "field derivation.steps[0].bucket_mb: must be 0..1048576, got -1"),
    ("bucket_mb", "25", "field derivation.steps[0].bucket_mb: must be a number, got '25'"),
    ("replicas", 2.5, "field derivation.steps[0].replicas: must be an integer, got 2.5"),
    ("scaling", "both", "field derivation.steps[0].scaling: must be one of strong, weak, got 'both'"),
    ("global_batch", 16, "field derivation.steps[0].global_batch: the placement was made for a batch of 16 "
                         "samples, graph 'tm' holds costs for 8"),
    ("x", 1, "field derivation.steps[0].x: not a field of a data-parallel step"),
])
def test_data_parallel_step_errors_name_the_field(field, value, expected):
    """N10, N11: every field checked, the file and the field named, a string never coerced."""
    g = training_model()  # batch 8
    step = {**data_parallel_step(4, "strong", 0.0), field: value}
    if expected is None:
        assert derive(g, {"steps": [step]}, devices=4).meta["data_parallel"]["replica_batch"] == [1, 1, 3, 3]
        return
    assert expected in _recipe_error(g, {"steps": [step]})


def test_split_and_recipe_errors_name_the_field():
    g = training_model()
    assert "field derivation.steps[0].node: graph 'tm' has no node 'ghost'" in _recipe_error(
        g, {"steps": [split_step("ghost", "batch", 2, 0.0)]})
    assert "derivation.steps[1] (split): node 'f' runs on 8 samples, which do not divide into 3 equal parts" in \
        _recipe_error(g, {"steps": [split_step("b", "batch", 2, 0.0), split_step("f", "batch", 3, 0.0)]})
    assert "field derivation.steps[0].transform: unknown transform 'shard'" in _recipe_error(
        g, {"steps": [{"transform": "shard", "n": 2}]})
    assert "field derivation.steps[0].node: missing" in _recipe_error(
        g, {"steps": [{"transform": "split", "dim": "batch", "n": 2}]})
    assert "field derivation.steps: must be a list of steps" in _recipe_error(g, {"steps": {"a": 1}})
    assert "field derivation.steps[0]: must be an object" in _recipe_error(g, {"steps": [3]})
    assert "field derivation.extra: not a field of a derivation" in _recipe_error(g, {"steps": [], "extra": 1})
    assert "field derivation.steps: 1025 steps, at most 1024" in _recipe_error(
        g, {"steps": [split_step("b", "batch", 2, 0.0)] * 1025})
    # base: unknown, repeated and missing members, and a grouping with a cycle (it used to say "graph has a cycle")
    assert "field derivation.base.members[1][0]: 'nope' is not a node of graph 'tm'" in _recipe_error(
        g, {"steps": [], "base": {"members": [["x", "f", "b"], ["nope"]]}})
    assert "field derivation.base.members[1][0]: node 'x' is listed twice" in _recipe_error(
        g, {"steps": [], "base": {"members": [["x", "f", "b"], ["x", "u"]]}})
    assert "field derivation.base.members: does not list node 'u'" in _recipe_error(
        g, {"steps": [], "base": {"members": [["x", "f", "b"]]}})
    assert "field derivation.base.members: this grouping of graph 'tm' has a cycle" in _recipe_error(
        g, {"steps": [], "base": {"members": [["x", "b"], ["f", "u"]]}})


def test_derivation_nested_deeper_than_64_levels_is_refused_when_read():
    """N12: a step field nested 300 levels deep (orjson could not write it back)."""
    p, cl = _dp_placement(training_model())
    deep: list = []
    for _ in range(300):
        deep = [deep]
    doc = p.to_dict()
    doc["derivation"]["steps"][0]["x"] = deep
    with pytest.raises(InvalidInput, match=r"^p.json: field derivation: nested more than 64 levels deep$"):
        Placement.from_dict(doc, "p.json")


def test_every_step_kind_declares_its_fields_size_and_builder():
    for name, kind in STEPS.items():
        assert set(kind.required) <= set(kind.fields), name
        assert callable(kind.size) and callable(kind.build) and kind.hint, name


# ---------------------------------------------------------------- batch: declared, whole samples
def test_no_batch_no_batch_split():
    """Issue 24.1: a graph that does not say its batch has none to split (a single-sample latency
    graph used to get 8 replicas each running 1/8 of one sample)."""
    g = build("lat", [node("a", 4.0, 400), node("b", 4.0, splittable=["batch", "channel"])], [edge("a", "b")])
    cl = uniform(4)
    for algo in ("data-parallel",):
        with pytest.raises(InvalidInput, match=r"graph 'lat' declares no batch size \(meta.batch_size\), so data "
                                               r"parallelism over 4 replicas .* --assume-batch N"):
            registry.place(g, cl, algo)
    with pytest.raises(InvalidInput, match="declares no batch size"):
        registry.place(g, cl, "os-dpos", params={"start": "data-parallel"})
    with pytest.raises(InvalidInput, match="declares no batch size"):
        split_operation(g, "b", "batch", 2)
    assert split_operation(g, "b", "channel", 2).n == 3  # a channel split does not touch the batch
    # os-dpos starts from the DAG and tries only channel splits; it says why it did not replicate
    p = registry.place(g, cl, "os-dpos")
    assert p.estimate["input"] == "dag" and "declares no batch size" in p.estimate["data_parallel_skipped"]
    assert all(s["dim"] == "channel" for s in p.estimate["splits"])
    # weak scaling does not divide the batch: every replica runs the graph's whole step
    assert registry.place(g, cl, "data-parallel", params={"scaling": "weak"}).estimate["replicas"] == 4
    # the user who knows the batch says so; the recipe records it and simulate rebuilds with it
    q = registry.place(g, cl, "data-parallel", params={"assume_batch": 8})
    assert q.derivation["steps"][0]["assume_batch"] == 8 and q.derivation["steps"][0]["global_batch"] == 8
    assert simulate(g, cl, q)["makespan_s"] == pytest.approx(q.estimate["makespan_s"])


def test_a_batch_of_one_cannot_be_split_and_shares_are_whole_samples():
    """New user: data-parallel on a batch-1 graph said "graph has a cycle"; a batch of 10 on 4
    replicas is shared 3, 3, 2, 2 (recorded as shares) instead of 2.5 samples each."""
    g = build("b1", [node("a", 4.0, 400), node("b", 4.0)], [edge("a", "b")], meta={"batch_size": 1})
    with pytest.raises(InvalidInput, match=r"^data-parallel over 4 replicas: the batch of 1 sample cannot be "
                                           r"split 4 ways: every part needs at least one whole sample$"):
        registry.place(g, uniform(4), "data-parallel")
    g10 = build("b10", [node("a", 4.0, 400), node("b", 4.0)], [edge("a", "b", 100)], meta={"batch_size": 10})
    cl = uniform(4, bandwidth=100.0, latency=0.0)
    p = registry.place(g10, cl, "data-parallel", params={"overhead_s": 0.0})
    step = p.derivation["steps"][0]
    assert step["shares"] == [0.3, 0.3, 0.2, 0.2] and step["global_batch"] == 10
    assert derive(g10, p.derivation).meta["data_parallel"]["replica_batch"] == [3, 3, 2, 2]
    # the slowest replica runs 3 of 10 samples: 0.3 x (4 + 4) = 2.4 s (not 8 / 4 = 2 s)
    rep = simulate(g10, cl, p)
    assert rep["makespan_s"] == pytest.approx(2.4) == p.estimate["makespan_s"]
    # the same recipe without its shares rebuilds the same whole-sample split
    bare = copy.deepcopy(p)
    del bare.derivation["steps"][0]["shares"]
    assert simulate(g10, cl, bare)["makespan_s"] == pytest.approx(2.4)
    # a placement made for another batch is refused, naming the field
    g12 = build("b10", [node("a", 4.0, 400), node("b", 4.0)], [edge("a", "b", 100)], meta={"batch_size": 12})
    with pytest.raises(InvalidInput, match=r"field derivation.steps\[0\].global_batch: the placement was made for "
                                           r"a batch of 10 samples, graph 'b10' holds costs for 12"):
        simulate(g12, cl, p)


def test_batch_splits_need_equal_whole_samples():
    g = training_model()  # batch 8
    assert split_operation(g, "b", "batch", 4).n > g.n
    with pytest.raises(InvalidInput, match="node 'b' runs on 8 samples, which do not divide into 3 equal parts"):
        split_operation(g, "b", "batch", 3)
    # a replica node runs on its replica's samples: 8 / 2 = 4, which 4 divides and 8 does not
    d = data_parallel_graph(g, 2)
    assert split_operation(d, "b/rep0", "batch", 4).n > d.n
    with pytest.raises(InvalidInput, match="node 'b/rep1' runs on 4 samples, which do not divide into 8"):
        split_operation(d, "b/rep1", "batch", 8)


# ---------------------------------------------------------------- N13: data parallelism of a coarse graph
@pytest.mark.slow  # 8 replicas of the zoo transformer; tests/cli/test_derived_cases.py checks N13 in the default suite
def test_data_parallel_of_a_coarse_transformer_is_refused_not_answered_without_an_all_reduce():
    """N13 (hand-checked): data-parallel on the cpd-coarse transformer gave 0.5113 s with 0 transfers
    (coarse nodes hid the optimizer updates, so no gradient was all-reduced); the honest answer is the
    data-parallel graph of the original: 0.5456 s with 7,056 transfers (explicit ring steps; 0.5305 s with
    the default nccl collectives, issue 34).  The coarse input and a derivation.base regrouping the original
    are refused the same way."""
    from celeritas_cli.model.io import load_cluster, load_graph

    from ..conftest import SAMPLES

    g = load_graph(str(SAMPLES / "zoo" / "transformer.json.gz"))
    cl = load_cluster("8xA100-nvswitch")
    coarse = registry.coarsen(g, cl, "cpd")
    with pytest.raises(InvalidInput, match="is coarse: its nodes group operators"):
        registry.place(coarse, cl, "data-parallel")
    honest = registry.place(g, cl, "data-parallel", params={"collectives": "ring"})
    rep = simulate(g, cl, honest)
    assert rep["makespan_s"] == pytest.approx(0.5456, abs=5e-5) and rep["transfers"]["count"] == 7056
    assert simulate(g, cl, registry.place(g, cl, "data-parallel"))["makespan_s"] == pytest.approx(0.5305, abs=5e-5)
    forged = copy.deepcopy(honest)
    forged.derivation["base"] = {"graph": coarse.name, "members": [coarse.original_ids(v) for v in range(coarse.n)]}
    with pytest.raises(InvalidInput, match=r"^p.json: derivation.steps\[0\] \(data-parallel\): graph "
                                           r"'transformer_b256@cpd' is coarse"):
        simulate(g, cl, forged, label="p.json")


# ---------------------------------------------------------------- auto and compare
def test_auto_leaves_data_parallelism_out_of_a_graph_without_a_batch_and_says_why(tmp_path):
    from click.testing import CliRunner

    from celeritas_cli.cli import main
    from celeritas_cli.model.jsonio import write_json
    from celeritas_cli.optimize.portfolio import batch_split_refusal, plan

    g = build("lat", [node("a", 1.0), node("b", 10.0), node("c", 10.0), node("d", 1.0)],
              [edge("a", "b", 1), edge("a", "c", 1), edge("b", "d", 1), edge("c", "d", 1)])
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    why = batch_split_refusal(g, cl)
    assert "declares no batch size" in why and batch_split_refusal(g, cl, assume_batch=2) is None
    assert not any(s.algo == "data-parallel" or s.on for s, _ in plan(g, cl, 1000, split_batch=False))
    path = tmp_path / "lat.json"
    write_json(g.to_dict(), path)
    write_json(cl.to_dict(), tmp_path / "c.json")
    r = CliRunner().invoke(main, ["place", str(path), "-c", str(tmp_path / "c.json"), "-p", "evaluations=40"])
    assert r.exit_code == 0, r.output
    left_out = [ln for ln in r.stderr.splitlines() if ln.startswith("auto: data parallelism left out: ")]
    assert len(left_out) == 1 and "graph 'lat' declares no batch size" in left_out[0]
    # told the batch, auto replicates (each replica on half of it: 0.5 + 5 + 5 + 0.5 s, the best here)
    r = CliRunner().invoke(main, ["place", str(path), "-c", str(tmp_path / "c.json"), "-p", "evaluations=40",
                                  "--assume-batch", "2", "--no-timings"])
    assert r.exit_code == 0 and "data parallelism left out" not in r.stderr
    import orjson

    doc = orjson.loads(r.stdout)
    assert doc["estimate"]["winner"].startswith("data-parallel")
    assert doc["derivation"]["steps"][0]["assume_batch"] == 2
    rep = CliRunner().invoke(main, ["simulate", str(path), "-P", "-", "-c", str(tmp_path / "c.json")], input=r.stdout)
    assert rep.exit_code == 0 and orjson.loads(rep.stdout)["makespan_s"] == pytest.approx(
        doc["estimate"]["makespan_s"])
    # compare passes --assume-batch to the algorithms that split the batch
    c = CliRunner().invoke(main, ["compare", str(path), "-c", str(tmp_path / "c.json"), "--algos",
                                  "data-parallel,heft", "--assume-batch", "2", "--format", "json", "--no-progress"])
    rows = [orjson.loads(x) for x in c.stdout.splitlines() if x.strip()]
    assert c.exit_code == 0 and {r["algorithm"]: r.get("status") for r in rows}["data-parallel"] in ("OK", "FEASIBLE")


def test_replicating_a_micro_batched_graph_needs_whole_samples_per_micro_batch():
    from celeritas_cli.transform.microbatch import microbatch_graph

    g = training_model()  # batch 8
    assert data_parallel_graph(microbatch_graph(g, 2), 2).meta["data_parallel"]["replica_batch"] == 4  # 4 + 4 -> 2 + 2
    with pytest.raises(InvalidInput, match=r"the micro-batches \[3, 3, 2\] of graph 'tm\+mb3' do not divide into "
                                           r"2 equal shares of whole samples"):
        data_parallel_graph(microbatch_graph(g, 3), 2)
