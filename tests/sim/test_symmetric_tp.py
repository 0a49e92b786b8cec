"""Tensor ranks judged as kinds (sim/symmetric.py, "Tensor ranks"): a megatron plan builds and simulates
tensor rank 0 of one replica of each kind, and its report, expanded to every (replica, tensor rank), equals
the full event simulation of every rank of every replica - makespan, every device's peak memory and busy
time, every link's bytes, to a relative 1e-9 - for tp 2 and 4, with and without sequence parallelism, dp 1
and 2, pp 1 and 2 (1F1B) and recompute none / full / selective.

The model is the tiny one-layer GPT of tests/transform/test_tensor_parallel.py, costed at a batch of 8,
with 4 attention heads (``meta.config.heads``: hidden 8, MLP 32 and vocabulary 16 divide by 4 too)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.graph import Graph
from celeritas_cli.model.placement import Placement
from celeritas_cli.model.servers import make_doc
from celeritas_cli.sim import symmetric
from celeritas_cli.sim.describe import nodes_per_device
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import derive
from celeritas_cli.transform.tensor_parallel import rank_ids, rename_rank, tensor_parallel_graph

from ..transform.test_tensor_parallel import tiny_gpt

REL = 1e-9


def gpt4() -> Graph:
    doc = tiny_gpt().to_dict()
    doc["meta"]["batch_size"] = 8
    doc["meta"]["config"] = {"heads": 4}
    return Graph.from_dict(doc, label="tiny_gpt4")


def servers(n: int, gpus: int) -> Cluster:
    return Cluster.from_dict(make_doc(name=f"{n}x{gpus}", servers=n, gpus_per_server=gpus, gpu="A100-80GB",
                                      intra="nvswitch", inter="ib-hdr-200", nics=gpus))


@pytest.fixture(scope="module")
def g():
    return gpt4()


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-15)


def assert_equal_reports(sym: dict, full: dict) -> None:
    """The judged report against the full simulation: makespan, status, every device's peak memory, busy time
    and node count, every link's transfers and bytes, the totals; all to a relative 1e-9."""
    assert _close(sym["makespan_s"], full["makespan_s"]), (sym["makespan_s"], full["makespan_s"])
    assert sym["status"] == full["status"]
    assert [d["id"] for d in sym["devices"]] == [d["id"] for d in full["devices"]]
    for a, b in zip(sym["devices"], full["devices"]):
        assert _close(a["memory_bytes"], b["memory_bytes"]), (a["id"], a["memory_bytes"], b["memory_bytes"])
        assert _close(a["busy_s"], b["busy_s"]), (a["id"], a["busy_s"], b["busy_s"])
        assert a["nodes"] == b["nodes"], a["id"]
    assert [(x["src"], x["dst"]) for x in sym["links"]] == [(x["src"], x["dst"]) for x in full["links"]]
    for a, b in zip(sym["links"], full["links"]):
        assert a["transfers"] == b["transfers"] and _close(a["bytes"], b["bytes"]), (a, b)
    assert sym["transfers"] == full["transfers"]


