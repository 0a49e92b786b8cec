"""``os-dpos -p start=best``: Algorithm 2 (FastT 5.2) run from both input
graphs - the model's DAG and the data-parallel graph - keeping the better
result (memory-feasible first, then the simulated makespan)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.transform.split_cost import COPY_BANDWIDTH_BPS, DEFAULT_OVERHEAD_S
from celeritas_cli.sim.simulator import simulate

from ..conftest import training_model

ADD = 3 * 25 / COPY_BANDWIDTH_BPS  # one reduce-scatter add of a 25-byte chunk


def test_best_takes_the_data_parallel_graph_where_fastts_rule_takes_the_dag():
    # the model (1100 B) does not fit a 1000 B device, so FastT's rule (start=auto) takes the DAG; its
    # data-parallel replicas do fit (activations split four ways), and run faster: x 0.1 + f 2 + b 2,
    # a ring all-reduce of the 100 B gradient (6 hops of 25 B at 1000 B/s, 3 adds), then u 1 s
    g = training_model()
    cl = uniform(4, bandwidth=1000.0, latency=0.0, memory=1000)
    fastt = registry.place(g, cl, "os-dpos")
    assert fastt.estimate["input"] == "dag"
    dp = registry.place(g, cl, "os-dpos", params={"start": "data-parallel"})
    best = registry.place(g, cl, "os-dpos", params={"start": "best"})
    expected = 0.1 + 2 + 2 + 6 * 0.025 + 3 * ADD + 1.0 + 3 * DEFAULT_OVERHEAD_S
    assert best.estimate["input"] == "data-parallel" and best.estimate["status"] == "FEASIBLE"
    assert best.estimate["makespan_s"] == pytest.approx(expected, rel=1e-9)
    assert best.assignment == dp.assignment and best.derivation == dp.derivation
    tried = best.estimate["inputs_tried"]
    assert tried["data-parallel"] == best.estimate["makespan_s"] < tried["dag"] == fastt.estimate["makespan_s"]
    rep = simulate(g, cl, best)
    assert rep["status"] == "OK" and rep["makespan_s"] == best.estimate["makespan_s"]


def test_best_keeps_the_dag_where_it_wins():
    # a single device: there is no data-parallel graph, both runs are the DAG's
    g = training_model()
    cl = uniform(1, memory=10_000)
    best = registry.place(g, cl, "os-dpos", params={"start": "best"})
    assert best.estimate["input"] == "dag" and list(best.estimate["inputs_tried"]) == ["dag"]
    assert best.derivation is None


def test_best_from_the_cli_is_byte_identical(tmp_path):
    gpath, cpath = tmp_path / "g.json", tmp_path / "c.json"
    gpath.write_bytes(orjson.dumps(training_model().to_dict()))
    cpath.write_bytes(orjson.dumps(uniform(4, bandwidth=1000.0, latency=0.0, memory=1000).to_dict()))
    args = ["place", str(gpath), "--cluster", str(cpath), "--algo", "os-dpos", "-p", "start=best", "--no-timings"]
    r1 = CliRunner().invoke(main, args, catch_exceptions=False)
    r2 = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r1.exit_code == 0 and r1.stdout == r2.stdout
    doc = orjson.loads(r1.stdout)
    assert doc["estimate"]["input"] == "data-parallel" and doc["derivation"]["steps"][0]["replicas"] == 4
    bad = CliRunner().invoke(main, args[:-2] + ["-p", "start=fastest"])
    assert bad.exit_code != 0 and "start" in bad.output
