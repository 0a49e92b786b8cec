"""``placer export`` / ``placer run`` of TP x PP plans (celeritas_cli/run/tp3d_export.py): the megatron
row with tp > 1 and pp > 1 written as one program on a ("dp", "pp", "tp") DeviceMesh in Megatron-LM's
rank order - torch.distributed.pipelining stages cut where the plan cuts, each parallelize_module'd
over mesh["tp"].

The default suite checks the pieces (the stage cut and the module styles, the mesh's rank order against
the megatron row's own device_of_rank, the tables and the torchrun line, the refusals, a wrong launch);
the slow tests launch the program with torchrun (tp 2 x pp 2: 4 processes, gloo, CPU) and run it by
``placer run``, comparing the step with the unplaced one (rtol 1e-4).  tp 2 x pp 2 x dp 2 needs 8
processes: not in the suite (run by hand: see the report of the branch)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.run.tp3d_export import has_pipeline, mesh_rank, pipe_plan  # noqa: E402

from .test_export_tp import (PLAN, export_tp, megatron_plan, prepared, python, reference, tables,  # noqa: E402
                             torchrun, write_model)

ROOT = Path(__file__).resolve().parents[2]
#: tp 2 x pp 2, one replica, 4 micro-batches of 1 sample (the batch is 4)
TP_PP = {"tp": 2, "pp": 2, "dp": 1, "micro_batch_size": 1}


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> str:
    """The spec of test_export_tp's TinyGPT (tied head, no QKV bias, no dropout), written once per module."""
    return write_model(tmp_path_factory.mktemp("tiny_gpt"))


# ----------------------------------------------------------------------- fast
def test_the_stage_cut_and_the_styles_of_a_tp_x_pp_plan(tmp_path, gpt):
    pre, cluster, placement = prepared(tmp_path, gpt, 4, **TP_PP)
    assert has_pipeline(placement)
    pipe = pre.pipe
    # TinyGPT's two blocks balanced over two stages: the second stage begins at blocks.1's call
    assert (pipe.pp, pipe.v, pipe.n_stages, pipe.split_points) == (2, 1, 2, ["blocks.1"])
    assert (pipe.schedule, pipe.torch_class, pipe.m) == ("1f1b", "Schedule1F1B", 4)
    assert pipe.rows == [[(0, 1), (1, 1), (2, 1), (3, 1)]]
    assert (pre.tp, pre.dp, pre.pp, pre.k) == (2, 1, 2, 4)
    # the whole model's styles (each stage applies those of the modules it holds); the head is tied
    assert pre.module_plan == PLAN and pre.tied
    # the devices against the plan's own words: its estimate's stage_devices (stage -> tensor ranks' devices)
    stage_devices = placement.estimate["stage_devices"]
    assert [cluster.ids[d] for d in pipe.rank_devices] == [d for row in stage_devices for d in row]
    # every forward node of blocks.1 (and after) is on pipeline rank 1, blocks.0's on rank 0
    assert placement.assignment["addmm_3/tp0/mb0"] == placement.assignment["native_layer_norm_2/tp0/mb0"] == "gpu2"


def test_the_mesh_is_megatrons_rank_order(tmp_path, gpt, monkeypatch):
    """Global rank t + tp (r + dp j): the megatron row's device_of_rank, an independent formula, gives
    the device of every (t, r, j); the program's DeviceMesh puts each rank at mesh[r, j, t]."""
    from celeritas_cli.algorithms.pipelines.megatron import device_of_rank

    pre, cluster, _ = prepared(tmp_path, gpt, 8, tp=2, pp=2, dp=2, micro_batch_size=1)
    assert pre.k == 8 and pre.pipe.m == 2
    for j in range(2):
        for r in range(2):
            for t in range(2):
                assert pre.devices[mesh_rank(t, r, j, 2, 2)] == device_of_rank(t, r, j, 2, 2)
    # each replica's micro-batches: rows of the global batch, together every row once
    rows = sorted(a + i for mine in pre.pipe.rows for a, n in mine for i in range(n))
    assert rows == [0, 1, 2, 3] and [len(mine) for mine in pre.pipe.rows] == [2, 2]
    # the program's mesh, built with a DeviceMesh that records what it is given
    from celeritas_cli.run.export_plan import export_program

    src = export_program(pre, cluster, label="p.json", algorithm="megatron")[0]
    seen = {}

    class FakeMesh:
        def __init__(self, device_type, mesh, mesh_dim_names):
            seen.update(device=device_type, mesh=mesh.tolist(), names=mesh_dim_names)

    import torch.distributed.device_mesh as dm

    monkeypatch.setattr(dm, "DeviceMesh", FakeMesh)
    tables(src)["make_mesh"](torch.device("cpu"))
    assert seen["names"] == ("dp", "pp", "tp")
    assert all(seen["mesh"][r][j][t] == mesh_rank(t, r, j, 2, 2) for r in (0, 1) for j in (0, 1) for t in (0, 1))


