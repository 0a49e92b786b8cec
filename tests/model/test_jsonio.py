"""Bad input never crashes placer (issue 15): ranges on load, broken files,
odd output paths, C libraries writing to stdout, parameter ranges, solver guards."""

from __future__ import annotations

import gzip
import math
import os
import stat
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.graph import Graph, build
from celeritas_cli.model.io import load_graph
from celeritas_cli.model.jsonio import MAX_DEPTH, write_bytes
from celeritas_cli.model.limits import BYTES_MAX, TIME_MAX

from ..conftest import SAMPLES, edge, node

G60 = str(SAMPLES / "layered_60.json")


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input)


def gdoc(nodes, edges, **kw):
    return {"schema": "placer.graph/v1", "name": "g", "nodes": nodes, "edges": edges, **kw}


def cdoc(speeds=(1.0, 1.0), bw=1e10, lat=1e-5, mem=2**35):
    return {"schema": "placer.cluster/v1", "name": "c",
            "devices": [{"id": f"g{i}", "memory_bytes": mem, "speed": s} for i, s in enumerate(speeds)],
            "links": {"default": {"bandwidth_Bps": bw, "latency_s": lat}}}


def one_line(exc_info, label):
    msg = str(exc_info.value)
    assert "\n" not in msg and msg.startswith(f"{label}: "), msg
    return msg


# ------------------------------------------------------------- ranges on load
@pytest.mark.parametrize("doc, where", [
    (gdoc([node("a", mem=2**62)], []), "node 'a' field memory_bytes: must be at most 2\\^53-1"),
    (gdoc([node("a", mem=1e308)], []), "node 'a' field memory_bytes: must be at most 2\\^53-1"),
    (gdoc([node("a"), node("b")], [edge("a", "b", 2**63 - 1)]), r"edge a->b \(#0\) field bytes: must be at most"),
    (gdoc([node("a", 1e308)], []), "node 'a' field compute_s: must be at most 1e12 s"),
    (gdoc([node("a", compute_by_type={"V100": 1e30})], []), "node 'a' field compute_by_type.V100: must be at most"),
    (gdoc([node("a", mem=2**52), node("b", mem=2**52)], []), "total of memory_bytes over all nodes"),
    (gdoc([node("a"), node("b"), node("c")], [edge("a", "b", 2**52), edge("a", "c", 2**52)]),
     "total of bytes over all distinct tensors"),
])
def test_graph_numbers_outside_the_range_are_rejected_naming_node_and_field(doc, where):
    with pytest.raises(InvalidInput, match=where) as info:
        Graph.from_dict(doc, "g.json")
    one_line(info, "g.json")


def test_the_range_limits_themselves_are_accepted():
    g = Graph.from_dict(gdoc([node("a", TIME_MAX, mem=BYTES_MAX - 8), node("b", 0.0)],
                             [edge("a", "b", 8)]), "g.json")
    assert g.memory[0] == BYTES_MAX - 8 and g.compute[0] == TIME_MAX


def test_one_shared_tensor_counts_once_in_the_total():
    # the same 2^52-byte tensor to two consumers is one tensor: within the limit
    Graph.from_dict(gdoc([node("a"), node("b"), node("c")],
                         [edge("a", "b", 2**52, tensor="t"), edge("a", "c", 2**52, tensor="t")]), "g.json")


@pytest.mark.parametrize("doc, where", [
    (cdoc(bw=1e-300), "field links.default.bandwidth_Bps: must be at least 1"),
    (cdoc(lat=1e300), "field links.default.latency_s: must be at most 1e12 s"),
    (cdoc(speeds=(1e-300, 1.0)), "device 'g0' field speed: must be at least 1e-6"),
    (cdoc(speeds=(1e9, 1.0)), "device 'g0' field speed: must be at most 1e6"),
    (cdoc(mem=2**60), "device 'g0' field memory_bytes: must be at most 2\\^53-1"),
    (cdoc(speeds=(1.0,) * 1025), "field devices: must contain less than or equal to 1024 items"),
])
def test_cluster_numbers_outside_the_range_are_rejected(doc, where):
    with pytest.raises(InvalidInput, match=where) as info:
        Cluster.from_dict(doc, "c.json")
    one_line(info, "c.json")


