"""`placer compare`: cells equal the simulator, failures stay in their cell,
resume, formats, executors, exit codes (celeritas_cli/compare/)."""

from __future__ import annotations

import csv
import io
import time

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import compare as lib
from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.log import chatty, warn
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate

CALLS: list[str] = []


def _split(graph, cluster, *, seed=0, costs=None):
    """Node v on device v % k (hand-computable)."""
    CALLS.append(graph.name)
    return Placement.from_indices(graph, cluster, [v % cluster.k for v in range(graph.n)], algorithm="test-split")


def _boom(graph, cluster, *, seed=0, costs=None):
    raise RuntimeError("kaboom in test")


def _hang(graph, cluster, *, seed=0, costs=None, time_limit=None):
    time.sleep(60)


def _interrupt(graph, cluster, *, seed=0, costs=None):
    raise KeyboardInterrupt  # what Ctrl-C raises in the running cell


def _chatty(graph, cluster, *, seed=0, costs=None):
    """Prints progress only when chatty, a warning always, and a stray print."""
    if chatty():
        warn("test-chatty: progress line")
    warn("test-chatty: warning about the result")
    print("stray print")
    return Placement.from_indices(graph, cluster, [0] * graph.n, algorithm="test-chatty")


DUMMIES = {
    "test-split": (_split, {}),
    "test-boom": (_boom, {}),
    "test-hang": (_hang, {"time_limit": registry.Param(float, None, "s")}),
    "test-interrupt": (_interrupt, {}),
    "test-chatty": (_chatty, {}),
}


@pytest.fixture(autouse=True)
def dummies():
    registry.names()  # load the real ones first
    for name, (func, params) in DUMMIES.items():
        registry.register(name, paper="test", section="-", summary="test dummy", params=params)(func)
    CALLS.clear()
    yield
    for name in DUMMIES:
        registry._ALGORITHMS.pop(name, None)


@pytest.fixture
def files(tmp_path):
    """Two tiny graphs and a 2-device cluster (100 B/s, no latency, 100 B memory)."""
    chain = build("chain3", [{"id": "a", "compute_s": 1, "memory_bytes": 10},
                             {"id": "b", "compute_s": 2, "memory_bytes": 10},
                             {"id": "c", "compute_s": 3, "memory_bytes": 10}],
                  [{"src": "a", "dst": "b", "bytes": 100}, {"src": "b", "dst": "c", "bytes": 100}])
    fork = build("fork", [{"id": "s", "compute_s": 1, "memory_bytes": 40},
                          {"id": "x", "compute_s": 4, "memory_bytes": 40},
                          {"id": "y", "compute_s": 4, "memory_bytes": 40},
                          {"id": "j", "compute_s": 1, "memory_bytes": 40}],
                 [{"src": "s", "dst": "x", "bytes": 100}, {"src": "s", "dst": "y", "bytes": 100},
                  {"src": "x", "dst": "j", "bytes": 100}, {"src": "y", "dst": "j", "bytes": 100}])
    gdir = tmp_path / "graphs"
    (gdir / "clusters").mkdir(parents=True)
    write_json(chain.to_dict(), gdir / "chain3.json")
    write_json(fork.to_dict(), gdir / "fork.json")
    cl = uniform(2, memory=100, bandwidth=100.0, latency=0.0, name="tiny2")
    write_json(cl.to_dict(), gdir / "clusters" / "tiny2.json")
    return {"dir": gdir, "chain": chain, "fork": fork, "cluster": cl, "cluster_file": gdir / "clusters" / "tiny2.json"}


ALGOS = ["single-device", "test-split", "random"]


def _by_cell(rows):
    return {(r["graph"], r["algorithm"]): r for r in rows}


