"""`placer compare --format html` (celeritas_cli/compare/html.py), tables
that fit the terminal (compare/formats.py) and `--algos` groups
(compare/inputs.py)."""

from __future__ import annotations

import base64
import gzip

import orjson
import pytest
from click.testing import CliRunner
from rich.cells import cell_len

from celeritas_cli import compare as lib
from celeritas_cli.cli import main
from celeritas_cli.cli.compare_cmd import _algorithms
from celeritas_cli.compare.formats import format_table, matrix, table_layout
from celeritas_cli.compare.html import compare_page
from celeritas_cli.compare.inputs import ALGORITHM_GROUPS, PARALLELISM_PLANNERS, algorithm_group
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.model.io import load_graph
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate
from tests.report.html_check import parse

ALGOS = ["single-device", "heft", "m-topo"]


@pytest.fixture
def files(tmp_path):
    """chain3 (a -> b -> c, 10 B each) and fork (s -> x, y -> j, 40 B each)
    on two devices of 100 B: fork on one device needs 160 B (OOM)."""
    chain = build("chain3", [{"id": v, "compute_s": t, "memory_bytes": 10} for v, t in (("a", 1), ("b", 2), ("c", 3))],
                  [{"src": "a", "dst": "b", "bytes": 100}, {"src": "b", "dst": "c", "bytes": 100}])
    fork = build("fork", [{"id": v, "compute_s": t, "memory_bytes": 40} for v, t in
                          (("s", 1), ("x", 4), ("y", 4), ("j", 1))],
                 [{"src": "s", "dst": "x", "bytes": 100}, {"src": "s", "dst": "y", "bytes": 100},
                  {"src": "x", "dst": "j", "bytes": 100}, {"src": "y", "dst": "j", "bytes": 100}])
    write_json(chain.to_dict(), tmp_path / "chain3.json")
    write_json(fork.to_dict(), tmp_path / "fork.json")
    cl = uniform(2, memory=100, bandwidth=100.0, latency=0.0, name="tiny2")
    write_json(cl.to_dict(), tmp_path / "tiny2.json")
    return tmp_path, cl


def test_compare_page(files, tmp_path):
    d, cl = files
    out = tmp_path / "cmp.html"
    res = lib.run_compare([str(d / "chain3.json"), str(d / "fork.json")], [cl], ALGOS,
                          lib.CompareOptions(fmt="html", output=str(out), progress=False))
    page = parse(out.read_text())
    rows = res.rows
    m = matrix(rows, "makespan_s", ALGOS)
    # three algorithms over two graphs: algorithms as rows, one column per graph
    tables = page.find("table", cls="sortable")
    results = tables[0]
    heads = [th.all_text() for th in page.find("th") if th.parent.parent.parent is results]
    assert heads == ["algorithm", "chain3", "fork"]
    best = [td for td in page.find("td", cls="best")]
    assert sorted(td.all_text() for td in best) == sorted(mr["cells"][mr["best"]] for mr in m["rows"])
    assert m["rows"][0]["cells"]["single-device"] == "6"  # chain3 on one device: 1 + 2 + 3
    oom = [td for td in page.find("td", cls="oom") if td.parent.parent.parent is results]
    assert [td.all_text() for td in oom] == ["OOM"]  # fork on one device: 160 B > 100 B
    # every results cell links to its row under Cells
    targets = {a.attrs["href"][1:] for a in page.find("a") if a.attrs.get("href", "").startswith("#cell-")}
    assert len(targets) == 6 and all(page.by_id(t).tag == "td" for t in targets)
    # each cell's placement is in the page; simulated again, it gives the row's makespan
    links = [a for a in page.find("a") if a.attrs.get("download")]
    assert len(links) == 6
    by_name = {(r["graph"], r["algorithm"]): r for r in rows}
    for a in links:
        doc = orjson.loads(gzip.decompress(base64.b64decode(a.attrs["href"].split(",", 1)[1])))
        graph_name, _, algo = a.attrs["download"].removesuffix(".placement.json.gz").split("__")
        row = by_name[(graph_name, algo)]
        rep = simulate(load_graph(row["graph_file"]), cl, Placement.from_dict(doc))
        assert rep["makespan_s"] == row["makespan_s"] and rep["status"] == row["status"]
    # the best placement of each graph is drawn in full
    assert len(page.find("svg", cls="gantt")) == 2 and len(page.find("svg", cls="strip")) == 2
    assert [h.all_text() for h in page.find("h2") if h.attrs.get("id", "").startswith("best-")] == [
        f"Best placement: {mr['graph']} on tiny2 by {mr['best']}" for mr in m["rows"]]


def test_html_never_replaces_the_resume_file(files, tmp_path):
    d, cl = files
    runs = tmp_path / "runs.ndjson"
    base = ["compare", str(d / "chain3.json"), "-c", str(d / "tiny2.json"), "--algos", "heft", "-q"]
    assert CliRunner().invoke(main, base + ["--format", "json", "-o", str(runs)]).exit_code == 0
    before = runs.read_bytes()
    res = CliRunner().invoke(main, base + ["--format", "html", "--resume", str(runs), "-o", str(runs)])
    assert res.exit_code == 1 and "would replace its rows" in res.output and runs.read_bytes() == before
    page = tmp_path / "page.html"
    res = CliRunner().invoke(main, base + ["--format", "html", "--resume", str(runs), "-o", str(page)])
    assert res.exit_code == 0 and 'class="best"' in page.read_text()  # resumed rows, no cell run


