"""`placer run` / `placer export` on micro-batched, pipelined, recomputed and hybrid placements (issue 23.5)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
import threading

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.run.plan import batch_layout, merged_sequence

MLP = "tests.profile.test_profile_torch:TinyMLP"
MICRO = {"transform": "microbatch", "m": 2, "global_batch": 8, "micro_batches": [4, 4], "overhead_s": 0.0}
DP2 = {"transform": "data-parallel", "replicas": 2, "scaling": "strong", "overhead_s": 0.0}


# ---------------------------------------------------------------- without torch
def test_instances_take_consecutive_rows_replica_major_or_microbatch_major():
    lay = batch_layout([DP2, dict(MICRO, micro_batches=[2, 2])], 8)       # each replica's 4 samples in 2 + 2
    assert [(i, lay.rows[i], lay.sizes[i]) for i in lay.instances] == [((0, 0), 0, 2), ((0, 1), 2, 2),
                                                                        ((1, 0), 4, 2), ((1, 1), 6, 2)]
    lay = batch_layout([dict(MICRO, global_batch=7, micro_batches=[4, 3]), DP2], 7)   # micro-batches over replicas
    assert [(i, lay.rows[i], lay.sizes[i]) for i in lay.instances] == [((0, 0), 0, 2), ((1, 0), 2, 2),
                                                                        ((0, 1), 4, 2), ((1, 1), 6, 1)]
    assert lay.total == 7 and lay.weight((1, 1)) == pytest.approx(1 / 7)
    assert batch_layout([{"transform": "recompute", "nodes": []}], 5).sizes == {(0, 0): 5}
    with pytest.raises(InvalidInput, match="micro-batch 1 of 1 sample cannot be split 2 ways"):
        batch_layout([dict(MICRO, global_batch=3, micro_batches=[2, 1]), DP2], 3)


def test_merged_sequence_keeps_every_device_order_and_the_graph():
    from celeritas_cli.model.graph import build

    g = build("m", [{"id": i, "compute_s": 1, "memory_bytes": 0} for i in "abcd"],
              [{"src": "a", "dst": "b", "bytes": 1}, {"src": "c", "dst": "d", "bytes": 1}])
    seq = merged_sequence(g, [0, 1, 1, 0], [[0, 3], [2, 1]], [0.0, 5.0, 0.0, 9.0])
    assert seq.index(2) < seq.index(1) and seq.index(0) < seq.index(3) and seq.index(0) < seq.index(1)


torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from torch import nn  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import validate, write_json  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.derived_program import DerivedProgram as MBProgram  # noqa: E402
from celeritas_cli.run.reference import microbatch_reference, whole_reference  # noqa: E402
from celeritas_cli.run.dist import merge_ranks  # noqa: E402
from celeritas_cli.run.dist import rank_main as mb_rank_main  # noqa: E402
from celeritas_cli.run.derived_program import derived_job as mb_job  # noqa: E402
from celeritas_cli.run.derived_run import placed_result  # noqa: E402
from celeritas_cli.run.report import compare  # noqa: E402
from celeritas_cli.run.step import capture_real  # noqa: E402
from celeritas_cli.pipelining.cuts import (  # noqa: E402
    balanced_stages,
    forward_order,
    stage_forward_nodes,
    stages_from_cuts,
)
from celeritas_cli.pipelining.builder import staged_plan  # noqa: E402

from .plans import hybrid_plan  # noqa: E402


class DropMLP(nn.Module):
    """Linear -> ReLU -> dropout -> Linear -> cross-entropy: no BatchNorm, a random op."""

    def __init__(self, p: float = 0.3):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(p)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(self.drop(torch.relu(self.l1(x))))

    def example_inputs(self, b):
        return (torch.randn(b, 8),)

    def example_target(self, b):
        return torch.arange(b) % 4

    def loss(self, out, target):
        return F.cross_entropy(out, target)


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: statistics over the batch."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.bn(self.l1(x))))

    def example_inputs(self, b):
        return (torch.randn(b, 8),)

    def example_target(self, b):
        return torch.arange(b) % 4

    def loss(self, out, target):
        return F.cross_entropy(out, target)


DROP = f"{__name__}:DropMLP"
BN = f"{__name__}:BNNet"
_STEPS: dict = {}


def step_of(spec: str, batch: int):
    if (spec, batch) not in _STEPS:
        _STEPS[(spec, batch)] = capture_real(spec, batch)
    return _STEPS[(spec, batch)]


def graph_of(spec, batch):
    return Graph.from_dict(step_of(spec, batch).doc)


def at_l2(g: Graph) -> list[int]:
    """Two stages split where the module l2 starts (its addmm), in trace order."""
    fwd = forward_order(g, list(range(g.n)))
    return stages_from_cuts(g, fwd, [0, fwd.index(g.index["addmm_1"])])


def plan(spec, batch, m, schedule="1f1b", stages=2, recompute=False):
    g = graph_of(spec, batch)
    p = stages if schedule != "interleaved" else stages // 2
    if schedule == "interleaved":
        fwd = forward_order(g, list(range(g.n)))
        stage_of = stages_from_cuts(g, fwd, [round(j * len(fwd) / stages) for j in range(stages)])
    else:
        stage_of = at_l2(g) if stages == 2 else balanced_stages(g, uniform(p), list(range(p))).stage_of
    rc = stage_forward_nodes(g, stage_of, range(stages)) if recompute else None
    return staged_plan(g, uniform(p), stage_of, [j % p for j in range(stages)], m, schedule, recompute=rc), uniform(p)


def run(spec, batch, placement, cluster, **kw):
    pre = api.prepare(spec, batch, placement, cluster, step=step_of(spec, batch))
    return api.run_placement(spec, batch, placement, cluster, prepared=pre, **kw)


# ---------------------------------------------------------------- local
def test_two_stage_1f1b_with_four_microbatches_runs_locally_and_matches():
    p, c = plan(MLP, 8, 4, "1f1b")
    rep = run(MLP, 8, p, c, steps=1)
    validate(rep, "placer.run/v1", "report")
    mb = rep["microbatch"]
    assert rep["match"] and mb["yardstick"] == "whole batch" and (mb["schedule"], mb["stages"]) == ("1f1b", 2)
    assert mb["instance_batches"] == [2, 2, 2, 2] and mb["per_microbatch"]["params_max_abs_diff"] == 0.0
    assert mb["per_microbatch"]["loss_max_abs_diff"] == 0.0 and rep["loss_max_abs_diff"] <= 1e-6
    # inputs and l1 (addmm, relu) on gpu0, l2 and the loss on gpu1: per micro-batch relu:0 (2x16 float32) and the
    # target (2 int64) forward, and the gradient mm:0 (2x16 float32) backward
    links = {(ln["src"], ln["dst"]): ln for ln in rep["links"]}
    assert (links[("gpu0", "gpu1")]["bytes"], links[("gpu0", "gpu1")]["transfers"]) == (4 * (2 * 16 * 4 + 2 * 8), 8)
    assert (links[("gpu1", "gpu0")]["bytes"], links[("gpu1", "gpu0")]["transfers"]) == (4 * 2 * 16 * 4, 4)
    for ln in rep["links"]:
        assert (ln["bytes"], ln["transfers"]) == (ln["simulated_bytes"], ln["simulated_transfers"])
    assert sum(d["nodes"] for d in rep["devices"]) == mb["derived_nodes"]


def test_node_times_of_a_microbatched_plan_keep_the_plan_to_simulate_again():
    """No per-node times for a pipelined run yet, but the report keeps the plan (``ran_placement``), so
    the calibration tables can simulate it again: on the same files, the simulated step it reported."""
    from celeritas_cli.run.resimulate import resimulate

    p, c = plan(MLP, 8, 4, "1f1b")
    rep = run(MLP, 8, p, c, steps=1, node_times=True)
    validate(rep, "placer.run/v1", "report")
    assert "node_times" not in rep and any("ran_placement keeps the plan" in n for n in rep["notes"])
    row, = resimulate([rep], ["mb"], graph_of(MLP, 8), c)
    assert row["after_s"] == pytest.approx(rep["simulated_step_s"], rel=1e-12)


def test_dropout_masks_are_the_unplaced_steps_rows():
    """Without BatchNorm, micro-batches reproduce the whole batch's step (dropout included), up to summation order."""
    p, c = plan(DROP, 6, 3, "gpipe")
    rep = run(DROP, 6, p, c, steps=1)
    assert rep["match"] and rep["microbatch"]["instance_batches"] == [2, 2, 2]
    assert rep["loss_max_abs_diff"] <= 1e-6 and rep["params_max_abs_diff"] <= 1e-7
    assert rep["microbatch"]["per_microbatch"]["params_max_abs_diff"] == 0.0


