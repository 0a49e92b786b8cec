"""Clusters of servers (the ``servers`` form of placer.cluster/v1): pair figures, size, bad files, `clusters make`."""

from __future__ import annotations

import math
from importlib import resources

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import place, simulate
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model import servers as servers_mod
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.io import bundled_cluster, load_cluster, load_graph
from celeritas_cli.model.jsonio import dumps
from celeritas_cli.model.servers import PairMatrix, make_doc

from ..conftest import SAMPLES

BUNDLED = [f"{n}xDGX-{g}" for g in ("A100", "H100") for n in (2, 16, 128)]


def _doc(**over):
    """2 servers x 4 GPUs; fabric 100 GB/s, 2 us; 2 NICs of 10 GB/s, 5 us, on 2 rails; oversubscription 2."""
    stype = {"gpu": "A100-80GB", "gpus": 4, "fabric": {"kind": "nvswitch", "bandwidth_Bps": 1e11, "latency_s": 2e-6},
             "nics": {"count": 2, "bandwidth_Bps": 1e10, "latency_s": 5e-6, "rails": 2}}
    doc = {"schema": "placer.cluster/v1", "name": "t",
           "servers": {"types": {"T": stype}, "groups": [{"type": "T", "count": 2}],
                       "network": {"topology": "fat-tree", "oversubscription": 2.0}}}
    for path, value in over.items():   # "servers.types.T.gpus" = 0
        *head, last = path.split(".")
        node = doc
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return doc


def test_pair_figures_by_hand():
    c = Cluster.from_dict(_doc(), "t")
    i = c.index
    assert c.k == 8 and c.ids[:5] == ["s0gpu0", "s0gpu1", "s0gpu2", "s0gpu3", "s1gpu0"]
    assert {d.type for d in c.devices} == {"A100"} and c.devices[0].memory == 80 * 2**30
    # same server: the fabric's figures
    assert (c.bandwidth[i["s0gpu0"]][i["s0gpu3"]], c.latency[i["s0gpu0"]][i["s0gpu3"]]) == (1e11, 2e-6)
    # other server, same rail (GPUs 0, 1 use NIC 0 on rail 0): one NIC / oversubscription 2, the NIC's latency
    assert (c.bandwidth[i["s0gpu0"]][i["s1gpu1"]], c.latency[i["s0gpu0"]][i["s1gpu1"]]) == (5e9, 5e-6)
    # other rail (GPU 2 uses NIC 1 on rail 1): over the destination's fabric too, latencies added
    assert c.bandwidth[i["s0gpu0"]][i["s1gpu2"]] == 5e9
    assert c.latency[i["s0gpu0"]][i["s1gpu2"]] == pytest.approx(7e-6)
    assert c.comm_time(1e9, i["s0gpu0"], i["s1gpu2"]) == pytest.approx(7e-6 + 0.2)
    # non-blocking: the NIC's full bandwidth
    c1 = Cluster.from_dict(_doc(**{"servers.network.oversubscription": 1.0}), "t")
    assert c1.bandwidth[0][5] == 1e10


def test_two_dgx_a100_servers_resolve_every_pair_as_the_hand_written_pairwise_file():
    servers, pairwise = bundled_cluster("2xDGX-A100"), bundled_cluster("2x8xA100-infiniband")
    assert servers.devices == pairwise.devices
    assert servers.bandwidth == pairwise.bandwidth
    assert all(math.isclose(x, y, rel_tol=1e-12) for r, q in zip(servers.latency, pairwise.latency)
               for x, y in zip(r, q))


def test_lazy_and_dense_matrices_agree(monkeypatch):
    dense = bundled_cluster("16xDGX-H100")
    assert isinstance(dense.bandwidth, list)
    monkeypatch.setattr(servers_mod, "DENSE_MAX", 0)
    lazy = bundled_cluster("16xDGX-H100")
    assert isinstance(lazy.bandwidth, PairMatrix)
    assert lazy.bandwidth == dense.bandwidth and lazy.latency == dense.latency
    assert lazy.digest() == dense.digest() and lazy.summary() == dense.summary()


def test_1024_gpus_hold_o_gpus_and_write_the_server_form_back():
    c = bundled_cluster("128xDGX-A100")
    assert c.k == 1024 and isinstance(c.bandwidth, PairMatrix)
    assert c.bandwidth[0][1] == 3e11 and c.bandwidth[0][1023] == 2.5e10 and c.latency[8][1016] == 5e-6
    assert len(dumps(c.to_dict())) <= 100_000 and "servers" in c.to_dict() and "devices" not in c.to_dict()
    s = c.summary()
    assert s["devices"] == 1024 and s["bandwidth_Bps"] == [2.5e10, 3e11]
    assert s["latency_s"][0] == 3e-6 and s["latency_s"][1] == pytest.approx(8e-6)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_server_clusters_load_small_with_sources(name):
    data = resources.files("celeritas_cli").joinpath("data", f"{name}.json").read_bytes()
    assert len(data) <= 100_000
    c = bundled_cluster(name)
    assert c.k == 8 * int(name.split("x")[0]) and c.doc["meta"]["sources"]
    assert dumps(c.to_dict()) == data


