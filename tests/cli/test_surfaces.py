"""Round 3 of bad input on the surfaces (issue 33): names that look like
rich markup are text (D1); users' mistakes get a sentence that says what
they did (U1 a file that is not a graph, U2 a placement of another graph,
U3 an algorithm by a name users know)."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.model.io import bundled_cluster

from ..conftest import SAMPLES


def _write(path, doc) -> str:
    path.write_bytes(orjson.dumps(doc))
    return str(path)


def test_markup_in_graph_name_and_device_id_is_printed_as_text(tmp_path):
    """D1: "[/x]" in a graph name and "[/b]" in a device id: rich would raise
    MarkupError (a closing tag that matches no open tag); "[b]" would vanish
    as a style.  The table prints them as they read."""
    graph = orjson.loads((SAMPLES / "layered_60.json").read_bytes())
    graph["name"] = "evil[/x]name[b]"
    cluster = bundled_cluster("4xV100-pcie").to_dict()
    cluster["devices"][1]["id"] = "[/b]gpu1"
    g = _write(tmp_path / "g.json", graph)
    c = _write(tmp_path / "c.json", cluster)
    placed = CliRunner().invoke(main, ["place", g, "--algo", "single-device", "-c", c, "--no-timings"])
    assert placed.exit_code == 0, placed.stderr
    doc = orjson.loads(placed.stdout)
    doc["assignment"] = {k: "[/b]gpu1" for k in doc["assignment"]}
    p = _write(tmp_path / "p.json", doc)
    res = CliRunner().invoke(main, ["simulate", g, "-P", p, "-c", c, "--format", "table"])
    assert res.exit_code == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "evil[/x]name[b] on 4xV100-pcie" in res.stdout
    row = next(line for line in res.stdout.splitlines() if line.startswith("│ [/b]gpu1 "))
    assert "│    60 │" in row  # all 60 nodes on the device whose id looks like a closing tag
