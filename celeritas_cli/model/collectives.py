"""What an NCCL collective over a group of devices costs: the one formula
the simulator and every planner use (docs/design.md, "Collectives").

:func:`collective_time` is the seconds of one ``all-reduce``,
``all-gather`` or ``reduce-scatter`` over the devices of a group;
:func:`collective_plan` says how it was costed (the algorithm, its phases,
the links and bandwidths), and :func:`bus_bytes` is the bytes each rank
sends.  ``nbytes`` is the full buffer per rank, as in a derived graph's
collective node (``collective.bytes``): all-reduce the tensor, all-gather
the gathered output, reduce-scatter the unreduced input.

The ring (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 69(2), 2009, section 3; Thakur, Rabenseifner
and Gropp, "Optimization of collective communication operations in MPICH",
IJHPCA 19(1), 2005, sections 4.4-4.5): over ``n`` ranks a reduce-scatter or
an all-gather is ``n - 1`` steps and an all-reduce ``2 (n - 1)`` steps (a
reduce-scatter, then an all-gather: Rabenseifner's decomposition), each step
every rank sending one chunk of ``S / n`` bytes to the next, so each rank
sends :func:`bus_bytes` = ``2 (n - 1) / n * S`` (all-reduce) or
``(n - 1) / n * S``.  These are NCCL's "bus bandwidth" factors (nccl-tests
``doc/PERFORMANCE.md``: busBW = algBW * 2(n-1)/n for all-reduce, (n-1)/n for
all-gather and reduce-scatter).  A step lasts as long as its slowest hop:
``latency + chunk / bandwidth`` of that hop, so a ring costs
``steps * max over hops (latency + S / n / bandwidth)``, which is
``bus_bytes / bandwidth + steps * latency`` when every hop is alike.

The group's topology decides the hops:

* **pairwise cluster** (``cluster.servers is None``): one ring over the
  group's devices in index order; hop ``d_i -> d_(i+1)`` has the pair's
  ``bandwidth`` / ``latency``.  O(group) pair look-ups.
* **one server** of a cluster of servers: a ring over the server's fabric.
* **several servers**: the faster of two algorithms (named in
  :attr:`CollectivePlan.algorithm`, the other's time in
  :attr:`CollectivePlan.alternative`):

  - ``ring``: one flat ring over all ``n`` GPUs, each server's GPUs adjacent
    on it.  NCCL runs one ring per channel and spreads its channels over
    every NIC (its rings enter and leave a server at different GPUs, each
    through its own NIC), so a server's crossing hop moves a chunk at the
    server's egress ``E = nics_used * nic_bw / oversubscription``, where
    ``nics_used`` are the NICs of the group's GPUs on that server (GPU ``j``
    of a server with ``c`` NICs and ``G`` GPUs owns NIC ``j*c // G``, or NICs
    ``j*c//G .. (j+1)*c//G - 1`` when ``c > G``: :mod:`~celeritas_cli.model.servers`'
    rule), i.e. every NIC for a whole server and one NIC for one GPU of it.
    Hops inside a server use its fabric.
  - ``hierarchical ring`` (the 2-D / hierarchical all-reduce: Jia et al.,
    "Highly scalable deep learning training system with mixed-precision",
    arXiv:1807.11205, 2018; Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``;
    NCCL's tree algorithm has the same intra-node / inter-node split): a
    reduce-scatter of ``S`` inside each server over its ``g`` GPUs of the
    group, then an all-reduce across the ``N`` servers of each GPU's ``S / g``
    shard, every rail at once (a server sends ``bus_bytes(kind, S, N)`` in
    all, at ``E``), then an all-gather of ``S`` inside each server.  An
    all-gather is the across-servers all-gather then the inside one; a
    reduce-scatter the inside one then the across-servers one.

  Servers holding different numbers of the group's GPUs (an uneven group):
  every phase lasts as long as its slowest server.

What it is not (documented simplifications): the phases of the
hierarchical ring do not overlap (NCCL's tree pipelines them); no tree
(log-depth) or NVLS / CollNet algorithm and no protocol choice (LL, LL128,
Simple), so a small collective pays every ring step's latency; a crossing
hop between GPUs on different rails pays no extra fabric hop (PXN);
explicit ``links.pairs`` of a cluster of servers are not read here (the
servers' fabric and NIC figures are); the NICs' PCIe path is not a limit.
A cluster's ``hosts`` with ``collective_step_s`` (``placer calibrate``)
adds that fixed cost, the largest over the group's devices, to every ring
step (:attr:`CollectivePlan.step_overhead_s`).

Cost: O(len(devices)) the first time a group is seen (validation, and the
group's shape: per server, its GPUs of the group and their NICs), then the
shape and each (shape, kind, bytes) plan are cached on the cluster: a plan
costs O(distinct (server type, GPUs, NICs) shapes) once, and a call seen
before costs one hash of the device tuple.  A cluster of servers' pair
matrices are never read.

Example
-------
>>> from celeritas_cli.model.cluster import uniform
>>> c = uniform(4, bandwidth=1e9, latency=1e-6)
>>> round(collective_time(c, [0, 1, 2, 3], "all-reduce", 4_000_000), 9)   # 6 steps of (1 us + 1 ms)
0.006006
>>> collective_time(c, [2], "all-reduce", 4_000_000)
0.0
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import InvalidInput

__all__ = ["KINDS", "CollectivePlan", "Phase", "bus_bytes", "collective_plan", "collective_time", "ring_steps"]

KINDS = ("all-reduce", "all-gather", "reduce-scatter")
#: cached group shapes / plans per cluster before the cache is emptied (a bound on memory, not a tuning knob)
CACHE_MAX = 4096
_FABRIC_NAMES = {"nvswitch": "NVSwitch", "nvlink": "NVLink", "pcie": "PCIe"}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidInput(f"collective kind {kind!r} is not one of {', '.join(KINDS)}")


def ring_steps(kind: str, n: int) -> int:
    """Steps of a ring *kind* over *n* ranks: ``2 (n - 1)`` for all-reduce, ``n - 1`` otherwise.

    >>> ring_steps("all-reduce", 8), ring_steps("all-gather", 8), ring_steps("reduce-scatter", 1)
    (14, 7, 0)
    """
    _check_kind(kind)
    return 2 * (n - 1) if kind == "all-reduce" else n - 1


def bus_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes each of *n* ranks sends in a ring *kind* of an *nbytes* buffer
    (nccl-tests ``doc/PERFORMANCE.md``, bus bandwidth): ``2 (n - 1) / n * S``
    for all-reduce, ``(n - 1) / n * S`` for all-gather and reduce-scatter.

    Raises
    ------
    InvalidInput
        An unknown *kind*.

    >>> bus_bytes("all-reduce", 800, 8), bus_bytes("all-gather", 800, 8), bus_bytes("all-reduce", 800, 1)
    (1400.0, 700.0, 0.0)
    """
    return ring_steps(kind, n) * (nbytes / n) if n > 1 else 0.0