def test_a_pairwise_cluster_still_round_trips_byte_identically():
    c = bundled_cluster("2x8xA100-infiniband")
    assert c.servers is None and isinstance(c.bandwidth, list)
    data = dumps(c.to_dict())
    again = Cluster.from_dict(orjson.loads(data), "again")
    assert dumps(again.to_dict()) == data and again.bandwidth == c.bandwidth and again.digest() == c.digest()
    built = Cluster(name="b", devices=c.devices[:2], bandwidth=[[1.0, 2.0], [3.0, 1.0]], latency=[[0.0, 1e-6], [2e-6, 0.0]])
    data = dumps(built.to_dict())
    assert "pairs" in built.to_dict()["links"] and dumps(Cluster.from_dict(orjson.loads(data)).to_dict()) == data


NAN = float("nan")


@pytest.mark.parametrize("path, value, message", [
    ("servers.types.T.gpus", 0, "servers.types.T field gpus: 0 is out of range"),
    ("servers.types.T.fabric.bandwidth_Bps", 0.0, "servers.types.T.fabric field bandwidth_Bps: 0.0 is out of range"),
    ("servers.types.T.fabric.bandwidth_Bps", -5.0, "servers.types.T.fabric field bandwidth_Bps: -5.0"),
    ("servers.types.T.nics.bandwidth_Bps", NAN, "servers.types.T.nics field bandwidth_Bps: nan"),
    ("servers.types.T.fabric.latency_s", 0.0, "servers.types.T.fabric field latency_s: 0.0 is out of range"),
    ("servers.types.T.nics.latency_s", -1e-6, "servers.types.T.nics field latency_s"),
    ("servers.types.T.fabric.latency_s", NAN, "servers.types.T.fabric field latency_s: nan"),
    ("servers.types.T.nics.rails", 3, "servers.types.T.nics field rails: 3 rails but 2 NICs per server"),
    ("servers.groups.0.count", 10**6, "servers.groups: 4,000,000 GPUs in all, over the limit of 1024"),
    ("servers.network.oversubscription", 0.5, "servers.network field oversubscription: 0.5 is out of range"),
    ("servers.groups.0.type", "DGX-B200", "servers.groups[0] field type: unknown server type 'DGX-B200'"),
    ("servers.types.T.gpu", "B200", "servers.types.T field gpu: unknown GPU type 'B200'"),
])
def test_bad_server_clusters_are_refused_in_one_line_naming_the_field(path, value, message):
    with pytest.raises(InvalidInput) as exc:
        Cluster.from_dict(_doc(**{path: value}), "c.json")
    assert str(exc.value).startswith("c.json: ") and message in str(exc.value) and "\n" not in str(exc.value)


def test_a_million_servers_are_refused_before_anything_is_built(monkeypatch):
    monkeypatch.setattr(servers_mod.Servers, "device_ids", lambda self: pytest.fail("built"))
    with pytest.raises(InvalidInput, match="over the limit"):
        Cluster.from_dict(_doc(**{"servers.groups.0.count": 10**6}), "c.json")


def test_a_bad_cluster_file_exits_1_in_one_line(tmp_path):
    f = tmp_path / "c.json"
    f.write_bytes(orjson.dumps(_doc(**{"servers.types.T.gpus": 0})))
    r = CliRunner().invoke(main, ["place", str(SAMPLES / "layered_60.json"), "--algo", "random", "-c", str(f)])
    assert r.exit_code == 1 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"Error: {f}: servers.types.T field gpus: 0 is out of range (1 to 1,024)"]


