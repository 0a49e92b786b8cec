"""Regenerate the input examples in examples/ (the README's examples use them).

    .venv/bin/python scripts/make_examples.py

- examples/measurements.json   placer.measurements/v1: examples/tiny_mlp.py:TinyMLP
                               captured at batch 2, 4, 8 (roofline costs; needs torch)
- examples/comm_samples.json   placer.comm_samples/v1: illustrative transfer times of a
                               4-GPU box (two NVLink pairs, PCIe otherwise), made from
                               t = k*d + b with 2% noise -- not measurements
- examples/expert_placement.json  placer.placement/v1 for sample_graphs/layered_300.json:
                               what a person would do by hand -- the forward pass cut
                               into four equal runs of layers, one per GPU, each layer's
                               gradient and update on its layer's GPU

Each output is deterministic.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli.model.jsonio import write_json  # noqa: E402

EXAMPLES = ROOT / "examples"


def measurements() -> dict:
    from celeritas_cli.profile.capture import profile_model
    from celeritas_cli.profile.regression import measurements_from_graphs

    sizes = [2, 4, 8]
    spec = f"{EXAMPLES / 'tiny_mlp.py'}:TinyMLP"
    docs = [profile_model(spec, b) for b in sizes]
    doc = measurements_from_graphs(docs, sizes, name="tiny_mlp")
    doc["meta"] = {"source": "placer profile of examples/tiny_mlp.py:TinyMLP at batch 2, 4, 8 (training step, "
                             "roofline costs); made by scripts/make_examples.py", "phase": "training"}
    return doc


def comm_samples() -> dict:
    rng = random.Random(0)
    devices = [{"id": f"gpu{i}", "type": "V100", "memory_bytes": 32 * 2**30} for i in range(4)]
    nvlink = {(0, 1), (1, 0), (2, 3), (3, 2)}
    samples = []
    for a in range(4):
        for b in range(4):
            if a == b:
                continue
            k, lat = (1 / 45e9, 4e-6) if (a, b) in nvlink else (1 / 11e9, 1.2e-5)
            for e in range(5, 15):  # 1 KiB ... 256 MiB, powers of 4
                size = 4**e
                samples.append({"src": f"gpu{a}", "dst": f"gpu{b}", "bytes": size,
                                "seconds": float(f"{(k * size + lat) * rng.uniform(0.98, 1.02):.6g}")})
    return {"schema": "placer.comm_samples/v1", "name": "example-4gpu-box",
            "meta": {"note": "illustrative samples, not measurements: t = d/45 GB/s + 4 us on the NVLink pairs "
                             "gpu0<->gpu1 and gpu2<->gpu3, t = d/11 GB/s + 12 us over PCIe otherwise, 2% noise; "
                             "placer profile --comm-bench measures a real machine"},
            "devices": devices, "samples": samples}


def expert_placement() -> dict:
    from celeritas_cli.model.io import load_graph

    g = load_graph(ROOT / "sample_graphs" / "layered_300.json")
    forward = [v for v in range(g.n) if not g.ids[v].startswith(("grad_", "update_"))]
    stage = {g.ids[v]: f"gpu{4 * i // len(forward)}" for i, v in enumerate(forward)}
    assignment = {}
    for nid in g.ids:
        assignment[nid] = stage[nid.removeprefix("grad_").removeprefix("update_")]
    return {"schema": "placer.placement/v1", "graph": g.name, "cluster": "4xV100-pcie", "algorithm": "expert",
            "params": {"note": "by hand: forward layers in four equal runs, one per GPU; gradients and updates "
                               "with their layer (scripts/make_examples.py)"},
            "seed": None, "assignment": assignment}


def main() -> None:
    write_json(comm_samples(), EXAMPLES / "comm_samples.json")
    write_json(expert_placement(), EXAMPLES / "expert_placement.json")
    write_json(measurements(), EXAMPLES / "measurements.json")


if __name__ == "__main__":
    main()
