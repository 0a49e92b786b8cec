"""Progress on long work (celeritas_cli/log.py ``Progress``): a rich bar on a
terminal, plain lines when stderr is piped, nothing with -q - for `placer
compare` and for auto (`placer place`)."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from rich.console import Console

from celeritas_cli import log
from celeritas_cli.algorithms.auto import auto
from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.jsonio import write_json


@pytest.fixture
def terminal(monkeypatch):
    """stderr as a terminal: the bar is drawn into a buffer."""
    buf = io.StringIO()
    monkeypatch.setattr(log, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(log, "stderr_console", lambda: Console(file=buf, force_terminal=True, width=100))
    return buf


def test_modes(terminal, capsys):
    with log.Progress("work", total=3) as bar:
        assert bar.mode == "bar"
        bar.update(advance=2, description="step two")
        bar.line("a line above the bar")
    drawn = terminal.getvalue()
    assert "step two" in drawn and "2/3" in drawn and "a line above the bar" in drawn and "━" in drawn
    with log.Progress("work", total=3, mode="lines") as bar:
        bar.update(advance=1)  # nothing to draw
        bar.line("plain line")
    with log.quiet(), log.Progress("work", total=3) as bar:
        assert bar.mode == "off"
        bar.line("not shown")
        bar.note("a failure is always said")
    err = capsys.readouterr().err
    assert err == "plain line\na failure is always said\n"


def test_compare_progress_lines_and_quiet(tmp_path):
    g, c = tmp_path / "g.json", tmp_path / "c.json"
    write_json(layered(60, seed=1).to_dict(), g)
    write_json(uniform(2, name="two").to_dict(), c)
    base = ["compare", str(g), "--algos", "heft,m-topo", "--format", "csv"]
    piped = CliRunner().invoke(main, base + ["-c", str(c)])  # CliRunner's stderr is not a terminal
    assert piped.exit_code == 0, piped.output
    lines = [ln for ln in piped.stderr.splitlines() if ln.startswith("compare: ")]
    assert [ln.split(" / ")[0] for ln in lines] == ["compare: 1/2 g.json", "compare: 2/2 g.json"]
    assert lines[0].endswith(("s", "OK")) and "heft: OK, makespan" in lines[0]
    quiet = CliRunner().invoke(main, base + ["-q"])  # no --cluster: the default, said only without -q
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.startswith("graph,")
    assert "no --cluster given" in CliRunner().invoke(main, base + ["--no-progress"]).stderr


def test_auto_bar_on_a_terminal(terminal):
    auto(layered(60, seed=1), uniform(2), evaluations=40)
    drawn = terminal.getvalue()
    assert "auto: candidate" in drawn and "━" in drawn and "/40" in drawn


def test_auto_quiet(terminal, capsys):
    with log.quiet():
        auto(layered(60, seed=1), uniform(2), evaluations=40)
    assert terminal.getvalue() == "" and capsys.readouterr().err == ""


def test_place_quiet(tmp_path):
    g = tmp_path / "g.json"
    write_json(layered(60, seed=1).to_dict(), g)
    loud = CliRunner().invoke(main, ["place", str(g), "-p", "evaluations=30", "--no-timings"])
    quiet = CliRunner().invoke(main, ["place", str(g), "-p", "evaluations=30", "--no-timings", "-q"])
    assert loud.exit_code == quiet.exit_code == 0
    assert "auto: candidate" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout  # -q changes what is said, not the placement
