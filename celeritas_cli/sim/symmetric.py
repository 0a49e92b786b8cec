"""The symmetric judge: one replica of each kind stands for the others.

A plan whose last recipe step is data parallelism over ``k`` replicas (plain
data parallelism, or ``k`` copies of a pipeline: the micro-batched graph
replicated, :mod:`~celeritas_cli.pipelining.builder`) or sharded data
parallelism (``fsdp``, :mod:`~celeritas_cli.transform.fsdp`: every replica
holds an equal shard, so only its samples tell it apart) runs ``k`` copies of
one program that meet only in their collectives.  When every copy runs on
devices and links alike (the *replica map* below) and the copies of one
*kind* (the same number of samples) do the same work, every copy of a kind
has the same schedule: each node starts and ends at the same instant in
every copy, by induction over the simulator's events (rule 1-5 see only the
copy's own devices and links, and rule 6 starts a collective when its last
member is ready, which is the same instant for every copy of a kind).  So
the simulator runs one copy of each kind with every collective costed for
the whole group (:func:`~celeritas_cli.sim.simulator.run_schedule`'s
``groups``), and the report is expanded to the other copies: the same
makespan, per-device memory peaks and per-link traffic as the full event
simulation, at the cost of ``kinds`` copies instead of ``k``
(tests/sim/test_symmetric.py checks the equality to 1e-9 against the full
simulation).

The replica map
---------------
A placement made this way holds the assignment and per-device orders of
replica 0's nodes only, and ``replicas.devices``: for every replica ``r``
the devices standing for replica 0's devices, in the order of
``replicas.devices[0]`` (``O(devices)``, not ``O(devices x nodes)``).  A
node ``X/rep<r>`` runs on ``devices[r][j]`` when ``X/rep0`` runs on
``devices[0][j]``, in the same place of that device's order.

Replicas are of one kind when they run the same number of samples on
devices of the same type, speed and memory joined by links of the same
bandwidth and latency (:func:`alike`: on a cluster of mixed GPUs each GPU
type's replicas are a kind).  A cluster with ``hosts`` (per-transfer device
costs, shared cores) is judged in full, and so is any plan under
``placer simulate --full-sim``: expanded (:func:`expand`) and simulated
event by event.

Not covered: lower bounds are computed on the judged copies (the critical
path is the full graph's; the total-work bound divides their work by every
device, so it is weaker than the full graph's); the Gantt chart and trace
show the judged copies.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.placement import Placement
from ..transform.admit import replica_kinds as kinds
from ..transform.derivation import STEPS, base_graph, check_step, derive, derive_last
from ..transform.fsdp import fsdp_kinds
from ..transform.recipe_check import Context as RecipeContext, check_recipe

#: the recipe steps a placement with ``replicas`` may end in
REPLICATED = ("data-parallel", "fsdp")

__all__ = ["ReplicaMap", "Judged", "replica_map", "kinds", "asymmetry", "judge", "expand", "expand_report"]


@dataclass(frozen=True)
class ReplicaMap:
    """``devices[r][j]``: the device index of replica ``r`` standing for replica 0's ``j``-th device."""

    devices: tuple[tuple[int, ...], ...]

    @property
    def k(self) -> int:
        return len(self.devices)

    def to_doc(self, cluster: Cluster) -> dict:
        return {"devices": [[cluster.ids[d] for d in row] for row in self.devices]}


def replica_map(doc: Any, cluster: Cluster, k: int, label: str) -> ReplicaMap:
    """The replica map of a placement's ``replicas`` field, checked: ``k``
    lists of the same length, of known and pairwise distinct devices."""
    rows = doc.get("devices") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or len(rows) != k:
        raise InvalidInput(f"{label}: field replicas.devices must list the devices of each of the {k} replicas")
    width = len(rows[0]) if isinstance(rows[0], list) else -1
    seen: set[int] = set()
    out = []
    for r, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width or width < 1:
            raise InvalidInput(f"{label}: field replicas.devices[{r}] must list {max(width, 1)} device ids, as "
                               f"replicas.devices[0] does")
        idx = []
        for did in row:
            d = cluster.index.get(did) if isinstance(did, str) else None
            if d is None:
                raise InvalidInput(f"{label}: field replicas.devices[{r}] names unknown device {did!r} (cluster "
                                   f"'{cluster.name}')")
            if d in seen:
                raise InvalidInput(f"{label}: field replicas.devices[{r}]: device '{did}' runs two replicas")
            seen.add(d)
            idx.append(d)
        out.append(tuple(idx))
    return ReplicaMap(tuple(out))


