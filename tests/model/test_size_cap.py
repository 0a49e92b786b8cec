"""A cap on one input document, decompressed (issue 24, N17: a 1 MB gzip
file of 1 GB whitespace was read whole, 2.1 GB of memory): refused in one
line, with memory bounded by the cap while reading."""

from __future__ import annotations

import gzip
import io
import sys
import tracemalloc

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.compare.inputs import discover_graphs
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model import limits
from celeritas_cli.model.jsonio import TooLarge, max_input_bytes, read_bytes, read_json, unpack

from ..conftest import ROOT

MIB = 1 << 20
LAYERED_60 = (ROOT / "sample_graphs" / "layered_60.json").read_bytes()


def _bomb(path, mib: int, head: bytes = LAYERED_60[:-2]) -> None:
    """*head* then *mib* MiB of spaces then the end of the document, gzip-compressed chunk by chunk
    (the bomb of the reproducer has layered_60's opening and 1 GiB of whitespace)."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(head)
        spaces = b" " * MIB
        for _ in range(mib):
            fh.write(spaces)
        fh.write(LAYERED_60[-2:])


@pytest.fixture
def cap_1mib(monkeypatch):
    monkeypatch.setenv("PLACER_MAX_INPUT_MB", "1")


def test_default_cap_and_its_override(monkeypatch):
    monkeypatch.delenv("PLACER_MAX_INPUT_MB", raising=False)
    assert max_input_bytes() == limits.INPUT_BYTES_MAX == 512 * MIB
    monkeypatch.setenv("PLACER_MAX_INPUT_MB", "2048")
    assert max_input_bytes() == 2048 * MIB
    for bad in ("0", "-5", "1.5", "lots"):
        monkeypatch.setenv("PLACER_MAX_INPUT_MB", bad)
        with pytest.raises(InvalidInput, match="PLACER_MAX_INPUT_MB=.*whole number of megabytes"):
            max_input_bytes()


def test_gzip_bomb_is_refused_in_one_line(tmp_path, cap_1mib):
    """The N17 command with the cap at 1 MiB and an 8 MiB bomb (same shape, smaller)."""
    bomb = tmp_path / "gzip_bomb.graph.json.gz"
    _bomb(bomb, 8)
    placement = str(ROOT / "examples" / "expert_placement.json")
    res = CliRunner().invoke(main, ["simulate", str(bomb), "-P", placement])
    assert res.exit_code == 1 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"Error: {bomb}: decompresses to more than 1 MiB, the most placer reads from one document; "
        f"set PLACER_MAX_INPUT_MB to a larger number of MiB if the file is meant to be this large")


def test_memory_stays_within_the_cap_while_reading(tmp_path, cap_1mib):
    """64 MiB decompressed, cap 1 MiB: what is allocated while reading stays near the cap (the cap,
    the chunk being added, gzip's own buffers: about 4 MiB, never the 64 MiB)."""
    bomb = tmp_path / "b.json.gz"
    _bomb(bomb, 64)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge):
            read_bytes(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * MIB


def test_under_the_cap_reads_as_before(tmp_path, cap_1mib):
    ok = tmp_path / "ok.json.gz"
    _bomb(ok, 0)
    assert read_json(ok)["name"] == "layered_60"
    plain = tmp_path / "ok.json"
    plain.write_bytes(LAYERED_60 + b" " * (MIB - len(LAYERED_60)))  # exactly the cap
    assert read_json(plain)["name"] == "layered_60"
    assert unpack(gzip.compress(LAYERED_60), "x.json.gz") == LAYERED_60


def test_plain_file_stdin_and_shipped_bytes_over_the_cap(tmp_path, cap_1mib, monkeypatch):
    big = tmp_path / "big.json"
    big.write_bytes(LAYERED_60 + b" " * MIB)
    with pytest.raises(TooLarge, match=rf"big.json: is {MIB + len(LAYERED_60):,} bytes, more than 1 MiB"):
        read_bytes(big)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(big.read_bytes())))
    with pytest.raises(TooLarge, match=r"<stdin>: is more than 1 MiB"):
        read_bytes("-")
    with pytest.raises(TooLarge, match=r"g.json: is more than 1 MiB"):
        unpack(big.read_bytes(), "g.json")
    with pytest.raises(TooLarge, match=r"g.json.gz: decompresses to more than 1 MiB"):
        unpack(gzip.compress(big.read_bytes()), "g.json.gz")
    with pytest.raises(InvalidInput, match=r"g.json.gz: not a valid gzip file"):
        unpack(b"not gzip", "g.json.gz")


def test_directory_scan_does_not_skip_a_graph_over_the_cap(tmp_path, cap_1mib):
    """compare's directory scan reads a whole file only when its schema tag is not in the first
    64 KiB: over the cap that is an error, not a silently missing graph."""
    _bomb(tmp_path / "late_tag.json.gz", 2, head=b'{"nodes": [], "edges": [],' + b" " * 70000
          + b'"schema": "placer.graph/v1"')
    with pytest.raises(TooLarge, match="late_tag.json.gz: decompresses to more than 1 MiB"):
        discover_graphs([tmp_path])
    (tmp_path / "late_tag.json.gz").unlink()
    (tmp_path / "g.json").write_bytes(orjson.dumps(orjson.loads(LAYERED_60)))
    assert discover_graphs([tmp_path]) == [str(tmp_path / "g.json")]