def test_the_programs_tables_and_torchrun_line(tmp_path, gpt):
    path, src, what, line, pre = export_tp(tmp_path, gpt, 4, name="tp3d.py", **TP_PP)
    ns = tables(src)
    assert line == f"torchrun --nproc-per-node 4 {path}" and f"    {line}\n" in src.split('"""')[1]
    assert "a TP x PP program" in what and "1 replica(s) x 2 pipeline x 2 tensor ranks" in what
    assert (ns["DP"], ns["PP"], ns["TP"], ns["PROCESSES"], ns["N_STAGES"]) == (1, 2, 2, 4, 2)
    assert (ns["SPLIT_POINTS"], ns["SCHEDULE"], ns["N_MICROBATCHES"]) == (["blocks.1"], "Schedule1F1B", 4)
    assert ns["TP_PLAN"] == PLAN and ns["SEQUENCE_PARALLEL"] is False
    assert ns["RANK_DEVICES"] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert [ns["stages_of"](j) for j in (0, 1)] == [[0], [1]]
    assert ns["SIMULATED_STEP_S"] == pytest.approx(pre.sim["makespan_s"]) and ns["SIMULATED_STEP_S"] > 0
    assert export_tp(tmp_path, gpt, 4, name="tp3d.py", **TP_PP)[1] == src          # same inputs, same bytes


def test_cli_export_of_a_tp_x_pp_plan(tmp_path, monkeypatch, gpt):
    megatron_plan(tmp_path, gpt, 4, **TP_PP)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o",
                                  "out.py"])
    assert r.exit_code == 0, r.output
    assert "placer export: launch it with: torchrun --nproc-per-node 4 out.py" in r.stderr
    assert "a TP x PP program" in r.stderr and "Schedule1F1B" in r.stderr
    ns = tables((tmp_path / "out.py").read_text())
    assert ns["FINGERPRINT"]["graph_file"] == "g.json" and ns["FINGERPRINT"]["cluster"] == "4cpu"


def test_sequence_parallelism_with_a_pipeline_is_refused_in_one_line(tmp_path, gpt, monkeypatch):
    with pytest.raises(InvalidInput, match=r"sequence parallelism with a pipeline is not exported") as e:
        prepared(tmp_path, gpt, 4, sequence_parallel=True, **TP_PP)
    assert "\n" not in str(e.value)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o",
                                  "out.py"])
    assert r.exit_code == 1 and "sequence parallelism with a pipeline" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out.py").exists()


