"""The HTML page of one simulated placement (celeritas_cli/report/): well
formed and self-contained, the Gantt chart's hover data equal to the
schedule (hand-computed), the critical path marked, memory over time drawn
to scale against the capacity, older reports without the memory fields
handled, the caveats said."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.model.placement import Placement
from celeritas_cli.report import placement_page
from celeritas_cli.report.charts import _log_ticks, memory_chart, strip_plot
from celeritas_cli.report.placement import devices_table, notes
from celeritas_cli.sim.simulator import simulate
from tests.report.html_check import parse


@pytest.fixture
def pair():
    """a (1 s) -> b (2 s), one 4-byte tensor over a 4 B/s link: a on gpu0
    [0, 1], the transfer [1, 2], b on gpu1 [2, 4]; makespan 4 s."""
    g = build("pair", [{"id": "a", "op": "matmul", "compute_s": 1, "memory_bytes": 8},
                       {"id": "</script><b>", "op": "relu", "compute_s": 2, "memory_bytes": 16}],
              [{"src": "a", "dst": "</script><b>", "bytes": 4}])
    c = uniform(2, bandwidth=4.0, latency=0.0)
    out: list = []
    rep = simulate(g, c, Placement.from_indices(g, c, [0, 1], algorithm="hand"), schedule_out=out)
    return g, c, out[0], rep


def test_gantt_hover_data_is_the_schedule(pair):
    g, c, sched, rep = pair
    assert rep["makespan_s"] == 4.0
    page = parse(placement_page(sched.graph, c, sched, rep))
    svg = page.find("svg", cls="gantt")
    assert len(svg) == 1
    bars = page.find("rect", data_i=True)
    assert len(bars) == 3  # two nodes and one transfer
    data = orjson.loads(page.by_id(svg[0].attrs["data-chart"]).text)
    assert data["unit"] == "s" and data["factor"] == 1.0
    assert data["lanes"] == ["gpu0", "gpu1", "gpu0→gpu1"] and data["devices"] == 2
    items = {it[0]: it for it in data["items"]}
    assert items["a"][1:7] == ["matmul", 0.0, 1.0, 0, 8, 1]  # op, start, end, lane, bytes, one node
    assert items["</script><b>"][1:7] == ["relu", 2.0, 4.0, 1, 16, 1]
    transfer = next(it for it in data["items"] if it[4] >= data["devices"])
    assert transfer[1:7] == ["a", 1.0, 2.0, 2, 4, 1]  # producer, start, end, the link's lane, bytes
    # the critical path a -> b is marked on both nodes, not on the transfer
    assert items["a"][7] == 1 and items["</script><b>"][7] == 1 and transfer[7] == 0
    assert sum("cp" in b.classes() for b in bars) == 2
    # a node id that closes a script element stays inside its JSON block
    assert "</script><b>" not in page.html


def test_subpixel_bars_are_drawn_together():
    """A chain of 400 nodes of 1 ms and one of 1 s on one device: at 1000 px
    for the axis' 1.6 s the short ones are 0.6 px wide and share bars, each
    bar counting its nodes and spanning them; the long one is drawn alone."""
    nodes = [{"id": f"n{i}", "op": "small", "compute_s": 0.001, "memory_bytes": 1} for i in range(400)]
    nodes.append({"id": "big", "op": "large", "compute_s": 1.0, "memory_bytes": 5})
    edges = [{"src": f"n{i}", "dst": f"n{i + 1}", "bytes": 0} for i in range(399)] + [
        {"src": "n399", "dst": "big", "bytes": 0}]
    g = build("chain", nodes, edges)
    c = uniform(1)
    out: list = []
    rep = simulate(g, c, Placement.from_indices(g, c, [0] * g.n, algorithm="hand"), schedule_out=out)
    page = parse(placement_page(out[0].graph, c, out[0], rep))
    data = orjson.loads(page.by_id("p-gantt").text)
    items = data["items"]
    assert sum(it[6] for it in items) == 401 and len(items) < 300
    assert items[-1][:2] == ["big", "large"] and items[-1][6] == 1
    assert items[0][0] == "n0 … n1" and items[0][2:4] == [0.0, 0.002] and items[0][5] == 2
    assert all(a[3] <= b[2] + 1e-12 for a, b in zip(items, items[1:]))  # bars in time order, not overlapping


def test_page_sections_and_numbers(pair):
    g, c, sched, rep = pair
    page = parse(placement_page(sched.graph, c, sched, rep))
    heads = [h.all_text() for h in page.find("h2")]
    assert heads == ["The plan", "Estimate and caveats", "Schedule", "Memory over time", "Devices", "Link traffic",
                     "Critical path"]
    text = page.html
    assert "operator placement: 2 nodes over 2 devices (gpu0 1, gpu1 1)" in text
    assert "2 nodes, 3 s of computation, 75.0% of the makespan" in text
    assert page.find("input", data_cp="p-gantt-svg")  # the critical-path switch names the chart
    links = [td.all_text() for td in page.find("td")]
    assert "gpu0 → gpu1" in links and "4 B" in links


def _report(capacity: int) -> dict:
    return {"makespan_s": 4.0, "memory_rule": "time",
            "devices": [{"id": "gpu0", "memory_bytes": 300, "capacity_bytes": capacity, "peak_at_s": 1.0,
                         "oom": False, "peak_live": [{"node": "a", "bytes": 200, "kind": "activation"}]},
                        {"id": "gpu1", "memory_bytes": 500, "capacity_bytes": capacity, "peak_at_s": 2.0,
                         "oom": capacity < 500, "peak_live": []}],
            "memory_timeline": {"gpu0": [[0, 100], [1, 300], [3, 100]], "gpu1": [[0, 0], [2, 500], [4, 0]]}}


def test_memory_over_time_to_scale():
    """Scale 0 .. 1.08 x max(peak 500, capacity 400) = 540 B; 250 px per
    second from x = 170; lane 1's base at y = 66, 52 px tall."""
    page = parse("<div>" + memory_chart(_report(400)) + "</div>")
    paths = page.find("path")
    assert paths[0].attrs["d"] == "M170,66.0H170.00V56.4H420.00V37.1H920.00V56.4H1170.00V66.0Z"
    assert paths[0].attrs["stroke"] == "#4e79a7" and paths[1].attrs["stroke"] == "#d62728"  # gpu1 over capacity
    caps = [ln for ln in page.find("line") if (ln.attrs.get("data-tip") or "").startswith("capacity")]
    assert [ln.attrs["y1"] for ln in caps] == ["27.5", "91.5"]
    peak = page.find("circle")[0]
    assert "peak 300 B of 400 B at 1 s" in peak.attrs["data-tip"] and "activation a: 200 B" in peak.attrs["data-tip"]
    assert "OVER capacity by 100 B" in page.find("circle")[1].attrs["data-tip"]
    # a capacity 20x the peak lies above the chart, and the page says so
    far = memory_chart(_report(10_000))
    assert "capacity of" not in far and "lies above the chart" in far


