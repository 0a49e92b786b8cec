"""``placer calibrate``: fit what the simulator needs from measured runs.

The inputs are ``placer.run/v1`` reports made with ``placer run
--node-times`` (:mod:`celeritas_cli.run.timing`), the graph file the
placements were made for and the cluster they ran on.  The fit (no torch):

1. **Dispatch and transfer overhead.**  On each device of each run, the time
   between its nodes that is neither a node, nor waiting for a tensor, nor
   waiting for an all-reduce - the executor's per-node bookkeeping, freeing
   tensors, the Python loop, and each transfer's copy, post and wait -
   fitted over all devices and runs as ``g * nodes + (s + s_b * bytes) *
   sent + r * received`` (non-negative least squares, :func:`fit_dispatch`):
   ``g`` is a fixed per-op cost the simulator does not know of, and a node's
   sample is ``measured_s + g``; ``[s, s_b]`` and ``[r, 0]`` become the
   host's ``send_s`` / ``recv_s`` lines, which the simulator charges to the
   sending and the receiving device (rule 3a of
   :mod:`celeritas_cli.sim.simulator`).
2. **Contention** (per host, :data:`hosts` of the cluster): devices that are
   processes on one machine share its cores and memory bandwidth.  For every
   node measured both in a run where it was alone on its host and in a run
   where several devices of the host were busy, the ratio of the medians of
   its own times; the factor ``kappa`` is the median ratio (at least 1).
   Node times from crowded runs are divided by ``kappa`` (before the gap is
   added); the simulator multiplies the node times of a host's devices by it
   where the placement keeps two or more of them busy, the same "crowded"
   as here (:meth:`~celeritas_cli.model.costs.CostModel.placed_time`).
3. **Node times and batch lines** (Celeritas 4.2.1's Standard Evaluation,
   :func:`~celeritas_cli.profile.regression.fit_line`): per node and device
   type the median sample at each batch it ran at; the value at the graph's
   batch ``B`` becomes ``compute_by_type[type]`` (and ``compute_s``), and with
   two or more batch sizes (a data-parallel run measures every node at
   ``B / k``) the least-squares line ``a + b * batch`` becomes the node's
   ``batch_line``, which the split cost model reads to time a replica or a
   micro-batch (:func:`~celeritas_cli.transform.split_cost.part_times`).
   A node measured only at another batch is scaled by its line or linearly;
   a node never measured gets its op type's fit ``overhead + scale * t``
   (:func:`fit_op_types`) of its old time.
4. **Links** (Celeritas 4.2.1, t = k·d + b per device pair as
   :func:`~celeritas_cli.profile.commfit.fit_link`): the transfers whose
   arrival the receiver waited for (so their time is known exactly), under
   the run's concurrency; a pair whose samples have one size keeps its
   bandwidth and gets the median latency.

5. **Collectives** (:func:`fit_collective`): a data-parallel run's
   all-reduces against a ring of the fitted links (``2 (k - 1)`` steps of a
   ``1/k`` chunk); the excess per step, the median over the buckets of the
   fastest replica's time (the last to arrive waits least), becomes the
   hosts' ``collective_step_s``, which the cost model adds to every ring
   step of a derived graph (gloo's fixed cost per collective step: the
   background thread's hand-offs on both processes).

The fit's error is the per-sample relative deviation from the fitted value
(:func:`~celeritas_cli.profile.regression.summarize`, Celeritas Table 5's
measure).  :mod:`celeritas_cli.run.resimulate` checks the result end to end:
the same placements simulated again, next to what was measured.

Example
-------
>>> g = {"schema": "placer.graph/v1", "name": "t", "meta": {"batch_size": 4},
...      "nodes": [{"id": "a", "compute_s": 1.0, "memory_bytes": 0}], "edges": []}
>>> c = {"schema": "placer.cluster/v1", "devices": [{"id": "cpu0", "type": "cpu", "memory_bytes": 1}],
...      "links": {"default": {"bandwidth_Bps": 1e9}}}
>>> nt = {"steps": 1, "batch": 4, "hosts": {"cpu0": "h"}, "transfers": [],
...       "nodes": [{"id": "a", "device": "cpu0", "measured_s": 0.5, "cpu_s": 0.5, "start_s": 0.0}]}
>>> rep = {"schema": "placer.run/v1", "model": "m", "batch_size": 4, "backend": "local", "match": True,
...        "loss_max_abs_diff": 0.0, "params_max_abs_diff": 0.0, "measured_step_s": 0.5, "simulated_step_s": 1.0,
...        "measured_over_simulated": 0.5, "devices": [], "links": [], "node_times": nt}
>>> cal = calibrate(g, c, [rep])
>>> cal.graph["nodes"][0]["compute_by_type"], cal.graph["nodes"][0]["compute_s"]
({'cpu': 0.5}, 0.5)

References
----------
Celeritas 4.2.1 (Standard Evaluation: per-node lines against the batch
size; t = k·d + b per link), 6.5.1 / Table 5 (deviation of the estimates);
FastT section 4 (per-device-pair cost models from measured runs).
"""

