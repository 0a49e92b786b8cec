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

Tensor ranks
------------
Tensor parallelism (:mod:`~celeritas_cli.transform.tensor_parallel`,
``megatron``) splits every layer of a replica over ``tp`` ranks in equal
parts (the derivation refuses uneven splits), edges stay on their rank and
the ranks meet only in collectives: so the copies are ``(replica r, tensor
rank t)``, and the same induction holds for them.  A placement with
``replicas.tensor`` (``tensor[t][i]``: the device of tensor rank ``t`` of
replica 0 standing for rank 0's ``i``-th device, ``tensor[0]``; the rows
share out ``devices[0]``) lists tensor rank 0's nodes of replica 0 only; the
judge builds tensor rank 0 of one replica of each kind
(:func:`~celeritas_cli.transform.derivation.derive`'s ``tensor_ranks``),
costs every ``tp:`` collective over all ``tp`` devices of its group, and
expands the report to every copy.  Rank ``t``'s node is rank 0's with its
``/tp0`` token renamed ``/tp<t>``
(:func:`~celeritas_cli.transform.tensor_parallel.rename_rank`), so a
recompute step must list the same nodes on every rank (refused in one line
otherwise).  A rank on devices or links unlike its rank 0's (:func:`asymmetry`)
is simulated in full; without data parallelism ``devices`` has one row.
tests/sim/test_symmetric_tp.py checks the equality with the full simulation.

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
from ..transform.tensor_parallel import GROUP_PREFIX, TRANSFORM as TP_TRANSFORM, rank_ids, rename_rank
from ..transform.recipe_check import Context as RecipeContext, check_recipe

#: the recipe steps a placement with ``replicas`` may end in
REPLICATED = ("data-parallel", "fsdp")

__all__ = ["ReplicaMap", "Judged", "replica_map", "kinds", "asymmetry", "judge", "expand", "expand_report"]


@dataclass(frozen=True)
class ReplicaMap:
    """``devices[r][j]``: the device index of replica ``r`` standing for
    replica 0's ``j``-th device; ``tensor[t][i]`` (a plan whose tensor
    ranks are judged as kinds, else None): the device of tensor rank ``t``
    of replica 0 standing for rank 0's ``i``-th device (``tensor[0]``)."""

    devices: tuple[tuple[int, ...], ...]
    tensor: tuple[tuple[int, ...], ...] | None = None

    @property
    def k(self) -> int:
        return len(self.devices)

    @property
    def tp(self) -> int:
        return len(self.tensor) if self.tensor is not None else 1

    def to_doc(self, cluster: Cluster) -> dict:
        doc = {"devices": [[cluster.ids[d] for d in row] for row in self.devices]}
        if self.tensor is not None:
            doc["tensor"] = [[cluster.ids[d] for d in row] for row in self.tensor]
        return doc

    def copies(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """Every copy of the program ``(r, t, row)``: replica ``r``'s tensor
        rank ``t`` (0 without ``tensor``), ``row[i]`` its device standing
        for the ``i``-th device of copy ``(0, 0)`` (``tensor[0]``, or
        ``devices[0]``)."""
        if self.tensor is None:
            return [(r, 0, row) for r, row in enumerate(self.devices)]
        col = {d: j for j, d in enumerate(self.devices[0])}
        return [(r, t, tuple(row[col[d]] for d in trow)) for r, row in enumerate(self.devices)
                for t, trow in enumerate(self.tensor)]


def replica_map(doc: Any, cluster: Cluster, k: int, label: str, tp: int | None = None) -> ReplicaMap:
    """The replica map of a placement's ``replicas`` field, checked: ``k``
    lists of the same length, of known and pairwise distinct devices; with
    *tp* also ``tensor``: ``tp`` lists of the same length that share out
    ``devices[0]``."""
    rows = doc.get("devices") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or len(rows) != k:
        raise InvalidInput(f"{label}: field replicas.devices must list the devices of each of the {k} replicas")
    out = _rows(rows, cluster, label, "replicas.devices", "replicas")
    tensor = None
    if tp is not None:
        trows = doc.get("tensor")
        if not isinstance(trows, list) or len(trows) != tp:
            raise InvalidInput(f"{label}: field replicas.tensor must list the devices of each of the {tp} tensor ranks "
                               f"of replica 0")
        tensor = _rows(trows, cluster, label, "replicas.tensor", "tensor ranks")
        if sorted(d for row in tensor for d in row) != sorted(out[0]):
            raise InvalidInput(f"{label}: field replicas.tensor must share out the devices of replica 0 "
                               f"(replicas.devices[0]) among its tensor ranks")
    return ReplicaMap(out, tensor)


def _rows(rows: list, cluster: Cluster, label: str, field: str, what: str) -> tuple[tuple[int, ...], ...]:
    width = len(rows[0]) if isinstance(rows[0], list) else -1
    seen: set[int] = set()
    out = []
    for r, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width or width < 1:
            raise InvalidInput(f"{label}: field {field}[{r}] must list {max(width, 1)} device ids, as "
                               f"{field}[0] does")
        idx = []
        for did in row:
            d = cluster.index.get(did) if isinstance(did, str) else None
            if d is None:
                raise InvalidInput(f"{label}: field {field}[{r}] names unknown device {did!r} (cluster "
                                   f"'{cluster.name}')")
            if d in seen:
                raise InvalidInput(f"{label}: field {field}[{r}]: device '{did}' runs two {what}")
            seen.add(d)
            idx.append(d)
        out.append(tuple(idx))
    return tuple(out)


def asymmetry(cluster: Cluster, rmap: ReplicaMap, kind_of: list[int]) -> str | None:
    """Why one replica of each kind cannot stand for the others (None: it
    can).  Replicas on other devices or links are a kind of their own
    (:func:`alike`); what remains is a cluster whose ``hosts`` make a node's
    time depend on what the host's other devices run (shared cores,
    per-transfer costs): then every replica is simulated."""
    if any(h >= 0 for h in cluster.host_of):
        return f"cluster '{cluster.name}' has hosts (devices that share cores or pay per transfer)"
    if rmap is not None and rmap.tensor is not None:
        copies = rmap.copies()
        for r, t, row in copies:
            first = copies[r * rmap.tp][2]
            if t and _signature(cluster, row) != _signature(cluster, first):
                return (f"tensor rank {t} of replica {r} runs on devices or links unlike its rank 0's "
                        f"({cluster.ids[row[0]]} vs {cluster.ids[first[0]]})")
    return None


def _signature(cluster: Cluster, row: tuple[int, ...]) -> tuple:
    """What the simulator sees of the devices *row*: each one's type, speed
    and memory, in order, and the links between them."""
    dv, bw, lat = cluster.devices, cluster.bandwidth, cluster.latency
    return (tuple((dv[d].type, dv[d].speed, dv[d].memory) for d in row),
            tuple((bw[a][c], lat[a][c]) for a in row for c in row if a != c))


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

    def __new__(cls, rmap: ReplicaMap, kind_of: list[int], last: dict | None, prefix: Graph) -> "Prepared":
        out = super().__new__(cls, (rmap, kind_of, last))
        out.prefix = prefix
        return out


def prepare(graph: Graph, cluster: Cluster, placement: Placement, label: str) -> Prepared:
    """The replica map and kinds of a placement with ``replicas``, its last
    recipe step (None when the recipe ends in no replication: a plan whose
    only copies are its tensor ranks) and the graph the recipe's other
    steps give (tensor rank 0 alone when the tensor ranks are judged as
    kinds), which :func:`judge` continues from."""
    der = placement.derivation
    ctx = RecipeContext(label, cluster.k, cluster.name)
    checked = check_recipe(der, STEPS, ctx) if der is not None else []  # the fields first, in one line
    steps = [st for st, _ in checked]
    tensor = isinstance(placement.replicas, dict) and "tensor" in placement.replicas
    replicated = bool(steps) and steps[-1]["transform"] in REPLICATED
    if not replicated and not (tensor and steps):
        raise InvalidInput(f"{label}: field replicas: only a placement whose recipe ends in data parallelism or fsdp "
                           f"lists its replicas' devices")
    if placement.split_graph is not None:
        raise InvalidInput(f"{label}: a placement that lists its replicas' devices carries no split_graph")
    last = steps[-1] if replicated else None
    k = last["replicas"] if last is not None else 1
    tp = _tensor_ranks(steps, label) if tensor else None
    rmap = replica_map(placement.replicas, cluster, k, label, tp)
    base = base_graph(graph, der, label)
    head = steps[:-1] if replicated else steps
    prefix = derive(base, {"steps": head}, label, devices=cluster.k, cluster=cluster.name,
                    tensor_ranks=[0] if tensor else None) if head else base
    if last is None:
        return Prepared(rmap, [0], None, prefix)
    check_step(prefix, len(steps) - 1, *checked[-1], ctx)  # the last step against its graph, as derive would
    try:
        kind_of = (fsdp_kinds if last["transform"] == "fsdp" else kinds)(prefix, last)
    except InvalidInput as exc:
        raise InvalidInput(f"{label}: derivation.steps[{len(steps) - 1}] ({last['transform']}): {exc}") from None
    return Prepared(rmap, alike(cluster, rmap, kind_of), last, prefix)


def _tensor_ranks(steps: list[dict], label: str) -> int:
    """``tp`` of a recipe's tensor-parallel step, whose ranks a placement
    with ``replicas.tensor`` lists by rank 0's nodes: so every later
    recompute step must list the same nodes on every rank
    (:func:`~celeritas_cli.transform.tensor_parallel.rank_ids`), else the
    other ranks' nodes have no name in it (refused in one line)."""
    i = next((i for i, st in enumerate(steps) if st["transform"] == TP_TRANSFORM), None)
    if i is None:
        raise InvalidInput(f"{label}: field replicas.tensor: the recipe has no tensor-parallel step")
    tp = steps[i]["tp"]
    for j, st in enumerate(steps[i + 1:], start=i + 1):
        if st["transform"] == "recompute":
            why = rank_ids(st["nodes"], tp, [0])[1]
            if why:
                raise InvalidInput(f"{label}: field derivation.steps[{j}].nodes: {why}, but replicas.tensor lists "
                                   f"tensor rank 0's nodes for every rank")
    return tp


def alike(cluster: Cluster, rmap: ReplicaMap, kind_of: list[int]) -> list[int]:
    """*kind_of* (replicas of one number of samples) refined by the
    devices: two replicas are of one kind when they also run on devices of
    the same type, speed and memory, in the same order, joined by links of
    the same bandwidth and latency (on a cluster of mixed GPUs the replicas
    of each GPU type are a kind of their own)."""
    first: dict = {}
    out = []
    for r, rs in enumerate(kind_of):
        out.append(first.setdefault((rs, _signature(cluster, rmap.devices[r])), r))
    return out


def judge(graph: Graph, cluster: Cluster, placement: Placement, label: str = "placement",
          prepared: Prepared | None = None) -> Judged:
    """The judged copies of a placement with ``replicas`` (module docstring):
    their graph (the recipe with only one replica of each kind built), the
    devices and orders the replica map gives them, and every collective
    group's whole device list.  *prepared*: :func:`prepare`'s answer, when
    the caller already has it."""
    prepared = prepared or prepare(graph, cluster, placement, label)
    (rmap, kind_of, last), prefix = prepared, prepared.prefix
    reps = sorted(set(kind_of))
    reduced = prefix if last is None else derive_last(prefix, placement.derivation, label, devices=cluster.k,
                                                       cluster=cluster.name, represent=reps)
    # the devices of copy (0, 0) the placement lists: replica 0's, or its tensor rank 0's
    home = set(rmap.tensor[0]) if rmap.tensor is not None else set(rmap.devices[0])
    col = {d: j for j, d in enumerate(rmap.devices[0]) if d in home}
    where = "replica 0's devices (replicas.devices[0])" if rmap.tensor is None else \
        "tensor rank 0's devices of replica 0 (replicas.tensor[0])"
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
            raise InvalidInput(f"{label}: node '{nid}' is on {did}, which is not one of {where}")
        device_of[x] = rmap.devices[r][j]
        rep0[x] = nid
    n0 = sum(1 for x in range(reduced.n) if int((reduced.node_extra[x] or {}).get("replica", 0)) == 0)
    if len(assign) != n0:
        known = set(rep0)
        extra = next((nid for nid in assign if nid not in known), "?")
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
                raise InvalidInput(f"{label}: order names device '{did}', which is not one of {where}")
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
    ranks_of = _rank_devices(rmap)
    for name, xs in members.items():
        c = ex[xs[0]]["collective"]
        if ranks_of is not None and isinstance(name, str) and name.startswith(GROUP_PREFIX):
            # a tensor-parallel group: rank 0 built, the group all the ranks of its replica
            r = int(ex[xs[0]].get("replica", 0))
            groups[name] = sorted(rmap.devices[r][j] for j in ranks_of[rmap.devices[r].index(device_of[xs[0]])])
            continue
        if rmap.k > 1 and len(xs) == c.get("ranks") and len({int(ex[x].get("replica", 0)) for x in xs}) == 1:
            groups[name] = sorted(device_of[x] for x in xs)  # a group inside one replica (tensor parallelism)
            continue
        # a group across the replicas: one rank per replica, on that replica's device for this rank's
        j = rmap.devices[int(ex[xs[0]].get("replica", 0))].index(device_of[xs[0]])
        groups[name] = [rmap.devices[r][j] for r in range(rmap.k)]
    # every simulation of this graph (auto's evaluations too) costs the collectives for the whole groups
    reduced.meta["collective_devices"] = groups
    return Judged(reduced, device_of, order, groups, rmap, kind_of)


def _rank_devices(rmap: ReplicaMap) -> dict[int, list[int]] | None:
    """Column ``j`` of ``devices[0]`` (a device of tensor rank 0) -> the
    columns of its tensor group (the device of every rank standing for
    it); None without ``tensor``."""
    if rmap.tensor is None:
        return None
    col = {d: j for j, d in enumerate(rmap.devices[0])}
    return {col[d]: [col[row[i]] for row in rmap.tensor] for i, d in enumerate(rmap.tensor[0])}


def expand(graph: Graph | None, cluster: Cluster, placement: Placement, label: str = "placement",
           ranks_only: bool = False) -> Placement:
    """The same plan with every replica's nodes listed (what the full event
    simulation, ``--full-sim``, and asymmetric plans get); *graph* is not
    needed (the replica map is the placement's).  With ``tensor``, tensor
    rank 0's nodes are first listed for every rank (``/tp0`` renamed
    ``/tp<t>``, :func:`~celeritas_cli.transform.tensor_parallel.rename_rank`)
    on the rank's devices, then for every replica.  *ranks_only*: every
    tensor rank of replica 0 listed, the replicas left in the symmetric form
    (``replicas.devices`` without ``tensor``; what ``placer run`` and
    ``placer export`` of tensor-parallel plans read)."""
    steps = (placement.derivation or {}).get("steps") or [{}]
    steps = [st if isinstance(st, dict) else {} for st in steps]
    last = steps[-1]
    tensor = isinstance(placement.replicas, dict) and "tensor" in placement.replicas
    replicated = last.get("transform") in REPLICATED
    k = last.get("replicas") if replicated else 1
    if not (replicated or tensor) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"{label}: field replicas: only a placement whose recipe ends in data parallelism or fsdp "
                           f"lists its replicas' devices")
    tp = None
    if tensor:
        tp = next((st.get("tp") for st in steps if st.get("transform") == TP_TRANSFORM), None)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise InvalidInput(f"{label}: field replicas.tensor: the recipe has no tensor-parallel step")
    rmap = replica_map(placement.replicas, cluster, k, label, tp)
    col = {d: j for j, d in enumerate(rmap.devices[0])}
    # a device of copy (0, 0) -> the column of devices[0] standing for it on every tensor rank
    if rmap.tensor is None:
        ranks = {d: [j] for d, j in col.items()}
    else:
        ranks = {d: [col[row[i]] for row in rmap.tensor] for i, d in enumerate(rmap.tensor[0])}
    home = "tensor rank 0" if tensor else "replica 0"
    ids = cluster.ids

    reps = 1 if ranks_only else rmap.k

    def copies(nid: str, t: int) -> list[str]:  # the ids of rank t's node in every replica
        name = nid if rmap.tensor is None else _rank_renamed(nid, t, label)
        return [_rename(name, r, label) for r in range(reps)] if replicated and not ranks_only else [name]

    assignment: dict[str, str] = {}
    for nid, did in placement.assignment.items():
        cols = ranks.get(cluster.index.get(did, -1))
        if cols is None:
            raise InvalidInput(f"{label}: node '{nid}' is on {did}, which is not one of {home}'s devices")
        for t, j in enumerate(cols):
            for r, name in enumerate(copies(nid, t)):
                assignment[name] = ids[rmap.devices[r][j]]
    order = None
    if placement.order is not None:
        order = {}
        for did, seq in placement.order.items():
            cols = ranks.get(cluster.index.get(did, -1))
            if cols is None:
                raise InvalidInput(f"{label}: order names device '{did}', which is not one of {home}'s devices")
            for t, j in enumerate(cols):
                named = [copies(nid, t) for nid in seq]
                for r in range(reps):
                    order[ids[rmap.devices[r][j]]] = [names[r] for names in named]
    out = copy.copy(placement)
    out.assignment, out.order, out.replicas = assignment, order, None
    if ranks_only and replicated:
        out.replicas = {key: val for key, val in placement.replicas.items() if key != "tensor"}
    out.derived = None
    return out


def _rank_renamed(nid: str, t: int, label: str) -> str:
    out = rename_rank(nid, t)
    if out is None:
        raise InvalidInput(f"{label}: node '{nid}' of tensor rank 0 has no '/tp0' in its id")
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
    copies = rmap.copies()
    for r, _t, row in copies:  # every copy takes the figures of its replica kind's judged rank 0
        for a, b in zip(copies[kind_of[r] * rmap.tp][2], row):
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
    for r, _t, row in copies:
        m = dict(zip((ids[a] for a in copies[kind_of[r] * rmap.tp][2]), (ids[b] for b in row)))
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
    if rmap.tensor is not None:
        report["judge"]["tensor_ranks"] = rmap.tp
        report["judge"]["words"] = (f"tensor rank 0 of one replica of each of {len(set(kind_of))} kind(s) simulated "
                                    f"for {rmap.tp} tensor ranks x {rmap.k} replicas (placer simulate --full-sim "
                                    f"simulates every rank of every replica)")
    return report

