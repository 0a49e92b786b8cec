"""``placer run`` on fsdp plans (ZeRO stages 1-3 / PyTorch FSDP): celeritas_cli/run/fsdp_run.py.

The ranks run as threads over raw gloo process groups in the default suite (exact against the
per-shard yardstick), as processes (``launch``) in the slow tests."""

from __future__ import annotations

import datetime
import json
import threading

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import validate  # noqa: E402
from celeritas_cli.model.placement import Placement  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.reference import replica_reference  # noqa: E402
from celeritas_cli.run import fsdp_run  # noqa: E402
from celeritas_cli.run.fsdp_run import FSDPPrepared, check_results, fsdp_job, fsdp_rank_main  # noqa: E402

from .test_run import CNN, MLP, run, step_of  # noqa: E402


def fsdp_placement(spec, batch, k=2, config=None, **params):
    return registry.place(Graph.from_dict(step_of(spec, batch, **(config or {})).doc), uniform(k), "fsdp",
                          params=params)


#: ranks as threads share torch's CPU generator, so their dropout masks would race: no dropout there
NO_DROP = {"dropout": 0.0}


def prepared(spec, batch, k=2, config=None, **params) -> FSDPPrepared:
    config = config if config is not None else (NO_DROP if spec == CNN else {})
    return api.prepare(spec, batch, fsdp_placement(spec, batch, k, config, **params), uniform(k), config=config,
                       step=step_of(spec, batch, **config))


class ThreadComm:
    """:class:`~celeritas_cli.run.fsdp_run.Collectives` over a raw ProcessGroupGloo (ranks as threads)."""

    def __init__(self, pg):
        self.pg = pg

    def all_gather(self, out, chunk, async_op=False):
        work = self.pg._allgather_base(out, chunk)
        return work if async_op else work.wait()

    def reduce_scatter(self, out, flat):
        return self.pg._reduce_scatter_base(out, flat)

    def barrier(self):
        self.pg.barrier().wait()


def run_in_threads(pre: FSDPPrepared, rtol=0.0, atol=0.0):
    """Every rank of *pre* as a thread; ``(numerics, spread, results)`` against the per-shard yardstick."""
    ref, states = replica_reference(pre, 1, lambda msg: None)
    job = fsdp_job(pre, states, steps=1, warmup=1, threads=1, timeout=60)
    store = dist.HashStore()
    out, errors = [None] * pre.k, []

    def rank(r):
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("fsdp", store), r, pre.k, datetime.timedelta(seconds=60))
            out[r] = fsdp_rank_main(r, job, step=pre.step, comm=ThreadComm(pg))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(pre.k)]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)    # the yardstick's threads: the same reductions (conv.bias's gradient is ~0 before
    try:                        # BatchNorm, so Adam turns a last-bit difference into a step of lr)
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        torch.set_num_threads(saved)
    assert not errors, errors
    assert all(r is not None for r in out), "a rank did not finish (deadlock?)"
    numerics, spread = check_results(pre, out, ref, rtol=rtol, atol=atol)
    return numerics, spread, out


def test_fsdp_plan_is_prepared_as_replicas_with_the_units_of_the_captured_parameters():
    p = fsdp_placement(CNN, 4, stage=3)
    pre = api.prepare(CNN, 4, p, uniform(2), step=step_of(CNN, 4))
    assert isinstance(pre, FSDPPrepared) and (pre.k, pre.stage, pre.replica_batch, pre.global_batch) == (2, 3, 2, 4)
    names = pre.step.sm.state_names
    # conv 4x3x3x3 + 4, BatchNorm 4 + 4 (its running statistics are buffers: not sharded), linear 144x5 + 5
    assert [(n, [names[i] for i in ps]) for n, ps in pre.units] == [
        ("conv", ["conv.weight", "conv.bias"]), ("bn", ["bn.weight", "bn.bias"]), ("fc", ["fc.weight", "fc.bias"])]
    assert [sum(pre.step.state[i].numel() for i in ps) for _, ps in pre.units] == [112, 8, 725]
    assert pre.devices == [0, 1] and sorted(pre.sequence) == list(range(len(pre.step.sm.ids)))
    assert set(pre.passes) == {"forward", "backward", "update"}
    with pytest.raises(InvalidInput, match="an fsdp placement runs with --backend gloo"):
        api.run_placement(CNN, 4, p, uniform(2), prepared=pre, backend="local")
    with pytest.raises(InvalidInput, match="under torchrun placer run executes plain and data-parallel"):
        api.run_placement(CNN, 4, p, uniform(2), prepared=pre, backend="gloo", launcher=lambda *a, **k: [])


