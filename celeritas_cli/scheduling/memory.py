"""Per-device memory and colocation bookkeeping shared by the placement
algorithms.

:class:`DeviceMemory` is the one implementation of the rules the memory-aware
algorithms have in common (Baechi's "m-" rule, Celeritas 6.1):

* a node's *unit* is its colocation group or the node itself; a group is
  charged in full when its first member is placed and pinned to that device,
  so later members can only go there (and add nothing);
* a unit *fits* a device when the device's load plus the unit stays within
  the budget ``cap`` (by default the device memory);
* when a unit fits nowhere it goes to a best-effort device; the algorithms
  disagree on which, so the rule is an explicit argument of
  :meth:`DeviceMemory.fallback` (``"most_free"``: the most free budget,
  Celeritas 6.2.3 as Baechi's baselines, DPOS and FD-DPS apply it;
  ``"least_used"``: the fewest bytes used, Celeritas 5.2 / 6.4 as Order-Place
  and Adjusting Placement apply it - they differ on heterogeneous memories);
* the status is ``FEASIBLE`` when every device's load fits its real memory,
  else ``OOM``.

Users: m-ETF / m-SCT, m-TOPO, HEFT, METIS (Baechi-style baselines),
Order-Place, Adjusting Placement, DPOS / OS-DPOS, FD-DPS and random.
"""

from __future__ import annotations

from typing import Sequence

from ..model.cluster import Cluster
from ..model.graph import Graph

#: best-effort rules of :meth:`DeviceMemory.fallback`
FALLBACK_RULES = ("most_free", "least_used")


class DeviceMemory:
    """Per-device memory load with colocation groups as units.

    A node's *unit* is its colocation group (all members, charged in full
    when the first member is placed, and pinned to that device) or the node
    itself.  ``cap[d]`` is the budget a placer respects (by default the
    device's memory); feasibility is always judged against the real device
    memory.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 6, "colocation": "w"},
    ...                 {"id": "b", "compute_s": 1, "memory_bytes": 5, "colocation": "w"}], [])
    >>> mem = DeviceMemory(g, uniform(2, memory=10))
    >>> mem.allowed(0, 0)  # the group needs 11 bytes: fits nowhere, best effort
    True
    >>> mem.candidates(1), mem.place(0, 0), mem.need(1), mem.candidates(1), mem.status()
    ([0], None, 0, [0], 'OOM')

    The two best-effort rules differ when budgets differ:

    >>> mem = DeviceMemory(g, uniform(2, memory=10), cap=[4, 8])
    >>> mem.load = [3, 4]   # free budget: 1 and 4
    >>> mem.fallback(0, "most_free"), mem.fallback(0, "least_used")
    (1, 0)
    """

    def __init__(self, graph: Graph, cluster: Cluster, cap: Sequence[float] | None = None):
        self.graph = graph
        self.k = cluster.k
        self.real = [d.memory for d in cluster.devices]
        self.cap = list(cap) if cap is not None else list(self.real)
        groups = graph.colocation_groups()
        self.group_of = [-1] * graph.n
        self.group_mem: list[int] = []
        self.group_members: list[list[int]] = []
        for gi, name in enumerate(sorted(groups)):
            members = groups[name]
            for v in members:
                self.group_of[v] = gi
            self.group_mem.append(sum(graph.memory[v] for v in members))
            self.group_members.append(members)
        self.pinned = [-1] * len(self.group_mem)
        self.load = [0] * self.k

    def unit_memory(self, v: int) -> int:
        """Memory of *v*'s unit (its whole colocation group, or itself)."""
        g = self.group_of[v]
        return self.group_mem[g] if g >= 0 else self.graph.memory[v]

    def pinned_device(self, v: int) -> int:
        """Device *v*'s colocation group is already on, or -1."""
        g = self.group_of[v]
        return self.pinned[g] if g >= 0 else -1

    def need(self, v: int) -> int:
        """Bytes placing *v* now adds (0 when its group is already charged)."""
        return 0 if self.pinned_device(v) >= 0 else self.unit_memory(v)

    def free(self, d: int) -> float:
        """Budget left on *d* (``cap[d] - load[d]``; negative when over)."""
        return self.cap[d] - self.load[d]

    def fits(self, v: int, d: int) -> bool:
        """Whether *v* may go to *d* within the budget ``cap``."""
        p = self.pinned_device(v)
        if p >= 0:
            return d == p
        return self.load[d] + self.unit_memory(v) <= self.cap[d]

    def fallback(self, v: int, rule: str = "most_free") -> int:
        """Best-effort device for *v*: the pinned one, else by *rule*.

        ``"most_free"`` (Celeritas 6.2.3; Baechi-style baselines, DPOS,
        FD-DPS): the device with the most free budget ``cap - load``.
        ``"least_used"`` (Celeritas 5.2 / 6.4 "the device with the lowest
        memory usage"; Order-Place, Adjusting Placement): the fewest bytes
        loaded, whatever the device's size.  Ties by device index.
        """
        p = self.pinned_device(v)
        if p >= 0:
            return p
        if rule == "most_free":
            return min(range(self.k), key=lambda d: (self.load[d] - self.cap[d], d))
        if rule == "least_used":
            return min(range(self.k), key=lambda d: (self.load[d], d))
        raise ValueError(f"unknown fallback rule {rule!r} (known: {', '.join(FALLBACK_RULES)})")

    def candidates(self, v: int, rule: str = "most_free") -> list[int]:
        """The devices *v* may go to, in index order: the pinned one, else
        those it fits, else the single best-effort device by *rule*
        (the list of ``d`` with :meth:`allowed`, in O(k))."""
        p = self.pinned_device(v)
        if p >= 0:
            return [p]
        m = self.unit_memory(v)
        out = [d for d in range(self.k) if self.load[d] + m <= self.cap[d]]
        return out or [self.fallback(v, rule)]

    def allowed(self, v: int, d: int) -> bool:
        """*v* may go to *d*: it fits, or it fits nowhere and *d* is the
        best-effort device."""
        if self.fits(v, d):
            return True
        if self.pinned_device(v) >= 0 or any(self.fits(v, x) for x in range(self.k)):
            return False
        return d == self.fallback(v)

    def place(self, v: int, d: int) -> None:
        """Charge *v*'s unit to *d* (once per group) and pin its group."""
        g = self.group_of[v]
        if g >= 0:
            if self.pinned[g] >= 0:
                return
            self.pinned[g] = d
        self.load[d] += self.unit_memory(v)

    def oom(self) -> bool:
        """Whether some device's load exceeds its real memory."""
        return any(self.load[d] > self.real[d] for d in range(self.k))

    def status(self) -> str:
        """``FEASIBLE`` when every device's load fits its real memory, else ``OOM``."""
        return "OOM" if self.oom() else "FEASIBLE"