def test_compare_page_of_resumed_rows_has_no_placements():
    rows = [{"graph": "g", "graph_file": "g.json", "cluster": "c", "algorithm": a, "status": st, "makespan_s": t,
             "lower_bound_s": 1.0, "makespan_over_lb": t, "placement_time_s": 0.1, "caveat": cv}
            for a, st, t, cv in (("heft", "OK", 2.0, None), ("m-sct", "OK", 1.5, "greedy favourite children"),
                                 ("m-topo", "OOM", 1.0, None))]
    page = parse(compare_page(rows, ["heft", "m-sct", "m-topo"]))
    best = page.find("td", cls="best")
    assert [td.all_text() for td in best] == ["1.5†"]  # OOM's 1.0 is not a makespan that counts
    assert "greedy favourite children" in best[0].attrs["data-tip"]
    assert not [a for a in page.find("a") if a.attrs.get("download")]
    assert "† m-sct on g: greedy favourite children" in page.html


ZOO = ["gpt_1.3b_b8", "gpt_6.7b_b16", "inception_v3_b512", "nmt_b512", "resnet50_b256", "tensor_holography_b32",
       "transformer_b256"]  # the graphs of sample_graphs/zoo


def _zoo_rows(algos: list[str]) -> list[dict]:
    rows = []
    for gi, g in enumerate(ZOO):
        for ai, a in enumerate(algos):
            t = 0.1 + 1.37 * ((gi * 7 + ai * 3) % 11)
            rows.append({"graph": g, "graph_file": f"zoo/{g}.json.gz", "cluster": "4xV100-pcie", "algorithm": a,
                         "status": "OOM" if a == "single-device" else "OK", "makespan_s": t,
                         "lower_bound_s": 0.1, "makespan_over_lb": t / 0.1, "placement_time_s": 0.0123 * ai,
                         "caveat": "smoke budget" if a == "hierarchical" else None})
    return rows


def test_zoo_table_fits_120_columns():
    """The zoo compare (7 graphs x every algorithm) is ~230 columns wide with
    graphs as rows; at 120 columns the algorithms become rows, the graph
    names fold at ``_`` in the headers, and it fits in one piece."""
    algos = sorted(set(lib.default_algorithms()) | {"hierarchical"})
    rows = _zoo_rows(algos)
    assert table_layout(matrix(rows, "makespan_s", algos), 120) == (True, True)
    text = format_table(rows, algos, width=120)
    widths = [cell_len(line.rstrip()) for line in text.splitlines()]
    assert max(widths) <= 120
    assert "algorithms as rows" in text and "(1/" not in text
    for a in algos:  # one line per algorithm in each of the three tables
        assert sum(1 for line in text.splitlines() if line.startswith(f"│ {a} ")) == 3
    wide = format_table(rows, algos, width=400)
    assert "algorithms as rows" not in wide and max(cell_len(x.rstrip()) for x in wide.splitlines()) > 120


def test_narrow_terminal_splits_the_columns():
    algos = lib.default_algorithms()
    rows = _zoo_rows(algos)
    text = format_table(rows, algos, width=60)
    assert max(cell_len(line.rstrip()) for line in text.splitlines()) <= 60
    assert "(1/" in text  # the graph columns in groups, labels repeated
    for g in ZOO:  # every graph's name, folded in its header
        assert all(part in text for part in g.split("_"))


def test_cli_table_fits_columns(files):
    d, cl = files
    res = CliRunner().invoke(main, ["compare", str(d / "chain3.json"), str(d / "fork.json"), "-c", str(d / "tiny2.json"),
                                    "--algos", "placement", "--exclude", "auto,milp,hierarchical,m-sct,os-dpos",
                                    "--quick", "-q"], env={"COLUMNS": "70"})
    assert res.exit_code == 0, res.output
    assert max(cell_len(line.rstrip()) for line in res.stdout.splitlines()) <= 70


def test_algorithm_groups():
    placement, pipelines = algorithm_group("placement"), algorithm_group("pipelines")
    assert "heft" in placement and "auto" in placement and "data-parallel" not in placement
    assert pipelines == [a for a in lib.default_algorithms() if a in PARALLELISM_PLANNERS or a == "auto"]
    assert algorithm_group("all") == algorithm_group("default") == lib.default_algorithms()
    assert set(placement) | set(pipelines) == set(lib.default_algorithms())
    with pytest.raises(InvalidInput, match="unknown algorithm group"):
        algorithm_group("nope")
    assert _algorithms("heft,pipelines", "auto") == ["heft"] + [a for a in pipelines if a != "auto"]
    assert {"data-parallel", "fsdp"} <= set(pipelines)
    res = CliRunner().invoke(main, ["compare", "x.json", "--algos", "placement", "--exclude", "all"])
    assert res.exit_code == 2 and "no algorithm left" in res.output
    res = CliRunner().invoke(main, ["compare", "x.json", "--algos", "heft,nosuch"])
    assert res.exit_code == 2 and "unknown algorithm 'nosuch'" in res.output and "groups: default" in res.output
    helptext = " ".join(CliRunner().invoke(main, ["compare", "--help"]).output.split())
    for name in ALGORITHM_GROUPS:
        assert f"{name}:" in helptext
