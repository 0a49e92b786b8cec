"""Every `placer` line of the examples of README.md and of every docs/*.md
page runs as written, in order, from the repository root of a fresh clone
(issues 15.11 and 32.4).

The examples are read from the pages when the tests run, so they cover
whatever the pages say.  Each page stands alone: its lines may read only
files of the repository or files an earlier line of the same page writes.
The default suite checks each line statically: its options parse, its
algorithm, parameters and cluster exist, and every file it reads is in the
repository or written by an earlier line; it also checks that the README
stays one page and that every relative link of the pages leads to a file
and a heading that exist.  The slow tests run every page's lines verbatim
with bash in a directory laid out like a fresh clone (one directory per
page) and need exit status 0 and no traceback; lines needing an extra that
is not installed (ray; torch skips the whole page, since later lines read
what the torch lines write) are skipped.  They also run the ``python``
blocks of docs/library.md, the library's examples, as one script.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.model.io import bundled_cluster_names

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The pages whose examples must run: the README, then every page of docs/.
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
#: The most characters the README may have (issue 32.4: one page, read in five minutes).
README_MAX_CHARS = 12_000
#: Options whose value is a file placer writes.
OUTPUT_OPTIONS = {"-o", "--output", "--gantt", "--trace", "--plot", "--cluster-out"}
#: Files of a fresh clone the test directory links to.
CLONE = ("celeritas_cli", "docs", "examples", "sample_graphs", "schemas", "scripts", "benchmarks", "tests",
         "README.md", "pyproject.toml", "Makefile")


def strip_comment(line: str) -> str:
    """The command without its trailing ``# comment`` (a ``#`` outside quotes after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _blocks(text: str, languages: tuple[str, ...]):
    """``(line number, line)`` of every line inside a fenced code block whose
    language is one of *languages*, in order."""
    fenced, wanted = False, False
    for no, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):  # an opening fence names the language; a closing one ends any block
            fenced = not fenced
            wanted = fenced and stripped[3:].strip() in languages
            continue
        if wanted:
            yield no, raw


def readme_examples(text: str | None = None) -> list[tuple[int, str]]:
    """``(line number, command)`` of every line starting with ``placer`` in the
    page's ``bash`` code blocks (default: the README's), in order, comments removed."""
    text = README.read_text() if text is None else text
    return [(no, strip_comment(raw.strip())) for no, raw in _blocks(text, ("bash", "sh", "console", ""))
            if raw.strip().startswith("placer ")]


def python_examples(text: str) -> str:
    """The page's ``python`` code blocks, in order, as one script."""
    return "\n".join(raw for _, raw in _blocks(text, ("python",)))


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def segments(command: str) -> list[tuple[list[str], list[str], list[str]]]:
    """Per pipeline stage: ``(placer arguments, files read, files written)``."""
    out = []
    for stage in command.split(" | "):
        tokens = shlex.split(stage)
        assert tokens[0] == "placer", f"not a placer stage: {stage!r}"
        args, reads, writes = [], [], []
        k = 1
        while k < len(tokens):
            tok = tokens[k]
            if tok in (">", ">>"):
                writes.append(tokens[k + 1])
                k += 2
                continue
            if tok in OUTPUT_OPTIONS and k + 1 < len(tokens):
                if tokens[k + 1] != "-":
                    writes.append(tokens[k + 1])
                args += [tok, tokens[k + 1]]
                k += 2
                continue
            args.append(tok)
            if _looks_like_path(tok):
                path = tok.split("=", 1)[-1] if tok.startswith("file=") else tok
                reads.append(re.sub(r"(\.py):[\w.]+$", r"\1", path))  # --model path/to/file.py:attr
            k += 1
        out.append((args, reads, writes))
    return out


