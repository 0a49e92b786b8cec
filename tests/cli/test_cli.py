"""The command line itself: exit codes, `-` for stdin, pipes, atomic -o."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main

from ..conftest import SAMPLES

G60 = str(SAMPLES / "layered_60.json")


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def test_help_everywhere():
    r = run(["--help"])
    assert r.exit_code == 0 and "placer coarsen g.json | placer place" in r.output
    for cmd in ("place", "simulate", "coarsen", "profile", "compare"):
        r = run([cmd, "--help"])
        if "No such command" in r.output:
            continue
        assert r.exit_code == 0 and "Example" in r.output, cmd


def test_place_list_shows_papers():
    r = run(["place", "--list"])
    assert r.exit_code == 0
    assert "single-device" in r.output and "random" in r.output


def test_place_then_simulate_via_stdin(tmp_path):
    r = run(["place", "--algo", "random", "--seed", "4", "--cluster", "4xV100-pcie"], input=open(G60).read())
    assert r.exit_code == 0, r.output
    doc = orjson.loads(r.stdout)
    assert doc["schema"] == "placer.placement/v1" and len(doc["assignment"]) == 60
    s = run(["simulate", G60, "-P", "-"], input=r.stdout)
    assert s.exit_code == 0
    rep = orjson.loads(s.stdout)
    assert rep["schema"] == "placer.report/v1" and rep["makespan_s"] > 0 and rep["algorithm"] == "random"


@pytest.mark.parametrize("algo", ["random", "heft", "m-sct", "adjusting", "fd-dps"])
def test_same_seed_same_bytes(algo):
    args = ["place", G60, "--algo", algo, "--seed", "9", "--no-timings"]
    a, b = run(args).stdout_bytes, run(args).stdout_bytes
    assert a == b and b'"placement_time_s": 0.0' in a
    timed = orjson.loads(run(["place", G60, "--algo", algo, "--seed", "9"]).stdout)
    assert timed["placement_time_s"] > 0


def test_simulate_outputs(tmp_path):
    p = tmp_path / "p.json"
    assert run(["place", G60, "--algo", "single-device", "-o", str(p)]).exit_code == 0
    svg, trace, rep = tmp_path / "g.svg", tmp_path / "t.json", tmp_path / "r.json"
    r = run(["simulate", G60, "-P", str(p), "--format", "table", "--gantt", str(svg), "--trace", str(trace),
             "-o", str(rep)])
    assert r.exit_code == 0
    assert "makespan" in r.output and "gpu0" in r.output
    assert svg.read_text().startswith("<svg") and "</svg>" in svg.read_text()
    events = orjson.loads(trace.read_bytes())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X") == 60
    assert orjson.loads(rep.read_bytes())["status"] == "OK"
    nc = orjson.loads(run(["simulate", G60, "-P", str(p), "--no-congestion"]).stdout)
    assert nc["congestion"] == "none"


def test_bad_input_one_line_exit_1_no_output_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "placer.graph/v1", "nodes": [{"id": "a", "compute_s": -1, "memory_bytes": 0}], '
                   '"edges": []}')
    out = tmp_path / "out.json"
    r = CliRunner().invoke(main, ["place", str(bad), "--algo", "random", "-o", str(out)])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0
    assert "node 'a' field compute_s" in r.output and "Traceback" not in r.output
    assert not out.exists()
    assert not list(tmp_path.glob(".out.json*"))


def test_usage_errors_exit_2():
    assert CliRunner().invoke(main, ["place", G60, "--algo", "nope"]).exit_code == 2
    assert CliRunner().invoke(main, ["simulate", "-", "-P", "-"]).exit_code == 2
    assert CliRunner().invoke(main, ["place", G60, "--algo", "random", "-p", "oops"]).exit_code == 2


def test_unknown_param_is_exit_1():
    r = CliRunner().invoke(main, ["place", G60, "--algo", "random", "-p", "foo=1"])
    assert r.exit_code == 1 and "has no parameter 'foo'" in r.output


def test_placement_for_other_graph_rejected(tmp_path):
    p = tmp_path / "p.json"
    run(["place", G60, "--algo", "random", "-o", str(p)])
    r = CliRunner().invoke(main, ["simulate", str(SAMPLES / "layered_300.json"), "-P", str(p)])
    assert r.exit_code == 1 and "this placement was made for graph 'layered_60', not for graph 'layered_300'" in r.output


def test_real_pipe_subprocess(tmp_path):
    place = subprocess.run([sys.executable, "-m", "celeritas_cli", "place", G60, "--algo", "random"],
                           capture_output=True, check=True)
    sim = subprocess.run([sys.executable, "-m", "celeritas_cli", "simulate", G60, "-P", "-", "--format", "json"],
                         input=place.stdout, capture_output=True, check=True)
    assert orjson.loads(sim.stdout)["schema"] == "placer.report/v1"
    bad = subprocess.run([sys.executable, "-m", "celeritas_cli", "simulate", G60, "-P", str(tmp_path / "x.json")],
                         capture_output=True)
    assert bad.returncode == 1 and b"Traceback" not in bad.stderr and b"no such file" in bad.stderr


@pytest.mark.parametrize("given_ok", [True])
def test_given_algorithm_round_trip(tmp_path, given_ok):
    p = tmp_path / "p.json"
    run(["place", G60, "--algo", "random", "--seed", "2", "-o", str(p)])
    q = orjson.loads(run(["place", G60, "--algo", "given", "-p", f"file={p}"]).stdout)
    assert q["assignment"] == orjson.loads(p.read_bytes())["assignment"]


def test_place_simulate_on_a_coarse_graph_says_which_graph(tmp_path):
    # issue 18.3: a coarse graph's makespan is labelled; the original graph's
    # is reported too when the coarse graph names a readable original file
    coarse = tmp_path / "c.json"
    assert run(["coarsen", G60, "-o", str(coarse)]).exit_code == 0
    assert orjson.loads(coarse.read_bytes())["meta"]["coarsened_from_file"] == G60
    r = run(["place", str(coarse), "--algo", "adjusting", "--simulate"])
    assert r.exit_code == 0
    rep = orjson.loads(run(["simulate", G60, "-P", "-"], input=r.stdout).stdout)
    assert "adjusting: simulated makespan on the coarse graph 'layered_60@cpd'" in r.stderr
    assert (f"on the original graph 'layered_60' (60 nodes): simulated makespan {rep['makespan_s']:.6g} s"
            in r.stderr)
    piped = run(["coarsen", "-"], input=open(G60).read()).stdout  # no file to go back to
    r = run(["place", "-", "--algo", "adjusting", "--simulate"], input=piped)
    assert "on the coarse graph" in r.stderr and "these are the coarse graph's numbers" in r.stderr


# ------------------------------------------------------ shared flags (issue 26) and issue 24 N03 / N18
def test_place_congestion_flag_reaches_the_algorithm_and_p_wins():
    base = ["place", G60, "--cluster", "4xV100-pcie", "--no-timings"]
    r = run(base + ["--algo", "dpos", "--congestion", "port"])
    assert r.exit_code == 0 and orjson.loads(r.stdout)["params"]["congestion"] == "port"
    same = run(base + ["--algo", "dpos", "-p", "congestion=port"])
    assert same.stdout_bytes == r.stdout_bytes  # the flag and -p are one parameter
    r = run(base + ["--algo", "dpos", "-p", "congestion=none", "--congestion", "port"])
    assert orjson.loads(r.stdout)["params"]["congestion"] == "none"
    assert "--congestion ignored: -p congestion=none wins" in r.stderr
    r = run(base + ["--algo", "heft", "--congestion", "port", "--time-limit", "5"])
    plain = orjson.loads(run(base + ["--algo", "heft"]).stdout)
    assert orjson.loads(r.stdout) == {**plain, "params": {**plain["params"], "time_limit": 5.0}}
    assert "--congestion ignored: 'heft' takes no congestion" in r.stderr
    assert "--time-limit" not in r.stderr  # every algorithm has a time limit (the registry's cap)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e300"])
@pytest.mark.parametrize("cmd", ["place", "compare"])
def test_n18_a_bad_time_limit_is_a_usage_error_naming_the_option(cmd, value):
    """Issue 24, N18: ``compare --time-limit nan`` exits 2 naming the
    option, as ``place`` does (one check for both)."""
    args = [cmd, G60, "--time-limit", value] + (["--algos", "heft,auto", "--quick"] if cmd == "compare" else [])
    r = run(args)
    assert r.exit_code == 2 and r.stdout == ""
    assert "Invalid value for '--time-limit'" in r.stderr and "from 0 (no limit) to 1e12" in r.stderr


@pytest.mark.parametrize("option", ["--steps", "--threads", "--warmup", "--batch-size"])
def test_n18_run_counts_below_one_are_usage_errors(option, tmp_path):
    for cmd in (["run"], ["export"]) if option == "--batch-size" else (["run"],):
        r = run(cmd + ["-P", str(tmp_path / "missing.json"), option, "0"])
        assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.stderr, r.stderr


@pytest.mark.parametrize("limit", ["1e7", "1e12", "0"])
def test_n03_compare_accepts_the_documented_time_limits(limit):
    """Issue 24, N03: a per-cell limit of 1e7 s or 1e12 s (inside the
    accepted 0..1e12) runs; the worker wait is clamped instead of
    overflowing poll()."""
    r = run(["compare", G60, "--algos", "heft", "--quick", "--format", "json", "--time-limit", limit,
             "--no-progress"])
    assert r.exit_code == 0, r.stderr
    (row,) = [orjson.loads(line) for line in r.stdout.splitlines()]
    assert row["status"] == "OK" and row["algorithm"] == "heft"


def test_n03_milp_with_a_huge_time_limit_starts_no_overflowing_timer(tmp_path):
    """Issue 24, N03: ``place --algo milp --time-limit 1e10`` printed an
    OverflowError from the watchdog thread; now no timer that long starts."""
    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, "-m", "celeritas_cli", "place", G60, "--algo", "milp", "--time-limit",
                        "1e10", "-p", "det_time=0.5", "--cluster", "4xV100-pcie", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Exception" not in p.stderr and "Traceback" not in p.stderr and "OverflowError" not in p.stderr
    assert orjson.loads(out.read_bytes())["params"]["time_limit"] == 1e10
