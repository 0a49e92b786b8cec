"""ZeRO stages 1-2 over a pipeline's replicas (issue 35.2): the data-parallel step's ``zero`` option
(transform/replicate.py) - optimizer state per replica / dp and the reduce-scatter / all-gather counts
and bytes by hand on a tiny pipelined chain (ZeRO, SC'20, 5.1-5.2 and 7.2.1), sizes counted before
building, the simulator's makespan and memory by hand, the symmetric judge against the full
simulation, forged recipes refused in one line, and the rows' parameters end to end (``pipeline -p
zero=1``, ``megatron -p use_distributed_optimizer=true``)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.servers import make_doc
from celeritas_cli.pipelining.builder import derive_pipeline, staged_plan
from celeritas_cli.pipelining.cuts import balanced_stages
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.derivation import derive
from celeritas_cli.transform.fsdp import fsdp_graph
from celeritas_cli.transform.microbatch import microbatch_graph
from celeritas_cli.transform.replicate import data_parallel_graph, dp_size

from ..conftest import SAMPLES
from ..pipelining.pipeline_graphs import layer_chain

REL = 1e-9


def chain():
    """Two layers, each 100 bytes of parameters (on its ``weights`` node once micro-batched), a 100-byte
    gradient and 200 bytes of optimizer state on its update (2 s on the whole parameter); batch 8."""
    return layer_chain(2, params=100, grad=100, tu=2.0, batch=8)


#: stage of every node of chain(): x, f0, f1, b1, b0, u0, u1 (layer 0 first, layer 1 second)
STAGES = [0, 0, 1, 1, 0, 0, 1]


def _pipeline(zero: int, symmetric: bool = False):
    """Two stages, two replicas, two micro-batches of chain() (every replica built unless *symmetric*)."""
    return derive_pipeline(chain(), STAGES, [2, 2], 2, overhead_s=0.0, zero=zero, symmetric=symmetric)


def _node(g, nid: str) -> dict:
    return g.to_dict()["nodes"][g.index[nid]]


@pytest.mark.parametrize("zero", [1, 2])
def test_optimizer_state_and_update_time_are_divided_by_the_replicas(zero):
    plain, z = _pipeline(0).graph, _pipeline(zero).graph
    for r in (0, 1):
        for i in (0, 1):
            u0, u = _node(plain, f"u{i}/rep{r}"), _node(z, f"u{i}/rep{r}")
            assert (u0["memory_bytes"], u0["resident_bytes"], u0["compute_s"]) == (200, 200, 2.0)
            assert (u["memory_bytes"], u["resident_bytes"], u["compute_s"]) == (100, 100, 1.0)  # 1/dp each
            assert _node(z, f"f{i}/weights/rep{r}")["memory_bytes"] == 100  # parameters stay whole (stages 1-2)
    info = z.meta["data_parallel"]
    assert info["zero"] == zero and info["optimizer_state_bytes"] == 400 and info["saved_bytes_per_replica"] == 200
    assert sum(z.memory) == sum(plain.memory) - 2 * 200 + (2 * 2 * 50 if zero == 2 else 0)  # + stage 2's shards


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_collectives_and_their_bytes_by_hand(zero):
    d = _pipeline(zero)
    g = d.graph
    assert d.steps[-1] == {"transform": "data-parallel", "replicas": 2, "scaling": "strong", "overhead_s": 0.0,
                           **({"zero": zero} if zero else {})}
    coll = [(g.op[v], g.node_extra[v]["collective"], g.ids[v]) for v in range(g.n) if g.op[v].startswith("collective")]
    kinds = Counter(op for op, _, _ in coll)
    if zero == 0:
        assert kinds == {"collective.all-reduce": 4}  # one per gradient and replica
    else:
        assert kinds == {"collective.reduce-scatter": 4, "collective.all-gather": 4}
        for op, c, nid in coll:
            assert c["ranks"] == 2 and c["bytes"] == 100  # a 100-byte gradient; the 100 parameter bytes of its layer
            if op == "collective.reduce-scatter":
                assert c["seq"] in (0, 1) and g.memory[g.index[nid]] == (50 if zero == 2 else 0)
            else:
                assert c["seq"] in (2, 3) and g.memory[g.index[nid]] == 0  # after every reduce-scatter
        for r in (0, 1):
            rs, ag = f"b0/accum1/allreduce0/rs/rep{r}", f"b0/accum1/allreduce0/ag/rep{r}"
            ins = {(g.ids[g.edge_src[e]], g.edge_bytes[e]) for e in g.in_edges[g.index[f"u0/rep{r}"]]}
            assert (rs, 50) in ins  # the update reads its reduced shard
            assert ((f"b0/accum1/rep{r}", 100) in ins) == (zero == 1)  # stage 1 keeps the whole gradient live
            assert [g.ids[g.edge_src[e]] for e in g.in_edges[g.index[ag]]] == [f"u0/rep{r}"]
        info = g.meta["data_parallel"]
        # ZeRO 7.2.1: reduce-scatter + all-gather send what the all-reduce sent, (k-1)/k x (G + P) per device
        assert info["collective_bytes_per_device"] == info["allreduce_bytes_per_device"] == 200
        assert info["allgather_bytes"] == 200


@pytest.mark.parametrize("zero", [0, 1, 2])
@pytest.mark.parametrize("bucket_mb", [0.0, 1e-4])
def test_size_is_counted_before_building(zero, bucket_mb):
    g = microbatch_graph(layered(30, seed=3), 2, assume_batch=16)
    for rep in (None, [0]):
        built = data_parallel_graph(g, 4, bucket_mb=bucket_mb, zero=zero, represent=rep)
        size = dp_size(g, 4, bucket_mb, "nccl", None if rep is None else 1, zero)
        assert (size.nodes, size.edges) == (built.n, built.m)


def test_makespan_and_memory_of_one_layer_by_hand():
    # one layer, 2 replicas of 2 samples: f 2 s, b 4 s, the update 2 s (1 s on its half), 1 GB/s and 10 us links
    g = layer_chain(1, tf=4, tb=8, tu=2, act=400, params=100, grad=1000, batch=4)
    cl = uniform(2, bandwidth=1e9, latency=1e-5)
    rep = {z: simulate(g, cl, staged_plan(g, cl, [0] * g.n, [[0, 1]], 1, zero=z, overhead_s=0.0)) for z in (0, 1, 2)}
    # DDP: the all-reduce of 1000 bytes is 2 ring steps of 10 us + 500 bytes, then the whole update
    assert rep[0]["makespan_s"] == pytest.approx(2 + 4 + 2 * (1e-5 + 500e-9) + 2, rel=REL)
    # ZeRO: reduce-scatter (1 step), the update on half the parameters, all-gather of its 100 parameter bytes
    for z in (1, 2):
        assert rep[z]["makespan_s"] == pytest.approx(2 + 4 + (1e-5 + 500e-9) + 1 + (1e-5 + 50e-9), rel=REL)
    # memory: weights 100 + optimizer state 200 (DDP) or 100, f's 200-byte activation, the 1000-byte gradient;
    # stage 1 reduce-scatters in place and keeps the gradient to the update, stage 2 frees it after a 500-byte shard
    assert [d["memory_bytes"] for d in rep[0]["devices"]] == [1500, 1500]
    assert [d["memory_bytes"] for d in rep[1]["devices"]] == [1400, 1400]
    assert [d["memory_bytes"] for d in rep[2]["devices"]] == [1700, 1700]
    t_rs = 6 + 1e-5 + 500e-9
    line1 = rep[1]["memory_timeline"][cl.ids[0]]
    line2 = rep[2]["memory_timeline"][cl.ids[0]]
    assert [b for _, b in line1] == [400, 1400, 1200, 200]
    assert [b for _, b in line2] == [400, 1400, 1700, 700, 200]
    assert line2[3][0] == pytest.approx(t_rs, rel=REL)  # stage 2: the gradient freed when its reduce-scatter ends
    assert line1[3][0] == pytest.approx(t_rs + 1, rel=REL)  # stage 1: when the update ends


def _servers(n: int, gpus: int = 8) -> Cluster:
    return Cluster.from_dict(make_doc(name=f"{n}x{gpus}", servers=n, gpus_per_server=gpus, gpu="A100-80GB",
                                      intra="nvswitch", inter="ib-hdr-200", nics=gpus))


def _same(sym: dict, full: dict) -> None:
    assert sym["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)
    assert sym["status"] == full["status"]
    assert [d["memory_bytes"] for d in sym["devices"]] == [d["memory_bytes"] for d in full["devices"]]
    for a, b in zip(sym["devices"], full["devices"]):
        assert a["busy_s"] == pytest.approx(b["busy_s"], rel=REL, abs=1e-15)
    assert sym["transfers"] == full["transfers"]


@pytest.mark.parametrize("zero", [1, 2])
@pytest.mark.parametrize("schedule,groups", [("1f1b", [[0, 2], [1, 3]]), ("gpipe", [[0, 1, 2, 3], [4, 5, 6, 7]]),
                                             ("interleaved", [[0, 2], [1, 3], [0, 2], [1, 3]])])
def test_symmetric_judge_equals_the_full_simulation(zero, schedule, groups):
    g = layered(40, seed=1)
    cl = _servers(1, 8)
    st = balanced_stages(g, cl, list(range(len(groups))))
    p = staged_plan(g, cl, st.stage_of, groups, 4, schedule, assume_batch=64, zero=zero)
    assert p.replicas is not None and p.derivation["steps"][-1]["zero"] == zero
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["how"] == "symmetric"
    _same(sym, full)


def _zero_plan():
    g = layered(24, seed=2)
    cl = uniform(4, bandwidth=1e9, latency=1e-5)
    st = balanced_stages(g, cl, [0, 1])
    return g, cl, staged_plan(g, cl, st.stage_of, [[0, 2], [1, 3]], 4, assume_batch=32, zero=1)


@pytest.mark.parametrize("value,why", [
    (5, r"must be 0\.\.3, got 5"), ("1", "must be an integer, got '1'"), (True, "must be an integer, got True"),
    (3, (r"zero=3 \(parameters sharded too\) is not modelled over micro-batches or a pipeline: .*DeepSpeed refuses "
         r"ZeRO-3 with pipeline parallelism"))])
def test_a_forged_zero_is_refused_in_one_line_naming_the_field(value, why):
    g, cl, p = _zero_plan()
    q = copy.deepcopy(p)
    q.derivation["steps"][-1]["zero"] = value
    for full in (False, True):
        with pytest.raises(InvalidInput, match=r"^p.json: field derivation.steps\[1\].zero: " + why) as err:
            simulate(g, cl, q, label="p.json", full=full)
        assert "\n" not in str(err.value)


def test_zero_with_ring_collectives_and_a_dropped_zero_are_refused():
    g, cl, p = _zero_plan()
    q = copy.deepcopy(p)
    q.derivation["steps"][-1]["collectives"] = "ring"
    with pytest.raises(InvalidInput, match=r"^p.json: field derivation.steps\[1\].zero: ZeRO \(zero=1\) is modelled in the nccl "
                                           r"collectives form only, not with collectives: ring \(placer run"):
        derive(g, q.derivation, "p.json")
    q = copy.deepcopy(p)
    del q.derivation["steps"][-1]["zero"]  # the recipe's all-reduces are nodes the assignment does not place
    with pytest.raises(InvalidInput, match=r"^p.json: node '.*/allreduce0/rep0' of replica 0 has no device in the "
                                           r"assignment$"):
        simulate(g, cl, q, label="p.json")


def test_stage_3_is_refused_after_micro_batches_with_the_reason():
    with pytest.raises(InvalidInput, match=r"^data-parallel: zero=3 .*DeepSpeed refuses ZeRO-3 with pipeline"):
        derive_pipeline(chain(), STAGES, [2, 2], 2, zero=3)
    with pytest.raises(InvalidInput, match=r"^data-parallel: zero must be 0 .* got 4$"):
        data_parallel_graph(chain(), 2, zero=4)
    mb = microbatch_graph(chain(), 2)
    with pytest.raises(InvalidInput, match=r"^fsdp: graph 'chain2\+mb2' is micro-batched: stage 3 over micro-batches "
                                           r"or a pipeline is not modelled .*DeepSpeed refuses ZeRO-3"):
        fsdp_graph(mb, 2, 3)
    with pytest.raises(InvalidInput, match=r"is micro-batched: ZeRO stage 1 over a pipeline's replicas is the "
                                           r"data-parallel step's zero=1 \(-p zero=1\)"):
        fsdp_graph(mb, 2, 1)


def test_the_pipeline_row_takes_zero_end_to_end():
    g = layered(40, seed=1)
    cl = uniform(4, bandwidth=1e9, latency=1e-5)
    fixed = {"stages": 2, "replicas": 2, "microbatches": 4, "assume_batch": 32, "evaluations": 150}
    plain = registry.place(g, cl, "pipeline", params=fixed)
    p = registry.place(g, cl, "pipeline", params={**fixed, "zero": 1})
    assert p.derivation["steps"][-1]["zero"] == 1 and "zero" not in plain.derivation["steps"][-1]
    assert p.estimate["zero"] == 1 and p.estimate["plan"].endswith(", ZeRO-1 distributed optimizer")
    rep, rep0 = simulate(g, cl, p), simulate(g, cl, plain)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
    # each replica holds half of every update's state: no device holds more than under DDP
    assert all(a["memory_bytes"] <= b["memory_bytes"] for a, b in zip(rep["devices"], rep0["devices"]))
    assert sum(d["memory_bytes"] for d in rep["devices"]) < sum(d["memory_bytes"] for d in rep0["devices"])


def test_the_pipeline_row_takes_zero_on_the_command_line(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["place", str(SAMPLES / "layered_60.json"), "--algo", "pipeline", "-p", "stages=2",
                                  "-p", "replicas=2", "-p", "microbatches=4", "-p", "zero=1", "--assume-batch", "32",
                                  "-q", "--no-timings", "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["simulate", str(SAMPLES / "layered_60.json"), "-P", str(out)], catch_exceptions=False)
    assert r.exit_code == 0 and '"status"' in r.output
    for z, why in (("3", "DeepSpeed refuses ZeRO-3 with pipeline parallelism"), ("4", "zero")):
        bad = CliRunner().invoke(main, ["place", str(SAMPLES / "layered_60.json"), "--algo", "pipeline", "-p",
                                        f"zero={z}", "--assume-batch", "32"])
        assert bad.exit_code == 1 and why in bad.output and "Traceback" not in bad.output


def test_megatron_use_distributed_optimizer():
    g = layered(40, seed=1)
    cl = uniform(4)
    args = {"pp": 2, "dp": 2, "micro_batch_size": 2, "assume_batch": 16}
    plain = registry.place(g, cl, "megatron", params=args)
    p = registry.place(g, cl, "megatron", params={**args, "use_distributed_optimizer": True})
    assert p.estimate["plan"] == "TP 1 × PP 2 × DP 2, 1F1B, 4 micro-batches, ZeRO-1 distributed optimizer"
    assert p.derivation["steps"][-1]["zero"] == 1 and p.params["use_distributed_optimizer"] is True
    rep, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    _same(rep, full)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
    rep0 = simulate(g, cl, plain)
    assert sum(d["memory_bytes"] for d in rep["devices"]) < sum(d["memory_bytes"] for d in rep0["devices"])


def test_megatron_3d_with_the_distributed_optimizer_on_a_tiny_gpt():
    # TP 2 x PP 2 x DP 2: every tensor rank's gradients reduce-scattered over its dp group, judged symmetric = full
    from ..algorithms.test_megatron import gpt8, servers

    g, cl = gpt8(), servers()
    args = {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 2}
    plain = registry.place(g, cl, "megatron", params=args)
    p = registry.place(g, cl, "megatron", params={**args, "use_distributed_optimizer": True})
    assert p.estimate["plan"].endswith(", ZeRO-1 distributed optimizer")
    steps = p.derivation["steps"]
    assert steps[0]["transform"] == "tensor-parallel" and steps[-1]["zero"] == 1
    rep, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    _same(rep, full)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
    rep0 = simulate(g, cl, plain)
    assert all(a["memory_bytes"] <= b["memory_bytes"] for a, b in zip(rep["devices"], rep0["devices"]))
    assert sum(d["memory_bytes"] for d in rep["devices"]) < sum(d["memory_bytes"] for d in rep0["devices"])
