"""Messages for people: everything here goes to stderr, never stdout (stdout
carries only the JSON document, so pipes keep working).  Library modules and
the CLI both use it; it imports nothing of the package."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import Iterator

# progress chatter on (placer place) or off (cells of placer compare without -v)
_CHATTY: contextvars.ContextVar[bool] = contextvars.ContextVar("placer_chatty", default=True)


def warn(msg: str) -> None:
    """One line to stderr."""
    print(msg, file=sys.stderr)


def stderr_console():
    """A rich console on stderr (progress bars, tables for people)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def chatty() -> bool:
    """Whether an algorithm should print its progress (solver incumbents,
    progress bars, a library's load banner): true, except inside
    :func:`quiet`.  Warnings that qualify a result are printed either way."""
    return _CHATTY.get()


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """Within the block, :func:`chatty` is false (when *on*).  ``placer
    compare`` runs its cells so unless ``-v``: many cells' chatter would
    bury the progress bar and the warnings.

    Example
    -------
    >>> with quiet():
    ...     chatty()
    False
    """
    token = _CHATTY.set(not on)
    try:
        yield
    finally:
        _CHATTY.reset(token)