def _looks_like_path(tok: str) -> bool:
    value = tok.split("=", 1)[1] if tok.startswith("file=") else tok
    if tok.startswith("-") or "[" in value or "://" in value:
        return False
    return "/" in value or bool(re.search(r"\.(json|json\.gz|ndjson|csv|py)$|\.py:[\w.]+$", value))


def needs(command: str) -> set[str]:
    """Extras and hardware a command needs."""
    want = set()
    if re.search(r"--model |--batch-sizes |--measure\b|--algo hierarchical", command):
        want.add("torch")
    if "--executor ray" in command:
        want.add("ray")
    if "--comm-bench" in command and "--processes" not in command:
        want.add("gpus")  # --comm-bench --processes N measures between processes, on CPUs too
    return want


def _check_stage(args: list[str], produced: set[str], where: str) -> None:
    name = args[0]
    root = click.Context(main, info_name="placer")
    cmd = main.get_command(root, name)
    assert cmd is not None, f"{where}: unknown command {name!r}"
    sub = cmd.make_context(name, list(args[1:]), parent=root)  # options, choices and ranges parse
    params = sub.params
    algo = params.get("algo")
    if algo:
        entry = registry.get(algo)  # unknown algorithm -> InvalidInput
        from celeritas_cli.cli.common import parse_params

        entry.coerce(parse_params(params.get("params") or ()))
    if name == "coarsen" and params.get("params"):
        from celeritas_cli.cli.common import parse_params

        registry.get_coarsener(params["method"]).coerce(parse_params(params["params"]))
    cluster = params.get("cluster_path")
    if cluster and cluster not in produced:
        assert cluster in bundled_cluster_names() or (ROOT / cluster).exists(), \
            f"{where}: --cluster {cluster} is neither bundled nor a file of the repository"


def test_readme_has_examples():
    lines = readme_examples()
    assert len(lines) >= 3
    assert any("examples/" in cmd for _, cmd in lines)
    assert sum(len(readme_examples(page.read_text())) for page in PAGES) >= 60


def test_the_pages_include_the_manual():
    names = {page.name for page in PAGES}
    assert {"README.md", "usage.md", "algorithms.md", "running.md", "compare.md", "library.md"} <= names


def test_examples_after_a_python_block_are_still_read():
    text = "```bash\nplacer a\n```\n```python\nplacer_not_a_command = 1\n```\nprose\n```bash\nplacer b\n```\n"
    assert readme_examples(text) == [(2, "placer a"), (9, "placer b")]
    assert python_examples(text) == "placer_not_a_command = 1"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_examples_parse_and_read_only_files_that_exist(page):
    produced: set[str] = set()
    for no, command in readme_examples(page.read_text()):
        where = f"{_page_id(page)}:{no}: {command}"
        for args, reads, writes in segments(command):
            _check_stage(args, produced, where)
            for path in reads:
                assert path in produced or (ROOT / path).exists(), \
                    f"{where}: reads {path}, which is neither in the repository nor written by an earlier example of the page"
            produced.update(writes)


def test_readme_is_one_page():
    text = README.read_text()
    assert len(text) <= README_MAX_CHARS, f"README.md has {len(text)} characters (at most {README_MAX_CHARS})"
    # the line the integrator fills with the measured time of make test
    assert "<!-- make-test-time -->\nmake test: " in text


def test_readme_links_every_docs_page():
    text = README.read_text()
    for page in PAGES[1:]:
        assert f"]({_page_id(page)}" in text, f"README.md links no {_page_id(page)}"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped
    (hyphens and underscores kept), each space a hyphen."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (outside code blocks)."""
    out, fenced = set(), False
    for raw in text.splitlines():
        if raw.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", raw):
            out.add(slug(raw.lstrip("#")))
    return out


