#!/usr/bin/env python
"""Regenerate the zoo sample graphs: sample_graphs/zoo/<model>.json.gz.

Each model of :data:`celeritas_cli.profile.zoo.ZOO` is captured with
``placer profile`` at the batch size of Celeritas 6.2.1 (training step,
roofline costs) and written gzip-compressed (deterministic: no timestamp);
every placer command reads ``*.json.gz`` directly.  ``--plain`` also writes
an uncompressed ``<model>.json`` next to each.  ``sample_graphs/zoo/TABLE.md``
gets the model / nodes / edges / CCR / memory table, next to the node counts
of Celeritas' Table 2.

Without torch (or with ``--no-capture``) the committed ``.json.gz`` files
are kept, and only the plain copies and the table are rebuilt from them.

Usage::

    python scripts/make_samples.py                 # capture all, table
    python scripts/make_samples.py transformer     # only these models
    python scripts/make_samples.py --no-capture --plain
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli.model.cluster import Cluster  # noqa: E402
from celeritas_cli.model.costs import CostModel  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.io import load_cluster  # noqa: E402
from celeritas_cli.model.jsonio import dumps, read_bytes, write_bytes  # noqa: E402

ZOO_DIR = ROOT / "sample_graphs" / "zoo"
#: Celeritas Table 2 (original graphs), and 6.2.1 batch sizes.
TABLE2 = {"inception_v3": (6332, 33.118, 512), "nmt": (25463, 18.630, 512),
          "transformer": (36352, 111.957, 256), "tensor_holography": (3810, 49.147, 32),
          "resnet50": (None, None, 256)}
MODELS = list(TABLE2)


def capture(name: str) -> bytes:
    from celeritas_cli.profile import capture_model

    doc = capture_model(name, TABLE2[name][2])
    Graph.from_dict(doc, name)
    return dumps(doc)


def stats(data: bytes, cluster: Cluster) -> dict:
    doc = orjson.loads(data)
    g = Graph.from_dict(doc, doc.get("name", "graph"))
    return {"name": g.name, "nodes": g.n, "edges": g.m, "ccr": CostModel(g, cluster).ccr(),
            "memory_gib": g.total_memory() / 2**30, "compute_s": sum(g.compute),
            "params": doc["meta"].get("parameters", 0), "batch": doc["meta"].get("batch_size")}


def table(rows: list[tuple[str, dict]]) -> str:
    lines = ["# Zoo sample graphs (placer profile, training step, roofline costs)", "",
             "Regenerate with `python scripts/make_samples.py` (`make samples`). CCR is Celeritas Eq. 1 on the",
             "4xV100-pcie cluster (10 GB/s, 10 us); memory is the sum of `memory_bytes` (parameters, gradients,",
             "Adam state, kept activations); compute is the V100 roofline time of one step.", "",
             "| model | batch | nodes | edges | CCR | memory (GiB) | compute (s, V100) | params (M) "
             "| Table 2 nodes | Table 2 CCR |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows:
        t_nodes, t_ccr, _ = TABLE2.get(name, (None, None, None))
        lines.append(f"| {name} | {s['batch']} | {s['nodes']} | {s['edges']} | {s['ccr']:.2f} | "
                     f"{s['memory_gib']:.1f} | {s['compute_s']:.3f} | {s['params'] / 1e6:.1f} | "
                     f"{t_nodes if t_nodes else '-'} | {t_ccr if t_ccr else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=MODELS, help=f"models (default: all of {', '.join(MODELS)})")
    ap.add_argument("--no-capture", action="store_true",
                    help="do not capture; rebuild the table (and --plain copies) from the committed .json.gz files")
    ap.add_argument("--plain", action="store_true", help="also write uncompressed <model>.json copies")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in TABLE2]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    have_torch = True
    try:
        import torch  # noqa: F401
    except ImportError:
        have_torch = False
    capture_now = have_torch and not args.no_capture
    if not have_torch and not args.no_capture:
        print("make_samples: torch not installed (pip install -e .[torch]); using the committed graphs",
              file=sys.stderr)
    ZOO_DIR.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(None)
    for name in args.models:
        gz = ZOO_DIR / f"{name}.json.gz"
        if capture_now:
            t0 = time.perf_counter()
            data = capture(name)
            write_bytes(data, gz)          # jsonio gzips *.gz with mtime=0: byte-identical reruns
            print(f"make_samples: {gz.relative_to(ROOT)} captured in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
        elif not gz.exists():
            print(f"make_samples: {gz.relative_to(ROOT)} missing and cannot be captured without torch",
                  file=sys.stderr)
            continue
        if args.plain:
            write_bytes(read_bytes(gz), ZOO_DIR / f"{name}.json")
    rows = []
    for name in MODELS:
        gz = ZOO_DIR / f"{name}.json.gz"
        if gz.exists():
            rows.append((name, stats(read_bytes(gz), cluster)))
    text = table(rows)
    write_bytes(text.encode(), ZOO_DIR / "TABLE.md")
    print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
