"""``placer run`` of tensor-parallel plans (celeritas_cli/run/tp_run.py): the recipe read, the mesh's
devices, refusals, the note on gradients that are zero in exact arithmetic; slow: ``placer run`` of a
TP plan (2 processes) and a TP x DP plan (4 processes: dp 2 x tp 2), gloo on CPU, matching the
unplaced step."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.jsonio import validate  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.reference import Reference  # noqa: E402
from celeritas_cli.run.tp_run import noise_note, rank_devices, tp_recipe  # noqa: E402

from .test_export_tp import BATCH, gpt, megatron_plan, prepared, reference  # noqa: E402,F401

TP = {"transform": "tensor-parallel", "tp": 2, "sequence_parallel": False}


# ----------------------------------------------------------------------- fast
def test_tp_recipe_takes_tp_first_then_microbatch_recompute_data_parallel():
    mb = {"transform": "microbatch", "m": 2}
    dp = {"transform": "data-parallel", "replicas": 2}
    assert tp_recipe(NS(derivation={"steps": [TP, mb, dp]}), "p") == [TP, mb, dp]
    assert tp_recipe(NS(derivation={"steps": [mb, dp]}), "p") is None                      # not tensor-parallel
    with pytest.raises(InvalidInput, match=r"^p: the tensor-parallel step must be the recipe's first"):
        tp_recipe(NS(derivation={"steps": [mb, TP]}), "p")
    with pytest.raises(InvalidInput, match=r"^p: a tensor-parallel plan with an fsdp step \(a ZeRO dimension\)"):
        tp_recipe(NS(derivation={"steps": [TP, {"transform": "fsdp", "replicas": 2}]}), "p")
    with pytest.raises(InvalidInput, match=r"^p: the recipe has 2 microbatch steps"):
        tp_recipe(NS(derivation={"steps": [TP, mb, mb]}), "p")


def test_rank_devices_put_tensor_ranks_innermost():
    c = uniform(4, dtype="cpu", name="4cpu")
    # replica 0 listed, replica 1 from the replica map (symmetric form): replica 1's ranks swapped
    sym = NS(assignment={"a/tp0/mb0/rep0": "gpu0", "a/tp1/mb0/rep0": "gpu1", "b/tp1/rep0": "gpu1"},
             replicas={"devices": [["gpu0", "gpu1"], ["gpu3", "gpu2"]]})
    assert rank_devices(sym, c, 2, 2, "p") == [0, 1, 3, 2]
    # every replica listed (no replica map)
    full = NS(assignment={"a/tp0/rep0": "gpu2", "a/tp1/rep0": "gpu0", "a/tp0/rep1": "gpu1", "a/tp1/rep1": "gpu3"},
              replicas=None)
    assert rank_devices(full, c, 2, 2, "p") == [2, 0, 1, 3]
    assert rank_devices(NS(assignment={"a/tp0": "gpu1", "a/tp1": "gpu0"}, replicas=None), c, 2, 1, "p") == [1, 0]
    pipe = NS(assignment={"a/tp0/mb0": "gpu0", "b/tp0/mb0": "gpu2", "a/tp1/mb0": "gpu1", "b/tp1/mb0": "gpu3"},
              replicas=None)
    with pytest.raises(InvalidInput, match=r"tensor rank 0 of replica 0 runs on 2 devices \(gpu0, gpu2\): a "
                                           r"pipeline, whose ranks tp3d_export.pipe_plan lays out"):
        rank_devices(pipe, c, 2, 1, "p")
    with pytest.raises(InvalidInput, match="two of the 2 ranks share a device"):
        rank_devices(NS(assignment={"a/tp0": "gpu1", "a/tp1": "gpu1"}, replicas=None), c, 2, 1, "p")


def test_the_note_names_parameters_whose_gradient_is_rounding_noise():
    ref = Reference(loss=torch.tensor(1.0), params={0: torch.zeros(3), 1: torch.ones(2)})
    names = ["blocks.0.qkv.bias", "w"]
    got = {0: torch.tensor([0.0, 3e-4, 0.0]), 1: torch.ones(2)}             # element 1 moved by 0.3 lr
    grads = {0: torch.tensor([1e-3, 1e-3, -1e-9]), 1: torch.ones(2)}
    assert noise_note(got, ref, grads, rtol=1e-4, atol=1e-5, names=names) is None     # its gradient is 1e-3
    grads[0] = torch.tensor([1e-3, 2e-9, -1e-9])                            # the others may be large
    note = noise_note(got, ref, grads, rtol=1e-4, atol=1e-5, names=names)
    assert note.startswith("off the unplaced step: elements of blocks.0.qkv.bias (1 of 3) only, whose gradients "
                           "there are at most 2e-09")
    got[1] = torch.full((2,), 2.0)                                           # a real difference: no excuse
    assert noise_note(got, ref, grads, rtol=1e-4, atol=1e-5, names=names) is None


def test_placer_run_of_a_tp_plan_wants_gloo(tmp_path, gpt):  # noqa: F811
    pre, cluster, placement = prepared(tmp_path, gpt, 2, tp=2)
    assert pre.k == 2 and [(r, n) for r, _, n in pre.instances] == [(0, 1)] * 4    # 4 micro-batches of 1
    with pytest.raises(InvalidInput, match=r"^p.json: a tensor-parallel plan runs with --backend gloo"):
        api.run_placement(gpt, BATCH, placement, cluster, label="p.json", backend="local", prepared=pre)


# ----------------------------------------------------------------------- slow
def check(rep: dict, spec: str, tp: int, dp: int) -> None:
    validate(rep, "placer.run/v1", "report")
    assert rep["match"], rep["notes"]
    assert rep["plan"] == "tensor-parallel" and rep["processes"] == tp * dp and rep["dist_backend"] == "gloo"
    assert (rep["tensor_parallel"]["tp"], rep["tensor_parallel"]["dp"]) == (tp, dp)
    assert rep["tensor_parallel"]["params_max_rel_diff"] < 1e-3
    want_loss, _, _ = reference(spec)                       # the unplaced step by hand, not placer's own
    assert rep["loss"] == pytest.approx(want_loss, rel=1e-4) and rep["reference_loss"] == pytest.approx(want_loss,
                                                                                                        rel=1e-5)
    assert rep["params_max_abs_diff"] < 1e-6 and rep["simulated_step_s"] > 0 and rep["measured_step_s"] > 0


@pytest.mark.slow
def test_placer_run_of_a_tp_plan_matches_the_unplaced_step(tmp_path, gpt):  # noqa: F811
    _, _, cluster, placement = megatron_plan(tmp_path, gpt, 2, tp=2)
    rep = api.run_placement(gpt, BATCH, placement, cluster, label="p.json", backend="gloo", steps=1, warmup=1,
                            threads=1)
    check(rep, gpt, 2, 1)
    assert rep["tensor_parallel"]["micro_batches"] == 4


@pytest.mark.slow
def test_cli_placer_run_of_a_tp_x_dp_plan_matches_the_unplaced_step(tmp_path, gpt, monkeypatch):  # noqa: F811
    megatron_plan(tmp_path, gpt, 4, tp=2, dp=2, sequence_parallel=True)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["run", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "--backend",
                                  "gloo", "--steps", "1", "--threads", "1", "-o", "rep.json"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep.json").read_text())
    check(rep, gpt, 2, 2)
    assert rep["tensor_parallel"]["sequence_parallel"] is True
    assert [d["id"] for d in rep["devices"]] == ["gpu0", "gpu1", "gpu2", "gpu3"]


def test_module_plan_of_the_bf16_zoo_gpt_reads_weights_through_their_half_copies():
    """Under autocast each weight reaches its matmul through an ``_to_copy``; the tied LM head's is a
    copy of wte.weight, ln_f's output reaches the head through another."""
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.profile import capture_model
    from celeritas_cli.profile.capture import build_meta
    from celeritas_cli.profile.models import resolve_model
    from celeritas_cli.run.tp_run import module_plan

    from .test_export_tp import PLAN

    cfg = {"layers": 2, "d_model": 32, "heads": 4, "vocab": 64, "seq": 16}
    g = Graph.from_dict(capture_model("gpt_1.3b", 2, config=cfg))
    assert g.meta["precision"] == "bf16"
    model = build_meta(resolve_model("gpt_1.3b", cfg)[0])
    plan, tied, layers = module_plan(g, 2, True, model)
    norms = [(f"blocks.{b}.{ln}", "sequence", {}) for b in (0, 1) for ln in ("ln1", "ln2")] + [("ln_f", "sequence", {})]
    assert sorted(plan) == sorted(PLAN + norms + [("ln_f", "head_input", {})])
    assert tied and layers == ["blocks.0", "blocks.1"]
