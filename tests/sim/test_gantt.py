"""simulate --gantt: op-type colours with a legend, round ticks in a fitting
unit, axis titles, the labelled lower-bound line; PNG written atomically."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.gantt import (
    OTHER_OPS,
    PALETTE,
    gantt_svg,
    legend_entries,
    op_colours,
    write_gantt,
)
from celeritas_cli.sim.simulator import lower_bound, simulate

from ..conftest import SAMPLES, edge, node


@pytest.fixture
def chart():
    """A chain of 12 nodes of 10 op types (mm 2 x 2.5 s, conv 2 x 1.5 s, eight
    types 1 s each) split 6/6 over two devices: 16 s of compute plus one 1-s
    transfer, makespan 17 s, lower bound 16 s (the chain)."""
    ops = ["mm", "mm", "conv", "conv", "relu", "add", "bn", "pool", "gelu", "softmax", "drop", "norm"]
    nodes = [node(f"v{i}", {"mm": 2.5, "conv": 1.5}.get(op, 1.0), op=f"aten.{op}") for i, op in enumerate(ops)]
    g = build("g", nodes, [edge(f"v{i}", f"v{i + 1}", 100) for i in range(len(ops) - 1)])
    c = uniform(2, bandwidth=100.0, latency=0.0)
    scheds: list = []
    simulate(g, c, Placement.from_indices(g, c, [0] * 6 + [1] * 6, algorithm="given"), schedule_out=scheds)
    return g, c, scheds[0]


def test_op_types_ranked_by_busy_time(chart):
    g, _, sched = chart
    colours, busy = op_colours(g, sched)
    assert sched.makespan == 17.0 and busy["aten.mm"] == 5.0
    assert colours["aten.mm"] == PALETTE[0] and colours["aten.conv"] == PALETTE[1]
    assert colours["aten.softmax"] == OTHER_OPS  # ten types, nine colours: the last of the 1-s ties by name
    labels = [lbl for lbl, _ in legend_entries(g, sched)]
    assert labels[:2] == ["mm 31%", "conv 19%"] and labels[-2:] == ["other ops 6%", "transfer"]


def test_svg_has_legend_round_ticks_axis_titles_and_lower_bound(chart):
    g, c, sched = chart
    lb = lower_bound(g, c)
    assert lb == 16.0
    svg = gantt_svg(g, c, sched, title="t", lower_bound=lb)
    for text in ("mm 31%", "other ops 6%", ">transfer<", ">time (s)<", "device / link", "lower bound 16 s",
                 "makespan / LB 1.062", 'stroke-dasharray="5,3"'):
        assert text in svg, text
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', svg)
    assert labels[:5] == ["0", "5", "10", "15", "20"]  # 17 s in at most 6 intervals: steps of 5 s
    assert svg.index('stroke="#ccc"') < svg.index("<title>")  # grid drawn under the bars
    assert "lower bound" not in gantt_svg(g, c, sched)  # no line without a bound


def test_small_makespans_are_labelled_in_ms():
    g = build("tiny", [node("a", 0.002), node("b", 0.002)], [edge("a", "b", 0)])
    c = uniform(1)
    scheds: list = []
    simulate(g, c, Placement.from_indices(g, c, [0, 0], algorithm="given"), schedule_out=scheds)
    svg = gantt_svg(g, c, scheds[0])
    assert ">time (ms)<" in svg
    assert re.findall(r'text-anchor="middle">([^<]+)</text>', svg)[:5] == ["0", "1", "2", "3", "4"]


def test_png_gantt(tmp_path, chart):
    pytest.importorskip("matplotlib")
    g, c, sched = chart
    out = tmp_path / "g.png"
    write_gantt(g, c, sched, str(out), title="t", lower_bound=lower_bound(g, c))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["g.png"]  # no temporary file left


def test_simulate_gantt_draws_the_reports_lower_bound(tmp_path):
    g60 = str(SAMPLES / "layered_60.json")
    p = tmp_path / "p.json"
    svg = tmp_path / "g.svg"
    assert CliRunner().invoke(main, ["place", g60, "--algo", "heft", "-o", str(p)]).exit_code == 0
    r = CliRunner().invoke(main, ["simulate", g60, "-P", str(p), "--gantt", str(svg)])
    assert r.exit_code == 0
    import orjson

    lb = orjson.loads(r.stdout)["lower_bound_s"]
    assert f"lower bound {lb:.4g} s" in svg.read_text()


@pytest.fixture
def memory_chart():
    """a (40 B resident + 60 B activation, 1 s) on gpu0 sends 50 B (1 s) to b (30 B) on gpu1;
    capacities 100 B: gpu0 peaks at 100 (t=0), gpu1 at 80 (t=2)."""
    g = build("m", [node("a", 1, 100, resident_bytes=40), node("b", 1, 30, resident_bytes=0)],
              [edge("a", "b", 50)])
    c = uniform(2, memory=100, bandwidth=50.0, latency=0.0)
    scheds: list = []
    rep = simulate(g, c, Placement.from_indices(g, c, [0, 1], algorithm="given"), schedule_out=scheds)
    return g, c, scheds[0], rep


def test_svg_memory_lanes_under_the_chart(memory_chart):
    g, c, sched, rep = memory_chart
    assert [d["memory_bytes"] for d in rep["devices"]] == [100, 80]
    svg = gantt_svg(g, c, sched, memory=rep)
    assert "memory (time rule)" in svg and "live memory" in svg and "device capacity" in svg
    assert svg.count("<polyline") == 2 and svg.count("<title>capacity 100 bytes</title>") == 2
    assert "polyline" not in gantt_svg(g, c, sched)  # no lanes without the report
    # gpu1's lane: 0 until the transfer starts (t=1), 50 B received, then b's 30 B from t=2 until t=3
    assert rep["memory_timeline"]["gpu1"] == [[0.0, 0], [1.0, 50], [2.0, 80], [3.0, 0]]


def test_trace_has_a_memory_counter_per_device(memory_chart):
    from celeritas_cli.sim.gantt import chrome_trace

    g, c, sched, rep = memory_chart
    counters = [e for e in chrome_trace(g, c, sched, rep)["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"memory gpu0", "memory gpu1"}
    assert [(e["ts"], e["args"]["bytes"]) for e in counters if e["name"] == "memory gpu1"] == \
        [(0.0, 0), (1e6, 50), (2e6, 80), (3e6, 0)]
    assert not [e for e in chrome_trace(g, c, sched)["traceEvents"] if e["ph"] == "C"]


def test_png_memory_lanes(tmp_path, memory_chart):
    pytest.importorskip("matplotlib")
    g, c, sched, rep = memory_chart
    out = tmp_path / "m.png"
    write_gantt(g, c, sched, str(out), memory=rep)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_memory_option_table_gantt_and_trace(tmp_path):
    import orjson

    g60 = str(SAMPLES / "layered_60.json")
    p, svg, trace = tmp_path / "p.json", tmp_path / "g.svg", tmp_path / "t.json"
    assert CliRunner().invoke(main, ["place", g60, "--algo", "m-topo", "-o", str(p)]).exit_code == 0
    r = CliRunner().invoke(main, ["simulate", g60, "-P", str(p), "--gantt", str(svg), "--trace", str(trace)])
    rep = orjson.loads(r.stdout)
    assert r.exit_code == 0 and rep["memory_rule"] == "time"
    for d in rep["devices"]:  # the peak is at most the static sum plus the buffers received
        received = sum(ln["bytes"] for ln in rep["links"] if ln["dst"] == d["id"])
        assert d["memory_bytes"] <= d["static_memory_bytes"] + received
    assert svg.read_text().count("<polyline") == 4
    assert any(e["ph"] == "C" for e in orjson.loads(trace.read_bytes())["traceEvents"])
    t = CliRunner().invoke(main, ["simulate", g60, "-P", str(p), "--memory", "static", "--format", "table"])
    assert t.exit_code == 0 and "memory rule: static" in t.output and "peak under the static rule" in t.output
    bad = CliRunner().invoke(main, ["simulate", g60, "-P", str(p), "--memory", "peak"])
    assert bad.exit_code == 2
