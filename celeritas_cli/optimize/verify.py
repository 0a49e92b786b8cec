"""``auto -p verify=N``: measured in the loop.

``auto`` ranks placements by the simulator; when the simulator is wrong about
the order, its winner is not the fastest placement.  With ``verify=N`` the N
best distinct placements the search simulated (its answer first, then the
best portfolio candidates with other assignments, feasible ones only) are
executed with ``placer run`` (:func:`celeritas_cli.run.api.run_placement`)
on the machine the cluster describes, and the one with the fastest measured
step whose numerics match is returned; ``estimate.verify`` lists every
candidate's simulated and measured step.  This is what an engineer does by
hand when the simulated winner is not the real one (the request FlexFlow's
and Alpa's users make: measure the top few plans), and what ``placer
calibrate`` cannot do once and for all on a machine whose load changes.

The backend follows the cluster (:func:`backend_for`): a cluster made by
``placer profile --comm-bench --processes N`` is N processes over gloo; a
cluster whose devices this machine has as CUDA GPUs runs one process per
GPU (NCCL).  The model is the one the graph was profiled from
(``meta.source``, ``meta.batch_size``, ``meta.config``).  A measured choice
is not repeatable: the estimate says so.

Example
-------
>>> rows = [{"name": "a", "simulated_s": 1.0, "measured_s": 3.0, "match": True},
...         {"name": "b", "simulated_s": 1.2, "measured_s": 2.0, "match": True},
...         {"name": "c", "simulated_s": 1.3, "measured_s": 1.0, "match": False}]
>>> fastest(rows)
1

References
----------
Jia et al., "Beyond Data and Model Parallelism for Deep Neural Networks"
(FlexFlow), MLSys 2019, section 5 (the simulator's ranking checked against
real runs); Zheng et al., "Alpa", OSDI 2022, section 8 (profiling candidate
plans on the cluster).
"""

from __future__ import annotations

from typing import Callable

from ..errors import InvalidInput, PlacerError
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.placement import Placement

#: timed steps per candidate (after one checked warm-up step)
VERIFY_STEPS = 3


def backend_for(cluster: Cluster) -> str:
    """The ``placer run`` backend a cluster implies: ``gloo`` (one process per device; NCCL when every
    device is a CUDA GPU of this machine) for a ``--comm-bench --processes`` cluster or a machine with as
    many CUDA GPUs as the cluster has devices.

    Raises
    ------
    InvalidInput
        The cluster does not describe this machine.
    """
    meta = (cluster.doc or {}).get("meta") or {}
    if isinstance(meta.get("comm_bench"), dict):
        return "gloo"
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus >= cluster.k:
        return "gloo"
    raise InvalidInput(f"'auto' parameter verify: cluster '{cluster.name}' is not this machine ({gpus} CUDA GPU(s) "
                       f"for {cluster.k} devices); measure one with placer profile --comm-bench --processes "
                       f"{cluster.k}, or use verify=0")


def model_of(graph: Graph) -> tuple[str, int, dict]:
    """``(model spec, batch, config)`` the graph was profiled from.

    Raises
    ------
    InvalidInput
        The graph was not made by ``placer profile --model``.
    """
    meta = graph.meta or {}
    source = str(meta.get("source") or "")
    if not source.startswith("profile torch:") or not isinstance(meta.get("batch_size"), int):
        raise InvalidInput(f"'auto' parameter verify: graph '{graph.name}' was not made by placer profile --model "
                           f"(meta.source, meta.batch_size), so there is no model to run")
    return source.removeprefix("profile torch:"), meta["batch_size"], dict(meta.get("config") or {})


def runner_for(graph: Graph, cluster: Cluster, *, steps: int = VERIFY_STEPS,
               log: Callable[[str], None] | None = None) -> Callable[[Placement, str], dict]:
    """A function running a placement of *graph* with ``placer run`` and returning its
    ``placer.run/v1`` report (the model is captured once)."""
    backend = backend_for(cluster)
    spec, batch, config = model_of(graph)
    from ..run.api import prepare, run_placement
    from ..run.step import capture_real

    step = capture_real(spec, batch, config=config)

    def run(p: Placement, name: str) -> dict:
        if log:
            log(f"auto: verify: running {name} ({backend}, {steps} steps)")
        pre = prepare(spec, batch, p, cluster, label=name, config=config, graph=graph, step=step)
        return run_placement(spec, batch, p, cluster, label=name, backend=backend, steps=steps, prepared=pre,
                             timeout=600.0)

    return run


