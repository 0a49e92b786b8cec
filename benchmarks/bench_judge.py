#!/usr/bin/env python
"""What the judge's ``time`` memory rule costs: simulator work on the
36k-node synthetic graph (``placer profile --synthetic layered --nodes 36000
--seed 1``) placed by ``m-topo`` on 4xV100-pcie, *counted*, not timed (the
development machine is shared; counts are deterministic).

Two counts per rule, for ``simulate(..., memory=RULE)`` (before the rule
existed: plain ``simulate``):

* ``calls``: Python function calls (cProfile, primitive calls);
* ``opcodes`` (``--opcodes``): bytecode instructions executed
  (``sys.settrace`` with ``f_trace_opcodes``; about ten times slower).
  Sorting runs in C and is not counted by either.

With ``--opcodes`` and the time rule present, also the parts: the event
loop (``run_schedule``), the time rule's peaks alone
(:func:`~celeritas_cli.sim.memory.peaks`, what ``auto``'s evaluator adds
when memory may bind) and the whole memory profile of the report
(:func:`~celeritas_cli.sim.memory.judge_memory`).

Usage::

    python benchmarks/bench_judge.py [--nodes 36000] [--opcodes]
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.model.generate import layered  # noqa: E402
from celeritas_cli.model.io import load_cluster  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402


def _calls(fn) -> int:
    prof = cProfile.Profile()
    prof.runcall(fn)
    return pstats.Stats(prof).prim_calls


def _opcodes(fn) -> int:
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=36000)
    ap.add_argument("--opcodes", action="store_true", help="also count bytecode instructions (slow)")
    args = ap.parse_args()
    graph = layered(args.nodes, seed=1)
    cluster = load_cluster("4xV100-pcie")
    placement = registry.place(graph, cluster, "m-topo")
    rules = ["static", "time"] if "memory" in inspect.signature(simulate).parameters else [None]
    print(f"graph: {graph.n} nodes, {graph.m} edges; placement m-topo on {cluster.name}")
    for rule in rules:
        def run(rule=rule):
            return simulate(graph, cluster, placement) if rule is None else simulate(graph, cluster, placement,
                                                                                     memory=rule)
        rep = run()
        line = f"rule {rule or '(none: before the time rule)'}: status {rep['status']}, calls {_calls(run)}"
        if args.opcodes:
            line += f", opcodes {_opcodes(run)}"
        print(line, flush=True)
    if args.opcodes and rules != [None]:
        from celeritas_cli.sim.memory import judge_memory, peaks
        from celeritas_cli.sim.simulator import run_schedule

        dev, order = placement.resolve(graph, cluster, "placement")
        sched = run_schedule(graph, cluster, dev, order)
        for name, fn in (("run_schedule", lambda: run_schedule(graph, cluster, dev, order)),
                         ("peaks", lambda: peaks(graph, sched, cluster.k)),
                         ("judge_memory", lambda: judge_memory(graph, sched, cluster.k))):
            print(f"{name}: opcodes {_opcodes(fn)}", flush=True)


if __name__ == "__main__":
    main()
