"""`placer profile` without torch: regression, measurements JSON, comm fit,
roofline, synthetic graphs, CLI modes."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput, MissingDependency
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.graph import Graph
from celeritas_cli.profile import from_measurements, synthetic
from celeritas_cli.profile.commfit import fit_cluster, fit_link
from celeritas_cli.model.devices import DEVICES, TENSOR_CORE_EFFICIENCY, roofline_time, times_by_type
from celeritas_cli.profile.flops import attention_flops, formula_flops
from celeritas_cli.profile.regression import (
    check_measurements,
    deviation,
    extrapolate,
    fit_line,
    leave_one_out,
    measurements_from_graphs,
    predict,
)


def meas_doc(sizes=(2, 4, 8), time_fn=lambda b: 1e-3 * b + 2e-4):
    """conv (params 1000 B + 100 B per sample) -> relu -> loss, colocated conv."""
    return {
        "schema": "placer.measurements/v1", "name": "toy", "meta": {"phase": "training"},
        "batch_sizes": list(sizes),
        "nodes": [
            {"id": "conv", "op": "aten.convolution", "memory_bytes": [1000 + 100 * b for b in sizes],
             "compute_s": [time_fn(b) for b in sizes],
             "compute_by_type": {"V100": [time_fn(b) for b in sizes], "T4": [3 * time_fn(b) for b in sizes]},
             "colocation": "param:conv.weight", "splittable": ["batch", "channel"]},
            {"id": "relu", "op": "aten.relu", "memory_bytes": [64 * b for b in sizes], "compute_s": 1e-5},
            {"id": "loss", "op": "aten.nll_loss_forward", "memory_bytes": 4, "compute_s": [1e-5] * len(sizes)},
        ],
        "edges": [
            {"src": "conv", "dst": "relu", "bytes": [64 * b for b in sizes], "tensor": "conv:0"},
            {"src": "relu", "dst": "loss", "bytes": [64 * b for b in sizes], "tensor": "relu:0"},
        ],
    }


# ----------------------------------------------------------------- regression
def test_fit_line_exact_and_needs_two_sizes():
    assert fit_line([2, 4, 8], [7, 11, 19]) == (3.0, 2.0)
    assert predict([2, 4], [5, 5], 1000) == 5
    assert predict([2, 4, 8], [10, 6, 2], 100, integer=True) == 0      # clamped at 0
    with pytest.raises(InvalidInput, match="two distinct batch sizes"):
        fit_line([4, 4], [1, 2])


def test_extrapolate_memory_time_edges_exactly_linear():
    g = extrapolate(check_measurements(meas_doc()), 512)
    conv, relu, loss = g["nodes"]
    assert conv["memory_bytes"] == 1000 + 100 * 512 and isinstance(conv["memory_bytes"], int)
    assert conv["compute_s"] == pytest.approx(1e-3 * 512 + 2e-4)
    assert conv["compute_by_type"]["T4"] == pytest.approx(3 * (1e-3 * 512 + 2e-4))
    assert conv["colocation"] == "param:conv.weight" and conv["splittable"] == ["batch", "channel"]
    assert relu["memory_bytes"] == 64 * 512 and relu["compute_s"] == 1e-5 and loss["memory_bytes"] == 4
    assert [e["bytes"] for e in g["edges"]] == [64 * 512, 64 * 512]
    assert g["meta"]["batch_size"] == 512 and g["meta"]["standard_evaluation"]["batch_sizes"] == [2, 4, 8]
    graph = Graph.from_dict(g, "extrapolated")           # a valid placer.graph/v1 document
    assert graph.n == 3 and graph.total_memory() == 1000 + 100 * 512 + 64 * 512 + 4


def test_leave_one_out_deviation_zero_when_linear_and_positive_otherwise():
    est, act, big = leave_one_out(meas_doc())
    assert big == 8
    table = deviation(est, act)
    assert table["memory"]["mean"] == 0 and table["time"]["mean"] == pytest.approx(0, abs=1e-12)
    # time grows quadratically: the line through b=2,4 underestimates b=8
    est, act, _ = leave_one_out(meas_doc(time_fn=lambda b: 1e-4 * b * b))
    conv_dev = abs(est["nodes"][0]["compute_s"] - act["nodes"][0]["compute_s"]) / act["nodes"][0]["compute_s"]
    assert conv_dev == pytest.approx((64 - (6 * 8 - 8)) / 64)   # line through (2,4),(4,16): 6b-8
    t = deviation(est, act)["time"]
    assert t["nodes"] == 3 and t["mean"] == pytest.approx(conv_dev / 3)
    assert leave_one_out(meas_doc(sizes=(2, 4))) is None


def test_from_measurements_api():
    g, table, how = from_measurements(meas_doc(), 64)
    assert g["name"] == "toy_b64" and table["memory"]["exact"] == 1.0 and "leave-one-out" in how


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(batch_sizes=[4]), "at least two integers"),
    (lambda d: d.update(batch_sizes=[2, 2, 4]), "repeated batch size"),
    (lambda d: d["nodes"][0].update(memory_bytes=[1, 2]), "node 'conv' field memory_bytes: has 2 values"),
    (lambda d: d["nodes"][1].update(compute_s=-1.0), "node 'relu' field compute_s"),
    (lambda d: d["nodes"][1].pop("memory_bytes"), "node 'relu': missing field memory_bytes"),
    (lambda d: d["edges"][0].update(dst="nope"), "unknown dst node 'nope'"),
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "node 'conv' is defined twice"),
    (lambda d: d.update(schema="placer.graph/v1"), "expected \"placer.measurements/v1\""),
])
def test_measurements_errors_name_the_field(mutate, message):
    doc = meas_doc()
    mutate(doc)
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_measurements(doc, "m.json")


def test_measurements_from_graphs_rejects_structure_change():
    a = synthetic("layered", 30, seed=1)
    b = synthetic("layered", 31, seed=1)
    with pytest.raises(InvalidInput, match="depends on the batch size"):
        measurements_from_graphs([a, b], [2, 4])
    m = measurements_from_graphs([a, a], [2, 4])
    g = extrapolate(m, 100)
    assert [n["memory_bytes"] for n in g["nodes"]] == [n["memory_bytes"] for n in a["nodes"]]


# ------------------------------------------------------------------ comm fit
def samples_doc():
    k = {("gpu0", "gpu1"): (1e-10, 1e-5), ("gpu1", "gpu0"): (2e-10, 3e-5)}
    samples = [{"src": s, "dst": d, "bytes": size, "seconds": kk * size + bb}
               for (s, d), (kk, bb) in k.items() for size in (1024, 1 << 20, 1 << 26)]
    return {"schema": "placer.comm_samples/v1", "name": "box",
            "devices": [{"id": "gpu0", "type": "V100", "memory_bytes": 1 << 34},
                        {"id": "gpu1", "type": "T4", "memory_bytes": 1 << 33}],
            "samples": samples}


def test_comm_fit_recovers_k_and_b_per_pair():
    doc = fit_cluster(samples_doc())
    c = Cluster.from_dict(doc, "fitted")
    assert c.bandwidth[0][1] == pytest.approx(1e10) and c.latency[0][1] == pytest.approx(1e-5)
    assert c.bandwidth[1][0] == pytest.approx(5e9) and c.latency[1][0] == pytest.approx(3e-5)
    assert c.comm_time(1 << 20, 1, 0) == pytest.approx(2e-10 * (1 << 20) + 3e-5)
    assert [d.type for d in c.devices] == ["V100", "T4"] and c.devices[1].memory == 1 << 33
    assert doc["meta"]["fit"]["gpu0->gpu1"]["r2"] == pytest.approx(1.0)
    assert doc["meta"]["fit"]["default"]["n"] == 6


def test_comm_fit_errors_and_defaults():
    with pytest.raises(InvalidInput, match="two or more distinct byte sizes"):
        fit_link([(100, 1.0), (100, 2.0)], "pair a->b")
    with pytest.raises(InvalidInput, match="not positive"):
        fit_link([(100, 2.0), (200, 1.0)], "pair a->b")
    doc = samples_doc()
    doc["samples"][0]["dst"] = "gpu9"
    with pytest.raises(InvalidInput, match="unknown device 'gpu9'"):
        fit_cluster(doc)
    doc = samples_doc()
    del doc["devices"]
    warned = []
    out = fit_cluster(doc, warn=warned.append)
    assert [d["id"] for d in out["devices"]] == ["gpu0", "gpu1"] and warned


def test_comm_fit_relative_weighting_fits_latency_on_small_transfers():
    """100 us + 1 GB/s, the largest sample 20% slow (a busy machine): the plain least-squares line
    takes its latency from that sample, the relative fit from the small ones."""
    pts = [(1e3, 1.01e-4), (1e4, 1.1e-4), (1e5, 2.0e-4), (1e6, 1.1e-3), (1e8, 0.12)]
    plain, rel = fit_link(pts, "a->b"), fit_link(pts, "a->b", weighting="relative")
    assert rel["latency_s"] == pytest.approx(1e-4, rel=0.05)
    assert abs(plain["latency_s"] - 1e-4) > 5e-5
    exact = [(d, 1e-4 + d / 1e9) for d in (1e3, 1e5, 1e7)]
    for f in (fit_link(exact, "x"), fit_link(exact, "x", weighting="relative")):
        assert f["latency_s"] == pytest.approx(1e-4) and f["bandwidth_Bps"] == pytest.approx(1e9)
    doc = fit_cluster(samples_doc(), weighting="relative")
    assert doc["meta"]["weighting"] == "relative"
    assert Cluster.from_dict(doc, "c").latency[1][0] == pytest.approx(3e-5)


# ------------------------------------------------------------ roofline/flops
def test_roofline_compute_and_memory_bound():
    v = DEVICES["V100"]
    assert roofline_time(v.fp32, 0, "V100") == pytest.approx(1.0 + v.launch_s)
    assert roofline_time(0, v.bandwidth_Bps * 2, "V100") == pytest.approx(2.0 + v.launch_s)
    # half-precision matmuls use the tensor cores (at TENSOR_CORE_EFFICIENCY of their peak), pointwise ops do not
    assert roofline_time(v.fp16 * TENSOR_CORE_EFFICIENCY, 0, "V100", dtype="float16",
                         tensor_core_op=True) == pytest.approx(1 + v.launch_s)
    assert roofline_time(v.fp16, 0, "V100", dtype="float16") == pytest.approx(8 + v.launch_s)
    t = times_by_type(1e12, 1e9)
    assert set(t) == {"V100", "P100", "T4", "P4", "2080Ti", "3060Ti", "A100", "H100"}
    assert t["H100"] < t["A100"] < t["V100"] < t["P100"] < t["P4"]
    with pytest.raises(InvalidInput, match="unknown device type"):
        roofline_time(1, 1, "TPU")


def test_flop_formulas():
    assert formula_flops("aten.add.Tensor", [(4, 5), (4, 5)], [(4, 5)]) == 20
    assert formula_flops("aten.tanh", [(10,)], [(10,)]) == 40
    assert formula_flops("aten.native_layer_norm", [(2, 8)], [(2, 8), (2, 1), (2, 1)]) == 7 * 16
    assert formula_flops("aten.embedding", [(100, 8), (4,)], [(4, 8)]) == 0
    assert formula_flops("aten.max_pool2d_with_indices", [(1, 1, 4, 4)], [(1, 1, 2, 2), (1, 1, 2, 2)],
                         kernel=(3, 3)) == 36
    fwd = attention_flops((2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8))
    assert fwd == 2 * (8 * 16 * 32) * 8 * 2 + 5 * 8 * 16 * 32
    assert formula_flops("aten._scaled_dot_product_flash_attention_for_cpu_backward",
                         [(2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)], []) > fwd
    assert formula_flops("aten.somethingnew", [(5,)], [(5,)]) == 0


# --------------------------------------------------------------------- CLI
def run(args, input=None):
    return CliRunner().invoke(main, args, input=input)


def test_cli_synthetic_is_deterministic_and_wraps_layered():
    a = run(["profile", "--synthetic", "layered", "--nodes", "120", "--seed", "3"])
    b = run(["profile", "--synthetic", "layered", "--nodes", "120", "--seed", "3"])
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout
    doc = json.loads(a.stdout)
    assert len(doc["nodes"]) == 120 and doc == orjson.loads(orjson.dumps(synthetic("layered", 120, 3)))
    assert "120 nodes" in a.stderr


def test_cli_from_measurements_and_comm_fit(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(meas_doc()))
    r = run(["profile", "--from-measurements", str(m), "--target-batch", "256", "-o", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    g = Graph.from_dict(json.loads((tmp_path / "g.json").read_text()))
    assert g.memory[0] == 1000 + 100 * 256 and r.stdout == ""
    assert "Mem Dev." in r.stderr and "Table 5" in r.stderr
    s = tmp_path / "s.json"
    s.write_text(json.dumps(samples_doc()))
    r = run(["profile", "--comm-fit", str(s)])
    assert r.exit_code == 0, r.output
    assert Cluster.from_dict(json.loads(r.stdout)).bandwidth[0][1] == pytest.approx(1e10)
    assert "gpu0->gpu1" in r.stderr


def test_cli_usage_and_input_errors(tmp_path):
    assert run(["profile"]).exit_code == 2
    assert run(["profile", "--synthetic", "layered", "--comm-fit", "x.json"]).exit_code == 2
    m = tmp_path / "m.json"
    m.write_text(json.dumps(meas_doc()))
    assert run(["profile", "--from-measurements", str(m)]).exit_code == 2        # no --target-batch
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "placer.measurements/v1", "batch_sizes": [2]}))
    r = run(["profile", "--from-measurements", str(bad), "--target-batch", "8"])
    assert r.exit_code == 1 and "batch_sizes" in r.output
    r = run(["profile", "--comm-fit", str(tmp_path / "missing.json")])
    assert r.exit_code == 1 and "no such file" in r.output


def test_profile_request_library_call(tmp_path):
    """The click command is a thin layer: make() gives the same documents, and the same usage rules."""
    from celeritas_cli.profile.request import ProfileRequest, fit_lines, make, summary_line

    res = make(ProfileRequest(synthetic="layered", nodes=50, seed=2))
    assert res.kind == "graph" and res.doc == synthetic("layered", 50, 2) and res.table is None
    assert summary_line(res.doc).startswith("layered_n50_s2: 50 nodes")
    m = tmp_path / "m.json"
    m.write_text(json.dumps(meas_doc()))
    res = make(ProfileRequest(measurements=str(m), target_batch=16))
    assert res.doc["nodes"][0]["memory_bytes"] == 1000 + 100 * 16
    assert res.table is not None and res.how.startswith("leave-one-out")    # three sizes: 2, 4, 8
    s = tmp_path / "s.json"
    s.write_text(json.dumps(samples_doc()))
    said = []
    res = make(ProfileRequest(comm_fit=str(s)), said.append)
    assert res.kind == "cluster" and any(line.startswith("gpu0->gpu1: k = 1e-10 s/B") for line in fit_lines(res.doc))
    for req, message in ((ProfileRequest(), "got none"),
                         (ProfileRequest(synthetic="layered", model="x"), "got --model, --synthetic"),
                         (ProfileRequest(synthetic="layered", processes=2), "--processes goes with --comm-bench"),
                         (ProfileRequest(measurements=str(m)), "needs --target-batch"),
                         (ProfileRequest(model="x", target_batch=8), "--target-batch needs --batch-sizes")):
        assert message in req.usage_problem()
        with pytest.raises(InvalidInput, match=message.replace("-", "\\-")):
            make(req)


def test_torch_parts_raise_missing_dependency_without_torch(monkeypatch):
    from celeritas_cli.profile.capture import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
    with pytest.raises(MissingDependency, match=r"pip install -e \.\[torch\]"):
        require_torch()
    r = run(["profile", "--comm-bench"])
    assert r.exit_code == 1 and "pip install -e .[torch]" in r.output
    r = run(["profile", "--model", "transformer", "-b", "4"])
    assert r.exit_code == 1 and "torch" in r.output
    for cmd in ("run", "export"):
        r = run([cmd, "--model", "transformer", "-b", "4", "-P", "p.json"])
        assert r.exit_code == 1 and "pip install -e .[torch]" in r.output
    r = run(["profile", "--synthetic", "layered", "--processes", "2"])
    assert r.exit_code == 2 and "--processes goes with --comm-bench" in r.output


def test_package_import_does_not_import_torch():
    import subprocess

    code = ("import sys, celeritas_cli.profile, celeritas_cli.profile.regression, celeritas_cli.profile.commfit, "
            "celeritas_cli.profile.capture, celeritas_cli.profile.stepmap, celeritas_cli.cli.profile_cmd, "
            "celeritas_cli.run, celeritas_cli.run.program, celeritas_cli.run.executor, celeritas_cli.run.dist, "
            "celeritas_cli.run.report, celeritas_cli.run.export, celeritas_cli.profile.commbench, "
            "celeritas_cli.cli.run_cmd, celeritas_cli.cli.export_cmd; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_standard_evaluation_records_each_nodes_lines():
    m = {"schema": "placer.measurements/v1", "name": "m", "batch_sizes": [2, 4, 8],
         "nodes": [{"id": "a", "memory_bytes": [10, 18, 34], "compute_s": [1.0, 1.5, 2.5],
                    "compute_by_type": {"T4": [2.0, 3.0, 5.0]}},
                   {"id": "u", "memory_bytes": 64, "compute_s": 0.25}], "edges": []}
    g, _, _ = from_measurements(m, 16)
    a, u = g["nodes"]
    assert a["batch_line"] == {"batch": 16, "compute_s": [0.5, 0.25], "memory_bytes": [2.0, 4.0],
                               "compute_by_type": {"T4": [1.0, 0.5]}}
    assert a["compute_s"] == pytest.approx(0.5 + 0.25 * 16)
    assert u["batch_line"] == {"batch": 16, "compute_s": [0.25, 0.0], "memory_bytes": [64.0, 0.0]}
