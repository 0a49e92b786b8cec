"""Property: no graph, cluster or placement document crashes the CLI (issue 15).

Hypothesis builds documents that are mostly well formed but carry malformed
and extreme values (NaN / Infinity / 1e400 literals, 2^62 bytes, 1e308
seconds, negative numbers, strings where numbers go, unknown and duplicate
ids, self-loops and cycles, deep ``meta``, speeds of 1e-300, truncated JSON,
broken gzip) and runs ``placer`` in-process (click's CliRunner).  Every run
must end one of two ways:

* exit 0 and stdout is exactly one JSON document of the expected schema;
* exit 1 (bad input) or 2 (usage), nothing on stdout, and one line on stderr
  ``Error: ...`` naming the offending file (or, when the input is valid but
  no placement fits, the graph and cluster).

Never a traceback, never another exit code.  The default suite runs a small
derandomised sample (a few seconds); ``-m slow`` runs thousands of examples.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas_cli import registry
from celeritas_cli.cli import main

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))

#: Every registered algorithm and coarsening method, run with its quick parameters; the solver and the
#: learner (seconds per run) only in the slow run.
SOLVERS = ("milp", "hierarchical")
ALGOS = tuple(n for n in registry.names() if n not in SOLVERS and n != "given")
SLOW_ALGOS = ALGOS + tuple(n for n in SOLVERS if n in registry.names())
METHODS = tuple(registry.coarsener_names())

class Raw:
    """JSON text written verbatim (NaN, Infinity, 1e400, a deeply nested object)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _deep(n: int) -> Raw:
    """``{"x": {"x": ... {"leaf": 1} ...}}`` nested *n* levels, as JSON text."""
    return Raw('{"x": ' * n + '{"leaf": 1}' + "}" * n)