from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass, field

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.jsonio import validate
from .overheads import dispatch_gaps, fit_collective, fit_dispatch, fit_links
from .regression import fit_line, summarize

CLOCKS = ("wall", "cpu")


@dataclass
class Calibration:
    """The calibrated ``graph`` and ``cluster`` documents and what was fitted (``summary``)."""

    graph: dict
    cluster: dict
    summary: dict = field(default_factory=dict)


# ------------------------------------------------------------------ reading
def check_report(doc, label: str, graph: Graph, cluster: Cluster) -> dict:
    """Validate a ``placer.run/v1`` report with a ``node_times`` section made for *graph* on *cluster*,
    once, as it is read: everything the fit uses is then known to be in range and consistent.

    The schema bounds every time to ``0 .. 1e12`` s (a transfer's ``seconds`` above 0: no link is
    instant) and every byte count to 2^53-1; here the report must agree with itself and with the
    files: its ``node_times.batch`` is the batch it ran at (``batch_size``, or
    ``data_parallel.replica_batch``), every node is in the graph, and every device it names (of a
    node, a transfer, an all-reduce, ``hosts`` and ``step_cpu_s``) is in the cluster.

    Raises
    ------
    InvalidInput
        One line naming *label*, the field and what is wrong.
    """
    nt = doc.get("node_times") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and doc.get("schema") == "placer.run/v1" and not isinstance(nt, dict):
        raise InvalidInput(f"{label}: has no per-node times; run placer run again with --node-times")
    validate(doc, "placer.run/v1", label)
    dp = doc.get("data_parallel") if isinstance(doc.get("data_parallel"), dict) else None
    ran_at, field = (dp.get("replica_batch"), "data_parallel.replica_batch") if dp else (doc["batch_size"],
                                                                                        "batch_size")
    if nt["batch"] != ran_at:
        raise InvalidInput(f"{label}: node_times.batch is {nt['batch']} but {field} is {ran_at}: the nodes ran at "
                           f"the report's batch, so the report is inconsistent; give the report placer run wrote")
    known = set(graph.ids)
    gone = f"which is not in cluster '{cluster.name}'; give the --cluster the run used"
    for row in nt["nodes"]:
        base = base_id(row["id"], doc)
        if base not in known:
            raise InvalidInput(f"{label}: node '{row['id']}' is not in graph '{graph.name}'; give the --graph the "
                               f"placement was made for")
        if row["device"] not in cluster.index:
            raise InvalidInput(f"{label}: node '{row['id']}' ran on device '{row['device']}', {gone}")
    named = [(f"node_times.transfers[{i}].{end}", t[end]) for i, t in enumerate(nt["transfers"])
             for end in ("src", "dst")]
    named += [(f"node_times.allreduce[{i}].device", a["device"]) for i, a in enumerate(nt.get("allreduce") or [])]
    named += [(f"node_times.{key}", d) for key in ("hosts", "step_cpu_s") for d in nt.get(key) or {}]
    for where, d in named:
        if d not in cluster.index:
            raise InvalidInput(f"{label}: {where} names device '{d}', {gone}")
    return doc


def base_id(nid: str, report: dict) -> str:
    """The model-graph id of a node of a report (a data-parallel replica ``<id>/rep<r>`` -> ``<id>``)."""
    if report.get("data_parallel") and "/rep" in nid:
        return nid.rsplit("/rep", 1)[0]
    return nid


@dataclass
class _Sample:
    node: str
    dtype: str
    batch: int
    seconds: float         # the node's time
    crowded: bool          # other devices of its host were running in the same run
    host: str
    gap: float = 0.0       # its device's dispatch gap in that run