def test_deep_meta_is_rejected_on_load_and_ordinary_meta_round_trips():
    deep: dict = {}
    for _ in range(1000):
        deep = {"x": deep}
    with pytest.raises(InvalidInput, match=f"field meta: nested more than {MAX_DEPTH} levels deep"):
        Graph.from_dict(gdoc([node("a")], [], meta=deep), "g.json")
    with pytest.raises(InvalidInput, match="node 'a' field notes: nested more than"):
        Graph.from_dict(gdoc([node("a", notes=[deep])], []), "g.json")
    ok: dict = {"leaf": 1}
    for _ in range(MAX_DEPTH - 1):
        ok = {"x": ok}
    g = Graph.from_dict(gdoc([node("a")], [], meta=ok), "g.json")
    assert orjson.loads(orjson.dumps(g.to_dict()))["meta"] == ok


# ------------------------------------------------------------- broken files
def test_corrupt_gzip_is_one_line(tmp_path):
    f = tmp_path / "g.json.gz"
    f.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage" * 10)
    with pytest.raises(InvalidInput, match="not a valid gzip file") as info:
        load_graph(f)
    one_line(info, str(f))
    f.write_bytes(gzip.compress(b'{"schema": "placer.graph/v1", "nodes": [], "edges": []}')[:-6])
    with pytest.raises(InvalidInput, match="not a valid gzip file"):
        load_graph(f)


def test_big_integer_literal_is_rejected_by_range(tmp_path):
    f = tmp_path / "g.json"
    f.write_text('{"schema": "placer.graph/v1", "nodes": [{"id": "a", "compute_s": 1, "memory_bytes": '
                 + "9" * 40 + '}], "edges": []}')
    with pytest.raises(InvalidInput, match="node 'a' field memory_bytes: must be at most"):
        load_graph(f)


