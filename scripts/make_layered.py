#!/usr/bin/env python
"""Regenerate the synthetic sample graphs ``sample_graphs/layered_*.json``
with :func:`celeritas_cli.model.generate.layered_doc` (deterministic: the
same code gives byte-identical files).

* ``layered_60``, ``layered_300``, ``layered_1000``: seed 7;
* ``layered_3000_bigmem``: seed 11, parameters scaled 30x
  (``memory_scale=30``), about 70 GiB under the static rule, so it does not
  fit one 32 GB V100.

Usage::

    python scripts/make_layered.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli.model.generate import layered_doc  # noqa: E402
from celeritas_cli.model.jsonio import write_json  # noqa: E402

SAMPLES = (("layered_60", 60, 7, {}), ("layered_300", 300, 7, {}), ("layered_1000", 1000, 7, {}),
           ("layered_3000_bigmem", 3000, 11, {"memory_scale": 30.0}))
BIGMEM_NOTE = "parameters scaled 30x (memory_scale=30): ~70 GiB, does not fit one 32 GB V100"


def main() -> None:
    for name, n, seed, kwargs in SAMPLES:
        doc = layered_doc(n, seed, name=name, **kwargs)
        if kwargs:
            doc["meta"]["note"] = BIGMEM_NOTE
        write_json(doc, ROOT / "sample_graphs" / f"{name}.json")
        print(f"make_layered: sample_graphs/{name}.json ({len(doc['nodes'])} nodes)", file=sys.stderr)


if __name__ == "__main__":
    main()
