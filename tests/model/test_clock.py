"""One deadline and one size guard that every algorithm honours, enforced by
``registry.place`` (issue 33, item 2; model/clock.py, transform/size.py).

No test here measures time: the clock the cap reads (``clock.now``) is
replaced by one that jumps past the cap, so each test knows the cap has
passed and checks what was stopped, where, and what came back.  The one
real-time test (an algorithm that never looks at the clock) only checks
that it was stopped at all.
"""

from __future__ import annotations

import itertools
import time

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput, PlacerError, TimeLimit
from celeritas_cli.model import clock
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.placement import Placement
from celeritas_cli.sim.simulator import makespan_of
from celeritas_cli.transform import microbatch
from celeritas_cli.transform.derivation import apply_step, split_step

from ..conftest import SAMPLES

ROWS = ("pipeline", "gpipe", "pipedream", "alpa-stages")


def _late(monkeypatch, after: int = 0):
    """``clock.now`` reads the real clock for its first *after* calls, then
    a day later: every cap in force has passed."""
    calls = itertools.count()
    monkeypatch.setattr(clock, "now", lambda: time.perf_counter() + (86400.0 if next(calls) >= after else 0.0))


def _no_alarm(monkeypatch):
    """Only the cooperative checks (the alarm would fire at once on a cap
    that has passed)."""
    monkeypatch.setattr(clock, "_arm", lambda cap: None)


def _single(graph, cluster, **kw) -> Placement:
    return Placement.from_indices(graph, cluster, [0] * graph.n, algorithm="x", estimate={"makespan_s": 1.0})


@pytest.fixture
def dummies():
    """Test algorithms, registered for the test and removed after it."""
    added = []

    def add(name, func, **params):
        registry.names()
        registry.register(name, paper="test", section="-", summary="test", params=params or None)(func)
        added.append(name)

    yield add
    for name in added:
        registry._ALGORITHMS.pop(name, None)


def test_the_cap_is_the_limit_plus_five_percent_and_half_a_second():
    assert clock.cap_at(100.0, 10.0) == pytest.approx(111.0)
    assert clock.cap_at(100.0, 0.0) is None  # 0 = no limit, no cap
    with clock.time_cap(None, 0.0, "x") as cap:
        clock.check_time()
    assert cap is None


@pytest.mark.parametrize("name", [e.name for e in registry.entries() if e.name != "given"])
def test_every_algorithm_is_stopped_past_its_cap_with_one_line_naming_the_limit(name, monkeypatch):
    """Every registered algorithm (quick parameters; ``given`` needs a
    file), through registry.place: as it starts, the clock jumps past its
    cap and the alarm is re-armed on that clock (it fires at once); none
    runs on, each fails with the one line naming its limit (none recorded
    a plan this early)."""
    late = [False]
    monkeypatch.setattr(clock, "now", lambda: time.perf_counter() + (86400.0 if late[0] else 0.0))
    entry = registry.get(name)
    real = entry.func

    def starts(*args, **kwargs):
        late[0] = True
        clock._arm(clock._CAP.get())
        return real(*args, **kwargs)

    monkeypatch.setattr(entry, "func", starts)
    with pytest.raises(TimeLimit) as err:
        registry.place(layered(20, seed=1), uniform(2), name, params={**entry.quick_params, "time_limit": 30.0})
    assert late == [True]
    assert str(err.value) == (f"{name}: stopped at its time limit of 30 s before it had a plan; raise --time-limit "
                              f"(-p time_limit=S; 0 = no limit)")


def test_a_limit_spent_before_the_call_runs_nothing(monkeypatch):
    """placer place counts the limit from the process's start: when loading
    spent it, the registry stops before the algorithm runs."""
    _no_alarm(monkeypatch)
    entry = registry.get("heft")
    ran = []
    monkeypatch.setattr(entry, "func", lambda *a, **k: ran.append(1))
    with pytest.raises(TimeLimit, match="heft: stopped at its time limit of 5 s"):
        registry.place(layered(20, seed=1), uniform(2), "heft", params={"time_limit": 5.0},
                       started=time.perf_counter() - 100.0)
    assert ran == []


