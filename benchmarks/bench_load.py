"""Benchmark: loading a huge graph (issue 24.5, WP "speed") - CPU seconds of
``load_graph`` and of its parts on synthetic layered graphs (``placer profile
--synthetic layered --nodes N --seed 1``, written to a temporary directory),
best of a few runs, in this tree and optionally in another one (``--base``,
e.g. ``git archive main | tar -x -C /tmp/base``) for before / after ratios.

CPU time of the process (``time.process_time``), not wall time, so the
numbers mean something on a shared machine; the load (``os.getloadavg``) is
printed with them anyway.  Whole ``placer place`` runs against the time limit
are ``bench_time_limits.py --only auto``.  Usage::

    python benchmarks/bench_load.py [--nodes 36000,200000] [--repeat 3] [--base DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("read_json", "validate", "read_nodes", "read_edges", "load_graph")


def child(path: str, repeat: int) -> dict:
    """CPU seconds of each part, best of *repeat*, in this process's celeritas_cli."""
    from celeritas_cli.model.graph_read import read_edges, read_nodes
    from celeritas_cli.model.io import load_graph
    from celeritas_cli.model.jsonio import read_json, validate

    doc = read_json(path)
    steps = {"read_json": lambda: read_json(path), "validate": lambda: validate(doc, "placer.graph/v1", path),
             "read_nodes": lambda: read_nodes(doc["nodes"], path),
             "read_edges": lambda: read_edges(doc["edges"], read_nodes(doc["nodes"], path).index, path),
             "load_graph": lambda: load_graph(path)}
    best = {}
    for name in PARTS:
        times = []
        for _ in range(repeat):
            paused = gc.isenabled() and name in ("read_nodes", "read_edges")  # as Graph.from_dict reads them
            if paused:
                gc.disable()
            t = time.process_time()
            steps[name]()
            times.append(time.process_time() - t)
            if paused:
                gc.enable()
        best[name] = min(times)
    best["read_edges"] -= best["read_nodes"]  # it reads the nodes for their index
    return best


def measure(tree: Path, path: str, repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--child", path, "--repeat", str(repeat)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="36000,200000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--base", type=Path, help="another source tree to compare against (before)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeat)))
        return
    print("## Loading huge graphs (CPU seconds, best of %d)\n" % args.repeat)
    print("| nodes | part | " + ("before | after | ratio |" if args.base else "seconds |"))
    print("|---|---|" + ("---|---|---|" if args.base else "---|"))
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.nodes.split(",")):
            path = str(Path(tmp) / f"layered_{n}.json")
            subprocess.run([sys.executable, "-m", "celeritas_cli", "profile", "--synthetic", "layered", "--nodes",
                            str(n), "--seed", "1", "-o", path], check=True, capture_output=True)
            load = os.getloadavg()[0]
            before = measure(args.base, path, args.repeat) if args.base else None
            after = measure(ROOT, path, args.repeat)
            for part in PARTS:
                row = f"| {n:,} | {part} | "
                if before:
                    row += f"{before[part]:.3f} | {after[part]:.3f} | {after[part] / before[part]:.2f} |"
                else:
                    row += f"{after[part]:.3f} |"
                print(row)
            print(f"| {n:,} | load average at start | {load:.2f} |" + (" | |" if args.base else ""))


if __name__ == "__main__":
    main()