def asymmetry(cluster: Cluster, rmap: ReplicaMap, kind_of: list[int]) -> str | None:
    """Why one replica of each kind cannot stand for the others (None: it
    can).  Replicas on other devices or links are a kind of their own
    (:func:`alike`); what remains is a cluster whose ``hosts`` make a node's
    time depend on what the host's other devices run (shared cores,
    per-transfer costs): then every replica is simulated."""
    if any(h >= 0 for h in cluster.host_of):
        return f"cluster '{cluster.name}' has hosts (devices that share cores or pay per transfer)"
    return None


def _as_replica(nid: str, r: int, to: int) -> str | None:
    """The id of node *nid* of replica *r* in replica *to* (its last ``/rep<r>`` renamed), None without one."""
    suffix = f"/rep{r}"
    i = nid.rfind(suffix)
    return None if i < 0 else nid[:i] + f"/rep{to}" + nid[i + len(suffix):]


@dataclass
class Judged:
    """What :func:`judge` simulated: the graph of the judged copies, where
    they ran, the replica map and each replica's kind."""

    graph: Graph
    device_of: list[int]
    order: list[list[int]] | None
    groups: dict[str, list[int]]
    rmap: ReplicaMap
    kind_of: list[int]


class Prepared(tuple):
    """:func:`prepare`'s answer: ``(rmap, kind_of, last)``, and ``prefix``,
    the graph of the recipe's steps before ``last``."""

    prefix: Graph

    def __new__(cls, rmap: "ReplicaMap", kind_of: list[int], last: dict, prefix: Graph) -> "Prepared":
        out = super().__new__(cls, (rmap, kind_of, last))
        out.prefix = prefix
        return out


def prepare(graph: Graph, cluster: Cluster, placement: Placement, label: str) -> Prepared:
    """The replica map and kinds of a placement with ``replicas``, its last
    recipe step and the graph the steps before it give (``prefix``), which
    :func:`judge` continues from."""
    der = placement.derivation
    ctx = RecipeContext(label, cluster.k, cluster.name)
    checked = check_recipe(der, STEPS, ctx) if der is not None else []  # the fields first, in one line
    steps = der.get("steps") if isinstance(der, dict) else None
    if not steps or not isinstance(steps[-1], dict) or steps[-1].get("transform") not in REPLICATED:
        raise InvalidInput(f"{label}: field replicas: only a placement whose recipe ends in data parallelism or fsdp "
                           f"lists its replicas' devices")
    if placement.split_graph is not None:
        raise InvalidInput(f"{label}: a placement that lists its replicas' devices carries no split_graph")
    last = steps[-1]
    k = last.get("replicas")
    if not isinstance(k, int) or k < 1:
        raise InvalidInput(f"{label}: field derivation.steps[{len(steps) - 1}].replicas must be a positive integer")
    base = base_graph(graph, der, label)
    prefix = derive(base, {"steps": steps[:-1]}, label, devices=cluster.k, cluster=cluster.name) \
        if len(steps) > 1 else base
    check_step(prefix, len(steps) - 1, *checked[-1], ctx)  # the last step against its graph, as derive would
    rmap = replica_map(placement.replicas, cluster, k, label)
    try:
        kind_of = (fsdp_kinds if last["transform"] == "fsdp" else kinds)(prefix, last)
    except InvalidInput as exc:
        raise InvalidInput(f"{label}: derivation.steps[{len(steps) - 1}] ({last['transform']}): {exc}") from None
    return Prepared(rmap, alike(cluster, rmap, kind_of), last, prefix)


def alike(cluster: Cluster, rmap: ReplicaMap, kind_of: list[int]) -> list[int]:
    """*kind_of* (replicas of one number of samples) refined by the
    devices: two replicas are of one kind when they also run on devices of
    the same type, speed and memory, in the same order, joined by links of
    the same bandwidth and latency (on a cluster of mixed GPUs the replicas
    of each GPU type are a kind of their own)."""
    dv, bw, lat = cluster.devices, cluster.bandwidth, cluster.latency
    first: dict = {}
    out = []
    for r, rs in enumerate(kind_of):
        row = rmap.devices[r]
        key = (rs, tuple((dv[d].type, dv[d].speed, dv[d].memory) for d in row),
               tuple((bw[a][c], lat[a][c]) for a in row for c in row if a != c))
        out.append(first.setdefault(key, r))
    return out


