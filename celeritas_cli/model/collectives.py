"""Placeholder: replaced by the NCCL formulas (issue 34.2)."""
from __future__ import annotations

from ..errors import InvalidInput

KINDS = ("all-reduce", "all-gather", "reduce-scatter")


def collective_time(cluster, devices, kind: str, nbytes: int) -> float:
    if kind not in KINDS:
        raise InvalidInput(f"unknown collective kind {kind!r}")
    n = len(devices)
    if n <= 1:
        return 0.0
    bw = min(cluster.bandwidth[devices[i]][devices[(i + 1) % n]] for i in range(n))
    lat = max(cluster.latency[devices[i]][devices[(i + 1) % n]] for i in range(n))
    f = 2 if kind == "all-reduce" else 1
    return f * (n - 1) / n * nbytes / bw + f * (n - 1) * lat