def test_batchnorm_is_per_microbatch_and_the_report_says_so():
    p, c = plan(BN, 8, 2, "1f1b")
    rep = run(BN, 8, p, c, steps=1)
    mb = rep["microbatch"]
    assert rep["match"] and mb["yardstick"] == "per micro-batch" and rep["params_max_abs_diff"] == 0.0
    assert not mb["whole_batch"]["match"] and mb["whole_batch"]["loss_max_abs_diff"] > 1e-4
    assert any("BatchNorm" in n and "per micro-batch" in n for n in rep["notes"])


def test_uneven_microbatches_are_captured_at_each_size():
    p, c = plan(DROP, 5, 2, "1f1b")
    pre = api.prepare(DROP, 5, p, c, step=step_of(DROP, 5))
    assert sorted(pre.steps_by_size) == [2, 3, 5] and pre.layout.sizes == {(0, 0): 3, (0, 1): 2}
    rep = api.run_placement(DROP, 5, p, c, prepared=pre, steps=1)
    assert rep["match"] and rep["microbatch"]["per_microbatch"]["params_max_abs_diff"] == 0.0


def test_recomputed_nodes_really_run_again(monkeypatch):
    from celeritas_cli.run.derived_executor import DerivedRunner as MBRunner

    p, c = plan(MLP, 8, 2, "1f1b", recompute=True)
    ran: list[int] = []
    real = MBRunner.run_node
    monkeypatch.setattr(MBRunner, "run_node", lambda self, x, d: (ran.append(x), real(self, x, d))[1])
    pre = api.prepare(MLP, 8, p, c, step=step_of(MLP, 8))
    rep = api.run_placement(MLP, 8, p, c, prepared=pre, steps=1, warmup=1)
    clones = [x for x, info in enumerate(pre.infos) if info.kind == "recompute"]
    # input_0 (read by mm_2), _log_softmax and nll_loss_forward (read by the loss's backward) are recomputed in their
    # stage (relu is not: mm_1 on the next stage reads it), and addmm_1, whose output the clone of _log_softmax reads
    # (the segment is recomputed from its input): 4 clones per micro-batch, each run once per step
    assert sorted({pre.graph.ids[x].split("/")[0] for x in clones}) == ["_log_softmax", "addmm_1", "input_0",
                                                                        "nll_loss_forward"]
    assert len(clones) == rep["microbatch"]["recomputed"] == 8
    assert all(ran.count(x) == 2 for x in clones)        # the checked step and the timed one
    assert rep["match"] and rep["microbatch"]["per_microbatch"]["params_max_abs_diff"] == 0.0


