"""The symmetric judge equals the full event simulation for fsdp (issue 34.3): a plan whose recipe ends in
an fsdp step (nccl collectives) is judged one replica of each kind (the same samples), and its report equals
every replica simulated (sim/symmetric.py, transform/fsdp.py ``represent``)."""

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim import symmetric
from celeritas_cli.sim.simulator import simulate

from .test_symmetric import REL, _same, _servers


def _check(g, cl, params, kinds):
    p = registry.place(g, cl, "fsdp", params=params)
    assert p.replicas is not None and len(p.replicas["devices"]) == p.estimate["replicas"]
    assert all(nid.endswith("/rep0") for nid in p.assignment)  # replica 0's nodes only
    sym = simulate(g, cl, p)
    full = simulate(g, cl, p, full=True)
    assert sym["judge"]["how"] == "symmetric" and "judge" not in full
    assert sym["judge"]["kinds"] == kinds
    _same(sym, full)
    # the planner's estimate is the judge's: makespan and the largest time-rule peak
    assert p.estimate["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)
    assert p.estimate["max_memory_bytes"] == max(d["memory_bytes"] for d in full["devices"])
    return p, sym, full


@pytest.mark.parametrize("k,batch,stage", [(2, 32, 3), (4, 32, 1), (4, 30, 2), (8, 33, 3), (8, 64, 2),
                                           (16, 64, 3), (16, 70, 1)])
def test_fsdp_symmetric_equals_full(k, batch, stage):
    g = layered(30, seed=3)
    cl = _servers(max(1, k // 8), min(k, 8))
    _check(g, cl, {"assume_batch": batch, "stage": stage}, 1 if batch % k == 0 else 2)


def test_units_by_size_on_a_pairwise_cluster_with_uneven_shares():
    g = layered(24, seed=5)
    cl = uniform(4, bandwidth=1e9, latency=1e-5)
    p, sym, _ = _check(g, cl, {"assume_batch": 10, "stage": 3, "unit_mb": 0.5}, 2)  # 3, 3, 2, 2 samples
    assert p.estimate["replica_batch"] == [3, 3, 2, 2]
    # the judged copies: replicas 0 and 2, every collective costed for the 4 devices
    assert sym["judge"]["simulated_nodes"] < 3 * len(p.assignment)


def test_a_kind_per_replica_when_every_share_differs():
    """Recorded samples 1, 2, 3, 4 of a batch of 10: four kinds, every replica judged - still equal."""
    g = layered(20, seed=2)
    cl = uniform(4, bandwidth=1e9, latency=1e-5)
    p = registry.place(g, cl, "fsdp", params={"assume_batch": 10, "stage": 3})
    doc = p.to_dict()
    doc["derivation"]["steps"][0]["samples"] = [1, 2, 3, 4]
    q = Placement.from_dict(doc)
    _, kind_of, last = symmetric.prepare(g, cl, q, "p")
    assert kind_of == [0, 1, 2, 3] and last["transform"] == "fsdp"
    sym, full = simulate(g, cl, q), simulate(g, cl, q, full=True)
    assert sym["judge"]["kinds"] == 4
    _same(sym, full)


def test_mixed_devices():
    """Devices of two speeds: proportional shares (1 and 7 samples) or equal
    ones, each replica is a kind of its own (other samples, or another
    device), judged symmetric and equal to the full simulation."""
    g = layered(20, seed=2)
    cl = uniform(2, speeds=[1.0, 3.0], memory=10**12)
    for params, samples in (({"shares": "proportional"}, [1, 7]), ({}, None)):
        p = registry.place(g, cl, "fsdp", params={"assume_batch": 8, **params})
        assert p.replicas is not None and p.derivation["steps"][0].get("samples") == samples
        _, kind_of, _ = symmetric.prepare(g, cl, p, "p")
        assert kind_of == [0, 1]
        sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
        assert sym["judge"]["kinds"] == 2
        _same(sym, full)
        assert p.estimate["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)
        assert p.estimate["max_memory_bytes"] == max(d["memory_bytes"] for d in full["devices"])


def test_a_ring_recipe_with_replicas_is_refused_in_one_line():
    g = layered(20, seed=2)
    cl = uniform(2)
    p = registry.place(g, cl, "fsdp", params={"assume_batch": 8})
    doc = p.to_dict()
    doc["derivation"]["steps"][0]["collectives"] = "ring"
    with pytest.raises(InvalidInput, match="nccl collectives") as err:
        simulate(g, cl, Placement.from_dict(doc, "p.json"), label="p.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("p.json: ")
