"""The Hierarchical Planner's runtime signal for a sampled placement,
including the one charged to a placement that does not fit in memory.

HRL (section 2) rewards ``R = -sqrt(r)`` with ``r`` the measured runtime; a
placement that runs out of memory has no runtime, and HRL's released
controller charges it a fixed ``failing_signal``.  Celeritas (section 2,
Figure 1) points at the weakness: when every sample is OOM every sample gets
the same reward, the advantage is zero and nothing is learnt - measured here
on InceptionV3 (64.8 GiB on 4 x 32 GB): 82 % of the samples OOM in the first
24 s, 100 % after 35 s, the best placement from iteration 15.

Modes (``oom_mode``), all documented deviations but ``fixed``:

* ``mask`` (default): the Placer does not sample a device a group no longer
  fits on (:class:`~.model.Placer`, action masking), so samples fit whenever
  the groups can be packed in decoding order; a sample that still overflows
  (best effort) is charged as in ``graded``.  Measured: with ``graded`` or
  ``fixed`` alone the policy drifts into memory overflow - REINFORCE sharpens
  a factorised policy, which concentrates load, and spreading load evenly is
  a coordinated choice such a policy learns slowly - so only the mask keeps
  a memory-bound graph's samples feasible.
* ``graded``: an OOM sample is charged more the further it overflows, so a
  batch of OOM samples still has a gradient towards fitting.
* ``fixed``: the paper's fixed penalty.

Every mode charges an OOM sample more than any feasible placement can take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ....model.cluster import Cluster
from ....model.costs import CostModel
from ....model.graph import Graph
from ....sim.simulator import run_schedule

OOM_MODES = ("mask", "graded", "fixed")


def oom_runtime(graph: Graph, cluster: Cluster, costs: CostModel, penalty: float) -> float:
    """The runtime charged to a placement that does not fit in memory
    (HRL's ``failing_signal``): ``penalty`` times an upper bound on the
    simulated makespan of *any* placement, ``sum_v max_d time(v, d) +
    sum_t (k - 1) * max_{a != c} comm(t, a, c)`` (at every instant of a
    simulation some node computes or some transfer moves, so the makespan
    never exceeds total work plus total transfer time).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0}],
    ...           [{"src": "a", "dst": "b", "bytes": 100}])
    >>> c = uniform(2, bandwidth=100.0, latency=0.0)
    >>> from celeritas_cli.model.costs import cost_model
    >>> oom_runtime(g, c, cost_model(g, c), 2.0)  # 2 x (1 + 2 + 1 x 1 s transfer)
    8.0
    """
    k = cluster.k
    work = math.fsum(costs.max_time)
    comm = 0.0
    if k > 1:
        for t in range(len(graph.tensor_src)):
            worst = max(costs.tensor_comm(t, a, c) for a in range(k) for c in range(k) if a != c)
            comm += (k - 1) * worst
    return penalty * max(work + comm, 1e-12)


def overflow_fraction(loads: Sequence[int], capacity: Sequence[int], total: int) -> float:
    """Bytes over capacity, summed over devices, as a fraction of the
    graph's memory *total* (0 when everything fits; below 1 always).

    Example
    -------
    >>> overflow_fraction([30, 10], [20, 20], 40)  # 10 of 40 bytes too many on device 0
    0.25
    """
    over = sum(max(0, ld - cap) for ld, cap in zip(loads, capacity))
    return over / total if total > 0 else 0.0


def oom_signal(fail_r: float, overflow: float, mode: str) -> float:
    """The runtime charged to an OOM sample: ``fail_r`` (``fixed``, the
    paper's ``failing_signal``) or ``fail_r * (1 + overflow)`` (``graded``
    and ``mask``),
    *overflow* from :func:`overflow_fraction`.  ``fail_r`` exceeds every
    feasible makespan, so OOM samples stay worse than feasible ones in both
    modes; in ``graded`` one that overflows less is rewarded more.

    Example
    -------
    >>> oom_signal(10.0, 0.25, "graded"), oom_signal(10.0, 0.25, "fixed")
    (12.5, 10.0)
    """
    return fail_r if mode == "fixed" else fail_r * (1.0 + overflow)


@dataclass
class RewardEnv:
    """The reward side: memory check, overflow and simulated makespan of a
    unit->device map (memoised)."""

    graph: Graph
    cluster: Cluster
    costs: CostModel
    congestion: str
    unit_of: list[int]
    unit_mem: list[int]
    fail_r: float = 0.0
    oom_mode: str = "mask"
    cache: dict = field(default_factory=dict)

    def loads(self, dev_unit: list[int]) -> list[int]:
        loads = [0] * self.cluster.k
        for u, d in enumerate(dev_unit):
            loads[d] += self.unit_mem[u]
        return loads

    def fits(self, dev_unit: list[int]) -> bool:
        return not self.cluster.over_capacity(self.loads(dev_unit))

    def makespan(self, dev_unit: list[int]) -> float:
        key = bytes(dev_unit) if self.cluster.k < 256 else repr(dev_unit).encode()
        ms = self.cache.get(key)
        if ms is None:
            device_of = [dev_unit[self.unit_of[v]] for v in range(self.graph.n)]
            ms = run_schedule(self.graph, self.cluster, device_of, congestion=self.congestion,
                              costs=self.costs).makespan
            self.cache[key] = ms
        return ms

    def overflow(self, dev_unit: list[int]) -> float:
        return overflow_fraction(self.loads(dev_unit), [dv.memory for dv in self.cluster.devices],
                                 sum(self.unit_mem))

    def runtime(self, dev_unit: list[int]) -> tuple[float, bool]:
        """``(r, fits)``: the simulated makespan, or the OOM signal
        (:func:`~.reward.oom_signal`) when the placement does not fit."""
        loads = self.loads(dev_unit)
        caps = [dv.memory for dv in self.cluster.devices]
        if all(ld <= cap for ld, cap in zip(loads, caps)):
            return self.makespan(dev_unit), True
        over = overflow_fraction(loads, caps, sum(self.unit_mem))
        return oom_signal(self.fail_r, over, self.oom_mode), False