def test_recompute_alone_and_after_data_parallelism_run_exactly():
    from celeritas_cli.model.placement import Placement
    from celeritas_cli.transform.derivation import apply_step, attach, data_parallel_step
    from celeritas_cli.transform.recompute import recompute_graph, recompute_step

    g = graph_of(DROP, 8)
    d = recompute_graph(g, ["addmm", "relu"])           # no micro-batches: one instance of the whole batch
    p = Placement.from_indices(d, uniform(1), [0] * d.n, algorithm="rc")
    attach(p, g, d, [recompute_step(["addmm", "relu"])])
    rep = run(DROP, 8, p, uniform(1), steps=1)
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["microbatch"]["recomputed"] == 2        # relu (read by its backward) and addmm (read by the clone)
    dp = data_parallel_step(2, "strong", 0.0)
    r = apply_step(g, dp)
    rc = [r.ids[x] for x in range(r.n) if (r.node_extra[x] or {}).get("origin") == "relu"]
    d = recompute_graph(r, rc)
    p = Placement.from_indices(d, uniform(2), [int((d.node_extra[x] or {}).get("replica", 0)) for x in range(d.n)],
                               algorithm="dp+rc")
    attach(p, g, d, [dp, recompute_step(rc)])
    rep = run(DROP, 8, p, uniform(2), steps=1)
    mb = rep["microbatch"]
    assert rep["match"] and mb["instance_batches"] == [4, 4] and mb["recomputed"] == 2
    assert mb["per_microbatch"]["params_max_abs_diff"] == 0.0 and rep["loss_max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("dp_first,bucket_mb", [(False, 0.0), (True, 1.0)])
def test_hybrid_replicated_pipelines_run_locally_with_the_ring_as_planned(dp_first, bucket_mb):
    """3 replicas of a 2-stage pipeline: micro-batched then replicated (1F1B orders, a ring per gradient), or
    replicated then micro-batched (the simulator's orders, one DDP bucket: a ring of all gradients at once)."""
    g = graph_of(MLP, 12)
    p = hybrid_plan(g, uniform(6), at_l2(g), 2, "1f1b", 3, dp_first=dp_first, bucket_mb=bucket_mb)
    rep = run(MLP, 12, p, uniform(6), steps=1)
    mb = rep["microbatch"]
    assert mb["recipe"] == (["data-parallel", "microbatch"] if dp_first else ["microbatch", "data-parallel"])
    assert rep["match"] and (mb["replicas"], mb["micro_batches"]) == (3, 2)
    assert dp_first or mb["schedule"] == "1f1b"          # without orders: whatever the simulator's rule ran
    assert mb["per_microbatch"]["params_max_abs_diff"] == 0.0 and mb["replica_spread"] == 0.0
    # the ring all-reduce moves 2 (k-1)/k of every gradient per replica, chunked by elements (the simulator by
    # bytes): within a few bytes per chunk of the simulated ring
    for ln in rep["links"]:
        assert ln["transfers"] == ln["simulated_transfers"]
        assert abs(ln["bytes"] - ln["simulated_bytes"]) <= 4 * ln["transfers"]


def test_refusals_are_one_line():
    p, c = plan(MLP, 8, 2)
    p.derivation["steps"].append({"transform": "split", "node": "addmm", "dim": "batch", "n": 2})
    with pytest.raises(InvalidInput, match="not a split step"):
        api.prepare(MLP, 8, p, c, step=step_of(MLP, 8))
    g = graph_of(MLP, 8)
    q = hybrid_plan(g, uniform(4), at_l2(g), 2, "1f1b", 2)
    q.derivation["steps"][1]["shares"] = [0.25, 0.75]
    with pytest.raises(InvalidInput, match="equal batch shares only"):
        api.prepare(MLP, 8, q, uniform(4), step=step_of(MLP, 8))


# ---------------------------------------------------------------- gloo ranks as threads
class ThreadPeers:
    def __init__(self, pg):
        self.pg = pg

    def send(self, t, dst, tag):
        return self.pg.send([t], dst, tag)

    def recv(self, t, src, tag):
        return self.pg.recv([t], src, tag)

    def barrier(self):
        self.pg.barrier().wait()


def ranks_in_threads(spec, batch, placement, cluster, steps=1):
    """Every rank of --backend gloo as a thread with its own gloo process group: ``(prepared, program, merged
    measurement, per-micro-batch reference, whole-batch reference)``."""
    pre = api.prepare(spec, batch, placement, cluster, step=step_of(spec, batch))
    prog = MBProgram(pre)
    whole, rnd = whole_reference(prog)
    per_mb = microbatch_reference(prog, pre.inputs, rnd, whole.rng_states)
    job = mb_job(pre, whole.rng_states, steps=steps, warmup=1, threads=1, timeout=60, dist_backend="gloo")
    n = len(job["ranks"])
    store = dist.HashStore()
    out, errors = [None] * n, []

    def rank(r):
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("mb", store), r, n, datetime.timedelta(seconds=60))
            out[r] = mb_rank_main(r, job, prog=prog, peers=ThreadPeers(pg))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(o is not None for o in out), "a rank did not finish (deadlock?)"
    return pre, prog, merge_ranks(out), per_mb, whole