# Valid values, the extremes of the accepted ranges included (docs/design.md, "Valid ranges").
SECONDS = st.one_of(st.floats(0, 1e-2), st.sampled_from([0.0, 1e-9, 1.0, 1e6, 1e12]))
BYTES = st.one_of(st.integers(0, 2**30), st.sampled_from([0, 1, 2**40, 2**50]))
SPEED = st.sampled_from([1e-6, 0.5, 1.0, 2.0, 100.0, 1000.0, 1e6])
MEMORY = st.sampled_from([0, 2**20, 2**30, 2**35, 2**53 - 1])
BANDWIDTH = st.sampled_from([1.0, 1e9, 1e10, 3e11, 1e18])
LATENCY = st.sampled_from([0.0, 1e-5, 1.0, 1e12])
#: What a malformed number looks like.
BAD = st.one_of(st.sampled_from([-1, -1e-9, 1e308, 2**62, 2**63 - 1, 2**64, 2**70, 1e30, 1.5, "1", None, True, [],
                                 {}, 1e-300]),
                st.sampled_from([Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400")]))


def _faults(kinds):
    """0-2 faults per document: about two thirds of the documents are valid."""
    return st.one_of(st.just([]), st.just([]), st.lists(st.sampled_from(kinds), min_size=1, max_size=2))


GRAPH_FAULTS = ("number", "number", "missing", "duplicate_id", "unknown_endpoint", "self_loop", "cycle",
                "tensor_bytes", "deep_meta", "schema", "members", "big_total", "not_object")


@st.composite
def graph_docs(draw):
    n = draw(st.integers(0, 7))
    ids = [f"n{i}" for i in range(n)]
    ops = st.sampled_from(["aten.mm", "aten.relu", "conv", "bn", "relu", "aten.add"])
    nodes = []
    for nid in ids:
        nd = {"id": nid, "op": draw(ops), "compute_s": draw(SECONDS), "memory_bytes": draw(BYTES)}
        if draw(st.booleans()):
            nd["compute_by_type"] = {draw(st.sampled_from(["V100", "A100", "2080Ti"])): draw(SECONDS)}
        if draw(st.integers(0, 3)) == 0:
            nd["colocation"] = draw(st.sampled_from(["p0", "p1", None]))
        if draw(st.integers(0, 4)) == 0:
            nd["splittable"] = draw(st.sampled_from([["batch"], ["channel"], ["batch", "channel"]]))
        nodes.append(nd)
    edges = []
    for _ in range(draw(st.integers(0, 10)) if n > 1 else 0):
        i = draw(st.integers(0, n - 2))
        j = draw(st.integers(i + 1, n - 1))
        ed = {"src": ids[i], "dst": ids[j], "bytes": draw(BYTES)}
        if draw(st.integers(0, 3)) == 0:
            ed["tensor"] = f"{ids[i]}:0"
        if draw(st.integers(0, 8)) == 0:
            ed["comm_s_by_pair"] = {"g0->g1": draw(SECONDS)}
        edges.append(ed)
    named: dict = {}
    for ed in edges:  # edges sharing a tensor agree on its bytes
        if "tensor" in ed:
            ed["bytes"] = named.setdefault((ed["src"], ed["tensor"]), ed["bytes"])
    doc = {"schema": "placer.graph/v1", "name": "fz", "nodes": nodes, "edges": edges}
    if draw(st.booleans()):
        doc["meta"] = {"source": "fuzz", "nested": _deep(draw(st.integers(0, 20)))}
    for fault in draw(_faults(GRAPH_FAULTS)):
        _graph_fault(draw, doc, fault)
    return doc


def _graph_fault(draw, doc, fault):
    nodes, edges = doc["nodes"], doc["edges"]
    if not isinstance(nodes, list) or not all(isinstance(nd, dict) for nd in nodes):
        return
    if fault == "number" and nodes:
        nd = draw(st.sampled_from(nodes))
        key = draw(st.sampled_from(["compute_s", "memory_bytes", "compute_by_type"]))
        nd[key] = {"V100": draw(BAD)} if key == "compute_by_type" else draw(BAD)
    elif fault == "number" and edges:
        draw(st.sampled_from(edges))["bytes"] = draw(BAD)
    elif fault == "missing" and nodes:
        nd = draw(st.sampled_from(nodes))
        nd.pop(draw(st.sampled_from(["id", "compute_s", "memory_bytes"])), None)
    elif fault == "duplicate_id" and len(nodes) > 1:
        nodes[-1]["id"] = nodes[0].get("id")
    elif fault == "unknown_endpoint" and nodes:
        edges.append({"src": nodes[0].get("id"), "dst": "nowhere", "bytes": 8})
    elif fault == "self_loop" and nodes:
        edges.append({"src": nodes[-1].get("id"), "dst": nodes[-1].get("id"), "bytes": 8})
    elif fault == "cycle" and edges:
        ed = draw(st.sampled_from(edges))
        edges.append({"src": ed["dst"], "dst": ed["src"], "bytes": 8})
    elif fault == "tensor_bytes" and len(nodes) > 2:
        edges += [{"src": nodes[0].get("id"), "dst": nodes[1].get("id"), "bytes": 8, "tensor": "t"},
                  {"src": nodes[0].get("id"), "dst": nodes[2].get("id"), "bytes": 9, "tensor": "t"}]
    elif fault == "deep_meta":
        doc["meta"] = _deep(draw(st.sampled_from([65, 300, 1100])))
    elif fault == "schema":
        doc["schema"] = draw(st.sampled_from(["placer.cluster/v1", "placer.graph/v2", None]))
    elif fault == "members" and nodes:
        draw(st.sampled_from(nodes))["members"] = draw(st.sampled_from([[], ["x"], [1], "x"]))
    elif fault == "big_total" and len(nodes) > 1:
        for nd in nodes:
            nd["memory_bytes"] = 2**52
    elif fault == "not_object":
        doc["nodes"] = draw(st.sampled_from([None, {}, [1, 2], "nodes"]))


CLUSTER_FAULTS = ("number", "number", "duplicate_id", "unknown_pair", "self_pair", "unknown_via", "too_many",
                  "no_devices", "missing_bandwidth")


@st.composite
def cluster_docs(draw):
    k = draw(st.integers(1, 4))
    devices = [{"id": f"g{i}", "type": draw(st.sampled_from(["V100", "A100"])), "memory_bytes": draw(MEMORY),
                "speed": draw(SPEED)} for i in range(k)]
    pairs = []
    for _ in range(draw(st.integers(0, 3)) if k > 1 else 0):
        a, b = draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=2, unique=True))
        p = {"src": f"g{a}", "dst": f"g{b}"}
        if k > 2 and draw(st.booleans()):
            p["via"] = [f"g{next(i for i in range(k) if i not in (a, b))}"]
        else:
            p["bandwidth_Bps"] = draw(BANDWIDTH)
            p["latency_s"] = draw(LATENCY)
        pairs.append(p)
    doc = {"schema": "placer.cluster/v1", "name": "fc", "devices": devices,
           "links": {"default": {"bandwidth_Bps": draw(BANDWIDTH), "latency_s": draw(LATENCY)}, "pairs": pairs}}
    for fault in draw(_faults(CLUSTER_FAULTS)):
        if fault == "number":
            field = draw(st.sampled_from(["speed", "memory_bytes", "bandwidth_Bps", "latency_s"]))
            target = draw(st.sampled_from(devices)) if field in ("speed", "memory_bytes") else doc["links"]["default"]
            target[field] = draw(BAD)
        elif fault == "duplicate_id" and k > 1:
            devices[-1]["id"] = "g0"
        elif fault == "unknown_pair":
            pairs.append({"src": "g0", "dst": "g9", "bandwidth_Bps": 1e9})
        elif fault == "self_pair":
            pairs.append({"src": "g0", "dst": "g0", "bandwidth_Bps": 1e9})
        elif fault == "unknown_via" and k > 1:
            pairs.append({"src": "g0", "dst": "g1", "via": ["g9"]})
        elif fault == "too_many":
            doc["devices"] = [dict(devices[0], id=f"x{i}") for i in range(1025)]
        elif fault == "no_devices":
            doc["devices"] = []
        elif fault == "missing_bandwidth":
            doc["links"]["default"] = {"latency_s": 0.0}
    return doc


PLACEMENT_FAULTS = ("unknown_device", "missing_node", "unknown_node", "order_reversed", "order_unknown", "seed")


@st.composite
def placement_docs(draw, graph, cluster):
    nodes = graph.get("nodes") if isinstance(graph.get("nodes"), list) else []
    ids = [nd.get("id") for nd in nodes if isinstance(nd, dict) and isinstance(nd.get("id"), str)]
    devs = [d.get("id") for d in cluster.get("devices", [])[:8] if isinstance(d.get("id"), str)] or ["g0"]
    assignment = {i: draw(st.sampled_from(devs)) for i in ids}
    doc = {"schema": "placer.placement/v1", "graph": "fz", "cluster": "fc", "algorithm": "given",
           "assignment": assignment}
    if draw(st.booleans()):
        order: dict = {}
        for i in ids:  # file order is topological for generated graphs
            order.setdefault(assignment[i], []).append(i)
        doc["order"] = order
    for fault in draw(_faults(PLACEMENT_FAULTS)):
        if fault == "unknown_device" and ids:
            assignment[draw(st.sampled_from(ids))] = "g9"
        elif fault == "missing_node" and ids:
            assignment.pop(draw(st.sampled_from(ids)), None)
        elif fault == "unknown_node":
            assignment["ghost"] = devs[0]
        elif fault == "order_reversed" and doc.get("order"):
            for seq in doc["order"].values():
                seq.reverse()
        elif fault == "order_unknown":
            doc["order"] = {devs[0]: ["ghost"]}
        elif fault == "seed":
            doc["seed"] = draw(st.sampled_from([2**70, -(2**70), 1.5, "x"]))
    return doc


def _encode(obj) -> str:
    """JSON text; :class:`Raw` numbers verbatim; big integers as Python writes them."""
    if isinstance(obj, Raw):
        return obj.text
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_encode(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(_encode(v) for v in obj) + "]"
    return json.dumps(obj)


def _write(directory: str, name: str, doc, damage: int) -> str:
    text = _encode(doc).encode()
    if damage == 1:
        text = text[: len(text) // 2]  # truncated
    path = os.path.join(directory, name)
    if damage == 2:
        path += ".gz"
        text = gzip.compress(text)[:-5] + b"xxxxx"  # corrupt trailer
    elif damage == 3:
        path += ".gz"
        text = gzip.compress(text, mtime=0)
    with open(path, "wb") as fh:
        fh.write(text)
    return path


def check(args: list[str], files: list[str], schema: str) -> None:
    """Run placer with *args* and assert the contract of the module docstring."""
    r = CliRunner().invoke(main, args)
    where = f"placer {' '.join(args)}\nstdout: {r.stdout[:300]!r}\nstderr: {r.stderr[-600:]!r}"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{type(r.exception).__name__}: {r.exception}\n{where}") from r.exception
    assert "Traceback" not in r.stderr, where
    assert r.exit_code in (0, 1, 2), where
    if r.exit_code == 0:
        doc = orjson.loads(r.stdout)  # exactly one JSON document, nothing else
        assert doc["schema"] == schema, where
        return
    assert r.stdout == "", where
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("Error: "), where
    if r.exit_code == 1:  # bad input names its file; a domain error (no placement fits) names graph and cluster
        names = [os.path.basename(f) for f in files] + ["'fz'", "'fc'"]
        assert any(name in lines[-1] for name in names), f"error names neither file nor graph\n{where}"


def _run_case(data, algos, graph_doc, cluster_doc):
    # draw everything first: what runs must not change what is drawn
    damage_g = data.draw(st.sampled_from([0] * 12 + [1, 2, 3]), label="damage graph file")
    damage_c = data.draw(st.sampled_from([0] * 16 + [1, 3]), label="damage cluster file")
    placement_doc = data.draw(placement_docs(graph_doc, cluster_doc), label="placement")
    algo = data.draw(st.sampled_from(algos), label="algo")
    method = data.draw(st.sampled_from(METHODS), label="method")
    with tempfile.TemporaryDirectory() as d:
        g = _write(d, "graph.json", graph_doc, damage_g)
        c = _write(d, "cluster.json", cluster_doc, damage_c)
        p = _write(d, "placement.json", placement_doc, 0)
        place = ["place", g, "--algo", algo, "-c", c, "--no-timings"]
        for key, value in registry.get(algo).quick_params.items():
            place += ["-p", f"{key}={value}"]
        if algo in SOLVERS:
            place += ["--time-limit", "2"]
        check(place, [g, c], "placer.placement/v1")
        check(["simulate", g, "-P", p, "-c", c], [g, c, p], "placer.report/v1")
        check(["coarsen", g, "--method", method, "-c", c], [g, c], "placer.graph/v1")


@FAST
@given(graph_docs(), cluster_docs(), st.data())
def test_cli_never_crashes_on_malformed_documents(graph_doc, cluster_doc, data):
    _run_case(data, ALGOS, graph_doc, cluster_doc)


@pytest.mark.slow
@SLOW
@given(graph_docs(), cluster_docs(), st.data())
def test_cli_never_crashes_on_malformed_documents_long_run(graph_doc, cluster_doc, data):
    _run_case(data, SLOW_ALGOS, graph_doc, cluster_doc)


MEASUREMENT_FAULTS = ("number", "length", "sizes", "unknown_edge", "missing", "huge_target")


@st.composite
def measurement_docs(draw):
    """A measurements document (docs/design.md) and a target batch, with 0-2 faults."""
    sizes = sorted(draw(st.lists(st.integers(1, 64), min_size=2, max_size=4, unique=True)))
    k = len(sizes)
    n = draw(st.integers(1, 5))
    nodes = [{"id": f"n{i}", "memory_bytes": [draw(st.integers(0, 2**30)) for _ in range(k)],
              "compute_s": draw(st.one_of(SECONDS, st.lists(SECONDS, min_size=k, max_size=k)))} for i in range(n)]
    edges = [{"src": f"n{i}", "dst": f"n{i + 1}", "bytes": [draw(st.integers(0, 2**20)) for _ in range(k)]}
             for i in range(n - 1)]
    doc = {"schema": "placer.measurements/v1", "name": "m", "batch_sizes": sizes, "nodes": nodes, "edges": edges}
    target = draw(st.sampled_from([1, 64, 512, 10**6]))
    for fault in draw(_faults(MEASUREMENT_FAULTS)):
        if fault == "number":
            nodes[0][draw(st.sampled_from(["memory_bytes", "compute_s"]))] = draw(BAD)
        elif fault == "length":
            nodes[-1]["memory_bytes"] = [1] * (k + 1)
        elif fault == "sizes":
            doc["batch_sizes"] = draw(st.sampled_from([[4], [2, 2], [0, 2], ["a", 2], None, [2, 2**70]]))
        elif fault == "unknown_edge":
            edges.append({"src": "n0", "dst": "ghost", "bytes": 1})
        elif fault == "missing":
            nodes[0].pop("compute_s", None)
        elif fault == "huge_target":
            target = 10**12
    return doc, target


@st.composite
def sample_docs(draw):
    """A communication-samples document with 0-2 faults."""
    pairs = [("g0", "g1"), ("g1", "g0")]
    samples = [{"src": a, "dst": b, "bytes": size, "seconds": size / 1e10 + 1e-5}
               for a, b in pairs for size in draw(st.lists(st.sampled_from([0, 1024, 2**20, 2**26, 2**40]),
                                                           min_size=1, max_size=4))]
    doc = {"schema": "placer.comm_samples/v1", "samples": samples}
    if draw(st.booleans()):
        doc["devices"] = [{"id": "g0", "memory_bytes": draw(MEMORY)}, {"id": "g1", "memory_bytes": draw(MEMORY)}]
    for fault in draw(_faults(("number", "self", "unknown", "flat", "empty"))):
        if fault == "number":
            samples[0][draw(st.sampled_from(["bytes", "seconds"]))] = draw(BAD)
        elif fault == "self":
            samples.append({"src": "g0", "dst": "g0", "bytes": 1, "seconds": 1.0})
        elif fault == "unknown" and "devices" in doc:
            samples.append({"src": "g0", "dst": "g9", "bytes": 1, "seconds": 1.0})
        elif fault == "flat":
            for smp in samples:
                smp["seconds"] = 1e-3
        elif fault == "empty":
            doc["samples"] = []
    return doc


def _profile_case(kind, doc, target=None):
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, f"{kind}.json", doc, 0)
        if kind == "measurements":
            check(["profile", "--from-measurements", path, "--target-batch", str(target)], [path], "placer.graph/v1")
        else:
            check(["profile", "--comm-fit", path], [path], "placer.cluster/v1")


@FAST
@given(measurement_docs(), sample_docs())
def test_profile_inputs_never_crash(measurement, samples):
    _profile_case("measurements", *measurement)
    _profile_case("samples", samples)


@pytest.mark.slow
@SLOW
@given(measurement_docs(), sample_docs())
def test_profile_inputs_never_crash_long_run(measurement, samples):
    _profile_case("measurements", *measurement)
    _profile_case("samples", samples)
