"""The NCCL collective cost formula (celeritas_cli.model.collectives.py): hand-computed times on one
DGX A100, two of them, a pairwise PCIe cluster, uneven groups and oversubscription; the identities
a ring obeys (Rabenseifner: reduce-scatter + all-gather = all-reduce); bad input refused."""

from __future__ import annotations

import copy

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.io import bundled_cluster
from celeritas_cli.model.servers import make_doc
from celeritas_cli.model.collectives import KINDS, bus_bytes, collective_plan, collective_time

FAB_BW, FAB_LAT = 3e11, 3e-6        # DGX A100 NVSwitch, per direction
NIC_BW, NIC_LAT = 2.5e10, 5e-6      # one HDR 200 Gb/s NIC


@pytest.fixture(scope="module")
def dgx2() -> Cluster:
    return bundled_cluster("2xDGX-A100")


def _bw_term(plan) -> float:
    """Seconds of a plan without its per-step latencies: its bandwidth term."""
    return sum(p.seconds - p.steps * p.latency_s for p in plan.phases)


def test_bus_bytes():
    assert bus_bytes("all-reduce", 800, 8) == 1400
    assert bus_bytes("all-gather", 800, 8) == bus_bytes("reduce-scatter", 800, 8) == 700
    assert bus_bytes("all-reduce", 800, 1) == 0
    with pytest.raises(InvalidInput, match="all-to-all"):
        bus_bytes("all-to-all", 800, 8)


def test_one_server_ring_over_nvswitch(dgx2):
    S = 8e8
    t = collective_time(dgx2, range(8), "all-reduce", S)
    assert t == pytest.approx(2 * 7 / 8 * S / FAB_BW + 14 * FAB_LAT)        # 4.6667 ms + 42 us
    for kind in ("all-gather", "reduce-scatter"):
        assert collective_time(dgx2, range(8), kind, S) == pytest.approx(7 / 8 * S / FAB_BW + 7 * FAB_LAT)
    plan = collective_plan(dgx2, range(8), "all-reduce", S)
    assert (plan.algorithm, plan.servers, plan.ranks, len(plan.phases)) == ("ring", 1, 8, 1)
    assert plan.bus_bytes == 1.4e9
    assert "NVSwitch 300 GB/s" in plan.words()
    # the same server written pairwise (8xA100-nvswitch: every pair 300 GB/s, 3 us) costs the same
    flat = bundled_cluster("8xA100-nvswitch")
    for kind in KINDS:
        assert collective_time(flat, range(8), kind, S) == pytest.approx(collective_time(dgx2, range(8), kind, S))


def test_two_servers_hierarchical_for_small_ring_for_large(dgx2):
    # 16 GPUs, 8 per server, 8 NICs per server: egress E = 8 x 25 GB/s = 200 GB/s
    E = 8 * NIC_BW
    S = 1e6
    rs = 7 * (FAB_LAT + S / 8 / FAB_BW)
    ar = 2 * (NIC_LAT + S / 2 / E)
    hier = rs + ar + rs
    flat = 30 * (NIC_LAT + S / 16 / E)
    plan = collective_plan(dgx2, range(16), "all-reduce", S)
    assert plan.algorithm == "hierarchical ring"
    assert plan.seconds == pytest.approx(hier) and hier < flat
    assert plan.alternative == ("flat ring", pytest.approx(flat))
    assert [p.kind for p in plan.phases] == ["reduce-scatter", "all-reduce", "all-gather"]
    assert [p.seconds for p in plan.phases] == pytest.approx([rs, ar, rs])
    # the phases sum, and the inside phase is the one-server reduce-scatter costed on its own
    assert plan.seconds == pytest.approx(sum(p.seconds for p in plan.phases))
    assert plan.phases[0].seconds == pytest.approx(collective_time(dgx2, range(8, 16), "reduce-scatter", S))
    assert plan.phases[1].bandwidth_Bps == E
    words = plan.words()
    assert words.startswith("hierarchical ring: reduce-scatter in 2 servers of 8 GPUs over NVSwitch 300 GB/s")
    assert "all-reduce of 1/8 across 2 servers over 8 NICs x 25 GB/s" in words
    # 1 GB: the flat ring over every NIC wins (1.875 S / 200 GB/s < 1.75 S / 300 GB/s + S / 200 GB/s)
    S = 1e9
    plan = collective_plan(dgx2, range(16), "all-reduce", S)
    assert plan.algorithm == "ring"
    assert plan.seconds == pytest.approx(2 * 15 / 16 * S / E + 30 * NIC_LAT)
    assert plan.alternative[1] == pytest.approx(2 * (7 * FAB_LAT + 7 / 8 * S / FAB_BW) + 2 * NIC_LAT + S / E)
    assert plan.bus_bandwidth_Bps < E