@pytest.mark.parametrize("schedule,stages,m", [("gpipe", 2, 4), ("1f1b", 2, 4), ("1f1b", 3, 3),
                                               ("interleaved", 4, 4)])
def test_gloo_ranks_follow_each_schedule_without_deadlock_and_match_exactly(schedule, stages, m):
    p, c = plan(DROP, 8 if m == 4 else 6, m, schedule, stages)
    pre, prog, measured, per_mb, whole = ranks_in_threads(DROP, 8 if m == 4 else 6, p, c, steps=2)
    for d, did in enumerate(c.ids):              # each rank ran the placement's order, as the schedule says
        assert [pre.graph.ids[x] for x in prog.sequence if prog.device_of[x] == d] == p.order[did]
    loss, params, _ = placed_result(prog, measured)
    assert compare(loss, params, per_mb, rtol=0, atol=0)["match"]
    assert compare(loss, params, whole, rtol=1e-4, atol=1e-5)["match"]
    assert len(measured["walls"]) == 2


@pytest.mark.parametrize("seed", [1, 2])
def test_gloo_ranks_follow_any_valid_order_without_deadlock(seed):
    """Per-device orders cut from a random topological order of a hybrid plan's derived graph: any order the
    simulator can follow, not only the schedules'."""
    import copy
    import random

    g = graph_of(MLP, 8)
    p = copy.deepcopy(hybrid_plan(g, uniform(4), at_l2(g), 2, "gpipe", 2))
    d = p.derived
    rng = random.Random(seed)
    need = [len(set(d.pred[x])) for x in range(d.n)]
    ready, topo = [x for x in range(d.n) if not need[x]], []
    while ready:
        x = ready.pop(rng.randrange(len(ready)))
        topo.append(x)
        for y in set(d.succ[x]):
            need[y] -= 1
            if not need[y]:
                ready.append(y)
    p.order = {did: [d.ids[x] for x in topo if p.assignment[d.ids[x]] == did] for did in uniform(4).ids}
    pre, prog, measured, per_mb, _ = ranks_in_threads(MLP, 8, p, uniform(4))
    for dev, did in enumerate(uniform(4).ids):
        assert [pre.graph.ids[x] for x in prog.sequence if prog.device_of[x] == dev] == p.order[did]
    loss, params, _ = placed_result(prog, measured)
    assert compare(loss, params, per_mb, rtol=0, atol=0)["match"]


