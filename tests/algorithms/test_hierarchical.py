"""The Hierarchical Planner (``place --algo hierarchical``): features, network
shapes, the OOM penalty, colocation, determinism and learning on a graph
whose optimum is known."""

from __future__ import annotations

import math
import sys

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.placers.hierarchical import planner as H
from celeritas_cli.transform.contract import contract
from celeritas_cli.errors import InvalidInput, MissingDependency
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node

torch = pytest.importorskip("torch")
from celeritas_cli.algorithms.placers.hierarchical import model as hm  # noqa: E402

pytestmark = pytest.mark.torch

QUICK = {"iterations": 5, "samples_per_iteration": 2, "hidden": 16, "progress": False, "time_limit": 0.0}


def two_chains(length=10, nbytes=10):
    """Two independent chains of unit-time ops (chain a: mm, chain b: conv);
    a 10-byte tensor takes 0.1 s at 100 B/s.  On 2 devices the optimum is
    one chain per device: makespan = length (nothing else reaches it:
    any other placement either serialises > length ops on a device or adds
    a transfer on a chain)."""
    nodes, edges = [], []
    for c, op in (("a", "mm"), ("b", "conv")):
        for i in range(length):
            nodes.append(node(f"{c}{i}", 1.0, op=op))
            if i:
                edges.append(edge(f"{c}{i - 1}", f"{c}{i}", nbytes))
    return build("two_chains", nodes, edges)


def test_registered_with_torch_extra():
    entry = registry.get("hierarchical")
    assert entry.extra == "torch"
    assert {"groups", "iterations", "samples_per_iteration", "time_limit", "lr"} <= set(entry.params)
    assert entry.params["time_limit"].default == 60.0
    assert entry.quick_params["iterations"] <= 10


def test_op_features_values():
    # a has two output tensors (400 B and 100 B), three successors
    g = build("f", [node("a", 2.0, mem=8, op="mm"), node("b", 1.0, op="relu"), node("c", 1.0, op="relu"),
                    node("d", 4.0, mem=4, op="add")],
              [edge("a", "b", 400, tensor="x"), edge("a", "c", 100, tensor="y"), edge("a", "d", 400, tensor="x"),
               edge("b", "d", 100), edge("c", "d", 100)])
    f = H.op_features(g)
    assert f["types"] == ["add", "mm", "relu"]
    assert f["type_idx"] == [1, 2, 2, 0]
    assert all(len(r) == H.SIZE_DIM for r in f["size"]) and all(len(r) == H.ADJ_DIM for r in f["adj"])
    sa = f["size"][0]
    assert sa[0] == pytest.approx(1.0)  # largest tensor of the graph
    assert sa[1] == pytest.approx(math.log1p(100) / math.log1p(400))
    assert sa[2:H.MAX_OUTPUTS] == [0.0] * (H.MAX_OUTPUTS - 2)
    assert sa[H.MAX_OUTPUTS] == 1.0  # 2 outputs, the most of any node
    assert sa[H.MAX_OUTPUTS + 1] == pytest.approx(0.5)  # compute 2 / 4
    assert sa[H.MAX_OUTPUTS + 2] == 1.0  # memory 8 / 8
    assert sa[H.MAX_OUTPUTS + 3] == pytest.approx(0.25)  # first of 4 in topological order
    # d: no outputs, three predecessors (a, b, c at positions 1/4, 2/4, 3/4), marked -1
    assert f["size"][3][:H.MAX_OUTPUTS + 1] == [0.0] * (H.MAX_OUTPUTS + 1)
    assert f["adj"][3][:6] == [0.25, -1.0, 0.5, -1.0, 0.75, -1.0]
    assert f["adj"][0][:6] == [0.5, 1.0, 0.75, 1.0, 1.0, 1.0]
    assert f["adj"][3][6:] == [0.0] * (H.ADJ_DIM - 6)


def test_adjacency_truncated_to_width():
    hub = [node("h")] + [node(f"s{i}") for i in range(15)]
    g = build("hub", hub, [edge("h", f"s{i}") for i in range(15)])
    assert len(H.op_features(g)["adj"][0]) == H.ADJ_DIM


