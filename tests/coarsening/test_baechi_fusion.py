"""Baechi's degree-1 co-placement and Moirai's fusion coarsening."""

from __future__ import annotations

import json

import pytest

from celeritas_cli import registry
from celeritas_cli.coarsening.baechi import baechi_clusters
from celeritas_cli.transform.contract import is_acyclic
from celeritas_cli.coarsening.fusion import (
    DEFAULT_RULES,
    fusion_clusters,
    matches,
    parse_rules,
)
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node

CL = uniform(2)


def _members(g):
    return sorted(sorted(m) for m in g.members)


def _check_partition(orig, coarse):
    ids = [x for m in coarse.members for x in m]
    assert sorted(ids) == sorted(orig.ids)
    assert coarse.total_compute() == pytest.approx(orig.total_compute())
    assert coarse.total_memory() == orig.total_memory()


# --------------------------------------------------------------------------- baechi
def test_baechi_merges_a_chain():
    g = build("c", [node(x) for x in "abc"], [edge("a", "b"), edge("b", "c")])
    cg = registry.coarsen(g, CL, "baechi")
    assert _members(cg) == [["a", "b", "c"]]
    assert cg.meta["coarsened_from"] == "c" and cg.meta["coarsening"] == "baechi"


def test_baechi_leaves_multi_in_multi_out_edges():
    """a -> {b, c} -> d, b -> e: every edge is eligible by original degrees
    (b, c, e have one predecessor; c has one successor); the quotient check
    keeps the result a DAG."""
    g = build("d", [node(x) for x in "abcde"],
              [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d"), edge("b", "e")])
    cof = baechi_clusters(g)
    assert is_acyclic(g, cof)
    cg = registry.coarsen(g, CL, "baechi")
    _check_partition(g, cg)


def test_baechi_defers_merges_that_would_close_a_cycle():
    """x->r, p->q, p->r, q->s, r->s, r->t: merging every eligible edge by
    original degrees gives {p,q,s} and {x,r,t} with edges both ways; the
    quotient check stops q->s once p,q's cluster has two successors."""
    g = build("cyc", [node(x) for x in "xpqrst"],
              [edge(a, b) for a, b in ("xr", "pq", "pr", "qs", "rs", "rt")])
    cof = baechi_clusters(g)
    assert is_acyclic(g, cof)
    cg = registry.coarsen(g, CL, "baechi")
    assert _members(cg) == [["p", "q"], ["r", "t", "x"], ["s"]]


@pytest.mark.parametrize("n,training", [(300, True), (1000, True), (300, False)])
def test_baechi_on_layered_graphs_is_acyclic_and_keeps_groups(n, training):
    g = layered(n, seed=2, training=training)
    cof = baechi_clusters(g)
    assert is_acyclic(g, cof)
    cg = registry.coarsen(g, CL, "baechi")
    _check_partition(g, cg)
    assert cg.n < g.n
    # a placement of the coarse graph that follows its colocation values keeps
    # the original groups whole (contract propagates them)
    group_dev: dict[str, str] = {}
    assignment = {}
    for v in range(cg.n):
        d = f"gpu{v % 2}"
        if cg.colocation[v] is not None:
            d = group_dev.setdefault(cg.colocation[v], d)
        for orig in cg.members[v]:
            assignment[orig] = d
    rep = simulate(g, CL, Placement(g.name, CL.name, "t", assignment))  # raises if a group is split
    assert rep["makespan_s"] > 0


def test_baechi_is_deterministic():
    g = layered(600, seed=5)
    assert baechi_clusters(g) == baechi_clusters(g)


# --------------------------------------------------------------------------- fusion
def _op(nid, op, c=1.0):
    return {"id": nid, "op": op, "compute_s": c, "memory_bytes": 0}


def test_fusion_direct_connection_longest_rule():
    g = build("f", [_op("c", "aten.convolution"), _op("b", "aten.native_batch_norm"), _op("r", "aten.relu"),
                    _op("m", "aten.mm")],
              [edge("c", "b"), edge("b", "r"), edge("r", "m")])
    cg = registry.coarsen(g, CL, "fusion")
    assert _members(cg) == [["b", "c", "r"], ["m"]]
    assert cg.meta["fused_groups"] == 1


def test_fusion_never_fuses_a_multi_output_connection():
    """conv's output also feeds x: conv -> bn is a multi-output link."""
    g = build("f", [_op("c", "aten.convolution"), _op("b", "aten.native_batch_norm"), _op("x", "aten.mm")],
              [edge("c", "b", tensor="o"), edge("c", "x", tensor="o")])
    cg = registry.coarsen(g, CL, "fusion")
    assert cg.n == 3 and cg.meta["fused_groups"] == 0


def test_fusion_multi_input_connection_rule_3():
    """conv -> bn -> add <- other, add -> relu: Table I rule 3 fuses the path;
    add's second input (multi-input connection) is allowed."""
    g = build("f", [_op("o", "aten.mm"), _op("c", "aten.convolution"), _op("b", "aten.native_batch_norm"),
                    _op("a", "aten.add.Tensor"), _op("r", "aten.relu_")],
              [edge("o", "a"), edge("c", "b"), edge("b", "a"), edge("a", "r")])
    cg = registry.coarsen(g, CL, "fusion")
    assert _members(cg) == [["a", "b", "c", "r"], ["o"]]


def test_fusion_rules_param_inline_and_file(tmp_path):
    g = build("f", [_op("m", "aten.mm"), _op("g", "aten.gelu"), _op("c", "aten.convolution"),
                    _op("b", "aten.native_batch_norm")],
              [edge("m", "g"), edge("g", "c"), edge("c", "b")])
    cg = registry.coarsen(g, CL, "fusion", params={"rules": '[["mm", "gelu"]]'})
    assert _members(cg) == [["b"], ["c"], ["g", "m"]]
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([["mm", "gelu", "conv", "bn"]]))
    cg = registry.coarsen(g, CL, "fusion", params={"rules": str(path)})
    assert cg.n == 1


@pytest.mark.parametrize("bad", ['{"conv": "bn"}', '[["conv"]]', "[[1, 2]]", "not json"])
def test_fusion_rejects_bad_rules(bad):
    with pytest.raises(InvalidInput, match="fusion"):
        parse_rules(bad)


def test_fusion_op_matching():
    assert parse_rules(None) == DEFAULT_RULES
    assert matches("conv", "aten.convolution") and matches("conv", "Conv2D")
    assert matches("bn", "torch.ops.aten.native_batch_norm") and matches("relu", "relu_")
    assert not matches("conv", "aten.convolution_backward") and not matches("add", "aten.addmm")


def test_fusion_on_inference_graph():
    g = layered(1000, seed=0, training=False)
    cof, fused = fusion_clusters(g, DEFAULT_RULES)
    assert fused > 0 and is_acyclic(g, cof)
    cg = registry.coarsen(g, CL, "fusion")
    _check_partition(g, cg)
    assert cg.n == g.n - sum(len(m) - 1 for m in cg.members)
    for m in cg.members:  # every fused group starts with a convolution
        if len(m) > 1:
            assert g.op[g.index[m[0]]] == "aten.convolution"


# ------------------------------------------------------- fusion that fuses nothing says why (issue 24)
def test_fusion_that_fuses_nothing_says_why(capsys):
    """The multi-output graph above: stderr names the blocked link; an inference graph that fuses
    something says nothing; a graph without the rules' first op type says so."""
    g = build("f", [_op("c", "aten.convolution"), _op("b", "aten.native_batch_norm"), _op("x", "aten.mm")],
              [edge("c", "b", tensor="o"), edge("c", "x", tensor="o")])
    registry.coarsen(g, CL, "fusion")
    err = capsys.readouterr().err
    assert "fusion fused nothing: 1 conv->bn link is a multi-output connection" in err
    assert "training graph" not in err  # no backward op, no phase: not called a training graph
    registry.coarsen(layered(1000, seed=0, training=False), CL, "fusion")
    assert capsys.readouterr().err == ""
    registry.coarsen(build("m", [_op("m", "aten.mm")], []), CL, "fusion")
    assert "no op of the rules' first type (conv) in m" in capsys.readouterr().err


def test_fusion_on_the_resnet50_training_graph_explains_the_backward_pass():
    """The new user's case: ResNet-50's training graph has 53 convolutions (49 in the bottlenecks,
    4 downsampling shortcuts), each feeding its batch norm and the backward pass, so all 53
    conv->bn links are multi-output and nothing is fused - said in one stderr line."""
    from click.testing import CliRunner

    from celeritas_cli.cli import main

    from ..conftest import SAMPLES

    res = CliRunner().invoke(main, ["coarsen", str(SAMPLES / "zoo" / "resnet50.json.gz"), "--method", "fusion",
                                    "-c", "4xV100-pcie"])
    assert res.exit_code == 0
    why = [line for line in res.stderr.splitlines() if "fused nothing" in line]
    assert why == ["placer: fusion fused nothing: 53 conv->bn links are multi-output connections (the first op's "
                   "output also feeds another op), which Moirai III-B never fuses. In a training graph every "
                   "forward output is also saved for the backward pass, so fusion (for inference graphs) finds "
                   "nothing: profile with --phase inference, or use --method cpd."]
