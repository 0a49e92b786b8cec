"""Every error is one line (issue 24, N07: control characters in ids, file
names, device ids and messages are escaped by the CLI's one formatter) and
bad option values are usage errors (N04: `run --rtol nan`, `--atol -1`)."""

from __future__ import annotations

import unicodedata

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas_cli.cli import main
from celeritas_cli.cli.common import one_line

from ..conftest import ROOT

FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def _error_line(res) -> str:
    """The stderr of a failed run: its only line that matters, which must be its last and say Error."""
    assert "Traceback" not in res.stderr and res.stdout == ""
    last = res.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("Error: "), res.stderr
    return last


def test_one_line_escapes_control_characters_only():
    assert one_line("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert one_line("\x1b[31mred\x00\x7f\x85") == "\\x1b[31mred\\x00\\x7f\\x85"
    assert one_line("para\u2028graph\u2029") == "para\\u2028graph\\u2029"
    assert one_line("plain C:\\dir 'é' ünïcode → ok") == "plain C:\\dir 'é' ünïcode → ok"


@FAST
@given(st.text())
def test_one_line_never_leaves_a_line_break_or_control(text):
    out = one_line(text)
    assert out.splitlines() == ([out] if out else [])  # str.splitlines breaks on every line boundary Python knows
    assert not any(unicodedata.category(ch) == "Cc" for ch in out)
    if not any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text):
        assert out == text


def test_node_id_with_newline(tmp_path):
    """The N07 reproducer: a node id "a\\nb" defined twice."""
    g = tmp_path / "node_id_with_newline.graph.json"
    g.write_text('{"schema":"placer.graph/v1","nodes":[{"id":"a\\nb","compute_s":1,"memory_bytes":1},'
                 '{"id":"a\\nb","compute_s":1,"memory_bytes":1}],"edges":[]}')
    res = CliRunner().invoke(main, ["simulate", str(g), "-P", str(ROOT / "examples" / "expert_placement.json")])
    assert res.exit_code == 1
    assert _error_line(res) == f"Error: {g}: node 'a\\nb' is defined twice (nodes #0 and #1)"


def test_file_name_and_device_id_with_newline(tmp_path):
    graph = str(ROOT / "sample_graphs" / "layered_60.json")
    res = CliRunner().invoke(main, ["simulate", graph, "-P", str(tmp_path / "no\nsuch.json")])
    assert res.exit_code == 1 and _error_line(res).endswith("no\\nsuch.json: no such file")
    placed = CliRunner().invoke(main, ["place", graph, "--algo", "single-device", "-c", "4xV100-pcie"])
    doc = orjson.loads(placed.stdout)
    doc["assignment"] = {k: "gpu\n9\x1b[0m" for k in doc["assignment"]}
    p = tmp_path / "p.json"
    p.write_bytes(orjson.dumps(doc))
    res = CliRunner().invoke(main, ["simulate", graph, "-P", str(p), "-c", "4xV100-pcie"])
    assert res.exit_code == 1 and "gpu\\n9\\x1b[0m" in _error_line(res)


def test_usage_errors_are_escaped_too():
    res = CliRunner().invoke(main, ["place", "--algo", "he\nft", str(ROOT / "sample_graphs" / "layered_60.json")])
    assert res.exit_code == 2 and "unknown algorithm 'he\\nft'" in _error_line(res)
    res = CliRunner().invoke(main, ["no\nsuch"])
    assert res.exit_code == 2 and _error_line(res) == "Error: No such command 'no\\nsuch'."


@pytest.mark.parametrize("option,value", [("--rtol", "nan"), ("--atol", "-1"), ("--rtol", "inf"),
                                          ("--atol", "-inf")])
def test_run_tolerances_are_usage_errors(option, value, tmp_path):
    """N04: checked when the options are parsed, before torch or any file is touched (exit 2)."""
    res = CliRunner().invoke(main, ["run", "--graph", "mlp_b8.graph.json", "-P", "mlp_b8_heft.placement.json",
                                    "--steps", "1", option, value])
    assert res.exit_code == 2
    assert _error_line(res) == f"Error: Invalid value for '{option}': must be a finite number >= 0, got {float(value)}"
