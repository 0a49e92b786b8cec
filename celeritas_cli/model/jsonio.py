"""Reading, validating and writing placer's JSON documents.

orjson does the parsing and writing; fastjsonschema (compiled validators, fast
enough for 100k-node graphs) checks every document against the schema files
in ``schemas/``.  ``-`` means stdin/stdout; files are written atomically
(temporary file in the same directory, then :func:`os.replace`), so a failed
run never leaves a partial output file behind.  A path that is not a regular
file (``/dev/null``, a FIFO) is written into directly, never replaced.

JSON has no NaN or Infinity and placer's numbers must fit a double: a document
with ``NaN``, ``Infinity`` or ``1e400`` is rejected with the node and field
named.  One document is at most :func:`max_input_bytes` long (512 MiB, or
``PLACER_MAX_INPUT_MB``), decompressed: a larger plain file is refused before
it is read, a ``*.gz`` file (or stdin) as soon as that many bytes came out,
so a gzip bomb costs at most the cap in memory.  Free-form fields (``meta``, ``params``, extra node fields) may nest at
most :data:`MAX_DEPTH` levels, so whatever placer writes stays serialisable.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import math
import os
import re
import stat
import sys
import tempfile
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson

from ..errors import InvalidInput
from . import limits

SCHEMAS = {
    "placer.graph/v1": "graph.schema.json",
    "placer.cluster/v1": "cluster.schema.json",
    "placer.placement/v1": "placement.schema.json",
    "placer.report/v1": "report.schema.json",
    "placer.run/v1": "run.schema.json",
    "placer.measurements/v1": "measurements.schema.json",
    "placer.comm_samples/v1": "comm_samples.schema.json",
    "placer.compare/v1": "compare_row.schema.json",
}

#: What a document of each kind is called and how a user makes one: the hint when a file that
#: should be one is something else (a torch checkpoint, a Python file, JSON without a schema tag).
MADE_BY = {
    "placer.graph/v1": ("placer graph", "make one from a model with `placer profile --model file.py:Factory "
                                        "-b BATCH -o graph.json` (placer profile --help)"),
    "placer.cluster/v1": ("placer cluster", "name a bundled one (`placer clusters`) or measure one with "
                                            "`placer profile --comm-bench --processes N -o cluster.json`"),
    "placer.placement/v1": ("placer placement", "make one with `placer place GRAPH -o placement.json`"),
    "placer.run/v1": ("placer run report", "make one with `placer run --graph GRAPH -P PLACEMENT --node-times "
                                           "-o report.json`"),
}

#: Deepest nesting accepted in a free-form field (``meta``, ``params``, extra
#: node fields): ample for real metadata, and shallow enough that a document
#: embedding it (a coarse graph, a placement's ``split_graph``) stays within
#: orjson's 254 levels.
MAX_DEPTH = 64


def label_of(path: str | os.PathLike) -> str:
    """The name used for *path* in error messages (``<stdin>`` for ``-``)."""
    return "<stdin>" if str(path) == "-" else str(path)


class TooLarge(InvalidInput):
    """A document longer than :func:`max_input_bytes` (decompressed)."""


_ENV_CAP = "PLACER_MAX_INPUT_MB"
_CHUNK = 1 << 20


def max_input_bytes() -> int:
    """The most bytes placer reads from one document: ``$PLACER_MAX_INPUT_MB``
    megabytes (MiB) when set, else :data:`~.limits.INPUT_BYTES_MAX` (512 MiB).

    Raises
    ------
    InvalidInput
        ``PLACER_MAX_INPUT_MB`` is not a whole number >= 1.

    Example
    -------
    >>> max_input_bytes() == limits.INPUT_BYTES_MAX or _ENV_CAP in os.environ
    True
    """
    text = os.environ.get(_ENV_CAP, "").strip()
    if not text:
        return limits.INPUT_BYTES_MAX
    if not text.isdigit() or not 1 <= int(text) <= 2**33:
        raise InvalidInput(f"{_ENV_CAP}={text!r}: expected a whole number of megabytes (MiB) >= 1")
    return int(text) << 20


def _too_large(label: str, what: str, cap: int) -> TooLarge:
    return TooLarge(f"{label}: {what} more than {cap >> 20} MiB, the most placer reads from one document; "
                    f"set {_ENV_CAP} to a larger number of MiB if the file is meant to be this large")


def _read_capped(fh, label: str, cap: int, what: str) -> bytes:
    """All of *fh*, refused as soon as more than *cap* bytes came out (memory
    stays within the cap plus a few 1 MiB chunks)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = fh.read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > cap:
            raise _too_large(label, what, cap)
        chunks.append(chunk)


