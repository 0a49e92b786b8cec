"""Per-device timelines shared by the list schedulers (SAGA's pattern).

A :class:`Timeline` owns each device's busy intervals and answers the one
question every list scheduler asks: *when can a task of length ``dur``,
whose inputs are ready at ``ready``, start on device ``d``?* — either at
the end of the device's work (append) or in the first idle gap that fits
(insertion-based scheduling, HEFT / Celeritas Algorithm 2 / FastT).
Schedulers only choose order and device.
"""

from __future__ import annotations

from bisect import bisect_right


class Timeline:
    """Busy intervals per device, kept sorted by start.

    Example
    -------
    >>> tl = Timeline(1)
    >>> tl.reserve(0, 0.0, 1.0, "a"); tl.reserve(0, 3.0, 4.0, "b")
    >>> tl.earliest_start(0, 0.5, 1.0), tl.earliest_start(0, 0.5, 3.0)
    (1.0, 4.0)
    """

    def __init__(self, k: int):
        self.starts: list[list[float]] = [[] for _ in range(k)]
        self.ends: list[list[float]] = [[] for _ in range(k)]
        self.tasks: list[list] = [[] for _ in range(k)]

    def free_at(self, d: int) -> float:
        """When device *d* finishes its last reserved task."""
        ends = self.ends[d]
        return ends[-1] if ends else 0.0

    def earliest_start(self, d: int, ready: float, dur: float, insertion: bool = True) -> float:
        """Earliest start >= *ready* on device *d* for a task of length *dur*."""
        starts, ends = self.starts[d], self.ends[d]
        if not starts:
            return ready
        if not insertion or ready >= ends[-1]:
            return max(ready, ends[-1])
        # first gap that can hold [s, s+dur) with s >= ready
        i = bisect_right(ends, ready)  # intervals before i end at or before ready
        prev_end = ends[i - 1] if i > 0 else 0.0
        for j in range(i, len(starts)):
            s = max(ready, prev_end)
            if s + dur <= starts[j]:
                return s
            prev_end = ends[j]
        return max(ready, prev_end)

    def slot(self, d: int, ready: float, dur: float, insertion: bool = True) -> tuple[float, int]:
        """Like :meth:`earliest_start`, also returning the position of the
        slot in the device's order (for :meth:`insert`): with zero-length
        tasks several positions share a start time, and only the slot's own
        position keeps the order the times say.

        >>> tl = Timeline(1)
        >>> tl.reserve(0, 1.0, 1.0, "z"); tl.reserve(0, 1.0, 2.0, "a")
        >>> tl.slot(0, 0.0, 0.5), tl.slot(0, 1.0, 0.0), tl.slot(0, 1.0, 1.0)
        ((0.0, 0), (1.0, 1), (2.0, 2))
        """
        starts, ends = self.starts[d], self.ends[d]
        if not starts:
            return ready, 0
        if not insertion or ready >= ends[-1]:
            return max(ready, ends[-1]), len(starts)
        i = bisect_right(ends, ready)
        prev_end = ends[i - 1] if i > 0 else 0.0
        for j in range(i, len(starts)):
            s = max(ready, prev_end)
            if s + dur <= starts[j]:
                return s, j
            prev_end = ends[j]
        return max(ready, prev_end), len(starts)

    def insert(self, d: int, pos: int, start: float, end: float, task=None) -> None:
        """Put [start, end) at position *pos* of device *d*'s order (a
        :meth:`slot` position)."""
        self.starts[d].insert(pos, start)
        self.ends[d].insert(pos, end)
        self.tasks[d].insert(pos, task)

    def reserve(self, d: int, start: float, end: float, task=None) -> None:
        """Mark [start, end) busy on device *d* (kept sorted by start)."""
        starts = self.starts[d]
        if not starts or start >= starts[-1]:
            starts.append(start)
            self.ends[d].append(end)
            self.tasks[d].append(task)
            return
        i = bisect_right(starts, start)
        starts.insert(i, start)
        self.ends[d].insert(i, end)
        self.tasks[d].insert(i, task)

    def order(self, d: int) -> list:
        """Tasks of device *d* in start order."""
        return list(self.tasks[d])