def test_the_simulator_stops_at_the_cap_without_the_algorithm_looking(dummies, monkeypatch):
    """A cooperative stop in the shared hot loop: an algorithm that only
    simulates (never reads the clock) is stopped inside the simulator's
    event loop; the plan it recorded is the answer."""
    seen = []

    def simulating(graph, cluster, *, seed=0, costs=None) -> Placement:
        best = _single(graph, cluster)
        clock.keep_best(lambda: best)
        seen.append("recorded")
        _late(monkeypatch)  # from here on the cap has passed
        while True:
            makespan_of(graph, cluster, [v % cluster.k for v in range(graph.n)])

    dummies("test-simulating", simulating)
    _no_alarm(monkeypatch)
    g, c = layered(3000, seed=1), uniform(2)
    p = registry.place(g, c, "test-simulating", params={"time_limit": 5.0})
    assert seen == ["recorded"] and set(p.assignment.values()) == {"gpu0"} and p.algorithm == "test-simulating"
    assert "time_limit" in p.params  # the user gave it


def test_derive_stops_at_the_cap(monkeypatch):
    from celeritas_cli.model.graph import build

    g = build("g", [{"id": "c", "compute_s": 4, "memory_bytes": 0, "splittable": ["batch"]}], [],
              meta={"batch_size": 8})
    _no_alarm(monkeypatch)
    with clock.time_cap(time.perf_counter() + 60.0, 60.0, "x"):
        assert apply_step(g, split_step("c", "batch", 2, 0.0)).n == 2
        _late(monkeypatch)
        with pytest.raises(clock.TimeUp):
            apply_step(g, split_step("c", "batch", 2, 0.0))


def test_an_algorithm_that_never_looks_at_the_clock_is_stopped_by_the_alarm(dummies):
    """Non-cooperation: a pure Python loop, no simulator, no check; the
    registry's alarm stops it (real time, no assertion on how long)."""
    def spins(graph, cluster, *, seed=0, costs=None) -> Placement:
        n = 0
        while True:
            n += 1

    dummies("test-spins", spins)
    with pytest.raises(TimeLimit, match="test-spins: stopped at its time limit of 0.01 s"):
        registry.place(layered(10, seed=1), uniform(2), "test-spins", params={"time_limit": 0.01})


def test_an_enclosing_limit_passes_through_the_inner_call_and_its_except(dummies, monkeypatch):
    """auto's members run through registry.place inside auto's own call,
    and auto skips a member that fails (``except PlacerError``): the outer
    limit still stops the outer call, which answers with its own best."""
    def inner(graph, cluster, *, seed=0, costs=None) -> Placement:
        _late(monkeypatch)
        clock.check_time()
        return _single(graph, cluster)

    def outer(graph, cluster, *, seed=0, costs=None) -> Placement:
        clock.keep_best(lambda: _single(graph, cluster))
        try:
            registry.place(graph, cluster, "test-inner")
        except PlacerError:  # what auto does with a member that failed
            pytest.fail("the outer limit was taken for the member's failure")
        return Placement.from_indices(graph, cluster, [1] * graph.n, algorithm="x")

    dummies("test-inner", inner)
    dummies("test-outer", outer)
    _no_alarm(monkeypatch)
    p = registry.place(layered(10, seed=1), uniform(2), "test-outer", params={"time_limit": 5.0})
    assert set(p.assignment.values()) == {"gpu0"}  # the recorded best, not the member's answer


