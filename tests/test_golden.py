"""Golden placements: the safety net for refactors.

Every registered placement algorithm (with its ``quick_params``) on a fixed
set of sample graphs and clusters, and every coarsening method on a few
graphs, is compared with ``tests/golden/placements.json``: the simulated
makespan and status, and a digest of the assignment and order (placements)
or of the coarse graph document (coarsening).  A refactor that changes any
placement fails here.  The runs are made once per session by tests/quick_runs.py (which
tests/algorithms/test_all_algorithms.py and tests/sim/test_honest_bounds.py judge too); the slowest
(``quick_runs.SLOW_RUNS``) are marked slow.

When a change of behaviour is intended (a bug fix, a new default), regenerate
the file and say in the commit message which cases changed and why::

    .venv/bin/python tests/test_golden.py --update        # rewrite all
    .venv/bin/python tests/test_golden.py --update adjusting   # only cases of one algorithm
    git diff --stat tests/golden/placements.json

Cases whose algorithm needs a missing extra (torch) are skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a script: tests/ is sys.path[0], and tests/profile would shadow the
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(ROOT))  # standard library's profile module (torch imports it)

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.jsonio import write_json  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402
from tests import quick_runs  # noqa: E402

SAMPLES = ROOT / "sample_graphs"
GOLDEN = Path(__file__).resolve().parent / "golden" / "placements.json"
DEFAULT_CLUSTER = "4xV100-pcie"
OTHER_CLUSTERS = ("moirai-inter-server", "moirai-intra-server")
#: graphs on the default cluster; ``@cpd`` = coarsened by cpd with defaults
GRAPHS = ("layered_60", "layered_300", "layered_1000@cpd", "zoo/tensor_holography")
#: too slow (a quick run of seconds) for more than the smallest graphs
SLOW = {"milp", "hierarchical", "os-dpos", "fd-dps"}
SMALL = ("layered_60", "layered_1000@cpd")
COARSEN_GRAPHS = ("layered_300", "zoo/tensor_holography")


def placement_cases() -> list[tuple[str, str, str]]:
    cases = []
    for entry in registry.entries():
        for gname in GRAPHS:
            if entry.name in SLOW and gname not in SMALL:
                continue
            cases.append((entry.name, gname, DEFAULT_CLUSTER))
        for cname in OTHER_CLUSTERS:
            if entry.name not in SLOW:
                cases.append((entry.name, "layered_60", cname))
    return cases


def coarsen_cases() -> list[tuple[str, str, str]]:
    return [(m, g, DEFAULT_CLUSTER) for m in registry.coarsener_names() for g in COARSEN_GRAPHS]


def _digest(obj) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def place_record(algo: str, gname: str, cname: str, tmp_dir: Path) -> dict:
    cluster, graph = quick_runs.cluster(cname), quick_runs.graph(gname, cname)
    params = dict(registry.get(algo).quick_params)
    if algo == "given":
        path = tmp_dir / "given.json"
        write_json(registry.place(graph, cluster, "m-topo").to_dict(), path)
        params["file"] = str(path)
    try:  # other than given, the quick run tests/algorithms/test_all_algorithms.py judges too, made once
        p = (registry.place(graph, cluster, algo, seed=0, params=params) if algo == "given"
             else quick_runs.placement(algo, gname, cname))
    except InvalidInput as exc:  # refused on purpose (data parallelism, sharded or not, of a coarse graph)
        return {"error": str(exc)}
    report = (simulate(quick_runs.original(gname), cluster, p) if algo == "given"
              else quick_runs.report(algo, gname, cname, on_original=True))
    return {"makespan_s": report["makespan_s"], "status": report["status"],
            "placement": _digest({"assignment": p.assignment, "order": p.order, "split": p.derived.to_dict() if p.derived is not None else None})}


def coarsen_record(method: str, gname: str, cname: str) -> dict:
    coarse = registry.coarsen(quick_runs.graph(gname, cname), quick_runs.cluster(cname), method)
    return {"nodes": coarse.n, "graph": _digest(coarse.to_dict())}


def _key(*parts: str) -> str:
    return "|".join(parts)


def _load_golden() -> dict:
    return orjson.loads(GOLDEN.read_bytes()) if GOLDEN.exists() else {}


def _skip_reason(algo: str) -> str | None:
    extra = registry.get(algo).extra
    if extra and importlib.util.find_spec(extra) is None:
        return f"extra '{extra}' not installed"
    return None


@pytest.mark.parametrize("algo,gname,cname", [pytest.param(*c, marks=quick_runs.marks(*c)) for c in placement_cases()],
                         ids=lambda x: x)
def test_golden_placement(algo, gname, cname, tmp_path):
    reason = _skip_reason(algo)
    if reason:
        pytest.skip(reason)
    expected = _load_golden().get(_key("place", algo, gname, cname))
    assert expected is not None, "no golden record: run `python tests/test_golden.py --update`"
    got = place_record(algo, gname, cname, tmp_path)
    assert got.get("error") == expected.get("error")
    if "error" in got:
        return
    assert got["status"] == expected["status"]
    assert math.isclose(got["makespan_s"], expected["makespan_s"], rel_tol=1e-9, abs_tol=1e-12)
    assert got["placement"] == expected["placement"], "placement changed (see the module docstring)"


@pytest.mark.parametrize("method,gname,cname", coarsen_cases(), ids=lambda x: x)
def test_golden_coarsening(method, gname, cname):
    expected = _load_golden().get(_key("coarsen", method, gname, cname))
    assert expected is not None, "no golden record: run `python tests/test_golden.py --update`"
    assert coarsen_record(method, gname, cname) == expected


def update(only: set[str]) -> None:
    import tempfile

    golden = _load_golden()
    with tempfile.TemporaryDirectory() as tmp:
        for algo, gname, cname in placement_cases():
            if (only and algo not in only) or _skip_reason(algo):
                continue
            golden[_key("place", algo, gname, cname)] = place_record(algo, gname, cname, Path(tmp))
            print("place", algo, gname, cname, golden[_key("place", algo, gname, cname)], file=sys.stderr)
        for method, gname, cname in coarsen_cases():
            if only and method not in only:
                continue
            golden[_key("coarsen", method, gname, cname)] = coarsen_record(method, gname, cname)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_bytes(orjson.dumps(dict(sorted(golden.items())), option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "--update":
        sys.exit("usage: python tests/test_golden.py --update [ALGO_OR_METHOD ...]")
    update(set(sys.argv[2:]))
