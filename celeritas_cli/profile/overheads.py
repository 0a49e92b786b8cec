"""What real runs say a step costs beyond its nodes' own times - the
executor's dispatch gaps and what a transfer costs the two processes
(:func:`fit_dispatch`), the links as timed inside the steps
(:func:`fit_links`) and a ring collective's fixed cost per step
(:func:`fit_collective`) - from ``placer run --node-times`` reports; steps
1, 4 and 5 of :mod:`celeritas_cli.profile.calibrate`, which writes them
into the calibrated files.  No torch.
"""

from __future__ import annotations

import math
import statistics

from ..errors import InvalidInput
from ..model.cluster import Cluster
from .commfit import fit_link
from .regression import nnls


def dispatch_gaps(nt: dict, clock: str = "wall") -> dict[str, float]:
    """Per device of one run: (span of its nodes - their times - waits for tensors inside the span and
    exposed all-reduces) /
    nodes, at least 0 - the executor's fixed cost per node (module docstring, step 1).  With
    ``clock="cpu"``: the CPU time of the device's thread in the step (``step_cpu_s``) not spent in
    its nodes, per node (without waiting for a core); without it, the wall gap scaled by the
    device's CPU / wall time in its nodes.

    >>> nt = {"nodes": [{"id": "a", "device": "d", "measured_s": 1.0, "start_s": 0.0},
    ...                 {"id": "b", "device": "d", "measured_s": 1.0, "start_s": 3.0}],
    ...       "transfers": [{"dst": "d", "waited_s": 0.5, "received_s": 3.0}]}
    >>> dispatch_gaps(nt)
    {'d': 0.75}
    """
    out = {}
    by_dev: dict[str, list[dict]] = {}
    for row in nt["nodes"]:
        by_dev.setdefault(row["device"], []).append(row)
    for d, rows in by_dev.items():
        first = min(r["start_s"] for r in rows)
        last = max(r["start_s"] + r["measured_s"] for r in rows)
        busy = math.fsum(r["measured_s"] for r in rows)
        waits = 0.0
        for t in nt.get("transfers", []):
            if t.get("dst") == d and t.get("waited_s"):
                end = t.get("received_s")
                if end is None:
                    waits += t["waited_s"]
                else:          # only the part of the wait between the device's first and last node
                    waits += max(0.0, min(end, last) - max(end - t["waited_s"], first))
        waits += math.fsum(a.get("exposed_s") or 0.0 for a in nt.get("allreduce", []) if a.get("device") == d)
        span = last - first
        gap = max(0.0, (span - busy - waits) / len(rows))
        cpu = [r.get("cpu_s") for r in rows]
        if clock == "cpu" and all(c is not None for c in cpu):
            step_cpu = (nt.get("step_cpu_s") or {}).get(d)
            if step_cpu is not None:                    # the thread's CPU time between its nodes
                gap = max(0.0, (step_cpu - math.fsum(cpu)) / len(rows))
            elif busy > 0:                              # the gap's share that was not waiting for a core
                gap *= min(1.0, math.fsum(cpu) / busy)
        out[d] = gap
    return out


def fit_dispatch(reports: list[dict], clock: str = "wall") -> dict:
    """Every device's dispatch gaps of every run (:func:`dispatch_gaps`) as ``per_node_s * nodes +
    (send_s + send_s_per_byte * bytes) * sent + recv_s * received`` (non-negative least squares,
    :func:`~celeritas_cli.profile.regression.nnls`): each transfer costs its sender a contiguous
    copy of the tensor and a post, and its receiver the wait and a buffer, so a placement that sends
    more has larger gaps.  ``per_node_s`` goes into the node times (it does not depend on the
    placement); the transfer terms become the hosts' ``send_s`` / ``recv_s`` lines, which the
    simulator charges to the devices (rule 3a of :mod:`celeritas_cli.sim.simulator`).
    ``per_transfer_s`` is the one-number summary: a transfer's cost to both processes at the
    runs' mean tensor size.

    >>> nt = lambda gap, sent: {"nodes": [{"id": "a", "device": "d", "measured_s": 1.0, "start_s": 0.0},
    ...                                   {"id": "b", "device": "d", "measured_s": 1.0, "start_s": 1.0 + gap}],
    ...                         "transfers": [{"src": "d", "dst": "e", "bytes": 0}] * sent}
    >>> f = fit_dispatch([{"node_times": nt(0.2, 0)}, {"node_times": nt(0.6, 4)}])
    >>> round(f["per_node_s"], 9), round(f["send_s"][0], 9), f["recv_s"]
    (0.1, 0.1, [0.0, 0.0])
    """
    rows, ys = [], []
    sizes: list[float] = []
    for rep in reports:
        nt = rep["node_times"]
        gaps = dispatch_gaps(nt, clock)
        for d, g in gaps.items():
            n = sum(1 for r in nt["nodes"] if r["device"] == d)
            sent = [float(x.get("bytes") or 0) for x in nt.get("transfers", []) if x.get("src") == d]
            recv = sum(1 for x in nt.get("transfers", []) if x.get("dst") == d)
            sizes.extend(sent)
            rows.append([float(n), float(len(sent)), math.fsum(sent), float(recv)])
            ys.append(g * n)
    if not rows:
        return {"per_node_s": 0.0, "per_transfer_s": 0.0, "send_s": [0.0, 0.0], "recv_s": [0.0, 0.0], "devices": 0}
    g0, s0, sb, r0 = nnls(rows, ys)
    s0, r0 = (x if x >= 1e-9 else 0.0 for x in (s0, r0))    # below a nanosecond: the clocks' rounding
    sb = sb if sb >= 1e-15 else 0.0                           # faster than a petabyte per second: none
    mean = math.fsum(sizes) / len(sizes) if sizes else 0.0
    return {"per_node_s": g0, "per_transfer_s": s0 + sb * mean + r0, "send_s": [s0, sb], "recv_s": [r0, 0.0],
            "devices": len(rows)}


