"""The congestion rules: how transfers share the links of a cluster.

One definition for every layer: the simulator (:mod:`celeritas_cli.sim.links`,
which re-exports these names), the algorithms' ``congestion`` parameter
(:func:`celeritas_cli.registry.congestion_param`) and the ``--congestion``
options of the commands.  What each rule means is in docs/design.md, "The
simulator (the judge)", rule 3, and in :mod:`celeritas_cli.sim.links`:

* ``channel`` (the default): one transfer at a time per directed channel
  ``a->b`` (Moirai Eq. 8, Celeritas 6.1);
* ``port``: one per sender uplink and one per receiver downlink (Moirai's
  released code);
* ``none``: transfers overlap freely (the classic HEFT model).

Example
-------
>>> DEFAULT_CONGESTION, CONGESTION_RULES
('channel', ('channel', 'port', 'none'))
>>> check_congestion("port")
'port'
"""

from __future__ import annotations

from ..errors import InvalidInput

#: the congestion rules, default first
CONGESTION_RULES = ("channel", "port", "none")
#: the rule every signature, parameter and option defaults to
DEFAULT_CONGESTION = "channel"


def check_congestion(rule: str, what: str = "congestion rule") -> str:
    """Return *rule* if it is a congestion rule, else raise
    :class:`~celeritas_cli.errors.InvalidInput` naming *what*.

    >>> check_congestion("bus")
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: unknown congestion rule 'bus' (use channel, port, none)
    """
    if rule not in CONGESTION_RULES:
        raise InvalidInput(f"unknown {what} '{rule}' (use {', '.join(CONGESTION_RULES)})")
    return rule
