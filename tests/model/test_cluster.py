"""Bundled clusters: `placer clusters`, presets for today's hardware, unknown names."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import place, simulate
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.io import (
    bundled_cluster,
    bundled_cluster_names,
    load_cluster,
    load_graph,
)

from ..conftest import SAMPLES

PRESETS = ("8xA100-nvswitch", "8xH100-nvswitch", "2x8xA100-infiniband", "cpu-a100-pcie")


def run(args):
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("name", bundled_cluster_names())
def test_every_bundled_cluster_loads_and_says_where_its_figures_come_from(name):
    c = bundled_cluster(name)
    assert c.name == name
    meta = c.doc["meta"]
    assert meta.get("sources") or meta.get("source")
    assert c.summary()["description"]


def test_presets_for_current_hardware():
    assert set(PRESETS) <= set(bundled_cluster_names())
    h = bundled_cluster("8xH100-nvswitch")
    assert h.k == 8 and {d.type for d in h.devices} == {"H100"} and h.devices[0].memory == 80 * 2**30
    assert h.comm_time(4.5e9, 0, 7) == pytest.approx(3e-6 + 0.01)  # 450 GB/s per direction
    host = bundled_cluster("cpu-a100-pcie")
    assert [d.type for d in host.devices] == ["CPU", "A100"]


def test_two_servers_route_cross_server_pairs_through_the_peer_gpu():
    c = bundled_cluster("2x8xA100-infiniband")
    i = c.index
    assert c.k == 16
    assert c.bandwidth[i["s0gpu1"]][i["s0gpu5"]] == 3e11 and c.latency[i["s0gpu1"]][i["s0gpu5"]] == 3e-6
    assert c.bandwidth[i["s0gpu3"]][i["s1gpu3"]] == 2.5e10 and c.latency[i["s0gpu3"]][i["s1gpu3"]] == 5e-6
    # s0gpu3 -> s1gpu6 via s1gpu3: the InfiniBand hop's bandwidth, latencies added (5 + 3 us)
    assert c.bandwidth[i["s0gpu3"]][i["s1gpu6"]] == 2.5e10
    assert c.latency[i["s0gpu3"]][i["s1gpu6"]] == pytest.approx(8e-6)


@pytest.mark.parametrize("name", PRESETS)
def test_a_placement_on_each_preset_simulates(name):
    g = load_graph(SAMPLES / "layered_300.json")
    c = bundled_cluster(name)
    report = simulate(g, c, place(g, c, "heft"))
    assert report["status"] == "OK" and report["makespan_s"] >= report["lower_bound_s"] > 0


def test_placer_clusters_lists_and_describes():
    r = run(["clusters"])
    assert r.exit_code == 0
    for name in bundled_cluster_names():
        assert name in r.stdout
    r = run(["clusters", "2x8xA100-infiniband"])
    assert r.exit_code == 0 and "25 GB/s" in r.stdout and "sources" in r.stdout
    r = run(["clusters", "8xA100-nvswitch", "--format", "json"])
    assert r.exit_code == 0
    doc = orjson.loads(r.stdout)
    assert Cluster.from_dict(doc, "x").k == 8
    listing = orjson.loads(run(["clusters", "--format", "json"]).stdout)
    assert [s["name"] for s in listing["clusters"]] == bundled_cluster_names()


def test_unknown_cluster_names_list_the_bundled_ones():
    r = run(["clusters", "9xB200"])
    assert r.exit_code == 2 and "8xH100-nvswitch" in r.stderr
    with pytest.raises(InvalidInput, match="no bundled cluster of that name.*8xA100-nvswitch"):
        load_cluster("9xB200")
    r = run(["place", str(SAMPLES / "layered_60.json"), "--algo", "random", "-c", "9xB200"])
    assert r.exit_code == 1 and "bundled: " in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- hosts (placer calibrate)
def _hosts_cluster(hosts):
    return {"schema": "placer.cluster/v1", "name": "h",
            "devices": [{"id": i, "type": "cpu", "memory_bytes": 10} for i in ("a", "b", "c")],
            "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.0}}, "hosts": hosts}


def test_host_contention_multiplies_node_times_of_its_devices_only():
    from celeritas_cli.model.costs import cost_model
    from celeritas_cli.model.graph import build

    c = Cluster.from_dict(_hosts_cluster([{"name": "m", "devices": ["a", "b"], "contention": 1.25}]))
    g = build("x", [{"id": "n", "compute_s": 2.0, "memory_bytes": 0}], [])
    assert c.contention == [1.25, 1.25, 1.0] and cost_model(g, c).time == [[2.5, 2.5, 2.0]]
    p = place(g, c, "single-device")
    assert simulate(g, c, p)["makespan_s"] == [2.5, 2.5, 2.0][c.index[p.assignment["n"]]]
    assert Cluster.from_dict(_hosts_cluster([])).contention == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("hosts, message", [
    ([{"devices": ["a", "z"]}], "host #0 field devices: unknown device 'z'"),
    ([{"name": "m", "devices": ["a"]}, {"name": "n", "devices": ["a"]}], "device 'a' is in two hosts (m and n)"),
    ([{"devices": ["a"], "contention": 0.5}], "contention"),
])
def test_bad_hosts_are_refused_in_one_line(hosts, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        Cluster.from_dict(_hosts_cluster(hosts), "c.json")
