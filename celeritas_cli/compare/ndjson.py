"""Result rows as NDJSON (``--format json``): one ``placer.compare/v1`` row
per line, written as each cell finishes so that a killed run keeps what it
finished, and read back by ``--resume``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson

from ..errors import InvalidInput
from ..log import warn
from ..model.jsonio import label_of, read_bytes, validate
from .rows import ROW_SCHEMA, cell_key


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a previous NDJSON output (``--format json``), each checked
    field by field against ``schemas/compare_row.schema.json`` like any
    input document.  A truncated last line (a killed run) is ignored; other
    bad lines are errors; a missing file is an empty run (a script may
    always pass ``--resume``).  When a cell has several rows (a resumed run
    with ``--retry-failed`` appends the new row after the old one), the
    last one stands.

    Raises
    ------
    InvalidInput
        An unreadable file, or a line that is not a valid ``placer.compare/v1``
        row: ``"FILE: line 3: field seed: must be integer"``.

    Example
    -------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".ndjson") as fh:
    ...     _ = fh.write('{"schema": "placer.compare/v1", "graph": "g", "graph_file": "g.json", "cluster": "c", '
    ...                  '"algorithm": "heft", "status": "OK", "makespan_s": "fast"}\\n')
    ...     _ = fh.flush()
    ...     read_rows(fh.name)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    celeritas_cli.errors.InvalidInput: ...ndjson: line 1: field makespan_s: must be number or null
    """
    if str(path) != "-" and not os.path.lexists(path):  # the first run of a script that always resumes
        warn(f"placer: {path} does not exist yet, nothing to resume: running every cell")
        return []
    lines = read_bytes(path).split(b"\n")
    label = label_of(path)
    rows: dict[tuple, dict] = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            if i == len(lines) or (i == len(lines) - 1 and not lines[-1].strip()):
                continue  # the partial line a killed run may leave
            raise InvalidInput(f"{label}: line {i} is not JSON (expected one {ROW_SCHEMA} row per line)") from None
        validate(row, ROW_SCHEMA, f"{label}: line {i}")
        key = cell_key(row)
        rows.pop(key, None)  # a later row of the same cell replaces it (and takes its place in file order)
        rows[key] = row
    return list(rows.values())


def row_line(row: dict) -> bytes:
    """One NDJSON line (private ``_`` fields dropped).

    Example
    -------
    >>> row_line({"schema": "placer.compare/v1", "_placement": {}})
    b'{"schema":"placer.compare/v1"}\\n'
    """
    return orjson.dumps({k: v for k, v in row.items() if not k.startswith("_")},
                        option=orjson.OPT_APPEND_NEWLINE)


def drop_partial_line(path: str) -> None:
    """Cut a trailing line without newline (what a killed writer leaves)."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


class NdjsonStream:
    """NDJSON output written row by row and flushed (so a killed run keeps
    its rows).  ``output`` ``-`` is stdout; when it is the same file as
    ``resume`` the new rows are appended to it (after cutting a partial
    last line), otherwise the file is replaced.

    Raises
    ------
    InvalidInput
        The output's directory does not exist.
    """

    def __init__(self, output: str, resume: str | None = None):
        self.output = output
        self.to_stdout = output == "-"
        self.same_as_resume = bool(resume) and not self.to_stdout and os.path.exists(output) \
            and os.path.samefile(output, resume)
        self.written = 0
        if self.to_stdout:
            self.fh = sys.stdout.buffer
        else:
            directory = Path(output).parent
            if str(directory) and not directory.is_dir():
                raise InvalidInput(f"{output}: directory {directory} does not exist")
            if self.same_as_resume:
                drop_partial_line(output)
            self.fh = open(output, "ab" if self.same_as_resume else "wb")

    def write(self, row: dict) -> None:
        self.fh.write(row_line(row))
        self.fh.flush()
        self.written += 1

    def close(self) -> None:
        if not self.to_stdout and not self.fh.closed:
            self.fh.close()