def test_an_explicit_pair_overrides_the_servers_and_says_so(capsys):
    doc = _doc()
    doc["links"] = {"pairs": [{"src": "s0gpu0", "dst": "s1gpu0", "bandwidth_Bps": 1e9, "latency_s": 1e-5},
                              {"src": "s0gpu1", "dst": "s0gpu2", "bandwidth_Bps": 1e11, "latency_s": 2e-6}]}
    c = Cluster.from_dict(doc, "c.json")
    assert (c.bandwidth[0][4], c.latency[0][4]) == (1e9, 1e-5) and c.bandwidth[4][0] == 5e9
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["c.json: link pair s0gpu0->s1gpu0: the explicit pair (1e+09 B/s, 1e-05 s) overrides the "
                   "servers' figure (5e+09 B/s, 5e-06 s)"]   # the pair that agrees says nothing
    doc["links"]["pairs"].append({"src": "s0gpu0", "dst": "s9gpu0", "bandwidth_Bps": 1e9})
    with pytest.raises(InvalidInput, match=r"link pair s0gpu0->s9gpu0 field dst: unknown device 's9gpu0'"):
        Cluster.from_dict(doc, "c.json")
    both = {**_doc(), "devices": [{"id": "a", "memory_bytes": 1}]}
    with pytest.raises(InvalidInput, match="either devices .* or servers, not both"):
        Cluster.from_dict(both, "c.json")


def test_clusters_make_writes_a_file_that_loads_back_equal(tmp_path):
    out = tmp_path / "c.json"
    r = CliRunner().invoke(main, ["clusters", "make", "--servers", "16", "--gpus-per-server", "8", "--gpu",
                                  "A100-80GB", "--intra", "nvswitch", "--inter", "ib-hdr-200", "--nics", "8",
                                  "--oversubscription", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    c = load_cluster(str(out))
    want = Cluster.from_dict(make_doc(name="16x8xA100-80GB", servers=16, gpus_per_server=8, gpu="A100-80GB",
                                      intra="nvswitch-a100", inter="ib-hdr-200", nics=8, oversubscription=2.0), "x")
    assert c.k == 128 and c.devices == want.devices and c.bandwidth == want.bandwidth and c.latency == want.latency
    assert c.bandwidth[0][8] == 1.25e10 and c.to_dict() == orjson.loads(out.read_bytes())
    assert len(out.read_bytes()) <= 100_000
    r = CliRunner().invoke(main, ["clusters", "make", "--servers", "2", "--nics", "4", "--rails", "8"])
    assert r.exit_code == 1 and "field rails: 8 rails but 4 NICs" in r.stderr and r.stdout == ""
    r = CliRunner().invoke(main, ["clusters", "make", "--servers", "2", "--inter", "ib-xdr"])
    assert r.exit_code == 2 and "'--inter'" in r.stderr and "ib-ndr-400" in r.stderr


def test_placer_clusters_describes_servers():
    r = CliRunner().invoke(main, ["clusters", "16xDGX-H100"])
    assert r.exit_code == 0
    for text in ("16 servers, 128 GPUs", "8x H100-80GB", "450 GB/s", "8x 50 GB/s", "oversubscription 1",
                 "sources"):
        assert text in r.stdout
    r = CliRunner().invoke(main, ["clusters", "2xDGX-A100", "--format", "json"])
    assert r.exit_code == 0 and orjson.loads(r.stdout)["servers"]["groups"] == [{"type": "DGX-A100", "count": 2}]


def test_a_placement_on_two_servers_simulates():
    g = load_graph(SAMPLES / "layered_300.json")
    c = bundled_cluster("2xDGX-A100")
    report = simulate(g, c, place(g, c, "heft"))
    assert report["status"] == "OK" and report["makespan_s"] >= report["lower_bound_s"] > 0


def test_pair_stats_of_servers_weight_one_server_per_type_as_all_pairs_would(monkeypatch):
    from celeritas_cli.model.costs import CostModel

    monkeypatch.setattr(servers_mod, "DENSE_MAX", 0)
    c = bundled_cluster("16xDGX-H100")
    pairs = [(a, b) for a in range(c.k) for b in range(c.k) if a != b]
    brute = (sum(c.latency[a][b] for a, b in pairs) / len(pairs), sum(1 / c.bandwidth[a][b] for a, b in pairs) / len(pairs),
             max(c.latency[a][b] for a, b in pairs), max(1 / c.bandwidth[a][b] for a, b in pairs))
    assert c.pair_stats() == pytest.approx(brute, rel=1e-12)
    g = load_graph(SAMPLES / "layered_60.json")
    assert CostModel(g, c)._pair_stats == c.pair_stats()
    # by hand on the 2 x 4 cluster: per sender 3 fabric pairs (2 us) and 4 NIC pairs (2 at 5 us, 2 at 7 us)
    mlat, minv, xlat, xinv = Cluster.from_dict(_doc(), "t").pair_stats()
    assert mlat == pytest.approx((3 * 2e-6 + 2 * 5e-6 + 2 * 7e-6) / 7) and xlat == pytest.approx(7e-6)
    assert minv == pytest.approx((3 / 1e11 + 4 / 5e9) / 7) and xinv == pytest.approx(1 / 5e9)