def test_cells_equal_simulate_and_hand_values(files):
    rows = lib.compare([files["dir"]], [files["cluster"]], ALGOS)
    assert len(rows) == 6
    cells = _by_cell(rows)
    for g in (files["chain"], files["fork"]):
        for a in ALGOS:
            r = cells[(g.name, a)]
            rep = simulate(g, files["cluster"], registry.place(g, files["cluster"], a))
            assert r["makespan_s"] == rep["makespan_s"]
            assert r["status"] == rep["status"]
            assert r["lower_bound_s"] == rep["lower_bound_s"]
            assert r["transfer_bytes"] == rep["transfers"]["bytes"]
            assert r["placement_time_s"] >= 0
    # hand-computed: chain on one device 1+2+3; split a|b|c alternating: 1 + 1 + 2 + 1 + 3
    assert cells[("chain3", "single-device")]["makespan_s"] == 6.0
    assert cells[("chain3", "test-split")]["makespan_s"] == 8.0
    assert cells[("chain3", "test-split")]["transfer_bytes"] == 200
    # fork: 160 B on one 100 B device -> OOM; split s,y | x,j: x 2..6, y 1..5 + 1 s transfer, j 6..7
    assert cells[("fork", "single-device")]["status"] == "OOM"
    assert cells[("fork", "test-split")]["makespan_s"] == 7.0
    assert cells[("fork", "test-split")]["status"] == "OK"
    # the clusters/ subdirectory was skipped (not a graph)
    assert {r["graph_file"].rsplit("/", 1)[-1] for r in rows} == {"chain3.json", "fork.json"}


def test_table_layout(files):
    rows = lib.compare([files["dir"]], [files["cluster"]], ALGOS)
    m = lib.matrix(rows, "makespan_s", ALGOS)
    assert m["columns"] == ALGOS
    by = {r["graph"]: r for r in m["rows"]}
    assert by["fork"]["cells"]["single-device"] == "OOM"
    assert by["fork"]["cells"]["test-split"] == "7"
    assert by["chain3"]["cells"]["single-device"] == "6"
    assert by["chain3"]["best"] == "single-device"
    # speed-up of the best over the second best, 1 - best/second (Celeritas Table 3)
    ok = sorted(r["makespan_s"] for r in rows if r["graph"] == "chain3" and r["status"] == "OK")
    assert by["chain3"]["speedup"] == pytest.approx(1 - ok[0] / ok[1])
    text = lib.format_table(rows, ALGOS)
    lines = [ln for ln in text.splitlines() if "chain3" in ln]
    assert "6*" in lines[0] and "over" in lines[0]
    md = lib.format_markdown(rows, ALGOS)
    assert "| fork | OOM | **7** |" in md


def test_failing_algorithm_is_reported_in_its_cell(files):
    rows = lib.compare([files["dir"] / "chain3.json"], [files["cluster"]], ["single-device", "test-boom"])
    cells = _by_cell(rows)
    bad = cells[("chain3", "test-boom")]
    assert bad["status"] == "error" and "kaboom in test" in bad["error"] and "RuntimeError" in bad["error"]
    assert cells[("chain3", "single-device")]["makespan_s"] == 6.0
    assert lib.matrix(rows)["rows"][0]["cells"]["test-boom"] == "error"


def test_cli_exit_codes_and_failure_cell(files):
    runner = CliRunner()
    base = ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]), "--no-progress"]
    res = runner.invoke(main, base + ["--algos", "single-device,test-boom"])
    assert res.exit_code == 1
    assert "error" in res.stdout and "6*" in res.stdout
    res = runner.invoke(main, base + ["--algos", "single-device,test-boom", "--allow-failures"])
    assert res.exit_code == 0
    assert runner.invoke(main, base + ["--algos", "single-device"]).exit_code == 0
    assert runner.invoke(main, base + ["--algos", "no-such-algo"]).exit_code == 2
    assert runner.invoke(main, base + ["--format", "yaml"]).exit_code == 2
    res = runner.invoke(main, ["compare", str(files["dir"] / "missing.json"), "--no-progress"])
    assert res.exit_code == 1 and "missing.json" in res.output
    res = runner.invoke(main, base + ["--algos", "single-device", "--plot", "x.pdf"])
    assert res.exit_code == 2


def test_resume_skips_done_cells(files, tmp_path):
    out = tmp_path / "runs.ndjson"
    runner = CliRunner()
    base = ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]), "--no-progress",
            "--format", "json", "-o", str(out)]
    assert runner.invoke(main, base + ["--algos", "single-device,test-split"]).exit_code == 0
    assert sorted(CALLS) == ["chain3", "fork"]
    first = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(first) == 4
    # simulate a killed run: a partial last line
    with open(out, "ab") as fh:
        fh.write(b'{"schema": "placer.compare/v1", "gra')
    CALLS.clear()
    res = runner.invoke(main, base + ["--algos", "single-device,test-split,random", "--resume", str(out)])
    assert res.exit_code == 0, res.output
    assert CALLS == []  # test-split cells were done before
    rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(rows) == 6
    assert len({lib.cell_key(r) for r in rows}) == 6
    assert sorted(r["algorithm"] for r in rows[4:]) == ["random", "random"]
    # resume into a table: previous rows appear in it, nothing re-runs
    res = runner.invoke(main, ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]),
                               "--no-progress", "--algos", "single-device,test-split,random", "--resume", str(out),
                               "--format", "csv"])
    assert res.exit_code == 0 and CALLS == []
    assert len(list(csv.DictReader(io.StringIO(res.stdout)))) == 6


