"""placer's ``pipeline`` planner and the peers' rows (``gpipe``,
``pipedream``, ``alpa-stages``): their dynamic programs against brute
force, the model's cut against every cut, hand-computed plans on tiny
chains, parameters and one-line errors."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.pipelines import alpa_stages, pipedream
from celeritas_cli.algorithms.pipelines.model import Model, Shape
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.pipelining.layers import LayerSequence, block_partition
from celeritas_cli.pipelining.schedules import ONE_F_ONE_B
from celeritas_cli.sim.simulator import simulate

from ..conftest import SAMPLES
from ..pipelining.pipeline_graphs import layer_chain


# ------------------------------------------------------------------ PipeDream


def _pipedream_brute(compute, act, params, out_act, N, bw, memory):
    """Every split of the chain into stages and every replication (all N
    workers used), scored as PipeDream's DP scores them."""
    L = len(compute)
    best = None
    for S in range(1, min(L, N) + 1):
        for cuts in itertools.combinations(range(1, L), S - 1):
            firsts = [0, *cuts]
            for reps in itertools.product(range(1, N + 1), repeat=S):
                if sum(reps) != N:
                    continue
                slowest, used, ok = 0.0, 0, True
                for s in range(S):
                    a, b = firsts[s], (firsts[s + 1] if s + 1 < S else L)
                    m = reps[s]
                    used += m
                    w = sum(params[a:b])
                    if math.ceil((N - used) / m) * (sum(act[a:b]) + w) > memory:
                        ok = False
                        break
                    t = (sum(compute[a:b]) + 4 * (m - 1) * w / (bw * m)) / m
                    if s > 0:
                        t = max(t, 2.0 * out_act[a - 1] / (bw * m))
                    slowest = max(slowest, t)
                if ok and (best is None or slowest < best - 1e-12):
                    best = slowest
    return best


@pytest.mark.parametrize("seed", range(6))
def test_pipedream_dp_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    L, N = rng.randint(2, 5), rng.randint(1, 4)
    compute = [rng.uniform(0.5, 3.0) for _ in range(L)]
    act = [rng.uniform(0, 4e9) for _ in range(L)]
    params = [rng.choice([0.0, rng.uniform(0, 8e9)]) for _ in range(L)]
    out_act = [rng.uniform(0, 2e9) for _ in range(L)]
    memory = rng.choice([1e18, 2e10])
    got = pipedream.plan(compute, act, params, out_act, N, 1e10, memory)
    want = _pipedream_brute(compute, act, params, out_act, N, 1e10, memory)
    if want is None:
        assert got is None
    else:
        assert got[0] == pytest.approx(want)
        assert sum(got[2]) == N


# ---------------------------------------------------------------------- Alpa


def _alpa_brute(t_intra, L, D, B):
    best = None
    sizes = alpa_stages.submeshes(D)
    for S in range(1, min(L, D) + 1):
        for cuts in itertools.combinations(range(1, L), S - 1):
            firsts = [0, *cuts]
            for devs in itertools.product(sizes, repeat=S):
                if sum(devs) != D:
                    continue
                ts = [t_intra(firsts[s], (firsts[s + 1] if s + 1 < S else L) - 1, devs[s], S - s) for s in range(S)]
                if any(math.isinf(x) for x in ts):
                    continue
                total = sum(ts) + (B - 1) * max(ts)
                best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_alpa_inter_op_dp_is_the_brute_force_optimum(seed):
    rng = random.Random(100 + seed)
    L, D, B = rng.randint(2, 5), rng.choice([1, 2, 4]), rng.choice([1, 4, 16])
    work = [rng.uniform(0.2, 2.0) for _ in range(L)]
    mem = [rng.uniform(0, 1.0) for _ in range(L)]

    def t(k, i, n, s):
        if sum(mem[k:i + 1]) * (1 + 0.3 * s) / n > 1.6:  # memory: s micro-batches' activations in flight
            return math.inf
        return sum(work[k:i + 1]) / n + 0.05 * (n - 1)

    got = alpa_stages.solve(t, L, D, B)
    want = _alpa_brute(t, L, D, B)
    if want is None:
        assert got is None
    else:  # Algorithm 1 skips t_max within 0.5 % of the last one tried
        assert want <= got[0] <= want * alpa_stages.T_MAX_STEP ** 2 + 1e-12


# --------------------------------------------------------------------- model


