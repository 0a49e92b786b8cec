"""The symmetric judge equals the full event simulation (issue 34.3): one replica of each kind
simulated, the report expanded, against every replica simulated (sim/symmetric.py)."""

import json

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.servers import make_doc
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.sim import symmetric
from celeritas_cli.sim.simulator import simulate

REL = 1e-9


def _servers(n: int, gpus: int = 8) -> Cluster:
    return Cluster.from_dict(make_doc(name=f"{n}x{gpus}", servers=n, gpus_per_server=gpus, gpu="A100-80GB",
                                      intra="nvswitch", inter="ib-hdr-200", nics=gpus))


def _same(sym: dict, full: dict) -> None:
    assert sym["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)
    assert sym["status"] == full["status"]
    for a, b in zip(sym["devices"], full["devices"]):
        assert a["id"] == b["id"]
        assert a["memory_bytes"] == b["memory_bytes"]
        assert a["busy_s"] == pytest.approx(b["busy_s"], rel=REL, abs=1e-15)
        assert a["nodes"] == b["nodes"] or a["nodes"] == 0  # unjudged copies: their rows are copied
    assert sym["transfers"] == full["transfers"]
    assert [(x["src"], x["dst"], x["bytes"]) for x in sym["links"]] == \
        [(x["src"], x["dst"], x["bytes"]) for x in full["links"]]


@pytest.mark.parametrize("k,batch", [(2, 32), (4, 32), (8, 33), (16, 64), (32, 70)])
def test_data_parallel_symmetric_equals_full(k, batch):
    g = layered(30, seed=3)
    cl = _servers(max(1, k // 8), min(k, 8))
    p = registry.place(g, cl, "data-parallel", params={"assume_batch": batch})
    assert p.replicas is not None and len(p.assignment) < 2 * g.n + 10  # replica 0's nodes only
    sym = simulate(g, cl, p)
    full = simulate(g, cl, p, full=True)
    assert sym["judge"]["how"] == "symmetric" and "judge" not in full
    assert sym["judge"]["kinds"] == (1 if batch % k == 0 else 2)
    _same(sym, full)
    assert p.estimate["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)


def test_uneven_shares_on_a_pairwise_cluster():
    g = layered(24, seed=5)
    cl = uniform(4, bandwidth=1e9, latency=1e-5)
    p = registry.place(g, cl, "data-parallel", params={"assume_batch": 10, "bucket_mb": 0})
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["kinds"] == 2  # 3, 3, 2, 2 samples
    _same(sym, full)


def test_replicas_on_other_devices_are_a_kind_of_their_own():
    # a slower third device: its replica is judged on its own (2 kinds), and the numbers are the full simulation's
    doc = json.loads(json.dumps(uniform(3, bandwidth=1e9, latency=1e-5).to_dict()))
    doc["devices"][2]["speed"] = 0.5
    cl = Cluster.from_dict(doc)
    g = layered(20, seed=2)
    p = registry.place(g, cl, "data-parallel", params={"assume_batch": 12})
    rmap, kind_of, _ = symmetric.prepare(g, cl, p, "p")
    assert kind_of == [0, 0, 2] and symmetric.asymmetry(cl, rmap, kind_of) is None
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["kinds"] == 2
    _same(sym, full)
    assert p.estimate["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)


def test_mixed_gpus_moirai_intra_server():
    from celeritas_cli.model.io import load_cluster

    g = layered(60, seed=1)
    cl = load_cluster("moirai-intra-server")  # 2 x V100 + 2 x P100
    p = registry.place(g, cl, "data-parallel", params={"assume_batch": 128, "bucket_mb": 0})
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["kinds"] == 2
    _same(sym, full)
    assert p.estimate["makespan_s"] == pytest.approx(full["makespan_s"], rel=REL)


def test_the_file_holds_the_recipe_not_a_copy_per_replica():
    g = layered(30, seed=3)
    small, big = _servers(1), _servers(16)
    a = registry.place(g, small, "data-parallel", params={"assume_batch": 1024})
    b = registry.place(g, big, "data-parallel", params={"assume_batch": 1024})
    sa, sb = len(json.dumps(a.to_dict(timings=False))), len(json.dumps(b.to_dict(timings=False)))
    # 16x the replicas: the replica map grows by one id per replica, the assignment not at all
    assert len(b.assignment) == len(a.assignment)
    assert sb - sa < 128 * 40


def test_bad_replica_maps_are_refused_in_one_line():
    g = layered(20, seed=2)
    cl = uniform(4)
    p = registry.place(g, cl, "data-parallel", params={"assume_batch": 8})
    doc = p.to_dict()
    for bad, match in [({"devices": [["gpu0"], ["gpu1"]]}, "each of the 4 replicas"),
                       ({"devices": [["gpu0"], ["gpu1"], ["gpu2"], ["gpu9"]]}, "unknown device 'gpu9'"),
                       ({"devices": [["gpu0"], ["gpu1"], ["gpu2"], ["gpu1"]]}, "runs two replicas")]:
        q = type(p).from_dict({**doc, "replicas": bad}, "p.json")
        with pytest.raises(InvalidInput, match=match) as err:
            simulate(g, cl, q, label="p.json")
        assert "\n" not in str(err.value) and str(err.value).startswith("p.json: ")


@pytest.mark.parametrize("schedule,groups,m", [("1f1b", [[0, 2], [1, 3]], 4), ("gpipe", [[0, 1, 2, 3], [4, 5, 6, 7]], 4),
                                              ("interleaved", [[0, 2], [1, 3], [0, 2], [1, 3]], 4)])
def test_replicated_pipelines_symmetric_equals_full(schedule, groups, m):
    from celeritas_cli.pipelining.builder import staged_plan
    from celeritas_cli.pipelining.cuts import balanced_stages

    g = layered(40, seed=1)
    cl = _servers(1, 8)
    st = balanced_stages(g, cl, list(range(len(groups))))
    p = staged_plan(g, cl, st.stage_of, groups, m, schedule, assume_batch=64)
    assert p.replicas is not None and p.order is not None
    sym, full = simulate(g, cl, p), simulate(g, cl, p, full=True)
    assert sym["judge"]["how"] == "symmetric"
    _same(sym, full)
