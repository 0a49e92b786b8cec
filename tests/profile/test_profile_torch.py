"""`placer profile` on real PyTorch models (skipped without torch)."""

from __future__ import annotations

import json
import resource
from collections import deque

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from torch import nn  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.profile import standard_evaluation  # noqa: E402
from celeritas_cli.profile.capture import VIEW_OPS, profile_model  # noqa: E402
from celeritas_cli.profile.regression import extrapolate, measurements_from_graphs  # noqa: E402
from celeritas_cli.profile.zoo import ZOO  # noqa: E402

#: zoo models whose small config takes seconds to capture; a convolution network with branches (resnet50) stays
#: in the default suite
SLOW_TO_CAPTURE = {"inception_v3"}


class TinyMLP(nn.Module):
    """x[b,8] -> Linear(8,16) -> ReLU -> Linear(16,4) -> cross-entropy."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))

    def example_inputs(self, b):
        return (torch.randn(b, 8),)

    def example_target(self, b):
        return torch.zeros(b, dtype=torch.long)

    def loss(self, out, target):
        return F.cross_entropy(out, target)


SPEC = f"{__name__}:TinyMLP"


def by_id(doc):
    return {n["id"]: n for n in doc["nodes"]}


def edge_set(doc):
    return {(e["src"], e["dst"]): e["bytes"] for e in doc["edges"]}


def test_tiny_mlp_training_graph_nodes_edges_bytes():
    b = 32
    doc = profile_model(SPEC, b)
    nodes = by_id(doc)
    ops = {k: n["op"] for k, n in nodes.items()}
    assert ops["addmm"] == "aten.addmm" and ops["relu"] == "aten.relu" and ops["addmm_1"] == "aten.addmm"
    assert [k for k in nodes if k.startswith("adam.")] == ["adam.l1.weight", "adam.l1.bias",
                                                           "adam.l2.weight", "adam.l2.bias"]
    assert not any(op.split(".")[-1] in VIEW_OPS for op in ops.values())   # t / detach / getitem folded
    assert len(nodes) == 19
    E = edge_set(doc)
    f32 = 4
    assert E[("input_0", "addmm")] == b * 8 * f32
    assert E[("addmm", "relu")] == b * 16 * f32
    assert E[("relu", "addmm_1")] == b * 16 * f32
    assert E[("addmm_1", "_log_softmax")] == b * 4 * f32
    assert E[("mm_2", "adam.l1.weight")] == 16 * 8 * f32          # the weight gradient
    assert E[("sum_2", "adam.l1.bias")] == 16 * f32
    assert E[("addmm_1", "mm")] == 4 * 16 * f32                    # l2.weight read by the backward mm
    assert len(E) == len(doc["edges"])                             # no duplicate edges
    # one tensor per producer output, shared by all its consumers
    relu_out = {e["tensor"] for e in doc["edges"] if e["src"] == "relu"}
    assert relu_out == {"relu:0"} and sum(e["src"] == "relu" for e in doc["edges"]) == 3
    # memory: outputs + owned parameters (+ Adam's two moments on the update node)
    assert nodes["addmm"]["memory_bytes"] == b * 16 * f32 + (16 * 8 + 16) * f32
    assert nodes["relu"]["memory_bytes"] == b * 16 * f32
    assert nodes["adam.l1.weight"]["memory_bytes"] == 2 * 16 * 8 * f32
    assert nodes["mm_2"]["memory_bytes"] == 16 * 8 * f32           # kept gradient
    assert nodes["threshold_backward"]["memory_bytes"] == 0        # transient backward output
    assert sum(n["memory_bytes"] for n in doc["nodes"]) > 4 * doc["meta"]["parameter_bytes"]
    # colocation: owner op + its updates; costs and splittable
    assert {n["id"] for n in doc["nodes"] if n.get("colocation") == "param:l1.weight"} == {
        "addmm", "adam.l1.weight", "adam.l1.bias"}
    assert nodes["addmm"]["flops"] == 2 * b * 8 * 16 and nodes["addmm"]["splittable"] == ["batch"]
    assert nodes["addmm"]["compute_s"] == nodes["addmm"]["compute_by_type"]["V100"]
    assert nodes["addmm"]["compute_by_type"]["H100"] < nodes["addmm"]["compute_by_type"]["P4"]
    g = Graph.from_dict(doc)
    assert g.n == 19 and doc["meta"]["parameters"] == 8 * 16 + 16 + 16 * 4 + 4


def test_batch_independent_fields_agree_with_the_standard_evaluation_lines():
    f32 = 4
    doc = profile_model(SPEC, 32)
    assert doc["name"] == "tinymlp_b32"
    n = by_id(doc)
    l1 = (8 * 16 + 16) * f32
    assert n["addmm"]["batch_independent"] == {"memory_bytes": l1, "state_bytes": l1, "bytes_moved": l1}
    assert n["addmm_1"]["batch_independent"]["state_tensors"] == ["addmm_1:l2.weight"]   # read by the backward mm
    assert n["mm_2"]["batch_independent"]["memory_bytes"] == 16 * 8 * f32                # the kept gradient
    assert n["adam.l1.weight"]["batch_independent"]["memory_bytes"] == 2 * 16 * 8 * f32
    assert "batch_independent" not in n["relu"] and "batch_independent" not in n["input_0"]
    # an independent path: the intercept of each node's memory line against the batch size
    docs = [profile_model(SPEC, b) for b in (2, 4, 8)]
    est = extrapolate(measurements_from_graphs(docs, [2, 4, 8]), 32)
    for nd in est["nodes"]:
        intercept = nd["batch_line"]["memory_bytes"][0]
        # the loss node's two scalar outputs (loss, total weight) do not grow with the batch: the one-batch
        # capture counts them as activations, the lines see 8 constant bytes
        extra = 2 * f32 if nd["id"] == "nll_loss_forward" else 0
        assert intercept == pytest.approx(nd.get("batch_independent", {}).get("memory_bytes", 0) + extra,
                                          abs=1e-6), nd["id"]
    # data parallelism reduces exactly the parameters' gradients
    from celeritas_cli.transform.replicate import data_parallel_graph

    dp = data_parallel_graph(Graph.from_dict(doc), 2)
    assert dp.meta["data_parallel"]["gradients"] == 4
    assert dp.meta["data_parallel"]["gradient_bytes"] == doc["meta"]["parameter_bytes"]


def test_inference_phase_has_no_backward():
    doc = profile_model(SPEC, 4, phase="inference")
    assert [n["op"] for n in doc["nodes"]] == ["placeholder", "aten.addmm", "aten.relu", "aten.addmm"]
    assert doc["meta"]["phase"] == "inference"


def weakly_connected(g: Graph) -> bool:
    seen = {0}
    queue = deque([0])
    while queue:
        v = queue.popleft()
        for w in g.succ[v] + g.pred[v]:
            if w not in seen:
                seen.add(w)
                queue.append(w)
    return len(seen) == g.n


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_CAPTURE else n
                                  for n in sorted(ZOO)])
def test_zoo_small_configs_fold_views_and_stay_acyclic_connected(name):
    doc = profile_model(name, 2, config=ZOO[name].small)
    g = Graph.from_dict(doc)                      # validates: ids, endpoints, acyclic
    assert g.topo_order() and weakly_connected(g)
    assert not any(op.split(".")[-1] in VIEW_OPS for op in g.op)
    assert any(n.get("splittable") for n in doc["nodes"])
    assert all(n["compute_s"] > 0 for n in doc["nodes"])
    groups = g.colocation_groups()
    assert groups and all(len(v) >= 2 for v in groups.values())   # owner + its optimizer update(s)


def test_regression_extrapolation_reproduces_direct_capture_memory_exactly():
    cfg = ZOO["transformer"].small
    docs = [profile_model("transformer", b, config=cfg) for b in (2, 4, 8)]
    est = extrapolate(measurements_from_graphs(docs, [2, 4, 8]), 40)
    actual = profile_model("transformer", 40, config=cfg)
    assert [n["memory_bytes"] for n in est["nodes"]] == [n["memory_bytes"] for n in actual["nodes"]]
    assert [e["bytes"] for e in est["edges"]] == [e["bytes"] for e in actual["edges"]]
    assert [n["flops"] for n in est["nodes"]] == [n["flops"] for n in actual["nodes"]]


def test_standard_evaluation_reports_table5_and_rejects_batch_1():
    doc, table, how = standard_evaluation("tensor_holography", [2, 4], 16, config=ZOO["tensor_holography"].small)
    assert doc["meta"]["batch_size"] == 16 and "direct capture" in how
    assert table["memory"]["mean"] == 0 and table["memory"]["nodes"] == len(doc["nodes"])
    with pytest.raises(InvalidInput, match=">= 2"):
        standard_evaluation(SPEC, [1, 2, 4], 8)


def test_capture_allocates_nothing_at_huge_batch():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    doc = profile_model("tensor_holography", 32)               # ~40 GB of activations if real
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert sum(n["memory_bytes"] for n in doc["nodes"]) > 30 * 2**30
    assert grown_kib < 1024 * 1024                               # < 1 GiB of real memory


def test_measure_times_nodes_on_local_device():
    from celeritas_cli.profile import capture_model

    lines = []
    doc = capture_model(SPEC, 4, measure=True, progress=lines.append)
    m = doc["meta"]["measured"]
    assert m["measured"] == 17 and m["failed"] == 0 and m["estimator"] == "min-of-k"
    local = m["device"]
    assert all(n["compute_by_type"][local] == n["compute_s"] for n in doc["nodes"] if n["op"] != "placeholder")
    assert any("noise" in line for line in lines)


def test_measure_threads_recorded_and_file_py_models(tmp_path):
    from celeritas_cli.profile import capture_model
    from celeritas_cli.profile.models import resolve_model

    doc = capture_model(SPEC, 2, measure=True, threads=1)
    assert doc["meta"]["measured"]["threads"] == 1
    adam = [n for n in doc["nodes"] if n["op"] == "optim.adam"]
    assert all(n["compute_by_type"]["cpu"] == n["compute_s"] > 0 for n in adam)
    f = tmp_path / "mynet.py"
    f.write_text("from tests.profile.test_profile_torch import TinyMLP\n\ndef build(width=16):\n    return TinyMLP()\n")
    factory, name = resolve_model(f"{f}:build")
    assert name == "build" and isinstance(factory(), TinyMLP)
    assert len(profile_model(f"{f}:build", 2)["nodes"]) == 19
    with pytest.raises(InvalidInput, match="no such file"):
        resolve_model(f"{tmp_path / 'nope.py'}:build")
    with pytest.raises(InvalidInput, match="has no attribute 'missing'"):
        resolve_model(f"{f}:missing")


@pytest.mark.slow
def test_comm_bench_between_two_processes_writes_a_cpu_cluster(tmp_path):
    out = tmp_path / "cpu2.json"
    r = CliRunner().invoke(main, ["profile", "--comm-bench", "--processes", "2", "--threads", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert [(d["id"], d["type"]) for d in doc["devices"]] == [("cpu0", "cpu"), ("cpu1", "cpu")]
    assert doc["meta"]["comm_bench"] == {"processes": 2, "dist_backend": "gloo", "threads": 1}
    assert {(p["src"], p["dst"]) for p in doc["links"]["pairs"]} == {("cpu0", "cpu1"), ("cpu1", "cpu0")}
    assert all(p["bandwidth_Bps"] > 0 for p in doc["links"]["pairs"])


def test_cli_model_module_attr_and_errors():
    r = CliRunner().invoke(main, ["profile", "--model", SPEC, "-b", "4"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["nodes"]) == 19 and "19 nodes" in r.stderr
    r = CliRunner().invoke(main, ["profile", "--model", "nosuchmodel"])
    assert r.exit_code == 1 and "unknown model" in r.output
    r = CliRunner().invoke(main, ["profile", "--model", "json:nothing_here", "-b", "2"])
    assert r.exit_code == 1 and "no attribute" in r.output


def test_batch_sizes_without_a_target_give_the_graph_at_the_batch_with_its_lines():
    """`profile -b 4 --batch-sizes 2,4`: the nodes keep the values captured at 4 and carry the lines
    through 2 and 4 that data parallelism and micro-batching read (batch_line)."""
    from celeritas_cli.profile.request import ProfileRequest, make

    doc = make(ProfileRequest(model=SPEC, batch_size=4, batch_sizes=[2, 4])).doc
    at2, at4 = by_id(profile_model(SPEC, 2)), by_id(profile_model(SPEC, 4))
    assert doc["meta"]["batch_size"] == 4
    for nd in doc["nodes"]:
        assert nd["compute_s"] == at4[nd["id"]]["compute_s"]
        a, b = nd["batch_line"]["compute_s"]
        assert nd["batch_line"]["batch"] == 4
        assert a + 2 * b == pytest.approx(at2[nd["id"]]["compute_s"], rel=1e-9, abs=1e-15)
    assert make(ProfileRequest(model=SPEC, batch_sizes=[2, 4])).doc["meta"]["batch_size"] == 4
