"""Gantt charts: op-type colours with a legend, round ticks, axis titles, the lower-bound line."""

from __future__ import annotations

import math
import re

import pytest

from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.gantt import OP_PALETTE, PALETTE, gantt_svg, nice_ticks, op_colours, write_gantt
from celeritas_cli.sim.simulator import lower_bound, simulate

from .conftest import edge, node


@pytest.fixture
def sched_and_graph():
    # ten op types; "mm" is the busiest, then "conv"; a transfer gpu0 -> gpu1
    ops = ["mm", "mm", "conv", "conv", "relu", "add", "bn", "pool", "gelu", "softmax", "drop", "norm"]
    nodes = [node(f"v{i}", 1.0 + (3 if op == "mm" else 1 if op == "conv" else 0) * 0.5, op=f"aten.{op}")
             for i, op in enumerate(ops)]
    edges = [edge(f"v{i}", f"v{i + 1}", 100) for i in range(len(ops) - 1)]
    g = build("g", nodes, edges)
    c = uniform(2, bandwidth=100.0, latency=0.0)
    p = Placement.from_indices(g, c, [0] * 6 + [1] * 6, algorithm="given")
    scheds: list = []
    simulate(g, c, p, schedule_out=scheds)
    return g, c, scheds[0]


@pytest.mark.parametrize("span", [1e-7, 3.3e-6, 0.9795, 1.0, 7.0, 1234.0, 5e11])
def test_ticks_are_round_and_cover_the_span(span):
    ticks = nice_ticks(span)
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))
    assert ticks[0] == 0 and ticks[-1] <= span * (1 + 1e-9) and ticks[-1] + step > span
    assert 4 <= len(ticks) <= 9
    assert all(math.isclose(t, i * step, rel_tol=1e-9, abs_tol=1e-30) for i, t in enumerate(ticks))


def test_op_types_ranked_by_busy_time_with_their_own_palette(sched_and_graph):
    g, _, sched = sched_and_graph
    colours, legend = op_colours(g, sched)
    assert [lab for lab, _, _ in legend[:2]] == ["mm", "conv"]          # busiest first
    assert legend[-1][0] == "other (2 types)"                          # 10 types, 8 colours
    assert math.isclose(sum(share for *_, share in legend), 1.0)
    assert len(set(colours.values())) == len(OP_PALETTE) == len(colours)
    assert not set(colours.values()) & set(PALETTE)                    # never an algorithm colour of compare


def test_svg_has_legend_round_ticks_axis_titles_and_lower_bound(sched_and_graph):
    g, c, sched = sched_and_graph
    lb = lower_bound(g, c)
    svg = gantt_svg(g, c, sched, title="t", lower_bound=lb)
    # shares of the 16 s of compute: mm 2 x 2.5 s, conv 2 x 1.5 s, the two least busy types 2 x 1 s
    for text in ("mm 31%", "conv 19%", "other (2 types) 12%", "transfer", "time (s)", "device / link",
                 f"lower bound {lb:.4g} s", f"makespan / LB {sched.makespan / lb:.3f}"):
        assert text in svg, text
    assert 'stroke-dasharray="5,3"' in svg
    labels = re.findall(r'text-anchor="middle">([0-9.e+-]+)</text>', svg)
    assert labels and all(float(x) == round(float(x), 6) for x in labels)
    assert sched.makespan == 17.0  # 16 s of compute in a chain plus one 1-s transfer
    assert labels == ["0", "2.5", "5", "7.5", "10", "12.5", "15"]  # 17 s / 8 ticks at most: steps of 2.5 s
    assert "lower bound" not in gantt_svg(g, c, sched)  # no line without a bound


def test_png_gantt(tmp_path, sched_and_graph):
    pytest.importorskip("matplotlib")
    g, c, sched = sched_and_graph
    out = tmp_path / "g.png"
    write_gantt(g, c, sched, str(out), title="t", lower_bound=lower_bound(g, c))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