def _cluster(k: int) -> Cluster:
    return servers(max(1, k // 4), min(4, k))


CASES = list(itertools.product((2, 4), (False, True), (1, 2), (1, 2), ("none", "full", "selective")))
#: a covering subset run by default (every value of every parameter, every recompute with pp 2 and with sp)
QUICK = {(2, False, 2, 2, "full"), (4, True, 2, 2, "selective"), (4, False, 1, 2, "none"),
         (2, True, 1, 1, "full"), (4, True, 2, 1, "full"), (2, False, 2, 1, "selective")}


def _params(case) -> dict:
    tp, sp, dp, pp, rc = case
    return {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 1, "sequence_parallel": sp, "recompute": rc}


def _check_case(g: Graph, case) -> None:
    tp, sp, dp, pp, rc = case
    cl = _cluster(tp * dp * pp)
    p = registry.place(g, cl, "megatron", params=_params(case))
    assert p.replicas is not None and len(p.replicas["tensor"]) == tp  # rank 0 built, the others by the map
    assert all("/tp0" in nid for nid in p.assignment)
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["how"] == "symmetric" and sym["judge"]["tensor_ranks"] == tp and "judge" not in full
    # one copy of tp x dp simulated
    assert sym["judge"]["simulated_nodes"] * tp * dp == sum(d["nodes"] for d in full["devices"])
    assert_equal_reports(sym, full)
    assert _close(p.estimate["makespan_s"], full["makespan_s"])  # the row's own verdict is the full simulation's


@pytest.mark.parametrize("case", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in CASES],
                         ids=lambda c: f"tp{c[0]}{'sp' if c[1] else ''}-dp{c[2]}-pp{c[3]}-{c[4]}")
def test_tensor_ranks_as_kinds_equal_the_full_simulation(g, case):
    _check_case(g, case)


# ------------------------------------------------------------------ the derivation
@pytest.mark.parametrize("sp", [False, True])
def test_rank0_build_is_the_full_build_restricted_to_rank0(g, sp):
    """tensor_parallel_graph(represent=[0]): the full graph's rank-0 nodes and edges, nothing else; every
    collective still says ranks = tp."""
    full = tensor_parallel_graph(g, 4, sequence_parallel=sp)
    part = tensor_parallel_graph(g, 4, sequence_parallel=sp, represent=[0])
    fd, pd = full.to_dict(), part.to_dict()
    r0 = [nd for nd in fd["nodes"] if nd["tp_rank"] == 0]
    assert pd["nodes"] == r0 and part.n * 4 == full.n
    keep = {nd["id"] for nd in r0}
    assert pd["edges"] == [e for e in fd["edges"] if e["src"] in keep]
    assert all(e["dst"] in keep for e in pd["edges"])  # no edge leaves a rank
    colls = [nd["collective"] for nd in pd["nodes"] if "collective" in nd]
    assert colls and {c["ranks"] for c in colls} == {4}
    assert part.meta["tensor_parallel"]["represented"] == [0] and "represented" not in full.meta["tensor_parallel"]


def test_judged_recipe_is_the_rank0_part_of_the_full_recipe(g):
    """The symmetric judge's graph (derive with tensor_ranks=[0] and one replica) is the full derivation's
    nodes of tensor rank 0, replica 0: same ids, times and memory."""
    cl = _cluster(8)
    p = registry.place(g, cl, "megatron", params=_params((2, False, 2, 2, "full")))
    full = derive(g, p.derivation, "t", devices=cl.k, cluster=cl.name)
    judged = symmetric.judge(g, cl, p, "t")
    want = [x for x in range(full.n) if "/tp0" in full.ids[x] and full.ids[x].endswith("/rep0")]
    assert [judged.graph.ids[x] for x in range(judged.graph.n)] == [full.ids[x] for x in want]
    assert judged.graph.compute == [full.compute[x] for x in want]
    assert judged.graph.memory == [full.memory[x] for x in want]
    # every tensor-parallel collective costed over its whole group: the 2 GPUs of its stage and replica
    tp_groups = {k: v for k, v in judged.groups.items() if k.startswith("tp:")}
    assert tp_groups and all(len(v) == 2 and v[1] == v[0] + 1 and v[0] % 2 == 0 for v in tp_groups.values())


def test_rank_ids_and_rename():
    assert rename_rank("fc/tp0/mb3/recompute/rep1", 2) == "fc/tp2/mb3/recompute/rep1"
    assert rename_rank("a/tp1/tp0", 3) == "a/tp1/tp3"  # a model id holding '/tp1': the last token is the rank's
    assert rename_rank("a/tpx", 1) is None
    ids = ["fc/tp0", "fc/tp1", "ln/tp0", "ln/tp1", "odd"]
    assert rank_ids(ids, 2, [0]) == (["fc/tp0", "ln/tp0", "odd"], None)
    keep, why = rank_ids(["fc/tp0", "fc/tp1", "ln/tp0"], 2, [0])
    assert keep == ["fc/tp0", "ln/tp0"] and why == "tensor rank 1 recomputes other nodes than rank 0"


# ------------------------------------------------------------------ what is not judged by rank 0
def _asymmetric(p: Placement) -> Placement:
    """*p* with one node of tensor rank 1 no longer recomputed."""
    doc = json.loads(json.dumps(p.to_dict()))
    for st in doc["derivation"]["steps"]:
        if st["transform"] == "recompute":
            st["nodes"].remove(next(x for x in st["nodes"] if "/tp1" in x))
            break
    return Placement.from_dict(doc, "p.json")


def test_ranks_recomputing_differently_are_refused(g):
    """A plan listing tensor rank 0's nodes for every rank must recompute the same nodes on every rank (the
    other ranks' nodes are named by rank 0's): a file that does not is refused in one line, judged or full."""
    cl = _cluster(8)
    p = registry.place(g, cl, "megatron", params=_params((2, False, 2, 2, "full")))
    q = _asymmetric(p)
    for full in (False, True):
        with pytest.raises(InvalidInput, match=r"^p.json: field derivation.steps\[2\].nodes: tensor rank 1 "
                                               r"recomputes other nodes than rank 0, but replicas.tensor") as exc:
            simulate(g, cl, q, label="p.json", full=full)
        assert "\n" not in str(exc.value)


def test_unlike_tensor_ranks_are_all_built(g):
    """A slower GPU inside a tensor group: rank 0 cannot stand for it, so megatron builds every rank (no
    replicas.tensor) and the report is still the full simulation's."""
    doc = json.loads(json.dumps(uniform(4, bandwidth=1e10, latency=1e-5).to_dict()))
    doc["devices"][1]["speed"] = 0.5
    cl = Cluster.from_dict(doc)
    p = registry.place(g, cl, "megatron", params=_params((2, False, 2, 1, "none")))
    assert "tensor" not in p.replicas and any("/tp1" in nid for nid in p.assignment)
    assert_equal_reports(simulate(g, cl, p), simulate(g, cl, p, full=True))
    # and a map that claims them alike is refused by the judge's check of the devices
    rmap = symmetric.ReplicaMap(((0, 1), (2, 3)), ((0,), (1,)))
    assert "tensor rank 1 of replica 0 runs on devices or links unlike its rank 0's" in \
        symmetric.asymmetry(cl, rmap, [0, 0])


def test_no_data_parallelism_lists_rank0_too(g):
    """dp = 1: no data-parallel step, yet the plan lists rank 0 alone (one replica, replicas.tensor)."""
    cl = _cluster(4)
    p = registry.place(g, cl, "megatron", params=_params((4, False, 1, 1, "none")))
    assert [s["transform"] for s in p.derivation["steps"]] == ["tensor-parallel", "microbatch"]
    assert p.replicas == {"devices": [["s0gpu0", "s0gpu1", "s0gpu2", "s0gpu3"]],
                          "tensor": [["s0gpu0"], ["s0gpu1"], ["s0gpu2"], ["s0gpu3"]]}
    full = symmetric.expand(None, cl, p)
    assert len(full.assignment) == 4 * len(p.assignment) and sorted(full.order) == cl.ids
    assert nodes_per_device(p) == {d: len(p.assignment) for d in cl.ids}


@pytest.mark.parametrize("tensor,match", [
    ([["s0gpu0", "s1gpu0"]], r"field replicas.tensor must list the devices of each of the 2 tensor ranks"),
    ([["s0gpu0", "s1gpu0"], ["s0gpu1", "s0gpu2"]], r"field replicas.tensor must share out the devices of replica 0"),
    ([["s0gpu0", "s1gpu0"], ["s0gpu1"]], r"field replicas.tensor\[1\] must list 2 device ids"),
    ([["s0gpu0", "s1gpu0"], ["s0gpu1", "s0gpu0"]], r"field replicas.tensor\[1\]: device 's0gpu0' runs two tensor"),
])
def test_bad_tensor_map_refused_in_one_line(g, tensor, match):
    cl = _cluster(8)
    p = registry.place(g, cl, "megatron", params=_params((2, False, 2, 2, "none")))
    doc = p.to_dict()
    doc["replicas"]["tensor"] = tensor
    q = Placement.from_dict(doc, "p.json")
    with pytest.raises(InvalidInput, match=match) as exc:
        simulate(g, cl, q, label="p.json")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("p.json: ")


@pytest.mark.slow
@pytest.mark.parametrize("params", [{"tp": 2, "pp": 2, "dp": 2, "recompute": "full"},
                                    {"tp": 4, "pp": 2, "dp": 1, "recompute": "selective", "sequence_parallel": True}],
                         ids=["tp2-pp2-dp2-full", "tp4sp-pp2-dp1-selective"])
def test_profiled_gpt_ranks_as_kinds_equal_the_full_simulation(params):
    """The zoo's GPT 1.3B (24 layers, each recomputed on its own): the same equality on a profiled model."""
    import gzip
    from pathlib import Path

    with gzip.open(Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo" / "gpt_1.3b.json.gz") as f:
        gpt = Graph.from_dict(json.load(f), label="gpt_1.3b")
    cl = servers(2, 4)
    p = registry.place(gpt, cl, "megatron", params=params)
    full = simulate(gpt, cl, p, full=True)
    assert_equal_reports(simulate(gpt, cl, p), full)
    assert _close(p.estimate["makespan_s"], full["makespan_s"])


def test_rank0_node_on_another_ranks_gpu_refused(g):
    """The file lists tensor rank 0's nodes: one on rank 1's GPU is refused in one line (judged and full)."""
    cl = _cluster(8)
    p = registry.place(g, cl, "megatron", params=_params((2, False, 2, 2, "none")))
    doc = p.to_dict()
    nid = next(x for x, d in doc["assignment"].items() if d == "s0gpu0" and "collective" not in x)
    doc["assignment"][nid] = "s0gpu1"
    q = Placement.from_dict(doc, "p.json")
    with pytest.raises(InvalidInput, match=r"^p.json: node '.*' is on s0gpu1, which is not one of tensor rank 0's "
                                           r"devices of replica 0 \(replicas.tensor\[0\]\)$"):
        simulate(g, cl, q, label="p.json")
    with pytest.raises(InvalidInput, match=r"^p.json: node '.*' is on s0gpu1, which is not one of tensor rank 0's"):
        simulate(g, cl, q, label="p.json", full=True)
