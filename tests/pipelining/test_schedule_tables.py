"""The Schedule objects (pipelining/schedules.py): golden per-rank tables
written by hand from Megatron-LM's and torch.distributed.pipelining's
documented orders, in-flight counts, bubbles, shape rules, the torch
classes, the recompute timing of issue 33 J1, and that no schedule name is
spelled outside the Schedule definitions."""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import pytest

import celeritas_cli
from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.cluster import uniform
from celeritas_cli.pipelining.builder import staged_plan
from celeritas_cli.pipelining.cuts import forward_order, stage_forward_nodes, stages_from_cuts
from celeritas_cli.pipelining.schedules import GPIPE, INTERLEAVED, ONE_F_ONE_B, SCHEDULES, get_schedule
from celeritas_cli.sim.simulator import simulate

from .pipeline_graphs import layer_chain

PACKAGE = Path(celeritas_cli.__file__).parent


# ------------------------------------------------------------------ golden tables
def test_gpipe_table_is_all_forwards_then_all_backwards():
    # GPipe 2.2 / torch ScheduleGPipe: every rank F0..F{m-1}, then B0..B{m-1}
    assert GPIPE.table(2, 4) == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2


def test_1f1b_table_p4_m8():
    # PipeDream-Flush (SC'21 Figure 4 bottom; torch Schedule1F1B): p - r - 1 warm-up forwards, then one
    # forward and one backward in turn, then the cool-down backwards
    assert ONE_F_ONE_B.table(4, 8) == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    ]


def test_1f1b_table_p2_m4():
    assert ONE_F_ONE_B.table(2, 4) == ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]


def test_interleaved_table_p2_m4_two_chunks():
    # Megatron-LM forward_backward_pipelining_with_interleaving, p = 2, v = 2, m = 4: rank r warms up with
    # (p - r - 1) 2 + (v - 1) p forwards (4 on rank 0, 2 on rank 1); forward k runs chunk (k mod 4) div 2 on
    # micro-batch (k div 4) 2 + k mod 2, backward k the chunks in reverse.  Virtual stage = chunk * p + rank.
    assert INTERLEAVED.table(2, 4, 2) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_interleaved_table_with_as_many_micro_batches_as_ranks_runs_all_forwards_first():
    # m = p: Megatron warms up with every forward
    assert INTERLEAVED.table(2, 2, 2) == ["0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1"]


def test_in_flight_and_bubble_by_hand():
    assert [ONE_F_ONE_B.in_flight(4, 8, r) for r in range(4)] == [4, 3, 2, 1]  # min(p - r, m)
    assert [GPIPE.in_flight(4, 8, r) for r in range(4)] == [8] * 4
    # the interleaved table above: rank 0 holds 5 chunk-micro-batches before its first backward, rank 1 3
    assert [INTERLEAVED.in_flight(2, 4, r, 2) for r in range(2)] == [5, 3]
    assert ONE_F_ONE_B.bubble(4, 8) == GPIPE.bubble(4, 8) == 3 / 8  # SC'21 Eq. 1: (p - 1) / m
    assert INTERLEAVED.bubble(2, 4, 2) == 1 / 8  # (p - 1) / (v m)


def test_shape_rules_name_the_rule():
    with pytest.raises(InvalidInput, match=r"micro-batches \(6\) to be a multiple of the pipeline ranks \(4\).*m % p"):
        INTERLEAVED.check(4, 6, 2)
    with pytest.raises(InvalidInput, match="at least 2 pipeline ranks"):
        INTERLEAVED.check(1, 4, 2)
    with pytest.raises(InvalidInput, match="at least 2 model chunks"):
        INTERLEAVED.check(2, 4, 1)
    with pytest.raises(InvalidInput, match="one model chunk per rank"):
        ONE_F_ONE_B.check(2, 4, 2)
    assert GPIPE.refusal(4, 6) is None and ONE_F_ONE_B.refusal(3, 1) is None
    with pytest.raises(InvalidInput, match="unknown schedule 'zb-h1'"):
        get_schedule("zb-h1")


def test_every_rank_runs_every_forward_and_backward_once():
    for sched, v in ((GPIPE, 1), (ONE_F_ONE_B, 1), (INTERLEAVED, 2), (INTERLEAVED, 4)):
        for p, m in ((2, 4), (4, 8), (4, 4)):
            for r in range(p):
                steps = sched.steps(p, m, r, v)
                assert sorted(steps) == sorted((k, c, i) for k in "FB" for c in range(v) for i in range(m))
                done = set()
                for a in steps:  # a backward follows its own forward on the rank
                    assert a.kind == "F" or ("F", a.chunk, a.microbatch) in done
                    done.add(tuple(a))


def test_torch_classes_exist_in_torch_distributed_pipelining():
    assert {s.name: s.torch_class for s in SCHEDULES.values()} == {
        GPIPE.name: "ScheduleGPipe", ONE_F_ONE_B.name: "Schedule1F1B", INTERLEAVED.name: "ScheduleInterleaved1F1B"}
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    for s in SCHEDULES.values():
        assert hasattr(pipelining, s.torch_class)