def test_pipe_plan_refuses_stages_out_of_turn_and_a_recipe_without_a_schedule(tmp_path, gpt):
    from celeritas_cli.model.graph import Graph

    from .test_export_tp import step_of

    _, _, cluster, placement = megatron_plan(tmp_path, gpt, 4, **TP_PP)
    step = step_of(gpt)
    kinds = {"blocks": "ModuleList"}
    recipe = placement.derivation["steps"]
    kw = {"tp": 2, "dp": 1, "sp": False, "batch": 4, "kinds": kinds, "label": "p.json"}
    base = Graph.from_dict(step.doc, step.doc["name"])
    assert pipe_plan(placement, cluster, base, step.sm, recipe, **kw).split_points == ["blocks.1"]
    # ln_f's LayerNorm (of micro-batch 0) moved back to pipeline rank 0: gpu0, gpu2, gpu0, gpu2 - 4 stages
    # taken in turn by 2 ranks, which the recipe's 1F1B (one stage per rank) does not run
    placement.assignment["native_layer_norm_4/tp0/mb0"] = "gpu0"
    with pytest.raises(InvalidInput, match=r"^p.json: 2 stages per pipeline rank but the recipe's schedule is 1F1B"):
        pipe_plan(placement, cluster, base, step.sm, recipe, **kw)
    # to a device of tensor rank 1 (the placement lists rank 0, which stands for every rank): refused as it
    # is expanded to every rank
    placement.assignment["native_layer_norm_4/tp0/mb0"] = "gpu3"
    with pytest.raises(InvalidInput, match=r"^p.json: node 'native_layer_norm_4/tp0/mb0' is on gpu3, which is not "
                                           r"one of tensor rank 0's devices"):
        pipe_plan(placement, cluster, base, step.sm, recipe, **kw)
    placement.assignment["native_layer_norm_4/tp0/mb0"] = "gpu2"
    unnamed = [dict(s) for s in recipe]
    unnamed[1].pop("schedule")
    with pytest.raises(InvalidInput, match=r"^p.json: the recipe names no pipeline schedule"):
        pipe_plan(placement, cluster, base, step.sm, unnamed, **kw)


def test_the_stage_cut_of_the_bf16_zoo_gpt_leaves_a_weights_cast_with_its_owner():
    """Under autocast the tied head reads wte.weight through a once-per-step cast that the plan keeps on
    the first stage, beside wte: the stages are cut by the nodes that run per micro-batch."""
    from celeritas_cli import registry
    from celeritas_cli.model.cluster import uniform
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.run.step import capture_real

    cfg = {"layers": 2, "d_model": 32, "heads": 4, "vocab": 64, "seq": 16}
    step = capture_real("gpt_1.3b", 4, config=cfg)
    graph = Graph.from_dict(step.doc, step.doc["name"])
    assert graph.meta["precision"] == "bf16"
    cluster = uniform(4, dtype="cpu", name="4cpu")
    placement = registry.place(graph, cluster, "megatron", params=TP_PP)
    casts = [nid for nid in placement.assignment if nid.startswith("_to_copy") and "/mb" not in nid]
    assert {placement.assignment[c] for c in casts} >= {"gpu0", "gpu2"}        # casts on both ranks' devices
    pipe = pipe_plan(placement, cluster, graph, step.sm, placement.derivation["steps"], tp=2, dp=1, sp=False,
                     batch=4, kinds={"blocks": "ModuleList"}, label="p.json")
    assert (pipe.pp, pipe.v, pipe.split_points, pipe.rank_devices) == (2, 1, ["blocks.1"], [0, 1, 2, 3])


def test_a_wrong_process_count_or_graph_stops_before_torch_loads(tmp_path, gpt):
    path, _, _, line, _ = export_tp(tmp_path, gpt, 4, name="tp3d.py", **TP_PP)
    r = python(tmp_path, path)                                   # no torchrun: one process
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"tp3d.py: started as 1 process(es), but the plan runs 4: launch it with `{line}`"]
    other = tmp_path / "other.json"
    other.write_text((tmp_path / "g.json").read_text() + "\n")                   # other bytes
    r = python(tmp_path, path, "--graph", str(other), env={"WORLD_SIZE": "4", "RANK": "0"})
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "exported for graph" in r.stderr and "other.json has sha256" in r.stderr


