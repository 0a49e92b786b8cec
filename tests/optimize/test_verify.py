"""``auto -p verify=N``: the N best simulated placements measured with placer run (mocked here;
a real gloo run in the slow test), the fastest measured returned with both numbers recorded."""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import Cluster, uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import Graph
from celeritas_cli.optimize import verify as V
from celeritas_cli.sim.simulator import simulate


def fake_runs(measured: dict[int, float], mismatch: set[int] = frozenset(), fail: set[int] = frozenset()):
    """A stand-in for runner_for: the i-th candidate run measures measured[i]."""
    calls: list[str] = []

    def runner_for(graph, cluster, **kw):
        def run(p, name):
            i = len(calls)
            calls.append(name)
            if i in fail:
                raise InvalidInput(f"{name}: the placement transforms the graph (split)")
            return {"measured_step_s": measured[i], "match": i not in mismatch, "load_average": 1.0}
        return run

    return runner_for, calls


def auto_verify(monkeypatch, n, **kw):
    runner_for, calls = fake_runs(**kw)
    monkeypatch.setattr(V, "runner_for", runner_for)
    g, c = layered(60, seed=1), uniform(2)
    return g, c, registry.place(g, c, "auto", params={"evaluations": 60, "quiet": True, "verify": n}), calls


def test_verify_3_returns_the_fastest_measured_and_records_both_numbers(monkeypatch):
    g, c, p, calls = auto_verify(monkeypatch, 3, measured={0: 3.0, 1: 1.0, 2: 2.0})
    assert len(calls) == 3 and calls[0] == "auto"
    rows = p.estimate["verify"]["candidates"]
    assert [r["measured_s"] for r in rows] == [3.0, 1.0, 2.0]
    assert rows[0]["simulated_s"] <= rows[1]["simulated_s"] <= rows[2]["simulated_s"]    # the N best, in order
    assert p.estimate["verified_choice"] == calls[1] and p.estimate["measured_s"] == 1.0
    assert p.estimate["verify"]["chosen"] == calls[1] and "measured runs" in p.estimate["caveat"]
    # the returned placement is the one measured, and its estimate is the simulator's step for it
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(p.estimate["makespan_s"])
    assert p.estimate["makespan_s"] == pytest.approx(rows[1]["simulated_s"])


def test_mismatched_numerics_and_failed_runs_are_never_chosen(monkeypatch):
    g, c, p, calls = auto_verify(monkeypatch, 3, measured={0: 3.0, 1: 1.0, 2: 2.0}, mismatch={1}, fail={2})
    rows = p.estimate["verify"]["candidates"]
    assert rows[2]["measured_s"] is None and "transforms the graph" in rows[2]["error"]
    assert p.estimate["verified_choice"] == "auto" and p.estimate["measured_s"] == 3.0
    plain = registry.place(g, c, "auto", params={"evaluations": 60, "quiet": True})
    assert p.assignment == plain.assignment and "verify" not in plain.estimate


def test_nothing_measured_keeps_the_simulated_best(monkeypatch):
    g, c, p, calls = auto_verify(monkeypatch, 2, measured={}, fail={0, 1})
    assert p.estimate["verified_choice"] == "auto" and p.estimate["measured_s"] is None
    assert "measured no candidate" in p.estimate["caveat"]


def test_fastest_breaks_ties_by_the_simulated_step():
    rows = [{"simulated_s": 2.0, "measured_s": 1.0, "match": True},
            {"simulated_s": 1.0, "measured_s": 1.0, "match": True}]
    assert V.fastest(rows) == 1 and V.fastest([]) is None


def test_a_cluster_of_another_machine_or_a_graph_without_model_is_refused():
    with pytest.raises(InvalidInput, match="cluster '4xV100' is not this machine"):
        V.backend_for(uniform(4, name="4xV100"))
    doc = uniform(2).to_dict()
    doc["meta"] = {"comm_bench": {"processes": 2}}
    assert V.backend_for(Cluster.from_dict(doc)) == "gloo"
    with pytest.raises(InvalidInput, match="was not made by placer profile --model"):
        V.model_of(layered(20, seed=0))


def test_verify_is_refused_before_the_search(monkeypatch):
    """A cluster that is not this machine is refused before auto spends its time limit searching."""
    import celeritas_cli.algorithms.auto as A

    def no_search(*a, **kw):
        raise AssertionError("auto searched before refusing verify")

    monkeypatch.setattr(A, "Search", no_search)
    with pytest.raises(InvalidInput, match="is not this machine"):
        registry.place(layered(20, seed=0), uniform(4, name="4xV100"), "auto", params={"verify": 2})


@pytest.mark.slow
def test_verify_runs_real_gloo_processes():
    pytest.importorskip("torch")
    from celeritas_cli.profile import capture_model

    spec = "tests.profile.test_profile_torch:TinyMLP"
    g = Graph.from_dict(capture_model(spec, 4), "g")
    doc = uniform(2).to_dict()
    doc["meta"] = {"comm_bench": {"processes": 2, "threads": 1}}
    c = Cluster.from_dict(doc)
    p = registry.place(g, c, "auto", params={"evaluations": 40, "quiet": True, "verify": 2})
    rows = p.estimate["verify"]["candidates"]
    assert len(rows) == 2 and all(r["match"] and r["measured_s"] > 0 for r in rows)
    assert p.estimate["measured_s"] == min(r["measured_s"] for r in rows)