def test_every_rail_used(dgx2):
    """A whole server sends over its 8 NICs; one GPU per server over its one NIC (its rail)."""
    S = 1e9
    whole = collective_plan(dgx2, range(16), "all-gather", S)
    assert (whole.algorithm, whole.phases[0].bandwidth_Bps) == ("ring", 8 * NIC_BW)
    assert "8 NICs x 25 GB/s" in whole.words()
    one = collective_plan(dgx2, [3, 11], "all-reduce", S)
    assert (one.algorithm, one.alternative) == ("ring", None)
    assert one.seconds == pytest.approx(2 * (NIC_LAT + S / 2 / NIC_BW))
    # the same as the pairwise ring over those two GPUs' links (same rail: 25 GB/s, 5 us)
    assert dgx2.bandwidth[3][11] == NIC_BW and dgx2.latency[3][11] == NIC_LAT


def test_pairwise_ring(dgx2):
    c = bundled_cluster("4xV100-pcie")       # every pair 10 GB/s, 10 us
    S = 4e6
    assert collective_time(c, range(4), "all-reduce", S) == pytest.approx(6 * (1e-5 + 1e6 / 1e10))   # 660 us
    assert collective_time(c, [0, 2], "all-gather", S) == pytest.approx(1 * (1e-5 + 2e6 / 1e10))
    # a slow pair on the ring (1 -> 2) bounds every step; one off it (0 -> 2) or against it (2 -> 1) does not
    doc = copy.deepcopy(c.doc)
    doc["links"]["pairs"] = [{"src": "gpu0", "dst": "gpu2", "bandwidth_Bps": 1e8},
                             {"src": "gpu2", "dst": "gpu1", "bandwidth_Bps": 1e8}]
    off = Cluster.from_dict(doc)
    assert collective_time(off, range(4), "all-reduce", S) == pytest.approx(6 * (1e-5 + 1e6 / 1e10))
    doc["links"]["pairs"].append({"src": "gpu1", "dst": "gpu2", "bandwidth_Bps": 1e9, "latency_s": 2e-5})
    slow = Cluster.from_dict(doc)
    plan = collective_plan(slow, [3, 2, 1, 0], "all-reduce", S)
    assert plan.seconds == pytest.approx(6 * (2e-5 + 1e6 / 1e9))
    assert (plan.phases[0].bandwidth_Bps, plan.phases[0].latency_s) == (1e9, 2e-5)


def test_group_of_one_and_no_bytes_cost_nothing(dgx2):
    for c in (dgx2, bundled_cluster("4xV100-pcie")):
        for kind in KINDS:
            assert collective_time(c, [1], kind, 1e9) == 0.0
            assert collective_time(c, [0, 1], kind, 0) == 0.0
    assert collective_plan(dgx2, [5], "all-reduce", 1e9).algorithm == "none"
    assert "nothing to move" in collective_plan(dgx2, [5], "all-reduce", 1e9).words()


@pytest.mark.parametrize("group", [range(8), range(16), [0, 1, 2, 8], [0, 8], range(0, 16, 2)])
@pytest.mark.parametrize("kind", KINDS)
def test_monotonic_in_bytes(dgx2, group, kind):
    sizes = [0, 1, 10**3, 10**5, 10**6, 6 * 10**7, 7 * 10**7, 10**8, 10**9, 10**10]
    times = [collective_time(dgx2, group, kind, s) for s in sizes]
    assert times == sorted(times) and times[-1] > times[1] > 0


@pytest.mark.parametrize("name,group,nbytes", [
    ("2xDGX-A100", range(8), 1e8), ("2xDGX-A100", range(16), 1e6), ("2xDGX-A100", range(16), 1e9),
    ("2xDGX-A100", [0, 1, 2, 3, 8], 1e8), ("4xV100-pcie", range(4), 1e8), ("2x8xA100-infiniband", range(16), 1e8)])
def test_rabenseifner_identity(name, group, nbytes):
    """All-gather + reduce-scatter of one buffer = the all-reduce: bandwidth terms and steps (Thakur et al. 2005)."""
    c = bundled_cluster(name)
    ar, ag, rs = (collective_plan(c, group, k, nbytes) for k in KINDS)
    assert ar.algorithm == ag.algorithm == rs.algorithm
    assert _bw_term(ag) + _bw_term(rs) == pytest.approx(_bw_term(ar))
    assert sum(p.steps for p in ag.phases) + sum(p.steps for p in rs.phases) == sum(p.steps for p in ar.phases)


