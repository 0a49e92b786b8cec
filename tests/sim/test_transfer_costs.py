"""Rule 3a of the simulator: a transfer's cost on its sender's and its receiver's own time (a host's
``send_s`` / ``recv_s``, fitted by ``placer calibrate``), and a host's contention only where the placement
crowds it.  Makespans computed by hand on three nodes."""

from __future__ import annotations

import pytest

from celeritas_cli.model.cluster import Cluster
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import run_schedule, simulate

#: a (1 s) makes one tensor of 100 bytes that b (2 s) and c (1 s) read
GRAPH = build("abc", [{"id": "a", "compute_s": 1.0, "memory_bytes": 0},
                      {"id": "b", "compute_s": 2.0, "memory_bytes": 0},
                      {"id": "c", "compute_s": 1.0, "memory_bytes": 0}],
              [{"src": "a", "dst": "b", "bytes": 100, "tensor": "a:0"},
               {"src": "a", "dst": "c", "bytes": 100, "tensor": "a:0"}])


def cluster(**host) -> Cluster:
    """Three CPU processes on one host, links of 100 B/s without latency (a 100-byte transfer: 1 s)."""
    doc = {"schema": "placer.cluster/v1", "name": "h3",
           "devices": [{"id": f"cpu{i}", "type": "cpu", "memory_bytes": 10**9} for i in range(3)],
           "links": {"default": {"bandwidth_Bps": 100.0, "latency_s": 0.0}}}
    if host:
        doc["hosts"] = [{"name": "h", "devices": ["cpu0", "cpu1", "cpu2"], **host}]
    return Cluster.from_dict(doc)


COSTS = {"send_s": [0.5, 0.01], "recv_s": [0.25, 0.0]}      # a send of 100 B: 1.5 s; a receive: 0.25 s


def place(c: Cluster, devs: str) -> Placement:
    return Placement("abc", c.name, "hand", {v: f"cpu{d}" for v, d in zip("abc", devs)})


def test_the_sender_pays_per_transfer_and_the_first_reader_per_received_tensor():
    """a on cpu0 runs 1 s + one send (0.5 + 0.01 x 100 = 1.5 s): 2.5 s; the tensor arrives at 3.5 s; b (the
    higher rank) reads it first on cpu1: 2 + 0.25 s, to 5.75 s; c then reads it already received: 1 s,
    to 6.75 s.  Without the costs: 1 + 1 + 2 + 1 = 5 s."""
    c = cluster(**COSTS)
    r = simulate(GRAPH, c, place(c, "011"))
    assert r["makespan_s"] == pytest.approx(6.75)
    dev = {d["id"]: d for d in r["devices"]}
    assert dev["cpu0"]["busy_s"] == pytest.approx(2.5) and dev["cpu0"]["transfer_overhead_s"] == pytest.approx(1.5)
    assert dev["cpu1"]["busy_s"] == pytest.approx(3.25) and dev["cpu1"]["transfer_overhead_s"] == pytest.approx(0.25)
    plain = cluster()
    assert simulate(GRAPH, plain, place(plain, "011"))["makespan_s"] == pytest.approx(5.0)
    assert "transfer_overhead_s" not in simulate(GRAPH, plain, place(plain, "011"))["devices"][0]


def test_one_send_per_remote_device_and_tensors_ready_after_all_sends():
    """a sends its tensor to cpu1 and cpu2: 1 + 2 x 1.5 = 4 s; both arrive at 5 s (separate channels);
    b: 5 + 2.25 = 7.25 s, c: 5 + 1.25 = 6.25 s."""
    c = cluster(**COSTS)
    s = run_schedule(GRAPH, c, [0, 1, 2])
    assert s.finish == pytest.approx([4.0, 7.25, 6.25]) and s.makespan == pytest.approx(7.25)
    assert [t.ready for t in s.transfers] == pytest.approx([4.0, 4.0])
    assert s.overhead == pytest.approx([3.0, 0.25, 0.25])


