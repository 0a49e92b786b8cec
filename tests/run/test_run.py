"""`placer run` / `placer export`: placed PyTorch steps (skipped without torch)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import random
import threading

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from torch import nn  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import validate, write_json  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.profile.zoo import ZOO  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.dist import merge_ranks, rank_main, wire_buffer, wire_view  # noqa: E402
from celeritas_cli.run.export import export_source  # noqa: E402
from celeritas_cli.run.reference import reference_step  # noqa: E402
from celeritas_cli.run.report import compare  # noqa: E402
from celeritas_cli.run.step import capture_real  # noqa: E402

MLP = "tests.profile.test_profile_torch:TinyMLP"
_STEPS: dict = {}


def step_of(spec: str, batch: int, **config):
    """capture_real, once per (model, batch, config) in this test session (runs copy its values)."""
    key = (spec, batch, tuple(sorted(config.items())))
    if key not in _STEPS:
        _STEPS[key] = capture_real(spec, batch, config=config)
    return _STEPS[key]


def run(spec, batch, placement, cluster, config=None, **kw):
    config = config or {}
    pre = api.prepare(spec, batch, placement, cluster, config=config, step=step_of(spec, batch, **config))
    return api.run_placement(spec, batch, placement, cluster, prepared=pre, **kw)


class SmallCNN(nn.Module):
    """conv -> BatchNorm -> ReLU -> dropout -> linear: buffers, multi-output nodes, views, a random op."""

    def __init__(self, dropout: float = 0.5):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.p = dropout

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return self.fc(F.dropout(torch.flatten(y, 1), self.p, self.training))

    def example_inputs(self, b):
        return (torch.randn(b, 3, 6, 6),)

    def example_target(self, b):
        return torch.arange(b) % 5

    def loss(self, out, target):
        return F.cross_entropy(out, target)


CNN = f"{__name__}:SmallCNN"

#: TinyMLP at batch 2, hand-split: forward layer 1 and the backward of layer 1 on gpu0, the rest on gpu1.
MLP_GPU0 = {"input_0", "target", "addmm", "relu", "threshold_backward", "mm_2", "sum_2", "adam.l1.weight",
            "adam.l1.bias"}


def mlp_split() -> Placement:
    step = step_of(MLP, 2)
    return Placement("tinymlp_b2", "2xV100", "hand", {nid: "gpu0" if nid in MLP_GPU0 else "gpu1"
                                                      for nid in step.sm.ids})


def colocated_random(doc: dict, k: int, seed: int, with_order: bool) -> Placement:
    """A random placement that keeps colocation groups together, optionally with per-device orders
    taken from a random topological order (any valid order must run without deadlock)."""
    rng = random.Random(seed)
    g = Graph.from_dict(doc)
    group_dev: dict = {}
    dev = []
    for v in range(g.n):
        grp = g.colocation[v]
        d = rng.randrange(k) if grp is None else group_dev.setdefault(grp, rng.randrange(k))
        dev.append(d)
    order = None
    if with_order:
        indeg = [len(set(g.pred[v])) for v in range(g.n)]
        ready = [v for v in range(g.n) if indeg[v] == 0]
        topo = []
        while ready:
            v = ready.pop(rng.randrange(len(ready)))
            topo.append(v)
            for w in set(g.succ[v]):
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        order = [[v for v in topo if dev[v] == d] for d in range(k)]
    return Placement.from_indices(g, uniform(k), dev, algorithm="random", order=order)


# ---------------------------------------------------------------- local
def test_tiny_mlp_across_two_cpu_devices_is_exact_and_sends_the_hand_computed_bytes():
    rep = run(MLP, 2, mlp_split(), uniform(2), steps=1)
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["params_compared"] == 4 and rep["backend"] == "local"
    # relu:0 (2x16 float32) crosses once although addmm_1 and mm_1 both read it; the target (2 int64) once
    # for nll_loss_forward and nll_loss_backward; back: mm:0 (2x16 float32) to threshold_backward.
    links = {(ln["src"], ln["dst"]): ln for ln in rep["links"]}
    assert (links[("gpu0", "gpu1")]["bytes"], links[("gpu0", "gpu1")]["transfers"]) == (2 * 16 * 4 + 2 * 8, 2)
    assert (links[("gpu1", "gpu0")]["bytes"], links[("gpu1", "gpu0")]["transfers"]) == (2 * 16 * 4, 1)
    for ln in rep["links"]:
        assert (ln["bytes"], ln["transfers"]) == (ln["simulated_bytes"], ln["simulated_transfers"])
    assert [d["nodes"] for d in rep["devices"]] == [9, 10]
    assert rep["simulated_step_s"] > 0 and rep["measured_step_s"] > 0
    assert rep["measured_over_simulated"] == pytest.approx(rep["measured_step_s"] / rep["simulated_step_s"])


def test_reference_equals_plain_eager_pytorch_step():
    """The yardstick itself: the traced step on real tensors + torch.optim.Adam equals an ordinary
    nn.Module forward / backward / Adam step (no fx involved)."""
    step = capture_real(CNN, 4, config={"dropout": 0.0})
    ref = reference_step(step)
    torch.manual_seed(0)
    model = SmallCNN(dropout=0.0)
    torch.manual_seed(1)
    x, y = model.example_inputs(4)[0], model.example_target(4)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    loss = model.loss(model(x), y)
    loss.backward()
    opt.step()
    assert float(ref.loss) == pytest.approx(float(loss.detach()), rel=1e-6)
    for p, (name, param) in enumerate(model.named_parameters()):
        assert torch.allclose(ref.params[p], param.detach(), rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("seed", [0, 1])
def test_random_placements_with_dropout_match_exactly_and_transfers_equal_the_simulators(seed):
    p = colocated_random(step_of(CNN, 3).doc, 3, seed, with_order=False)
    rep = run(CNN, 3, p, uniform(3), steps=1)
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["params_compared"] == 6
    for ln in rep["links"]:
        assert (ln["bytes"], ln["transfers"]) == (ln["simulated_bytes"], ln["simulated_transfers"])


@pytest.mark.parametrize("name", ["transformer", pytest.param("nmt", marks=pytest.mark.slow),
                                  pytest.param("resnet50", marks=pytest.mark.slow),
                                  pytest.param("inception_v3", marks=pytest.mark.slow)])
def test_zoo_transfer_plan_equals_the_simulated_transfers(name):
    """Program (derived from the fx trace) and simulator (derived from the graph edges) agree on every
    cross-device tensor: same (tensor, destination) set, same bytes per link."""
    from celeritas_cli.run.program import Program
    from celeritas_cli.sim.simulator import simulate

    step = step_of(name, 2, **ZOO[name].small)
    g = Graph.from_dict(step.doc)
    p = colocated_random(step.doc, 3, 7, with_order=False)
    prog = Program(step, [int(p.assignment[nid][3:]) for nid in step.sm.ids], list(range(g.n)))
    planned = {(prog.tensor_name(t), t.dst) for t in prog.transfers}
    crossing = {(g.tensor_name[g.edge_tensor[e]], int(p.assignment[g.ids[g.edge_dst[e]]][3:]))
                for e in range(g.m) if p.assignment[g.ids[g.edge_src[e]]] != p.assignment[g.ids[g.edge_dst[e]]]}
    assert planned == crossing
    sim = {(ln["src"], ln["dst"]): (ln["bytes"], ln["transfers"]) for ln in simulate(g, uniform(3), p)["links"]}
    assert {(f"gpu{a}", f"gpu{b}"): tuple(v) for (a, b), v in prog.link_bytes().items()} == sim


def test_numerics_check_can_fail(monkeypatch):
    from celeritas_cli.run import executor

    real = executor.adam_update
    monkeypatch.setattr(executor, "adam_update", lambda *a, **k: real(*a, **k) + 1e-3)
    rep = run(MLP, 2, mlp_split(), uniform(2), steps=1)
    assert not rep["match"] and rep["params_max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    ref = reference_step(step_of(MLP, 2))
    assert compare(ref.loss + 1, ref.params, ref, rtol=0, atol=0.5)["match"] is False


# ---------------------------------------------------------------- errors
def test_placement_made_for_another_graph_is_refused_in_one_line():
    other = step_of("tensor_holography", 2, **ZOO["tensor_holography"].small)
    p = Placement(other.doc["name"], "2xV100", "x", {nid: "gpu0" for nid in other.sm.ids})
    with pytest.raises(InvalidInput, match=r"was made for graph 'tensor_holography_b2' \(\d+ nodes\), the capture "
                                           r"is 'tinymlp_b2' \(19 nodes\): it places node '.*', which the capture"):
        run(MLP, 2, p, uniform(2))
    partial = mlp_split()
    del partial.assignment["relu"]
    with pytest.raises(InvalidInput, match="does not place node 'relu'"):
        run(MLP, 2, partial, uniform(2))


def test_graph_file_of_another_model_is_refused(tmp_path):
    from celeritas_cli.profile.capture import profile_model

    g = Graph.from_dict(profile_model(CNN, 2))
    with pytest.raises(InvalidInput, match="differs from the captured 'tinymlp_b2'"):
        api.check_same_graph(step_of(MLP, 2).doc, mlp_split(), "p.json", g, "g.json")


# ---------------------------------------------------------------- gloo
class ThreadPeers:
    """The rank interface over a raw ProcessGroupGloo (ranks as threads of this process)."""

    def __init__(self, pg):
        self.pg = pg

    def send(self, t, dst, tag):
        return self.pg.send([t], dst, tag)

    def recv(self, t, src, tag):
        return self.pg.recv([t], src, tag)

    def barrier(self):
        self.pg.barrier().wait()


def run_ranks_in_threads(pre, ref, steps=1, **job_kw):
    """Run every rank of ``--backend gloo`` as a thread with its own gloo process group."""
    job = api.dist_job(pre, ref.rng_states, steps=steps, warmup=1, threads=1, timeout=60, **job_kw)
    n = len(job["ranks"])
    store = dist.HashStore()
    out, errors = [None] * n, []

    def rank(r):
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("run", store), r, n, datetime.timedelta(seconds=60))
            out[r] = rank_main(r, job, step=pre.step, peers=ThreadPeers(pg))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(t is not None for t in out), "a rank did not finish (deadlock?)"
    return merge_ranks(out)


def test_gloo_ranks_exact_on_tiny_mlp():
    pre = api.prepare(MLP, 2, mlp_split(), uniform(2), step=step_of(MLP, 2))
    ref = reference_step(pre.step)
    m = run_ranks_in_threads(pre, ref, steps=2)
    c = compare(m["loss"], m["params"], ref, rtol=0, atol=0)
    assert c["match"] and c["params_compared"] == 4
    assert {k: v[:2] for k, v in m["link"].items()} == {(0, 1): [144, 2], (1, 0): [128, 1]}
    assert len(m["walls"]) == 2 and all(w > 0 for w in m["walls"])


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_gloo_any_valid_order_runs_without_deadlock(seed):
    """Random devices and random per-device orders (from a random topological order) on 3 ranks."""
    step = step_of(CNN, 2, dropout=0.0)
    p = colocated_random(step.doc, 3, seed, with_order=True)
    pre = api.prepare(CNN, 2, p, uniform(3), config={"dropout": 0.0}, step=step)
    for d, did in enumerate(uniform(3).ids):
        mine = [pre.step.sm.ids[v] for v in pre.prog.sequence if pre.prog.device_of[v] == d]
        assert mine == p.order.get(did, [])               # each rank follows the placement's order
    ref = reference_step(pre.step)
    m = run_ranks_in_threads(pre, ref)
    assert compare(m["loss"], m["params"], ref, rtol=0, atol=0)["match"]


def test_wire_format_keeps_traced_strides():
    x = torch.randn(2, 3, 4).permute(2, 0, 1)              # dense, not contiguous
    buf, view = wire_buffer(x, "cpu")
    view.copy_(wire_view(x, x))                            # what send + recv do
    assert torch.equal(buf, x) and buf.stride() == x.stride()
    y = torch.randn(3, 4)                                  # contiguous value, traced as transposed
    meta = torch.empty_strided((3, 4), (1, 3))
    buf, view = wire_buffer(meta, "cpu")
    view.copy_(wire_view(y, meta))
    assert torch.equal(buf, y) and buf.stride() == (1, 3)


@pytest.mark.slow
def test_gloo_two_processes_match_with_dropout():
    step = capture_real(CNN, 2)
    p = colocated_random(step.doc, 2, 1, with_order=False)
    rep = api.run_placement(CNN, 2, p, uniform(2), backend="gloo", steps=2, timeout=300)
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["processes"] == 2 and rep["dist_backend"] == "gloo" and len(rep["measured_steps_s"]) == 2
    for ln in rep["links"]:
        assert (ln["bytes"], ln["transfers"]) == (ln["simulated_bytes"], ln["simulated_transfers"])


# ---------------------------------------------------------------- export
def test_export_runs_in_a_training_loop_like_the_unplaced_step(tmp_path):
    step = step_of(CNN, 2, dropout=0.0)
    pre = api.prepare(CNN, 2, colocated_random(step.doc, 2, 5, False), uniform(2), config={"dropout": 0.0},
                      step=step)
    src = export_source(pre.prog, ["gpu0", "gpu1"], pre.tdev, graph="g", cluster="c", label="p.json",
                        algorithm="random")
    assert src.count(" = _to(") == len(pre.prog.transfers) + 2           # copies, the input, the target
    path = tmp_path / "placed.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("placed_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = SmallCNN(dropout=0.0)
    torch.manual_seed(1)
    x, y = model.example_inputs(2)[0], model.example_target(2)
    step = mod.PlacedStep(model)
    ref = reference_step(pre.step)
    loss = step(x, target=y)
    assert float(loss) == float(ref.loss)
    named = dict(model.named_parameters())
    for p, want in ref.params.items():
        assert torch.equal(named[pre.step.sm.state_names[p]].detach(), want)
    step(x, target=y)                                                        # a second step runs too


# ---------------------------------------------------------------- CLI
def test_cli_run_table_export_and_mismatch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(main, ["profile", "--model", MLP, "-b", "2", "-o", "g.json"])
    assert r.exit_code == 0, r.output
    write_json(mlp_split().to_dict(), "p.json")
    r = runner.invoke(main, ["run", "--graph", "g.json", "-P", "p.json", "--steps", "1", "--format", "table",
                             "-o", "rep.json"])
    assert r.exit_code == 0, r.output
    assert "match" in r.stdout and "gpu0→gpu1" in r.stdout
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["model"] == MLP and rep["batch_size"] == 2 and rep["graph_source"] == "file" and rep["match"]
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "-o", "placed.py"])
    assert r.exit_code == 0, r.output
    assert "def placed_step(" in (tmp_path / "placed.py").read_text()
    # a placement for another batch size's graph has the same ids: fine; for another model: one line, exit 1
    other = step_of("tensor_holography", 2, **ZOO["tensor_holography"].small)
    write_json(Placement("th", "2xV100", "x", {n: "gpu0" for n in other.sm.ids}).to_dict(), "q.json")
    r = runner.invoke(main, ["run", "--graph", "g.json", "-P", "q.json"])
    assert r.exit_code == 1 and r.stdout == ""
    assert "q.json was made for graph 'th'" in r.stderr and len(r.stderr.strip().splitlines()) >= 1
    assert r.stderr.strip().splitlines()[-1].startswith("Error: q.json was made for graph 'th'")
    r = runner.invoke(main, ["run", "-P", "p.json"])
    assert r.exit_code == 2 and "--model is required" in r.output


# ---------------------------------------------------------------- data parallelism
def dp_placement(spec, batch, k=2, **config):
    from celeritas_cli import registry

    return registry.place(Graph.from_dict(step_of(spec, batch, **config).doc), uniform(k), "data-parallel")


def test_data_parallel_placement_is_prepared_as_replicas_with_shards():
    from celeritas_cli.run.data_parallel import DPPrepared

    p = dp_placement(CNN, 4)
    pre = api.prepare(CNN, 4, p, uniform(2), step=step_of(CNN, 4))
    assert isinstance(pre, DPPrepared) and (pre.k, pre.replica_batch, pre.global_batch) == (2, 2, 4)
    assert pre.devices == [0, 1] and sorted(pre.sequence) == list(range(len(pre.step.sm.ids)))
    whole = step_of(CNN, 4)
    for j, t in enumerate(whole.inputs):                  # the shards are the rows of the global batch
        assert torch.equal(torch.cat([s[0][j] for s in pre.shards]), t)
    assert torch.equal(torch.cat([s[1] for s in pre.shards]), whole.target)
    with pytest.raises(InvalidInput, match="runs with --backend gloo"):
        api.run_placement(CNN, 4, p, uniform(2), prepared=pre, backend="local")
    # a batch of 3 on 2 replicas: whole samples 2 + 1 (issue 24.1), which placer run does not execute
    with pytest.raises(InvalidInput, match=r"uneven batch shares \(\[0.666"):
        api.prepare(CNN, 3, dp_placement(CNN, 3), uniform(2), step=step_of(CNN, 3))
    # run -b 2 with a placement made for batch 4: one line, before anything is captured
    with pytest.raises(InvalidInput, match="was made for a global batch of 4 samples, the run is at batch 2; "
                                           "run with -b 4"):
        api.prepare(CNN, 2, p, uniform(2))


def test_placements_that_split_operations_are_refused():
    from celeritas_cli.run.plan import dp_recipe

    p = mlp_split()
    p.derivation = {"steps": [{"transform": "split", "node": "addmm", "dim": "batch", "n": 2}]}
    with pytest.raises(InvalidInput, match=r"transforms the graph \(split\)"):
        dp_recipe(p, "p.json")
    assert dp_recipe(mlp_split(), "p.json") is None


def test_cli_export_writes_data_parallel_as_a_torchrun_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--model", MLP, "-b", "4", "-o", "g.json"]).exit_code == 0
    r = runner.invoke(main, ["place", "g.json", "--algo", "data-parallel", "--cluster", "4xV100-pcie",
                             "-p", "devices=2", "-o", "dp.json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "dp.json", "-o", "x.py"])
    assert r.exit_code == 0 and "launch it with: torchrun --nproc-per-node 2 x.py" in r.stderr
    src = (tmp_path / "x.py").read_text()
    assert "DP, PP, N_MICROBATCHES = 2, 1, 1" in src and "ROWS = [[(0, 2)], [(2, 2)]]" in src


@pytest.mark.slow
def test_data_parallel_two_processes_match_the_averaged_shards():
    p = dp_placement(CNN, 4)
    rep = run(CNN, 4, p, uniform(2), backend="gloo", steps=1, timeout=300)
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["data_parallel"] == {"replicas": 2, "scaling": "strong", "replica_batch": 2, "global_batch": 4}
    assert rep["batch_size"] == 4 and all(ln["bytes"] is None for ln in rep["links"])
    assert rep["simulated_step_s"] > 0 and len(rep["measured_steps_s"]) == 1