@dataclass(frozen=True)
class Phase:
    """One ring of a collective: *kind* over *ranks* ranks *where* (words),
    *steps* steps, each lasting ``latency_s + chunk / bandwidth_Bps`` of its
    slowest hop (*link* names it); *bytes* sent per rank (per server for a
    phase across servers); *seconds* in all (the slowest server's, for a phase
    run in every server at once)."""

    kind: str
    where: str
    ranks: int
    steps: int
    bytes: float
    bandwidth_Bps: float
    latency_s: float
    link: str
    seconds: float

    def words(self) -> str:
        return f"{self.kind} {self.where} over {self.link}"


@dataclass(frozen=True)
class CollectivePlan:
    """How :func:`collective_time` costs one collective.

    ``algorithm``: ``none`` (one rank or no bytes), ``ring`` or
    ``hierarchical ring``; ``phases`` in order; ``step_overhead_s`` the
    hosts' fixed cost per step in all; ``seconds`` the total;
    ``alternative`` the algorithm not chosen and its seconds (several servers
    only, else None)."""

    kind: str
    nbytes: float
    ranks: int
    servers: int
    algorithm: str
    phases: tuple[Phase, ...]
    step_overhead_s: float
    seconds: float
    alternative: tuple[str, float] | None = None

    @property
    def bus_bytes(self) -> float:
        """Bytes each rank of a flat ring would send (:func:`bus_bytes`)."""
        return bus_bytes(self.kind, self.nbytes, self.ranks)

    @property
    def bus_bandwidth_Bps(self) -> float:
        """NCCL's bus bandwidth of this collective: :attr:`bus_bytes` / seconds (0 when it costs nothing)."""
        return self.bus_bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def algorithm_bandwidth_Bps(self) -> float:
        """NCCL's algorithm bandwidth: nbytes / seconds (0 when it costs nothing)."""
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0

    def words(self) -> str:
        """The plan in one line.

        >>> from celeritas_cli.model.cluster import uniform
        >>> w = collective_plan(uniform(4, bandwidth=1e9, latency=1e-6), [0, 1, 2, 3], "all-gather", 4e6).words()
        >>> w.split("; ")  # doctest: +NORMALIZE_WHITESPACE
        ['ring: all-gather over 4 GPUs in index order over the slowest adjacent pair, 1 GB/s, 1 us',
         '3.003 ms, bus bandwidth 0.999 GB/s']
        """
        if self.algorithm == "none":
            why = "one GPU" if self.ranks <= 1 else "no bytes"
            return f"{self.kind} of {_size(self.nbytes)} over {self.ranks} GPU{'s' * (self.ranks != 1)}: " \
                   f"nothing to move ({why})"
        out = f"{self.algorithm}: " + ", ".join(p.words() for p in self.phases)
        if self.step_overhead_s:
            out += f", plus {_secs(self.step_overhead_s)} of the hosts' fixed cost per step"
        out += f"; {_secs(self.seconds)}, bus bandwidth {_bw(self.bus_bandwidth_Bps)}"
        if self.alternative:
            out += f" (a {self.alternative[0]}: {_secs(self.alternative[1])})"
        return out