# ------------------------------------------------------------------ issue 33 J1
@pytest.mark.parametrize("schedule", [ONE_F_ONE_B, GPIPE])
def test_recompute_runs_after_the_gradient_arrives(schedule):
    """The reproducer's case: a uniform chain of p = 4 one-layer stages, m = 4, tf = 1 and tb = 2 per
    stage and micro-batch, every stage recomputing its forward.  A stage recomputes micro-batch i once
    the gradient of i has arrived, so every backward step takes tf + tb and both schedules take the closed
    form (m + p - 1)(2 tf + tb) = 7 * 4 = 28 s (a clone that runs before the gradient arrives gives 25 s)."""
    g = layer_chain(4, tf=4.0, tb=8.0, batch=4)
    fwd = forward_order(g, g.topo_order())
    stage_of = stages_from_cuts(g, fwd, [0, 2, 3, 4])
    c = uniform(4, bandwidth=1.0e18, latency=0.0)
    rc = stage_forward_nodes(g, stage_of, [0, 1, 2, 3])
    p = staged_plan(g, c, stage_of, [0, 1, 2, 3], 4, schedule, recompute=rc, overhead_s=0.0)
    assert p.estimate["recomputed"] == 5 * 4  # x and f0 .. f3 in each micro-batch
    assert simulate(g, c, p)["makespan_s"] == pytest.approx(28.0, rel=1e-12)
    plain = staged_plan(g, c, stage_of, [0, 1, 2, 3], 4, schedule, overhead_s=0.0)
    assert simulate(g, c, plain)["makespan_s"] == pytest.approx(7 * 3.0, rel=1e-12)  # (m + p - 1)(tf + tb)


# ------------------------------------------------------------------ names spelled once
def _string_literals(path: Path):
    """``(line, value)`` of every plain string literal of a Python file (docstrings included; f-strings'
    text as written)."""
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING:
            text = tok.string
            prefix = text[:len(text) - len(text.lstrip("rbuRBUfF"))]
            if "f" in prefix.lower():
                continue
            try:
                value = eval(text)  # a literal, nothing else
            except (SyntaxError, ValueError):
                continue
            yield tok.start[0], tok.line.strip(), value


#: ``gpipe`` is also an algorithm's name (the registry's), spelled where the algorithm is named
ALGORITHM_NAMES = {("algorithms/pipelines/gpipe.py", 'ALGORITHM = "gpipe"'),
                   ("compare/inputs.py", 'PARALLELISM_PLANNERS = ("data-parallel", "pipeline", "gpipe", "pipedream", '
                                         '"alpa-stages", "fsdp", "megatron", "3d")')}


def test_no_schedule_name_literal_outside_the_schedule_definitions():
    names = set(SCHEDULES)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "pipelining/schedules.py":
            continue
        for line, text, value in _string_literals(path):
            if value in names and (rel, text) not in ALGORITHM_NAMES:
                found.append(f"{rel}:{line}: {text}")
    assert found == []


def test_run_schema_lists_the_schedules():
    doc = json.loads((PACKAGE / "schemas" / "run.schema.json").read_text())

    def enums(x):
        if isinstance(x, dict):
            if "enum" in x and set(SCHEDULES) <= set(x["enum"]):
                yield x["enum"]
            for y in x.values():
                yield from enums(y)
        elif isinstance(x, list):
            for y in x:
                yield from enums(y)

    assert [set(e) - {None} for e in enums(doc)] == [set(SCHEDULES)]


def test_the_recipe_records_the_schedule_that_export_reads():
    from celeritas_cli.model.placement import Placement
    from celeritas_cli.run.pipe_export import recorded_schedule

    g = layer_chain(4, batch=4)
    fwd = forward_order(g, g.topo_order())
    c = uniform(2)
    p = staged_plan(g, c, stages_from_cuts(g, fwd, [0, 2, 3, 4]), [0, 1, 0, 1], 4, INTERLEAVED.name)
    steps = Placement.from_dict(p.to_dict(timings=False)).derivation["steps"]
    assert steps[0]["schedule"] == INTERLEAVED.name and recorded_schedule(steps) is INTERLEAVED
    old = [{k: x for k, x in steps[0].items() if k != "schedule"}]  # a placement made before it was recorded
    assert recorded_schedule(old) is None
    assert simulate(g, c, Placement.from_dict({**p.to_dict(timings=False), "derivation": {"steps": old}}))["status"]


def test_pipeline_parameters_are_declared_once():
    from celeritas_cli import registry
    from celeritas_cli.pipelining.params import N_MICROBATCHES, RECOMPUTE, SCHEDULE

    for algo in ("pipeline", "gpipe", "pipedream", "alpa-stages"):
        assert registry.get(algo).params["microbatches"] is N_MICROBATCHES
    assert registry.get("pipeline").params["schedule"] is SCHEDULE
    assert registry.get("pipeline").params["recompute"] is RECOMPUTE
    assert set(SCHEDULE.choices) == {"auto", *SCHEDULES}
    # no second declaration of the micro-batch count in the package
    found = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).as_posix() != "pipelining/params.py"
             for line, text, value in _string_literals(path) if "Param(" in text and "micro-batch" in str(value)]
    assert found == []
