"""Byte-identical ``placer place --no-timings`` outputs, before and after a refactoring.

Places every sample graph (``sample_graphs/*.json`` and ``sample_graphs/zoo/*.json.gz``)
with every registered algorithm's quick parameters (``quick_params``, as
``placer compare --quick`` uses them) through the ``placer place`` command, in
this process (click's test runner), and writes one file per cell into DIR:
the exit code and stdout.  Run it before a change and after, then compare::

    python benchmarks/identical_outputs.py /tmp/before
    ... change the code ...
    python benchmarks/identical_outputs.py /tmp/after --compare /tmp/before

``given`` re-reads the ``heft`` placement of the same graph (from :data:`GIVEN`).
The slow algorithms (:data:`SLOW`) run on graphs of at most :data:`SLOW_NODES` nodes.
Only stdout and the exit code are compared (stderr carries wall times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = sorted((ROOT / "sample_graphs").glob("*.json")) + sorted((ROOT / "sample_graphs" / "zoo").glob("*.json.gz"))
SLOW = {"milp", "hierarchical", "os-dpos", "fd-dps", "auto"}
SLOW_NODES = 10000
#: where ``given`` reads the heft placement (a fixed path: it is recorded in the placement's params)
GIVEN = Path("/tmp/placer_identical_outputs_heft.json")


def _nodes(path: Path) -> int:
    from celeritas_cli.model.io import load_graph
    return load_graph(str(path)).n


def _args(entry, graph: Path, out: Path) -> list[str]:
    args = ["place", str(graph), "--algo", entry.name, "--no-timings", "--seed", "0"]
    params = dict(entry.quick_params)
    if entry.name == "given":
        params["file"] = str(GIVEN)
    for k, v in params.items():
        args += ["-p", f"{k}={v}"]
    return args


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    names = sorted(registry.names(), key=lambda n: (n == "given", n))  # given reads heft's answer
    for graph in GRAPHS:
        n = _nodes(graph)
        for name in names:
            entry = registry.get(name)
            if name in SLOW and n > SLOW_NODES:
                continue
            t0 = time.perf_counter()
            res = runner.invoke(main, _args(entry, graph, out), catch_exceptions=True)
            stdout = res.stdout_bytes
            if name == "heft":
                GIVEN.write_bytes(stdout)
            err = res.stderr_bytes.decode(errors="replace").strip().splitlines()
            tail = err[-1] if res.exit_code and err else ""
            if res.exception is not None and not isinstance(res.exception, SystemExit):
                tail = f"{type(res.exception).__name__}: {res.exception}"
            (out / f"{graph.name}.{name}.cell").write_bytes(
                json.dumps({"rc": res.exit_code, "error": tail}).encode() + b"\n" + stdout)
            print(f"{graph.name:28s} {name:14s} rc={res.exit_code} {time.perf_counter() - t0:6.1f} s {tail[:80]}",
                  file=sys.stderr, flush=True)


def compare(a: Path, b: Path) -> int:
    cells = sorted({p.name for p in a.glob("*.cell")} | {p.name for p in b.glob("*.cell")})
    differ = [c for c in cells if not (a / c).exists() or not (b / c).exists()
              or (a / c).read_bytes() != (b / c).read_bytes()]
    print(f"{len(cells) - len(differ)} of {len(cells)} cells byte-identical")
    for c in differ:
        print(f"  differs: {c}")
    return 1 if differ else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--compare", type=Path, default=None, help="an earlier DIR to compare with")
    ns = ap.parse_args()
    run(ns.dir)
    if ns.compare is not None:
        sys.exit(compare(ns.compare, ns.dir))