def test_overhead_is_what_the_transfers_cost_counted_another_way():
    """Cross-check on a random placement of a random graph: the devices' overhead is the send line over
    the schedule's transfers plus the receive line once per (tensor, receiving device)."""
    from celeritas_cli.model.generate import layered

    g = layered(80, seed=3)
    c = cluster(send_s=[1e-3, 2e-9], recv_s=[5e-4, 1e-9])
    dev = [(v * 7 + 3) % 3 for v in range(g.n)]
    s = run_schedule(g, c, dev)
    want = [0.0] * 3
    for t in s.transfers:
        want[t.src_dev] += 1e-3 + 2e-9 * t.nbytes
        want[t.dst_dev] += 5e-4 + 1e-9 * t.nbytes       # one transfer per (tensor, device): one receive
    assert s.overhead == pytest.approx(want)
    free = run_schedule(g, cluster(send_s=[0.0, 0.0], recv_s=[0.0, 0.0]), dev)
    assert free.makespan == run_schedule(g, cluster(), dev).makespan <= s.makespan


def test_contention_only_where_the_placement_crowds_the_host():
    """Contention 2: on one device the step takes its 4 s alone; split over two devices of the host
    every node takes twice its time: a 2 s, the transfer 1 s, b 4 s, c 2 s: 9 s."""
    c = cluster(contention=2.0)
    assert simulate(GRAPH, c, place(c, "000"))["makespan_s"] == pytest.approx(4.0)
    r = simulate(GRAPH, c, place(c, "011"))
    assert r["makespan_s"] == pytest.approx(9.0)
    assert {d["id"]: d["busy_s"] for d in r["devices"]} == pytest.approx({"cpu0": 2.0, "cpu1": 6.0, "cpu2": 0.0})


def test_a_hosts_collective_step_cost_goes_to_the_ring_steps_only():
    """A data-parallel graph's explicit ring steps (``collectives="ring"``: ops ``allreduce.reduce-scatter``
    / ``.all-gather``) take the host's ``collective_step_s`` on top of their time; every other node keeps its
    time, and the last bucket's ring lies between the backward pass and the update, so the step grows by at
    least one step's 0.25 s.  In the nccl form (one ``collective.all-reduce`` node per replica) no node's time
    changes: the all-reduce's 2 (k - 1) = 2 ring steps pay it in ``collective_time`` (0.5 s more), once."""
    from celeritas_cli.model.collectives import collective_time
    from celeritas_cli.model.costs import RING_STEPS, cost_model
    from celeritas_cli.model.generate import layered
    from celeritas_cli.transform.replicate import data_parallel_graph

    g = layered(30, seed=2)
    dp = data_parallel_graph(g, 2, collectives="ring")
    plain, costly = cluster(), cluster(collective_step_s=0.25)
    a, b = cost_model(dp, plain).time, cost_model(dp, costly).time
    steps = [v for v, op in enumerate(dp.op) if op.endswith(RING_STEPS)]
    assert steps and all(b[v] == pytest.approx([t + 0.25 for t in a[v]]) for v in steps)
    assert all(a[v] == b[v] for v in range(dp.n) if v not in set(steps))
    dev = [int(nid.rsplit("/rep", 1)[1]) for nid in dp.ids]        # replica q on device q
    assert run_schedule(dp, costly, dev).makespan >= run_schedule(dp, plain, dev).makespan + 0.25 - 1e-9
    nccl = data_parallel_graph(g, 2)
    coll = [v for v, op in enumerate(nccl.op) if op.startswith("collective.")]
    assert coll and cost_model(nccl, plain).time == cost_model(nccl, costly).time
    for v in coll:
        nbytes = nccl.node_extra[v]["collective"]["bytes"]
        assert collective_time(costly, [0, 1], "all-reduce", nbytes) == \
            pytest.approx(collective_time(plain, [0, 1], "all-reduce", nbytes) + 2 * 0.25)
    dev = [int(nid.rsplit("/rep", 1)[1]) for nid in nccl.ids]
    assert run_schedule(nccl, costly, dev).makespan >= run_schedule(nccl, plain, dev).makespan + 0.5 - 1e-9


def test_the_table_says_what_the_devices_spent_on_transfers(tmp_path):
    from click.testing import CliRunner

    from celeritas_cli.cli import main
    from celeritas_cli.model.jsonio import write_json

    c = cluster(**COSTS)
    write_json(GRAPH.to_dict(), tmp_path / "g.json")
    write_json(c.doc, tmp_path / "c.json")
    write_json(place(c, "011").to_dict(), tmp_path / "p.json")
    r = CliRunner().invoke(main, ["simulate", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.json"),
                                  "-P", str(tmp_path / "p.json"), "--format", "table"])
    assert r.exit_code == 0, r.output
    assert "sending and receiving tensors (the hosts' send_s / recv_s): cpu0 1.5 s, cpu1 0.25 s, cpu2 0 s" in r.output
