"""Clusters of servers: the ``servers`` form of ``placer.cluster/v1``.

A pairwise cluster file lists every ordered device pair, O(devices²); a
cluster of servers describes each server type once and how many servers of
each type there are, O(servers + GPUs).  Its ``servers`` object holds

``gpus``
    GPU types (``type``: the device type graphs' ``compute_by_type`` name,
    ``memory_bytes``, ``speed``); the presets of :data:`GPUS` need no entry.
``types``
    Server types: ``gpu`` (a GPU type), ``gpus`` (GPUs per server), ``fabric``
    (inside a server: ``kind`` nvswitch / nvlink / pcie, ``bandwidth_Bps`` per
    direction, ``latency_s``) and ``nics`` (between servers: ``count`` per
    server, ``bandwidth_Bps`` per direction of one NIC, ``latency_s``,
    ``rails``).
``groups``
    ``[{"type": T, "count": n}, ...]``: the servers, in order; device ``j`` of
    server ``s`` (counted over all groups) is ``s{s}gpu{j}``.
``network``
    ``{"topology": "fat-tree", "oversubscription": 1.0}`` (the default: a
    non-blocking fat tree).

A pair's link (:func:`pair_link`) follows NCCL's rail-optimised transport
(GPUDirect RDMA, PXN): inside a server, the fabric's figures; between
servers, every GPU pair gets **one NIC's** bandwidth divided by the fat
tree's oversubscription (the worst case, every flow crossing the spine), and
the NIC's latency; a pair on different rails (GPU ``i`` uses NIC
``i * nics // gpus``, on rail ``nic % rails``) is first moved over the
destination server's fabric to the GPU on the sender's rail, so the
destination fabric's latency is added (as the bundled
``2x8xA100-infiniband`` routes it with ``via``).  Not modelled: GPUs that share
one NIC (fewer NICs than GPUs) do not slow one another here.

The matrices ``Cluster.bandwidth`` / ``latency`` of a server cluster are plain
lists up to :data:`DENSE_MAX` devices (the simulator's hot path indexes
them) and :class:`PairMatrix` objects above it, O(devices) memory.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import InvalidInput
from .limits import BANDWIDTH_MAX, BANDWIDTH_MIN, DEVICES_MAX, TIME_MAX

GiB = 1024**3
#: Largest server cluster whose pair matrices are built as plain lists (16 servers of 8 GPUs).
DENSE_MAX = 128

#: GPU presets: device type, memory, speed (FP32 peak relative to the 14.0 TFLOPS V100 PCIe of
#: the profile device table, as the bundled clusters' ``speed``).
GPUS: dict[str, dict] = {
    "A100-80GB": {"type": "A100", "memory_bytes": 80 * GiB, "speed": 1.3929,
                  "source": "NVIDIA A100 datasheet: A100 SXM4 80GB HBM2e, 19.5 TFLOPS FP32"},
    "A100-40GB": {"type": "A100", "memory_bytes": 40 * GiB, "speed": 1.3929,
                  "source": "NVIDIA A100 datasheet: A100 SXM4 40GB HBM2, 19.5 TFLOPS FP32"},
    "H100-80GB": {"type": "H100", "memory_bytes": 80 * GiB, "speed": 4.7857,
                  "source": "NVIDIA H100 datasheet: H100 SXM5 80GB HBM3, 67 TFLOPS FP32"},
    "V100-32GB": {"type": "V100", "memory_bytes": 32 * GiB, "speed": 1.0,
                  "source": "NVIDIA V100 datasheet: V100 32GB HBM2 (the speed-1.0 reference device)"},
}

#: Fabric presets (inside a server), bandwidth per direction.
FABRICS: dict[str, dict] = {
    "nvswitch-a100": {"kind": "nvswitch", "bandwidth_Bps": 3.0e11, "latency_s": 3e-6,
                      "source": "NVIDIA DGX A100 datasheet: NVLink 3 through 6 NVSwitches, 600 GB/s bidirectional "
                                "per GPU -> 300 GB/s per direction; 3 us is a typical peer-to-peer latency, "
                                "not a datasheet figure"},
    "nvswitch-h100": {"kind": "nvswitch", "bandwidth_Bps": 4.5e11, "latency_s": 3e-6,
                      "source": "NVIDIA DGX H100 datasheet: NVLink 4 through 4 NVSwitches, 900 GB/s bidirectional "
                                "per GPU -> 450 GB/s per direction; 3 us typical, not a datasheet figure"},
    "pcie-gen4": {"kind": "pcie", "bandwidth_Bps": 2.5e10, "latency_s": 1e-5,
                  "source": "PCI Express 4.0 base specification: x16 = 31.5 GB/s per direction; 25 GB/s is about "
                            "80% of it (measured peer copies), 10 us a typical cudaMemcpy latency"},
}
#: ``--intra nvswitch``: the NVSwitch generation of the GPU's device type.
NVSWITCH_OF = {"A100": "nvswitch-a100", "H100": "nvswitch-h100"}

#: NIC presets (between servers), bandwidth per direction of one NIC.
NICS: dict[str, dict] = {
    "ib-hdr-200": {"bandwidth_Bps": 2.5e10, "latency_s": 5e-6,
                   "source": "NVIDIA ConnectX-6 / DGX A100 datasheet: HDR InfiniBand 200 Gb/s per port = 25 GB/s "
                             "per direction; 5 us with GPUDirect RDMA is typical, not a datasheet figure"},
    "ib-ndr-400": {"bandwidth_Bps": 5.0e10, "latency_s": 5e-6,
                   "source": "NVIDIA ConnectX-7 / DGX H100 datasheet: NDR InfiniBand 400 Gb/s per port = 50 GB/s "
                             "per direction; 5 us typical, not a datasheet figure"},
}


class PairMatrix:
    """A read-only ``k x k`` matrix whose entry ``[a][c]`` is computed on demand
    by ``fn(a, c)`` (O(k) memory): what ``Cluster.bandwidth`` / ``latency`` are
    for a large cluster of servers.

    >>> m = PairMatrix(lambda a, c: 10 * a + c, 3)
    >>> m[2][1], len(m), list(m[0])
    (21, 3, [0, 1, 2])
    """

    __slots__ = ("_rows",)

    def __init__(self, fn: Callable[[int, int], float], k: int) -> None:
        self._rows = [_Row(fn, a, k) for a in range(k)]

    def __getitem__(self, a: int) -> "_Row":
        return self._rows[a]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (PairMatrix, list)) and len(other) == len(self) and \
            all(list(r) == list(o) for r, o in zip(self, other))


class _Row:
    __slots__ = ("_fn", "_a", "_k")

    def __init__(self, fn: Callable[[int, int], float], a: int, k: int) -> None:
        self._fn, self._a, self._k = fn, a, k

    def __getitem__(self, c: int) -> float:
        if c < 0:
            c += self._k
        if not 0 <= c < self._k:
            raise IndexError(c)
        return self._fn(self._a, c)

    def __len__(self) -> int:
        return self._k

    def __iter__(self):
        return (self._fn(self._a, c) for c in range(self._k))


def _fail(label: str, where: str, what: str) -> InvalidInput:
    return InvalidInput(f"{label}: {where}: {what}")


def _number(obj: dict, key: str, label: str, where: str, lo: float, hi: float, *, strict: bool = False,
            default: float | None = None) -> float:
    """``obj[key]`` as a finite float in ``lo..hi`` (``strict``: above ``lo``), else a one-line error."""
    if key not in obj:
        if default is None:
            raise _fail(label, where, f"missing field {key}")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(label, f"{where} field {key}", f"must be a number, not {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < lo or (strict and v == lo) or v > hi:
        bound = f"above {lo:g}" if strict else f"at least {lo:g}"
        raise _fail(label, f"{where} field {key}", f"{v!r} is out of range (must be {bound} and at most {hi:g})")
    return v


def _count(obj: dict, key: str, label: str, where: str, hi: int) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(label, f"{where} field {key}", f"must be a whole number, not {v!r}")
    if not 1 <= v <= hi:
        raise _fail(label, f"{where} field {key}", f"{v} is out of range (1 to {hi:,})")
    return v


class Servers:
    """The parsed ``servers`` object: per device its server, its index in the
    server and its server type; :meth:`pair_link` resolves a pair.

    Raises
    ------
    InvalidInput
        One line naming the field: an unknown server or GPU type, a count
        below 1, a bandwidth / latency that is not a positive finite number in
        :mod:`~celeritas_cli.model.limits`, more rails than NICs, an
        oversubscription below 1, more devices than ``DEVICES_MAX`` (checked
        from the counts, before anything is built).
    """

    def __init__(self, spec: dict, label: str) -> None:
        gpus = {**GPUS, **(spec.get("gpus") or {})}
        types: dict[str, dict] = spec["types"]
        groups: list[dict] = spec["groups"]
        net = spec.get("network") or {}
        self.oversubscription = _number(net, "oversubscription", label, "servers.network", 1.0, 1e6, default=1.0)
        total = 0
        for n, grp in enumerate(groups):   # the size guard first: counts only, nothing built
            where = f"servers.groups[{n}]"
            if grp.get("type") not in types:
                raise _fail(label, f"{where} field type", f"unknown server type {grp.get('type')!r} "
                                                          f"(defined in servers.types: {', '.join(types)})")
            count = _count(grp, "count", label, where, 10**18)
            per = types[grp["type"]].get("gpus")
            if isinstance(per, int) and not isinstance(per, bool) and per >= 1:
                total += count * per
        if total > DEVICES_MAX:
            raise _fail(label, "servers.groups", f"{total:,} GPUs in all, over the limit of {DEVICES_MAX} devices "
                                                 "of one cluster")
        self.types: dict[str, dict] = {}
        for name, t in types.items():
            where = f"servers.types.{name}"
            gpu = t.get("gpu")
            if gpu not in gpus:
                raise _fail(label, f"{where} field gpu", f"unknown GPU type {gpu!r} (known: {', '.join(gpus)})")
            g = gpus[gpu]
            per = _count(t, "gpus", label, where, DEVICES_MAX)
            fab = t.get("fabric") or {}
            nics = t.get("nics")
            r = {"gpu": gpu, "device_type": str(g.get("type", gpu)), "gpus": per,
                 "memory": int(_number(g, "memory_bytes", label, f"servers.gpus.{gpu}", 0, 2**53 - 1)),
                 "speed": _number(g, "speed", label, f"servers.gpus.{gpu}", 1e-6, 1e6, default=1.0),
                 "fabric_bw": _number(fab, "bandwidth_Bps", label, f"{where}.fabric", BANDWIDTH_MIN, BANDWIDTH_MAX),
                 "fabric_lat": _number(fab, "latency_s", label, f"{where}.fabric", 0.0, TIME_MAX, strict=True),
                 "nics": 0}
            if nics is not None:
                w = f"{where}.nics"
                r["nics"] = _count(nics, "count", label, w, DEVICES_MAX)
                r["nic_bw"] = _number(nics, "bandwidth_Bps", label, w, BANDWIDTH_MIN, BANDWIDTH_MAX)
                r["nic_lat"] = _number(nics, "latency_s", label, w, 0.0, TIME_MAX, strict=True)
                rails = nics.get("rails", 1)
                r["rails"] = _count(nics, "rails", label, w, DEVICES_MAX) if "rails" in nics else rails
                if r["rails"] > r["nics"]:
                    raise _fail(label, f"{w} field rails", f"{r['rails']} rails but {r['nics']} NICs per server "
                                                           "(a rail needs a NIC of every server)")
            self.types[name] = r
        servers = [grp["type"] for grp in groups for _ in range(grp["count"])]
        if len(servers) > 1:
            for name in dict.fromkeys(servers):
                if not self.types[name]["nics"]:
                    raise _fail(label, f"servers.types.{name}", "missing field nics (needed between servers)")
        self.server_types = servers
        self.server_of: list[int] = []
        self.local: list[int] = []
        self.rail: list[int] = []
        self.type_of: list[dict] = []
        for s, name in enumerate(servers):
            t = self.types[name]
            for j in range(t["gpus"]):
                self.server_of.append(s)
                self.local.append(j)
                self.type_of.append(t)
                self.rail.append((j * t["nics"] // t["gpus"]) % t["rails"] if t["nics"] else 0)

    def device_ids(self) -> list[str]:
        return [f"s{s}gpu{j}" for s, j in zip(self.server_of, self.local)]

    def pair_link(self, a: int, c: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of the directed link from device *a* to
        device *c* (the module docstring's rule; the fabric's when equal: the diagonal is unused).

        >>> s = Servers({"types": {"T": {"gpu": "A100-80GB", "gpus": 2,
        ...     "fabric": {"bandwidth_Bps": 100.0, "latency_s": 1.0},
        ...     "nics": {"count": 2, "bandwidth_Bps": 10.0, "latency_s": 2.0, "rails": 2}}},
        ...     "groups": [{"type": "T", "count": 2}], "network": {"oversubscription": 2.0}}, "c")
        >>> s.pair_link(0, 1), s.pair_link(0, 2), s.pair_link(0, 3)
        ((100.0, 1.0), (5.0, 2.0), (5.0, 3.0))
        """
        ta, tc = self.type_of[a], self.type_of[c]
        if self.server_of[a] == self.server_of[c]:
            return ta["fabric_bw"], ta["fabric_lat"]
        bw = min(ta["nic_bw"], tc["nic_bw"]) / self.oversubscription
        lat = max(ta["nic_lat"], tc["nic_lat"])
        if self.rail[a] != self.rail[c]:   # PXN: over the destination's fabric to the GPU on the sender's rail
            bw, lat = min(bw, tc["fabric_bw"]), lat + tc["fabric_lat"]
        return bw, lat

    def describe(self) -> dict:
        """What the servers are, for ``placer clusters NAME``."""
        counts: dict[str, int] = {}
        for name in self.server_types:
            counts[name] = counts.get(name, 0) + 1
        return {"servers": counts, "gpus": len(self.server_of), "oversubscription": self.oversubscription,
                "types": {n: {k: v for k, v in t.items()} for n, t in self.types.items() if n in counts}}