def test_slug_is_githubs():
    assert slug(" `placer profile` — graphs from real models") == "placer-profile--graphs-from-real-models"
    assert slug(" Cluster — `placer.cluster/v1`") == "cluster--placerclusterv1"
    assert slug(" Pipelines, sharding and `auto` over them (`benchmarks/bench_planners.py`)") == \
        "pipelines-sharding-and-auto-over-them-benchmarksbench_plannerspy"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_lead_to_files_and_headings_that_exist(page):
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{_page_id(page)}: link {target} leads to no file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest.read_text()), f"{_page_id(page)}: link {target}: no such heading"


def test_comment_stripping_and_stage_parsing():
    line = "placer place g.json -p rules='[\"a#b\"]'"
    assert strip_comment(line + "  # note") == line
    (a1, r1, w1), (a2, r2, w2) = segments("placer coarsen g.json | placer place - --algo heft -o p.json")
    assert r1 == ["g.json"] and w1 == [] and w2 == ["p.json"] and a2[:2] == ["place", "-"]
    [(args, reads, writes)] = segments("placer place x.json --algo given -p file=examples/e.json > out.json")
    assert reads == ["x.json", "examples/e.json"] and writes == ["out.json"]
    [(args, reads, writes)] = segments("placer profile --model models/net.py:Net -b 4 -o g.json")
    assert reads == ["models/net.py"] and writes == ["g.json"]


def test_needs_gpus_only_for_the_cuda_comm_bench():
    assert needs("placer profile --comm-bench -o c.json") == {"gpus"}
    assert needs("placer profile --comm-bench --processes 2 -o cpu2.json") == set()


def test_layout_lists_every_subpackage():
    text = (ROOT / "docs" / "library.md").read_text()
    layout = text[text.index("## Layout"):]
    packages = sorted(p.name for p in (ROOT / "celeritas_cli").iterdir()
                      if p.is_dir() and not p.name.startswith("_") and p.name != "__pycache__")
    assert {"run", "optimize", "sim", "model"} <= set(packages)
    for name in packages:
        assert f"\n  {name}/ " in layout, f"docs/library.md's Layout does not list celeritas_cli/{name}/"


def test_algorithm_tables_list_every_registered_name():
    text = (ROOT / "docs" / "algorithms.md").read_text()
    listed = registry.names() + registry.coarsener_names()
    assert "auto" in listed and "cpd" in listed
    for name in listed:
        assert f"| `{name}` |" in text, f"docs/algorithms.md's tables do not list `{name}`"


def _fresh_clone(tmp: Path) -> Path:
    for name in CLONE:
        if (ROOT / name).exists():
            (tmp / name).symlink_to(ROOT / name)
    return tmp


def _available(what: str) -> bool:
    if what == "gpus":
        try:
            import torch

            return torch.cuda.device_count() >= 2
        except ImportError:
            return False
    return importlib.util.find_spec(what) is not None


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_examples_run_verbatim(page, tmp_path):
    pytest.importorskip("torch")
    cwd = _fresh_clone(tmp_path)
    skipped = []
    for no, command in readme_examples(page.read_text()):
        where = f"{_page_id(page)}:{no}"
        missing = [w for w in sorted(needs(command)) if not _available(w)]
        if missing:
            skipped.append(f"{where} (needs {', '.join(missing)})")
            continue
        p = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=_env(), capture_output=True,
                           text=True, timeout=1200)
        assert p.returncode == 0, f"{where}: {command}\nexit {p.returncode}\n{p.stderr[-2000:]}"
        assert "Traceback" not in p.stderr, f"{where}: {command}\n{p.stderr[-2000:]}"
    if skipped:
        print("skipped: " + "; ".join(skipped))


@pytest.mark.slow
def test_library_examples_run(tmp_path):
    """docs/library.md's python blocks, in order, as one script from a fresh clone."""
    script = python_examples((ROOT / "docs" / "library.md").read_text())
    assert "place(" in script
    cwd = _fresh_clone(tmp_path)
    p = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, f"docs/library.md's python blocks: exit {p.returncode}\n{p.stderr[-2000:]}"
    assert (cwd / "cmp.md").exists()
