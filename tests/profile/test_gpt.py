"""The GPT zoo model and mixed-precision capture (`profile --precision`), on a tiny configuration
(skipped without torch)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.model import devices as dev  # noqa: E402
from celeritas_cli.profile.capture import LOSS_SCALE, default_precision, profile_model  # noqa: E402
from celeritas_cli.profile.gpt import model_flops  # noqa: E402
from celeritas_cli.profile.zoo import ZOO  # noqa: E402

SMALL = ZOO["gpt_1.3b"].small
L, D, H, V, S = SMALL["layers"], SMALL["d_model"], SMALL["heads"], SMALL["vocab"], SMALL["seq"]
B = 2


@pytest.fixture(scope="module")
def docs():
    return {p: profile_model("gpt_1.3b", B, config=SMALL, precision=p) for p in ("fp32", "bf16", "fp16")}


def by_id(doc):
    return {n["id"]: n for n in doc["nodes"]}


def test_parameters_tied_embedding_and_default_precision(docs):
    # per block: 2 LayerNorms (4d), QKV (3d^2+3d), projection (d^2+d), MLP (8d^2+5d); embeddings; final LayerNorm
    assert docs["bf16"]["meta"]["parameters"] == L * (12 * D * D + 13 * D) + V * D + S * D + 2 * D
    assert [d["meta"]["precision"] for d in docs.values()] == ["fp32", "bf16", "fp16"]
    assert default_precision("gpt_1.3b") == default_precision("gpt_6.7b") == "bf16"
    assert default_precision("transformer") == default_precision("m.py:Net") == "fp32"
    # the output layer reads the token embedding's weight from its owner (tied, no head parameter)
    reads = {e["tensor"] for e in docs["fp32"]["edges"] if e["tensor"].endswith(":wte.weight")}
    assert reads == {"embedding:wte.weight"}


def test_matmul_and_attention_flops_match_megatron(docs):
    for doc in docs.values():
        mm = sum(n["flops"] for n in doc["nodes"] if n["op"] in ("aten.mm", "aten.addmm"))
        # Narayanan et al. 2021 Eq. 3 without recomputation: 72 B s l h^2 (1 + s/6h + V/12lh) minus attention
        assert mm == 72 * B * S * L * D * D + 6 * B * S * D * V
        attn = [n for n in doc["nodes"] if n["op"].endswith("flash_attention_for_cpu")]
        assert len(attn) == L
        assert sum(n["flops"] for n in attn) == L * (4 * B * S * S * D + 5 * B * H * S * S)
    assert model_flops(B, S, L, D, V) == pytest.approx(72 * B * S * L * D * D * (1 + S / (6 * D) + V / (12 * L * D)))


def test_bf16_matmuls_at_the_derated_tensor_core_peak(docs):
    a100 = dev.DEVICES["A100"]
    for precision, rate in (("bf16", 312e12 * dev.TENSOR_CORE_EFFICIENCY), ("fp32", 19.5e12)):
        mms = [n for n in docs[precision]["nodes"] if n["op"] in ("aten.mm", "aten.addmm")]
        assert len(mms) == 3 * (4 * L + 1)                 # 4 linears a block + the logits; 2 backward mms each
        for n in mms:
            want = max(n["flops"] / rate, n["bytes_moved"] / a100.bandwidth_Bps) + a100.launch_s
            assert n["compute_by_type"]["A100"] == pytest.approx(want, rel=1e-9, abs=1e-12), (precision, n["id"])
    # half tensors: a bf16 matmul moves half the bytes of its fp32 twin
    f32 = by_id(docs["fp32"])["addmm"]
    b16 = next(n for n in docs["bf16"]["nodes"] if n["op"] == "aten.addmm" and n["flops"] == f32["flops"])
    assert b16["bytes_moved"] == f32["bytes_moved"] // 2


def test_resident_bytes_and_pass(docs):
    for precision, doc in docs.items():
        pbytes = doc["meta"]["parameter_bytes"]
        nodes = by_id(doc)
        assert all(0 <= n["resident_bytes"] <= n["memory_bytes"] for n in doc["nodes"])
        # fp32 master weights + Adam's two moments are resident, in every precision
        assert sum(n["resident_bytes"] for n in doc["nodes"]) == 3 * pbytes
        updates = [n for n in doc["nodes"] if n["op"] == "optim.adam"]
        assert all(n["pass"] == "update" and n["resident_bytes"] == n["memory_bytes"] for n in updates)
        assert sum(n["memory_bytes"] for n in updates) == 2 * pbytes
        # kept gradients (fp32, the inputs of the updates) are activation of backward nodes: 16 bytes/parameter
        grads = {e["src"] for e in doc["edges"] if e["dst"].startswith("adam.")} - {n["id"] for n in updates}
        assert all(nodes[g]["pass"] == "backward" and nodes[g]["resident_bytes"] == 0 for g in grads), precision
        kept = sum(nodes[g]["memory_bytes"] for g in grads)
        assert kept == pbytes
        # the passes in graph order: inputs and forward up to the loss, then backward, then the updates
        order = [n["pass"] for n in doc["nodes"]]
        assert order == sorted(order, key=["forward", "backward", "update"].index)
        assert nodes["input_0"]["pass"] == nodes["target"]["pass"] == nodes["nll_loss_forward"]["pass"] == "forward"
        assert nodes["nll_loss_backward"]["pass"] == "backward"


def test_bf16_weights_are_cast_where_used(docs):
    """autocast: the fp32 weight is owned by its cast, whose half copy is kept for the backward pass."""
    nodes = docs["bf16"]["nodes"]
    owner = [n for n in nodes if n.get("colocation") == "param:blocks.0.fc.weight" and n["op"] != "optim.adam"]
    assert [n["op"] for n in owner] == ["aten._to_copy"]
    w = 4 * D * 4 * D                                        # fp32 bytes of fc.weight
    assert owner[0]["resident_bytes"] == w and owner[0]["memory_bytes"] == w + w // 2


def test_fp16_loss_scale_and_unscale(docs):
    doc = docs["fp16"]
    nodes = by_id(doc)
    forward = [n for n in doc["nodes"] if n["pass"] == "forward"]
    assert forward[-1]["op"] == "aten.mul" and forward[-2]["op"] == "aten.nll_loss_forward"   # loss x 2^16
    assert LOSS_SCALE == 2.0**16
    for e in doc["edges"]:
        if e["dst"].startswith("adam."):                     # every gradient unscaled before its update
            src = nodes[e["src"]]
            assert src["op"] == "aten.mul" and src["pass"] == "backward" and src["memory_bytes"] == e["bytes"]
    # one unscale per gradient and the loss scale: the fp16 step has exactly those muls more than bf16
    n_updates = sum(n["op"] == "optim.adam" for n in doc["nodes"])
    muls = {p: sum(n["op"] == "aten.mul" for n in docs[p]["nodes"]) for p in ("fp16", "bf16")}
    assert muls["fp16"] == muls["bf16"] + n_updates + 1


def test_fp32_is_the_default_and_unchanged():
    small = ZOO["transformer"].small
    plain = profile_model("transformer", 2, config=small)
    assert plain == profile_model("transformer", 2, config=small, precision="fp32")
    assert plain["meta"]["precision"] == "fp32"
    assert all(n["pass"] in ("forward", "backward", "update") for n in plain["nodes"])


def test_inference_is_all_forward_and_resident_parameters():
    doc = profile_model("gpt_6.7b", 2, config=SMALL, phase="inference")
    assert {n["pass"] for n in doc["nodes"]} == {"forward"}
    assert doc["meta"]["precision"] == "bf16"
    assert sum(n["resident_bytes"] for n in doc["nodes"]) == doc["meta"]["parameter_bytes"]


def test_cli_precision_option():
    r = CliRunner().invoke(main, ["profile", "--model", "gpt_1.3b", "-b", "2", "--precision", "fp16"]
                           + [f"--config={k}={v}" for k, v in SMALL.items()])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["precision"] == "fp16" and "tensor-core peak" in doc["meta"]["cost_model"]
    r = CliRunner().invoke(main, ["profile", "--synthetic", "layered", "--precision", "bf16"])
    assert r.exit_code == 2 and "--precision goes with --model" in r.output
    r = CliRunner().invoke(main, ["profile", "--model", "gpt_1.3b", "--precision", "fp8"])
    assert r.exit_code == 2
