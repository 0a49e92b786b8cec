"""Layer sequences (pipelining/layers.py) and pipelines with replicated
stages (pipelining/builder.py): hand-computed numbers on tiny chains."""

from __future__ import annotations

import itertools

import pytest

from celeritas_cli.sim.symmetric import expand

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.pipelining.builder import staged_plan
from celeritas_cli.pipelining.cuts import stages_from_cuts
from celeritas_cli.pipelining.layers import LayerSequence, alap_order, block_partition
from celeritas_cli.sim.simulator import simulate

from .pipeline_graphs import layer_chain


def test_layer_sequence_of_a_chain_by_hand():
    g = layer_chain(3, tf=4.0, tb=8.0, tu=1.0, act=400, params=100, grad=100, batch=4)
    seq = LayerSequence(g, uniform(2), order="topo")
    assert seq.n == 4  # x, f0, f1, f2
    t = seq.times(1.0)
    assert t.stage(0, 1, 4) == (12.0, 24.0, 3.0)  # three layers: forward, backward, updates once
    quarter = seq.times(0.25)
    assert quarter.stage(0, 1, 2)[:2] == pytest.approx((1.0 + 2e-6, 2.0 + 2e-6))  # linear + overhead
    assert quarter.stage(0, 1, 2)[2] == 1.0  # the update runs once, whatever the micro-batch
    # resident: f_i's parameters + u_i's optimizer state; gradients: b_i's; activations: f_i's outputs
    assert seq.resident[4] - seq.resident[1] == 3 * (100 + 200)
    assert seq.gradients[4] - seq.gradients[1] == 300
    assert seq.activation[4] - seq.activation[1] == 3 * 400
    # cut before f1: y of f0 (read by f1 and b0... b0 is attributed to f0) and the gradient dx of b1
    assert seq.cross_fwd[2] == 400 and seq.cross_bwd[2] == 400


def test_stage_memory_by_hand_and_under_recomputation():
    g = layer_chain(3, act=400, params=100, grad=100, batch=4)
    seq = LayerSequence(g, uniform(2), order="topo")
    # stage f1..f2, 2 micro-batches of a quarter in flight: resident 600 + gradients 200
    # + 2 x (received y: 100 + activations 800/4 = 200)
    assert seq.memory(2, 4, 0.25, 2) == 600 + 200 + 2 * (100 + 200)
    # recomputed: only the received input per micro-batch, plus one micro-batch's activations
    assert seq.memory(2, 4, 0.25, 2, recompute=True) == 600 + 200 + 2 * 100 + 200
    assert seq.memory(2, 4, 0.25, 2, recompute=True) < seq.memory(2, 4, 0.25, 2)


@pytest.mark.parametrize("seed", range(5))
def test_alap_order_is_topological_and_a_permutation(seed):
    from celeritas_cli.model.costs import cost_model

    g = layered(80, seed=seed)
    c = uniform(2)
    order = alap_order(g, cost_model(g, c))
    pos = {v: i for i, v in enumerate(order)}
    assert sorted(order) == list(range(g.n))
    assert all(pos[s] < pos[d] for s, d in zip(g.edge_src, g.edge_dst))


def test_block_partition_blocks_are_contiguous_and_balanced_within_one_unit():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    for parts in range(1, 6):
        cuts = block_partition(seq, parts)
        assert cuts[0] == 0 and cuts == sorted(set(cuts)) and len(cuts) == parts
        lo, span = min(seq), max(seq) - min(seq)
        sums = [sum((x - lo) / span for x in seq[a:b]) for a, b in zip(cuts, cuts[1:] + [len(seq)])]
        assert max(sums) <= min(sums) + 1 + 1e-9  # the stopping rule of Barany and Grinberg
    with pytest.raises(InvalidInput):
        block_partition([1, 2], 3)


def test_replicated_pipeline_puts_replica_r_of_stage_s_on_its_lane():
    g = layer_chain(2, tf=4.0, tb=8.0, act=400, params=100, grad=100, batch=8)
    c = uniform(4)
    stage_of = stages_from_cuts(g, LayerSequence(g, c, order="topo").fwd, [0, 2])
    p = staged_plan(g, c, stage_of, [[0, 1], [2, 3]], 2, "1f1b")
    assert [s["transform"] for s in p.derivation["steps"]] == ["microbatch", "data-parallel"]
    # the symmetric form: replica 0's nodes, and replica r's device for each of replica 0's
    assert p.replicas == {"devices": [["gpu0", "gpu2"], ["gpu1", "gpu3"]]}
    assert p.assignment["f0/mb1/rep0"] == "gpu0" and p.assignment["f1/mb0/rep0"] == "gpu2"
    full = expand(g, c, p)
    assert full.assignment["f0/mb1/rep1"] == "gpu1" and full.assignment["f1/mb0/rep1"] == "gpu3"
    rep = simulate(g, c, p)
    assert rep["status"] == "OK"
    # every micro-batch of 8 samples is split over 2 replicas: 2 micro-batches of 2 samples per replica
    assert p.estimate["micro_batches"] == [4, 4] and p.estimate["replicas"] == [2, 2]


def test_replicated_stage_with_one_device_per_replica_halves_the_work():
    """One stage, two replicas, one micro-batch each: data parallelism; each
    device runs half the batch (forward 2 + backward 4 per layer), then the
    ring all-reduce of the gradients and the update."""
    g = layer_chain(1, tf=4.0, tb=8.0, act=400, params=0, grad=0, batch=8)
    c = uniform(2)
    p = staged_plan(g, c, [0] * g.n, [[0, 1]], 1, "1f1b")
    rep = simulate(g, c, p)
    assert rep["makespan_s"] == pytest.approx(2.0 + 4.0, rel=1e-3)


def test_round_robin_lanes_take_micro_batches_in_turn():
    g = layer_chain(2, act=400, params=100, grad=100, batch=8)
    c = uniform(3)
    stage_of = stages_from_cuts(g, LayerSequence(g, c, order="topo").fwd, [0, 2])
    p = staged_plan(g, c, stage_of, [[0, 1], [2]], 4, "1f1b")
    for i, x in itertools.product(range(4), ("f0", "b0")):
        assert p.assignment[f"{x}/mb{i}"] == f"gpu{i % 2}"
    assert all(p.assignment[f"f1/mb{i}"] == "gpu2" for i in range(4))
    assert "deviation" in p.estimate
    assert simulate(g, c, p)["status"] == "OK"


def test_staged_plan_refuses_what_it_cannot_run():
    g = layer_chain(2, batch=8)
    c = uniform(4)
    stage_of = stages_from_cuts(g, LayerSequence(g, c, order="topo").fwd, [0, 2])
    with pytest.raises(InvalidInput, match="distinct devices"):
        staged_plan(g, c, stage_of, [[0], [0]], 2, "1f1b")
    with pytest.raises(InvalidInput, match="without work"):
        staged_plan(g, c, stage_of, [[0, 1, 2], [3]], 2, "1f1b")
    with pytest.raises(InvalidInput, match="interleaved"):
        staged_plan(g, c, stage_of, [[0], [1]], 3, "interleaved")
