"""Every registered placement algorithm, on every small sample graph and
sample cluster, judged by the simulator.

Enumerated at collection time from :func:`registry.entries`, so an
algorithm added later is tested without touching this file.  Each case
runs the algorithm twice with ``seed=0`` and its ``quick_params`` and checks:

* every node of the graph is assigned exactly once (and, when an order is
  given, listed exactly once, on its own device);
* colocation groups are whole (on the original graph, also for the coarse one);
* whenever the algorithm claims feasibility (estimate status FEASIBLE or
  OPTIMAL) the simulator finds no device over its memory;
* the two runs give the same assignment and order (determinism).

Graphs: ``layered_60``, ``layered_300`` and ``layered_1000`` coarsened by
``cpd`` (when that method is registered).  Clusters: every file in
``sample_graphs/clusters``.  To stay within ~90 s on the shared 2-core
machine the two Moirai clusters are crossed with ``layered_60`` and the
coarse graph only (``layered_300`` runs on the default 4xV100 cluster),
and algorithms in :data:`SLOW` (a quick run of several seconds) are
limited to ``layered_60`` and the coarse graph on the default cluster.
The first run is shared with tests/test_golden.py (tests/quick_runs.py),
and the slowest runs (``quick_runs.SLOW_RUNS``) are marked slow.
Entries whose ``extra`` (e.g. ``torch``) is not importable are skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from celeritas_cli import registry
from celeritas_cli.transform.derivation import derive
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.graph import Graph
from celeritas_cli.model.jsonio import write_json
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim import symmetric
from celeritas_cli.sim.simulator import simulate

from .. import quick_runs

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_graphs"
CLUSTER_FILES = sorted((SAMPLES / "clusters").glob("*.json"))
DEFAULT_CLUSTER = "4xV100-pcie"
GRAPHS = ["layered_60", "layered_300", "layered_1000@cpd"]
SMALL = {"layered_60", "layered_1000@cpd"}
#: algorithms whose quick run is too slow for layered_300 in this suite
SLOW = {"milp", "hierarchical", "os-dpos", "fd-dps"}


def _cases():
    cases = []
    coarse_ok = "cpd" in registry.coarsener_names()
    for entry in registry.entries():
        marks = []
        if entry.extra and importlib.util.find_spec(entry.extra) is None:
            marks.append(pytest.mark.skip(reason=f"extra '{entry.extra}' not installed"))
        for gname in GRAPHS:
            if gname.endswith("@cpd") and not coarse_ok:
                continue
            if entry.name in SLOW and gname not in SMALL:
                continue
            for cfile in CLUSTER_FILES:
                cname = cfile.stem
                if cname != DEFAULT_CLUSTER and (gname not in SMALL or entry.name in SLOW):
                    continue
                cases.append(pytest.param(entry.name, gname, cname, id=f"{entry.name}-{gname}-{cname}",
                                          marks=marks + quick_runs.marks(entry.name, gname, cname)))
    return cases


def _registered():
    entries = [e for e in registry.entries() if not e.name.startswith("test-")]  # not test-registered stand-ins
    return entries + [registry.get_coarsener(n) for n in registry.coarsener_names()]


@pytest.mark.parametrize("entry", _registered(), ids=lambda e: f"{e.kind}-{e.name}")
def test_registered_function_follows_the_protocol(entry):
    """The :class:`registry.Algorithm` protocol, checked on the signature:
    ``(graph, cluster, *, seed=0, costs=None, **params)``, each ``Param``'s
    default equal to the function's, ``deadline`` exactly where there is a
    ``time_limit``, the shared time-limit / congestion parameters, a max on
    every integer parameter, valid quick parameters (what ``place`` passes;
    what it returns is checked on every run below)."""
    assert registry.signature_problems(entry) == []


def test_the_protocol_check_sees_a_wrong_default():
    entry = registry.get("heft")
    wrong = dataclasses.replace(entry, params={**entry.params, "insertion": registry.Param(bool, False, "x")})
    assert registry.signature_problems(wrong) == ["parameter insertion: default False, the signature says True"]
    timed = dataclasses.replace(entry, params={**entry.params, "time_limit": registry.Param(float, 1.0, "s", gt=0)})
    problems = registry.signature_problems(timed)  # only the registry's cap may be a time_limit heft does not take
    assert "parameter time_limit is not a keyword-only parameter of the function" in problems
    assert "parameter time_limit is not the shared one (model.params)" in problems
    milp = registry.get("milp")
    untimed = dataclasses.replace(milp, params={k: p for k, p in milp.params.items() if k != "time_limit"})
    assert "declares no time_limit (registry.register adds the shared cap)" in registry.signature_problems(untimed)
    shares = dataclasses.replace(registry.get("fsdp"), params={**registry.get("fsdp").params,
                                                               "shares": registry.Param(str, "equal", "x")})
    assert registry.signature_problems(shares) == ["parameter shares is not the shared one (model.params)"]


#: algorithms that split the batch (replicas, micro-batches) and so refuse a coarse graph
BATCH_SPLITTERS = ("data-parallel", "pipeline", "gpipe", "pipedream", "alpa-stages", "fsdp", "megatron", "3d")


def _run(name: str, graph: Graph, cluster, params: dict):
    return registry.place(graph, cluster, name, seed=0, params=params)


@pytest.mark.parametrize("algo,gname,cname", _cases())
def test_algorithm_through_simulator(algo, gname, cname, tmp_path):
    cluster = quick_runs.cluster(cname)
    graph = quick_runs.graph(gname, cname)
    entry = registry.get(algo)
    params = dict(entry.quick_params)
    if algo == "given":
        src = registry.place(graph, cluster, "single-device")
        path = tmp_path / "given.json"
        write_json(src.to_dict(), path)
        params["file"] = str(path)
    if algo in BATCH_SPLITTERS and graph.is_coarse:  # gradients are not told apart on a coarse graph (N13)
        with pytest.raises(InvalidInput, match="is coarse"):
            _run(algo, graph, cluster, params)
        return

    # the run the golden and bound tests judge too (made once per session), and a second, fresh one
    p1 = _run(algo, graph, cluster, params) if algo == "given" else quick_runs.placement(algo, gname, cname)
    p2 = _run(algo, graph, cluster, params)
    assert isinstance(p1, Placement), "the protocol: an algorithm returns a Placement"

    if p1.replicas is not None:  # a symmetric plan (sim/symmetric.py): check its every-replica form
        assert all("/rep0" in nid for nid in p1.assignment), "a symmetric plan lists replica 0's nodes"
        assert p2.replicas == p1.replicas
        p1, p2 = (symmetric.expand(graph, cluster, p) for p in (p1, p2))
        p1.derived = derive(graph, p1.derivation)
    # the graph the placement refers to: a derived graph (FastT/FD-DPS splits, data parallelism), else the input
    target = p1.derived if p1.derived is not None else graph
    expected = {orig for v in range(target.n) for orig in target.original_ids(v)}
    assert set(p1.assignment) == expected, "every node placed exactly once"
    assert set(p1.assignment.values()) <= set(cluster.ids)
    if p1.order is not None:
        listed = [nid for seq in p1.order.values() for nid in seq]
        assert len(listed) == len(set(listed)) == len(expected), "order lists every node once"
        for did, seq in p1.order.items():
            assert all(p1.assignment[nid] == did for nid in seq), "order lists nodes on their device"

    # raises on split colocation groups, a deadlocking order, or a split graph that does not derive from the input
    report = simulate(graph, cluster, p1) if algo == "given" else quick_runs.report(algo, gname, cname)
    assert report["makespan_s"] > 0
    if p1.derived is None:
        original = quick_runs.original(gname)
        for group, members in original.colocation_groups().items():
            assert len({p1.assignment[original.ids[v]] for v in members}) == 1, f"group {group} split"
    if p1.estimate.get("status") in ("FEASIBLE", "OPTIMAL"):
        assert report["status"] == "OK", f"{algo} claims {p1.estimate['status']} but {report['oom_devices']} overflow"

    assert p1.assignment == p2.assignment, "deterministic for a seed"
    assert p1.order == p2.order