def test_retry_failed(files, tmp_path):
    out = tmp_path / "r.ndjson"
    runner = CliRunner()
    base = ["compare", str(files["dir"] / "chain3.json"), "--cluster", str(files["cluster_file"]),
            "--no-progress", "--format", "json", "-o", str(out), "--algos", "test-boom,test-split"]
    assert runner.invoke(main, base).exit_code == 1
    CALLS.clear()
    assert runner.invoke(main, base + ["--resume", str(out)]).exit_code == 1  # failed row kept, not re-run
    assert CALLS == []
    assert runner.invoke(main, base + ["--retry-failed"]).exit_code == 2  # needs --resume


def test_formats(files, tmp_path):
    runner = CliRunner()
    base = ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]), "--no-progress",
            "--algos", ",".join(ALGOS)]
    res = runner.invoke(main, base + ["--format", "csv"])
    assert res.exit_code == 0
    recs = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(recs) == 6 and list(recs[0]) == list(lib.CSV_FIELDS)
    assert {(r["graph"], r["algorithm"]): r["status"] for r in recs}[("fork", "single-device")] == "OOM"
    res = runner.invoke(main, base + ["--format", "json"])
    rows = [orjson.loads(x) for x in res.stdout.splitlines()]
    assert len(rows) == 6 and all(r["schema"] == lib.ROW_SCHEMA for r in rows)
    res = runner.invoke(main, base + ["--format", "markdown", "-o", str(tmp_path / "t.md")])
    assert res.exit_code == 0 and res.stdout == ""
    md = (tmp_path / "t.md").read_text()
    assert "| Graph | single-device | test-split | random | Speed up |" in md


def test_processes_and_timeout(files):
    serial = lib.compare([files["dir"]], [files["cluster"]], ALGOS)
    par = lib.compare([files["dir"]], [files["cluster"]], ALGOS + ["test-hang"], jobs=2, time_limit=0.2)
    cells = _by_cell(par)
    for r in serial:
        assert cells[(r["graph"], r["algorithm"])]["makespan_s"] == r["makespan_s"]
    hang = cells[("chain3", "test-hang")]
    assert hang["status"] == "timeout" and "0.2" in hang["error"]
    # the hung algorithm declared time_limit, so it was passed through
    assert hang["params"] == {"time_limit": 0.2}


def test_plot_svg(files, tmp_path):
    out = tmp_path / "cmp.svg"
    res = CliRunner().invoke(main, ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]),
                                    "--no-progress", "--algos", ",".join(ALGOS), "--plot", str(out)])
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert svg.startswith("<?xml") and svg.count("<svg") == 3  # bars + one Gantt per graph
    assert "best = single-device" in svg and "best = test-split" in svg and ">OOM<" in svg


def test_default_algorithms_resolved_at_run_time():
    names = lib.default_algorithms()
    assert "test-split" in names and "single-device" in names and "given" not in names


@pytest.mark.ray
def test_ray_executor(files):
    pytest.importorskip("ray")
    rows = lib.compare([files["dir"] / "chain3.json"], [files["cluster"]], ["single-device", "random"],
                       executor="ray", jobs=2)
    serial = lib.compare([files["dir"] / "chain3.json"], [files["cluster"]], ["single-device", "random"])
    assert [(r["algorithm"], r["makespan_s"]) for r in rows] == [(r["algorithm"], r["makespan_s"]) for r in serial]


def test_png_plot_without_matplotlib_is_a_clear_error(files, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    res = CliRunner().invoke(main, ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]),
                                    "--no-progress", "--algos", "single-device", "--plot", "x.png"])
    assert res.exit_code == 1 and "matplotlib" in res.output and ".svg" in res.output