def unpack(data: bytes, label: str) -> bytes:
    """*data* as read from a file named *label*: gunzipped for ``*.gz``,
    both within :func:`max_input_bytes` (for bytes that did not come
    through :func:`read_bytes`, e.g. a graph shipped to a Ray worker).

    Raises
    ------
    InvalidInput
        Not valid gzip, or longer than the cap (:class:`TooLarge`).

    Example
    -------
    >>> unpack(gzip.compress(b"{}"), "g.json.gz"), unpack(b"{}", "g.json")
    (b'{}', b'{}')
    """
    cap = max_input_bytes()
    if not label.endswith(".gz"):
        if len(data) > cap:
            raise _too_large(label, "is", cap)
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as gz:
            return _read_capped(gz, label, cap, "decompresses to")
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidInput(f"{label}: not a valid gzip file: {exc}") from None


def read_bytes(path: str | os.PathLike) -> bytes:
    """Read *path* (``-`` = stdin) whole, as bytes; ``*.gz`` files are
    decompressed transparently.  At most :func:`max_input_bytes`: a larger
    plain file is refused before it is read, a gzip file or stdin as soon as
    that much came out.

    Raises
    ------
    InvalidInput
        No such file, a directory, unreadable, not valid gzip, or too large
        (:class:`TooLarge`).
    """
    cap = max_input_bytes()
    if str(path) == "-":
        return _read_capped(sys.stdin.buffer, "<stdin>", cap, "is")
    name = str(path)
    try:
        with open(path, "rb") as fh:
            if not name.endswith(".gz"):
                info = os.fstat(fh.fileno())
                if stat.S_ISREG(info.st_mode) and info.st_size > cap:
                    raise _too_large(name, f"is {info.st_size:,} bytes,", cap)
                return _read_capped(fh, name, cap, "is")
            try:
                with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                    return _read_capped(gz, name, cap, "decompresses to")
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise InvalidInput(f"{name}: not a valid gzip file: {exc}") from None
    except FileNotFoundError:
        raise InvalidInput(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{name}: is a directory, expected a JSON file") from None
    except OSError as exc:
        raise InvalidInput(f"{name}: cannot read: {exc.strerror or exc}") from None


def loads(data: bytes, label: str, expect: str | None = None) -> Any:
    """Parse JSON bytes; a syntax error becomes a one-line :class:`InvalidInput`.

    Data that is no JSON at all (:func:`not_json`: a torch checkpoint, a
    pickle, a Python file) is named as what it is; with *expect*, the schema
    tag of the document the caller wanted, the message says how to make one
    (:data:`MADE_BY`).

    Example
    -------
    >>> loads(b"PK\\x03\\x04...", "model.pt", "placer.graph/v1")
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: model.pt: is not a placer graph file (it is a zip archive, as torch.save \
writes a model or checkpoint); make one from a model with `placer profile --model file.py:Factory -b BATCH -o \
graph.json` (placer profile --help)
    """
    if not data.strip():
        raise InvalidInput(f"{label}: empty input, expected a JSON document")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        where = _non_finite(data)
        if where:
            raise InvalidInput(f"{label}: {where}") from None
        kind = not_json(data)
        if kind is None:
            raise InvalidInput(f"{label}: not valid JSON: {exc}") from None
        if data.startswith(b"\x1f\x8b"):
            raise InvalidInput(f"{label}: is {kind}") from None
        if expect in MADE_BY:
            what, how = MADE_BY[expect]
            raise InvalidInput(f"{label}: is not a {what} file (it is {kind}); {how}") from None
        raise InvalidInput(f"{label}: is not a JSON document (it is {kind})") from None


def not_json(data: bytes) -> str | None:
    """What *data* is when it is no JSON document at all (a binary file, or
    text that does not start like JSON); None when it looks like JSON (a
    syntax error inside is then worth quoting).

    >>> not_json(b"PK\\x03\\x04"), not_json(b"\\x80\\x02}q"), not_json(b"import torch"), not_json(b'{"a": ')
    ('a zip archive, as torch.save writes a model or checkpoint', 'a Python pickle (an older torch.save \
checkpoint)', 'text, not JSON', None)
    """
    head = data[:8192]
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive, as torch.save writes a model or checkpoint"
    if head.startswith(b"\x80") and len(head) > 1 and head[1] <= 5:
        return "a Python pickle (an older torch.save checkpoint)"
    if head.startswith(b"\x1f\x8b"):
        return "gzip-compressed: name it *.gz (placer decompresses those)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) == len(head) or exc.start < len(head) - 3:   # not a character cut by the 8 KiB window
            return "binary data"
        text = head[:exc.start].decode("utf-8")
    if "\x00" in text:
        return "binary data"
    first = text.lstrip("\ufeff \t\r\n")[:1]
    return None if first in ("{", "[", "") else "text, not JSON"


class _NonFinite:
    """Stands for a ``NaN`` / ``Infinity`` / ``1e400`` literal while locating it."""

    def __init__(self, text: str) -> None:
        self.text = text


def _non_finite(data: bytes) -> str | None:
    """Where orjson stopped at a number that is not finite (``NaN``,
    ``Infinity``, ``1e400``), ``"node 'a' field compute_s: NaN is not a
    finite number ..."``; None when that was not the problem."""

    def as_float(text: str):
        value = float(text)
        return value if math.isfinite(value) else _NonFinite(text)

    try:
        doc = json.loads(data, parse_constant=_NonFinite, parse_float=as_float)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, list]] = [(doc, [])]
    while stack:
        obj, steps = stack.pop()
        if isinstance(obj, _NonFinite):
            return (f"{_describe(doc, steps)}: {obj.text} is not a finite number (JSON has no NaN or Infinity, "
                    f"and numbers must fit a double)")
        if isinstance(obj, dict):
            stack.extend((v, steps + [k]) for k, v in reversed(list(obj.items())))
        elif isinstance(obj, list):
            stack.extend((v, steps + [i]) for i, v in reversed(list(enumerate(obj))))
    return None


