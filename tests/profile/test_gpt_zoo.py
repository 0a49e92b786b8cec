"""The bundled GPT graphs (sample_graphs/zoo/gpt_*.json.gz; no torch needed): sizes, the memory
that makes the 6.7B model a placement problem, and the MFU anchor of the tensor-core efficiency."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeritas_cli import registry
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.sim.mfu import mfu, model_flops
from celeritas_cli.sim.simulator import simulate

ZOO = Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo"
GiB = 2**30
#: published MFU band: Megatron-LM on A100-80GB, 41.5 % (22B) to 56.3 % (1T) (Korthikanti et al. 2022)
BAND = (0.415, 0.563)


@pytest.fixture(scope="module")
def gpt():
    return {s: load_graph(str(ZOO / f"gpt_{s}.json.gz")) for s in ("1.3b", "6.7b")}


def _extra(g, key):
    return [(ex or {}).get(key) for ex in g.node_extra]


def test_sizes_precision_and_batch(gpt):
    g13, g67 = gpt["1.3b"], gpt["6.7b"]
    assert (g13.meta["precision"], g13.meta["batch_size"]) == ("bf16", 8)
    assert (g67.meta["precision"], g67.meta["batch_size"]) == ("bf16", 16)
    assert g13.meta["parameters"] == pytest.approx(1.32e9, rel=0.01)
    assert g67.meta["parameters"] == pytest.approx(6.66e9, rel=0.01)
    assert set(_extra(g67, "pass")) == {"forward", "backward", "update"}


def test_weights_and_adam_state_do_not_fit_an_80gb_a100(gpt):
    a100 = load_cluster("8xA100-nvswitch").devices[0].memory
    g67 = gpt["6.7b"]
    resident = sum(_extra(g67, "resident_bytes"))
    assert resident == 3 * g67.meta["parameter_bytes"]               # fp32 weights + two Adam moments
    assert resident + g67.meta["parameter_bytes"] > a100 > 0          # + fp32 gradients: 16 B/parameter
    assert (resident + g67.meta["parameter_bytes"]) / g67.meta["parameters"] == pytest.approx(16, rel=1e-6)
    assert gpt["1.3b"].total_memory() < a100                           # 1.3B at batch 8 fits one A100-80GB


def test_single_a100_mfu_in_the_published_band(gpt):
    one = load_cluster("8xA100-nvswitch")
    for name, g in gpt.items():
        t = sum(by["A100"] for by in g.compute_by_type)               # every node in sequence on one A100
        value = model_flops(g) / (t * 312e12)
        assert BAND[0] < value < BAND[1], name
        # the same number through the report's definition: 8 devices, 8 x the time
        assert mfu(g, one, t / 8) == pytest.approx(value, rel=1e-12)


@pytest.mark.slow   # 8 replicas of 2206 nodes: about 10 s
def test_data_parallel_6_7b_is_oom_on_8xa100(gpt):
    c = load_cluster("8xA100-nvswitch")
    g = gpt["6.7b"]
    rep = simulate(g, c, registry.place(g, c, "data-parallel"))
    assert rep["status"] == "OOM" and len(rep["oom_devices"]) == 8
    # what it would reach with the memory: MFU of the graph given, not of the 8 replicas
    assert 0.3 < rep["mfu"] < BAND[1]


@pytest.mark.parametrize("name", ["gpt_1.3b", "gpt_6.7b", "transformer", "inception_v3", "nmt"])
def test_pass_field_agrees_with_the_structural_fallback(name):
    """Two independent paths: the capture knows where the backward starts (the loss), the fallback of
    transform/passes.py finds it from the graph's shape (gradient-op names reached from the loss seed)."""
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.model.jsonio import read_json
    from celeritas_cli.transform.passes import node_passes

    doc = read_json(str(ZOO / f"{name}.json.gz"))
    field = [nd.pop("pass") for nd in doc["nodes"]]
    assert node_passes(Graph.from_dict(doc)) == field