def test_units_follow_colocation():
    g = build("u", [node("a", colocation="w"), node("b"), node("c", colocation="w"), node("d", colocation="z")],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    unit_of, count = H.units(g)
    assert unit_of == [0, 1, 0, 2] and count == 3
    assert H.default_groups(g) == 3
    assert H.default_groups(layered(1000)) == 256


def test_group_embeddings_shapes_and_connectivity():
    n, M, T = 4, 3, 5
    node_group = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]])
    type_vec = torch.arange(n * T, dtype=torch.float32).view(n, T)
    size = torch.ones(n, H.SIZE_DIM)
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])
    w = torch.tensor([1.0, 0.5, 1.0])
    emb = hm.group_embeddings(node_group, type_vec, size, src, dst, w, M)
    assert emb.shape == (2, M, T + H.SIZE_DIM + 1 + 2 * M)
    # sample 0, group 0 = nodes {0, 1}: mean type embedding of rows 0 and 1
    assert torch.allclose(emb[0, 0, :T], type_vec[:2].mean(0))
    assert emb[0, 0, T + H.SIZE_DIM] == pytest.approx(0.5)  # share of the nodes
    conn = emb[0, :, T + H.SIZE_DIM + 1:]
    # group 0: intra edge 0->1 (1.0) and edge to group 1 (0.5); normalised by its max
    assert conn[0].tolist() == pytest.approx([1.0, 0.5, 0.0, 1.0, 0.0, 0.0])
    # group 1: intra 2->3 (1.0), in-edge from group 0 (0.5) in the column half
    assert conn[1].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.5, 1.0, 0.0])
    assert torch.all(emb[0, 2] == 0)  # empty group
    # sample 1: everything in group 2, all edges intra-group
    assert emb[1, 2, T + H.SIZE_DIM + 1 + 2] == pytest.approx(1.0)


def test_network_shapes():
    torch.manual_seed(0)
    grouper = hm.Grouper(n_types=3, type_dim=4, feat_dim=6, hidden=8, groups=5)
    type_idx = torch.tensor([0, 1, 2, 1])
    feats = torch.rand(4, 6)
    unit_of = torch.tensor([0, 1, 0, 2])
    lp = grouper(type_idx, feats, unit_of, 3)
    assert lp.shape == (3, 5)
    assert torch.allclose(lp.exp().sum(1), torch.ones(3))
    placer = hm.Placer(emb_dim=7, hidden=8, devices=3)
    actions, logp = placer(torch.rand(4, 5, 7), generator=torch.Generator().manual_seed(1))
    assert actions.shape == (4, 5) and logp.shape == (4,)
    assert int(actions.min()) >= 0 and int(actions.max()) < 3
    assert torch.all(logp <= 0) and torch.all(torch.isfinite(logp))
    # tanh-bounded logits: no action more likely than e / (e + 2/e) with 3 devices
    # and none less likely than (1/e) / (1/e + 2e)
    pmax, pmin = math.e / (math.e + 2 / math.e), (1 / math.e) / (1 / math.e + 2 * math.e)
    assert float(logp.detach().max()) <= 5 * math.log(pmax) + 1e-5
    assert float(logp.detach().min()) >= 5 * math.log(pmin) - 1e-5
    logp.sum().backward()
    assert placer.device_emb.weight.grad is not None and placer.go.grad is not None


def test_oom_runtime_is_an_upper_bound_times_penalty(chain3, two_dev):
    costs = CostModel(chain3, two_dev)
    # work 1 + 2 + 3 = 6; two 100-byte tensors x (k-1) = 1 transfer x 1 s each
    assert H.oom_runtime(chain3, two_dev, costs, 2.0) == pytest.approx(16.0)


@pytest.mark.slow  # 800 samples; test_learns_a_feasible_placement_under_memory_pressure shows the learning quickly
def test_two_chains_finds_the_optimum_within_5_percent():
    # 2^32 placements; the best of 800 uniformly random ones (as many as the
    # samples trained on here) is 17.5 s, 9 % off the optimum of 16 s
    g = two_chains(16)
    cl = uniform(2, bandwidth=100.0, latency=0.0)
    p = registry.place(g, cl, "hierarchical", seed=0,
                       params={"iterations": 100, "samples_per_iteration": 8, "hidden": 32, "progress": False,
                               "time_limit": 0.0})
    rep = simulate(g, cl, p)
    assert rep["makespan_s"] <= 1.05 * 16.0
    assert p.estimate["makespan_s"] == pytest.approx(rep["makespan_s"])
    assert p.estimate["status"] == "FEASIBLE" and p.estimate["iterations"] == 100
    assert p.placement_time_s > 0