def test_gloo_hybrid_replicated_pipelines_in_threads_match_exactly():
    g = graph_of(MLP, 8)
    p = hybrid_plan(g, uniform(4), at_l2(g), 2, "1f1b", 2)
    pre, prog, measured, per_mb, whole = ranks_in_threads(MLP, 8, p, uniform(4))
    loss, params, spread = placed_result(prog, measured)
    assert compare(loss, params, per_mb, rtol=0, atol=0)["match"] and spread == 0.0
    assert {r for r, _ in measured["params"]} == {0, 1}


# ---------------------------------------------------------------- export
def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_export_writes_a_pipelining_program_when_stages_are_module_segments(tmp_path):
    from celeritas_cli.run.derived_export import export_derived

    p, c = plan(MLP, 8, 4, "1f1b")
    pre = api.prepare(MLP, 8, p, c, step=step_of(MLP, 8))
    src, what = export_derived(pre, c, label="p.json", algorithm="pipeline")
    assert what.startswith("a torch.distributed.pipelining program (1f1b, 2 stages split at l2, 4 micro-batches")
    assert "import Schedule1F1B as SCHEDULE" in src and "SPLIT_SPEC = {'l2': SplitPoint.BEGINNING}" in src
    (tmp_path / "pp.py").write_text(src)
    mod = _load(tmp_path / "pp.py", "pp_test")
    from torch.distributed.pipelining import pipeline

    from tests.profile.test_profile_torch import TinyMLP

    pipe = pipeline(TinyMLP(), mb_args=(torch.randn(2, 8),), split_spec=mod.SPLIT_SPEC)
    assert [[n for n, _ in pipe.get_stage_module(j).named_parameters()] for j in range(2)] == \
        [["l1.weight", "l1.bias"], ["l2.weight", "l2.bias"]]       # the placement's stages
    assert mod.STAGE_DEVICES == ["gpu0", "gpu1"] and mod.stages_of(1) == [1]


