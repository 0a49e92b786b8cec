"""Fuzz the surfaces of the second bad-input round (issue 24): `compare
--resume` rows and a user model's hooks.

* Resume rows: hypothesis takes a valid ``placer.compare/v1`` row and breaks
  or stretches fields (other JSON types, extreme numbers, control characters,
  missing or extra fields, duplicate cells, a truncated last line).  ``placer
  compare --resume`` over one cell that is already done (so nothing runs and
  every output format renders the resumed rows) must either exit 0 with its
  output, or exit 1 with one ``Error:`` line naming the file and line - and
  ``-o`` untouched then.  A row the schema accepts must never crash what
  reads rows after it (sorting, tables, CSV, Markdown, the best-row pick).
* Model hooks: hypothesis picks a hook, what it raises (any exception class,
  a ``BaseException`` subclass, ``SystemExit`` with any code, ``os._exit``
  with any status) and a message with arbitrary characters; the guarded hook
  must turn every one into one :class:`InvalidInput` that names the spec, the
  hook, and the user's file and line, and that the CLI prints as one line.

The default suite runs a small derandomised sample; ``-m slow`` runs more.
"""

from __future__ import annotations

import os
import tempfile

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas_cli.cli import main
from celeritas_cli.cli.common import one_line
from celeritas_cli.errors import InvalidInput
from celeritas_cli.profile import models

from .conftest import ROOT

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))

GRAPH = str(ROOT / "sample_graphs" / "layered_60.json")
#: The one cell each run asks for; a valid row of it is always in the resume file, so nothing runs.
DONE = {"schema": "placer.compare/v1", "graph": "layered_60", "graph_file": GRAPH, "nodes": 60, "edges": 92,
        "cluster": "4xV100-pcie", "devices": 4, "algorithm": "single-device", "coarsen": None,
        "coarse_nodes": None, "seed": 0, "params": {}, "status": "OK", "makespan_s": 0.0028,
        "lower_bound_s": 0.0005, "makespan_over_lb": 5.3, "utilisation": 0.25, "transfers": 0,
        "transfer_bytes": 0, "placement_time_s": 0.0001, "coarsen_time_s": None, "simulate_time_s": 0.0003,
        "estimate_status": "FEASIBLE", "estimate_makespan_s": 0.0028, "caveat": None, "error": None}
FIELDS = sorted(DONE)

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
NUMBERS = st.one_of(st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0, -0.0, 1e-300, 1e308, 2**53, 2**63 - 1, 2**63]))
VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(TEXT, inner, max_size=3)), max_leaves=6)
#: Values that are valid for some field: the other rows mostly survive validation and reach the tables.
PLAUSIBLE = {"status": st.sampled_from(["OK", "OOM", "error", "timeout"]),
             "algorithm": st.sampled_from(["heft", "metis", "single-device", "x\ny", "é"]),
             "graph_file": st.sampled_from([GRAPH, "a/../b.json", "g 1.json", "g\n.json", "10.json", "9.json"]),
             "coarsen": st.sampled_from([None, "cpd", "", "fusion"]),
             "seed": st.sampled_from([0, 1, 2**63 - 1]),
             "makespan_s": st.one_of(st.floats(0, 1e308), st.just(0.0)),
             "caveat": st.one_of(st.none(), TEXT), "error": st.one_of(st.none(), TEXT),
             "graph": TEXT, "cluster": st.sampled_from(["4xV100-pcie", "c\t2"])}


@st.composite
def rows(draw):
    row = dict(DONE, graph_file=draw(PLAUSIBLE["graph_file"]), algorithm=draw(PLAUSIBLE["algorithm"]))
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(FIELDS + ["extra"]))
        kind = draw(st.sampled_from(["plausible", "any", "drop"]))
        if kind == "drop":
            row.pop(field, None)
        elif kind == "plausible" and field in PLAUSIBLE:
            row[field] = draw(PLAUSIBLE[field])
        else:
            row[field] = draw(VALUES)
    return row


