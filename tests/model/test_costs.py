"""The cost-model seam: a user's CostModel subclass is used by the
registry's algorithms, by derived (coarse) graphs and by the simulator."""

from __future__ import annotations

import pytest

from celeritas_cli import registry
from celeritas_cli.transform.contract import contract
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.costs import CostModel, cost_model
from celeritas_cli.model.graph import build
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import simulate

from ..conftest import edge, node


class SlowLinks(CostModel):
    """Every transfer takes twice the link model's time."""

    def link_time(self, nbytes, a, c):
        return 2 * super().link_time(nbytes, a, c)


class FastSecondDevice(CostModel):
    """Device 1 runs every node ten times faster than the file says."""

    def node_row(self, v):
        row = super().node_row(v)
        return [row[0]] + [t / 10 for t in row[1:]]


def test_simulator_judges_under_the_given_model(chain3, two_dev):
    # a(1) on gpu0, b(2) and c(3) on gpu1: one 100-byte transfer, 1 s by the file's links
    p = Placement("chain3", two_dev.name, "given", {"a": "gpu0", "b": "gpu1", "c": "gpu1"})
    assert simulate(chain3, two_dev, p)["makespan_s"] == pytest.approx(1 + 1 + 2 + 3)
    assert simulate(chain3, two_dev, p, costs=SlowLinks(chain3, two_dev))["makespan_s"] == pytest.approx(1 + 2 + 2 + 3)


def test_registry_places_under_the_given_model(chain3, two_dev):
    default = registry.place(chain3, two_dev, "single-device")
    custom = registry.place(chain3, two_dev, "single-device", costs=FastSecondDevice(chain3, two_dev))
    assert set(default.assignment.values()) == {"gpu0"}  # equal speeds: ties to the first device
    assert set(custom.assignment.values()) == {"gpu1"}


def test_for_graph_keeps_the_rules_on_a_coarse_graph(two_dev):
    g = build("g", [node("a", 1), node("b", 1), node("c", 1), node("d", 1)],
              [edge("a", "b"), edge("b", "c"), edge("c", "d")])
    coarse = contract(g, [0, 0, 1, 1])
    m = cost_model(coarse, two_dev, FastSecondDevice(g, two_dev))
    assert isinstance(m, FastSecondDevice) and m.graph is coarse
    assert m.time == [[2.0, 0.2], [2.0, 0.2]]
    slow = SlowLinks(coarse, two_dev)
    assert slow.comm(0, 0, 1) == pytest.approx(2.0)  # 100 bytes at 100 B/s, doubled
    assert slow.mean_comm(0) == pytest.approx(2.0) and slow.max_comm(0) == pytest.approx(2.0)


def test_a_model_for_another_cluster_is_refused(chain3, two_dev, three_dev):
    with pytest.raises(ValueError, match="bound to cluster"):
        cost_model(chain3, three_dev, CostModel(chain3, two_dev))


def test_default_mean_and_max_comm_match_the_per_pair_definition():
    c = uniform(3, bandwidth=100.0, latency=0.5)
    c.bandwidth[0][1] = 50.0
    g = build("e", [node("a"), node("b")], [edge("a", "b", 100)])
    m = CostModel(g, c)
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    per_pair = [c.latency[a][b] + 100 / c.bandwidth[a][b] for a, b in pairs]
    assert m.mean_comm(0) == pytest.approx(sum(per_pair) / len(per_pair))
    assert m.max_comm(0) == pytest.approx(max(per_pair))