@pytest.mark.parametrize("seed", range(3))
def test_model_cut_is_the_best_min_max_cut(seed):
    """The bisection + greedy cut meets the least largest stage time any
    contiguous cut meets (here without memory limits)."""
    g = layered(40, seed=seed)
    c = uniform(3)
    seq = LayerSequence(g, c, order="cpd")
    model = Model(seq, c, 64)
    shape = Shape(((0,), (1,), (2,)), 4, ONE_F_ONE_B, "off")
    plan = model.cut(shape)
    best = min(max(model.stage_time(shape, j, a, b, False) for j, (a, b) in enumerate(zip((0, *cuts), (*cuts, seq.n))))
               for cuts in itertools.combinations(range(1, seq.n), 2))
    assert max(plan.stage_time) <= best * (1 + 1e-3)


def test_model_of_a_three_stage_chain_by_hand():
    """Three stages of one layer each (forward 4, backward 8 on the whole
    batch of 4), m = 4 micro-batches of one sample: each stage takes
    1 + 2 s (+ overheads) per micro-batch, so T = 3 x 3 + 3 x 3 = 18 s with
    free links, the pipeline of issue 22's hand test."""
    g = layer_chain(3, tf=4.0, tb=8.0, act=0, batch=4)
    c = uniform(3, bandwidth=1e18, latency=0.0)
    seq = LayerSequence(g, c, order="topo")
    model = Model(seq, c, 4)
    plan = model.evaluate(Shape(((0,), (1,), (2,)), 4, ONE_F_ONE_B, "off"), [0, 2, 3], [False] * 3)
    assert plan.time_s == pytest.approx(18.0, rel=1e-4)
    sim = registry.place(g, c, "pipeline", params={"stages": 3, "replicas": 1, "microbatches": 4,
                                                   "schedule": "1f1b", "order": "topo", "evaluations": 200})
    assert sim.estimate["makespan_s"] == pytest.approx(18.0, rel=1e-3)


# ------------------------------------------------------------------ the rows


def test_gpipe_cuts_by_torchgpipe_block_partition_of_forward_times():
    g = layered(60, seed=2)
    c = uniform(3)
    p = registry.place(g, c, "gpipe", params={"assume_batch": 24})
    seq = LayerSequence(g, c, order="topo")
    t = seq.times(1.0)
    fwd = [t.fwd[0][i + 1] - t.fwd[0][i] for i in range(seq.n)]
    cuts = block_partition(fwd, 3)
    assert p.estimate["balance"] == [b - a for a, b in zip(cuts, cuts[1:] + [seq.n])]
    assert p.estimate["schedule"] == "gpipe" and p.estimate["microbatches"] == 12
    assert p.estimate["recomputed"] > 0  # except_last: every micro-batch but the last
    rep = simulate(g, c, p)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"])


def test_pipedream_reports_its_asynchronous_time_apart_from_the_step():
    g = layered(60, seed=4)
    c = uniform(2)
    p = registry.place(g, c, "pipedream", params={"assume_batch": 32})
    e = p.estimate
    assert e["async_batch_s"] == pytest.approx(e["async_minibatch_s"] * 8)
    assert e["makespan_s"] == pytest.approx(simulate(g, c, p)["makespan_s"])
    assert e["makespan_s"] != e["async_batch_s"]


@pytest.mark.parametrize("algo", ["pipeline", "gpipe", "pipedream", "alpa-stages"])
def test_rows_refuse_a_graph_without_a_batch(algo):
    g = layered(30, seed=1)
    g.meta.pop("batch_size", None)
    with pytest.raises(InvalidInput, match="batch"):
        registry.place(g, uniform(2), algo)


@pytest.mark.parametrize("algo", ["pipeline", "gpipe", "pipedream", "alpa-stages"])
def test_rows_refuse_a_coarse_graph(algo):
    """Coarse nodes mix per-sample work, gradients and updates: micro-batches
    would repeat updates and replicas lose their all-reduce."""
    c = uniform(2)
    coarse = registry.coarsen(layered(200, seed=1), c, "cpd")
    with pytest.raises(InvalidInput, match="is coarse.*pipeline the original graph"):
        registry.place(coarse, c, algo)


@pytest.mark.parametrize("params, match", [
    ({"stages": 3, "replicas": 2}, "need 6 devices"),
    ({"groups": "gpu0,gpu1|gpu2"}, "same number of devices"),
    ({"groups": "gpu0|gpu9"}, "unknown device 'gpu9'"),
    ({"groups": "gpu0|gpu1", "stages": 3}, "disagree"),
    ({"microbatches": 100}, "the batch is 32"),
])
def test_pipeline_parameters_that_cannot_go_together(params, match):
    with pytest.raises(InvalidInput, match=match):
        registry.place(layered(30, seed=1), uniform(4), "pipeline", params={"assume_batch": 32, **params})


GiB = 2**30


