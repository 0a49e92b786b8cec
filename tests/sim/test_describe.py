"""A placement's plan in words (``sim/describe.py``): the new user read
``transformer_b256+dp4`` and 3,000+ nodes per device for a 1,300-node graph
without being told the answer is data parallelism (issue 24)."""

from __future__ import annotations

from collections import Counter

import orjson
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.sim.describe import DESCRIBERS, Context, describe, describe_placement

from ..conftest import SAMPLES

G60 = str(SAMPLES / "layered_60.json")


def _all_reduce_nodes(d):
    return sum(1 for v in range(d.n) if (d.node_extra[v] or {}).get("allreduce") is not None)


def test_data_parallel_plan_counts_replicas_and_all_reduce_nodes():
    """The symmetric plan (replica 0's nodes + the replica map, sim/symmetric.py) is described as the whole
    plan: the all-reduce count is cross-checked against its expanded derived graph's own collective nodes
    (one per replica and bucket), and the ring form's against its ring steps."""
    from celeritas_cli.sim.symmetric import expand
    from celeritas_cli.transform.derivation import derive

    g = layered(80, seed=1)
    c = uniform(4, memory=2**40)
    p = registry.place(g, c, "data-parallel")
    assert p.replicas is not None and p.derived is None
    text = describe_placement(p, g, c)
    assert text.startswith(f"data parallelism: 4 replicas of {g.name}, 80 nodes each, each on 1/4 of the batch")
    assert "all-reduce of the gradients in 25 MiB buckets (NCCL)" in text
    full = expand(g, c, p)
    d = derive(g, full.derivation, devices=c.k)
    assert set(full.assignment) == set(d.ids)
    rings = _all_reduce_nodes(d)
    assert rings == sum(1 for op in d.op if op == "collective.all-reduce") > 0
    assert f"({rings // 4:,} all-reduce nodes per replica)" in text
    assert d.n == 4 * 80 + rings
    full.derived = d  # the same plan listing every node reads the same
    assert describe_placement(full, g, c) == text
    # the explicit ring form: reduce-scatter, all-gather and result steps per bucket, counted the same way
    ring = registry.place(g, c, "data-parallel", params={"collectives": "ring"})
    d = ring.derived_graph
    text = describe_placement(ring, g, c)
    rings = _all_reduce_nodes(d)
    assert f"({rings // 4:,} all-reduce nodes per replica)" in text and rings > 4 * 4
    assert d.n == 4 * 80 + rings


def test_operator_placement_and_single_device():
    g = layered(60, seed=1)
    c = uniform(4)
    one = registry.place(g, c, "single-device")
    assert describe_placement(one, g, c) == f"single device: all 60 nodes of {g.name} on gpu0"
    p = registry.place(g, c, "metis")
    text = describe_placement(p, g, c)
    counts = [int(x.split()[-1]) for x in text.split("(")[1].rstrip(")").split(", ")]
    assert text.startswith(f"operator placement: 60 nodes of {g.name} over ") and sum(counts) == 60


def test_splits_micro_batches_and_unknown_transforms_are_named():
    steps = [{"transform": "split", "node": "a", "dim": "batch", "n": 2},
             {"transform": "split", "node": "b", "dim": "channel", "n": 4},
             {"transform": "microbatch", "m": 4, "global_batch": 64, "micro_batches": [16, 16, 16, 16]},
             {"transform": "recompute", "nodes": ["a", "b", "c"]},
             {"transform": "fsdp-to-come", "stage": 3}]
    text = describe({"steps": steps}, Context("g", 10))
    assert text == ("operator splitting: 2 operations of g split into 2-4 parts (batch 1, channel 1); "
                    "4 micro-batches of 16 samples (global batch 64) of g, gradients accumulated; "
                    "recomputation: 3 forward nodes run again in the backward pass instead of kept; "
                    "fsdp-to-come (1 step)")


def test_a_new_transform_plugs_in_one_function():
    DESCRIBERS["pipeline-test"] = lambda steps, ctx: f"{steps[0]['stages']}-stage pipeline of {ctx.name}"
    try:
        assert describe({"steps": [{"transform": "pipeline-test", "stages": 4}]}, Context("m", 5)) == \
            "4-stage pipeline of m"
    finally:
        del DESCRIBERS["pipeline-test"]


def test_simulate_table_says_the_plan(tmp_path):
    p = tmp_path / "p.json"
    g = layered(40, seed=2)
    gpath = tmp_path / "g.json"
    gpath.write_bytes(orjson.dumps(g.to_dict()))
    r = CliRunner().invoke(main, ["place", str(gpath), "--algo", "data-parallel", "-o", str(p)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["simulate", str(gpath), "-P", str(p), "--format", "table"])
    assert r.exit_code == 0, r.output
    assert f"plan: data parallelism: 4 replicas of {g.name}, 40 nodes each" in r.stdout
    r = CliRunner().invoke(main, ["place", G60, "-p", "evaluations=30"])
    assert "auto: the plan: " in r.stderr


def test_the_pipeline_steps_read_as_their_builders_write_them():
    from celeritas_cli.transform.microbatch import microbatch_step
    from celeritas_cli.transform.recompute import recompute_step

    steps = [microbatch_step(3, 10, [4, 3, 3], 0.0), recompute_step(["x", "y"])]
    assert describe({"steps": steps}, Context("m", 7)) == (
        "3 micro-batches of 3-4 samples (global batch 10) of m, gradients accumulated; "
        "recomputation: 2 forward nodes run again in the backward pass instead of kept")


def test_dpos_on_the_data_parallel_graph_is_not_called_data_parallelism():
    """auto's dpos@data-parallel member places the replicas' operators across devices; its words said
    "data parallelism: 8 replicas" (issue 33.3).  The words follow the assignment: replicas spread over
    several devices, counted here from the derived graph's own replica field."""
    from celeritas_cli.model.costs import cost_model
    from celeritas_cli.optimize.runner import Runner, Spec
    from celeritas_cli.sim.symmetric import expand

    g, c = layered(80, seed=1), uniform(4, memory=2**40)
    # dpos places the data-parallel graph with its all-reduces as ring steps (optimize/runner.py)
    p = Runner(g, c, cost_model(g, c)).run(Spec("dpos", on="data-parallel")).placement
    assert p.derivation["steps"][-1]["collectives"] == "ring" and p.replicas is None
    text = describe_placement(p, g, c)
    assert not text.startswith("data parallelism") and "data parallelism:" not in text
    assert text.startswith(f"operator placement over a data-parallel graph of 4 replicas of {g.name}, 80 nodes each")
    split = sum(1 for devs in _homes(p).values() if len(devs) > 1)
    assert split > 0 and f"{split} of the 4 replicas spread over several devices" in text
    counts = sorted(Counter(p.assignment.values()).values())
    assert text.endswith(f"{counts[0]:,}-{counts[-1]:,} nodes per device")
    p.derived = None  # a placement read back from a file: the node ids say the replicas, the same words
    assert describe_placement(p, g, c) == text
    # the data-parallel row itself, symmetric: every replica whole on a device of its own, as its expansion
    sym = registry.place(g, c, "data-parallel")
    words = describe_placement(sym, g, c)
    assert words.startswith("data parallelism: 4 replicas") and words == describe_placement(expand(g, c, sym), g, c)


def _homes(p) -> dict[int, set[str]]:
    """Replica -> the devices its nodes run on, from the derived graph's own replica field."""
    d = p.derived
    homes: dict[int, set[str]] = {}
    for v in range(d.n):
        homes.setdefault(d.node_extra[v]["replica"], set()).add(p.assignment[d.ids[v]])
    return homes