def depth(obj: Any) -> int:
    """Nesting depth of *obj* (a scalar is 0, ``{}`` and ``[]`` are 1)."""
    best = 0
    stack = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            d += 1
            best = max(best, d)
            if d > MAX_DEPTH:  # deep enough to reject; no need to walk further
                return d
            stack.extend((v, d) for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, (dict, list)))
    return best


def check_depth(obj: Any, label: str, where: str) -> None:
    """Reject *obj* (a free-form field) nested deeper than :data:`MAX_DEPTH`.

    Raises
    ------
    InvalidInput
        ``"<label>: <where>: nested more than 64 levels deep"``.
    """
    if isinstance(obj, (dict, list)) and depth(obj) > MAX_DEPTH:
        raise InvalidInput(f"{label}: {where}: nested more than {MAX_DEPTH} levels deep")


def read_json(path: str | os.PathLike, expect: str | None = None) -> Any:
    """Read and parse one JSON document from *path* (``-`` = stdin); *expect*:
    the schema tag of the document wanted, for the hint when it is none
    (:func:`loads`)."""
    return loads(read_bytes(path), label_of(path), expect)


@functools.lru_cache(maxsize=None)
def _validator(schema_tag: str):
    name = SCHEMAS[schema_tag]
    text = resources.files("celeritas_cli").joinpath("schemas").joinpath(name).read_bytes()
    return fastjsonschema.compile(orjson.loads(text))


_PATH = re.compile(r"^data((?:\.[^\s.[]+|\[\d+\])*)")


_KINDS = {"nodes": "node", "edges": "edge", "devices": "device", "pairs": "link pair", "samples": "sample"}


def _describe(doc: Any, steps: list) -> str:
    """``["nodes", 3, "compute_s"]`` -> ``"node 'mm_3' field compute_s"``
    (items of nodes/edges/devices/pairs by their id where known)."""
    where: list[str] = []
    obj: Any = doc
    k = 0
    while k < len(steps):
        step = steps[k]
        if isinstance(step, str) and step in _KINDS and k + 1 < len(steps) and isinstance(steps[k + 1], int):
            idx = steps[k + 1]
            try:
                item = obj[step][idx]
            except (KeyError, IndexError, TypeError):
                item = None
            kind = _KINDS[step]
            if isinstance(item, dict) and kind == "edge" and "src" in item and "dst" in item:
                where.append(f"edge {item.get('src')}->{item.get('dst')} (#{idx})")
            elif isinstance(item, dict) and isinstance(item.get("id"), str):
                where.append(f"{kind} '{item['id']}'")
            else:
                where.append(f"{kind} #{idx}")
            obj = item
            k += 2
            continue
        try:
            obj = obj[step]
        except (KeyError, IndexError, TypeError):
            obj = None
        if where and where[-1].startswith("field "):
            where[-1] += f".{step}" if isinstance(step, str) else f"[{step}]"
        else:
            where.append(f"field {step}" if isinstance(step, str) else f"[{step}]")
        k += 1
    return " ".join(where) if where else "document"


