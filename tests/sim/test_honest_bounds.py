"""Every lower bound placer prints is below the makespan it is printed with
("every number placer prints is true"), also when the placement runs a
derived graph (data parallelism, operation splits) whose parts beat the
original graph's critical path."""

from __future__ import annotations

import importlib.util

import pytest

from celeritas_cli import registry
from celeritas_cli.algorithms.auto import auto
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.graph import build
from celeritas_cli.transform.split_cost import DEFAULT_OVERHEAD_S
from celeritas_cli.sim.bounds import work_bound
from celeritas_cli.sim.simulator import lower_bound, simulate

from .. import quick_runs
from ..conftest import edge, node

ZOO = ("tensor_holography", "inception_v3", "nmt", "resnet50", "transformer")
#: quick runs too slow for a zoo graph in the default suite
SLOW = {"milp", "hierarchical", "os-dpos", "fd-dps"}
TOL = 1e-9


def chain() -> tuple:
    """a (4 s) -> b (4 s), no optimizer: on 2 devices the original critical
    path is 8 s, two data-parallel replicas on half the batch take 2 + 2."""
    g = build("ab", [node("a", 4.0), node("b", 4.0)], [edge("a", "b", 100)], meta={"batch_size": 2})
    return g, uniform(2, bandwidth=100.0, latency=0.0)


def assert_true_bounds(report: dict, estimate: dict | None = None) -> None:
    """Every bound the report (and the estimate) prints holds for its makespan."""
    ms = report["makespan_s"]
    slack = ms * (1 + TOL)
    assert report["lower_bound_s"] <= slack
    assert report["tight_lower_bound_s"] <= slack
    for b in report["lower_bounds"]:
        if b["name"] != "memory_cut" or report["status"] == "OK":
            assert b["value_s"] <= slack, b
    if report["makespan_over_lb"] is not None:
        assert report["makespan_over_lb"] >= 1 - TOL
    if estimate is not None and estimate.get("lower_bound_s") is not None:
        assert estimate["lower_bound_s"] <= estimate["makespan_s"] * (1 + TOL)


def test_data_parallel_beats_the_original_critical_path_and_its_bound_says_so():
    g, c = chain()
    assert lower_bound(g, c) == 8.0  # the original's critical path
    p = registry.place(g, c, "data-parallel", params={"overhead_s": 0.0})
    rep = simulate(g, c, p)
    assert rep["makespan_s"] == 4.0 == p.estimate["makespan_s"]
    # the derived graph's bound: each replica's chain 2 + 2; work 4 x 2 / 2 devices
    assert rep["lower_bound_s"] == 4.0 == p.estimate["lower_bound_s"]
    assert rep["makespan_over_lb"] == 1.0 == p.estimate["makespan_over_lb"]
    names = [b["name"] for b in rep["lower_bounds"]]
    assert names == ["path_and_work", "work_any_derivation"]
    assert "derived graph" in rep["lower_bounds"][0]["holds_for"]
    assert rep["lower_bounds"][1]["value_s"] == 4.0 == work_bound(g, c)  # (4 + 4) / 2
    assert_true_bounds(rep, p.estimate)


def test_weak_scaling_bound_is_the_replica_chain():
    g, c = chain()
    p = registry.place(g, c, "data-parallel", params={"scaling": "weak"})
    rep = simulate(g, c, p)
    # every replica runs the whole batch: 8 s, bound 8; any derivation: (4 + 4) / 2
    assert rep["makespan_s"] == 8.0 == rep["lower_bound_s"]
    assert rep["lower_bounds"][-1] == {**rep["lower_bounds"][-1], "name": "work_any_derivation", "value_s": 4.0}
    assert_true_bounds(rep, p.estimate)


def test_auto_choosing_data_parallelism_reports_the_bound_simulate_reports():
    g, c = chain()
    p = auto(g, c, evaluations=60, quiet=True)
    assert p.estimate["winner"] == "data-parallel" and p.derivation is not None
    expected = 4.0 + 2 * DEFAULT_OVERHEAD_S  # a/rep0 then b/rep0, each 2 s + one launch
    assert p.estimate["makespan_s"] == pytest.approx(expected, rel=1e-12)
    assert p.estimate["lower_bound_s"] == pytest.approx(expected, rel=1e-12)
    rep = simulate(g, c, p)
    assert rep["lower_bound_s"] == p.estimate["lower_bound_s"]  # the same bound, two code paths
    assert rep["makespan_over_lb"] == p.estimate["makespan_over_lb"]
    assert_true_bounds(rep, p.estimate)


def test_plain_placement_reports_are_unchanged():
    g, c = chain()
    rep = simulate(g, c, registry.place(g, c, "single-device"))
    assert [b["name"] for b in rep["lower_bounds"]] == ["path_and_work"]
    assert rep["lower_bounds"][0]["holds_for"] == "every placement"
    assert rep["lower_bound_s"] == 8.0 == rep["makespan_s"]


def _algorithms(slow: bool) -> list[str]:
    out = []
    for e in registry.entries():
        if e.kind != "placement" or e.name == "given":  # given re-reads a placement file
            continue
        if getattr(e, "extra", None) and importlib.util.find_spec(e.extra) is None:
            continue
        if (e.name in SLOW) == slow:
            out.append(e.name)
    return sorted(out)


def _check(gname: str, algo: str) -> None:
    g, c = quick_runs.original(f"zoo/{gname}"), quick_runs.cluster("4xV100-pcie")
    # the bounds, not the clock: counted budgets only (pipeline's first plan of nmt takes longer than its 10 s)
    params = {"time_limit": 0.0, **(registry.get(algo).quick_params or {})}
    p = registry.place(g, c, algo, seed=0, params=params)
    assert_true_bounds(simulate(g, c, p), p.estimate)


@pytest.mark.parametrize("algo", _algorithms(slow=False))
def test_every_fast_algorithm_prints_true_bounds_on_tensor_holography(algo):
    # the graph where data parallelism beats the original critical path by 4x
    _check("tensor_holography", algo)


@pytest.mark.slow
@pytest.mark.parametrize("gname", ZOO)
@pytest.mark.parametrize("algo", _algorithms(slow=False) + _algorithms(slow=True))
def test_every_algorithm_prints_true_bounds_on_the_zoo(gname, algo):
    _check(gname, algo)
