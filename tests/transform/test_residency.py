"""resident_bytes and pass through every rewrite (docs/design.md, "Node memory"):
a derived graph of a declaring graph still declares, with the resident state
where the rewrite puts it."""

from __future__ import annotations

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.model.residency import declares, pass_of, resident_list
from celeritas_cli.transform.contract import contract
from celeritas_cli.transform.replicate import data_parallel_graph
from celeritas_cli.transform.splitting import split_operation

from ..conftest import edge, node


def declared_model():
    """x (forward, 400 B activation) -> f (forward: 300 B resident of 500) -> b (backward) -> u (update)."""
    return build("dm", [node("x", 0.4, 400, resident_bytes=0, **{"pass": "forward"}),
                        node("f", 8.0, 500, colocation="p", splittable=["batch", "channel"], resident_bytes=300,
                             batch_independent={"memory_bytes": 300, "state_bytes": 100}, **{"pass": "forward"}),
                        node("b", 8.0, 100, op="aten.mm", splittable=["batch"], resident_bytes=0,
                             **{"pass": "backward"}),
                        node("u", 1.0, 0, op="optim.sgd", colocation="p", resident_bytes=0, **{"pass": "update"})],
                 [edge("x", "f", 400, tensor="x:0"), edge("f", "b", 400, tensor="f:0"),
                  edge("b", "u", 100, tensor="b:0")], meta={"phase": "training", "batch_size": 8})


def test_loading_checks_name_the_node_and_field():
    with pytest.raises(InvalidInput, match=r"node 'a' field resident_bytes: 6 is more than its memory_bytes \(5\)"):
        build("g", [node("a", 1, 5, resident_bytes=6)], [])
    with pytest.raises(InvalidInput, match=r"node 'a' field resident_bytes: must be at least 0"):
        build("g", [node("a", 1, 5, resident_bytes=-1)], [])
    with pytest.raises(InvalidInput, match=r"node 'a' field resident_bytes: must be integer"):
        build("g", [node("a", 1, 5, resident_bytes=1.5)], [])
    with pytest.raises(InvalidInput, match=r"node 'a' field pass: must be forward, backward or update, got 'sideways'"):
        build("g", [node("a", 1, 5, **{"pass": "sideways"})], [])


def test_a_node_without_the_field_counts_as_all_resident():
    g = build("g", [node("a", 1, 5, resident_bytes=2), node("b", 1, 7)], [])
    assert declares(g) and resident_list(g) == [2, 7]
    assert not declares(build("h", [node("a", 1, 5)], []))


def test_replicas_hold_the_full_resident_state_and_a_share_of_the_activation():
    d = data_parallel_graph(declared_model(), 2, overhead_s=0.0)
    res = resident_list(d)
    f0, x1 = d.index["f/rep0"], d.index["x/rep1"]
    # f: 300 batch-independent (all resident) + 200 activation -> 300 + 100 per replica
    assert (d.memory[f0], res[f0]) == (400, 300)
    assert (d.memory[x1], res[x1]) == (200, 0)
    assert pass_of(d, f0) == "forward" and pass_of(d, d.index["u/rep1"]) == "update"
    # every node of the derived graph says its resident bytes or has none to say (ring nodes hold 0 bytes)
    assert all(res[v] <= d.memory[v] for v in range(d.n))


def test_batch_split_puts_the_resident_state_in_weights():
    s = split_operation(declared_model(), "f", "batch", 2, overhead_s=0.0)
    res = resident_list(s)
    w = s.index["f/weights"]
    parts = [s.index["f/part0"], s.index["f/part1"]]
    assert (s.memory[w], res[w]) == (300, 300)
    assert [(s.memory[p], res[p]) for p in parts] == [(100, 0), (100, 0)]
    assert res[s.index["f/split0"]] == 0 and res[s.index["f/concat0"]] == 0
    assert {pass_of(s, v) for v in parts + [w]} == {"forward"}
    # the total resident state is unchanged by the split
    assert sum(res) == sum(resident_list(declared_model()))


def test_channel_split_shares_the_resident_state():
    s = split_operation(declared_model(), "f", "channel", 2, overhead_s=0.0)
    res = resident_list(s)
    parts = [s.index["f/part0"], s.index["f/part1"]]
    assert [(s.memory[p], res[p]) for p in parts] == [(250, 150), (250, 150)]


def test_contraction_sums_resident_bytes_and_keeps_a_common_pass():
    g = declared_model()
    c = contract(g, [0, 0, 1, 1], method="t")
    res = resident_list(c)
    assert res == [300, 0] and c.memory == [900, 100]
    assert pass_of(c, 0) == "forward" and pass_of(c, 1) is None  # backward + update: no single pass


def test_generated_graphs_declare_and_their_derived_graphs_still_declare():
    g = layered(60, seed=7)
    assert declares(g) and g.meta["batch_size"] == 128
    heavy = next(v for v in range(g.n) if g.op[v] == "aten.convolution" and g.splittable[v])
    total = sum(resident_list(g))
    derived = [(data_parallel_graph(g, 2), 2 * total), (split_operation(g, g.ids[heavy], "batch", 2), total),
               (contract(g, [v // 3 for v in range(g.n)], method="t"), total)]
    for d, expected in derived:
        res = resident_list(d)
        assert res is not None and all(0 <= r <= m for r, m in zip(res, d.memory))
        assert sum(res) == expected  # replicas hold the full state each; splits and contraction move it
