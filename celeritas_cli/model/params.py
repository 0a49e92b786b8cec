"""User-settable parameters, declared once.

A :class:`Param` states one parameter's type, default, help and accepted
values (scikit-learn's ``_parameter_constraints``).  What several algorithms
or the CLI share is declared here, once, with its name, type, range and
default, and every algorithm's ``params={...}``, its signature's default and
the CLI's flag read it from here (issue 32, item 2; one name per concept):

=================  =========================================================
``time_limit``     :func:`time_limit_param`; defaults :data:`DEFAULT_TIME_LIMIT`
                   (the searches: auto, pipeline), :data:`SOLVER_TIME_LIMIT`
                   (milp, hierarchical) and :data:`CAP_TIME_LIMIT` (every
                   other algorithm: the registry's cap,
                   :data:`TIME_LIMIT_CAP`); 0 = no limit
``seed``           :data:`SEED` (``--seed``)
``assume_batch``   :data:`ASSUME_BATCH` (``--assume-batch``, ``-p assume_batch``)
``congestion``     :func:`congestion_param`, default
                   :data:`~.congestion.DEFAULT_CONGESTION` (``--congestion``)
``evaluations``    :func:`evaluations_param` (0 = from ``time_limit``)
``shares``         :func:`shares_param`, default :data:`DEFAULT_SHARES`
``devices``        :data:`DEVICES` (data parallelism's and fsdp's replicas)
``overhead_s``     :func:`overhead_param`, default :data:`DEFAULT_OVERHEAD_S`
``bucket_mb``      :data:`DEFAULT_BUCKET_MB` (PyTorch DDP's gradient bucket)
=================  =========================================================

A default that legitimately differs for one algorithm (the MILP's time
limit, fsdp's ``stage``) is declared once, as that algorithm's ``Param``.
The micro-batch count, the pipeline schedule and recomputation are the
pipeline wing's (:mod:`celeritas_cli.pipelining`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from .congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from .limits import BATCH_MAX, COUNT_MAX, TIME_MAX

INT_MAX = 2**63 - 1  # the largest integer parameter (the JSON writer's int64)


@dataclass(frozen=True)
class Param:
    """One algorithm parameter: its type (int, float, bool, str), default,
    help, and the values it accepts: ``choices``, or a range ``min`` <= value
    <= ``max`` (``gt``: strictly above), or a ``check`` returning an error
    message (None when the value is fine).  Float parameters are always
    finite (no nan, no inf).  ``size(graph, value)``, when given, is the
    smallest derived graph (a :class:`~celeritas_cli.transform.size.Size`,
    or None) a value other than the default makes the algorithm build:
    :func:`celeritas_cli.registry.place` refuses it over the derived-graph
    budget before the algorithm runs (``-p microbatches=10000000``).

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
    size: Callable[[Any, Any], Any] | None = None

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
#: the time limit of a search that answers in seconds (``auto``, ``pipeline``); with 0 (no wall clock) their
#: counted budgets are this one's
DEFAULT_TIME_LIMIT = 10.0
#: the time limit of the long solvers (milp, hierarchical); with 0 their counted budgets are this one's
SOLVER_TIME_LIMIT = 60.0
#: the time limit of every other algorithm (heft, fsdp, gpipe, ... declare none; the registry gives them
#: :data:`TIME_LIMIT_CAP`): not a budget, a cap on a run that would not end - gpipe on the zoo's nmt takes over a
#: minute on a loaded 2-core machine, and that is an answer, not a runaway
CAP_TIME_LIMIT = 600.0


def time_limit_param(default: float, help: str) -> Param:
    """The ``time_limit`` parameter of an algorithm that has one: seconds,
    ``0 <= value <= 1e12`` (:data:`~celeritas_cli.model.limits.TIME_MAX`),
    0 = no wall-clock limit (:data:`TIME_LIMIT_RULE`).  An algorithm whose
    function takes it also takes ``deadline`` (the registry's
    ``Algorithm``); the counted budget it derives from the limit
    (iterations, evaluations, deterministic time) is its own and said in
    *help*.  Whoever takes it, the registry stops the call past it
    (:mod:`~celeritas_cli.model.clock`).

    >>> time_limit_param(DEFAULT_TIME_LIMIT, "cap of the whole call").range_text()
    '0..1000000000000.0'
    """
    return Param(float, default, f"{help} (s; {TIME_LIMIT_RULE})", min=0, max=TIME_MAX)


#: the ``time_limit`` the registry gives an algorithm that declares none: it caps the call
#: (:mod:`~celeritas_cli.model.clock`), the algorithm itself never sees it
TIME_LIMIT_CAP = time_limit_param(CAP_TIME_LIMIT, "cap of the whole call, enforced by the registry")

#: ``--seed`` and every algorithm's ``seed`` keyword
SEED = Param(int, 0, "random seed", min=0, max=INT_MAX)
#: the batch of a graph that declares none (``--assume-batch N``, ``-p assume_batch=N``)
ASSUME_BATCH = Param(int, 0, "the batch the graph's costs hold for, when it declares none (meta.batch_size); "
                             "0 = the graph's own", min=0, max=BATCH_MAX)
#: replica devices of data parallelism and fsdp
DEVICES = Param(str, "", "replica devices: empty = all, N = the first N, or ids like gpu0,gpu2")
#: the batch-share rules of data parallelism and fsdp
SHARE_RULES = ("equal", "proportional")
DEFAULT_SHARES = "equal"
#: extra time of a copy of an op whose time is scaled linearly (a split part, a replica, a micro-batch; s)
DEFAULT_OVERHEAD_S = 2.0e-6
#: gradient bucket of data parallelism (MiB): PyTorch DDP's ``bucket_cap_mb`` default
DEFAULT_BUCKET_MB = 25.0
#: how a derived graph writes a collective: ``nccl`` one ``collective.*`` node per rank, costed by the
#: NCCL formulas (:mod:`~celeritas_cli.model.collectives`) on its own stream (simulator rule 6);
#: ``ring`` the explicit point-to-point ring steps (Patarasuk and Yuan), what ``placer run`` executes
COLLECTIVE_FORMS = ("nccl", "ring")
COLLECTIVES = Param(str, COLLECTIVE_FORMS[0], "nccl: each all-reduce one collective per rank, costed as NCCL runs it "
                    "on the servers (ring in a server, hierarchical across, every NIC) on its own stream; ring: "
                    "explicit point-to-point ring steps on the links (k^2 nodes per bucket)",
                    choices=COLLECTIVE_FORMS)


def shares_param(help: str) -> Param:
    """The ``shares`` parameter: one of :data:`SHARE_RULES`, default
    :data:`DEFAULT_SHARES`; *help* says what a share is for the algorithm.

    >>> shares_param("batch shares").choices
    ('equal', 'proportional')
    """
    return Param(str, DEFAULT_SHARES, help, choices=SHARE_RULES)


def evaluations_param(help: str) -> Param:
    """The ``evaluations`` parameter of a search: simulations it may make,
    ``0 <= value <= COUNT_MAX``, 0 = derived from ``time_limit``.

    >>> evaluations_param("simulations").range_text()
    '0..1000000000'
    """
    return Param(int, 0, help, min=0, max=COUNT_MAX)


def overhead_param(help: str) -> Param:
    """The ``overhead_s`` parameter: seconds, default :data:`DEFAULT_OVERHEAD_S`.

    >>> overhead_param("extra time").default
    2e-06
    """
    return Param(float, DEFAULT_OVERHEAD_S, help, min=0, max=TIME_MAX)


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