def fastest(rows: list[dict]) -> int | None:
    """Index of the row with the fastest measured step among those whose numerics match (ties: the
    better simulated step), ``None`` when none was measured."""
    ok = [i for i, r in enumerate(rows) if r.get("measured_s") is not None and r.get("match")]
    return min(ok, key=lambda i: (rows[i]["measured_s"], rows[i]["simulated_s"], i)) if ok else None


def verify(candidates: list[tuple[str, Placement, float]], run: Callable[[Placement, str], dict],
           log: Callable[[str], None] | None = None) -> tuple[int | None, list[dict]]:
    """Run every ``(name, placement, simulated step)`` with *run*; returns the index of the fastest
    measured (:func:`fastest`) and one row per candidate (``name``, ``simulated_s``, ``measured_s``,
    ``match``, or ``error`` when it could not run)."""
    rows = []
    for name, p, sim in candidates:
        try:
            rep = run(p, name)
        except PlacerError as exc:
            rows.append({"name": name, "simulated_s": sim, "measured_s": None, "match": False, "error": str(exc)})
            if log:
                log(f"auto: verify: {name} not measured: {exc}")
            continue
        rows.append({"name": name, "simulated_s": sim, "measured_s": rep["measured_step_s"],
                     "match": bool(rep["match"]), "load_average": rep.get("load_average")})
        if log:
            log(f"auto: verify: {name}: simulated {sim:.6g} s, measured {rep['measured_step_s']:.6g} s"
                + ("" if rep["match"] else " (numerics differ: not chosen)"))
    return fastest(rows), rows


def candidate_placement(cand, cluster: Cluster, graph: Graph) -> Placement:
    """A portfolio :class:`~celeritas_cli.optimize.portfolio.Candidate` as a placement of *graph*
    (a derived candidate carries its graph's recipe, as ``auto``'s own answer does)."""
    if cand.placement.replicas is not None:  # a symmetric plan: its own file form
        return cand.placement
    p = Placement.from_indices(cand.graph, cluster, cand.device_of, algorithm="auto", order=cand.order)
    if cand.derived:
        p.derivation, p.derived = cand.placement.derivation, cand.graph
        p.graph = graph.original_name
    return p


def choose_measured(answer: Placement, answer_key: tuple, search, graph: Graph, cluster: Cluster, n: int, *,
                    run: Callable[[Placement, str], dict] | None = None,
                    log: Callable[[str], None] | None = None) -> Placement:
    """``auto``'s *answer* (whose ``(id(graph), device_of)`` is *answer_key*) or, among it and the next
    ``n - 1`` best distinct feasible candidates of *search*, the fastest measured (module docstring);
    the returned placement's estimate records every candidate's simulated and measured step."""
    cands = [("auto", answer, float(answer.estimate["makespan_s"]))]
    seen = {answer_key}
    for cand in search.starts():
        key = (id(cand.graph), tuple(cand.device_of))
        if len(cands) >= n or key in seen or not cand.score.feasible:
            continue
        seen.add(key)
        cands.append((cand.spec.name, candidate_placement(cand, cluster, graph), cand.score.makespan))
    idx, rows = verify(cands, run or runner_for(graph, cluster, log=log), log)
    name, chosen, sim = cands[idx] if idx is not None else cands[0]
    est = dict(answer.estimate.to_dict())
    est.update(makespan_s=sim, verified_choice=name, measured_s=rows[idx]["measured_s"] if idx is not None else None,
               verify={"candidates": rows, "steps": VERIFY_STEPS, "chosen": name if idx is not None else None},
               repeatable=False,
               caveat=(est.get("caveat") + "; " if est.get("caveat") else "")
               + ("chosen by measured runs (not repeatable)" if idx is not None else
                  "verify measured no candidate: the simulated best is returned"))
    if name != "auto":
        est.update(lower_bound_s=None, makespan_over_lb=None)
    out = Placement(graph=chosen.graph, cluster=cluster.name, algorithm="auto", assignment=chosen.assignment,
                    order=chosen.order, params=answer.params, seed=answer.seed, estimate=est,
                    split_graph=chosen.split_graph, derivation=chosen.derivation, cluster_digest=answer.cluster_digest,
                    cluster_file=answer.cluster_file, derived=chosen.derived, replicas=chosen.replicas)
    if log and idx is not None:
        log(f"auto: verify: chose {name}: measured {rows[idx]['measured_s']:.6g} s (simulated {sim:.6g} s)")
    return out
