"""Round 3 of bad input on the surfaces (issue 33): names that look like
rich markup are text (D1); users' mistakes get a sentence that says what
they did (U1 a file that is not a graph, U2 a placement of another graph,
U3 an algorithm by a name users know)."""

from __future__ import annotations

import gzip

import orjson
import pytest
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


def _fails(res, code: int = 1) -> str:
    """The one error line of a failed run (nothing on stdout, no traceback)."""
    assert res.exit_code == code, res.output
    assert res.stdout == "" and "Traceback" not in res.stderr
    return res.stderr.strip().splitlines()[-1]


def test_a_torch_checkpoint_is_not_a_graph_and_the_error_says_how_to_make_one(tmp_path):
    """U1: `placer place model.pt` said "not valid JSON: str is not valid UTF-8"."""
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl\x80\x02}q\x00")  # torch.save's zip
    line = _fails(CliRunner().invoke(main, ["place", str(pt)]))
    assert line == (f"Error: {pt}: is not a placer graph file (it is a zip archive, as torch.save writes a model or "
                    f"checkpoint); make one from a model with `placer profile --model file.py:Factory -b BATCH -o "
                    f"graph.json` (placer profile --help)")
    pkl = tmp_path / "old.pt"
    pkl.write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.")  # torch.save's legacy pickle format
    assert "(it is a Python pickle (an older torch.save checkpoint)); make one" in _fails(
        CliRunner().invoke(main, ["place", str(pkl)]))
    py = tmp_path / "model.py"
    py.write_text("import torch\n")
    assert "is not a placer graph file (it is text, not JSON)" in _fails(CliRunner().invoke(main, ["place", str(py)]))
    # JSON that is no placer document names the kind expected and how to get one; broken JSON is quoted as before
    other = _write(tmp_path / "other.json", {"weights": [1, 2]})
    assert _fails(CliRunner().invoke(main, ["place", other])).endswith(
        'field schema is None, expected "placer.graph/v1": not a placer graph file; make one from a model with '
        '`placer profile --model file.py:Factory -b BATCH -o graph.json` (placer profile --help)')
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "placer.graph/v1", "nodes": [')
    assert ": not valid JSON: " in _fails(CliRunner().invoke(main, ["place", str(broken)]))
    # a placement that is a checkpoint: how to make a placement
    g = str(SAMPLES / "layered_60.json")
    assert "is not a placer placement file (it is a zip archive" in _fails(
        CliRunner().invoke(main, ["simulate", g, "-P", str(pt)]))
    # gzip data under a plain name: say to name it *.gz
    gz = tmp_path / "g.json"
    gz.write_bytes(gzip.compress((SAMPLES / "layered_60.json").read_bytes()))
    assert _fails(CliRunner().invoke(main, ["place", str(gz)])) == \
        f"Error: {gz}: is gzip-compressed: name it *.gz (placer decompresses those)"


def test_a_placement_of_another_graph_is_named_so(tmp_path):
    """U2: a data-parallel placement of one graph simulated on another complained of the batch
    ("the placement was made for a batch of 128 samples ..."); now it says whose placement it is."""
    small = str(SAMPLES / "layered_60.json")
    other = orjson.loads((SAMPLES / "layered_300.json").read_bytes())
    for algo in ("data-parallel", "heft"):
        placed = CliRunner().invoke(main, ["place", small, "--algo", algo, "--no-timings", "-q"])
        p = _write(tmp_path / f"{algo}.json", orjson.loads(placed.stdout))
        line = _fails(CliRunner().invoke(main, ["simulate", str(SAMPLES / "layered_300.json"), "-P", p]))
        assert line.startswith(f"Error: {p}: this placement was made for graph 'layered_60', not for graph "
                               f"'{other['name']}' (only ")
        assert line.endswith("simulate it with the graph it was made for, or make one for this graph with "
                             "`placer place GRAPH`")
    # the same graph under another name (a renamed copy) is still that graph's placement
    renamed = orjson.loads((SAMPLES / "layered_60.json").read_bytes())
    renamed["name"] = "my_copy"
    res = CliRunner().invoke(main, ["simulate", _write(tmp_path / "copy.json", renamed), "-P", p])
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("alias,algo,stage", [("ddp", "data-parallel", None), ("zero3", "fsdp", 3),
                                              ("zero", "fsdp", 3), ("zero1", "fsdp", 1), ("ZeRO-2", "fsdp", 2),
                                              ("Data_Parallel", "data-parallel", None)])
def test_algorithms_by_the_names_users_know(alias, algo, stage):
    """U3: DDP is data-parallel, ZeRO stages 1-3 are fsdp -p stage=1..3; the placement records the
    registered name and the stage, so it is the file `--algo fsdp -p stage=N` writes."""
    g = str(SAMPLES / "layered_60.json")
    res = CliRunner().invoke(main, ["place", g, "--algo", alias, "--no-timings", "-q"])
    assert res.exit_code == 0, res.stderr
    doc = orjson.loads(res.stdout)
    assert doc["algorithm"] == algo
    if stage is not None:
        assert doc["params"]["stage"] == stage
        plain = CliRunner().invoke(main, ["place", g, "--algo", "fsdp", "-p", f"stage={stage}", "--no-timings", "-q"])
        assert plain.stdout == res.stdout


def test_a_near_miss_gets_a_did_you_mean_and_an_alias_is_not_contradicted():
    g = str(SAMPLES / "layered_60.json")
    line = _fails(CliRunner().invoke(main, ["place", g, "--algo", "fsdb"]), 2)
    assert "unknown algorithm 'fsdb'; did you mean 'fsdp'? (known: " in line and "aliases: ddp, zero" in line
    line = _fails(CliRunner().invoke(main, ["place", g, "--algo", "zero3", "-p", "stage=2"]), 2)
    assert line.endswith("'zero3' is fsdp with stage=3, but stage=2 was given; use --algo fsdp -p stage=2")
    assert _fails(CliRunner().invoke(main, ["compare", g, "--algos", "heft,zero2"]), 2).endswith(
        "'zero2' is fsdp with stage=2; compare takes registered names: --algos fsdp -p fsdp:stage=2")
    assert "did you mean 'heft' or 'm-etf'?" in _fails(CliRunner().invoke(main, ["compare", g, "--algos", "hetf"]), 2)
    help_text = CliRunner().invoke(main, ["place", "--help"]).stdout
    assert "zero3 = fsdp -p stage=3" in " ".join(help_text.split())


def test_the_library_takes_the_aliases_too():
    from celeritas_cli import registry
    from celeritas_cli.errors import InvalidInput
    from celeritas_cli.model.cluster import uniform
    from celeritas_cli.model.generate import layered

    assert registry.get("zero2") is registry.get("fsdp")
    p = registry.place(layered(20, seed=1), uniform(2), "zero1")
    assert p.algorithm == "fsdp" and p.params["stage"] == 1 and p.derivation["steps"][0]["stage"] == 1
    with pytest.raises(InvalidInput, match="did you mean 'single-device'"):
        registry.get("single-devise")
