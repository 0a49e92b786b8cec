"""Given placement: re-evaluate an existing placement file (for example a
human expert's, HRL Table 1 "Human Experts") through the same simulator.

``given`` judges what it is given: the assignment, the per-device orders
when the file has them (an order that deadlocks against the graph's
dependencies is refused, naming the node, what it waits for and the
devices), and the recipe of a derived graph.  It never passes a number on:
the estimate is the simulator's on that graph, whatever the file's
``estimate`` says (issue 33, D7: a forged ``makespan_s`` of 1e-12 came back
labelled "simulator").
"""

from __future__ import annotations

from ...errors import InvalidInput
from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.io import load_placement
from ...model.placement import Placement, finite_or_none
from ...registry import Param, register
from ...sim.memory import peaks
from ...sim.simulator import check_colocation, lower_bound, run_schedule
from ...transform.derivation import rebuild


@register("given", paper="baseline", section="HRL Table 1 (human experts)",
          summary="Read an existing placement file (-p file=P.json) and re-evaluate it.",
          params={"file": Param(str, None, "placement file to re-evaluate")})
def given(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
          file: str | None = None) -> Placement:
    """Load placement *file*, check it against *graph* and *cluster*,
    simulate it, and return it (its order, if any, kept), so ``compare``
    and ``simulate`` judge it like any algorithm's output.  A placement of a
    derived graph (``derivation``: operation splits, data parallelism,
    micro-batches) is checked against the derived graph rebuilt from
    *graph* (:func:`~celeritas_cli.transform.derivation.rebuild`) and keeps
    its recipe.

    Returns
    -------
    Placement
        With an ``estimate`` of the simulator's on that graph (the file's
        own ``estimate`` is not read): ``makespan_s`` under *costs* and the
        file's orders (the simulator's rule where it has none), ``status``
        (``OOM`` when a device's peak is over its capacity: the time rule,
        or the static rule for a graph that declares no ``resident_bytes``,
        ``memory_rule``), ``max_memory_bytes``, ``lower_bound_s`` and
        ``makespan_over_lb``.

    Raises
    ------
    InvalidInput
        No file given; the file does not fit the graph or cluster, or
        splits a colocation group (ColocationError); its orders cannot be
        followed (one line: the file, the device whose
        order waits, the node and the node it waits for).

    Example
    -------
    >>> import json, tempfile
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("ab", [{"id": "a", "compute_s": 1, "memory_bytes": 0},
    ...                  {"id": "b", "compute_s": 2, "memory_bytes": 0}], [{"src": "a", "dst": "b", "bytes": 0}])
    >>> doc = {"schema": "placer.placement/v1", "graph": "ab", "cluster": "uniform2", "algorithm": "x",
    ...        "assignment": {"a": "gpu0", "b": "gpu0"}, "estimate": {"makespan_s": 1e-12}}
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     json.dump(doc, f)
    >>> p = given(g, uniform(2), file=f.name)
    >>> p.estimate["makespan_s"], p.estimate["makespan_by"]
    (3.0, 'simulator')
    """
    if not file:
        raise InvalidInput("algorithm 'given' needs the placement file: -p file=PLACEMENT.json")
    src = load_placement(file)
    target = graph
    if src.derivation is not None or src.split_graph is not None:
        target = rebuild(graph, src.derivation, src.split_graph, label=file, devices=cluster.k, cluster=cluster.name)
    device_of, order = src.resolve(target, cluster, label=file)
    check_colocation(target, cluster, device_of, file)
    judged = cost_model(graph, cluster, costs).for_graph(target)
    sched = run_schedule(target, cluster, device_of, order, costs=judged, label=file)  # a deadlock: InvalidInput
    loads = peaks(target, sched, cluster.k)
    rule = "time" if loads is not None else "static"
    if loads is None:
        loads = target.memory_by(device_of, cluster.k)
    oom = [cluster.ids[d] for d in cluster.over_capacity(loads)]
    lb = lower_bound(target, cluster, judged)
    estimate = {"makespan_s": sched.makespan, "makespan_by": "simulator", "status": "OOM" if oom else "FEASIBLE",
                "lower_bound_s": lb, "makespan_over_lb": finite_or_none(sched.makespan / lb) if lb > 0 else None,
                "max_memory_bytes": max(loads, default=0), "memory_rule": rule}
    if oom:
        estimate["oom_devices"] = oom
    p = Placement.from_indices(target, cluster, device_of, order=order, algorithm="given", seed=seed,
                               params={"file": file}, estimate=estimate)
    if target is not graph:
        p.derivation, p.derived, p.graph = src.derivation, target, graph.original_name
    return p
