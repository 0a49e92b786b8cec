"""The typed ``estimate`` record (issue 16.4): whose makespan it is (the
algorithm's own model or the simulator) and on which graph (original,
coarse, split), written as flat JSON keys beside the unchanged
``makespan_s`` / ``status``."""

from __future__ import annotations

import orjson
import pytest

from celeritas_cli import registry
from celeritas_cli.transform.contract import contract
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.estimate import Estimate
from celeritas_cli.model.generate import layered
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import run_schedule, simulate

from ..conftest import edge, node


def test_record_round_trip_and_mapping_reads():
    e = Estimate.from_dict({"makespan_s": 1.5, "status": "FEASIBLE", "gap": 0.1, "solve_time_s": 3.0})
    assert e.makespan_by == "model" and e.graph == "original" and e.details == {"gap": 0.1, "solve_time_s": 3.0}
    assert e["status"] == "FEASIBLE" and e.get("gap") == 0.1 and "graph_nodes" not in e
    assert list(e.to_dict()) == ["makespan_s", "status", "makespan_by", "graph", "gap", "solve_time_s"]
    assert "solve_time_s" not in e.to_dict(timings=False)
    assert Estimate.from_dict(e.to_dict()) == e
    c = e.with_graph("coarse", 7)
    assert c.label() == "FEASIBLE (coarse graph)" and c["graph_nodes"] == 7 and e.graph == "original"
    assert Estimate().to_dict() == {"graph": "original"} and Estimate().label() is None


def test_bad_provenance_in_a_file_is_rejected():
    doc = {"schema": "placer.placement/v1", "assignment": {"a": "gpu0"}, "estimate": {"graph": "coarsest"}}
    with pytest.raises(InvalidInput, match=r"p.json: field estimate.graph: must be one of \[.original."):
        Placement.from_dict(doc, "p.json")  # the schema says so
    with pytest.raises(InvalidInput, match="est: makespan_by must be one of model, simulator, got 'oracle'"):
        Estimate.from_dict({"makespan_s": 1.0, "makespan_by": "oracle"}, "est")


def test_model_and_simulator_makespans_are_labelled():
    g, c = layered(40, seed=1), uniform(2)
    heft = registry.place(g, c, "heft")
    assert heft.estimate.makespan_by == "model" and heft.estimate.graph == "original"
    adj = registry.place(g, c, "adjusting")
    assert adj.estimate.makespan_by == "simulator"
    assert adj.estimate.makespan_s == pytest.approx(run_schedule(g, c, [c.index[adj.assignment[i]]
                                                                         for i in g.ids]).makespan)
    metis = registry.place(g, c, "metis")
    assert metis.estimate.makespan_s is None and metis.estimate.makespan_by is None


def test_a_coarse_graph_estimate_says_coarse_and_serialises_flat():
    g = layered(60, seed=2)
    cg = contract(g, [i // 4 for i in range(g.n)], method="chunks")
    p = registry.place(cg, uniform(2), "heft")
    assert p.estimate.graph == "coarse" and p.estimate.graph_nodes == cg.n
    doc = orjson.loads(orjson.dumps(p.to_dict()))
    assert doc["estimate"]["graph"] == "coarse" and doc["estimate"]["makespan_by"] == "model"
    assert doc["estimate"]["makespan_s"] == p.estimate.makespan_s
    report = simulate(g, uniform(2), Placement.from_dict(doc))
    assert report["estimate"]["graph"] == "coarse"


def test_a_split_graph_estimate_says_split():
    g = build("dom", [node("in", 0.1), node("conv", 10.0, splittable=["batch"]), node("out", 0.1)],
              [edge("in", "conv", 1000, tensor="out"), edge("conv", "out", 1000, tensor="out")],
              meta={"batch_size": 8})
    p = registry.place(g, uniform(2, bandwidth=1e6, latency=0.0), "os-dpos")
    assert p.derived is not None
    assert p.estimate.graph == "split" and p.estimate.graph_nodes == p.derived.n
    assert p.estimate.makespan_by == "simulator"
