"""``fsdp -p recompute=full`` (issue 35.2): FSDP with activation checkpointing per transformer layer -
the recomputed forward reads its unit's parameters from the backward all-gather (the forward gather is
not kept alive for it), the recipe ``recompute`` then ``fsdp`` rebuilt by the simulator, memory down and
time up on the zoo's GPT 1.3B, forged recipes refused."""

from __future__ import annotations

import copy

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.pipelines.megatron import layer_checkpoints
from celeritas_cli.algorithms.sharding.fsdp import recompute_nodes
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.io import load_cluster, load_graph
from celeritas_cli.sim.simulator import simulate
from celeritas_cli.transform.fsdp import fsdp_graph
from celeritas_cli.transform.passes import node_passes
from celeritas_cli.transform.recompute import recompute_graph

from ..conftest import SAMPLES
from ..transform.test_fsdp import chain

REL = 1e-9


def test_a_recomputed_forward_reads_the_backward_gather():
    # chain(): units l.0 (f0) and l.1 (f1); f1's forward is recomputed before b1
    d = fsdp_graph(recompute_graph(chain(), ["f1"], segments=True), 2, 3, represent=[0])

    def outs(nid):
        return [d.ids[d.edge_dst[e]] for e in d.out_edges[d.index[nid]]]

    assert [d.ids[d.edge_src[e]] for e in d.in_edges[d.index["f1/recompute/rep0"]]] == \
        ["f0/rep0", "fsdp/u1/bwd/rep0"]
    assert outs("fsdp/u1/bwd/rep0")[:2] == ["f1/recompute/rep0", "b1/rep0"]
    # the forward gather feeds only the forward (and, by the issue chain, the next collective): freed after it
    assert outs("fsdp/u1/fwd/rep0") == ["f1/rep0", "fsdp/u1/bwd/rep0"]


@pytest.fixture(scope="module")
def gpt():
    return load_graph(SAMPLES / "zoo" / "gpt_1.3b.json.gz")


@pytest.fixture(scope="module")
def plans(gpt):
    cl = load_cluster("8xA100-nvswitch")
    return cl, {rc: registry.place(gpt, cl, "fsdp", params={"recompute": rc}) for rc in ("none", "full")}


def test_recompute_full_keeps_the_layer_inputs_and_recomputes_the_rest(gpt):
    ids = recompute_nodes(gpt)
    kept = set(layer_checkpoints(gpt))
    passes = node_passes(gpt)
    assert len(kept) == 24 and not kept & set(ids)  # one input per transformer layer of the 1.3B
    assert ids and all(passes[gpt.index[x]] == "forward" for x in ids)


def test_the_fsdp_row_with_recompute_on_the_zoo_gpt(gpt, plans):
    cl, by = plans
    p, p0 = by["full"], by["none"]
    steps = p.derivation["steps"]
    assert [s["transform"] for s in steps] == ["recompute", "fsdp"] and steps[0]["segments"] is True
    assert steps[0]["nodes"] == recompute_nodes(gpt) and p.estimate["recomputed"] == len(steps[0]["nodes"])
    assert [s["transform"] for s in p0.derivation["steps"]] == ["fsdp"]
    rep = simulate(gpt, cl, p)
    assert rep["makespan_s"] == pytest.approx(p.estimate["makespan_s"], rel=REL)
    assert max(d["memory_bytes"] for d in rep["devices"]) == p.estimate["max_memory_bytes"]
    # activations of one layer at a time instead of every layer's; one more forward's time
    assert p.estimate["max_memory_bytes"] < p0.estimate["max_memory_bytes"]
    assert p0.estimate["makespan_s"] < p.estimate["makespan_s"] < 1.5 * p0.estimate["makespan_s"]


def test_a_forged_recompute_step_is_refused_in_one_line(gpt, plans):
    cl, by = plans
    q = copy.deepcopy(by["full"])
    q.derivation["steps"][0]["nodes"][0] = "no_such_node"
    with pytest.raises(InvalidInput, match=r"^p.json: field derivation.steps\[0\].nodes: .*graph 'gpt_1.3b_b8' has no "
                                           r"node 'no_such_node'") as err:
        simulate(gpt, cl, q, label="p.json")
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="recompute"):
        registry.place(gpt, cl, "fsdp", params={"recompute": "selective"})