def _locate(doc: dict, message: str) -> str:
    """Turn fastjsonschema's ``data.nodes[3].compute_s must ...`` into
    ``node 'mm_3' field compute_s: must ...`` where an id is known."""
    m = _PATH.match(message)
    if not m:
        return message
    rest = message[m.end():].strip()
    parts = re.findall(r"\.([^\s.[]+)|\[(\d+)\]", m.group(1))
    steps: list[str | int] = [p if p else int(i) for p, i in parts]
    place = _describe(doc, steps)
    missing = re.fullmatch(r"must contain \[(.*)\] properties", rest)
    if missing:
        fields = [f.strip().strip("'\"") for f in missing.group(1).split(",")]
        rest = "missing field " + ", ".join(fields)
    bound = re.fullmatch(r"must be (smaller|bigger) than (or equal to )?(\S+)", rest)
    if bound:
        word = ("at most" if bound.group(2) else "below") if bound.group(1) == "smaller" else (
            "at least" if bound.group(2) else "above")
        rest = f"must be {word} {limits.WORDS.get(bound.group(3), bound.group(3))}"
    return f"{place}: {rest}"


def validate(doc: Any, schema_tag: str, label: str) -> dict:
    """Check *doc* against the JSON Schema for *schema_tag*.

    Raises
    ------
    InvalidInput
        One line naming *label*, the node/edge/field and the problem.
    """
    if not isinstance(doc, dict):
        raise InvalidInput(f"{label}: expected a JSON object with \"schema\": \"{schema_tag}\"")
    tag = doc.get("schema")
    if tag != schema_tag:
        if isinstance(tag, str) and tag in SCHEMAS:  # a list or object tag is unhashable
            raise InvalidInput(f"{label}: is a {tag} document, expected {schema_tag}")
        hint = f": not a {MADE_BY[schema_tag][0]} file; {MADE_BY[schema_tag][1]}" if tag is None and \
            schema_tag in MADE_BY else ""
        raise InvalidInput(f"{label}: field schema is {tag!r}, expected \"{schema_tag}\"{hint}")
    try:
        _validator(schema_tag)(doc)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise InvalidInput(f"{label}: {_locate(doc, exc.message)}") from None
    return doc


#: a document larger than this, indented, is written without indentation (a placement of a derived graph: a
#: tensor-parallel plan's 12,000 nodes of GPT 6.7B over 1,024 GPUs are 1.07 MiB indented, 0.83 MiB compact)
COMPACT_OVER_BYTES = 512 * 1024


def dumps(doc: Any) -> bytes:
    """Serialise *doc* deterministically (sorted keys only where dicts say so),
    indented by two spaces, or compact (one line) when that would be over
    :data:`COMPACT_OVER_BYTES` - what a person reads is small, what a
    machine reads stays small.

    >>> dumps({"a": [1]}).count(b"\\n"), len(dumps({"a": "x" * COMPACT_OVER_BYTES}).splitlines())
    (5, 1)
    """
    out = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if len(out) > COMPACT_OVER_BYTES:
        out = orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
    return out


def _detach_stdout() -> None:
    """After a failed write to stdout, point file descriptor 1 at /dev/null so
    the interpreter's final flush of what is still buffered fails silently."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def _write_stdout(data: bytes) -> None:
    out = sys.stdout.buffer
    try:
        out.write(data)
        out.flush()
    except BrokenPipeError:  # the reader went away (`placer ... | head`): the CLI exits quietly
        _detach_stdout()
        raise
    except OSError as exc:  # e.g. `> /dev/full`
        _detach_stdout()
        raise InvalidInput(f"<stdout>: cannot write the result: {exc.strerror or exc}") from None


def write_bytes(data: bytes, path: str | os.PathLike | None) -> None:
    """Write *data* to *path* atomically (gzip-compressed for ``*.gz``), or
    to stdout for ``-``/``None``.

    A path that exists and is not a regular file (``/dev/null``, a FIFO) is
    written into directly: replacing it would destroy the device node.

    Raises
    ------
    InvalidInput
        Empty name, a directory, a missing directory, or the write failed
        (permissions, a full disk); nothing is left behind.
    """
    if path is None or str(path) == "-":
        _write_stdout(data)
        return
    name = str(path)
    if not name.strip():
        raise InvalidInput("output file name is empty (use - for stdout)")
    target = Path(name)
    if target.is_dir():
        raise InvalidInput(f"{name}: is a directory; give a file name")
    if target.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: byte-identical output for identical input
    if target.exists() and not target.is_file():  # a device, FIFO or socket: write into it
        try:
            with open(target, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise InvalidInput(f"{name}: cannot write: {exc.strerror or exc}") from None
        return
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidInput(f"{name}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InvalidInput(f"{name}: cannot create a file in {directory}: {exc.strerror or exc}") from None
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InvalidInput(f"{name}: cannot write: {exc.strerror or exc}") from None
        raise


def write_json(doc: Any, path: str | os.PathLike | None) -> None:
    """Serialise *doc* and write it atomically to *path* (``-`` = stdout)."""
    write_bytes(dumps(doc), path)
