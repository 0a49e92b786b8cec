"""``placer profile``: graph files from real PyTorch models, Celeritas'
Standard Evaluation, and the communication fit.

Importing this package never imports torch.  Torch-free modules:
:mod:`.devices` (device table, roofline), :mod:`.flops` (FLOP formulas),
:mod:`.regression` (per-node linear regression, the measurements format,
Table 5 deviations), :mod:`.commfit` (t = k·d + b).  Modules needing torch,
imported only when used: :mod:`.zoo`, :mod:`.capture`, :mod:`.measure`.

References
----------
Celeritas 4.2.1 (Rough Estimation, comm fit), 6.1 (implementation),
6.2.1 (models and batch sizes), 6.5 / Table 5 (estimation accuracy);
FastT section 4 (cost models).
"""

from __future__ import annotations

from typing import Callable

from ..errors import InvalidInput
from ..log import stdout_to_stderr
from ..model.generate import layered_doc
from .regression import (
    check_measurements,
    deviation,
    extrapolate,
    leave_one_out,
    measurements_from_graphs,
)

__all__ = ["synthetic", "capture_model", "standard_evaluation", "from_measurements"]


def _check_extrapolated(doc: dict, label: str) -> None:
    """A graph predicted at a large batch may leave the accepted ranges
    (2^53 bytes, 1e12 s): say so, naming the node, instead of writing it."""
    from ..model.graph import Graph

    Graph.from_dict(doc, label)


def synthetic(kind: str, nodes: int, seed: int = 0) -> dict:
    """The synthetic graph document ``kind`` (only ``layered``: :func:`celeritas_cli.model.generate.layered_doc`).

    Example
    -------
    >>> len(synthetic("layered", 40, seed=1)["nodes"])
    40
    """
    if kind != "layered":
        raise InvalidInput(f"--synthetic {kind!r}: unknown generator; available: layered")
    if nodes < 1:
        raise InvalidInput(f"--nodes must be >= 1, got {nodes}")
    return layered_doc(nodes, seed)


def capture_model(spec: str, batch: int, *, phase: str = "training", config: dict | None = None,
                  measure: bool = False, threads: int | None = None,
                  progress: Callable[[str], None] | None = None, precision: str | None = None) -> dict:
    """Capture model *spec* (zoo name, ``module:attr`` or ``file.py:attr``:
    :func:`.models.resolve_model`) at *batch* in *precision* (``fp32``,
    ``bf16``, ``fp16``; default: the zoo entry's, else ``fp32``); optionally
    time every node on the local device (:mod:`.measure`) with *threads*
    torch threads.  Whatever the model prints goes to stderr, never into the
    graph document on stdout."""
    from .capture import profile_model

    if not measure:
        with stdout_to_stderr():
            return profile_model(spec, batch, phase=phase, config=config, precision=precision)
    from .measure import measure_doc

    with stdout_to_stderr():
        doc, tr = profile_model(spec, batch, phase=phase, config=config, keep_trace=True, precision=precision)
        summary = measure_doc(doc, tr, threads=threads, progress=progress)
    if progress:
        progress(f"measured {summary['measured']} nodes on {summary['device']} with {summary['threads']} "
                 f"thread(s) (min of {summary['repeats']} after "
                 f"{summary['warmup']} warm-up runs); noise (median-min)/min: median "
                 f"{100 * summary['noise_median']:.1f}%, p90 {100 * summary['noise_p90']:.1f}%, "
                 f"{summary['noisy']} nodes above 20%; {summary['failed']} could not run and keep roofline times")
    return doc


def standard_evaluation(spec: str, batch_sizes: list[int], target: int, *, phase: str = "training",
                        config: dict | None = None, measure: bool = False, threads: int | None = None,
                        progress: Callable[[str], None] | None = None,
                        precision: str | None = None) -> tuple[dict, dict | None, str]:
    """Celeritas 4.2.1 step 1 on a PyTorch model: capture at small batches,
    fit per-node lines, predict the graph at *target*.

    Returns
    -------
    ``(graph_doc, deviation_table or None, how the deviation was obtained)``.
    Every node carries its ``batch_line``; when *target* is one of the
    *batch_sizes* its times are the ones captured (measured) there.
    Without ``measure`` the accurate graph is captured directly at *target*
    (fake tensors make that free), so the table is the true Table 5
    deviation; with ``measure`` it is leave-one-out on the largest small batch.

    Raises
    ------
    InvalidInput
        A batch size below 2 (batch 1 changes the traced graph), fewer than two sizes.
    """
    sizes = sorted(set(batch_sizes))
    if len(sizes) < 2:
        raise InvalidInput("--batch-sizes needs at least two distinct sizes, e.g. 2,4,8")
    if sizes[0] < 2:
        raise InvalidInput("--batch-sizes must all be >= 2 (at batch 1 some ops squeeze the batch dimension "
                           "and the graph changes)")
    docs = []
    for b in sizes:
        if progress:
            progress(f"capturing {spec} at batch {b}")
        docs.append(capture_model(spec, b, phase=phase, config=config, measure=measure, threads=threads,
                                  progress=progress, precision=precision))
    base = docs[0]["name"].rsplit("_b", 1)[0]
    meas = measurements_from_graphs(docs, sizes, name=base)
    est = extrapolate(meas, target)
    if target in sizes:       # a measured batch keeps its measured values; the lines only scale them
        at = docs[sizes.index(target)]
        for nd, got in zip(est["nodes"], at["nodes"]):
            for key in ("compute_s", "compute_by_type"):
                if key in got:
                    nd[key] = got[key]
        est["name"] = at["name"]
        if "measured" in (at.get("meta") or {}):
            est["meta"]["measured"] = at["meta"]["measured"]
    _check_extrapolated(est, f"{spec} extrapolated to batch {target}")
    est["meta"]["source"] = docs[0]["meta"].get("source")
    if not measure:
        if progress:
            progress(f"capturing {spec} at batch {target} to check the fit")
        actual = capture_model(spec, target, phase=phase, config=config, precision=precision)
        return est, deviation(est, actual), f"vs. a direct capture at batch {target}"
    loo = leave_one_out(meas)
    if loo is None:
        return est, None, "needs three batch sizes for a leave-one-out check"
    e, a, big = loo
    return est, deviation(e, a), f"leave-one-out: fit on the smaller sizes, predict batch {big}"


def from_measurements(doc: dict, target: int, *, label: str = "measurements") -> tuple[dict, dict | None, str]:
    """The Standard Evaluation from a ``placer.measurements/v1`` document (no torch).

    Example
    -------
    >>> m = {"schema": "placer.measurements/v1", "name": "m", "batch_sizes": [2, 4],
    ...      "nodes": [{"id": "a", "memory_bytes": [10, 18], "compute_s": [1.0, 2.0]}], "edges": []}
    >>> g, table, how = from_measurements(m, 8)
    >>> g["nodes"][0]["memory_bytes"], g["nodes"][0]["compute_s"], table
    (34, 4.0, None)
    """
    check_measurements(doc, label)
    if target < 1:
        raise InvalidInput(f"--target-batch must be >= 1, got {target}")
    est = extrapolate(doc, target)
    _check_extrapolated(est, f"{label} extrapolated to batch {target}")
    loo = leave_one_out(doc)
    if loo is None:
        return est, None, "needs three batch sizes for a leave-one-out check"
    e, a, big = loo
    return est, deviation(e, a), f"leave-one-out: fit on the smaller sizes, predict batch {big}"