@pytest.mark.parametrize("batch, cluster, params, match", [
    # issue 33 J4: interleaving with m not a multiple of p (Megatron-LM's rule)
    (8, uniform(4), {"stages": 4, "replicas": 1, "microbatches": 6, "schedule": "interleaved"},
     r"keeps the parameters: the interleaved 1F1B schedule needs the number of micro-batches \(6\) to be a "
     r"multiple of the pipeline ranks \(4\).*\(m % p == 0\)"),
    # D9: interleaving needs two ranks
    (8, uniform(4), {"stages": 1, "schedule": "interleaved"}, "needs at least 2 pipeline ranks.*got 1"),
    # D9: 4 replicas of a batch of 7 (data-parallel takes unequal shares; a replicated pipeline does not)
    (7, uniform(4), {"replicas": 4}, "a micro-batch of 7 samples does not split into 4 equal replica shares"),
    # J4: every plan over memory (1 GiB devices, 10 GiB of activations per micro-batch)
    (4, uniform(4, memory=GiB), {"stages": 4, "replicas": 1, "microbatches": 4, "schedule": "gpipe",
                                  "recompute": "off"},
     r"no plan of graph 'chain4' on cluster '.*' fits memory: .* without recomputation \(-p recompute=off\)"),
    (4, uniform(4, memory=GiB), {"stages": 4, "microbatches": 4}, "fits memory: .* even with activation recomputation"),
])
def test_pipeline_names_the_contradiction_not_the_budget(batch, cluster, params, match):
    g = layer_chain(4, act=40 * GiB, batch=batch)
    with pytest.raises(InvalidInput, match=match) as err:
        registry.place(g, cluster, "pipeline", params={"evaluations": 100000, **params})
    assert "budget" not in str(err.value) and "\n" not in str(err.value)


def test_placer_place_names_megatrons_rule_in_one_line(tmp_path):
    import json

    from click.testing import CliRunner

    from celeritas_cli.cli import main

    (tmp_path / "g.json").write_text(json.dumps(layer_chain(8, batch=8).to_dict()))
    (tmp_path / "c.json").write_text(json.dumps(uniform(4).to_dict()))
    res = CliRunner().invoke(main, ["place", str(tmp_path / "g.json"), "-c", str(tmp_path / "c.json"), "--algo",
                                    "pipeline", "-p", "stages=4", "-p", "replicas=1", "-p", "microbatches=6", "-p",
                                    "schedule=interleaved", "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and "m % p == 0" in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_pipeline_honours_fixed_choices_and_is_deterministic():
    g = layered(60, seed=5)
    c = uniform(4)
    params = {"assume_batch": 32, "stages": 2, "microbatches": 4, "schedule": "gpipe", "recompute": "off",
              "evaluations": 300}
    a = registry.place(g, c, "pipeline", params=params)
    b = registry.place(g, c, "pipeline", params=params)
    e = a.estimate
    assert (e["pipeline_devices"], e["replicas"], e["microbatches"], e["schedule"]) == (2, [2, 2], 4, "gpipe")
    assert e["recomputed_stages"] == []
    assert a.assignment == b.assignment and a.order == b.order
    assert e["makespan_s"] == pytest.approx(simulate(g, c, a)["makespan_s"])
    fixed = registry.place(g, c, "pipeline", params={"assume_batch": 32, "groups": "gpu3|gpu2", "evaluations": 300})
    assert set(fixed.assignment.values()) == {"gpu2", "gpu3"}


def test_pipeline_gives_up_before_building_when_its_model_cannot_come_near():
    g = layered(60, seed=5)
    c = uniform(2)
    with pytest.raises(InvalidInput, match="gave up.*nothing was built"):
        registry.place(g, c, "pipeline", params={"assume_batch": 32, "beat_s": 1e-9})
    p = registry.place(g, c, "pipeline", params={"assume_batch": 32, "beat_s": 1e3, "evaluations": 200})
    assert p.estimate["status"] == "FEASIBLE"


def test_placer_place_and_simulate_say_the_plan_in_words(tmp_path):
    """The placement file carries the plan's fields; simulate rebuilds the
    derived graph from the recipe, reproduces the makespan and says the plan."""
    from click.testing import CliRunner

    from celeritas_cli.cli import main

    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["place", str(SAMPLES / "layered_60.json"), "--algo", "pipeline", "-p", "stages=2",
                                    "-p", "replicas=2", "-p", "microbatches=4", "-p", "schedule=1f1b",
                                    "-p", "evaluations=200", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    table = CliRunner().invoke(main, ["simulate", str(SAMPLES / "layered_60.json"), "-P", str(out), "--format",
                                      "table"])
    assert table.exit_code == 0, table.output
    assert "2-stage 1F1B x 2 replicas, 4 micro-batches each" in " ".join(table.stdout.split())
    for algo in ("gpipe", "pipedream", "alpa-stages"):
        p = registry.place(layered(60, seed=1), uniform(2), algo)
        assert p.estimate["plan"] and "micro-batch" in p.estimate["plan"]