def judge(graph: Graph, cluster: Cluster, placement: Placement, label: str = "placement",
          prepared: Prepared | None = None) -> Judged:
    """The judged copies of a placement with ``replicas`` (module docstring):
    their graph (the recipe with only one replica of each kind built), the
    devices and orders the replica map gives them, and every collective
    group's whole device list.  *prepared*: :func:`prepare`'s answer, when
    the caller already has it."""
    prepared = prepared or prepare(graph, cluster, placement, label)
    rmap, kind_of, _ = prepared
    reps = sorted(set(kind_of))
    reduced = derive_last(prepared.prefix, placement.derivation, label, devices=cluster.k, cluster=cluster.name,
                          represent=reps)  # the steps before the last are prepare's
    col = {d: j for j, d in enumerate(rmap.devices[0])}
    assign = placement.assignment
    device_of = [-1] * reduced.n
    rep0 = [""] * reduced.n
    for x in range(reduced.n):
        r = int((reduced.node_extra[x] or {}).get("replica", 0))
        nid = reduced.ids[x] if r == 0 else (_as_replica(reduced.ids[x], r, 0) or "")
        did = assign.get(nid)
        if did is None or did not in cluster.index:
            raise InvalidInput(f"{label}: node '{nid or reduced.ids[x]}' of replica 0 has no device in the assignment"
                               if did is None else f"{label}: node '{nid}' is assigned to unknown device '{did}'")
        j = col.get(cluster.index[did])
        if j is None:
            raise InvalidInput(f"{label}: node '{nid}' is on {did}, which is not one of replica 0's devices "
                               f"(replicas.devices[0])")
        device_of[x] = rmap.devices[r][j]
        rep0[x] = nid
    n0 = sum(1 for x in range(reduced.n) if int((reduced.node_extra[x] or {}).get("replica", 0)) == 0)
    if len(assign) != n0:
        extra = next((nid for nid in assign if nid not in set(rep0)), "?")
        raise InvalidInput(f"{label}: assignment names node '{extra}', which is not a node of replica 0")
    order = None
    if placement.order is not None:
        by_id: dict[str, dict[int, int]] = {}
        for x in range(reduced.n):
            by_id.setdefault(rep0[x], {})[int((reduced.node_extra[x] or {}).get("replica", 0))] = x
        order = [[] for _ in range(cluster.k)]
        for did, seq in placement.order.items():
            j = col.get(cluster.index.get(did, -1))
            if j is None:
                raise InvalidInput(f"{label}: order names device '{did}', which is not one of replica 0's devices")
            for r in reps:
                d = rmap.devices[r][j]
                for nid in seq:
                    x = by_id.get(nid, {}).get(r)
                    if x is None:
                        raise InvalidInput(f"{label}: order of {did} names node '{nid}', which is not a node of "
                                           f"replica 0")
                    if device_of[x] != d:
                        raise InvalidInput(f"{label}: order of {did} lists node '{nid}', which is assigned to "
                                           f"another device")
                    order[d].append(x)
        counts = [0] * cluster.k
        for x in range(reduced.n):
            counts[device_of[x]] += 1
        for d in range(cluster.k):
            if len(order[d]) != counts[d]:
                raise InvalidInput(f"{label}: the order of {cluster.ids[d]} does not list every node of replica 0 "
                                   f"assigned to it exactly once")
    members: dict[str, list[int]] = {}
    for x in range(reduced.n):
        c = (reduced.node_extra[x] or {}).get("collective")
        if isinstance(c, dict):
            members.setdefault(c.get("group"), []).append(x)
    groups: dict[str, list[int]] = {}
    ex = reduced.node_extra
    for name, xs in members.items():
        c = ex[xs[0]]["collective"]
        if rmap.k > 1 and len(xs) == c.get("ranks") and len({int(ex[x].get("replica", 0)) for x in xs}) == 1:
            groups[name] = sorted(device_of[x] for x in xs)  # a group inside one replica (tensor parallelism)
            continue
        # a group across the replicas: one rank per replica, on that replica's device for this rank's
        j = rmap.devices[int(ex[xs[0]].get("replica", 0))].index(device_of[xs[0]])
        groups[name] = [rmap.devices[r][j] for r in range(rmap.k)]
    # every simulation of this graph (auto's evaluations too) costs the collectives for the whole groups
    reduced.meta["collective_devices"] = groups
    return Judged(reduced, device_of, order, groups, rmap, kind_of)


