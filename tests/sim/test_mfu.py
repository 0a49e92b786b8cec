"""Model FLOPs utilisation (sim/mfu.py) and the tensor-core rates it is measured against."""

from __future__ import annotations

import math

import pytest

from celeritas_cli.model import devices as dev
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.mfu import mfu, model_flops, peak_flops
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import derive


def _graph(precision: str | None, flops=(3.0e12, 6.0e12)):
    nodes = [{"id": "a", "compute_s": 1.0, "memory_bytes": 0, "flops": flops[0]},
             {"id": "b", "compute_s": 2.0, "memory_bytes": 0, "flops": flops[1]}]
    meta = {"precision": precision} if precision else {}
    return build("g", nodes, [{"src": "a", "dst": "b", "bytes": 100}], meta=meta)


def test_hand_graph_mfu_in_the_report():
    # a on gpu0 (1 s), 100 B at 100 B/s (1 s), b on gpu1 (2 s): makespan 4 s
    c = uniform(2, bandwidth=100.0, latency=0.0, dtype="A100")
    g = _graph("bf16")
    rep = simulate(g, c, Placement("g", c.name, "given", {"a": "gpu0", "b": "gpu1"}))
    assert rep["makespan_s"] == 4.0
    # 9 TFLOP / (4 s x 2 x 312 TFLOP/s bf16 peak)
    assert rep["mfu"] == pytest.approx(9.0e12 / (4.0 * 2 * 312e12), rel=1e-12)
    # the same graph without meta.precision is fp32: the A100's 19.5 TFLOP/s CUDA-core peak
    rep32 = simulate(_graph(None), c, Placement("g", c.name, "given", {"a": "gpu0", "b": "gpu0"}))
    assert rep32["makespan_s"] == 3.0
    assert rep32["mfu"] == pytest.approx(9.0e12 / (3.0 * 2 * 19.5e12), rel=1e-12)


def test_mfu_is_none_without_flops_or_datasheet():
    g = build("g", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0, "flops": 5.0},
                    {"id": "b", "compute_s": 1.0, "memory_bytes": 0}], [])
    assert model_flops(g) is None                          # one node records no flops: no MFU
    assert mfu(g, uniform(1, dtype="A100"), 2.0) is None
    assert peak_flops(_graph("bf16"), uniform(2, dtype="generic")) is None
    assert mfu(_graph("bf16"), uniform(2, dtype="generic"), 2.0) is None
    assert mfu(_graph("bf16"), uniform(2, dtype="A100"), 0.0) is None
    # a part without bf16 (V100) is measured against its fp32 peak, fp16 against its tensor-core peak
    assert peak_flops(_graph("bf16"), uniform(1, dtype="V100")) == 14.0e12
    assert peak_flops(_graph("fp16"), uniform(1, dtype="V100")) == 112.0e12


def test_replicas_do_not_inflate_model_flops():
    """Data parallelism runs 1/k of each node per replica plus all-reduce steps; MFU counts the
    graph given, so report.mfu x makespan x peak = the given graph's flops (not the derived graph's)."""
    nodes = [{"id": "x", "compute_s": 0.0, "memory_bytes": 0, "flops": 0},
             {"id": "w", "op": "aten.mm", "compute_s": 4.0, "memory_bytes": 64, "flops": 8.0e12,
              "colocation": "p", "splittable": ["batch"]},
             {"id": "gw", "op": "aten.mm", "compute_s": 4.0, "memory_bytes": 64, "flops": 8.0e12,
              "splittable": ["batch"]},
             {"id": "adam.w", "op": "optim.adam", "compute_s": 0.5, "memory_bytes": 128, "flops": 1.0e9,
              "colocation": "p"}]
    edges = [{"src": "x", "dst": "w", "bytes": 1000}, {"src": "w", "dst": "gw", "bytes": 1000},
             {"src": "gw", "dst": "adam.w", "bytes": 64}]
    g = build("dp", nodes, edges, meta={"precision": "bf16", "batch_size": 4})
    c = uniform(2, bandwidth=1.0e9, latency=0.0, dtype="A100")
    step = {"transform": "data-parallel", "replicas": 2, "scaling": "strong"}
    derived = derive(g, {"steps": [step]})
    assert any((ex or {}).get("allreduce") for ex in derived.node_extra)
    assert model_flops(derived) is None                  # all-reduce steps record no flops
    replicated = sum((ex or {}).get("flops", 0) for ex in derived.node_extra)
    assert replicated == pytest.approx(16.0e12 + 2 * 1.0e9)   # every replica runs the whole update
    assign = {derived.ids[v]: f"gpu{(derived.node_extra[v] or {}).get('replica', 0)}" for v in range(derived.n)}
    p = Placement("dp", c.name, "data-parallel", assign, derivation={"steps": [step]},
                  split_graph=derived.to_dict())
    rep = simulate(g, c, p)
    assert rep["mfu"] * rep["makespan_s"] * 2 * 312e12 == pytest.approx(16.0e12 + 1.0e9, rel=1e-12)


def test_tensor_core_rate_and_precision_peaks():
    a100 = dev.DEVICES["A100"]
    eff = dev.TENSOR_CORE_EFFICIENCY
    assert 0.5 <= eff <= 0.75
    assert a100.rate("bfloat16", True) == pytest.approx(312e12 * eff)
    assert a100.rate("float16", True) == pytest.approx(312e12 * eff)
    assert a100.rate("float32", True) == 19.5e12           # fp32 path unchanged: the papers' roofline
    assert a100.rate("bfloat16", False) == 19.5e12         # pointwise ops on half tensors: fp32 rate
    assert dev.DEVICES["V100"].rate("bfloat16", True) == 14.0e12   # no bf16 on Volta: fp32 rate, no derating
    assert dev.DEVICES["H100"].precision_peak("bf16") == 989e12
    assert a100.precision_peak("fp32") == a100.precision_peak("anything else") == 19.5e12
    # a compute-bound bf16 matmul: 1 s of work at the derated rate, plus one launch
    t = dev.roofline_time(312e12 * eff, 0, "A100", dtype="bfloat16", tensor_core_op=True)
    assert math.isclose(t, 1.0 + a100.launch_s)


def test_simulate_table_prints_mfu(tmp_path):
    import json

    from click.testing import CliRunner

    from celeritas_cli.cli import main

    g = _graph("bf16").to_dict()
    c = uniform(2, bandwidth=100.0, latency=0.0, dtype="A100").to_dict()
    p = Placement("g", c["name"], "given", {"a": "gpu0", "b": "gpu1"}).to_dict()
    for name, doc in (("g.json", g), ("c.json", c), ("p.json", p)):
        (tmp_path / name).write_text(json.dumps(doc))
    args = ["simulate", str(tmp_path / "g.json"), "-P", str(tmp_path / "p.json"), "-c", str(tmp_path / "c.json")]
    r = CliRunner().invoke(main, args + ["--format", "table"])
    assert r.exit_code == 0, r.output
    assert "model FLOPs utilisation (MFU): 0.4%" in r.stdout          # 9e12 / (4 s x 624e12) = 0.36 %
    r = CliRunner().invoke(main, args)
    assert json.loads(r.stdout)["mfu"] == pytest.approx(9.0e12 / (4.0 * 2 * 312e12))
