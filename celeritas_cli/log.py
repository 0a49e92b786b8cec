"""Messages for people: everything here goes to stderr, never stdout (stdout
carries only the JSON document, so pipes keep working).  Library modules and
the CLI both use it; it imports nothing of the package."""

from __future__ import annotations

import sys


def warn(msg: str) -> None:
    """One line to stderr."""
    print(msg, file=sys.stderr)


def stderr_console():
    """A rich console on stderr (progress bars, tables for people)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)
