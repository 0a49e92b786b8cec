"""`placer compare --resume`: rows are checked field by field like any input
(issue 24, N02) - one line naming the file, the line and the field, exit 1,
and `-o` untouched, also when it is the resume file."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import compare as lib
from celeritas_cli.cli import main
from celeritas_cli.compare.ndjson import read_rows
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.io import load_cluster
from celeritas_cli.model.jsonio import validate

from ..conftest import ROOT

GRAPH = str(ROOT / "sample_graphs" / "layered_60.json")

#: A row as `compare --format json` writes it (the N02 reproducer's heft row, seed fixed).
ROW = {"schema": "placer.compare/v1", "graph": "layered_60", "graph_file": "sample_graphs/layered_60.json",
       "nodes": 60, "edges": 92, "cluster": "4xV100-pcie", "devices": 4, "algorithm": "heft", "coarsen": None,
       "coarse_nodes": None, "seed": 0, "params": {}, "status": "OK", "makespan_s": 0.0008122929999999998,
       "lower_bound_s": 0.000527368, "makespan_over_lb": 1.5402773774669678, "utilisation": 0.25, "transfers": 0,
       "transfer_bytes": 0, "placement_time_s": 0.0009045169999808422, "coarsen_time_s": None,
       "simulate_time_s": 0.00033746199994766357, "estimate_status": "FEASIBLE",
       "estimate_makespan_s": 0.0008122929999999998, "caveat": None, "error": None}
METIS = {**ROW, "algorithm": "metis", "makespan_s": 0.0013426405999999998, "transfers": 13}

#: (field, bad value, what the message says) - the reproducers of N02 and the other types they listed.
BAD = [
    ("seed", "abc", "field seed: must be integer"),
    ("seed", -1, "field seed: must be at least 0"),
    ("seed", 1.5, "field seed: must be integer"),
    ("makespan_s", "fast", "field makespan_s: must be number or null"),
    ("makespan_s", None, "field makespan_s: must be number"),  # an OK row has a makespan
    ("graph_file", ["a.json"], "field graph_file: must be string"),
    ("cluster", {"name": "x"}, "field cluster: must be string"),
    ("coarsen", 3, "field coarsen: must be string or null"),
    ("placement_time_s", "1s", "field placement_time_s: must be number or null"),
    ("nodes", "60", "field nodes: must be integer or null"),
    ("transfers", -2, "field transfers: must be at least 0"),
    ("status", "FINE", "field status: must be one of"),
    ("params", [], "field params: must be object"),
    ("algorithm", "", "field algorithm: must be longer than or equal to 1 characters"),
]


def _ndjson(*rows) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _compare(resume, *extra):
    return CliRunner().invoke(main, ["compare", GRAPH, "--algos", "heft,metis", "--quick", "--no-progress",
                                     "--resume", str(resume), *extra])


@pytest.mark.parametrize("field,value,says", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_bad_row_is_one_line_naming_file_line_and_field(tmp_path, field, value, says):
    resume = tmp_path / "runs.ndjson"
    resume.write_bytes(_ndjson(METIS, {**ROW, field: value}))  # the bad row is line 2
    res = _compare(resume)
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.stderr and res.stdout == ""
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: {resume}: line 2: ") and says in last, last


def test_reproducers_of_n02(tmp_path):
    """The three files of the bad-input round: seed "abc", a row with nothing but its schema,
    makespan "fast" (which broke the table's sort)."""
    cases = {"seed_str": ({**ROW, "seed": "abc"}, "line 1: field seed: must be integer"),
             "only_schema": ({"schema": "placer.compare/v1"},
                             "line 1: document: missing field algorithm, cluster, graph, graph_file, status"),
             "makespan_str": ({**ROW, "makespan_s": "fast"}, "line 1: field makespan_s: must be number or null")}
    for name, (row, says) in cases.items():
        resume = tmp_path / f"{name}.ndjson"
        resume.write_bytes(_ndjson(row, METIS))
        for fmt in ("table", "markdown", "json"):
            res = _compare(resume, "--format", fmt)
            assert res.exit_code == 1 and res.stderr.strip().splitlines()[-1] == f"Error: {resume}: {says}"


@pytest.mark.parametrize("same", [False, True], ids=["other file", "the resume file"])
def test_output_untouched_when_resume_fails(tmp_path, same):
    resume = tmp_path / "runs.ndjson"
    resume.write_bytes(_ndjson(METIS, {**ROW, "seed": "abc"}) + b'{"schema": "placer.compare/v1", "gr')
    out = resume if same else tmp_path / "out.ndjson"
    if not same:
        out.write_bytes(b"keep me\n")
    before = out.read_bytes()
    for fmt in ("json", "csv"):
        res = _compare(resume, "--format", fmt, "-o", str(out))
        assert res.exit_code == 1 and "line 2: field seed" in res.stderr
        assert out.read_bytes() == before  # not truncated, not rewritten, partial line not cut


def test_rows_compare_writes_are_valid_rows(tmp_path):
    """Cross-check writer and reader: every row a real run writes (OK, OOM and error rows) passes the
    schema, and resuming from them runs nothing and reports the same rows."""
    out = tmp_path / "runs.ndjson"
    res = CliRunner().invoke(main, ["compare", GRAPH, str(ROOT / "sample_graphs" / "layered_3000_bigmem.json"),
                                    "--algos", "single-device,heft", "--quick", "--no-progress", "--format", "json",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert {r["status"] for r in rows} >= {"OK", "OOM"} and len(rows) == 4
    for i, r in enumerate(rows, 1):
        validate(r, "placer.compare/v1", f"line {i}")
    assert read_rows(out) == rows
    started = []
    again = lib.compare([GRAPH, str(ROOT / "sample_graphs" / "layered_3000_bigmem.json")], [load_cluster(None)],
                        ["single-device", "heft"], previous=read_rows(out), quick=True, on_start=started.append)
    assert started == [] and sorted(map(lib.cell_key, again)) == sorted(map(lib.cell_key, rows))


def test_last_row_of_a_cell_wins(tmp_path):
    """A --retry-failed run appends the new row after the old failed one; reading the file back, the
    cell is the new row (so the old failure no longer fails the run)."""
    resume = tmp_path / "runs.ndjson"
    failed = {**ROW, "status": "error", "makespan_s": None, "error": "place: boom"}
    resume.write_bytes(_ndjson(failed, METIS, ROW))
    rows = read_rows(resume)
    assert [(r["algorithm"], r["status"]) for r in rows] == [("metis", "OK"), ("heft", "OK")]
    res = _compare(resume, "--format", "json", "-c", "4xV100-pcie")
    assert res.exit_code == 0, res.output  # the old error row would fail the run
    assert "error" not in {orjson.loads(x)["status"] for x in res.stdout.splitlines()}


def test_missing_resume_file_is_an_empty_run_and_bad_json_is_named(tmp_path):
    assert read_rows(tmp_path / "nope.ndjson") == []
    bad = tmp_path / "bad.ndjson"
    bad.write_bytes(b"not json\n" + _ndjson(ROW))
    with pytest.raises(InvalidInput, match=r"bad.ndjson: line 1 is not JSON"):
        read_rows(bad)
    other = tmp_path / "other.ndjson"
    other.write_bytes(_ndjson({"schema": "placer.graph/v1", "nodes": [], "edges": []}))
    with pytest.raises(InvalidInput, match=r"other.ndjson: line 1: is a placer.graph/v1 document"):
        read_rows(other)
