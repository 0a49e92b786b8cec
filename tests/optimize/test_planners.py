"""auto's planner members (optimize/planners.py): the pipeline planner joins
the portfolio with a budget of its own, runs first when a data-parallel
replica cannot fit, wins where only a pipeline fits memory, and auto names
the winner's plan in words."""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.optimize.planners import PLAN_SHARE
from celeritas_cli.optimize.portfolio import plan
from celeritas_cli.sim.describe import describe_placement
from celeritas_cli.sim.simulator import simulate

from ..pipelining.pipeline_graphs import layer_chain


def tight():
    """Four layers of 1,000 bytes of parameters (2,000 of optimizer state,
    1,000 of gradient) on two devices of 10,000 bytes: a data-parallel
    replica holds all 16,000 bytes of state (OOM), two pipeline stages hold
    half each."""
    return layer_chain(4, tf=4.0, tb=8.0, act=400, params=1000, grad=1000, batch=8), \
        uniform(2, memory=10_000, bandwidth=1e9, latency=1e-6)


def test_pipeline_joins_with_its_share_and_runs_first_when_memory_is_tight():
    g, c = tight()
    specs = plan(g, c, 1000)
    names = [s.name for s, _ in specs]
    first = names.index("metis(weights=memory)") + 1  # a replica does not fit: the planners that shard or cut first
    assert names[first:first + 2] == ["fsdp", "pipeline"]
    assert "data-parallel" not in names  # every replica would hold the 16,000 bytes of state: left out
    assert dict((s.name, x) for s, x in specs)["pipeline"] == PLAN_SHARE * 1000 - 1
    roomy = uniform(2, memory=2**40)
    names = [s.name for s, _ in plan(g, roomy, 1000)]
    assert names.index("pipeline") > names.index("data-parallel")


def test_pipeline_left_out_when_its_share_pays_for_no_plan():
    g, c = tight()
    skipped: list = []
    specs = plan(g, c, 20, skipped=skipped)
    assert "pipeline" not in [s.name for s, _ in specs]
    assert any(name == "pipeline" and "cannot pay for its model and one plan" in why for name, why in skipped)


def test_auto_answers_a_sharded_or_pipelined_plan_where_a_replica_cannot_fit_and_says_it():
    g, _ = tight()
    # 12,000 bytes: fsdp's peak is 11,400 (its prefetch runs a gather ahead of the compute, as FSDP's rate limiter
    # allows: the nccl form on its own stream); a data-parallel replica still holds 16,000
    c = uniform(2, memory=12_000, bandwidth=1e9, latency=1e-6)
    dp = registry.place(g, c, "data-parallel")
    assert dp.estimate["status"] == "OOM"
    p = registry.place(g, c, "auto", params={"evaluations": 600, "quiet": True})
    # fsdp shards the 16,000 bytes of state over the two replicas and splits the 48 s of work evenly (24 s plus
    # the collectives' latencies); no pipeline of 2 stages beats it (its bubble), no placement fits faster
    assert p.estimate["status"] == "FEASIBLE" and p.estimate["winner"] == "fsdp"
    assert 24.0 < p.estimate["makespan_s"] < 24.001
    assert p.estimate["plan"].startswith("sharded data parallelism (ZeRO stage 3, FSDP): 2 replicas of ")
    assert p.estimate["makespan_s"] <= registry.place(g, c, "fsdp").estimate["makespan_s"]
    p = registry.place(g, c, "auto", params={"evaluations": 600, "quiet": True, "algos": "metis,pipeline"})
    assert p.estimate["status"] == "FEASIBLE"
    assert p.estimate["winner"] == "pipeline"
    rep = simulate(g, c, p)
    assert rep["status"] == "OK" and rep["makespan_s"] == p.estimate["makespan_s"]
    words = describe_placement(p, g, c)
    assert words.startswith("2-stage ") and "micro-batch" in words and "stages 2xV100" in words
    assert p.estimate["plan"] == words  # estimate names the plan in words


def test_auto_named_pipeline_member_runs_and_is_never_worse_than_it():
    g = layered(60, seed=2)
    c = uniform(2)
    p = registry.place(g, c, "auto", params={"algos": "pipeline", "evaluations": 400, "quiet": True})
    row = registry.place(g, c, "pipeline", params={"evaluations": int(PLAN_SHARE * 400 - 1)})
    assert p.estimate["candidates"][0]["name"] == "pipeline"
    assert p.estimate["makespan_s"] <= row.estimate["makespan_s"] * (1 + 1e-9)


def test_fsdp_is_charged_as_data_parallel_scaled_by_the_built_graphs_sizes():
    from celeritas_cli.optimize.planners import fsdp_charge
    from celeritas_cli.transform.fsdp import fsdp_graph
    from celeritas_cli.transform.replicate import data_parallel_graph

    g = layered(60, seed=1)
    # one replica of each, as the symmetric judge builds them
    f, d = fsdp_graph(g, 4, 3, represent=[0]), data_parallel_graph(g, 4, bucket_mb=25.0, represent=[0])
    assert fsdp_charge(g, 4, 12.0) == 12.0 * (f.n + f.m) / (d.n + d.m)
    assert fsdp_charge(g, 4, 12.0) > 12.0  # per-unit gathers and reduce-scatters: more nodes than DDP's buckets


def test_fsdp_member_sized_and_proportional_first_on_mixed_devices():
    from celeritas_cli.model.io import load_cluster
    from celeritas_cli.optimize.planners import fsdp_charge
    from celeritas_cli.optimize.portfolio import member_cost
    from celeritas_cli.optimize.runner import Spec

    g = layered(60, seed=1)
    c = load_cluster("moirai-intra-server")  # 2xV100 + 2xP100
    specs = plan(g, c, 4000)
    names = [s.name for s, _ in specs]
    assert names.index("fsdp(shares=proportional)") + 1 == names.index("fsdp")
    charge = fsdp_charge(g, 4, member_cost(Spec("fsdp"), 4))
    assert dict((s.name, x) for s, x in specs)["fsdp"] == pytest.approx(charge, rel=1e-12)
    skipped: list = []
    # a budget whose member share cannot pay for it leaves it out, saying so
    names = [s.name for s, _ in plan(g, c, 2 * charge, skipped=skipped)]
    assert "fsdp" not in names and any(n == "fsdp" and "over its share" in why for n, why in skipped)
