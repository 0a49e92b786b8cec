"""Pipeline stages (issue 22.3): contiguous cuts of the forward order,
backward and updates attributed to them, the chain check, balancing."""

from __future__ import annotations

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.pipelining.cuts import (
    attribution,
    balanced_cuts,
    balanced_stages,
    check_chain,
    forward_order,
    stages_from_cuts,
)
from celeritas_cli.transform.passes import node_passes

from .pipeline_graphs import layer_chain


def test_stages_of_the_chain():
    g = layer_chain(3)
    fwd = forward_order(g, g.topo_order())
    assert [g.ids[v] for v in fwd] == ["x", "f0", "f1", "f2"]
    st = dict(zip(g.ids, stages_from_cuts(g, fwd, [0, 2, 3])))
    assert st == {"x": 0, "f0": 0, "f1": 1, "f2": 2, "b2": 2, "b1": 1, "b0": 0, "u0": 0, "u1": 1, "u2": 2}


def test_a_backward_node_reading_an_early_key_stays_with_its_attention():
    # k (early, stage 0) is read by the attention a (stage 1) and by a's backward da, which feeds dk:
    # da goes with what it feeds back into (the attention's stage), not down to where k was made
    nd = lambda i, p: {"id": i, "compute_s": 1, "memory_bytes": 0, "pass": p}
    g = build("attn", [nd("q", "forward"), nd("k", "forward"), nd("a", "forward"), nd("loss", "backward"),
                       nd("da", "backward"), nd("dq", "backward"), nd("dk", "backward")],
              [{"src": "q", "dst": "k", "bytes": 1}, {"src": "k", "dst": "a", "bytes": 1},
               {"src": "q", "dst": "a", "bytes": 1, "tensor": "q"}, {"src": "a", "dst": "loss", "bytes": 1},
               {"src": "loss", "dst": "da", "bytes": 1}, {"src": "k", "dst": "da", "bytes": 1},
               {"src": "da", "dst": "dq", "bytes": 1}, {"src": "a", "dst": "dq", "bytes": 1},
               {"src": "da", "dst": "dk", "bytes": 1, "tensor": "g"}, {"src": "q", "dst": "dk", "bytes": 1}])
    att = attribution(g, [0, 1, 2])
    assert att[g.index["da"]] == 2 and att[g.index["dq"]] == 2 and att[g.index["dk"]] == 0
    stage_of = stages_from_cuts(g, [0, 1, 2], [0, 2])
    check_chain(g, stage_of)
    assert [stage_of[g.index[x]] for x in ("da", "dk")] == [1, 0]


def test_check_chain_names_the_edge_that_breaks_it():
    g = layer_chain(2)
    stage_of = [0] * g.n
    stage_of[g.index["b0"]] = 1  # gradient flowing from stage 0 (b1) up to stage 1
    with pytest.raises(InvalidInput, match="node 'b1' \\(stage 0\\) feeds backward node 'b0' \\(stage 1\\)"):
        check_chain(g, stage_of)


def test_bad_cuts_and_orders_are_refused():
    g = layer_chain(2)
    fwd = forward_order(g)
    with pytest.raises(InvalidInput, match="must start at 0"):
        stages_from_cuts(g, fwd, [1, 2])
    with pytest.raises(InvalidInput, match="must start at 0 and increase"):
        stages_from_cuts(g, fwd, [0, 3])
    with pytest.raises(InvalidInput, match="not a topological order"):
        forward_order(g, list(reversed(range(g.n))))
    with pytest.raises(InvalidInput, match="cannot cut 3 forward nodes into 4 stages"):
        balanced_stages(g, uniform(4), [0, 1, 2, 3])


def test_balanced_cuts_minimise_the_slowest_stage():
    pre = lambda xs: [sum(xs[:i]) for i in range(len(xs) + 1)]
    assert balanced_cuts([pre([1, 2, 3, 4, 5])] * 3, 3) == [0, 3, 4]  # 6 | 4 | 5: max 6 (exhaustive: best)
    # a device twice as slow gets half the work
    assert balanced_cuts([pre([1] * 9), pre([2] * 9)], 2) == [0, 6]


def test_balanced_stages_on_mixed_devices():
    g = layer_chain(4, tf=2.0, tb=4.0)
    c = uniform(2, speeds=[1.0, 0.5])
    st = balanced_stages(g, c, [0, 1])
    # 4 layers of 6 s; on the half-speed second device a layer takes 12 s: 3 layers | 1 layer = 18 | 12
    assert st.cuts == [0, 4] and st.stage_time_s == pytest.approx([18.0, 12.0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stages_of_synthetic_graphs_form_a_chain(seed):
    g = layered(120, seed=seed)
    st = balanced_stages(g, uniform(3), [0, 1, 2])
    check_chain(g, st.stage_of)
    passes = node_passes(g)
    for v in range(g.n):  # updates stay with their parameters
        if passes[v] == "update" and g.colocation[v] is not None:
            holders = [u for u in range(g.n) if g.colocation[u] == g.colocation[v]]
            assert len({st.stage_of[u] for u in holders}) == 1


def test_balancing_on_the_micro_batched_graph_counts_what_a_stage_runs():
    from celeritas_cli.transform.microbatch import microbatch_graph

    g = layer_chain(3, tf=2.0, tb=4.0, grad=9 * 10**8, batch=4)
    c = uniform(3)
    plain = balanced_stages(g, c, [0, 1, 2])
    mb = balanced_stages(g, c, [0, 1, 2], microbatched=microbatch_graph(g, 4, overhead_s=0.0))
    # linear copies do the layer's work; each stage also adds its 3 gradient accumulations (3 * 0.9 GB / 9e11 B/s)
    assert plain.stage_time_s == pytest.approx([6.0] * 3)
    assert mb.stage_time_s == pytest.approx([6.0 + 3 * 0.003] * 3)
    assert mb.stage_of == plain.stage_of