@pytest.mark.parametrize("what", ["recompute", "hybrid", "split"])
def test_export_falls_back_to_placers_own_code_which_trains_like_the_unplaced_step(tmp_path, what):
    from celeritas_cli.run.derived_export import export_derived
    from celeritas_cli.run.reference import reference_step

    g = graph_of(MLP, 8)
    if what == "hybrid":                        # replicated, then micro-batched, in no recorded schedule
        p, c = hybrid_plan(g, uniform(4), at_l2(g), 2, "1f1b", 2, dp_first=True), uniform(4)
    elif what == "split":                       # stage 1 starts with relu: not where a module starts
        fwd = forward_order(g, list(range(g.n)))
        p, c = staged_plan(g, uniform(2), stages_from_cuts(g, fwd, [0, fwd.index(g.index["relu"])]), [0, 1], 2,
                             "gpipe"), uniform(2)
    else:
        p, c = plan(MLP, 8, 2, "1f1b", recompute=True)
    pre = api.prepare(MLP, 8, p, c, step=step_of(MLP, 8))
    src, why = export_derived(pre, c, label="p.json", algorithm="x")
    assert why.startswith("placer's own code") and {"recompute": "microbatch + recompute", "hybrid": "names no pipeline schedule",
                                                    "split": "stage 1 does not start"}[what] in why
    (tmp_path / "own.py").write_text(src)
    mod = _load(tmp_path / "own.py", f"own_{what}")
    from tests.profile.test_profile_torch import TinyMLP

    torch.manual_seed(0)
    model = TinyMLP()
    s = step_of(MLP, 8)
    loss = mod.PlacedStep(model)(*s.inputs, target=s.target)
    ref = reference_step(s)
    assert float(loss) == pytest.approx(float(ref.loss), rel=1e-6)
    named = dict(model.named_parameters())
    for q, want in ref.params.items():
        assert torch.allclose(named[s.sm.state_names[q]].detach(), want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- CLI
def test_cli_runs_and_exports_a_pipeline_placement(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--model", MLP, "-b", "8", "-o", "g.json"]).exit_code == 0
    p, c = plan(MLP, 8, 4, "1f1b")
    write_json(p.to_dict(), "p.json")
    write_json(c.to_dict(), "c.json")
    r = runner.invoke(main, ["run", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "--steps", "1",
                             "-o", "rep.json"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["match"] and rep["microbatch"]["schedule"] == "1f1b" and rep["graph_source"] == "file"
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o", "pp.py"])
    assert r.exit_code == 0, r.output
    assert "torch.distributed.pipelining program (1f1b" in r.stderr
    assert "Schedule1F1B" in (tmp_path / "pp.py").read_text()


# ---------------------------------------------------------------- processes (slow)
@pytest.mark.slow
def test_gloo_processes_two_stage_1f1b_four_microbatches_match():
    p, c = plan(MLP, 8, 4, "1f1b")
    rep = run(MLP, 8, p, c, backend="gloo", steps=2, timeout=300)
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["processes"] == 2 and rep["dist_backend"] == "gloo"
    assert rep["microbatch"]["schedule"] == "1f1b" and rep["microbatch"]["per_microbatch"]["params_max_abs_diff"] == 0


@pytest.mark.slow
def test_gloo_processes_hybrid_plan_matches():
    g = graph_of(MLP, 8)
    p = hybrid_plan(g, uniform(4), at_l2(g), 2, "1f1b", 2)
    rep = run(MLP, 8, p, uniform(4), backend="gloo", steps=1, timeout=300)
    assert rep["match"] and rep["processes"] == 4 and rep["microbatch"]["replicas"] == 2
    assert rep["microbatch"]["per_microbatch"]["params_max_abs_diff"] == 0


@pytest.mark.slow
def test_exported_pipelining_program_trains_like_the_unplaced_step_under_torchrun(tmp_path):
    from celeritas_cli.run.derived_export import export_derived
    from celeritas_cli.run.reference import reference_step

    p, c = plan(MLP, 8, 4, "1f1b")
    pre = api.prepare(MLP, 8, p, c, step=step_of(MLP, 8))
    src, _ = export_derived(pre, c, label="p.json", algorithm="pipeline")
    (tmp_path / "pp.py").write_text(src)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root, PLACER_EXPORT_OUT=str(tmp_path / "out"))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        "29517", str(tmp_path / "pp.py")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = {}
    for rank in (0, 1):
        got.update(torch.load(tmp_path / f"out.{rank}", weights_only=False))
    ref = reference_step(step_of(MLP, 8))
    assert float(got["loss"]) == pytest.approx(float(ref.loss), rel=1e-6)
    for q, want in ref.params.items():
        assert torch.allclose(got[pre.whole.sm.state_names[q]], want, rtol=1e-4, atol=1e-5)
