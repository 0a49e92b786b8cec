"""Symmetry breaking between identical devices (beyond Moirai III-D).

Moirai's MILP (III-D) has, for k interchangeable devices, k! copies of
every solution; CP-SAT proves optimality far sooner when only one of them
is allowed.  Devices are interchangeable when they have the same type,
speed and memory and swapping them is an automorphism of the link matrices
(:func:`identical_classes`); inside such a class the j-th device may host a
unit only if the (j-1)-th hosts a unit of smaller topological rank
(:func:`symmetry_breaking`).  A warm start is permuted into that canonical
form before it is hinted (:func:`canonical_permutation`).
"""

from __future__ import annotations

from typing import Sequence

from ....model.cluster import Cluster
from ....model.graph import Graph
from .data import Problem


def identical_classes(graph: Graph, cluster: Cluster) -> list[list[int]]:
    """Classes of interchangeable devices: same type, speed and memory, and
    swapping the two is an automorphism of the link matrices (so every
    permutation inside a class is one).  Empty when an edge has per-pair
    measured times (``comm_s_by_pair`` names devices)."""
    if any(graph.edge_comm):
        return []
    k = cluster.k
    bw, lat, devs = cluster.bandwidth, cluster.latency, cluster.devices

    def swappable(i: int, j: int) -> bool:
        if (devs[i].type, devs[i].speed, devs[i].memory) != (devs[j].type, devs[j].speed, devs[j].memory):
            return False
        for m in (bw, lat):
            if m[i][j] != m[j][i]:
                return False
            for x in range(k):
                if x in (i, j):
                    continue
                if m[i][x] != m[j][x] or m[x][i] != m[x][j]:
                    return False
        return True

    classes: list[list[int]] = []
    for d in range(k):
        for cl in classes:
            if swappable(cl[0], d):
                cl.append(d)
                break
        else:
            classes.append([d])
    return [cl for cl in classes if len(cl) > 1]


def _prefix_chain(model, pb: Problem, x: list[list], d0: int, d1: int) -> list:
    """Device *d1* hosts unit *u* only if *d0* hosts *u* or an earlier unit:
    ``P[u]`` = "unit u or an earlier one is on d0" (None where d0 cannot
    host u, then the previous P stands)."""
    prev = None
    plist = []
    for u in range(len(pb.units)):
        xd1 = x[u][d1]
        if xd1 is not None:
            if prev is None:
                model.add(xd1 == 0)
            else:
                model.add_implication(xd1, prev)
        xd0 = x[u][d0]
        if xd0 is None:
            plist.append(prev)
            continue
        pu = model.new_bool_var(f"P_{d0}_{u}")
        if prev is None:
            model.add(pu == xd0)
        else:
            model.add_bool_or([pu.Not(), prev, xd0])
            model.add_implication(prev, pu)
            model.add_implication(xd0, pu)
        plist.append(pu)
        prev = pu
    return plist


def symmetry_breaking(model, pb: Problem, x: list[list], classes: list[list[int]]) -> dict[tuple[int, int], list]:
    """For consecutive devices ``d0, d1`` of every class, the chain of
    :func:`_prefix_chain`; returns ``{(d0, d1): P}`` for hinting."""
    prefix: dict[tuple[int, int], list] = {}
    for cl in classes:
        for j in range(len(cl) - 1):
            d0, d1 = cl[j], cl[j + 1]
            prefix[(d0, d1)] = _prefix_chain(model, pb, x, d0, d1)
    return prefix


def canonical_permutation(device_of: Sequence[int], units: list[list[int]], classes: list[list[int]],
                          k: int) -> list[int]:
    """perm[d] = device the hint's device *d* becomes so that, inside each
    identical class, devices are used in order of their first unit.

    Example
    -------
    >>> canonical_permutation([2, 2, 0], [[0, 1], [2]], [[0, 1, 2]], 3)
    [1, 2, 0]
    """
    perm = list(range(k))
    for cl in classes:
        first = {}
        for u, mem in enumerate(units):
            d = device_of[mem[0]]
            if d in cl and d not in first:
                first[d] = u
        ranked = sorted(cl, key=lambda d: (first.get(d, len(units)), d))
        for new, old in zip(cl, ranked):
            perm[old] = new
    return perm
