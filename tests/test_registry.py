"""The registry's shared parameters, the deadline it passes, and the flag
helper of ``place`` / ``compare`` (issue 26, item 2; issue 24, N01).

The protocol check of every registered function
(:func:`registry.signature_problems`) runs in
``tests/algorithms/test_all_algorithms.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest
from click.testing import CliRunner

from celeritas_cli import registry
from celeritas_cli.cli import main
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from celeritas_cli.model.generate import layered
from celeritas_cli.model.limits import TIME_MAX
from celeritas_cli.sim import links, simulator

from .conftest import SAMPLES

G60 = str(SAMPLES / "layered_60.json")
TIMED = ["3d", "auto", "hierarchical", "milp", "pipeline"]


def _entries():
    return [e for e in registry.entries() if not e.name.startswith("test-")] + \
        [registry.get_coarsener(n) for n in registry.coarsener_names()]


def test_the_congestion_rules_have_one_definition():
    assert links.CONGESTION_RULES is CONGESTION_RULES and simulator.CONGESTION_RULES is CONGESTION_RULES
    assert links.DEFAULT_CONGESTION == DEFAULT_CONGESTION == CONGESTION_RULES[0]
    takes = [e for e in _entries() if "congestion" in e.params]
    assert len(takes) >= 9
    for e in takes:
        assert dataclasses.replace(e.params["congestion"], help="") == \
            dataclasses.replace(registry.congestion_param(), help=""), e.name


def test_every_time_limit_follows_one_rule():
    """0 = no limit, up to 1e12 s, for every algorithm (issue 33, item 2);
    those with a search of their own (hierarchical, milp, auto, pipeline)
    take the deadline, the others have the registry's cap."""
    timed = sorted(e.name for e in _entries() if e.takes_deadline)
    assert timed == TIMED
    for e in _entries():
        if e.kind != "placement":
            continue
        assert e.takes_deadline == e.takes_time_limit, e.name
        if not e.takes_time_limit:
            assert e.params["time_limit"] is registry.TIME_LIMIT_CAP, e.name
        for ok in ("0", "5", "1e12"):
            assert e.coerce({"time_limit": ok})["time_limit"] == float(ok)
        for bad in ("-1", "1e13", "nan", "inf"):
            with pytest.raises(InvalidInput, match="time_limit"):
                e.coerce({"time_limit": bad})
    assert registry.time_limit_param(1.0, "x").max == TIME_MAX


def test_deadline_is_counted_from_the_start_given():
    assert registry.deadline(0.0) is None and registry.deadline(0.0, started=5.0) is None
    assert registry.deadline(2.5, started=10.0) == 12.5
    before = time.perf_counter()
    assert before + 3.0 <= registry.deadline(3.0) <= time.perf_counter() + 3.0


@pytest.mark.parametrize("name", TIMED)
def test_a_deadline_already_past_stops_every_timed_algorithm(name, monkeypatch):
    """placer place counts --time-limit from the command's start: with a
    start 1,000 s ago the limit of 30 s is over before the algorithm runs,
    and each of them says its clock cut the run (none reads a context
    variable or its own start).  The registry's cap, which would stop them
    at once (tests/model/test_clock.py), is lifted to see their own."""
    if name == "hierarchical" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed")
    monkeypatch.setattr(registry, "cap_at", lambda started, limit: None)
    g, c = layered(30, seed=2), uniform(2)
    params = {"time_limit": 30.0, **{"auto": {"quiet": True, "evaluations": 10**6},
                                     "hierarchical": {"iterations": 50, "samples_per_iteration": 2, "hidden": 8,
                                                      "progress": False},
                                     "milp": {}, "pipeline": {"evaluations": 10**4}, "3d": {"evaluations": 10**4}}[name]}
    late = registry.place(g, c, name, params=params, started=time.perf_counter() - 1000.0)
    assert "deadline" not in late.params  # a clock reading never lands in the file
    est = late.estimate
    if name in ("auto", "pipeline", "3d"):  # the first plan is judged whatever the clock says: an answer
        assert est["clock_cut"] is True and est["evaluations"] < 100
    elif name == "hierarchical":
        assert est["iterations"] == 0 and est["repeatable"] is False
    else:
        assert est["status"] == "UNKNOWN" and est["repeatable"] is False


def test_with_flags_explicit_parameters_win():
    dpos = registry.get("dpos")
    assert registry.with_flags(dpos, {}, congestion="port", time_limit=None) == ({"congestion": "port"}, [])
    out, left = registry.with_flags(dpos, {"congestion": "none"}, congestion="port", time_limit=3.0)
    assert out == {"congestion": "none", "time_limit": 3.0}  # every algorithm has a time limit
    assert left == ["--congestion ignored: -p congestion=none wins"]
    assert registry.with_flags(registry.get("milp"), {}, time_limit=7.0)[0] == {"time_limit": 7.0}


def test_n01_every_integer_parameter_has_a_max_and_2_to_64_is_refused():
    """Issue 24, N01: an integer >= 2^64 (or any absurd count) is refused
    by the parameter check, before any search, naming the parameter."""
    ints = [(e, k) for e in _entries() for k, p in e.params.items() if p.type is int]
    assert len(ints) >= 10
    for e, key in ints:
        assert e.params[key].max is not None and e.params[key].max < 2**63, (e.name, key)
        with pytest.raises(InvalidInput, match=f"parameter {key}: must be <= "):
            e.coerce({key: str(2**64)})


def test_n01_reproducer_one_line_before_the_search():
    started = time.perf_counter()
    r = CliRunner().invoke(main, ["place", G60, "-p", "evaluations=99999999999999999999"])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == ("Error: 'auto' parameter evaluations: must be <= 1000000000, "
                                                 "got '99999999999999999999'")
    assert "Traceback" not in r.stderr and time.perf_counter() - started < 5.0  # no search ran (10 s by default)
    for algo, key in (("m-sct", "lp_max_nodes"), ("os-dpos", "max_ops"), ("fd-dps", "max_splits"),
                      ("hierarchical", "iterations")):
        r = CliRunner().invoke(main, ["place", G60, "--algo", algo, "-p", f"{key}={2**64}"])
        assert r.exit_code == 1 and f"parameter {key}: must be <=" in r.stderr, (algo, r.stderr)
