"""What a comparison runs over: the graph files found under the given paths
and the algorithms - by default every registered one whose optional extra is
installed, resolved from the registry at run time - or a named group of them
(:data:`ALGORITHM_GROUPS`, ``--algos placement``)."""

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


#: the parallelism planners: they derive a graph (replicas, micro-batches, stages, shards) and place it;
#: names not registered (yet) are left out when a group is expanded
PARALLELISM_PLANNERS = ("data-parallel", "pipeline", "gpipe", "pipedream", "alpa-stages", "fsdp", "megatron", "3d")

#: ``--algos`` group name -> what it holds (the help text); :func:`algorithm_group` expands it
ALGORITHM_GROUPS = {
    "default": "what runs without --algos: every algorithm whose extra is installed, but given",
    "all": "the same, today",
    "placement": "the operator placers (papers, baselines, auto): all but the parallelism planners",
    "pipelines": "the parallelism planners (data-parallel, fsdp, pipeline, gpipe, pipedream, alpa-stages) and auto",
}


def algorithm_group(name: str) -> list[str]:
    """The registered algorithms of the ``--algos`` group *name*
    (:data:`ALGORITHM_GROUPS`), in registry order.

    Raises
    ------
    InvalidInput
        An unknown group.

    Example
    -------
    >>> "heft" in algorithm_group("placement"), "data-parallel" in algorithm_group("placement")
    (True, False)
    >>> algorithm_group("pipelines")[:4]
    ['3d', 'alpa-stages', 'auto', 'data-parallel']
    """
    if name not in ALGORITHM_GROUPS:
        raise InvalidInput(f"unknown algorithm group '{name}' (groups: {', '.join(ALGORITHM_GROUPS)})")
    runnable = default_algorithms()
    if name == "placement":
        return [a for a in runnable if a not in PARALLELISM_PLANNERS]
    if name == "pipelines":
        return [a for a in runnable if a in PARALLELISM_PLANNERS or a == "auto"]
    return runnable


def expand_algorithms(items: Iterable[str]) -> list[str]:
    """Algorithm names and group names (:data:`ALGORITHM_GROUPS`) ->
    algorithm names, groups expanded in place, duplicates dropped (first
    kept).  A name that is neither stays as it is (the caller says it is
    unknown).

    Example
    -------
    >>> expand_algorithms(["heft", "placement"])[:2]
    ['heft', 'adjusting']
    """
    out: list[str] = []
    for item in items:
        out.extend(algorithm_group(item) if item in ALGORITHM_GROUPS and item not in registry.names() else [item])
    return list(dict.fromkeys(out))


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
