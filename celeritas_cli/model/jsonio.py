"""Reading, validating and writing placer's JSON documents.

orjson does the parsing and writing; fastjsonschema (compiled validators, fast
enough for 100k-node graphs) checks every document against the schema files
in ``schemas/``.  ``-`` means stdin/stdout; files are written atomically
(temporary file in the same directory, then :func:`os.replace`), so a failed
run never leaves a partial output file behind.
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson

from ..errors import InvalidInput

SCHEMAS = {
    "placer.graph/v1": "graph.schema.json",
    "placer.cluster/v1": "cluster.schema.json",
    "placer.placement/v1": "placement.schema.json",
    "placer.report/v1": "report.schema.json",
    "placer.run/v1": "run.schema.json",
}


def label_of(path: str | os.PathLike) -> str:
    """The name used for *path* in error messages (``<stdin>`` for ``-``)."""
    return "<stdin>" if str(path) == "-" else str(path)


def read_bytes(path: str | os.PathLike) -> bytes:
    """Read *path* (``-`` = stdin) whole, as bytes; ``*.gz`` files are
    decompressed transparently."""
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        data = Path(path).read_bytes()
        if str(path).endswith(".gz"):
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError) as exc:
                raise InvalidInput(f"{path}: not a valid gzip file: {exc}") from None
        return data
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a directory, expected a JSON file") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None


def loads(data: bytes, label: str) -> Any:
    """Parse JSON bytes; a syntax error becomes a one-line :class:`InvalidInput`."""
    if not data.strip():
        raise InvalidInput(f"{label}: empty input, expected a JSON document")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{label}: not valid JSON: {exc}") from None


def read_json(path: str | os.PathLike) -> Any:
    """Read and parse one JSON document from *path* (``-`` = stdin)."""
    return loads(read_bytes(path), label_of(path))


@functools.lru_cache(maxsize=None)
def _validator(schema_tag: str):
    name = SCHEMAS[schema_tag]
    text = resources.files("celeritas_cli").joinpath("schemas").joinpath(name).read_bytes()
    return fastjsonschema.compile(orjson.loads(text))


_PATH = re.compile(r"^data((?:\.[A-Za-z_][\w]*|\[\d+\])*)")


def _locate(doc: dict, message: str) -> str:
    """Turn fastjsonschema's ``data.nodes[3].compute_s must ...`` into
    ``node 'mm_3' field compute_s: must ...`` where an id is known."""
    m = _PATH.match(message)
    if not m:
        return message
    rest = message[m.end():].strip()
    parts = re.findall(r"\.([A-Za-z_]\w*)|\[(\d+)\]", m.group(1))
    steps: list[str | int] = [p if p else int(i) for p, i in parts]
    where = []
    obj: Any = doc
    k = 0
    while k < len(steps):
        step = steps[k]
        if (
            isinstance(step, str)
            and step in ("nodes", "edges", "devices", "pairs")
            and k + 1 < len(steps)
            and isinstance(steps[k + 1], int)
        ):
            idx = steps[k + 1]
            try:
                item = obj[step][idx]
            except (KeyError, IndexError, TypeError):
                item = None
            kind = {"nodes": "node", "edges": "edge", "devices": "device", "pairs": "link pair"}[step]
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
        where.append(f"field {step}" if isinstance(step, str) else f"[{step}]")
        k += 1
    place = " ".join(where) if where else "document"
    missing = re.fullmatch(r"must contain \[(.*)\] properties", rest)
    if missing:
        fields = [f.strip().strip("'\"") for f in missing.group(1).split(",")]
        rest = "missing field " + ", ".join(fields)
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
        if tag in SCHEMAS:
            raise InvalidInput(f"{label}: is a {tag} document, expected {schema_tag}")
        raise InvalidInput(f"{label}: field schema is {tag!r}, expected \"{schema_tag}\"")
    try:
        _validator(schema_tag)(doc)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise InvalidInput(f"{label}: {_locate(doc, exc.message)}") from None
    return doc


def dumps(doc: Any) -> bytes:
    """Serialise *doc* deterministically (sorted keys only where dicts say so)."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def write_bytes(data: bytes, path: str | os.PathLike | None) -> None:
    """Write *data* to *path* atomically (gzip-compressed for ``*.gz``), or
    to stdout for ``-``/``None``."""
    if path is None or str(path) == "-":
        out = sys.stdout.buffer
        out.write(data)
        out.flush()
        return
    target = Path(path)
    if target.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: byte-identical output for identical input
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidInput(f"{path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(doc: Any, path: str | os.PathLike | None) -> None:
    """Serialise *doc* and write it atomically to *path* (``-`` = stdout)."""
    write_bytes(dumps(doc), path)
