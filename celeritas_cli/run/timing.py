"""``placer run --node-times``: what every node and transfer took in the
timed steps, next to what the simulator said (the ``node_times`` section of
``placer.run/v1``; ``placer calibrate`` fits the simulator's inputs from it).

Every rank keeps, per timed step (:func:`record`): the start of the step
(``time.perf_counter``, which on Linux is ``CLOCK_MONOTONIC``: one clock for
all processes of a host), each node's start, wall time and process CPU time
(:class:`~celeritas_cli.run.executor.Timer`), and its channel's events:
``("send", transfer, posted)``, ``("recv", transfer, wait start, wait end,
arrived before the wait)``, ``("copy", transfer, t0, t1)`` (one process), and
data parallelism's ``("allreduce", gradient, bytes, started, wait start,
wait end, done before the wait)``.  :func:`section` takes the median over the
timed steps:

- a node's ``measured_s`` (wall; CPU devices also ``cpu_s``) and ``start_s``
  (from the start of the step on the earliest rank); ``cpu_s`` is the CPU time of
  the thread that ran the node (without waiting for a core, without the
  backend's threads); ``step_cpu_s`` per device run by its own process, the
  CPU time of that thread in the whole step (nodes, the executor's work between
  them, posting sends; not the waits, which block);
- a transfer's ``seconds``: from the sender posting it to the receiver
  holding it, known exactly only when the receiver was already waiting -
  its wait lasted :data:`BLOCKED_S` or more (``exact_steps`` counts those
  steps); otherwise ``bound_s`` is an upper bound (it arrived before the
  receiver looked).  Ranks on different hosts have no common clock: their
  transfers get no ``seconds``;
- a gradient all-reduce's ``seconds`` (start to result, exact when the update
  waited for it) and ``exposed_s``, the time the update waited (the part the
  backward pass did not hide), ``hidden_s`` the time from its start to the
  update asking for it.

Example
-------
>>> rows = [{"device": 0, "host": "h", "timing": [
...     {"t_start": 10.0, "nodes": [(0, 0, 0.0, 0.5, 0.4)], "events": []},
...     {"t_start": 20.0, "nodes": [(0, 0, 0.0, 0.7, 0.6)], "events": []}]}]
>>> sec = section(rows, node_id=lambda v, d: "a", device_id=lambda d: "cpu0", batch=8)
>>> sec["nodes"][0]["measured_s"], sec["nodes"][0]["cpu_s"], sec["steps"]
(0.6, 0.5, 2)
"""

from __future__ import annotations

import statistics
from typing import Callable

ESTIMATOR = "median over the timed steps"
#: a wait at least this long means the receiver blocked, so the tensor arrived when the wait ended (gloo's
#: point-to-point works do not say whether they completed before ``wait``: ``is_completed`` stays false)
BLOCKED_S = 50e-6


def host() -> str:
    """This machine's name (ranks on one host share a clock)."""
    import socket

    return socket.gethostname()


def record(res: dict, extra_events=()) -> dict:
    """What one timed step of a :class:`~celeritas_cli.run.executor.Runner` keeps (``res`` is
    its :meth:`~celeritas_cli.run.executor.Runner.step` result with ``node_times``)."""
    return {"t_start": res["t_start"], "cpu_step": res.get("cpu_step"), "nodes": list(res["nodes"]),
            "events": list(res["events"]) + list(extra_events)}


def placement_doc(placement) -> dict:
    """The placement that ran, without its carried derived graph and estimate (the report keeps it so
    that ``placer calibrate`` can simulate the same placement under calibrated costs)."""
    doc = placement.to_dict(timings=False)
    doc.pop("split_graph", None)
    doc["estimate"] = {}
    return doc