def test_older_report_without_memory_fields():
    old = {"makespan_s": 1.0, "devices": [{"id": "gpu0", "type": "V100", "nodes": 3, "busy_s": 1.0,
                                           "utilisation": 1.0, "memory_bytes": 50, "capacity_bytes": 100,
                                           "oom": False}]}
    html = memory_chart(old)
    assert "no memory_timeline" in html and 'data-tip="gpu0: 50 B of 100 B"' in html
    cells = [td.all_text() for td in parse(devices_table(old)).find("td")]
    assert cells[:9] == ["gpu0", "V100", "3", "1", "100.0%", "0", "50 B", "-", "-"]  # idle = makespan - busy


def test_notes_say_the_caveats():
    rep = {"makespan_s": 2.0, "memory_rule_note": "no resident_bytes: static rule",
           "estimate": {"caveat": "smoke budget", "clock_cut": True, "makespan_s": 1.0, "makespan_by": "model"},
           "devices": [{"id": "gpu1", "oom": True, "memory_bytes": 300, "capacity_bytes": 200,
                        "peak_live": [{"node": "w", "bytes": 100, "kind": "resident"}]}]}
    text = " | ".join(notes(rep))
    assert '<span class="dagger">†</span> smoke budget' in text
    assert "static rule" in text and "wall clock" in text
    assert "estimated 1 s; the simulator" in text and "(-50.0%)" in text
    assert "gpu1 is over memory" in text and "w (resident, 100 B)" in text
    assert notes({"makespan_s": 1.0, "estimate": {"makespan_s": 1.0}}) == []


def test_strip_plot_axes():
    assert _log_ticks(0.003, 20) == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]
    svg = strip_plot(["heft", "m-topo"], [("heft", 2.0, "g1", "g1 / heft"), ("m-topo", 4.0, "g1", "x"),
                                          ("heft", 3.0, "g2", "y"), ("m-topo", None, "g2", "failed")],
                     ["g1", "g2"], ["#111", "#222"], "makespan / LB", reference=1.0)
    page = parse("<div>" + svg + "</div>")
    dots = [c for c in page.find("circle") if c.attrs.get("data-tip")]
    assert [d.attrs["data-tip"] for d in dots] == ["g1 / heft", "x", "y"]  # the failed cell has no dot
    assert "(log scale)" not in svg  # 1 .. 4 spans less than 30x


def test_simulate_format_html(tmp_path, pair):
    g, c, sched, rep = pair
    gf, cf, pf, out = tmp_path / "g.json", tmp_path / "c.json", tmp_path / "p.json", tmp_path / "page.html"
    write_json(g.to_dict(), gf)
    write_json(c.to_dict(), cf)
    write_json(Placement.from_indices(g, c, [0, 1], algorithm="hand").to_dict(), pf)
    res = CliRunner().invoke(main, ["simulate", str(gf), "-P", str(pf), "-c", str(cf), "--format", "html",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # the page went to the file, nothing else to stdout
    page = parse(out.read_text())
    assert page.find("svg", cls="gantt") and "pair by hand on" in page.find("title")[0].all_text()