# ------------------------------------------------------------- output paths
def test_output_to_a_directory_or_empty_name_is_an_error(tmp_path):
    with pytest.raises(InvalidInput, match="is a directory"):
        write_bytes(b"{}", tmp_path)
    with pytest.raises(InvalidInput, match="empty"):
        write_bytes(b"{}", "")
    r = run(["place", G60, "--algo", "random", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "is a directory" in r.output and "Traceback" not in r.output
    r = run(["place", G60, "--algo", "random", "-o", ""])
    assert r.exit_code == 2 and "empty file name" in r.output


def test_output_to_a_fifo_writes_into_it_and_keeps_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", f"import sys; print(len(open({str(fifo)!r}, 'rb').read()))"],
                              stdout=subprocess.PIPE, text=True)
    write_bytes(b'{"a": 1}\n', fifo)
    assert reader.communicate(timeout=30)[0].strip() == "9"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _null_device(tmp_path) -> str:
    """A character device that discards writes: /dev/null, or a fresh one made with mknod (root)."""
    if stat.S_ISCHR(os.stat(os.devnull).st_mode):
        return os.devnull
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (OSError, AttributeError):
        pytest.skip("no character device to write to")
    return str(dev)


def test_output_to_a_character_device_keeps_the_device(tmp_path):
    dev = _null_device(tmp_path)
    before = os.stat(dev)
    write_bytes(b"{}\n", dev)
    r = run(["place", G60, "--algo", "random", "-o", dev])
    assert r.exit_code == 0, r.output
    after = os.stat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_device_is_one_line_exit_1():
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-m", "celeritas_cli", "place", G60, "--algo", "random"],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == "Error: <stdout>: cannot write the result: No space left on device"
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr


# ------------------------------------------------------------- C libraries and stdout
def test_metis_message_goes_to_stderr_not_stdout():
    # one device 1000x faster: METIS gets a zero-weight part and prints "***Cannot bisect ..." from C
    fast = {"schema": "placer.cluster/v1", "name": "fast",
            "devices": [{"id": "g0", "memory_bytes": 2**35, "speed": 1000}]
            + [{"id": f"g{i}", "memory_bytes": 2**35, "speed": 1} for i in (1, 2)],
            "links": {"default": {"bandwidth_Bps": 1e10}}}
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(fast, fh)
    try:
        p = subprocess.run([sys.executable, "-m", "celeritas_cli", "place", G60, "--algo", "metis", "-c", fh.name],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(fh.name)
    assert p.returncode == 0, p.stderr
    assert orjson.loads(p.stdout)["schema"] == "placer.placement/v1"  # nothing but JSON on stdout
    assert "Cannot bisect" in p.stderr


def test_stdout_to_stderr_moves_python_and_c_writes(capfd):
    from celeritas_cli.log import stdout_to_stderr

    with stdout_to_stderr():
        print("from python")
        os.write(1, b"from C level\n")
    print("after")
    out, err = capfd.readouterr()
    assert "from python" in err and "from C level" in err
    assert "from python" not in out and "from C level" not in out and "after" in out


# ------------------------------------------------------------- parameters
@pytest.mark.parametrize("algo, param, value, problem", [
    ("m-sct", "threshold", "nan", "must be a finite number"),
    ("m-sct", "threshold", "-5", "must be >= 0.0"),
    ("metis", "ufactor", "-1", "must be >= 1"),
    ("os-dpos", "max_ops", "-1", "must be >= 0"),
    ("order-place", "fill", "0", "must be > 0"),
    ("milp", "workers", "0", "must be >= 1"),
    ("milp", "resolution", "-1", "must be >= 0"),
    ("milp", "time_limit", "inf", "must be a finite number"),
    ("fd-dps", "split_parts", "1", "must be 0 or >= 2"),
    ("fd-dps", "eps", "0", "must be > 0"),
])
def test_parameter_ranges_are_checked(algo, param, value, problem):
    with pytest.raises(InvalidInput, match=f"'{algo}' parameter {param}: {problem}"):
        registry.get(algo).coerce({param: value})


def test_every_parameter_declares_what_it_accepts():
    """Every numeric parameter of every algorithm and coarsener has a declared
    range, and its default is inside it."""
    entries = registry.entries() + [registry.get_coarsener(n) for n in registry.coarsener_names()]
    for e in entries:
        for key, p in e.params.items():
            assert p.problem(p.default) is None, (e.name, key)
            if p.type in (int, float) and p.choices is None:
                assert p.min is not None or p.gt is not None or p.check is not None, (e.name, key)


def test_coarsen_parameter_ranges():
    with pytest.raises(InvalidInput, match="'cpd' parameter R: must be >= 0"):
        registry.get_coarsener("cpd").coerce({"R": -1})
    with pytest.raises(InvalidInput, match="'cpd' parameter M: must be a finite number"):
        registry.get_coarsener("cpd").coerce({"M": "nan"})


def test_time_limit_nan_is_a_usage_error():
    r = run(["place", G60, "--algo", "milp", "--time-limit", "nan"])
    assert r.exit_code == 2 and "must be a number of seconds from 0 (no limit) to 1e12" in r.output


# ------------------------------------------------------------- solver guards
def test_m_sct_lp_with_wide_time_range_finishes():
    """One node 1e11 s among microsecond nodes made GLOP run for minutes; the
    LP is scaled now and gives the same favourites on ordinary graphs."""
    from celeritas_cli.algorithms.placers.m_sct import m_sct

    doc = orjson.loads(open(G60, "rb").read())
    doc["nodes"][5]["compute_s"] = 1e11
    g = Graph.from_dict(doc, "g.json")
    p = m_sct(g, uniform(4), lp_max_nodes=5000)
    assert p.estimate["favorites"] == "lp" and p.estimate["lp_makespan_s"] >= 1e11


def test_milp_with_huge_transfer_times_does_not_overflow():
    from celeritas_cli.algorithms.placers.milp import milp

    g = build("wide", [node("a", 1e-6), node("b", 1e-6), node("c", 1e-6)],
              [edge("a", "b", 2**52), edge("a", "c", 10)])
    c = uniform(2, bandwidth=1.0, latency=TIME_MAX)
    p = milp(g, c, time_limit=5, workers=1, hint="none")
    assert math.isfinite(p.estimate["makespan_s"])
    with pytest.raises(InvalidInput, match="use -p resolution="):
        milp(g, c, time_limit=5, workers=1, hint="none", resolution=1e-300)


def test_trace_on_stdout_only_when_the_report_is_not(tmp_path):
    p = tmp_path / "p.json"
    assert run(["place", G60, "--algo", "heft", "-o", str(p)]).exit_code == 0
    r = run(["simulate", G60, "-P", str(p), "--trace", "-"])
    assert r.exit_code == 2 and r.stdout == "" and "--trace FILE" in r.stderr
    r = run(["simulate", G60, "-P", str(p), "--trace", "-", "-o", str(tmp_path / "report.json")])
    assert r.exit_code == 0 and "traceEvents" in orjson.loads(r.stdout)


@pytest.mark.parametrize("tag", ["[]", "{}", "[\"placer.graph/v1\"]"])
def test_a_schema_tag_that_is_not_a_string_is_named(tmp_path, tag):
    """Found by tests/test_fuzz_inputs.py (a resume row with "schema": []): an unhashable tag was looked
    up in the table of schemas - a TypeError traceback for every kind of document."""
    g = tmp_path / "g.json"
    g.write_text(f'{{"schema": {tag}, "nodes": [], "edges": []}}')
    r = run(["simulate", str(g), "-P", str(SAMPLES.parent / "examples" / "expert_placement.json")])
    assert r.exit_code == 1 and r.stderr.strip() == f"Error: {g}: field schema is {orjson.loads(tag)!r}, expected " \
                                                     f"\"placer.graph/v1\""