def test_oom_samples_penalised_feasible_preferred():
    # two nodes that talk a lot: both on one device is fastest (2 s) but does
    # not fit; the only feasible placements split them (2 s + 10 s transfer)
    g = build("pair", [node("a", 1.0, mem=10), node("b", 1.0, mem=10)], [edge("a", "b", 1000)])
    cl = uniform(2, memory=10, bandwidth=100.0, latency=0.0)
    p = H.hierarchical(g, cl, seed=0, **{**QUICK, "iterations": 20})
    assert p.estimate["status"] == "FEASIBLE"
    assert p.assignment["a"] != p.assignment["b"]
    rep = simulate(g, cl, p)
    assert rep["status"] != "OOM" and rep["makespan_s"] == pytest.approx(12.0)


def test_all_oom_reported_as_oom():
    g = build("big", [node("a", 1.0, mem=100), node("b", 1.0, mem=100)], [edge("a", "b", 100)])
    cl = uniform(2, memory=50, bandwidth=100.0, latency=0.0)
    p = H.hierarchical(g, cl, seed=0, **QUICK, oom_mode="fixed")
    assert p.estimate["status"] == "OOM"
    assert simulate(g, cl, p)["status"] == "OOM"
    assert set(p.assignment) == {"a", "b"}
    assert p.estimate["makespan_s"] == pytest.approx(2.0)  # best OOM sample: both on one device
    # the memory mask samples the best effort only: each node on its own device
    p = H.hierarchical(g, cl, seed=0, **QUICK)
    assert p.estimate["status"] == "OOM" and p.assignment["a"] != p.assignment["b"]
    assert p.estimate["makespan_s"] == pytest.approx(3.0)


def test_colocation_never_split_and_coarse_expansion():
    g = layered(300, seed=2)
    chunk = [0] * g.n
    for i, v in enumerate(g.topo_order()):
        chunk[v] = i // 3
    cg = contract(g, chunk, method="chunks")
    cl = uniform(4)
    p = registry.place(cg, cl, "hierarchical", seed=1, params=QUICK)
    assert set(p.assignment) == set(g.ids)
    rep = simulate(g, cl, p)  # raises ColocationError on a split group
    for group, members in g.colocation_groups().items():
        assert len({p.assignment[g.ids[v]] for v in members}) == 1, group
    assert p.estimate["makespan_s"] == pytest.approx(simulate(cg, cl, p)["makespan_s"])
    assert rep["makespan_s"] > 0


def test_deterministic_for_a_seed_and_state_restored():
    g = layered(60, seed=3)
    cl = uniform(3)
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    a = H.hierarchical(g, cl, seed=7, **QUICK)
    b = H.hierarchical(g, cl, seed=7, **QUICK)
    assert a.assignment == b.assignment
    assert a.estimate["makespan_s"] == b.estimate["makespan_s"]
    assert a.estimate["best_iteration"] == b.estimate["best_iteration"]
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_time_limit_stops_training(capsys):
    g = layered(60, seed=3)
    p = H.hierarchical(g, uniform(2), seed=0, **{**QUICK, "iterations": 1000, "time_limit": 1.0})
    done = p.estimate["iterations"]
    assert 1 <= done < 1000 and p.estimate["repeatable"] is False
    assert p.estimate["samples"] == done * QUICK["samples_per_iteration"] + 1  # + the final greedy decode
    assert "the wall clock (--time-limit 1 s) cut training" in capsys.readouterr().err


def test_trivial_inputs(chain3):
    p = H.hierarchical(chain3, uniform(1), seed=0, **QUICK)
    assert set(p.assignment.values()) == {"gpu0"} and p.estimate["makespan_s"] == pytest.approx(6.0)
    empty = build("empty", [], [])
    assert H.hierarchical(empty, uniform(2), seed=0, **QUICK).assignment == {}


def test_bad_params(chain3, two_dev):
    with pytest.raises(InvalidInput, match="iterations"):
        H.hierarchical(chain3, two_dev, **{**QUICK, "iterations": -1})
    with pytest.raises(InvalidInput, match="groups"):
        H.hierarchical(chain3, two_dev, **{**QUICK, "groups": -1})