def _check_resume(lines: list[bytes], fmt: str, truncate: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        resume = os.path.join(d, "runs.ndjson")
        data = b"".join(line + b"\n" for line in lines)
        if truncate:
            data += b'{"schema": "placer.compare/v1", "graph_fi'
        with open(resume, "wb") as fh:
            fh.write(data)
        out = os.path.join(d, "out.txt")
        with open(out, "wb") as fh:
            fh.write(b"before\n")
        args = ["compare", GRAPH, "--algos", "single-device", "-c", "4xV100-pcie", "--no-progress",
                "--resume", resume, "--format", fmt, "-o", out]
        r = CliRunner().invoke(main, args)
        where = f"placer {' '.join(args)}\nrows: {data[:600]!r}\nstderr: {r.stderr[-600:]!r}"
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise AssertionError(f"{type(r.exception).__name__}: {r.exception}\n{where}") from r.exception
        assert "Traceback" not in r.stderr, where
        if r.exit_code == 0:
            with open(out, "rb") as fh:
                written = fh.read()
            assert written != b"before\n" and written.strip(), where
            if fmt == "json":
                assert all(orjson.loads(x)["schema"] == "placer.compare/v1" for x in written.splitlines()), where
            return
        # a failed (error/timeout) resumed row makes the run exit 1 after writing its output
        assert r.exit_code == 1, where
        last = r.stderr.rstrip("\n").split("\n")[-1]
        if last.startswith("Error: "):
            assert f"{resume}: line " in last, where
            with open(out, "rb") as fh:
                assert fh.read() == b"before\n", where  # -o untouched when the resume file is bad
        else:
            assert "cells failed or timed out" in last, where


def _resume_case(data):
    extra = data.draw(st.lists(rows(), max_size=4), label="rows")
    lines = [orjson.dumps(DONE)] + [orjson.dumps(r) for r in extra]
    order = data.draw(st.permutations(range(len(lines))), label="order")
    fmt = data.draw(st.sampled_from(["table", "csv", "markdown", "json"]), label="format")
    truncate = data.draw(st.booleans(), label="truncated last line")
    _check_resume([lines[i] for i in order], fmt, truncate)


@FAST
@given(st.data())
def test_resume_rows_never_crash_compare(data):
    _resume_case(data)


@pytest.mark.slow
@SLOW
@given(st.data())
def test_resume_rows_never_crash_compare_long_run(data):
    _resume_case(data)


# ------------------------------------------------------------------------------------- model hooks
class Odd(BaseException):
    """A BaseException subclass, as user code may define."""


RAISES = st.one_of(st.sampled_from([ValueError, KeyError, IndexError, RuntimeError, TypeError, ZeroDivisionError,
                                    AttributeError, MemoryError, StopIteration, GeneratorExit, Odd, Exception,
                                    BaseException, NotImplementedError, RecursionError, AssertionError]),
                   st.just("SystemExit"), st.just("os._exit"))
USER_FILE = os.path.join(tempfile.gettempdir(), "placer_fuzz_user_model.py")


def _user_function(kind, message, code):
    """A function defined in a user's file (so the error names it and its line 3) doing *kind*."""
    body = {"SystemExit": "raise SystemExit(code)", "os._exit": "os._exit(code)"}.get(kind, "raise kind(message)")
    src = f"import os\ndef hook(*args):\n    {body}\n"
    scope = {"kind": kind, "message": message, "code": code}
    exec(compile(src, USER_FILE, "exec"), scope)  # noqa: S102 - the fuzzed user code
    return scope["hook"]


@FAST
@given(RAISES, st.text(max_size=40), st.one_of(st.none(), st.integers(-300, 300), TEXT),
       st.sampled_from(models.HOOKS))
def test_every_way_a_hook_fails_is_one_error_line(monkeypatch_exit, kind, message, code, hook):
    fn = models._guard_hook(_user_function(kind, message, code), hook, "m.py:Net", None)
    with pytest.raises(InvalidInput) as info:
        fn(2)
    text = str(info.value)
    assert text.startswith(f"--model m.py:Net: {models._label(hook, (2,))} failed: ")
    assert text.endswith(f" ({USER_FILE}:3)") or text.endswith(f" ({os.path.relpath(USER_FILE)}:3)"), text
    if kind == "os._exit":
        assert f"called os._exit({code!r})" in text
    elif kind == "SystemExit":
        assert f"raised SystemExit({code!r})" in text
    else:
        assert f": {kind.__name__}" in text
    line = one_line(f"Error: {text}")
    assert line.splitlines() == [line]


@pytest.fixture
def monkeypatch_exit(monkeypatch):
    """os._exit as the guard finds it: a stand-in that fails the test instead of ending pytest."""

    def not_the_real_exit(status):
        raise AssertionError(f"os._exit({status!r}) escaped the guard")

    monkeypatch.setattr(os, "_exit", not_the_real_exit)
