"""Issue 23's targets on the memory-tight cluster (slow: the zoo
Transformer micro-batched is a graph of 20,000-40,000 nodes): on
moirai-intra-server, where a data-parallel replica does not fit the 16 GB
P100s, placer's ``pipeline`` beats the peers' rows and ``auto`` answers
a sharded or pipelined plan at no more than 2.02 s per step (auto before
issue 23: 3.33 s): fsdp with speed-proportional shares (1.771 s) ahead of
the best pipeline (1.83 s)."""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.model.io import bundled_cluster, load_graph
from celeritas_cli.sim.simulator import simulate

from ..conftest import SAMPLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def case():
    return load_graph(SAMPLES / "zoo" / "transformer.json.gz"), bundled_cluster("moirai-intra-server")


@pytest.fixture(scope="module")
def rows(case):
    g, c = case
    out = {algo: registry.place(g, c, algo) for algo in ("gpipe", "pipedream", "alpa-stages")}
    out["pipeline"] = registry.place(g, c, "pipeline", params={"evaluations": 300, "time_limit": 0})
    return out


def test_pipeline_beats_the_peers_and_fits(case, rows):
    g, c = case
    mine = rows["pipeline"]
    assert mine.estimate["status"] == "FEASIBLE"
    assert mine.estimate["makespan_s"] <= 2.02
    for algo in ("gpipe", "pipedream", "alpa-stages"):
        assert mine.estimate["makespan_s"] <= rows[algo].estimate["makespan_s"], algo
    rep = simulate(g, c, mine)  # the file's recipe rebuilt: the same number
    assert rep["makespan_s"] == pytest.approx(mine.estimate["makespan_s"]) and rep["status"] == "OK"


def test_auto_answers_a_sharded_or_pipelined_plan_under_2_02_s(case, rows):
    g, c = case
    p = registry.place(g, c, "auto", params={"time_limit": 0, "quiet": True})
    assert p.estimate["status"] == "FEASIBLE" and p.estimate["makespan_s"] <= 2.02
    assert p.estimate["winner"] in ("fsdp(shares=proportional)", "fsdp", "pipeline")
    fsdp = registry.place(g, c, "fsdp", params={"shares": "proportional"})
    assert p.estimate["makespan_s"] <= min(fsdp.estimate["makespan_s"], rows["pipeline"].estimate["makespan_s"])
    assert p.estimate["plan"].startswith(("sharded data parallelism", "2-stage", "3-stage", "4-stage"))