def test_missing_torch_says_how_to_install(chain3, two_dev, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency, match=r"pip install -e \.\[torch\]"):
        H.hierarchical(chain3, two_dev, **QUICK)


# ------------------------------------------------------------------ issue 18: budget, determinism, memory pressure
def memory_bound_coarse_graph():
    """A coarse graph of 40 nodes of 30 bytes on 4 devices of 315 bytes:
    only placements within 5 % of a perfect balance fit (a uniformly random
    one almost never does)."""
    g = layered(120, seed=1)
    doc = g.to_dict()
    for nd in doc["nodes"]:
        nd["memory_bytes"] = 10
        nd.pop("resident_bytes", None)  # the static rule: every node's 10 bytes for the whole step
    g = Graph.from_dict(doc)
    chunk = [0] * g.n
    for i, v in enumerate(g.topo_order()):
        chunk[v] = i // 3
    return g, contract(g, chunk, method="chunks"), uniform(4, memory=315)


def test_learns_a_feasible_placement_under_memory_pressure():
    # the paper's fixed penalty: every sample overflows, every reward is the
    # same, nothing is learnt (Celeritas Figure 1); the masked sampling finds
    # feasible placements from the first iteration and keeps improving
    g, cg, cl = memory_bound_coarse_graph()
    budget = {"iterations": 30, "samples_per_iteration": 8, "hidden": 32, "time_limit": 0.0, "progress": False}
    rand = simulate(g, cl, registry.place(cg, cl, "random"))
    assert rand["status"] == "OOM"
    fixed = H.hierarchical(cg, cl, seed=0, oom_mode="fixed", **budget)
    assert fixed.estimate["status"] == "OOM"
    hist: list = []
    p = H.hierarchical(cg, cl, seed=0, history=hist, **budget)
    rep = simulate(g, cl, p)
    assert p.estimate["status"] == "FEASIBLE" and rep["status"] == "OK"
    assert p.estimate["oom_mode"] == "mask" and len(hist) == 30
    oom = [h["oom"] for h in hist]
    assert sum(oom[-10:]) < sum(oom[:10])  # fewer overflowing samples as it learns
    assert hist[-1]["best_feasible_s"] == pytest.approx(p.estimate["makespan_s"])


def test_graded_penalty_orders_oom_samples_by_overflow():
    from celeritas_cli.algorithms.placers.hierarchical.reward import (
        oom_signal,
        overflow_fraction,
    )

    fail = 10.0
    small = oom_signal(fail, overflow_fraction([110, 90], [100, 100], 200), "graded")
    large = oom_signal(fail, overflow_fraction([200, 0], [100, 100], 200), "graded")
    assert fail < small < large and oom_signal(fail, 0.5, "fixed") == fail


def test_two_runs_give_byte_identical_placements():
    # the default budget is counted (auto iterations from the time limit by a
    # fixed cost model), so the clock does not decide how far training gets
    import orjson

    g, cl = layered(30, seed=5), uniform(2)
    params = {"time_limit": 8.0, "samples_per_iteration": 2, "hidden": 16, "progress": False}
    docs = []
    for _ in range(2):
        p = registry.place(g, cl, "hierarchical", seed=3, params=params)
        assert p.estimate["repeatable"] and p.estimate["iterations"] == p.params["iterations"] > 1
        docs.append(orjson.dumps(p.to_dict(timings=False)))
    assert docs[0] == docs[1]


