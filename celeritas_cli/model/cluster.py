"""Devices and the directed links between them (``placer.cluster/v1``).

Transfer time of ``b`` bytes from device ``a`` to device ``c`` is
``latency_s + b / bandwidth_Bps`` of the directed link ``a->c`` (the linear
fit t = k·d + b of Celeritas 4.2.1 with k = 1/bandwidth); zero on the same
device.  A pair listed with ``via`` is multi-hop: bandwidth is the minimum
along the path, latencies add (Moirai III-C).  ``hosts`` (optional, written
by ``placer calibrate``) groups devices that share one machine's cores; a
host's ``contention`` multiplies the node times of its devices while two or
more of them run a placement's nodes
(:meth:`~celeritas_cli.model.costs.CostModel.placed_time`), and its
``send_s`` / ``recv_s`` lines ``[seconds, seconds per byte]`` are what a
transfer costs the sending and the receiving device's own time (a CPU
process copies and posts a tensor; the simulator keeps the device busy for
it, :mod:`celeritas_cli.sim.simulator` rule 3a); its ``collective_step_s``
is the fixed cost of one step of a ring collective on its devices (added
to the time of the derived graphs' ring-step nodes by the cost model).

A cluster of servers (a ``servers`` object instead of ``devices``, file size
O(servers + GPUs)) is the other form of the same schema: its devices are
generated and a pair's link is resolved from the two devices' servers
(:mod:`celeritas_cli.model.servers`); ``links.pairs`` may still name pairs,
and an explicit pair's figure wins over the servers' (stderr says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import InvalidInput
from .jsonio import check_depth, validate

CLUSTER_SCHEMA = "placer.cluster/v1"
GiB = 1024**3


@dataclass(frozen=True)
class Device:
    id: str
    type: str
    memory: int
    speed: float = 1.0


@dataclass
class Cluster:
    """Devices indexed ``0..k-1`` in file order plus dense link matrices.

    ``bandwidth[a][c]`` (bytes/s) and ``latency[a][c]`` (s) describe the
    directed link from device ``a`` to device ``c``; the diagonal is unused.
    """

    name: str
    devices: list[Device]
    bandwidth: list[list[float]]
    latency: list[list[float]]
    doc: dict = field(default_factory=dict, repr=False)
    index: dict[str, int] = field(default_factory=dict)
    #: the file the cluster was read from (None: bundled, built in code, or stdin)
    source: str | None = field(default=None, compare=False)
    #: per device, the factor its node times are multiplied by because it shares a host's cores with other
    #: devices (the ``hosts`` field; 1.0 for a device alone): :meth:`~celeritas_cli.model.costs.CostModel.node_row`
    contention: list[float] = field(default_factory=list)
    #: per device, the index of its host in ``hosts`` (-1: in none)
    host_of: list[int] = field(default_factory=list)
    #: per device, what sending a tensor of b bytes costs the device's own time: ``a + b * bytes``
    #: (``(a, b)``; the host's ``send_s``, zero by default), and what receiving one costs (``recv_s``)
    send_cost: list[tuple[float, float]] = field(default_factory=list)
    recv_cost: list[tuple[float, float]] = field(default_factory=list)
    #: per device, the fixed cost of one step of a ring collective on it (the host's ``collective_step_s``)
    collective_step: list[float] = field(default_factory=list)
    #: the parsed ``servers`` object of a cluster of servers (None: a pairwise cluster)
    servers: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.index:
            self.index = {d.id: i for i, d in enumerate(self.devices)}
        k = len(self.devices)
        if not self.contention:
            self.contention = [1.0] * k
        if not self.host_of:
            self.host_of = [-1] * k
        if not self.send_cost:
            self.send_cost = [(0.0, 0.0)] * k
        if not self.recv_cost:
            self.recv_cost = [(0.0, 0.0)] * k
        if not self.collective_step:
            self.collective_step = [0.0] * k

    @property
    def transfer_costs(self) -> bool:
        """Whether a transfer costs any device time of its own (some host's ``send_s`` / ``recv_s``)."""
        return any(a or b for a, b in self.send_cost) or any(a or b for a, b in self.recv_cost)

    @property
    def k(self) -> int:
        """Number of devices."""
        return len(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    def comm_time(self, nbytes: float, a: int, c: int) -> float:
        """Seconds to move *nbytes* from device *a* to device *c* (0 if equal)."""
        if a == c:
            return 0.0
        return self.latency[a][c] + nbytes / self.bandwidth[a][c]

    def over_capacity(self, loads: Sequence[int]) -> list[int]:
        """Indices of the devices whose memory *loads* (bytes, one per
        device) exceed their capacity: a placement fits when this is empty."""
        return [d for d, dv in enumerate(self.devices) if loads[d] > dv.memory]

    def min_memory(self) -> int:
        return min(d.memory for d in self.devices)

    def total_memory(self) -> int:
        return sum(d.memory for d in self.devices)

    def mean_bandwidth(self) -> float:
        """Mean bandwidth over ordered pairs of distinct devices."""
        vals = [self.bandwidth[a][c] for a, c in self._summary_pairs()]
        return sum(vals) / len(vals) if vals else math.inf

    def mean_latency(self) -> float:
        vals = [self.latency[a][c] for a, c in self._summary_pairs()]
        return sum(vals) / len(vals) if vals else 0.0

    def _summary_pairs(self) -> list[tuple[int, int]]:
        """The ordered pairs of distinct devices; of a cluster of servers without explicit
        pairs, those among the first two servers of each server type, which hold every
        distinct figure (servers of one type are alike) in O(GPUs per server²)."""
        k = self.k
        srv = self.servers
        if srv is None or (self.doc.get("links") or {}).get("pairs"):
            return [(a, c) for a in range(k) for c in range(k) if a != c]
        first: dict[str, list[int]] = {}
        for s, name in enumerate(srv.server_types):
            if len(first.setdefault(name, [])) < 2:
                first[name].append(s)
        keep = {s for servers in first.values() for s in servers}
        reps = [d for d in range(k) if srv.server_of[d] in keep]
        return [(a, c) for a in reps for c in reps if a != c]

    def pair_stats(self) -> tuple[float, float, float, float]:
        """Mean latency, mean ``1 / bandwidth``, the largest latency and the
        largest ``1 / bandwidth`` over ordered pairs of distinct devices (HEFT's
        c̄, :meth:`~celeritas_cli.model.costs.CostModel.mean_comm`).  Of a cluster
        of servers without explicit pairs, the rows of the first server of each
        server type, weighted by the number of servers of that type (every
        server of a type sees the same other devices): O(GPUs per server ×
        devices), not O(devices²).

        >>> uniform(3, bandwidth=4.0, latency=1.0).pair_stats()
        (1.0, 0.25, 1.0, 0.25)
        """
        k, srv = self.k, self.servers
        if srv is None or (self.doc.get("links") or {}).get("pairs"):
            rows = [(a, 1) for a in range(k)]
        else:
            servers_of: dict[str, int] = {}
            first: dict[str, int] = {}
            for s, name in enumerate(srv.server_types):
                servers_of[name] = servers_of.get(name, 0) + 1
                first.setdefault(name, s)
            lead = {s: servers_of[name] for name, s in first.items()}
            rows = [(a, lead[srv.server_of[a]]) for a in range(k) if srv.server_of[a] in lead]
        if k < 2:
            return 0.0, 0.0, 0.0, 0.0
        lat_sum = inv_sum = lat_max = inv_max = 0.0
        total = 0
        for a, w in rows:
            bw_row, lat_row = self.bandwidth[a], self.latency[a]
            lats = [lat_row[c] for c in range(k) if c != a]
            invs = [1.0 / bw_row[c] for c in range(k) if c != a]
            lat_sum += w * math.fsum(lats)
            inv_sum += w * math.fsum(invs)
            lat_max, inv_max = max(lat_max, *lats), max(inv_max, *invs)
            total += w * (k - 1)
        return lat_sum / total, inv_sum / total, lat_max, inv_max

    def summary(self) -> dict:
        """What the cluster is, for listings (``placer clusters``): device
        count per type, total memory, the range of link bandwidths and
        latencies over ordered pairs, and the file's description.

        Example
        -------
        >>> s = uniform(2, bandwidth=100.0, latency=0.0).summary()
        >>> s["devices"], s["types"], s["bandwidth_Bps"]
        (2, {'V100': 2}, [100.0, 100.0])
        """
        types: dict[str, int] = {}
        for d in self.devices:
            types[d.type] = types.get(d.type, 0) + 1
        pairs = self._summary_pairs()
        bws = [self.bandwidth[a][c] for a, c in pairs]
        lats = [self.latency[a][c] for a, c in pairs]
        meta = self.doc.get("meta") if isinstance(self.doc.get("meta"), dict) else {}
        return {"name": self.name, "devices": self.k, "types": types,
                "memory_bytes": self.total_memory(),
                "bandwidth_Bps": [min(bws), max(bws)] if bws else None,
                "latency_s": [min(lats), max(lats)] if lats else None,
                "description": str(meta.get("description") or meta.get("source") or "")}

    def digest(self) -> str:
        """A fingerprint of what the cluster is: the first 16 hex digits of
        the sha256 of the canonical JSON (sorted keys, no spaces) of its
        devices (id, type, memory_bytes, speed, in order) and its resolved
        links (bandwidth_Bps and latency_s of every ordered pair).  The name
        and ``meta`` are not part of it, so an edited copy that keeps a
        bundled cluster's name has another digest, and the same cluster
        written differently (default links or explicit pairs) the same one.

        >>> uniform(2).digest() == uniform(2, name="other").digest(), uniform(2).digest() == uniform(3).digest()
        (True, False)
        """
        import hashlib

        import orjson

        cached = self.__dict__.get("_digest")
        if cached is None and self.servers is not None:   # O(devices): the server form, not the pairs
            doc = {"devices": [[d.id, d.type, d.memory, d.speed] for d in self.devices],
                   "servers": self.doc["servers"], "pairs": (self.doc.get("links") or {}).get("pairs") or [],
                   "hosts": self.doc.get("hosts") or []}
            cached = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
            self.__dict__["_digest"] = cached
        if cached is None:  # clusters are not mutated after loading
            doc = {"devices": [[d.id, d.type, d.memory, d.speed] for d in self.devices],
                   "bandwidth_Bps": self.bandwidth, "latency_s": self.latency}
            if any(h >= 0 for h in self.host_of):   # calibrated hosts change what a step costs
                doc["hosts"] = [self.host_of, self.contention, self.send_cost, self.recv_cost, self.collective_step]
            cached = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
            self.__dict__["_digest"] = cached
        return cached

    def to_dict(self) -> dict:
        if self.doc:
            return self.doc
        return {
            "schema": CLUSTER_SCHEMA,
            "name": self.name,
            "devices": [{"id": d.id, "type": d.type, "memory_bytes": d.memory, "speed": d.speed}
                        for d in self.devices],
            "links": {
                "default": {"bandwidth_Bps": self.mean_bandwidth(), "latency_s": self.mean_latency()},
                "pairs": [{"src": self.devices[a].id, "dst": self.devices[c].id,
                           "bandwidth_Bps": self.bandwidth[a][c], "latency_s": self.latency[a][c]}
                          for a in range(self.k) for c in range(self.k) if a != c],
            },
        }

    @classmethod
    def from_dict(cls, doc: Any, label: str = "cluster") -> "Cluster":
        """Validate a ``placer.cluster/v1`` document and build the model.

        Raises
        ------
        InvalidInput
            Schema violation, duplicate device id, link to an unknown device,
            missing bandwidth, a number outside :mod:`~celeritas_cli.model.limits`.
        """
        validate(doc, CLUSTER_SCHEMA, label)
        check_depth(doc.get("meta"), label, "field meta")
        if "servers" in doc:
            return cls._from_servers(doc, label)
        devices: list[Device] = []
        index: dict[str, int] = {}
        for i, dd in enumerate(doc["devices"]):
            did = dd["id"]
            if did in index:
                raise InvalidInput(f"{label}: device '{did}' is defined twice")
            speed = float(dd.get("speed", 1.0))
            if not math.isfinite(speed):
                raise InvalidInput(f"{label}: device '{did}' field speed: must be finite")
            index[did] = i
            devices.append(Device(did, dd.get("type", "generic"), int(dd["memory_bytes"]), speed))
        k = len(devices)
        links = doc["links"]
        default = links["default"]
        if "bandwidth_Bps" not in default:
            raise InvalidInput(f"{label}: links.default: missing field bandwidth_Bps")
        dbw = float(default["bandwidth_Bps"])
        dlat = float(default.get("latency_s", 0.0))
        for val, fname in ((dbw, "bandwidth_Bps"), (dlat, "latency_s")):
            if not math.isfinite(val):
                raise InvalidInput(f"{label}: links.default field {fname}: must be finite")
        bw = [[dbw] * k for _ in range(k)]
        lat = [[dlat] * k for _ in range(k)]
        pairs = links.get("pairs") or []
        direct = [p for p in pairs if not p.get("via")]
        multi = [p for p in pairs if p.get("via")]
        for p in direct + multi:
            s, d = p["src"], p["dst"]
            for end, fname in ((s, "src"), (d, "dst")):
                if end not in index:
                    raise InvalidInput(f"{label}: link pair {s}->{d} field {fname}: unknown device '{end}'")
            if s == d:
                raise InvalidInput(f"{label}: link pair {s}->{d}: a link needs two different devices")
            a, c = index[s], index[d]
            if p.get("via"):
                hops = [s, *p["via"], d]
                for h in p["via"]:
                    if h not in index:
                        raise InvalidInput(f"{label}: link pair {s}->{d} field via: unknown device '{h}'")
                path_bw = math.inf
                path_lat = 0.0
                for x, y in zip(hops, hops[1:]):
                    xi, yi = index[x], index[y]
                    path_bw = min(path_bw, bw[xi][yi])
                    path_lat += lat[xi][yi]
                bw[a][c] = float(p.get("bandwidth_Bps", path_bw))
                lat[a][c] = float(p.get("latency_s", path_lat))
            else:
                if "bandwidth_Bps" not in p:
                    raise InvalidInput(f"{label}: link pair {s}->{d}: missing field bandwidth_Bps")
                bw[a][c] = float(p["bandwidth_Bps"])
                lat[a][c] = float(p.get("latency_s", dlat))
            if not (math.isfinite(bw[a][c]) and math.isfinite(lat[a][c])):
                raise InvalidInput(f"{label}: link pair {s}->{d}: bandwidth and latency must be finite")
        kappa, host_of, send, recv, coll = _hosts(doc.get("hosts") or [], index, label)
        return cls(name=doc.get("name", "cluster"), devices=devices, bandwidth=bw, latency=lat,
                   doc=doc, index=index, contention=kappa, host_of=host_of, send_cost=send, recv_cost=recv,
                   collective_step=coll)

    @classmethod
    def _from_servers(cls, doc: dict, label: str) -> "Cluster":
        """The cluster of a document with a ``servers`` object (:mod:`~celeritas_cli.model.servers`)."""
        import sys

        from .servers import Servers, build_links

        def warn(msg: str) -> None:
            print(msg, file=sys.stderr)

        if "devices" in doc:
            raise InvalidInput(f"{label}: give either devices (with links) or servers, not both")
        if (doc.get("links") or {}).get("default"):
            raise InvalidInput(f"{label}: links field default: a cluster of servers resolves every pair "
                               "from its servers; only links.pairs may override one")
        srv = Servers(doc["servers"], label)
        ids = srv.device_ids()
        devices = [Device(i, t["device_type"], t["memory"], t["speed"]) for i, t in zip(ids, srv.type_of)]
        index = {d: i for i, d in enumerate(ids)}
        bw, lat = build_links(srv, (doc.get("links") or {}).get("pairs") or [], index, label, warn)
        kappa, host_of, send, recv, coll = _hosts(doc.get("hosts") or [], index, label)
        return cls(name=doc.get("name", "cluster"), devices=devices, bandwidth=bw, latency=lat, doc=doc,
                   index=index, contention=kappa, host_of=host_of, send_cost=send, recv_cost=recv,
                   collective_step=coll, servers=srv)


def _hosts(hosts: list, index: dict[str, int], label: str) -> tuple[list[float], list[int], list, list, list]:
    """Per device, from a cluster's ``hosts``: the contention factor, the host's index, the
    ``send_s`` / ``recv_s`` lines and ``collective_step_s`` (a device in no host: 1.0, -1, zero costs).

    Raises
    ------
    InvalidInput
        A host naming an unknown device, or a device in two hosts.
    """
    k = len(index)
    kappa, host_of = [1.0] * k, [-1] * k
    send, recv, coll = [(0.0, 0.0)] * k, [(0.0, 0.0)] * k, [0.0] * k
    seen: dict[str, str] = {}
    for i, host in enumerate(hosts):
        name = host.get("name", f"#{i}")
        for did in host["devices"]:
            if did not in index:
                raise InvalidInput(f"{label}: host {name} field devices: unknown device '{did}'")
            if did in seen:
                raise InvalidInput(f"{label}: device '{did}' is in two hosts ({seen[did]} and {name})")
            seen[did] = name
            d = index[did]
            kappa[d], host_of[d] = float(host.get("contention", 1.0)), i
            send[d] = tuple(float(x) for x in host.get("send_s", (0.0, 0.0)))
            recv[d] = tuple(float(x) for x in host.get("recv_s", (0.0, 0.0)))
            coll[d] = float(host.get("collective_step_s", 0.0))
    return kappa, host_of, send, recv, coll


def uniform(k: int, *, memory: int = 32 * GiB, bandwidth: float = 1.0e10, latency: float = 1.0e-5,
            speeds: list[float] | None = None, dtype: str = "V100", name: str | None = None) -> Cluster:
    """A cluster of *k* devices on identical links (handy in tests).

    Example
    -------
    >>> c = uniform(2, bandwidth=100.0, latency=0.0)
    >>> c.comm_time(50, 0, 1)
    0.5
    """
    speeds = speeds or [1.0] * k
    doc = {
        "schema": CLUSTER_SCHEMA,
        "name": name or f"{k}x{dtype}",
        "devices": [{"id": f"gpu{i}", "type": dtype, "memory_bytes": int(memory), "speed": float(speeds[i])}
                    for i in range(k)],
        "links": {"default": {"bandwidth_Bps": float(bandwidth), "latency_s": float(latency)}},
    }
    return Cluster.from_dict(doc, label=doc["name"])