def fit_links(reports: list[dict], cluster: Cluster) -> dict[tuple[str, str], dict]:
    """Per directed device pair with exactly timed transfers: its link (module docstring, step 4):
    ``{"latency_s", "bandwidth_Bps", "n", "how", "error"}`` (error: median relative deviation)."""
    pts: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rep in reports:
        for t in rep["node_times"].get("transfers", []):
            if t.get("seconds") is not None and t["src"] != t["dst"]:
                pts.setdefault((t["src"], t["dst"]), []).append((float(t["bytes"]), float(t["seconds"])))
    out = {}
    for (a, b), xs in sorted(pts.items()):
        ia, ib = cluster.index[a], cluster.index[b]
        try:
            f = fit_link(xs, f"{a}->{b}", weighting="relative")
            lat, bw, how = f["latency_s"], f["bandwidth_Bps"], "t = k*d + b"
        except InvalidInput:          # one size, or no growth with size: keep the bandwidth, fit the latency
            bw = cluster.bandwidth[ia][ib]
            lat, how = max(0.0, statistics.median(s - d / bw for d, s in xs)), "latency (bandwidth kept)"
        err = statistics.median(abs(lat + d / bw - s) / s for d, s in xs if s > 0) if xs else 0.0
        out[(a, b)] = {"latency_s": lat, "bandwidth_Bps": bw, "n": len(xs), "how": how, "error": err}
    return out


def fit_collective(reports: list[dict], cluster: Cluster, links: dict) -> dict:
    """``{"collective_step_s", "buckets"}`` (module docstring, step 5): per all-reduce of a data-parallel
    run (``node_times.allreduce``, one row per bucket and replica), the fastest replica's time less a ring
    of ``2 (k - 1)`` steps over the links (the fitted *links*, else the cluster's), per step; the median
    over the buckets, at least 0.

    >>> c = Cluster.from_dict({"schema": "placer.cluster/v1", "links": {"default": {"bandwidth_Bps": 1e3}},
    ...     "devices": [{"id": i, "type": "cpu", "memory_bytes": 1} for i in ("a", "b")]})
    >>> rows = [{"device": "a", "tensor": "b0", "bytes": 1000, "seconds": 1.5},
    ...         {"device": "b", "tensor": "b0", "bytes": 1000, "seconds": 1.2}]
    >>> f = fit_collective([{"data_parallel": {"replicas": 2}, "node_times": {"allreduce": rows}}], c, {})
    >>> round(f["collective_step_s"], 9), f["buckets"]    # (1.2 - 2 steps of 500 B at 1000 B/s) / 2
    (0.1, 1)
    """
    excess = []
    for rep in reports:
        k = (rep.get("data_parallel") or {}).get("replicas")
        rows = rep["node_times"].get("allreduce") or []
        if not k or k < 2 or not rows:
            continue
        devs = sorted({r["device"] for r in rows}, key=lambda d: cluster.index[d])
        pairs = [(devs[q - 1], devs[q]) for q in range(len(devs))]
        by_bucket: dict[str, list[dict]] = {}
        for r in rows:
            if r.get("seconds") is not None:
                by_bucket.setdefault(str(r.get("tensor")), []).append(r)
        for _, rs in sorted(by_bucket.items()):
            chunk = max(r["bytes"] for r in rs) / k
            step = statistics.mean(
                (links[(a, b)]["latency_s"] + chunk / links[(a, b)]["bandwidth_Bps"]) if (a, b) in links
                else cluster.comm_time(chunk, cluster.index[a], cluster.index[b]) for a, b in pairs)
            excess.append((min(r["seconds"] for r in rs) - 2 * (k - 1) * step) / (2 * (k - 1)))
    return {"collective_step_s": max(0.0, statistics.median(excess)) if excess else 0.0, "buckets": len(excess)}
