"""The HTML pages in a real browser (slow; `make install-browser`): a zoo
placement (`placer simulate --format html`) and `placer compare
sample_graphs/zoo --quick --format html`, opened in headless Chromium from
the system packages, driven by playwright: no console errors, the table and
the chart are there, hovering a bar shows its details, sorting works, and a
screenshot is not blank.  Screenshots are kept in ``$PLACER_SCREENSHOTS``
(a directory) when it is set, to look at."""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
ZOO = Path(__file__).resolve().parents[2] / "sample_graphs" / "zoo"


def png_pixels(data: bytes) -> bytes:
    """The decompressed image data of a PNG (filter bytes included)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is not installed (make install-browser)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def _open(browser, path: Path, shot: str):
    """The page loaded from *path*, its console errors, and a full-page screenshot (PNG bytes)."""
    page = browser.new_page(viewport={"width": 1320, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"network request: {r.url}") if not r.url.startswith(
        ("file:", "data:")) else None)
    page.goto(path.as_uri())
    png = page.screenshot(full_page=True)
    keep = os.environ.get("PLACER_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        Path(keep, shot).write_bytes(png)
    return page, errors, png


def _not_blank(png: bytes) -> None:
    pixels = png_pixels(png)
    assert len(set(pixels)) > 50, "the screenshot looks blank"


def _hover_shows_details(page) -> None:
    bar = page.query_selector("svg.gantt rect[data-i]")
    bar.hover(force=True)
    tip = page.inner_text("#tip")  # one node or transfer, or several narrower than a pixel: "83 nodes a … b"
    assert re.match(r"(\d+ )?(node|transfer)s? ", tip) and "start " in tip and ("device " in tip or "link " in tip)


def test_zoo_placement_page(browser, tmp_path):
    graph = ZOO / "transformer.json.gz"
    placement, html = tmp_path / "p.json", tmp_path / "transformer_heft.html"
    run = CliRunner()
    assert run.invoke(main, ["place", str(graph), "--algo", "heft", "-q", "-o", str(placement)]).exit_code == 0
    res = run.invoke(main, ["simulate", str(graph), "-P", str(placement), "--format", "html", "-o", str(html)])
    assert res.exit_code == 0, res.output
    page, errors, png = _open(browser, html, "zoo_placement.png")
    assert errors == []
    assert page.locator("svg.gantt rect[data-i]").count() > 1000  # 1,300 nodes and their transfers
    assert page.locator("svg.memory").count() == 1 and page.locator("table.sortable").count() >= 2
    _hover_shows_details(page)
    page.check("input[data-cp]")
    assert "cp-on" in page.get_attribute("svg.gantt", "class")
    _not_blank(png)


def test_zoo_compare_page(browser, tmp_path):
    html = tmp_path / "zoo_compare.html"
    res = CliRunner().invoke(main, ["compare", str(ZOO), "--quick", "-j", "2", "--format", "html", "-o", str(html),
                                    "-q", "--allow-failures"])
    assert res.exit_code == 0, res.output
    page, errors, png = _open(browser, html, "zoo_compare.png")
    assert errors == []
    table = page.locator("table.sortable").first
    assert table.locator("tbody tr").count() >= 10  # algorithms as rows (more algorithms than graphs)
    best = table.locator("td.best").count()  # each zoo graph with a placement that fits (not GPT 6.7B on 4 V100s)
    assert best >= 5 and page.locator("svg.gantt").count() == best  # and its best placement drawn
    assert page.locator("svg.strip").count() == 2
    # sorting a graph's column ranks the algorithms on it (OOM and failed cells last)
    table.locator("thead th").nth(1).click()
    values = [float(v) for v in table.locator("tbody tr:not(.fixed) td:nth-child(2)").evaluate_all(
        "cells => cells.map(c => c.dataset.v).filter(v => v !== 'x')")]
    assert values == sorted(values) and values
    _hover_shows_details(page)
    _not_blank(png)


def test_png_pixels_sees_a_blank_image():
    """The blank check is not blind: a white PNG has few distinct bytes."""
    raw = b"".join(b"\x00" + b"\xff" * 30 for _ in range(10))
    chunk = zlib.compress(raw)
    png = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I4s", 13, b"IHDR") + struct.pack(">IIBBBBB", 10, 10, 8, 2, 0, 0, 0)
           + b"\0\0\0\0" + struct.pack(">I4s", len(chunk), b"IDAT") + chunk + b"\0\0\0\0")
    assert len(set(png_pixels(png))) == 2