@pytest.mark.parametrize("stage", [3, 2, 1])
def test_fsdp_ranks_match_the_averaged_shards_exactly(stage):
    pre = prepared(CNN, 4, stage=stage)
    numerics, spread, out = run_in_threads(pre)
    assert numerics["match"] and numerics["params_compared"] == 6, numerics
    assert numerics["loss_max_abs_diff"] == 0.0 and numerics["params_max_abs_diff"] == 0.0 and spread == 0.0
    # flat gradients padded to 2 chunks: (112 + 8 + 726) float32 per rank and step
    assert all(r["scattered_bytes"] == 846 * 4 for r in out)
    assert [c.numel() for c in out[0]["chunks"]] == [56, 4, 363]
    if stage == 3:      # no rank keeps whole parameters; each unit gathered for its forward, again for its backward
        assert all(r["params"] == {} for r in out)
        assert out[0]["gathers"] == 6 and out[0]["gathered_bytes"] == 2 * 846 * 4
    else:               # ZeRO 1-2: no gather before use, one gather of the updated chunks per unit
        assert sorted(out[0]["params"]) == list(range(6))
        assert out[0]["gathers"] == 3 and out[0]["gathered_bytes"] == 846 * 4


def test_fsdp_prefetch_overlaps_the_next_gather_and_changes_no_value(monkeypatch):
    """Stage 3, two steps: the second prefetches every gather but the first one ahead, and the chunks
    after it are bit for bit those of the same two steps gathering each unit when it is read."""
    pre = prepared(CNN, 4, stage=3)
    _, _, out = run_in_threads(pre)
    assert out[0]["gathers"] >= 2 and out[0]["prefetched"] == out[0]["gathers"] - 1
    monkeypatch.setattr(fsdp_run.ShardedRunner, "_gather_for_read", lambda self, u: self._all_gather(u, self.shard[u]))
    _, _, plain = run_in_threads(pre)
    assert plain[0]["prefetched"] == 0
    for a, b in zip(out, plain):
        assert all(torch.equal(x, y) for x, y in zip(a["chunks_last"], b["chunks_last"]))


def test_fsdp_unit_bigger_than_the_others():
    """Size wrap policy, units of >= 420 bytes of parameters: conv (448 bytes) alone, then bn + fc
    (8 + 725 parameters in one flat parameter, 733 cut into 2 chunks of 367: one padding element)."""
    pre = prepared(CNN, 4, stage=3, unit_mb=420 / 2**20)
    names = pre.step.sm.state_names
    assert [(n, [names[i] for i in ps]) for n, ps in pre.units] == [
        ("unit0", ["conv.weight", "conv.bias"]), ("unit1", ["bn.weight", "bn.bias", "fc.weight", "fc.bias"])]
    numerics, _, out = run_in_threads(pre)
    assert numerics["match"] and numerics["params_max_abs_diff"] == 0.0, numerics
    assert [c.numel() for c in out[1]["chunks"]] == [56, 367]
    assert out[0]["scattered_bytes"] == (112 + 734) * 4


def test_fsdp_three_replicas_pad_the_last_chunk():
    """TinyMLP over 3 replicas: units l1 (144 parameters, chunks of 48) and l2 (68: chunks of 23, one padding).
    gloo sums 3 gradients in another order than the yardstick: equal within the run's default tolerance."""
    pre = prepared(MLP, 6, k=3, stage=3)
    assert [n for n, _ in pre.units] == ["l1", "l2"]
    numerics, _, out = run_in_threads(pre, rtol=1e-4, atol=1e-5)
    assert numerics["match"] and numerics["params_compared"] == 4, numerics
    assert [c.numel() for c in out[2]["chunks"]] == [48, 23]
    assert out[0]["scattered_bytes"] == (144 + 69) * 4


