"""Where measured and simulated steps differ (issue 25, item 1): tables computed from the
``placer run --node-times`` reports of :mod:`bench_calibration` (round 1, before calibration).

Every function returns Markdown lines; none runs anything.  The numbers:

- **dispatch**: per placement, the executor's time between nodes that is neither a node nor a
  wait (:func:`celeritas_cli.profile.calibrate.dispatch_gaps`), per node and as a share of the step;
- **per-op overhead**: in the single-device run (one process), each node's thread CPU time against
  its isolated ``--measure`` time, fitted as ``overhead + scale * isolated``;
- **split scaling**: the data-parallel run's replica node times at ``b/2`` against the single-device
  run's at ``b`` (measured in the step), and the isolated ``--measure`` times at both batches;
- **transfers**: transfers the receiver waited for (so timed exactly) against the comm-bench line;
- **contention**: node times of each run against the same nodes alone (single-device run), wall and
  CPU, and the share of node wall time spent waiting for a core;
- **all-reduce**: the data-parallel run's bucket all-reduces, measured, exposed (the update waited)
  and hidden, against the simulated ring.
"""

from __future__ import annotations

import math
import statistics

from celeritas_cli.profile.calibrate import base_id, dispatch_gaps
from celeritas_cli.profile.regression import fit_line


