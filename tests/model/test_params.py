"""Every user-settable parameter that algorithms or the CLI share is declared
once, in model/params.py, with its name, type, range and default (issue 32,
item 2; scikit-learn's ``_parameter_constraints``).

The source of the package is searched for each shared parameter's default
literal: it is declared in one place; every algorithm's ``Param`` of a
shared name is the shared declaration (``registry.signature_problems``,
checked for every algorithm in tests/algorithms/test_all_algorithms.py, and
here by identity where the declaration is an object); the CLI's flags read
the declarations.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import celeritas_cli
from celeritas_cli import registry
from celeritas_cli.cli import common
from celeritas_cli.model import params

PKG = Path(celeritas_cli.__file__).resolve().parent
SOURCES = {str(p.relative_to(PKG)): p.read_text() for p in sorted(PKG.rglob("*.py"))}

#: each shared default as a declaration in the source (a constant or a Param holding the literal), and the one
#: file it may be in
DECLARED = {
    "time_limit of the searches (10 s)": (r"\b\w*TIME_LIMIT\w*\s*=\s*10(\.0)?\b", "model/params.py"),
    "time_limit of the long solvers (60 s)": (r"\b\w*TIME_LIMIT\w*\s*=\s*60(\.0)?\b", "model/params.py"),
    "time_limit of the registry's cap (600 s)": (r"\b\w*TIME_LIMIT\w*\s*=\s*600(\.0)?\b", "model/params.py"),
    "bucket_mb (25 MiB)": (r"\b\w*BUCKET_MB\s*=\s*25(\.0)?\b", "model/params.py"),
    "overhead_s (2e-6 s)": (r"\b\w*OVERHEAD_S\s*=\s*2(\.0)?e-0?6\b", "model/params.py"),
    "shares ('equal')": (r"\b\w*SHARES\s*=\s*\"equal\"", "model/params.py"),
    "assume_batch": (r"\bASSUME_BATCH\s*=\s*Param\(", "model/params.py"),
    "devices": (r"\bDEVICES\s*=\s*Param\(", "model/params.py"),
    "seed": (r"\bSEED\s*=\s*Param\(", "model/params.py"),
    "congestion ('channel')": (r"\bDEFAULT_CONGESTION\s*=", "model/congestion.py"),
    "the batch's range": (r"\bBATCH_MAX\s*=\s*2\s*\*\*\s*53", "model/limits.py"),
}
#: names whose Param is shared: no ``"name": Param(`` anywhere
SHARED = ("time_limit", "assume_batch", "devices", "shares", "evaluations", "overhead_s", "congestion", "seed")


def _where(pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [f"{path}:{i + 1}" for path, text in SOURCES.items() for i, line in enumerate(text.splitlines())
            if rx.search(line.split("#")[0])]


@pytest.mark.parametrize("what", sorted(DECLARED))
def test_each_shared_default_is_declared_in_one_place(what):
    pattern, home = DECLARED[what]
    found = _where(pattern)
    assert len(found) == 1 and found[0].startswith(home + ":"), (what, found)


def test_no_algorithm_declares_a_shared_parameter_of_its_own():
    for name in SHARED:
        assert _where(rf"[\"']{name}[\"']\s*:\s*(registry\.)?Param\(") == [], name
    assert _where(r"time_limit_param\(\s*\d") == []  # a limit is a named constant (DEFAULT_/CAP_TIME_LIMIT, ...)
    # a signature's default of a shared float is the constant, never a literal copy of it (the rewrites'
    # bucket_mb=0.0 is the recipe's "absent = one ring per gradient", not the data-parallel planner's default)
    assert _where(r"\b(time_limit|overhead_s)\s*:\s*float\s*=\s*\d") == []


def test_every_algorithm_takes_the_shared_declarations():
    entries = registry.entries()
    for e in entries:
        assert "time_limit" in e.params, e.name
        for key, shared in (("assume_batch", params.ASSUME_BATCH), ("devices", params.DEVICES)):
            if key in e.params:
                assert e.params[key] is shared, (e.name, key)
        for key, make in registry.SHARED.items():
            if key in e.params:
                assert dataclasses.replace(e.params[key], help="") == \
                    dataclasses.replace(make(e.params[key]), help=""), (e.name, key)
    assert sum("assume_batch" in e.params for e in entries) >= 8  # once declared, read by every batch splitter
    assert {e.name for e in entries if e.params["time_limit"].default == params.DEFAULT_TIME_LIMIT} == \
        {"auto", "pipeline", "3d"}
    assert {e.name for e in entries if e.params["time_limit"].default == params.SOLVER_TIME_LIMIT} == \
        {"milp", "hierarchical"}


def test_the_cli_flags_read_the_declarations():
    def option(decorator, name):
        return next(p for p in decorator(lambda: None).__click_params__ if p.name == name)

    seed = option(common.seed_option, "seed")
    assert (seed.default, seed.type.min, seed.type.max) == (params.SEED.default, params.SEED.min, params.SEED.max)
    batch = option(common.assume_batch_option, "assume_batch")
    assert batch.type.max == params.ASSUME_BATCH.max
    assert common.time_limit_seconds(None, None, params.TIME_LIMIT_CAP.max) == params.TIME_LIMIT_CAP.max