def test_uneven_group_slowest_server_bounds(dgx2):
    # 4 GPUs on server 0 (4 NICs), 1 on server 1 (1 NIC): the inside phases are server 0's, the
    # crossing phase server 1's single NIC
    S = 1e8
    plan = collective_plan(dgx2, [0, 1, 2, 3, 8], "all-reduce", S)
    rs = 3 * (FAB_LAT + S / 4 / FAB_BW)
    ar = 2 * (NIC_LAT + S / 2 / NIC_BW)
    flat = 8 * (NIC_LAT + S / 5 / NIC_BW)
    assert plan.algorithm == "hierarchical ring"
    assert [p.seconds for p in plan.phases] == pytest.approx([rs, ar, rs])
    assert plan.seconds == pytest.approx(2 * rs + ar)                     # 4.528 ms
    assert plan.alternative[1] == pytest.approx(flat)
    assert plan.phases[1].bandwidth_Bps == NIC_BW and "of 4 or 1 GPUs" in plan.words()
    # two server types: the slower NIC bounds the crossing
    doc = make_doc(name="mixed", servers=2, gpus_per_server=2, gpu="A100-80GB", intra="nvswitch",
                   inter="ib-ndr-400", nics=2)
    slow = copy.deepcopy(doc["servers"]["types"]["server"])
    slow["nics"]["bandwidth_Bps"] = 1e10
    doc["servers"]["types"]["slow"] = slow
    doc["servers"]["groups"] = [{"type": "server", "count": 1}, {"type": "slow", "count": 1}]
    mixed = Cluster.from_dict(doc)
    S = 1e9
    plan = collective_plan(mixed, range(4), "all-gather", S)
    across = 1 * (NIC_LAT + S / 2 / (2 * 1e10))           # the slow server's 2 NICs of 10 GB/s
    inside = 1 * (FAB_LAT + S / 2 / FAB_BW)
    assert plan.algorithm == "hierarchical ring"
    assert [(p.kind, p.bandwidth_Bps) for p in plan.phases] == [("all-gather", 2e10), ("all-gather", FAB_BW)]
    assert plan.seconds == pytest.approx(across + inside)
    assert plan.alternative[1] == pytest.approx(3 * (NIC_LAT + S / 4 / 2e10))


def test_oversubscription_halves_inter_bandwidth():
    def cluster(over):
        return Cluster.from_dict(make_doc(name="o", servers=2, gpus_per_server=8, gpu="A100-80GB",
                                          intra="nvswitch", inter="ib-hdr-200", nics=8, oversubscription=over))
    one, two = cluster(1.0), cluster(2.0)
    for group in (range(16), [0, 8]):
        for S in (1e6, 1e9):
            p1, p2 = (collective_plan(c, group, "all-reduce", S) for c in (one, two))
            assert p2.seconds > p1.seconds
    p1, p2 = (collective_plan(c, [0, 8], "all-reduce", 1e9) for c in (one, two))
    assert p2.phases[0].bandwidth_Bps == p1.phases[0].bandwidth_Bps / 2 == NIC_BW / 2
    assert _bw_term(p2) == pytest.approx(2 * _bw_term(p1))
    h1, h2 = (collective_plan(c, range(16), "all-reduce", 1e6) for c in (one, two))
    assert h2.phases[1].bandwidth_Bps == h1.phases[1].bandwidth_Bps / 2 == 4 * NIC_BW
    assert h2.phases[0] == h1.phases[0]                                   # inside a server: unchanged
    assert "/ 2 oversubscription" in h2.words()


def test_hosts_collective_step_added_per_step():
    doc = copy.deepcopy(uniform(4, bandwidth=1e10, latency=1e-5).doc)
    doc["hosts"] = [{"name": "h", "devices": ["gpu0", "gpu1"], "collective_step_s": 1e-3}]
    c = Cluster.from_dict(doc)
    plan = collective_plan(c, range(4), "all-reduce", 4e6)
    assert plan.step_overhead_s == pytest.approx(6e-3)
    assert plan.seconds == pytest.approx(6 * (1e-5 + 1e6 / 1e10) + 6e-3)
    assert collective_time(c, [2, 3], "all-reduce", 4e6) == pytest.approx(2 * (1e-5 + 2e6 / 1e10))


def test_1024_gpus_never_reads_the_pair_matrices():
    c = bundled_cluster("128xDGX-A100")

    class Boom:
        def __getitem__(self, a):
            raise AssertionError("the pair matrix was read")

    c.bandwidth = c.latency = Boom()
    S = 1e9
    plan = collective_plan(c, range(1024), "all-reduce", S)
    E = 8 * NIC_BW
    hier = 2 * 7 * (FAB_LAT + S / 8 / FAB_BW) + 254 * (NIC_LAT + S / 128 / E)
    flat = 2046 * (NIC_LAT + S / 1024 / E)
    assert plan.seconds == pytest.approx(min(hier, flat))
    assert plan.algorithm == "hierarchical ring" and plan.alternative[1] == pytest.approx(flat)
    assert collective_plan(c, range(1024), "all-reduce", S) is plan          # cached
    assert collective_time(c, range(0, 1024, 8), "all-reduce", S) == pytest.approx(254 * (NIC_LAT + S / 128 / NIC_BW))


def test_bad_input_refused(dgx2):
    with pytest.raises(InvalidInput, match="collective kind 'broadcast' is not one of all-reduce"):
        collective_time(dgx2, range(8), "broadcast", 100)
    with pytest.raises(InvalidInput, match="device index 16 is not a device of cluster '2xDGX-A100'"):
        collective_time(dgx2, [0, 16], "all-reduce", 100)
    with pytest.raises(InvalidInput, match="s0gpu1 is listed twice"):
        collective_time(dgx2, [0, 1, 1], "all-reduce", 100)
    with pytest.raises(InvalidInput, match="bytes must be"):
        collective_time(dgx2, [0, 1], "all-reduce", -1)
    with pytest.raises(InvalidInput, match="not a device index"):
        collective_time(dgx2, ["s0gpu0", 1], "all-reduce", 1)
