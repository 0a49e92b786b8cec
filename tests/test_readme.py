"""Every `placer` line of README.md's examples runs as written, in order, from
the repository root of a fresh clone (issue 15.11).

The examples are read from README.md when the tests run, so they cover
whatever the README says.  The default suite checks each line statically:
its options parse, its algorithm, parameters and cluster exist, and every
file it reads is in the repository or written by an earlier line.  The slow
test runs every line verbatim with bash in a directory laid out like a fresh
clone and needs exit status 0 and no traceback; lines needing an extra that
is not installed (ray; torch skips the whole run, since later lines read what
the torch lines write) are skipped.
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


def readme_examples(text: str | None = None) -> list[tuple[int, str]]:
    """``(line number, command)`` of every line starting with ``placer`` in the
    README's ``bash`` code blocks, in order, comments removed."""
    text = README.read_text() if text is None else text
    out, fenced, shell = [], False, False
    for no, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):  # an opening fence names the language; a closing one ends any block
            fenced = not fenced
            shell = fenced and stripped[3:].strip() in ("bash", "sh", "console", "")
            continue
        if shell and stripped.startswith("placer "):
            out.append((no, strip_comment(stripped)))
    return out


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
    assert len(lines) >= 20
    assert any("examples/" in cmd for _, cmd in lines)


def test_examples_after_a_python_block_are_still_read():
    text = "```bash\nplacer a\n```\n```python\nplacer_not_a_command = 1\n```\nprose\n```bash\nplacer b\n```\n"
    assert readme_examples(text) == [(2, "placer a"), (9, "placer b")]


def test_readme_examples_parse_and_read_only_files_that_exist():
    produced: set[str] = set()
    for no, command in readme_examples():
        where = f"README.md:{no}: {command}"
        for args, reads, writes in segments(command):
            _check_stage(args, produced, where)
            for path in reads:
                assert path in produced or (ROOT / path).exists(), \
                    f"{where}: reads {path}, which is neither in the repository nor written by an earlier example"
            produced.update(writes)


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
    text = README.read_text()
    layout = text[text.index("## Layout"):]
    packages = sorted(p.name for p in (ROOT / "celeritas_cli").iterdir()
                      if p.is_dir() and not p.name.startswith("_") and p.name != "__pycache__")
    assert {"run", "optimize", "sim", "model"} <= set(packages)
    for name in packages:
        assert f"\n  {name}/ " in layout, f"README.md's Layout does not list celeritas_cli/{name}/"


def test_algorithm_tables_list_every_registered_name():
    from celeritas_cli import registry
    text = README.read_text()
    listed = registry.names() + registry.coarsener_names()
    assert "auto" in listed and "cpd" in listed
    for name in listed:
        assert f"| `{name}` |" in text, f"README.md's algorithm tables do not list `{name}`"


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


@pytest.mark.slow
def test_readme_examples_run_verbatim(tmp_path):
    pytest.importorskip("torch")
    cwd = _fresh_clone(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    skipped = []
    for no, command in readme_examples():
        missing = [w for w in sorted(needs(command)) if not _available(w)]
        if missing:
            skipped.append(f"README.md:{no} (needs {', '.join(missing)})")
            continue
        p = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=1200)
        assert p.returncode == 0, f"README.md:{no}: {command}\nexit {p.returncode}\n{p.stderr[-2000:]}"
        assert "Traceback" not in p.stderr, f"README.md:{no}: {command}\n{p.stderr[-2000:]}"
    if skipped:
        print("skipped: " + "; ".join(skipped))
