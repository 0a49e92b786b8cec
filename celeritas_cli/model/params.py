"""User-settable parameters, declared once.

A :class:`Param` states one parameter's type, default, help and accepted
values (scikit-learn's ``_parameter_constraints``); the shared ones (the time
limit, the congestion rule) are built here by one function each, and every
algorithm, the registry and the CLI read them from here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from .congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from .limits import TIME_MAX

INT_MAX = 2**63 - 1  # the largest integer parameter (the JSON writer's int64)


@dataclass(frozen=True)
class Param:
    """One algorithm parameter: its type (int, float, bool, str), default,
    help, and the values it accepts: ``choices``, or a range ``min`` <= value
    <= ``max`` (``gt``: strictly above), or a ``check`` returning an error
    message (None when the value is fine).  Float parameters are always
    finite (no nan, no inf).

    Example
    -------
    >>> Param(float, 0.5, min=0.0, max=1.0).problem(1.5)
    'must be <= 1.0'
    >>> Param(int, 200, gt=0).range_text()
    '> 0'
    """

    type: type
    default: Any
    help: str = ""
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    check: Callable[[Any], str | None] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with *value* (already converted to ``type``), or None."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if isinstance(value, (int, float)):
            if self.gt is not None and not value > self.gt:
                return f"must be > {self.gt}"
            if self.min is not None and value < self.min:
                return f"must be >= {self.min}"
            if self.max is not None and value > self.max:
                return f"must be <= {self.max}"
        return self.check(value) if self.check is not None else None

    def range_text(self) -> str:
        """The accepted range for help texts (``">= 1"``, ``"0..1"``), or ``""``."""
        low = f"> {self.gt}" if self.gt is not None else (f">= {self.min}" if self.min is not None else "")
        if self.max is None:
            return low
        if self.min is not None and self.gt is None:
            return f"{self.min}..{self.max}"
        return f"{low}, <= {self.max}" if low else f"<= {self.max}"


#: the one rule of every ``time_limit`` parameter, for help texts
TIME_LIMIT_RULE = "0 = no limit; counted from the start of the command"


def time_limit_param(default: float, help: str) -> Param:
    """The ``time_limit`` parameter of an algorithm that has one: seconds,
    ``0 <= value <= 1e12`` (:data:`~celeritas_cli.model.limits.TIME_MAX`),
    0 = no wall-clock limit (:data:`TIME_LIMIT_RULE`).  Such an algorithm
    also takes ``deadline`` (:class:`Algorithm`); the counted budget it
    derives from the limit (iterations, evaluations, deterministic time) is
    its own and said in *help*.

    >>> time_limit_param(60.0, "cap of the whole call").range_text()
    '0..1000000000000.0'
    """
    return Param(float, default, f"{help} (s; {TIME_LIMIT_RULE})", min=0, max=TIME_MAX)


def congestion_param(help: str = "link rule the algorithm plans with, as the simulator's") -> Param:
    """The ``congestion`` parameter: one of
    :data:`~celeritas_cli.model.congestion.CONGESTION_RULES`, default
    :data:`~celeritas_cli.model.congestion.DEFAULT_CONGESTION`; *help* says
    what the algorithm uses it for.

    >>> congestion_param().default, congestion_param().choices
    ('channel', ('channel', 'port', 'none'))
    """
    return Param(str, DEFAULT_CONGESTION, help, choices=CONGESTION_RULES)


def deadline(time_limit: float, started: float | None = None) -> float | None:
    """The :func:`time.perf_counter` reading (a monotonic clock) at which
    *time_limit* seconds counted from *started* (default: now) are over;
    ``None`` for 0 (no limit).  What :func:`place` passes as ``deadline``, and
    what an algorithm called directly without one computes at its start.

    >>> deadline(0.0) is None, deadline(5.0, started=100.0)
    (True, 105.0)
    """
    if not time_limit:
        return None
    return (time.perf_counter() if started is None else started) + time_limit