def collective_time(cluster: Any, devices: Sequence[int], kind: str, nbytes: float) -> float:
    """Seconds of the NCCL collective *kind* of an *nbytes* buffer per rank
    over *devices* (indices into *cluster*): :func:`collective_plan`'s total.

    Raises
    ------
    InvalidInput
        An unknown *kind*, a negative or non-finite *nbytes*, a device index
        out of range or listed twice.
    """
    return collective_plan(cluster, devices, kind, nbytes).seconds


def collective_plan(cluster: Any, devices: Sequence[int], kind: str, nbytes: float) -> CollectivePlan:
    """How the collective *kind* of *nbytes* over *devices* of *cluster* is
    costed (the module docstring's rules), cached on the cluster.

    Raises
    ------
    InvalidInput
        As :func:`collective_time`.

    References
    ----------
    Patarasuk and Yuan, JPDC 2009, section 3 (the ring); Thakur et al.,
    IJHPCA 2005, section 4 (reduce-scatter + all-gather); nccl-tests
    ``doc/PERFORMANCE.md`` (bus bandwidth); Jia et al. 2018 (hierarchical
    all-reduce).
    """
    _check_kind(kind)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise InvalidInput(f"collective {kind}: bytes must be a finite number of at least 0, not {nbytes!r}")
    cache = cluster.__dict__.get("_collectives")
    if cache is None:
        cache = cluster.__dict__["_collectives"] = ({}, {})
    groups, plans = cache
    key = tuple(devices)
    group = groups.get(key)
    if group is None:
        group = _group(cluster, key)
        if len(groups) >= CACHE_MAX:
            groups.clear()
        groups[key] = group
    pkey = (group, kind, nbytes)
    plan = plans.get(pkey)
    if plan is None:
        plan = _plan(cluster, group, kind, nbytes)
        if len(plans) >= CACHE_MAX:
            plans.clear()
        plans[pkey] = plan
    return plan


# --- the group's shape ------------------------------------------------------------------------------------