def test_ray_missing_is_a_clear_error(files, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    res = CliRunner().invoke(main, ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]),
                                    "--no-progress", "--algos", "single-device", "--executor", "ray"])
    assert res.exit_code == 1 and "pip install" in res.output and "ray" in res.output


def test_discover_gz_and_skip_non_graphs(files, tmp_path):
    d = tmp_path / "mixed"
    (d / "sub").mkdir(parents=True)
    write_json(files["chain"].to_dict(), d / "sub" / "chain.json.gz")
    write_json(files["cluster"].to_dict(), d / "cl.json.gz")
    (d / "notes.json").write_text('{"hello": 1}')
    found = lib.discover_graphs([d])
    assert [f.rsplit("/", 1)[-1] for f in found] == ["chain.json.gz"]
    rows = lib.compare([d], [files["cluster"]], ["single-device"])
    assert rows[0]["graph"] == "chain3" and rows[0]["makespan_s"] == 6.0
    with pytest.raises(InvalidInput):
        lib.discover_graphs([tmp_path / "nowhere"])


def test_plot_gantt_of_a_split_placement_draws_the_split_graph(tmp_path):
    """os-dpos plans on a split graph; the Gantt chart of the best placement
    must draw that graph's nodes (the schedule's node indices refer to it)."""
    g = build("dom", [{"id": "in", "compute_s": 0.1, "memory_bytes": 0},
                      {"id": "conv", "compute_s": 10.0, "memory_bytes": 0, "splittable": ["batch"]},
                      {"id": "out", "compute_s": 0.1, "memory_bytes": 0}],
              [{"src": "in", "dst": "conv", "bytes": 1000, "tensor": "out"},
               {"src": "conv", "dst": "out", "bytes": 1000, "tensor": "out"}], meta={"batch_size": 8})
    gf, cf, out = tmp_path / "dom.json", tmp_path / "c.json", tmp_path / "p.svg"
    write_json(g.to_dict(), gf)
    write_json(uniform(2, bandwidth=1e6, latency=0.0).to_dict(), cf)
    res = CliRunner().invoke(main, ["compare", str(gf), "--cluster", str(cf), "--no-progress",
                                    "--algos", "os-dpos,single-device", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert "best = os-dpos" in svg
    split_ids = registry.place(g, uniform(2, bandwidth=1e6, latency=0.0), "os-dpos").derived.ids
    assert len(split_ids) > 3 and all(f"<title>{i} (" in svg for i in split_ids)


def test_run_compare_is_the_command_as_a_library_call(files, tmp_path):
    """The library entry streams NDJSON, resumes and reports failures
    exactly as the command does (the command is a thin layer over it)."""
    out = tmp_path / "runs.ndjson"
    opts = lib.CompareOptions(fmt="json", output=str(out), progress=False)
    res = lib.run_compare([files["dir"]], [files["cluster"]], ["single-device", "test-boom"], opts)
    assert [(r["graph"], r["algorithm"], r["status"]) for r in res.rows] == [
        ("chain3", "single-device", "OK"), ("chain3", "test-boom", "error"),
        ("fork", "single-device", "OOM"), ("fork", "test-boom", "error")]
    assert [r["algorithm"] for r in res.failed] == ["test-boom", "test-boom"]
    assert [orjson.loads(x)["algorithm"] for x in out.read_bytes().splitlines()].count("single-device") == 2
    CALLS.clear()
    again = lib.run_compare([files["dir"]], [files["cluster"]], ["single-device", "test-boom", "test-split"],
                            lib.CompareOptions(fmt="json", output=str(out), resume=str(out), progress=False))
    assert sorted(CALLS) == ["chain3", "fork"]  # only the new algorithm ran
    assert len(again.rows) == 6 and len(out.read_bytes().splitlines()) == 6
    with pytest.raises(InvalidInput, match="both named 'tiny2'"):
        lib.run_compare([files["dir"]], [files["cluster"], files["cluster"]], ["single-device"],
                        lib.CompareOptions(progress=False))


def test_coarse_columns_name_the_method_and_the_algorithm(files):
    rows = lib.compare([files["dir"] / "chain3.json"], [files["cluster"]], ["single-device", "test-split"],
                       coarsen="cpd")
    assert [r["algorithm"] for r in rows] == ["single-device", "test-split"]  # the row fields keep their meaning
    assert all(r["coarsen"] == "cpd" for r in rows)
    m = lib.matrix(rows, "makespan_s", ["single-device", "test-split"])
    assert m["columns"] == ["cpd+single-device", "cpd+test-split"]
    assert m["rows"][0]["best"] == "cpd+single-device"
    words = " ".join(lib.format_table(rows, ["single-device", "test-split"]).split())  # rich wraps captions
    assert "cpd+test-split" in words and "cpd+X: X placed on the cpd coarse graph" in words
    # rows of a resumed run on the original graph share the table row, in their own columns
    plain = lib.compare([files["dir"] / "chain3.json"], [files["cluster"]], ["test-split"])
    m = lib.matrix(rows + plain, "makespan_s", ["single-device", "test-split"])
    assert m["columns"] == ["test-split", "cpd+single-device", "cpd+test-split"]
    assert len(m["rows"]) == 1 and m["rows"][0]["cells"]["test-split"] == "8"


def test_csv_floats_have_six_significant_digits(files):
    assert lib.formats.csv_value(0.0008122929999999998) == "0.000812293"
    assert lib.formats.csv_value(1 / 3) == "0.333333" and lib.formats.csv_value(123456789.0) == "123457000.0"
    assert lib.formats.csv_value(47101732) == 47101732  # integers stay exact
    rows = lib.compare([files["dir"]], [files["cluster"]], ["single-device", "random"])
    rows[0]["placement_time_s"] = 0.0008122929999999998
    recs = list(csv.DictReader(io.StringIO(lib.format_csv(rows, ["single-device", "random"]))))
    assert recs[0]["placement_time_s"] == "0.000812293"
    for rec in recs:
        for key in ("makespan_s", "lower_bound_s", "utilisation", "simulate_time_s"):
            digits = rec[key].replace(".", "").replace("-", "").split("e")[0].lstrip("0")
            assert len(digits.rstrip("0")) <= 6, (key, rec[key])


def test_plot_axes_legends_and_order(files, tmp_path):
    """Round y ticks that end at the tallest bar's tick (bars of 5 s: an axis
    to 5, not 10), a labelled lower-bound line, an algorithm legend in a
    palette of its own, and Gantt charts in the order of the bar panels
    (g2 before g10, as the tables sort file names)."""
    from celeritas_cli.compare import plots
    from celeritas_cli.sim.gantt import PALETTE, nice_ticks

    assert nice_ticks(5.0, 5)[-1] == 5.0 and nice_ticks(5.2, 5) == [0.0, 2.0, 4.0, 6.0]
    assert nice_ticks(0.9795) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert not set(plots.ALGO_PALETTE) & set(PALETTE)
    g = build("g", [{"id": "a", "compute_s": 5, "memory_bytes": 0}], [])
    for name in ("g2", "g10"):
        write_json({**g.to_dict(), "name": name}, tmp_path / f"{name}.json")
    out = tmp_path / "p.svg"
    res = CliRunner().invoke(main, ["compare", str(tmp_path / "g10.json"), str(tmp_path / "g2.json"),
                                    "--cluster", str(files["cluster_file"]), "--no-progress",
                                    "--algos", "single-device,test-split", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert svg.index("g2 on tiny2: best") < svg.index("g10 on tiny2: best")
    assert svg.index(">g2</text>") < svg.index(">g10</text>")  # bar panels, same order
    ticks = [t for t in ("0", "1", "2", "3", "4", "5", "10") if f'text-anchor="end" font-size="9">{t}</text>' in svg]
    assert ticks == ["0", "1", "2", "3", "4", "5"]
    assert ">LB</text>" in svg and ">lower bound (LB)</text>" in svg
    colour = plots.algorithm_colours([], ["single-device", "test-split"])
    assert f'fill="{colour["test-split"]}"/><text x="17" y="11">test-split</text>' in svg
    assert ">time (s)</text>" in svg and ">makespan (s)</text>" in svg


def test_plot_png(files, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    res = CliRunner().invoke(main, ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]),
                                    "--no-progress", "--algos", ",".join(ALGOS), "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(b"\x89PNG")


def test_ctrl_c_says_what_was_kept_and_how_to_resume(files, tmp_path):
    out = tmp_path / "runs.ndjson"
    base = ["compare", str(files["dir"]), "--cluster", str(files["cluster_file"]), "--no-progress",
            "--format", "json", "-o", str(out)]
    res = CliRunner().invoke(main, base + ["--algos", "single-device,test-interrupt"])
    assert res.exit_code == 130
    assert "interrupted after 1 of 4 cells" in res.stderr and f"--resume {out}" in res.stderr
    assert [orjson.loads(x)["algorithm"] for x in out.read_bytes().splitlines()] == ["single-device"]
    res = CliRunner().invoke(main, base + ["--algos", "single-device", "--resume", str(out)])
    assert res.exit_code == 0 and len(out.read_bytes().splitlines()) == 2
    res = CliRunner().invoke(main, base[:-4] + ["--algos", "single-device,test-interrupt"])
    assert res.exit_code == 130 and "nothing was written" in res.stderr and "--format json -o FILE" in res.stderr


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cells_are_quiet_unless_verbose(files, jobs):
    """Progress lines only with -v; warnings always; all of it on stderr,
    after the cell, prefixed by it (so it cannot break the progress bar);
    stdout keeps only the table."""
    base = ["compare", str(files["dir"] / "chain3.json"), "--cluster", str(files["cluster_file"]), "--no-progress",
            "--algos", "test-chatty", "-j", jobs]
    quiet = CliRunner().invoke(main, base)
    loud = CliRunner().invoke(main, base + ["-v"])
    assert quiet.exit_code == loud.exit_code == 0
    cell = "chain3.json / tiny2 / test-chatty: "
    assert f"{cell}warning about the result" in quiet.stderr and "progress line" not in quiet.stderr
    assert f"{cell}warning about the result" in loud.stderr and f"{cell}progress line" in loud.stderr
    assert f"{cell}stray print" in quiet.stderr
    assert "stray print" not in quiet.stdout + loud.stdout and "test-chatty" in quiet.stdout


def test_milp_progress_lines_follow_chatty(files, capsys):
    from celeritas_cli.log import quiet

    params = {"time_limit": "2", "workers": "1"}
    registry.place(files["chain"], files["cluster"], "milp", params=params)
    assert "milp: hint" in capsys.readouterr().err
    with quiet():
        registry.place(files["chain"], files["cluster"], "milp", params=params)
    assert "milp: hint" not in capsys.readouterr().err


def test_coarse_milp_status_is_labelled_and_judged_on_the_original():
    # issue 18.2: a milp cell on a coarse graph says its status holds there;
    # its makespan is the original graph's (the simulator's, not the solver's)
    pytest.importorskip("ortools")
    rows = lib.compare(["sample_graphs/layered_60.json"], [uniform(2)], ["milp"], coarsen="cpd",
                       per_algo_params={"milp": {"time_limit": 20, "det_time": 0.05}})
    (r,) = rows
    assert r["status"] == "OK" and r["coarse_nodes"] < r["nodes"]
    assert r["estimate_status"] in ("OPTIMAL (coarse graph)", "FEASIBLE (coarse graph)")
    from celeritas_cli.model.io import load_graph

    g = load_graph("sample_graphs/layered_60.json")
    cg = registry.coarsen(g, uniform(2), "cpd")
    p = registry.place(cg, uniform(2), "milp", params={"time_limit": 20, "det_time": 0.05})
    assert r["makespan_s"] == pytest.approx(simulate(g, uniform(2), p)["makespan_s"])
    assert p.estimate["original_makespan_s"] == pytest.approx(r["makespan_s"])


def test_caveats_mark_cells_and_are_listed_under_every_table(files):
    # m-SCT above lp_max_nodes is not Baechi's LP m-SCT: the cell says so
    rows = lib.compare([files["dir"]], [files["cluster"]], ["m-sct", "single-device"],
                       per_algo_params={"m-sct": {"lp_max_nodes": 2}})
    cells = _by_cell(rows)
    assert "lp_max_nodes=2" in cells[("chain3", "m-sct")]["caveat"]
    assert cells[("chain3", "single-device")]["caveat"] is None
    m = lib.matrix(rows, "makespan_s", ["m-sct", "single-device"])
    by = {r["graph"]: r for r in m["rows"]}
    assert by["chain3"]["cells"]["m-sct"].endswith(lib.CAVEAT_MARK)
    text = lib.format_table(rows, ["m-sct", "single-device"])
    md = lib.format_markdown(rows, ["m-sct", "single-device"])
    for out in (text, md):
        notes = [ln for ln in out.splitlines() if ln.startswith(lib.CAVEAT_MARK + " m-sct on chain3, fork:")]
        assert len(notes) == 3 and "not Baechi's LP" in notes[0]  # one per table
    assert "caveat" in lib.format_csv(rows).splitlines()[0]


#: planning for the judge's link rule changes the judged makespan (1 B/s links, no latency):
#: dpos on three children of n0 (3, 3, 1 bytes); m-etf on a join n3 of three sources (3, 4, 3 bytes)
PLAN_FOR_JUDGE = {
    "dpos": (
        [{"id": "n0", "compute_s": 4, "memory_bytes": 0}, {"id": "n1", "compute_s": 1, "memory_bytes": 0},
         {"id": "n2", "compute_s": 4, "memory_bytes": 0}, {"id": "n3", "compute_s": 1, "memory_bytes": 0}],
        [{"src": "n0", "dst": "n1", "bytes": 3}, {"src": "n0", "dst": "n2", "bytes": 3},
         {"src": "n0", "dst": "n3", "bytes": 1}]),
    "m-etf": (
        [{"id": "n0", "compute_s": 4, "memory_bytes": 0}, {"id": "n1", "compute_s": 2, "memory_bytes": 0},
         {"id": "n2", "compute_s": 1, "memory_bytes": 0}, {"id": "n3", "compute_s": 3, "memory_bytes": 0}],
        [{"src": "n0", "dst": "n3", "bytes": 3}, {"src": "n1", "dst": "n3", "bytes": 4},
         {"src": "n2", "dst": "n3", "bytes": 3}]),
}


@pytest.mark.parametrize("algo,told,untold", [("dpos", 8.0, 9.0), ("m-etf", 9.0, 10.0)])
def test_compare_congestion_is_passed_to_the_algorithms(tmp_path, algo, told, untold):
    """--congestion none judges without link contention and tells the
    algorithms so.  Hand values: dpos puts n0, n2 (its critical path) on
    gpu0 [0, 8]; planning for ``channel`` it queues n3's transfer [7, 8]
    behind n1's [4, 7] and keeps n3 on gpu0 [8, 9] (9); planning for
    ``none`` it inserts n3 on gpu1 [5, 6] before n1 [7, 8] (8).  m-etf runs
    n0 on gpu0 [0, 4], n1 [0, 2] and n2 [2, 3] on gpu1; for ``channel`` the
    inputs of n3 reach gpu0 at 9 (4 B then 3 B on one channel) and gpu1 at
    7, so n3 runs on gpu1 [7, 10]; for ``none`` they reach gpu0 at 6:
    [6, 9]."""
    nodes, edges = PLAN_FOR_JUDGE[algo]
    write_json(build("plan", nodes, edges).to_dict(), tmp_path / "plan.json")
    cl = uniform(2, bandwidth=1.0, latency=0.0, name="slow2")
    (row,) = lib.compare([tmp_path / "plan.json"], [cl], [algo], congestion="none")
    assert row["params"]["congestion"] == "none"
    assert row["makespan_s"] == told
    # an explicit -p congestion wins: planned for channel, judged without contention
    (row,) = lib.compare([tmp_path / "plan.json"], [cl], [algo], congestion="none",
                         common_params={"congestion": "channel"})
    assert row["params"]["congestion"] == "channel"
    assert row["makespan_s"] == untold
    # the default judge (channel) tells them channel
    (row,) = lib.compare([tmp_path / "plan.json"], [cl], [algo])
    assert row["params"]["congestion"] == "channel"


def test_compare_congestion_reaches_every_algorithm_that_takes_it():
    """Every registered algorithm with a ``congestion`` parameter gets the
    judge's rule; the others get no such parameter (they would reject it)."""
    for name in registry.names():
        params = lib.algorithm_params(name, {}, {}, None, quick=True, congestion="port")
        if "congestion" in registry.get(name).params:
            assert params["congestion"] == "port", name
        else:
            assert "congestion" not in params, name
    takes = {n for n in registry.names() if "congestion" in registry.get(n).params}
    assert {"adjusting", "dpos", "fd-dps", "m-etf", "m-sct", "os-dpos", "milp", "auto"} <= takes