# ----------------------------------------------------------------------- slow
def check_stages_against_reference(prefix: Path, n: int, spec: str) -> float:
    """Every rank's saved loss and its stages' whole parameters against the unplaced step (rtol 1e-4,
    atol 1e-7); together the ranks hold every parameter.  The largest difference relative to
    max(|value|, 1e-3) (the updates are 1e-3: Adam's lr)."""
    want_loss, want, init = reference(spec)
    worst, seen = 0.0, set()
    for r in range(n):
        got = torch.load(f"{prefix}.{r}")
        assert got["loss"] == pytest.approx(want_loss, rel=1e-4)
        for name, t in got["params"].items():
            torch.testing.assert_close(t, want[name], rtol=1e-4, atol=1e-7)
            assert not torch.equal(t, init[name])                               # the step updated it
            worst = max(worst, float(((t - want[name]).abs() / want[name].abs().clamp_min(1e-3)).max()))
            seen.add(name)
    assert seen == set(want)
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"recompute": "full"}])
def test_exported_tp_x_pp_program_under_torchrun_matches_the_unplaced_step(tmp_path, gpt, extra):
    path, _, _, _, pre = export_tp(tmp_path, gpt, 4, name="tp3d.py", **TP_PP, **extra)
    # full recomputation: one recompute step per stage in the recipe; every block checkpointed in its stage
    assert pre.recompute_layers == (["blocks.0", "blocks.1"] if extra else [])
    r = torchrun(tmp_path, 4, path, "--steps", "1", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_stages_against_reference(tmp_path / "out", 4, gpt) < 1e-4
    # pipeline rank 0 holds stage 0 (the embedding), rank 1 stage 1 and its copy of the tied embedding
    held = [set(torch.load(f"{tmp_path / 'out'}.{r}")["params"]) for r in range(4)]
    assert held[0] == held[1] and held[2] == held[3] and held[0] & held[2] == {"wte.weight"}
    lines = r.stdout.splitlines()
    assert any(ln.startswith("step: measured ") and "(median of 1), simulated " in ln for ln in lines), r.stdout
    assert sum(ln.startswith("loss ") for ln in lines) == 1


@pytest.mark.slow
def test_placer_run_of_a_tp_x_pp_plan_matches_the_unplaced_step(tmp_path, gpt):
    from celeritas_cli.run import api

    pre, cluster, placement = prepared(tmp_path, gpt, 4, **TP_PP)
    report = api.run_placement(gpt, 4, placement, cluster, label="p.json", backend="gloo", steps=1, warmup=1,
                               prepared=pre)
    assert report["match"], report["notes"]
    assert report["plan"] == "tensor-parallel" and report["processes"] == 4
    tpd = report["tensor_parallel"]
    assert (tpd["tp"], tpd["dp"], tpd["pp"], tpd["micro_batches"]) == (2, 1, 2, 4)
    assert tpd["params_max_rel_diff"] < 1e-4 and report["params_compared"] == len(reference(gpt)[1])


# ------------------------------------------------------------- the README's example
EXAMPLE = f"{ROOT / 'examples' / 'tiny_gpt.py'}:TinyGPT"


def test_the_readme_example_splits_its_own_head_and_interleaves_four_stages(tmp_path):
    """examples/tiny_gpt.py (4 blocks, an LM head of its own): with 2 model chunks per pipeline rank the
    plan's 4 stages are taken in turn by the 2 ranks (interleaved 1F1B), the head column-parallel."""
    pre, _, _ = prepared(tmp_path, EXAMPLE, 4, virtual_stages=2, **TP_PP)
    pipe = pre.pipe
    assert (pipe.pp, pipe.v, pipe.n_stages, len(pipe.split_points)) == (2, 2, 4, 3)
    assert (pipe.schedule, pipe.torch_class, pipe.m) == ("interleaved", "ScheduleInterleaved1F1B", 4)
    assert not pre.tied and pre.module_plan[-1] == ("head", "head", {})
    assert [p for p, s, _ in pre.module_plan if s == "colwise"] == [f"blocks.{b}.{m}" for b in range(4)
                                                                     for m in ("qkv", "fc")]


@pytest.mark.slow
def test_placer_run_of_the_examples_interleaved_tp_x_pp_plan_matches(tmp_path):
    from celeritas_cli.run import api

    pre, cluster, placement = prepared(tmp_path, EXAMPLE, 4, virtual_stages=2, **TP_PP)
    report = api.run_placement(EXAMPLE, 4, placement, cluster, label="p.json", backend="gloo", steps=1, warmup=1,
                               prepared=pre)
    assert report["match"], report["notes"]
    # match: every element within rtol 1e-4 + atol 1e-5 (an update is lr = 1e-3)
    assert report["tensor_parallel"]["pp"] == 2 and report["params_max_abs_diff"] < 1e-5
    assert report["tensor_parallel"]["micro_batches"] == 4