@pytest.mark.parametrize("name", ["pipeline", "auto", "hierarchical"])
def test_a_search_stopped_at_its_cap_answers_with_its_best_so_far(name, monkeypatch, capsys):
    """pipeline, auto and hierarchical record their best plan
    (clock.keep_best): stopped by the cap after their first judged plan,
    the registry answers with it, marked as cut by the clock, and says so."""
    from celeritas_cli.algorithms.pipelines import search as pipeline_search
    from celeritas_cli.algorithms.placers.hierarchical import training
    from celeritas_cli.optimize import search as auto_search

    if name == "hierarchical":
        pytest.importorskip("torch")
    late = [False]
    monkeypatch.setattr(clock, "now", lambda: time.perf_counter() + (86400.0 if late[0] else 0.0))
    _no_alarm(monkeypatch)
    cls, method = {"pipeline": (pipeline_search.PipelineSearch, "judge"), "auto": (auto_search.Search, "_judge"),
                   "hierarchical": (training.Trainer, "consider")}[name]
    real = getattr(cls, method)

    def judged_then_late(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        late[0] = late[0] or bool(out) or name == "hierarchical"  # the first plan judged: the cap has passed
        return out

    monkeypatch.setattr(cls, method, judged_then_late)
    g = layered(60, seed=1)
    g.meta["batch_size"] = 32
    params = {"time_limit": 30.0, **{"auto": {"quiet": True, "evaluations": 10**5},
                                     "pipeline": {"evaluations": 10**5},
                                     "hierarchical": {"iterations": 1000, "progress": False, "hidden": 8}}[name]}
    p = registry.place(g, uniform(4), name, params=params)
    assert late == [True] and p.algorithm == name
    if name == "hierarchical":
        assert p.estimate["repeatable"] is False and p.estimate["iterations"] < 1000
    else:
        assert p.estimate["clock_cut"] is True and p.estimate["makespan_by"] == "simulator"
        assert p.estimate["evaluations"] < 10**4  # stopped long before its count
    assert f"placer: {name}: stopped at its time limit of 30 s (+5 % + 0.5 s); the answer is the best plan" in \
        capsys.readouterr().err


def test_the_registry_cap_is_not_recorded_unless_given():
    p = registry.place(layered(20, seed=1), uniform(2), "heft")
    assert "time_limit" not in p.params and registry.get("heft").params["time_limit"].default == 600.0
    q = registry.place(layered(20, seed=1), uniform(2), "heft", params={"time_limit": 30})
    assert q.params["time_limit"] == 30.0 and q.assignment == p.assignment


# ------------------------------------------------------------------ the size guard (D3, D4)
def test_a_micro_batch_count_over_the_budget_is_refused_before_anything_is_built(monkeypatch):
    """The registry sizes -p microbatches before the algorithm runs: nothing
    is built (the builder is never called), the message is one line."""
    built = []
    monkeypatch.setattr(microbatch, "_Builder", lambda *a, **k: built.append(1))
    g = layered(60, seed=1)
    g.meta["batch_size"] = 1 << 40
    for name in ROWS:
        with pytest.raises(InvalidInput) as err:
            registry.place(g, uniform(4), name, params={"microbatches": 10**7})
        msg = str(err.value)
        assert msg.startswith(f"{name}: -p microbatches=10000000 would build a derived graph of ") and \
            "over the budget of 1,000,000 nodes" in msg and "\n" not in msg, msg
    assert built == []


def test_microbatch_graph_itself_is_sized_before_it_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(microbatch, "_Builder", lambda *a, **k: built.append(1))
    g = layered(60, seed=1)
    g.meta["batch_size"] = 1 << 20
    with pytest.raises(InvalidInput, match=r"micro-batching graph '.*' into 65536 would build a derived graph"):
        microbatch.microbatch_graph(g, 65536)
    assert built == []


@pytest.mark.parametrize("algo,batch,m,nodes", [("pipeline", 2**53 - 1, "10000000", "600,000,020"),
                                                ("gpipe", 65536, "65536", "3,932,180"),
                                                ("pipedream", 65536, "65536", "3,932,180"),
                                                ("alpa-stages", 65536, "65536", "3,932,180")])
def test_d3_d4_reproducers_refuse_in_one_line(algo, batch, m, nodes, tmp_path):
    """Round 3, D3 / D4 (shared/bad-inputs/round3/surfaces/mb_huge: layered_60 with a batch of 2^53-1 and of
    65,536): refused in one line, as ``placer simulate`` refuses the same recipe, instead of 101 s and a
    MemoryError."""
    doc = orjson.loads((SAMPLES / "layered_60.json").read_bytes())
    doc["meta"]["batch_size"] = batch
    path = tmp_path / "g.json"
    path.write_bytes(orjson.dumps(doc))
    r = CliRunner().invoke(main, ["place", str(path), "--algo", algo, "-p", f"microbatches={m}"])
    assert r.exit_code == 1 and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: {algo}: -p microbatches={m} would build a derived graph of {nodes} nodes ") and \
        last.endswith("(--max-derived-nodes); lower -p microbatches"), last


def test_a_timer_running_before_the_call_is_given_back():
    """Another user of SIGALRM (a test harness's timeout) keeps its timer."""
    import signal

    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1000.0)
        registry.place(layered(10, seed=1), uniform(2), "heft", params={"time_limit": 5.0})
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 900.0 < left <= 1000.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
