"""Messages for people: everything here goes to stderr, never stdout (stdout
carries only the JSON document, so pipes keep working).  Library modules and
the CLI both use it; it imports nothing of the package.

:class:`Progress` shows long work (``placer compare``'s cells, ``auto``'s
search): a rich bar on a terminal, plain lines when stderr is a pipe or a
file, nothing inside :func:`quiet` (``-q``).

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


def console(*, stderr: bool = False, width: int | None = None, **kw):
    """The rich console every table and line for people goes through.

    Markup is off: a string is printed as it reads, so a graph name, device
    id or file name such as ``"g[/x]"`` is text, never a rich tag (rich would
    raise ``MarkupError`` on it, or swallow ``"[b]"`` as a style).  Styles
    are given explicitly (``style=``, :class:`rich.text.Text`).  Highlighting
    is off too (no colouring of numbers in names).  *kw* goes to
    :class:`rich.console.Console` (``file=``, ``soft_wrap=`` ...).

    Example
    -------
    >>> import io
    >>> buf = io.StringIO()
    >>> console(file=buf, width=40).print("graph g[/x] on [b]c0")
    >>> buf.getvalue()
    'graph g[/x] on [b]c0\\n'
    """
    from rich.console import Console

    return Console(stderr=stderr, width=width, markup=False, highlight=False, **kw)


def stderr_console():
    """A rich console on stderr (progress bars, tables for people), markup
    off like every console of :func:`console`.

    On a terminal rich fits the terminal's width; otherwise (a log file, a
    pipe, CI) lines are never hard-wrapped, so ``grep`` finds whole messages.
    """
    if _stderr_is_terminal():
        return console(stderr=True)
    return console(stderr=True, soft_wrap=True, width=200)


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


class Progress:
    """Progress of long work on stderr, in one of three modes: ``"bar"`` (a
    rich progress bar; stderr is a terminal), ``"lines"`` (plain lines;
    stderr is a pipe or a log file) or ``"off"`` (*enabled* false, or inside
    :func:`quiet`).  Use it as a context manager.

    :meth:`update` moves the bar (nothing in the other modes); :meth:`line`
    prints a progress line (above the bar, or plain; nothing when off);
    :meth:`note` prints a line in every mode (a failure, a warning).  No
    refresh thread runs (``placer compare`` forks its workers while the bar
    is up): the bar is redrawn on each call.

    Example
    -------
    >>> with Progress("cells", total=2, enabled=False) as bar:
    ...     bar.update(advance=1); bar.line("not shown"); bar.mode
    'off'
    """

    def __init__(self, description: str, total: float | None = None, *, enabled: bool = True,
                 mode: str | None = None):
        if mode is None:
            mode = "off" if not (enabled and chatty()) else ("bar" if _stderr_is_terminal() else "lines")
        if mode not in ("bar", "lines", "off"):
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode = mode
        self.description = description
        self.total = total
        self._bar = None
        self._task = None

    def __enter__(self) -> "Progress":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self.mode != "bar" or self._bar is not None:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("{task.description}", style="progress.description", markup=False), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=stderr_console(),
                                 auto_refresh=False, transient=False)
        self._bar.start()
        self._task = self._bar.add_task(self.description, total=self.total)
        self._bar.refresh()

    def update(self, *, completed: float | None = None, advance: float = 0, total: float | None = None,
               description: str | None = None) -> None:
        """Move the bar: *completed* (absolute) or *advance*, a new *total*
        or *description* (shown left of the bar)."""
        if self._bar is None:
            return
        fields: dict = {}
        if completed is not None:
            fields["completed"] = completed
        if total is not None:
            fields["total"] = total
        if description is not None:
            fields["description"] = description
        if advance:
            fields["advance"] = advance
        self._bar.update(self._task, **fields)
        self._bar.refresh()

    def line(self, msg: str) -> None:
        """A progress line: above the bar, or plain on stderr; nothing when off."""
        if self.mode != "off":
            self.note(msg)

    def note(self, msg: str) -> None:
        """A line in every mode (above the bar when there is one), never
        hard-wrapped: stderr is often a log file that people grep."""
        if self._bar is not None:
            self._bar.console.print(msg, markup=False, highlight=False, soft_wrap=True)
        else:
            warn(msg)

    def stop(self, description: str | None = None) -> None:
        if self._bar is not None:
            self.update(description=description)
            self._bar.stop()
            self._bar = None


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # no process-wide symbol table here (Windows)
        return None


def flush_c_stdio() -> None:
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
        flush_c_stdio()
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
            flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)