def _med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def section(ranks: list[dict], *, node_id: Callable[[int, int], str], device_id: Callable[[int], str], batch: int,
            transfers: dict | None = None, sched=None, sim_graph=None) -> dict:
    """The ``node_times`` section from every rank's timed steps.

    Parameters
    ----------
    ranks : per process ``{"device": its cluster device index (None: several), "host": hostname,
        "timing": [record(...), ...]}``.
    node_id : ``(captured node index, device) -> id`` of the node in the simulated graph.
    device_id : cluster device index -> id.
    batch : the batch every node ran at (a replica's batch under data parallelism).
    transfers : transfer index -> ``(tensor name, src device, dst device, bytes)``.
    sched, sim_graph : the simulator's :class:`~celeritas_cli.sim.simulator.Schedule` and the graph it ran,
        for the ``simulated_*`` fields.

    Returns
    -------
    dict, see the module docstring.
    """
    steps = min((len(r["timing"]) for r in ranks), default=0)
    hosts = {row[1]: r.get("host") for r in ranks for rec in r["timing"] for row in rec["nodes"]}
    one_host = len(set(hosts.values())) <= 1
    origins = [min(r["timing"][i]["t_start"] for r in ranks) for i in range(steps)]
    nodes: dict[tuple[int, int], dict] = {}
    sent: dict[int, list] = {}
    recv: dict[int, list] = {}
    ar: dict[tuple[int, str], list] = {}
    for r in ranks:
        for i in range(steps):
            rec = r["timing"][i]
            shift = rec["t_start"] - origins[i] if one_host else 0.0
            for v, d, start, wall, cpu in rec["nodes"]:
                row = nodes.setdefault((v, d), {"wall": [], "cpu": [], "start": []})
                row["wall"].append(wall)
                row["cpu"].append(cpu)
                row["start"].append(start + shift)
            origin = origins[i] if one_host else rec["t_start"]
            for ev in rec["events"]:
                if ev[0] == "send":
                    sent.setdefault(ev[1], [None] * steps)[i] = ev[2] - origin
                elif ev[0] == "recv":
                    recv.setdefault(ev[1], [None] * steps)[i] = (ev[2] - origin, ev[3] - origin,
                                                                 ev[3] - ev[2] >= BLOCKED_S)
                elif ev[0] == "copy":
                    sent.setdefault(ev[1], [None] * steps)[i] = ev[2] - origin
                    recv.setdefault(ev[1], [None] * steps)[i] = (ev[3] - origin, ev[3] - origin, True)
                elif ev[0] == "allreduce":
                    ar.setdefault((r["device"], ev[1]), []).append((ev[2], ev[3], ev[4], ev[5], ev[6]))
    sim_index = {nid: v for v, nid in enumerate(sim_graph.ids)} if sim_graph is not None else {}
    out_nodes = []
    for (v, d), row in sorted(nodes.items(), key=lambda kv: (_med(kv[1]["start"]), kv[0])):
        nid = node_id(v, d)
        item = {"id": nid, "device": device_id(d), "measured_s": _med(row["wall"]), "cpu_s": _med(row["cpu"]),
                "start_s": _med(row["start"])}
        s = sim_index.get(nid)
        if sched is not None and s is not None:
            item["simulated_s"] = sched.finish[s] - sched.start[s]
            item["simulated_start_s"] = sched.start[s]
        out_nodes.append(item)
    step_cpu = {}
    for r in ranks:        # a process running one device: its main thread's CPU time per step
        devs = {row[1] for rec in r["timing"] for row in rec["nodes"]}
        cpu = [rec.get("cpu_step") for rec in r["timing"][:steps]]
        if len(devs) == 1 and cpu and all(c is not None for c in cpu):
            step_cpu[device_id(devs.pop())] = statistics.median(cpu)
    out = {"estimator": ESTIMATOR, "steps": steps, "batch": batch, "step_cpu_s": step_cpu,
           "clock": "wall (perf_counter); cpu_s: thread CPU time", "same_host": one_host,
           "hosts": {device_id(d): h for d, h in sorted(hosts.items())},
           "nodes": out_nodes, "transfers": _transfers(transfers or {}, sent, recv, steps, one_host, sched, sim_graph,
                                                      device_id)}
    if ar:
        out["allreduce"] = [_allreduce(dev, name, samples, device_id) for (dev, name), samples in sorted(ar.items())]
    return out


def _transfers(info: dict, sent: dict, recv: dict, steps: int, one_host: bool, sched, sim_graph, device_id) -> list:
    sim: dict[tuple[str, int, int], tuple[float, float]] = {}
    if sched is not None and sim_graph is not None:
        for tr in sched.transfers:
            sim[(sim_graph.tensor_name[tr.tensor], tr.src_dev, tr.dst_dev)] = (tr.end - tr.start, tr.start)
    rows = []
    for ti in sorted(info):
        name, a, b, nbytes = info[ti]
        exact, bound, waited, arrived, posted = [], [], [], [], []
        for i in range(steps):
            s = (sent.get(ti) or [None] * steps)[i]
            r = (recv.get(ti) or [None] * steps)[i]
            if s is None or r is None:
                continue
            w0, w1, blocked = r
            posted.append(s)
            arrived.append(w1)
            waited.append(w1 - w0)
            if not one_host:
                continue
            if blocked:
                exact.append(w1 - s)
            else:
                bound.append(max(0.0, w0 - s))
        row = {"tensor": name, "src": device_id(a), "dst": device_id(b), "bytes": int(nbytes),
               "seconds": _med(exact), "bound_s": _med(bound), "exact_steps": len(exact),
               "sent_s": _med(posted), "received_s": _med(arrived), "waited_s": _med(waited)}
        if (name, a, b) in sim:
            row["simulated_s"], row["simulated_start_s"] = sim[(name, a, b)]
        rows.append(row)
    return rows


def _allreduce(dev: int, name: str, samples: list, device_id) -> dict:
    exact = [w1 - t0 for _, t0, w0, w1, _ in samples if w1 - w0 >= BLOCKED_S]
    return {"device": device_id(dev), "tensor": name, "bytes": int(samples[0][0]), "seconds": _med(exact),
            "exact_steps": len(exact), "exposed_s": _med([w1 - w0 for _, _, w0, w1, _ in samples]),
            "hidden_s": _med([w0 - t0 for _, t0, w0, _, _ in samples])}