def build_links(servers: Servers, pairs: list, index: dict[str, int], label: str, warn: Callable[[str], None]
                ) -> tuple[Any, Any]:
    """The bandwidth and latency matrices of a server cluster: plain lists up
    to :data:`DENSE_MAX` devices, :class:`PairMatrix` above; an explicit
    ``links.pairs`` entry overrides the servers' figure of its pair (*warn*
    says so when they differ).

    Raises
    ------
    InvalidInput
        A pair naming an unknown device, the same device twice, or ``via``.
    """
    k = len(servers.server_of)
    over: dict[tuple[int, int], tuple[float, float]] = {}
    for n, p in enumerate(pairs):
        s, d = p["src"], p["dst"]
        for end, fname in ((s, "src"), (d, "dst")):
            if end not in index:
                raise _fail(label, f"link pair {s}->{d} field {fname}", f"unknown device '{end}'")
        if s == d:
            raise _fail(label, f"link pair {s}->{d}", "a link needs two different devices")
        if p.get("via"):
            raise _fail(label, f"link pair {s}->{d} field via", "a cluster of servers routes pairs itself; "
                                                                "give the pair's figures instead")
        a, c = index[s], index[d]
        bw0, lat0 = servers.pair_link(a, c)
        bw = _number(p, "bandwidth_Bps", label, f"link pair {s}->{d}", BANDWIDTH_MIN, BANDWIDTH_MAX, default=bw0)
        lat = _number(p, "latency_s", label, f"link pair {s}->{d}", 0.0, TIME_MAX, default=lat0)
        if (bw, lat) != (bw0, lat0):
            warn(f"{label}: link pair {s}->{d}: the explicit pair ({bw:g} B/s, {lat:g} s) overrides the "
                 f"servers' figure ({bw0:g} B/s, {lat0:g} s)")
        over[(a, c)] = (bw, lat)

    def link(a: int, c: int) -> tuple[float, float]:
        return over.get((a, c)) or servers.pair_link(a, c)

    if k <= DENSE_MAX:
        rows = [[link(a, c) for c in range(k)] for a in range(k)]
        return [[x[0] for x in r] for r in rows], [[x[1] for x in r] for r in rows]
    return PairMatrix(lambda a, c: link(a, c)[0], k), PairMatrix(lambda a, c: link(a, c)[1], k)


