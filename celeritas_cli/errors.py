"""Domain exceptions.

Every error the library raises on bad input or an impossible request is a
:class:`PlacerError`.  The CLI converts them, in one place, into a one-line
message and exit code 1 (see :mod:`celeritas_cli.cli`).
"""

from __future__ import annotations


class PlacerError(Exception):
    """Base class of every error placer reports to the user."""


class InvalidInput(PlacerError):
    """A graph, cluster, placement or option that breaks the design card's rules."""


class CycleError(InvalidInput):
    """The graph has a cycle; the message names one."""


class ColocationError(InvalidInput):
    """A placement splits a colocation group across devices."""


class Infeasible(PlacerError):
    """No placement satisfies the constraints (for example memory)."""


class TimeLimit(PlacerError):
    """An algorithm was stopped at its time limit before it had a plan
    (:mod:`celeritas_cli.model.clock`)."""


class SolverError(PlacerError):
    """An external solver failed or gave no usable answer."""


class MissingDependency(PlacerError):
    """An optional extra (torch, ray, matplotlib, ...) is needed but not installed."""