def node_samples(report: dict, cluster: Cluster, clock: str = "wall", gap: float | None = None) -> list[_Sample]:
    """One sample per node run in *report*: its time (``measured_s``, or ``cpu_s`` with ``clock="cpu"``)
    and the dispatch gap per node: *gap* (:func:`fit_dispatch`), else its device's in this run
    (:func:`dispatch_gaps`)."""
    nt = report["node_times"]
    gaps = dispatch_gaps(nt, clock)
    if gap is not None:
        gaps = {d: gap for d in gaps}
    hosts = nt.get("hosts") or {}
    host_of = {row["device"]: hosts.get(row["device"]) or row["device"] for row in nt["nodes"]}  # unknown: its own
    active: dict[str, set] = {}
    for row in nt["nodes"]:
        active.setdefault(host_of[row["device"]], set()).add(row["device"])
    batch = int(nt.get("batch") or report["batch_size"])
    out = []
    for row in nt["nodes"]:
        t = row.get("cpu_s") if clock == "cpu" and row.get("cpu_s") is not None else row["measured_s"]
        host = host_of[row["device"]]
        out.append(_Sample(base_id(row["id"], report), cluster.devices[cluster.index[row["device"]]].type, batch,
                           t, len(active[host]) > 1, host, gaps[row["device"]]))
    return out


# ------------------------------------------------------------------ fitting
def fit_contention(samples: list[_Sample]) -> dict[str, dict]:
    """Per host: ``{"contention": kappa, "nodes": pairs used}`` (module docstring, step 2), from the
    nodes' own times (not the dispatch gaps, which grow with the transfers a run sends); kappa is 1.0
    when no node was measured both alone and crowded on that host.

    >>> s = [_Sample("a", "cpu", 2, 1.0, False, "h"), _Sample("a", "cpu", 2, 1.5, True, "h", 9.0)]
    >>> fit_contention(s)
    {'h': {'contention': 1.5, 'nodes': 1}}
    """
    groups: dict[tuple, dict[bool, list[float]]] = {}
    for s in samples:
        groups.setdefault((s.host, s.node, s.dtype, s.batch), {True: [], False: []})[s.crowded].append(s.seconds)
    ratios: dict[str, list[float]] = {}
    for (host, *_), g in groups.items():
        ratios.setdefault(host, [])
        if g[True] and g[False] and statistics.median(g[False]) > 0:
            ratios[host].append(statistics.median(g[True]) / statistics.median(g[False]))
    return {h: {"contention": max(1.0, statistics.median(r)) if r else 1.0, "nodes": len(r)}
            for h, r in sorted(ratios.items())}


def fit_op_types(old: dict[str, float], new: dict[str, float], ops: dict[str, str]) -> dict[str, dict]:
    """Per op type (and ``"*"``, all nodes): the least-squares line ``new = overhead_s + scale * old``
    over the nodes measured, for the nodes that were not (module docstring, step 3).

    >>> fit_op_types({"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 5.0}, {"a": "mm", "b": "mm"})["mm"]
    {'overhead_s': 1.0, 'scale': 2.0, 'nodes': 2}
    """
    groups: dict[str, list[str]] = {"*": sorted(new)}
    for nid in sorted(new):
        groups.setdefault(ops.get(nid, "op"), []).append(nid)
    out = {}
    for op, ids in groups.items():
        xs, ys = [old[i] for i in ids], [new[i] for i in ids]
        if len(set(xs)) >= 2:
            a, b = fit_line(xs, ys)
        else:
            a, b = 0.0, (math.fsum(ys) / math.fsum(xs) if math.fsum(xs) > 0 else 1.0)
        out[op] = {"overhead_s": a, "scale": b, "nodes": len(ids)}
    return out