def _group(cluster: Any, devices: tuple) -> tuple:
    """The group's shape, all a plan depends on (hashable):
    ``("pairs", n, hops, step)``: the distinct (bandwidth, latency) hops of the
    ring in index order; ``("servers", n, shape, step)``: sorted
    ``((server type, GPUs of the group on it, NICs of those GPUs), count of such servers)``.
    ``step``: the largest ``collective_step`` of the group's devices."""
    k = cluster.k
    seen: set[int] = set()
    for d in devices:
        try:
            i = operator.index(d)
        except TypeError:
            raise InvalidInput(f"collective group: device {d!r} is not a device index") from None
        if not 0 <= i < k:
            raise InvalidInput(f"collective group: device index {i} is not a device of cluster "
                               f"'{cluster.name}' (0..{k - 1})")
        if i in seen:
            raise InvalidInput(f"collective group: device {cluster.devices[i].id} is listed twice")
        seen.add(i)
    n = len(devices)
    coll = cluster.collective_step
    step = max((coll[d] for d in devices), default=0.0)
    if n <= 1:
        return ("none", n, (), step)
    srv = cluster.servers
    if srv is None:
        ring = sorted(devices)
        bw, lat = cluster.bandwidth, cluster.latency
        hops = {(float(bw[a][c]), float(lat[a][c])) for a, c in zip(ring, ring[1:] + ring[:1])}
        return ("pairs", n, tuple(sorted(hops)), step)
    local: dict[int, list[int]] = {}
    for d in devices:
        local.setdefault(srv.server_of[d], []).append(srv.local[d])
    shape: dict[tuple, int] = {}
    for s, js in local.items():
        t = srv.types[srv.server_types[s]]
        c, G = t["nics"], t["gpus"]
        if c >= G:
            nics = sum((j + 1) * c // G - j * c // G for j in js)
        else:
            nics = len({j * c // G for j in js})
        entry = (srv.server_types[s], len(js), nics)
        shape[entry] = shape.get(entry, 0) + 1
    return ("servers", n, tuple(sorted(shape.items())), step)


# --- plans ------------------------------------------------------------------------------------------------


def _plan(cluster: Any, group: tuple, kind: str, nbytes: float) -> CollectivePlan:
    form, n, shape, step = group
    if form == "none" or nbytes == 0:
        nserv = 1 if form != "servers" else sum(cnt for _, cnt in shape)
        return CollectivePlan(kind, nbytes, n, nserv, "none", (), 0.0, 0.0)
    if form == "pairs":
        chunk = nbytes / n
        bw, lat = max(shape, key=lambda h: (h[1] + chunk / h[0], -h[0], h[1]))
        steps = ring_steps(kind, n)
        ph = Phase(kind, f"over {n} GPUs in index order", n, steps, bus_bytes(kind, nbytes, n), bw, lat,
                   f"the slowest adjacent pair, {_bw(bw)}, {_secs(lat)}", steps * (lat + chunk / bw))
        return _finish(kind, nbytes, n, 1, "ring", (ph,), step, None)
    srv = cluster.servers
    over = srv.oversubscription
    servers = [(srv.types[name], name, g, nics, cnt) for (name, g, nics), cnt in shape]
    nserv = sum(s[4] for s in servers)
    if nserv == 1:
        g = servers[0][2]
        ph = _intra(kind, nbytes, [servers[0]], cluster, f"over {g} GPUs of one server")
        return _finish(kind, nbytes, n, 1, "ring", (ph,), step, None)
    # flat ring: every hop of a step at once; a server's crossing hop at its egress E
    chunk = nbytes / n
    inside = [s for s in servers if s[2] > 1]
    hops = []
    for t, name, g, nics, _ in servers:
        if g > 1:
            hops.append((t["fabric_lat"] + chunk / t["fabric_bw"], t["fabric_bw"], t["fabric_lat"],
                         _fabric(cluster, name, t)))
        e = nics * t["nic_bw"] / over
        hops.append((t["nic_lat"] + chunk / e, e, t["nic_lat"], _nics(nics, t["nic_bw"], over)))
    _, bw, lat, link = max(hops, key=lambda h: (h[0], -h[1], h[2], h[3]))
    steps = ring_steps(kind, n)
    flat = (Phase(kind, f"over {n} GPUs in {nserv} servers", n, steps, bus_bytes(kind, nbytes, n), bw, lat,
                  f"the slowest hop, {link}", steps * (lat + chunk / bw)),)
    # hierarchical ring
    gs = sorted({g for _, _, g, _, _ in servers}, reverse=True)
    ins = "in " + (f"{nserv} servers of {gs[0]} GPUs" if len(gs) == 1 else
                   f"{nserv} servers of {', '.join(map(str, gs[:-1]))} or {gs[-1]} GPUs")
    share = f"1/{gs[0]}" if len(gs) == 1 else "each GPU's share"
    if not inside:   # one GPU per server: the hierarchical ring is the flat ring
        return _finish(kind, nbytes, n, nserv, "ring", flat, step, None)
    phases: list[Phase] = []
    cross = "all-reduce" if kind == "all-reduce" else kind
    if kind in ("all-reduce", "reduce-scatter"):
        phases.append(_intra("reduce-scatter", nbytes, inside, cluster, ins))
    phases.append(_inter(cross, nbytes, nserv, servers, over, f"of {share} across {nserv} servers"))
    if kind in ("all-reduce", "all-gather"):
        phases.append(_intra("all-gather", nbytes, inside, cluster, ins))
    hier = tuple(phases)
    step_flat = step * sum(p.steps for p in flat)
    step_hier = step * sum(p.steps for p in hier)
    t_flat = math.fsum(p.seconds for p in flat) + step_flat
    t_hier = math.fsum(p.seconds for p in hier) + step_hier
    if t_hier < t_flat:
        return _finish(kind, nbytes, n, nserv, "hierarchical ring", hier, step, ("flat ring", t_flat))
    return _finish(kind, nbytes, n, nserv, "ring", flat, step, ("hierarchical ring", t_hier))


def _finish(kind: str, nbytes: float, n: int, nserv: int, algorithm: str, phases: tuple, step: float,
            alternative: tuple | None) -> CollectivePlan:
    over = step * sum(p.steps for p in phases)
    total = math.fsum(p.seconds for p in phases) + over
    return CollectivePlan(kind, nbytes, n, nserv, algorithm, phases, over, total, alternative)


def _intra(kind: str, nbytes: float, servers: list, cluster: Any, where: str) -> Phase:
    """A ring *kind* of *nbytes* inside each of *servers* at once, over its fabric: the slowest server's."""
    best = None
    for t, name, g, _, _ in servers:
        steps = ring_steps(kind, g)
        secs = steps * (t["fabric_lat"] + nbytes / g / t["fabric_bw"])
        cand = (secs, -t["fabric_bw"], name, g, steps, t)
        if best is None or cand > best:
            best = cand
    secs, _, name, g, steps, t = best
    return Phase(kind, where, g, steps, bus_bytes(kind, nbytes, g), t["fabric_bw"], t["fabric_lat"],
                 _fabric(cluster, name, t), secs)


def _inter(kind: str, nbytes: float, nserv: int, servers: list, over: float, where: str) -> Phase:
    """A ring *kind* across *nserv* servers, each server's share of *nbytes* on all its rails at once
    (a server sends ``bus_bytes(kind, nbytes, nserv)`` at its egress): the slowest server's."""
    steps = ring_steps(kind, nserv)
    best = None
    for t, name, g, nics, _ in servers:
        e = nics * t["nic_bw"] / over
        secs = steps * (t["nic_lat"] + nbytes / nserv / e)
        cand = (secs, -e, t["nic_lat"], nics, t["nic_bw"])
        if best is None or cand > best:
            best = cand
    secs, neg_e, lat, nics, nic_bw = best
    return Phase(kind, where, nserv, steps, bus_bytes(kind, nbytes, nserv), -neg_e, lat,
                 _nics(nics, nic_bw, over), secs)


# --- words ------------------------------------------------------------------------------------------------


def _fabric(cluster: Any, name: str, t: dict) -> str:
    doc_types = ((cluster.doc or {}).get("servers") or {}).get("types") or {}
    kind = ((doc_types.get(name) or {}).get("fabric") or {}).get("kind")
    return f"{_FABRIC_NAMES.get(kind, kind or 'the fabric')} {_bw(t['fabric_bw'])}"


def _nics(nics: int, nic_bw: float, over: float) -> str:
    out = f"{nics} NIC{'s' * (nics != 1)} x {_bw(nic_bw)}"
    return out + (f" / {over:g} oversubscription" if over != 1 else "")


def _bw(bps: float) -> str:
    return f"{bps / 1e9:.3g} GB/s"


def _secs(s: float) -> str:
    if s >= 1:
        return f"{s:.4g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.4g} ms"
    return f"{s * 1e6:.4g} us"


def _size(b: float) -> str:
    return f"{b:g} B"
