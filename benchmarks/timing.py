"""Timing helper shared by the benchmark scripts (not a benchmark itself)."""

from __future__ import annotations

import time


def best_of(fn, k: int = 2):
    """Run *fn* *k* times; return (best wall time in seconds, last result).
    Best-of-k is the least noisy statistic on a shared machine."""
    best = float("inf")
    out = None
    for _ in range(k):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out