def make_doc(*, name: str, servers: int, gpus_per_server: int, gpu: str, intra: str, inter: str | None,
             nics: int | None, rails: int | None = None, oversubscription: float = 1.0,
             description: str | None = None, server_type: str = "server") -> dict:
    """A ``placer.cluster/v1`` document of *servers* identical servers from the
    presets (:data:`GPUS`, :data:`FABRICS`, :data:`NICS`; *intra* ``nvswitch``
    picks the GPU's NVSwitch generation), its ``meta.sources`` naming them.

    Raises
    ------
    InvalidInput
        An unknown preset name.

    >>> d = make_doc(name="x", servers=2, gpus_per_server=8, gpu="A100-80GB", intra="nvswitch",
    ...              inter="ib-hdr-200", nics=8)
    >>> d["servers"]["types"]["server"]["fabric"]["bandwidth_Bps"], d["servers"]["groups"]
    (300000000000.0, [{'type': 'server', 'count': 2}])
    """
    def pick(table: dict, key: str, what: str) -> dict:
        if key not in table:
            raise InvalidInput(f"unknown {what} '{key}' (known: {', '.join(table)})")
        return table[key]

    g = pick(GPUS, gpu, "GPU type")
    if intra == "nvswitch":
        if g["type"] not in NVSWITCH_OF:
            raise InvalidInput(f"--intra nvswitch: no NVSwitch preset for {gpu} (known: {', '.join(FABRICS)})")
        intra = NVSWITCH_OF[g["type"]]
    fab = pick(FABRICS, intra, "fabric")
    sources = [g["source"], fab["source"]]
    stype: dict = {"gpu": gpu, "gpus": gpus_per_server,
                   "fabric": {k: v for k, v in fab.items() if k != "source"}}
    if inter is not None:
        nic = pick(NICS, inter, "NIC")
        count = nics or gpus_per_server
        stype["nics"] = {"count": count, "bandwidth_Bps": nic["bandwidth_Bps"], "latency_s": nic["latency_s"],
                         "rails": rails or count}
        sources.append(nic["source"])
    sources.append("NCCL rail-optimised transport (GPUDirect RDMA, PXN) and the NVIDIA DGX SuperPOD reference "
                   "architecture: GPU i of every server on rail i; a fat tree, non-blocking unless "
                   "oversubscription says otherwise")
    desc = description or (f"{servers} servers of {gpus_per_server}x {gpu} on {intra}"
                           + (f", {inter} between servers ({stype['nics']['count']} NICs per server)" if inter
                              else ""))
    return {"schema": "placer.cluster/v1", "name": name,
            "meta": {"description": desc, "sources": sources,
                     "links": "a pair's link is resolved from its two GPUs' servers: the fabric inside a server; "
                              "between servers one NIC's bandwidth divided by the oversubscription, the NIC's "
                              "latency, plus the destination fabric's latency for a pair on different rails",
                     "speed": "speed = FP32 peak relative to the V100 PCIe of the profile device table "
                              "(14.0 TFLOPS); it is used only for graphs without compute_by_type"},
            "servers": {"types": {server_type: stype}, "groups": [{"type": server_type, "count": servers}],
                        "network": {"topology": "fat-tree", "oversubscription": float(oversubscription)}}}