def test_noise_stops_at_75_percent_of_the_budget_even_when_the_clock_ends_it(monkeypatch):
    from types import SimpleNamespace

    from celeritas_cli.algorithms.placers.hierarchical import budget as B

    clock = [0.0]
    monkeypatch.setattr(B, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    b = B.TrainingBudget(iterations=100, samples=8, time_limit=10.0, t0=0.0)
    noisy, started = [], 0
    for it in range(100):
        if not b.may_start(it):
            break
        started += 1
        noisy.append(b.noisy(it))
        clock[0] += 0.5  # every iteration takes 0.5 s: about 19 fit in 10 s
    assert 15 <= started < 20 and b.clock_cut
    assert noisy[0] and not noisy[-1]
    assert sum(noisy) == pytest.approx(0.75 * b.horizon, abs=1.0)
    free = B.TrainingBudget(iterations=8, samples=8, time_limit=0.0, t0=0.0)
    assert [free.noisy(i) for i in range(8)] == [True] * 6 + [False] * 2 and all(map(free.may_start, range(8)))


def test_auto_budget_and_smoke_caveat():
    from celeritas_cli.algorithms.placers.hierarchical.budget import auto_iterations

    assert auto_iterations(60, 92, 52, 8, 0.0) == 1000  # the paper's, without a limit
    assert auto_iterations(60, 92, 52, 8, 60.0) < auto_iterations(60, 92, 52, 8, 600.0) <= 1000
    assert auto_iterations(1000, 1600, 256, 8, 1.0) == 1
    p = registry.place(layered(20, seed=1), uniform(2), "hierarchical",
                       params=registry.get("hierarchical").quick_params)
    assert p.estimate["caveat"].startswith("smoke budget: 5 iterations x 2 samples, not the paper's planner")


def test_a_graph_too_large_for_the_time_limit_fails_early():
    from celeritas_cli.errors import SolverError

    with pytest.raises(SolverError, match=r"too long for --time-limit 1 s; coarsen first"):
        H.hierarchical(layered(1000, seed=0), uniform(4), seed=0, time_limit=1.0, progress=False)


def test_a_slow_start_leaves_the_untrained_decode_and_says_so(monkeypatch, capsys):
    # a cold `import torch` can take longer than the limit: no iteration then
    from types import SimpleNamespace

    from celeritas_cli.algorithms.placers.hierarchical import budget as B

    real = B.time.perf_counter
    monkeypatch.setattr(B, "time", SimpleNamespace(perf_counter=lambda: real() + 1e6))
    g = layered(30, seed=2)
    p = H.hierarchical(g, uniform(2), seed=0, **{**QUICK, "iterations": 0, "time_limit": 30.0})
    assert p.estimate["iterations"] == 0 and p.estimate["samples"] == 1 and p.estimate["repeatable"] is False
    assert p.estimate["caveat"].startswith("no training") and set(p.assignment) == set(g.ids)
    assert "cut training to 0 of" in capsys.readouterr().err


# ------------------------------------------------------------------ the training steps alone (section 2)
def _trainer(env, history=None):
    from types import SimpleNamespace

    from celeritas_cli.algorithms.placers.hierarchical.training import Trainer, Training

    theta = torch.zeros(2, requires_grad=True)
    policy = SimpleNamespace(parameters=lambda: [theta])
    return Trainer(torch, policy, env, Training(groups=2, hidden=2, lr=0.1), SimpleNamespace(n_samples=0),
                   history), theta


def test_trainer_evaluate_rewards_and_keeps_the_best_feasible_sample():
    # R = -sqrt(r / T), T = total mean compute time = 1 + 3 = 4: a 16 s sample earns -2,
    # an OOM one (signal 100) -5; the feasible one is the best although the OOM one came first
    from types import SimpleNamespace

    runtime = {(1,): (100.0, False), (0,): (16.0, True)}
    env = SimpleNamespace(costs=SimpleNamespace(mean_time=[1.0, 3.0]), runtime=lambda du: runtime[tuple(du)],
                          makespan=lambda du: 9.0, overflow=lambda du: 0.5)
    tr, _ = _trainer(env, history=[])
    rewards, n_oom, over = tr.evaluate(0, [[1], [0]])
    assert rewards == [-5.0, -2.0] and (n_oom, over) == (1, 0.5)
    assert tr.best == ((False, 16.0, 0, 1), [0]) and tr.budget.n_samples == 2


def test_trainer_update_is_reinforce_with_a_moving_average_baseline():
    # first batch: the baseline is its mean (-2); sample 0 (R = -1) beat it, so the
    # policy moves toward its action; then b <- 0.9 b + 0.1 mean = 0.9 (-2) + 0.1 (-1)
    from types import SimpleNamespace

    tr, theta = _trainer(SimpleNamespace(costs=SimpleNamespace(mean_time=[1.0])))
    tr.update([-1.0, -3.0], torch.log_softmax(theta, 0))  # sample s chose action s
    assert tr.baseline == pytest.approx(-2.0)
    assert torch.softmax(theta, 0)[0].item() > 0.5
    tr.update([0.0, -2.0], torch.log_softmax(theta, 0))
    assert tr.baseline == pytest.approx(0.9 * -2.0 + 0.1 * -1.0)
