"""Each node's pass (forward / backward / update): the field, and the
structural fallback for graphs without it."""

from __future__ import annotations

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.transform.passes import loss_seeds, node_passes
from celeritas_cli.transform.replicate import data_parallel_graph

from ..pipelining.pipeline_graphs import layer_chain


def strip_passes(g: Graph) -> Graph:
    doc = g.to_dict()
    for nd in doc["nodes"]:
        nd.pop("pass", None)
    return Graph.from_dict(doc)


def test_the_field_is_used_where_given():
    g = layer_chain(3)
    assert node_passes(g) == ["forward"] * 4 + ["backward"] * 3 + ["update"] * 3


def test_structural_fallback_agrees_with_the_field_on_the_chain():
    g = layer_chain(3)
    bare = strip_passes(g)
    assert node_passes(bare) == node_passes(g)
    assert [bare.ids[v] for v in loss_seeds(bare)] == ["b2"]


def test_fallback_without_gradient_op_names_uses_the_last_ancestor_of_every_update():
    doc = strip_passes(layer_chain(3)).to_dict()
    for nd in doc["nodes"]:
        nd["op"] = "optim.sgd" if nd["id"].startswith("u") else "op"
    g = Graph.from_dict(doc)
    # b2 is the last node that reaches u0, u1 and u2: the loss gradient; f0..f2 and x its ancestors
    assert [g.ids[v] for v in loss_seeds(g)] == ["b2"]
    assert node_passes(g) == node_passes(layer_chain(3))


def test_inference_graphs_are_all_forward():
    g = layered(30, seed=2, training=False)
    assert set(node_passes(g)) == {"forward"}


def test_synthetic_training_graph_forward_and_backward_mirror():
    g = layered(60, seed=1)
    p = node_passes(g)
    assert p.count("forward") == p.count("backward")
    assert all((p[v] == "backward") == g.op[v].endswith("_backward") for v in range(g.n) if p[v] != "update")
    # no backward node feeds a forward node
    assert not any(p[s] == "backward" and p[d] == "forward" for s, d in zip(g.edge_src, g.edge_dst))


def test_data_parallel_graph_has_one_seed_per_replica():
    g = data_parallel_graph(strip_passes(layer_chain(2)), 2)
    seeds = sorted(g.ids[v] for v in loss_seeds(g))
    assert seeds == ["b1/rep0", "b1/rep1"]
    p = node_passes(g)
    assert all(p[v] == "backward" for v in range(g.n) if "allreduce" in (g.node_extra[v] or {}))


def test_a_bad_pass_value_is_refused():
    with pytest.raises(InvalidInput, match="sideways"):  # on load once the schema knows the field
        node_passes(build("b", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "pass": "sideways"}], []))
