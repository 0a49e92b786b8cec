"""The placements of ``placer run --node-times`` reports simulated again,
under other (calibrated) graph and cluster files: how far the simulator's
step is from the measured one before and after ``placer calibrate``, and
whether it ranks the placements in the measured order (Kendall's tau).

A report keeps the placement that ran (``node_times.placement``: its
assignment, order and derivation, :func:`~celeritas_cli.run.timing.placement_doc`),
so the check needs no other file.

Example
-------
>>> rows = [{"measured_s": 1.0, "before_s": 0.5, "after_s": 0.9},
...         {"measured_s": 2.0, "before_s": 0.4, "after_s": 2.2}]
>>> s = summary(rows)
>>> s["tau_before"], s["tau_after"], s["within_after"]
(-1.0, 1.0, 2)
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.graph import Graph
from ..model.placement import Placement

#: the target band of measured / simulated (issue 25)
BAND = (0.75, 1.33)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two score lists (1: same order, -1: reversed; ties count 0).

    >>> kendall_tau([1, 2, 3], [10, 30, 20])
    0.3333333333333333
    """
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return 1.0
    s = sum((x > 0) - (x < 0) for x in ((a[i] - a[j]) * (b[i] - b[j]) for i, j in pairs))
    return s / len(pairs)


def resimulate(reports: list[dict], labels: list[str], graph: Graph, cluster: Cluster, *,
               congestion: str | None = None) -> list[dict]:
    """Per report: ``{"report", "placement", "measured_s", "before_s" (the report's simulated step),
    "after_s" (its placement simulated on *graph* and *cluster*)}``.  The placement is the one the
    report keeps: ``node_times.placement``, or ``ran_placement`` for a plan without per-node times
    (micro-batched, pipelined, fsdp).

    Raises
    ------
    InvalidInput
        A report without the placement it ran (made before ``--node-times`` kept it).
    """
    from ..sim.simulator import simulate

    rows = []
    for rep, lab in zip(reports, labels):
        doc = (rep.get("node_times") or {}).get("placement") or rep.get("ran_placement")
        if not isinstance(doc, dict):
            raise InvalidInput(f"{lab}: keeps no placement (node_times.placement); run placer run --node-times again")
        p = Placement.from_dict(doc, f"{lab}: node_times.placement")
        rule = congestion or (rep.get("simulation") or {}).get("congestion") or "channel"
        sim = simulate(graph, cluster, p, congestion=rule, label=lab)
        rows.append({"report": lab, "placement": rep.get("placement"), "model": rep.get("model"),
                     "batch": rep.get("batch_size"), "measured_s": rep["measured_step_s"],
                     "before_s": rep["simulated_step_s"], "after_s": sim["makespan_s"]})
    return rows


def summary(rows: list[dict]) -> dict:
    """Kendall's tau of measured vs simulated before and after, and how many placements fall in
    :data:`BAND` (measured / simulated) before and after."""
    meas = [r["measured_s"] for r in rows]

    def within(key: str) -> int:
        return sum(1 for r in rows if r[key] > 0 and BAND[0] <= r["measured_s"] / r[key] <= BAND[1])

    return {"placements": len(rows), "tau_before": kendall_tau(meas, [r["before_s"] for r in rows]),
            "tau_after": kendall_tau(meas, [r["after_s"] for r in rows]), "within_before": within("before_s"),
            "within_after": within("after_s"), "band": list(BAND)}
