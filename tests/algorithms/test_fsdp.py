"""``place --algo fsdp`` (issue 23.3): the row's estimate is the judge's,
stage 3 fits where data parallelism and stage 1 do not, the recipe is
rebuilt by ``simulate``, and the CLI round trip with ``-p stage=``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.sim.simulator import simulate

from ..transform.test_fsdp import EPS, chain


def tight(memory: int = 800):
    """Two devices of *memory* bytes, 25 B/s links (one ring step of the chain: 2 s)."""
    return uniform(2, bandwidth=25.0, latency=0.0, memory=memory)


def test_sharding_fits_where_data_parallelism_does_not():
    """Per device, data parallelism holds 2 x 100 parameter and 2 x 200 Adam
    bytes (600 resident) and peaks at 840 under the time rule while b0 runs
    (t = 4..5): f0's activation 20 (until b0), b1's dx and gradient 120
    (until the gradient's NCCL all-reduce, in place, ends at t = 8: 2 ring
    steps of 50 B at 25 B/s after b1), b0's gradient 100; the explicit ring
    form (``collectives=ring``) 920, its chunks received on top.  fsdp in
    the ring form: stage 1 820 (the full gradients live until the update),
    stages 2 and 3 790 (the hand counts of tests/transform/test_fsdp.py); in
    the nccl form (the default) 720, 690 and 690 (no flat-gradient copy,
    tests/transform/test_fsdp_nccl.py).  On 800-byte devices stages 2 and 3
    fit in both forms, stage 1 in the nccl form, data parallelism in
    neither."""
    g = chain()
    c = tight()
    status = {}
    for algo, params in (("data-parallel", {"bucket_mb": 0}), ("data-parallel", {"bucket_mb": 0, "collectives": "ring"}),
                         *(("fsdp", {"stage": s, "collectives": f}) for s in (1, 2, 3) for f in ("nccl", "ring"))):
        p = registry.place(g, c, algo, params=params)
        rep = simulate(g, c, p)
        key = (params["stage"], params["collectives"]) if algo == "fsdp" else params.get("collectives")
        status[(algo, key)] = (rep["status"], max(d["memory_bytes"] for d in rep["devices"]))
        if algo == "fsdp":
            assert p.estimate["status"] == ("OOM" if rep["status"] == "OOM" else "FEASIBLE")
        else:
            at = [m for t, m in rep["memory_timeline"]["gpu0"] if 4.0 <= t < 5.0]
            assert params.get("collectives") == "ring" or at == [840]
    assert status == {("data-parallel", None): ("OOM", 840), ("data-parallel", "ring"): ("OOM", 920),
                      ("fsdp", (1, "ring")): ("OOM", 820), ("fsdp", (2, "ring")): ("OK", 790),
                      ("fsdp", (3, "ring")): ("OK", 790), ("fsdp", (1, "nccl")): ("OK", 720),
                      ("fsdp", (2, "nccl")): ("OK", 690), ("fsdp", (3, "nccl")): ("OK", 690)}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_estimate_is_the_judges(stage):
    """The ring form (hand-checked in tests/transform/test_fsdp.py); the nccl form's in
    tests/transform/test_fsdp_nccl.py."""
    g = chain()
    c = tight(10**6)
    p = registry.place(g, c, "fsdp", params={"stage": stage, "overhead_s": 0.0, "collectives": "ring"})
    rep = simulate(g, c, p)
    est = p.estimate
    assert est["makespan_s"] == pytest.approx(rep["makespan_s"]) == pytest.approx((13.0 if stage == 3 else 12.0) + 2 * EPS)
    assert est["max_memory_bytes"] == max(d["memory_bytes"] for d in rep["devices"])
    assert (est["status"], est["memory_rule"], est["replicas"], est["stage"], est["units"]) == \
        ("FEASIBLE", "time", 2, stage, 2)
    assert est["bytes_per_device"] == (300 if stage == 3 else 200)
    assert est["global_batch"] == 4 and est["replica_batch"] == 2
    assert p.derivation == {"steps": [{"transform": "fsdp", "replicas": 2, "stage": stage, "global_batch": 4,
                                       "overhead_s": 0.0, "collectives": "ring"}]}
    assert set(p.assignment.values()) == {"gpu0", "gpu1"}
    again = registry.place(g, c, "fsdp", params={"stage": stage, "overhead_s": 0.0, "collectives": "ring"})
    assert again.assignment == p.assignment


def test_devices_and_refusals():
    g = chain()
    c = uniform(4, memory=10**6)
    p = registry.place(g, c, "fsdp", params={"devices": "gpu3,gpu1"})
    # the symmetric form: replica 0's nodes on gpu3, replica 1 on gpu1 by the replica map
    assert set(p.assignment.values()) == {"gpu3"} and p.replicas == {"devices": [["gpu3"], ["gpu1"]]}
    assert p.estimate["replicas"] == 2
    p = registry.place(g, c, "fsdp", params={"devices": "gpu3,gpu1", "collectives": "ring"})
    assert sorted(set(p.assignment.values())) == ["gpu1", "gpu3"] and p.replicas is None
    with pytest.raises(InvalidInput, match="parameter stage"):
        registry.place(g, c, "fsdp", params={"stage": 4})
    with pytest.raises(InvalidInput, match="cannot be split 8 ways"):
        registry.place(chain(batch=4), uniform(8), "fsdp")


def test_proportional_shares_follow_device_speed():
    """A device three times as fast gets three of the four samples, recorded in the recipe."""
    g = chain()
    c = uniform(2, speeds=[1.0, 3.0], memory=10**6)
    p = registry.place(g, c, "fsdp", params={"shares": "proportional"})
    assert p.derivation["steps"][0]["samples"] == [1, 3] and p.estimate["replica_batch"] == [1, 3]
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    equal = registry.place(g, uniform(2, memory=10**6), "fsdp", params={"shares": "proportional"})
    assert "samples" not in equal.derivation["steps"][0]  # identical devices: the equal shares


def test_whole_samples_make_the_slowest_replica_fastest():
    """Issue 33, J3, by hand: a 1 s batch-dependent op and a 0.01 s update on
    two fast and two slow devices (0.68293 x), a batch of 512.  Proportional
    shares 152.12 / 103.88 round (largest remainders) to 152/104.  Data
    parallelism runs the update whole: 152/104 takes (104/512 + 0.01) /
    0.68293 = 0.31207 s on a slow device, 153/103 at most 153/512 + 0.01 =
    0.30883 s and (103/512 + 0.01) / 0.68293 = 0.30921 s, 154/102 0.31078 s:
    153/103.  FSDP runs each update on a quarter of the parameters (0.0025
    s): 152/104 takes 0.29938 s and 0.30109 s, 153/103 0.30133 s: 152/104."""
    from celeritas_cli.model.graph import build

    g = build("au", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0},
                     {"id": "u", "op": "optim.sgd", "compute_s": 0.01, "memory_bytes": 0}], [],
              meta={"batch_size": 512})
    c = uniform(4, speeds=[1.0, 1.0, 0.68293, 0.68293])
    dp = registry.place(g, c, "data-parallel", params={"shares": "proportional", "overhead_s": 0.0})
    assert [round(x * 512) for x in dp.estimate["shares"]] == [153, 153, 103, 103]
    assert dp.estimate["makespan_s"] == pytest.approx((103 / 512 + 0.01) / 0.68293, rel=1e-12)
    fs = registry.place(g, c, "fsdp", params={"shares": "proportional", "overhead_s": 0.0})
    assert fs.derivation["steps"][0]["samples"] == [152, 152, 104, 104]
    assert fs.estimate["makespan_s"] == pytest.approx((104 / 512 + 0.0025) / 0.68293, rel=1e-12)
    assert simulate(g, c, fs)["makespan_s"] == pytest.approx(fs.estimate["makespan_s"], rel=1e-12)


@pytest.mark.slow
def test_nmt_on_moirai_intra_server_gets_153_and_103_samples():
    """The J3 reproducer's shares (the simulator: 0.92350 s for 153/103
    against 0.92861 s for the 152/104 of largest remainders)."""
    from celeritas_cli import load_graph
    from celeritas_cli.algorithms.sharding.data_parallel import speed_samples
    from celeritas_cli.model.costs import cost_model
    from celeritas_cli.model.io import load_cluster

    from ..conftest import CLUSTERS, SAMPLES

    g = load_graph(str(SAMPLES / "zoo" / "nmt.json.gz"))
    c = load_cluster(str(CLUSTERS / "moirai-intra-server.json"))
    for sharded in (False, True):
        assert speed_samples(g, cost_model(g, c), [0, 1, 2, 3], 512, 2e-6, sharded_updates=sharded) == \
            [153, 153, 103, 103]


def _placer(*args):
    return subprocess.run([sys.executable, "-m", "celeritas_cli", *args], capture_output=True, text=True)


def test_cli_round_trip_and_a_forged_batch(tmp_path):
    g, c = tmp_path / "g.json", tmp_path / "c.json"
    write_json(chain().to_dict(), g)
    write_json(tight(10**6).to_dict(), c)
    out = tmp_path / "p.json"
    run = _placer("place", str(g), "--algo", "fsdp", "-p", "stage=2", "--cluster", str(c), "-o", str(out))
    assert run.returncode == 0, run.stderr
    placement = json.loads(out.read_text())
    run = _placer("simulate", str(g), "--cluster", str(c), "--placement", str(out))
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["makespan_s"] == pytest.approx(placement["estimate"]["makespan_s"])
    placement["derivation"]["steps"][0]["global_batch"] = 2
    forged = tmp_path / "forged.json"
    write_json(placement, forged)
    run = _placer("simulate", str(g), "--cluster", str(c), "--placement", str(forged))
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.count("\n") == 1
    assert "field derivation.steps[0].global_batch: the placement was made for a batch of 2 samples" in run.stderr