def _nodes(rep: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for n in rep["node_times"]["nodes"]:
        out.setdefault(base_id(n["id"], rep), []).append(n)
    return out


def dispatch_rows(label: str, reports: dict[str, dict]) -> list[str]:
    rows = []
    for algo, rep in reports.items():
        nt = rep["node_times"]
        gaps = dispatch_gaps(nt)
        per_dev = {d: sum(1 for n in nt["nodes"] if n["device"] == d) for d in gaps}
        busiest = max(per_dev, key=lambda d: per_dev[d] * gaps[d])
        share = per_dev[busiest] * gaps[busiest] / rep["measured_step_s"] if rep["measured_step_s"] else 0.0
        waits = sum(t.get("waited_s") or 0.0 for t in nt["transfers"])
        cpu_gap = statistics.median(dispatch_gaps(nt, "cpu").values())
        rows.append(f"| {label} | {algo} | {rep['load_average']:.1f} | {rep['measured_step_s'] * 1e3:.2f} | "
                    f"{rep['simulated_step_s'] * 1e3:.2f} | {statistics.median(gaps.values()) * 1e6:.0f} | "
                    f"{cpu_gap * 1e6:.0f} | {100 * share:.0f}% | {waits * 1e3:.2f} |")
    return rows


def overhead_row(label: str, single: dict, graph: dict) -> str:
    iso = {n["id"]: n["compute_s"] for n in graph["nodes"]}
    xs, ys, ws = [], [], []
    for n in single["node_times"]["nodes"]:
        xs.append(iso[n["id"]])
        ys.append(n["cpu_s"] if n.get("cpu_s") is not None else n["measured_s"])
        ws.append(n["measured_s"])
    a, b = fit_line(xs, ys)
    gap = statistics.median(dispatch_gaps(single["node_times"]).values())
    return (f"| {label} | {len(xs)} | {sum(xs) * 1e3:.2f} | {sum(ys) * 1e3:.2f} | {sum(ws) * 1e3:.2f} | "
            f"{a * 1e6:.1f} | {b:.2f} | {gap * 1e6:.0f} | {single['measured_step_s'] * 1e3:.2f} | "
            f"{single['load_average']:.1f} |")


def split_row(label: str, single: dict, dp: dict, graph: dict, half: dict | None) -> str:
    whole = {k: v[0] for k, v in _nodes(single).items()}
    parts = _nodes(dp)
    t_b = sum(n["measured_s"] for n in whole.values())
    t_h = statistics.median([sum(n["measured_s"] for ns in parts.values() for n in ns if n["device"] == d)
                             for d in {n["device"] for ns in parts.values() for n in ns}])
    c_b = sum(n["cpu_s"] or 0.0 for n in whole.values())
    c_h = statistics.median([sum(n["cpu_s"] or 0.0 for ns in parts.values() for n in ns if n["device"] == d)
                             for d in {n["device"] for ns in parts.values() for n in ns}])
    iso_b = sum(n["compute_s"] for n in graph["nodes"])
    iso = f"{sum(n['compute_s'] for n in half['nodes']) / (iso_b / 2):.2f}" if half else "-"
    return (f"| {label} | {t_b * 1e3:.2f} | {t_h * 1e3:.2f} | {t_h / (t_b / 2):.2f} | {c_h / (c_b / 2):.2f} | "
            f"{iso} | {dp['simulated_step_s'] * 1e3:.2f} |")


def transfer_rows(label: str, reports: dict[str, dict], cluster) -> list[str]:
    rows = []
    for algo, rep in reports.items():
        ts = [t for t in rep["node_times"]["transfers"] if t.get("seconds") is not None]
        if not ts:
            continue
        pred = [cluster.comm_time(t["bytes"], cluster.index[t["src"]], cluster.index[t["dst"]]) for t in ts]
        ratio = statistics.median(t["seconds"] / p for t, p in zip(ts, pred) if p > 0)
        sim = [t["simulated_s"] for t in ts if t.get("simulated_s")]
        rows.append(f"| {label} | {algo} | {len(rep['node_times']['transfers'])} | {len(ts)} | "
                    f"{statistics.median(t['bytes'] for t in ts) / 1024:.0f} | "
                    f"{statistics.median(t['seconds'] for t in ts) * 1e6:.0f} | "
                    f"{statistics.median(pred) * 1e6:.0f} | {ratio:.1f} | "
                    f"{statistics.median(sim) * 1e6 if sim else float('nan'):.0f} |")
    return rows


def contention_rows(label: str, reports: dict[str, dict]) -> list[str]:
    alone = {k: v[0] for k, v in _nodes(reports["single-device"]).items()} if "single-device" in reports else {}
    rows = []
    for algo, rep in reports.items():
        nodes = rep["node_times"]["nodes"]
        wall = sum(n["measured_s"] for n in nodes)
        cpu = sum(n["cpu_s"] or 0.0 for n in nodes)
        procs = len({n["device"] for n in nodes})
        same = [(n, alone[base_id(n["id"], rep)]) for n in nodes
                if not rep.get("data_parallel") and base_id(n["id"], rep) in alone]
        rw = statistics.median(n["measured_s"] / a["measured_s"] for n, a in same if a["measured_s"] > 0) \
            if same else math.nan
        rc = statistics.median(n["cpu_s"] / a["cpu_s"] for n, a in same if a.get("cpu_s")) if same else math.nan
        rows.append(f"| {label} | {algo} | {procs} | {rep['load_average']:.1f} | {wall / cpu if cpu else math.nan:.2f} "
                    f"| {rw:.2f} | {rc:.2f} |")
    return rows


def allreduce_row(label: str, dp: dict, ring_s: float) -> str:
    ar = dp["node_times"].get("allreduce") or []
    if not ar:
        return f"| {label} | - | - | - | - | - | {ring_s * 1e3:.2f} |"
    secs = [a["seconds"] for a in ar if a["seconds"] is not None]
    return (f"| {label} | {len(ar)} | {ar[0]['bytes'] / 2**20:.2f} | "
            f"{statistics.median(secs) * 1e3 if secs else float('nan'):.2f} | "
            f"{statistics.median(a['exposed_s'] for a in ar) * 1e3:.2f} | "
            f"{statistics.median(a['hidden_s'] for a in ar) * 1e3:.2f} | {ring_s * 1e3:.2f} |")


def ring_seconds(sched) -> float:
    """Simulated duration of the data-parallel graph's all-reduces: first ring node start to last result."""
    g = sched.graph
    ring = [v for v in range(g.n) if isinstance((g.node_extra[v] or {}).get("allreduce"), dict)]
    if not ring:
        return 0.0
    return max(sched.finish[v] for v in ring) - min(sched.start[v] for v in ring)


HEADERS = {
    "dispatch": ("| model | placement | load | measured step (ms) | simulated (ms) | "
                 "dispatch gap per node, wall (us) | same, thread CPU (us) | gaps of the busiest device / step | "
                 "waited for tensors (ms) |\n"
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|"),
    "overhead": ("| model | nodes | isolated --measure (ms) | in the step, thread CPU (ms) | in the step, wall (ms) | "
                 "fit: overhead per op (us) | fit: scale | dispatch gap per node (us) | step (ms) | load |\n"
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"),
    "split": ("| model | nodes at b, wall (ms) | nodes at b/2 per replica, wall (ms) | t(b/2) / (t(b)/2), wall | "
              "same, thread CPU | same, isolated --measure | simulated DP step (ms) |\n"
              "|---|---:|---:|---:|---:|---:|---:|"),
    "transfer": ("| model | placement | transfers | timed exactly | median KiB | measured (us) | "
                 "comm-bench line (us) | measured / line | simulated (us) |\n"
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|"),
    "contention": ("| model | placement | processes | load | node wall / thread CPU | node wall vs alone | "
                   "node CPU vs alone |\n|---|---|---:|---:|---:|---:|---:|"),
    "allreduce": ("| model | all-reduces | MiB each | measured (ms) | exposed (ms) | hidden behind backward (ms) | "
                  "simulated ring (ms) |\n|---|---:|---:|---:|---:|---:|---:|"),
}
