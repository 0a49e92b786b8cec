"""Messages for people: everything here goes to stderr, never stdout (stdout
carries only the JSON document, so pipes keep working).  Library modules and
the CLI both use it; it imports nothing of the package.

:func:`stdout_to_stderr` keeps code we do not control (C libraries such as
METIS, a user's model) from writing into our stdout.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import os
import sys
from typing import Iterator

# progress chatter on (placer place) or off (cells of placer compare without -v)
_CHATTY: contextvars.ContextVar[bool] = contextvars.ContextVar("placer_chatty", default=True)


def warn(msg: str) -> None:
    """One line to stderr."""
    print(msg, file=sys.stderr)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def stderr_console():
    """A rich console on stderr (progress bars, tables for people).

    On a terminal rich fits the terminal's width; otherwise (a log file, a
    pipe, CI) lines are never hard-wrapped, so ``grep`` finds whole messages.
    """
    from rich.console import Console

    if _stderr_is_terminal():
        return Console(stderr=True, highlight=False)
    return Console(stderr=True, highlight=False, soft_wrap=True, width=200)


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


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # no process-wide symbol table here (Windows)
        return None


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (``printf`` output of C extensions)."""
    try:
        _libc().fflush(None)
    except (OSError, AttributeError):  # no libc, or no fflush in it
        pass


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout inside the block to stderr instead:
    Python's ``print`` and C code writing to file descriptor 1 alike (METIS'
    ``***Cannot bisect ...``, a user's model printing while it is traced).

    Example
    -------
    >>> with stdout_to_stderr():
    ...     print("to stderr")
    """
    with contextlib.redirect_stdout(sys.stderr):
        try:
            sys.__stdout__.flush()
        except (AttributeError, ValueError, OSError):
            pass
        _flush_c_stdio()
        try:
            saved = os.dup(1)
        except OSError:  # fd 1 is closed: nothing of ours to protect
            yield
            return
        try:
            os.dup2(2, 1)
        except OSError:
            os.close(saved)
            yield
            return
        try:
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)