def _profiled_and_placed(tmp_path, monkeypatch) -> CliRunner:
    """In *tmp_path*: g.json (TinyMLP, batch 4) and f.json, its fsdp plan on 2 devices, made by the CLI."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--model", MLP, "-b", "4", "-o", "g.json"]).exit_code == 0
    r = runner.invoke(main, ["place", "g.json", "--algo", "fsdp", "--cluster", "4xV100-pcie", "-p", "devices=2",
                             "-o", "f.json"])
    assert r.exit_code == 0, r.output
    return runner


def test_tampered_fsdp_recipe_is_refused_in_one_line(tmp_path, monkeypatch):
    """The units come from the recipe rebuilt on the graph: a recipe edited after placing (one unit of 1 MiB,
    other replicas, a stage out of range, a step added) is refused in one line, before anything runs."""
    runner = _profiled_and_placed(tmp_path, monkeypatch)
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["derivation"]["steps"][0]["transform"] == "fsdp"
    edits = {"unit_mb": ("unit_mb", 1.0), "replicas": ("replicas", 3), "stage": ("stage", 4)}
    for what, (key, val) in edits.items():
        bad = json.loads(json.dumps(doc))
        bad["derivation"]["steps"][0][key] = val
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        r = runner.invoke(main, ["run", "--graph", "g.json", "-P", "bad.json", "--backend", "gloo", "-o", "r.json"])
        assert r.exit_code == 1 and r.stdout == "", (what, r.output)
        lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("placer run: ")]  # progress
        assert len(lines) == 1 and lines[0].startswith("Error: bad.json: "), (what, r.stderr)
        assert not (tmp_path / "r.json").exists()
    bad = json.loads(json.dumps(doc))
    bad["derivation"]["steps"].append({"transform": "recompute", "nodes": ["relu"]})
    # the plan is in the symmetric form (replicas), which only a recipe ending in fsdp (or data parallelism) has
    with pytest.raises(InvalidInput, match="recipe ends in data parallelism or fsdp lists its replicas"):
        api.prepare(MLP, 4, Placement.from_dict(bad), uniform(2), label="bad.json", step=step_of(MLP, 4))
    bad = json.loads(json.dumps(fsdp_placement(MLP, 4, collectives="ring").to_dict()))
    bad["derivation"]["steps"].append({"transform": "recompute", "nodes": ["relu"]})
    with pytest.raises(InvalidInput, match="placer run executes"):
        api.prepare(MLP, 4, Placement.from_dict(bad), uniform(2), label="bad.json", step=step_of(MLP, 4))


def test_fsdp_uneven_batch_shares_are_refused_as_in_data_parallelism():
    doc = fsdp_placement(CNN, 4, stage=1).to_dict()
    doc["derivation"]["steps"][0]["samples"] = [3, 1]
    with pytest.raises(InvalidInput, match=r"uneven batch shares \(\[3, 1\]\); placer run executes equal shares"):
        api.prepare(CNN, 4, Placement.from_dict(doc), uniform(2), label="p.json", step=step_of(CNN, 4))
    with pytest.raises(InvalidInput, match="2 replicas cannot share a batch of 3 evenly"):
        api.prepare(CNN, 3, fsdp_placement(CNN, 3, stage=3), uniform(2), step=step_of(CNN, 3))


def test_cli_exports_an_fsdp_plan_as_a_torchrun_program(tmp_path, monkeypatch):
    """(tests/run/test_export_fsdp.py runs the program.)"""
    runner = _profiled_and_placed(tmp_path, monkeypatch)
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "f.json", "-o", "x.py"])
    assert r.exit_code == 0 and r.stdout == "", r.output
    assert "placer export: launch it with: torchrun --nproc-per-node 2 x.py" in r.stderr
    assert "fully_shard(" in (tmp_path / "x.py").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [3, 1])
def test_fsdp_two_processes_match_the_averaged_shards(stage):
    rep = run(CNN, 4, fsdp_placement(CNN, 4, stage=stage), uniform(2), backend="gloo", steps=1, timeout=300)
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["plan"] == "fsdp" and rep["batch_size"] == 4 and rep["processes"] == 2
    f = rep["fsdp"]
    assert (f["replicas"], f["stage"], f["replica_batch"]) == (2, stage, 2)
    assert f["sharded"] == ["optimizer state", "gradients", "parameters"][:stage]
    assert [u["chunk_numel"] for u in f["units"]] == [56, 4, 363] and f["reduce_scattered_bytes"] == 846 * 4
    assert rep["simulated_step_s"] > 0 and all(ln["bytes"] is None for ln in rep["links"])
    json.dumps(rep)