def calibrate(graph_doc: dict, cluster_doc: dict, reports: list[dict], *, labels: list[str] | None = None,
              clock: str = "wall") -> Calibration:
    """Fit node times, batch lines, links and contention from *reports* (module docstring).

    Parameters
    ----------
    graph_doc, cluster_doc : the graph the placements were made for and the cluster they ran on.
    reports : ``placer.run/v1`` documents with ``node_times`` (``placer run --node-times``).
    labels : names of the reports in messages (default ``report #i``).
    clock : ``wall`` (node wall times: what a step takes on this machine, load included) or ``cpu``
        (the thread's CPU time: what it would take without waiting for a core).

    Returns
    -------
    Calibration

    Raises
    ------
    InvalidInput
        No reports, a report without per-node times or made for another graph or cluster, a bad clock.
    """
    if clock not in CLOCKS:
        raise InvalidInput(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if not reports:
        raise InvalidInput("calibrate needs at least one placer run --node-times report")
    labels = list(labels or [])[:len(reports)]
    labels += [f"report #{i}" for i in range(len(labels), len(reports))]  # every report is checked, named or not
    graph = Graph.from_dict(graph_doc, "graph")
    cluster = Cluster.from_dict(cluster_doc, "cluster")
    for rep, lab in zip(reports, labels):
        check_report(rep, lab, graph, cluster)
    batch = graph.meta.get("batch_size")
    if not isinstance(batch, int):
        plain = {int(r["batch_size"]) for r in reports if not r.get("data_parallel")}
        if len(plain) != 1:
            raise InvalidInput("graph: meta.batch_size is missing; give a graph from placer profile")
        batch = plain.pop()
    dispatch = fit_dispatch(reports, clock)
    samples = [s for rep in reports for s in node_samples(rep, cluster, clock, dispatch["per_node_s"])]
    hosts = fit_contention(samples)
    kappa = {h: v["contention"] for h, v in hosts.items()}
    by_key: dict[tuple[str, str], dict[int, list[float]]] = {}
    for s in samples:
        t = (s.seconds / kappa[s.host] if s.crowded else s.seconds) + s.gap
        by_key.setdefault((s.node, s.dtype), {}).setdefault(s.batch, []).append(t)
    out_graph = copy.deepcopy(graph_doc)
    fitted, errors, lines, scaled = _write_nodes(out_graph, graph, by_key, batch)
    old = {v_id: graph.compute[v] for v, v_id in enumerate(graph.ids)}
    types = fit_op_types(old, fitted, {nid: graph.op[v] for v, nid in enumerate(graph.ids)})
    unmeasured = _fill_unmeasured(out_graph, fitted, types, {d.type for d in cluster.devices})
    links = fit_links(reports, cluster)
    collective = fit_collective(reports, cluster, links)
    out_cluster = _write_cluster(cluster_doc, cluster, reports, links, hosts,
                                 {**dispatch, "collective_step_s": collective["collective_step_s"]})
    summary = {"reports": labels, "clock": clock, "batch": batch, "nodes_fitted": len(fitted),
               "nodes_unmeasured": unmeasured, "batch_lines": lines, "scaled_linearly": scaled,
               "node_error": summarize(errors), "dispatch_s": _dispatch(reports, labels, clock),
               "dispatch": dispatch, "collective": collective,
               "hosts": hosts, "op_types": {k: v for k, v in types.items() if k == "*" or v["nodes"] >= 3},
               "links": {f"{a}->{b}": f for (a, b), f in links.items()}}
    out_graph.setdefault("meta", {})["calibrated"] = {k: summary[k] for k in ("reports", "clock", "batch",
                                                                              "nodes_fitted", "batch_lines",
                                                                              "op_types")}
    out_graph["meta"]["calibrated"]["node_error_median"] = summary["node_error"]["median"]
    Graph.from_dict(out_graph, "calibrated graph")
    Cluster.from_dict(out_cluster, "calibrated cluster")
    return Calibration(graph=out_graph, cluster=out_cluster, summary=summary)


def _write_nodes(doc: dict, graph: Graph, by_key: dict, batch: int):
    """Node times (and lines) at the graph's batch into *doc*; returns (fitted times by id, relative
    errors of the samples, nodes given a line, nodes scaled linearly)."""
    fitted: dict[str, float] = {}
    errors: list[float] = []
    n_lines = scaled = 0
    per_node: dict[str, dict[str, dict[int, list[float]]]] = {}
    for (nid, dtype), pts in by_key.items():
        per_node.setdefault(nid, {})[dtype] = pts
    for nd in doc["nodes"]:
        types = per_node.get(nd["id"])
        if not types:
            continue
        old_line = nd.get("batch_line") if isinstance(nd.get("batch_line"), dict) else {}
        line = {"batch": batch}
        for dtype, pts in sorted(types.items()):
            meds = {b: statistics.median(v) for b, v in pts.items()}
            for b, v in pts.items():
                errors.extend(abs(x - meds[b]) / meds[b] for x in v if meds[b] > 0)
            ab = None
            if len(meds) >= 2:
                a, b = fit_line([float(x) for x in meds], list(meds.values()))
                ab = [a, b]
            if batch in meds:
                t = meds[batch]
            elif ab is not None:
                t = max(0.0, ab[0] + ab[1] * batch)
            else:
                (b0, t0), = meds.items()
                old_ab = (old_line.get("compute_by_type") or {}).get(dtype) or old_line.get("compute_s")
                if isinstance(old_ab, list) and len(old_ab) == 2 and old_ab[0] + old_ab[1] * b0 > 0:
                    t = t0 * (old_ab[0] + old_ab[1] * batch) / (old_ab[0] + old_ab[1] * b0)
                else:
                    t = t0 * batch / b0
                    scaled += 1
            nd.setdefault("compute_by_type", {})[dtype] = t
            if len(types) == 1:
                nd["compute_s"] = t
            fitted.setdefault(nd["id"], t)
            if ab is not None:
                line.setdefault("compute_by_type", {})[dtype] = ab
                if len(types) == 1:
                    line["compute_s"] = ab
        if len(line) > 1:
            n_lines += 1
            keep = {k: v for k, v in old_line.items() if k not in ("batch", "compute_s", "compute_by_type")}
            by_old = {k: v for k, v in (old_line.get("compute_by_type") or {}).items() if k not in types}
            line.update(keep)
            if by_old:
                line["compute_by_type"] = {**by_old, **line.get("compute_by_type", {})}
            nd["batch_line"] = line
    return fitted, errors, n_lines, scaled


def _fill_unmeasured(doc: dict, fitted: dict, types: dict, dtypes: set[str]) -> int:
    n = 0
    for nd in doc["nodes"]:
        if nd["id"] in fitted:
            continue
        fit = types.get(nd.get("op", "op")) if types.get(nd.get("op", "op"), {}).get("nodes", 0) >= 3 else None
        fit = fit or types.get("*")
        if fit is None:
            continue
        for dtype in sorted(dtypes):
            old = (nd.get("compute_by_type") or {}).get(dtype, nd["compute_s"])
            nd.setdefault("compute_by_type", {})[dtype] = max(0.0, fit["overhead_s"] + fit["scale"] * old)
        n += 1
    return n


def _write_cluster(doc: dict, cluster: Cluster, reports: list[dict], links: dict, hosts: dict,
                   dispatch: dict | None = None) -> dict:
    """The calibrated cluster: the fitted pairs, and hosts with their contention, the transfer
    costs of *dispatch* (:func:`fit_dispatch`: ``send_s`` / ``recv_s``) and its ``collective_step_s``
    (:func:`fit_collective`)."""
    out = copy.deepcopy(doc)
    pairs = [p for p in (out["links"].get("pairs") or []) if (p["src"], p["dst"]) not in links]
    for (a, b), f in links.items():
        pairs.append({"src": a, "dst": b, "bandwidth_Bps": f["bandwidth_Bps"], "latency_s": f["latency_s"]})
    out["links"]["pairs"] = pairs
    costs = {}
    if dispatch and (any(dispatch.get("send_s") or ()) or any(dispatch.get("recv_s") or ())):
        costs = {"send_s": list(dispatch["send_s"]), "recv_s": list(dispatch["recv_s"])}
    if dispatch and dispatch.get("collective_step_s"):
        costs["collective_step_s"] = dispatch["collective_step_s"]
    members: dict[str, list[str]] = {}
    for rep in reports:
        for did, host in (rep["node_times"].get("hosts") or {}).items():
            if host is not None and did not in members.setdefault(host, []):
                members[host].append(did)
    for h in out.get("hosts") or []:        # hosts the cluster already had keep their other devices
        name = h.get("name")
        if name in members:
            members[name] = list(dict.fromkeys(list(h["devices"]) + members[name]))
    grouped = []
    for host, devs in sorted(members.items()):
        devs = sorted(devs, key=lambda d: cluster.index[d])
        if len(devs) >= 2 or costs:
            grouped.append({"name": host, "devices": devs, "contention": hosts.get(host, {}).get("contention", 1.0),
                            **costs})
    done = {d for h in grouped for d in h["devices"]}
    keep = [h for h in (out.get("hosts") or []) if not done & set(h["devices"])]
    if grouped or keep:
        out["hosts"] = keep + grouped
    out.setdefault("meta", {})["calibrated"] = {
        "links": {f"{a}->{b}": {k: f[k] for k in ("n", "how", "error")} for (a, b), f in links.items()},
        "hosts": hosts}
    return out


def _dispatch(reports: list[dict], labels: list[str], clock: str) -> dict[str, float]:
    """Median per-node dispatch gap of each report (over its devices)."""
    return {lab: statistics.median(dispatch_gaps(rep["node_times"], clock).values())
            for rep, lab in zip(reports, labels) if rep["node_times"]["nodes"]}
