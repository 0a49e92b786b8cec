#!/usr/bin/env python
"""Regenerate the zoo sample graphs: sample_graphs/zoo/<model>.json.gz.

Each model of :data:`celeritas_cli.profile.zoo.ZOO` is captured with
``placer profile`` at the batch size of Celeritas 6.2.1 (training step,
roofline costs; the GPTs at our batch sizes, in bf16 mixed precision) and
written gzip-compressed (deterministic: no timestamp); every placer command
reads ``*.json.gz`` directly.  ``--plain`` also writes an uncompressed
``<model>.json`` next to each.  ``sample_graphs/zoo/TABLE.md`` gets the model
/ nodes / edges / CCR / memory table, next to the node counts of Celeritas'
Table 2, and each graph's model FLOPs utilisation on one A100
(:mod:`celeritas_cli.sim.mfu`: every node in sequence on one device).

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
from celeritas_cli.model.devices import DEVICES  # noqa: E402
from celeritas_cli.model.costs import CostModel  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.io import load_cluster  # noqa: E402
from celeritas_cli.model.jsonio import dumps, read_bytes, write_bytes  # noqa: E402
from celeritas_cli.sim.mfu import model_flops  # noqa: E402

ZOO_DIR = ROOT / "sample_graphs" / "zoo"
#: Celeritas Table 2 (original graphs), and 6.2.1 batch sizes (ours for resnet50 and the GPTs).
TABLE2 = {"inception_v3": (6332, 33.118, 512), "nmt": (25463, 18.630, 512),
          "transformer": (36352, 111.957, 256), "tensor_holography": (3810, 49.147, 32),
          "resnet50": (None, None, 256), "gpt_1.3b": (None, None, 8), "gpt_6.7b": (None, None, 16)}
MODELS = list(TABLE2)
GPT_NOTE = """The GPTs are not Celeritas models: GPT-3's 1.3B and 6.7B layouts at sequence 2048 and vocabulary
51,200 (Megatron-LM's scaling setup), captured in bf16 mixed precision (`--precision bf16`: fp32 master
weights, gradients and Adam state, 16 bytes per parameter). `gpt_1.3b` at batch 8, the batch of
Megatron-LM's 1.2B single-GPU baseline: it fits one A100-80GB even under the static memory rule, the
single-device MFU anchor. `gpt_6.7b` at batch 16: its weights, gradients and Adam state alone exceed an
80 GB A100, so data parallelism is OOM and 8xA100-nvswitch needs a placement, a pipeline or a sharded
plan; 16 = two whole sequences per GPU under sharded data parallelism (about 12 GiB of sharded state and
two sequences' activations per GPU, with an all-gather / reduce-scatter traffic of about 0.2 s against
about 1.1 s of work per GPU, so a sharded plan can come within 1.25 x the work bound), and 16 micro-batches
of one sequence for a pipeline (an 8-stage 1F1B bubble of 7/16, 4 stages x 2 replicas 3/8, interleaved
stages less). Batch 32 would shorten the bubbles but leave a sharded plan four sequences (about 60 GiB of
activations) next to its 12 GiB of state on each 80 GiB GPU."""


def capture(name: str) -> bytes:
    from celeritas_cli.profile import capture_model

    doc = capture_model(name, TABLE2[name][2])
    Graph.from_dict(doc, name)
    return dumps(doc)


def stats(data: bytes, cluster: Cluster) -> dict:
    doc = orjson.loads(data)
    g = Graph.from_dict(doc, doc.get("name", "graph"))
    precision = doc["meta"].get("precision", "fp32")
    a100 = sum(nd["compute_by_type"]["A100"] for nd in doc["nodes"])
    return {"name": g.name, "nodes": g.n, "edges": g.m, "ccr": CostModel(g, cluster).ccr(),
            "memory_gib": g.total_memory() / 2**30, "compute_s": sum(g.compute),
            "resident_gib": sum(nd.get("resident_bytes", 0) for nd in doc["nodes"]) / 2**30,
            "params": doc["meta"].get("parameters", 0), "batch": doc["meta"].get("batch_size"),
            "param_gib": doc["meta"].get("parameter_bytes", 0) / 2**30,
            "precision": precision, "a100_s": a100,
            "mfu_a100": model_flops(g) / (a100 * DEVICES["A100"].precision_peak(precision))}


def table(rows: list[tuple[str, dict]]) -> str:
    lines = ["# Zoo sample graphs (placer profile, training step, roofline costs)", "",
             "Regenerate with `python scripts/make_samples.py` (`make samples`). CCR is Celeritas Eq. 1 on the",
             "4xV100-pcie cluster (10 GB/s, 10 us); memory is the sum of `memory_bytes` (parameters, gradients,",
             "Adam state, kept activations), resident the sum of `resident_bytes` (parameters, Adam state);",
             "compute is the roofline time of one step on one V100 and on one A100 (bf16 graphs: matmuls at 0.60",
             "of the tensor-core peak; a V100 has no bf16, so it runs them at its fp32 rate); MFU is the model",
             "FLOPs utilisation of that A100 step against the A100 peak at the graph's precision (the fp32 graphs keep",
             "the seed papers' pure roofline at the fp32 peak, hence 72-96 %, which no real step reaches).", "",
             "| model | precision | batch | nodes | edges | CCR | memory (GiB) | resident (GiB) | compute (s, V100) "
             "| compute (s, A100) | MFU 1xA100 | params (M) | Table 2 nodes | Table 2 CCR |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows:
        t_nodes, t_ccr, _ = TABLE2.get(name, (None, None, None))
        lines.append(f"| {name} | {s['precision']} | {s['batch']} | {s['nodes']} | {s['edges']} | {s['ccr']:.2f} | "
                     f"{s['memory_gib']:.1f} | {s['resident_gib']:.1f} | {s['compute_s']:.3f} | {s['a100_s']:.3f} | "
                     f"{s['mfu_a100']:.1%} | {s['params'] / 1e6:.1f} | "
                     f"{t_nodes if t_nodes else '-'} | {t_ccr if t_ccr else '-'} |")
    gpts = [(name, s) for name, s in rows if name.startswith("gpt_")]
    if gpts:
        lines += ["", GPT_NOTE] + [
            f"- {name}: parameters and Adam state {s['resident_gib']:.1f} GiB + fp32 gradients {s['param_gib']:.1f} "
            f"GiB = {s['resident_gib'] + s['param_gib']:.1f} GiB before activations; "
            f"{(s['memory_gib'] - s['resident_gib'] - s['param_gib']) / s['batch']:.1f} GiB of kept activations "
            f"per sequence; {s['memory_gib']:.1f} GiB in all at batch {s['batch']}." for name, s in gpts]
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
