"""The one deadline every algorithm honours, enforced where algorithms are
called (:func:`celeritas_cli.registry.place`), not by each remembering to.

An algorithm's ``time_limit`` (:func:`~.params.time_limit_param`; every
registered algorithm has one) is counted from the start of the command.
Algorithms with a search of their own take ``deadline`` and stop there by
themselves, with the best plan their counted budget reached.  Whatever an
algorithm does, the registry runs it under a :class:`Cap` at

    ``cap_at = started + time_limit * (1 + OVERRUN) + OVERRUN_S``

and stops it there, without its cooperation, in two ways:

1. cooperatively, in the shared hot loops: the simulator's event loop (at
   its start, then every :data:`CHECK_EVERY` events) and every derived
   graph's build (:func:`~celeritas_cli.transform.size.check_size`, which
   every rewrite calls first) call :func:`check_time`, which raises
   :class:`TimeUp` once the cap has passed;
2. in any other Python loop, by a ``SIGALRM`` timer armed for the cap
   (main thread only; POSIX), whose handler raises the same and re-arms
   itself every :data:`REPEAT_S` while the cap is over.

:class:`TimeUp` is a ``BaseException``, as ``KeyboardInterrupt`` is: the
``except PlacerError`` / ``except Exception`` of an algorithm (auto skipping
a member that failed) does not stop it.  The registry turns it into the best
plan the algorithm recorded (:func:`keep_best`), said in a warning, or into
a one-line :class:`~celeritas_cli.errors.TimeLimit` naming the limit.  The
rest of the promise (``time_limit`` + 10 % + 1 s for the whole command,
counted from the process's start, :func:`process_start`) is left for the
interpreter's start and writing the answer.  A call nested in another (auto's
members) gets the earlier of the two caps; an error for the outer cap
passes through the inner call.

Example
-------
>>> with time_cap(None, 0.0, "heft") as cap:
...     check_time()  # no limit: never raises
>>> cap is None
True
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .limits import WAIT_MAX


#: the registry stops an algorithm this share of its limit after the limit ...
OVERRUN = 0.05
#: ... plus this many seconds (the other 5 % + 0.5 s of "limit + 10 % + 1 s" are the answer's)
OVERRUN_S = 0.5
#: while the cap is over, the alarm raises again after this many seconds (an algorithm that caught it goes on)
REPEAT_S = 0.1
#: the simulator checks the clock once every this many events (a few milliseconds of work)
CHECK_EVERY = 4096

#: the clock of every check: :func:`time.perf_counter` (tests replace it)
now: Callable[[], float] = time.perf_counter


@dataclass
class Cap:
    """One call's cap: the :func:`now` reading ``at`` which it stops, the
    ``limit`` it enforces (s, for messages), the algorithm's name, and the
    best plan it recorded (:func:`keep_best`: a function making it)."""

    at: float
    limit: float
    what: str
    best: Callable[[], Any] | None = None

    def stop(self) -> "TimeUp":
        """The exception that stops the call."""
        return TimeUp(self)

    def message(self) -> str:
        """The one-line error of a call stopped without a plan."""
        return (f"{self.what}: stopped at its time limit of {self.limit:g} s before it had a plan; raise "
                f"--time-limit (-p time_limit=S; 0 = no limit)")


class TimeUp(BaseException):
    """The cap *cap* has passed: raised by :func:`check_time` and the alarm,
    caught only by the registry (module docstring)."""

    def __init__(self, cap: Cap):
        super().__init__(cap.what)
        self.cap = cap


_CAP: ContextVar[Cap | None] = ContextVar("time_cap", default=None)


def cap_at(started: float, time_limit: float) -> float | None:
    """The reading at which a call started at *started* with *time_limit*
    is stopped (module docstring); None for 0 (no limit).

    >>> cap_at(100.0, 10.0), cap_at(100.0, 0.0)
    (111.0, None)
    """
    return started + time_limit * (1 + OVERRUN) + OVERRUN_S if time_limit else None


def process_start() -> float | None:
    """The :func:`now` reading at which this process started (Linux:
    ``/proc/self/stat``, 10 ms steps), or None where that is not known:
    ``placer place`` counts ``--time-limit`` from there, so the
    interpreter's start and placer's imports (0.3-0.7 s on a loaded
    machine) are inside the limit too.

    >>> s = process_start()
    >>> s is None or s <= now()
    True
    """
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22, starttime, after "pid (comm) "
        elapsed = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return now() - elapsed if 0.0 <= elapsed < 3600.0 else None


def check_time() -> None:
    """Raise :class:`TimeUp` when the cap in force has passed (nothing when
    there is none): what the shared hot loops call."""
    cap = _CAP.get()
    if cap is not None and now() >= cap.at:
        raise cap.stop()


def keep_best(make: Callable[[], Any]) -> None:
    """Record how to make the best plan found so far (a function returning
    the :class:`~celeritas_cli.model.placement.Placement`, or None while
    there is none; called only if the cap stops the algorithm): the
    registry answers with it instead of an error.  Nothing without a cap in
    force."""
    cap = _CAP.get()
    if cap is not None:
        cap.best = make


def _alarm(signum, frame) -> None:  # the SIGALRM handler
    cap = _CAP.get()
    if cap is None:
        return
    left = cap.at - now()
    if left > 0:  # woken early (a timer is at most WAIT_MAX): wait again
        _arm(cap)
        return
    signal.setitimer(signal.ITIMER_REAL, REPEAT_S)
    raise cap.stop()


def _arm(cap: Cap | None) -> None:
    if cap is None:
        signal.setitimer(signal.ITIMER_REAL, 0)
    else:
        signal.setitimer(signal.ITIMER_REAL, min(WAIT_MAX, max(1e-6, cap.at - now())))  # woken early: re-armed


@contextmanager
def time_cap(at: float | None, limit: float, what: str) -> Iterator[Cap | None]:
    """Within the block, the call *what* is stopped at reading *at* (None:
    no cap of its own), or at the cap in force when that is earlier.
    Yields the block's :class:`Cap` (None when there is none at all).  An
    earlier enclosing cap's :class:`TimeUp` leaves the block as the
    enclosing call's (``exc.cap`` is that call's), so only the call whose
    own limit ran out answers with its best plan."""
    outer = _CAP.get()
    borrowed = at is None or (outer is not None and outer.at <= at)
    if borrowed and outer is None:
        yield None
        return
    cap = Cap(outer.at, outer.limit, outer.what) if borrowed else Cap(at, limit, what)  # type: ignore[union-attr]
    token = _CAP.set(cap)
    alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _alarm) if alarm else None
    foreign = signal.getitimer(signal.ITIMER_REAL) if alarm and outer is None else (0.0, 0.0)  # another's timer
    armed = now()
    try:
        if alarm:
            _arm(cap)
        yield cap
    except TimeUp:
        if borrowed:
            raise outer.stop() from None  # type: ignore[union-attr]
        raise
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        _CAP.reset(token)
        if alarm and outer is not None:
            _arm(outer)
        elif alarm and foreign[0] > 0:  # give the timer that was running back, less the time the call took
            signal.setitimer(signal.ITIMER_REAL, max(1e-6, foreign[0] - (now() - armed)), foreign[1])
