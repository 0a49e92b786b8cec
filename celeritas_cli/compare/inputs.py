"""What a comparison runs over: the graph files found under the given paths
and the algorithms taken by default (every registered one whose optional
extra is installed, resolved from the registry at run time)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
from pathlib import Path
from typing import Iterable

import orjson

from .. import registry
from ..errors import InvalidInput
from ..model.jsonio import TooLarge, read_bytes
from .rows import GRAPH_SCHEMA, natural_key

# extra name -> module whose presence makes the extra importable
_EXTRA_MODULES = {"plot": "matplotlib", "torch": "torch", "ray": "ray", "test": "pytest"}

# registered, but re-evaluate an existing placement rather than make one
NOT_BY_DEFAULT = ("given",)


def extra_available(extra: str | None) -> bool:
    """True when the optional dependency group *extra* can be imported.

    Example
    -------
    >>> extra_available(None)
    True
    """
    if not extra:
        return True
    module = _EXTRA_MODULES.get(extra, extra)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def default_algorithms() -> list[str]:
    """Every registered algorithm whose optional extra is importable, sorted
    (resolved at run time: algorithms added later take part automatically),
    except ``given``, which needs a placement file (``--algos given -p
    given:file=P.json`` still works)."""
    return [e.name for e in registry.entries() if extra_available(e.extra) and e.name not in NOT_BY_DEFAULT]


_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"]*)"')


def _schema_of(path: Path) -> str | None:
    """The document's ``"schema"`` tag, read from its first 64 KiB (our
    writers put it first) or, failing that, from the whole file; ``*.gz``
    files are decompressed (within the size cap: a file over it is an error,
    not skipped)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            head = fh.read(65536)
        m = _SCHEMA_RE.search(head)
        if m:
            return m.group(1).decode("utf-8", "replace")
        doc = orjson.loads(read_bytes(path))
    except TooLarge:
        raise
    except (orjson.JSONDecodeError, OSError, EOFError, InvalidInput):
        return None
    return doc.get("schema") if isinstance(doc, dict) else None


def discover_graphs(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Expand *paths* into graph files: a file is taken as given; a
    directory is scanned recursively for ``*.json`` and ``*.json.gz``
    (read transparently by :func:`~celeritas_cli.model.jsonio.read_bytes`) whose ``"schema"`` is
    ``placer.graph/v1`` (clusters, placements, reports are skipped), sorted
    by path.  Duplicates are dropped, first occurrence kept.

    Raises
    ------
    InvalidInput
        A path that does not exist, or a directory with no graph file.
    """
    out: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = [f for f in sorted([*p.rglob("*.json"), *p.rglob("*.json.gz")], key=lambda f: natural_key(str(f)))
                     if f.is_file() and _schema_of(f) == GRAPH_SCHEMA]
            if not found:
                raise InvalidInput(f"{raw}: directory has no {GRAPH_SCHEMA} *.json files")
            files = [str(f) for f in found]
        elif p.exists():
            files = [str(p)]
        else:
            raise InvalidInput(f"{raw}: no such file or directory")
        for f in files:
            key = os.path.normpath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
