"""The JSON Schemas and docs/design.md against the files placer ships and the
documents it writes: every shipped file validates, and every node and meta
field the code writes is declared in the graph schema and described in the spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celeritas_cli.model.graph import Graph
from celeritas_cli.model.jsonio import SCHEMAS, read_json, validate

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "celeritas_cli" / "schemas"
SHIPPED = sorted(p for d in ("sample_graphs", "examples", "celeritas_cli/data")
                 for p in (ROOT / d).rglob("*") if p.name.endswith((".json", ".json.gz")))
GRAPH_SCHEMA = json.loads((SCHEMA_DIR / "graph.schema.json").read_text())
NODE_FIELDS = set(GRAPH_SCHEMA["properties"]["nodes"]["items"]["properties"])
META_FIELDS = set(GRAPH_SCHEMA["properties"]["meta"]["properties"])
DESIGN = (ROOT / "docs" / "design.md").read_text()


def test_every_shipped_document_is_found():
    assert {p.name for p in SHIPPED} >= {"layered_60.json", "transformer.json.gz", "4xV100-pcie.json",
                                         "measurements.json", "comm_samples.json", "expert_placement.json"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_document_validates_against_its_schema(path):
    doc = read_json(str(path))
    assert doc.get("schema") in SCHEMAS, f"{path}: no known schema tag"
    validate(doc, doc["schema"], str(path))
    if doc["schema"] == "placer.graph/v1":
        Graph.from_dict(doc, str(path))


def test_every_schema_file_is_used():
    assert sorted(SCHEMAS.values()) == sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json"))


def _written_documents() -> list[dict]:
    """Graph documents placer writes: profile (captured zoo graph, synthetic, Standard Evaluation),
    coarse, split and data-parallel graphs."""
    from celeritas_cli.model.cluster import uniform
    from celeritas_cli.model.generate import layered
    from celeritas_cli.profile import from_measurements
    from celeritas_cli.registry import coarsen
    from celeritas_cli.transform.replicate import data_parallel_graph
    from celeritas_cli.transform.splitting import split_operation

    g = layered(60, seed=1)
    v = next(v for v in range(g.n) if g.splittable[v] and g.colocation[v])
    est, _, _ = from_measurements(read_json(str(ROOT / "examples" / "measurements.json")), 64)
    zoo = read_json(str(ROOT / "sample_graphs" / "zoo" / "resnet50.json.gz"))
    coarse_of_zoo = coarsen(Graph.from_dict(zoo), uniform(4), "cpd")
    return [g.to_dict(), zoo, est, coarse_of_zoo.to_dict(),
            split_operation(g, g.ids[v], "batch", 2).to_dict(),
            data_parallel_graph(Graph.from_dict(est), 2).to_dict()]


def test_every_field_placer_writes_is_in_the_schema_and_the_spec():
    node_keys: set[str] = set()
    meta_keys: set[str] = set()
    for doc in _written_documents():
        meta_keys |= set(doc.get("meta") or {})
        for nd in doc["nodes"]:
            node_keys |= set(nd)
            for sub in ("batch_independent", "batch_line", "allreduce"):
                node_keys |= {f"{sub}.{k}" for k in nd.get(sub) or {}}
    # the transforms write the fields the issue names: make sure the documents above exercise them
    assert {"batch_independent", "batch_line", "replica", "origin", "allreduce", "split_of", "part"} <= node_keys
    assert {"coarsened_from", "splits", "data_parallel", "standard_evaluation"} <= meta_keys
    for key in sorted(node_keys):
        top, _, sub = key.partition(".")
        assert top in NODE_FIELDS, f"node field {top} is not in graph.schema.json"
        if sub:
            assert sub in GRAPH_SCHEMA["properties"]["nodes"]["items"]["properties"][top]["properties"], key
        assert f"`{key}`" in DESIGN or f"`{sub}`" in DESIGN, f"node field {key} is not described in docs/design.md"
    for key in sorted(meta_keys | {"coarsened_from_file"}):
        assert key in META_FIELDS, f"meta.{key} is not in graph.schema.json"
        assert f"`meta.{key}`" in DESIGN or f"`{key}`" in DESIGN, f"meta.{key} is not described in docs/design.md"


def test_placement_derivation_is_in_the_schema_and_the_spec():
    schema = json.loads((SCHEMA_DIR / "placement.schema.json").read_text())
    steps = schema["properties"]["derivation"]["properties"]["steps"]["items"]["properties"]
    assert {"transform", "replicas", "scaling", "node", "dim", "n", "overhead_s"} <= set(steps)
    for word in ("`derivation`", "`split_graph`", "`base`"):
        assert word in DESIGN