def expand(graph: Graph | None, cluster: Cluster, placement: Placement, label: str = "placement") -> Placement:
    """The same plan with every replica's nodes listed (what the full event
    simulation, ``--full-sim``, and asymmetric plans get); *graph* is not
    needed (the replica map is the placement's)."""
    steps = (placement.derivation or {}).get("steps") or [{}]
    last = steps[-1] if isinstance(steps[-1], dict) else {}
    k = last.get("replicas")
    if last.get("transform") not in REPLICATED or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"{label}: field replicas: only a placement whose recipe ends in data parallelism or fsdp "
                           f"lists its replicas' devices")
    rmap = replica_map(placement.replicas, cluster, k, label)
    col = {d: j for j, d in enumerate(rmap.devices[0])}
    ids = cluster.ids
    assignment: dict[str, str] = {}
    for nid, did in placement.assignment.items():
        j = col.get(cluster.index.get(did, -1))
        if j is None:
            raise InvalidInput(f"{label}: node '{nid}' is on {did}, which is not one of replica 0's devices")
        for r in range(rmap.k):
            assignment[_rename(nid, r, label)] = ids[rmap.devices[r][j]]
    order = None
    if placement.order is not None:
        order = {}
        for did, seq in placement.order.items():
            j = col.get(cluster.index.get(did, -1))
            if j is None:
                raise InvalidInput(f"{label}: order names device '{did}', which is not one of replica 0's devices")
            for r in range(rmap.k):
                order[ids[rmap.devices[r][j]]] = [_rename(nid, r, label) for nid in seq]
    out = copy.copy(placement)
    out.assignment, out.order, out.replicas = assignment, order, None
    out.derived = None
    return out


def _rename(nid: str, r: int, label: str) -> str:
    out = _as_replica(nid, 0, r)
    if out is None:
        raise InvalidInput(f"{label}: node '{nid}' of replica 0 has no '/rep0' in its id")
    return out


def expand_report(report: dict, cluster: Cluster, judged: Judged) -> dict:
    """The report of the judged copies made the report of all replicas:
    every device of replica ``r`` gets the row of the device of its kind's
    judged copy (its own id, type and capacity; OOM against its capacity),
    every link of its copy the judged link's traffic, and the totals add
    up; ``judge`` says how it was judged."""
    rmap, kind_of = judged.rmap, judged.kind_of
    rows = {row["id"]: row for row in report["devices"]}
    timeline = report.get("memory_timeline") or {}
    ids = cluster.ids
    source = list(range(cluster.k))  # device -> the device whose figures it takes
    for r, rs in enumerate(kind_of):
        for a, b in zip(rmap.devices[rs], rmap.devices[r]):
            source[b] = a
    devices, oom = [], []
    for d, dv in enumerate(cluster.devices):
        row = dict(rows[ids[source[d]]])
        row.update({"id": dv.id, "type": dv.type, "capacity_bytes": dv.memory})
        row["oom"] = row["memory_bytes"] > dv.memory
        if row["oom"]:
            oom.append(dv.id)
        devices.append(row)
    report["devices"] = devices
    report["memory_timeline"] = {ids[d]: timeline.get(ids[source[d]], []) for d in range(cluster.k)}
    links = {(row["src"], row["dst"]): row for row in report["links"]}
    out_links = []
    count, nbytes = 0, 0
    for r, rs in enumerate(kind_of):
        m = dict(zip((ids[a] for a in rmap.devices[rs]), (ids[b] for b in rmap.devices[r])))
        for (s, t), row in links.items():
            if s in m and t in m:
                out_links.append({**row, "src": m[s], "dst": m[t]})
                count += row["transfers"]
                nbytes += row["bytes"]
    out_links.sort(key=lambda row: (cluster.index[row["src"]], cluster.index[row["dst"]]))
    report["links"] = out_links
    report["transfers"] = {"count": count, "bytes": nbytes}
    report["oom_devices"] = oom
    report["status"] = "OOM" if oom else "OK"
    report["judge"] = {"how": "symmetric", "replicas": rmap.k, "kinds": len(set(kind_of)),
                       "simulated_nodes": judged.graph.n,
                       "words": f"one replica of each of {len(set(kind_of))} kind(s) simulated for {rmap.k} "
                                f"replicas (placer simulate --full-sim simulates every replica)"}
    return report

