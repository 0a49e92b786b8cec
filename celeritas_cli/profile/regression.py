"""Celeritas' Standard Evaluation, step 1: per-node linear regression against
batch size (no torch needed).

Celeritas 4.2.1 ("Rough Estimation"): run the model at batch sizes small
enough for one GPU, then "establish a linear regression model for each node"
of its memory (and, roughly, its time) against the batch size, and predict
the large-batch graph.  Section 6.5.1 / Table 5 report the average relative
deviation between estimated and accurate per-node values; :func:`deviation`
computes the same numbers (plus the CDF points of Figure 5).

The measurements file — ``placer.measurements/v1``
--------------------------------------------------
One JSON object holding the same graph measured at several batch sizes
(JSON Schema: ``schemas/measurements.schema.json``; an example:
``examples/measurements.json``)::

    {"schema": "placer.measurements/v1",
     "name": "mymodel",                       # optional
     "meta": {"phase": "training"},           # optional, copied to the graph
     "batch_sizes": [2, 4, 8],                # >= 2 distinct sizes, each >= 1
     "nodes": [{"id": "conv1", "op": "aten.convolution",
                "memory_bytes": [1000, 1800, 3400],        # one value per batch size,
                "compute_s": [1.0e-4, 1.9e-4, 3.7e-4],     # or one number = constant
                "compute_by_type": {"V100": [1.0e-4, 1.9e-4, 3.7e-4]},   # optional
                "colocation": "conv1.weight", "splittable": ["batch"]}], # optional, copied
     "edges": [{"src": "conv1", "dst": "relu1", "bytes": [512, 1024, 2048],
                "tensor": "conv1:0"}]}                      # bytes: list or number

Per node the fitted fields are ``memory_bytes``, ``compute_s``,
``compute_by_type.<type>``, ``output_bytes``, ``flops`` and ``bytes_moved``;
per edge ``bytes``.  Any other field is copied unchanged.  A list must have
exactly one value per batch size; a plain number is a constant.

Example
-------
>>> fit_line([2, 4, 8], [10, 18, 34])
(2.0, 4.0)
>>> predict([2, 4, 8], [10, 18, 34], 512, integer=True)
2050
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..errors import InvalidInput
from ..model.graph import GRAPH_SCHEMA
from ..model.jsonio import validate

MEASUREMENTS_SCHEMA = "placer.measurements/v1"
NODE_FITTED = ("memory_bytes", "compute_s", "output_bytes", "flops", "bytes_moved")
INT_FIELDS = frozenset(("memory_bytes", "output_bytes", "flops", "bytes_moved", "bytes"))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)``.

    Raises
    ------
    InvalidInput
        Fewer than two distinct x values.
    """
    n = len(xs)
    if n != len(ys):
        raise InvalidInput(f"fit_line: {n} batch sizes but {len(ys)} values")
    mx = math.fsum(xs) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        raise InvalidInput("the Standard Evaluation needs at least two distinct batch sizes (e.g. --batch-sizes 2,4,8)")
    my = math.fsum(ys) / n
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    return my - b * mx, b


def nnls(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares ``y ~ sum_j c_j x_j`` with every ``c_j >= 0``
    (no intercept), for a handful of columns: the best of the least-squares
    fits on every subset of the columns whose coefficients are all >= 0 (the
    optimum is one of them: the unconstrained fit on its positive set), ties
    to the smaller subset.  Columns are scaled to unit norm before solving.

    >>> [round(c, 6) for c in nnls([[1, 0], [0, 1], [1, 1]], [2, 3, 5])]
    [2.0, 3.0]
    >>> [round(c, 6) for c in nnls([[1, 1], [2, 1], [3, 1]], [1, 0.5, 0])]   # the slope would be negative
    [0.0, 0.5]
    """
    p = len(rows[0]) if rows else 0
    norm = [math.sqrt(math.fsum(r[j] * r[j] for r in rows)) or 1.0 for j in range(p)]
    best, best_sse = [0.0] * p, math.fsum(y * y for y in ys)
    ynorm = math.sqrt(best_sse)
    subsets = sorted((m for m in range(1, 1 << p)), key=lambda m: (bin(m).count("1"), m))
    for mask in subsets:
        cols = [j for j in range(p) if mask >> j & 1]
        a = [[math.fsum(r[i] * r[j] for r in rows) / (norm[i] * norm[j]) for j in cols] for i in cols]
        b = [math.fsum(r[i] * y for r, y in zip(rows, ys)) / norm[i] for i in cols]
        sol = _solve(a, b)
        if sol is None or any(c < 0 for c in sol):
            continue
        coef = [0.0] * p
        for j, c in zip(cols, sol):      # a contribution at the rounding level of y is none
            coef[j] = c / norm[j] if c > 1e-9 * ynorm else 0.0
        sse = math.fsum((y - math.fsum(c * x for c, x in zip(coef, r))) ** 2 for r, y in zip(rows, ys))
        if sse < best_sse * (1 - 1e-12):
            best, best_sse = coef, sse
    return best


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` for a (nearly) singular system."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) < 1e-12:
            return None
        m[c], m[piv] = m[piv], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= f * m[c][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - math.fsum(m[r][j] * x[j] for j in range(r + 1, n))) / m[r][r]
    return x


def predict(xs: list[float], ys: list[float], x: float, *, integer: bool = False) -> float | int:
    """Value of the least-squares line through ``(xs, ys)`` at *x*, clamped at 0.

    Exact whenever the points are collinear (memory and tensor sizes of a
    captured graph are affine in the batch size, so their extrapolation is
    exact).  Integers are rounded to the nearest integer.
    """
    if all(y == ys[0] for y in ys):
        y = ys[0]
    else:
        a, b = fit_line(xs, ys)
        y = a + b * x
    y = max(0.0, y)
    return int(round(y)) if integer else y


# ------------------------------------------------------------- measurements
def _series(value: Any, k: int, where: str) -> list[float]:
    if isinstance(value, bool):
        raise InvalidInput(f"{where}: expected a number or a list of {k} numbers, got {value!r}")
    if isinstance(value, (int, float)):
        vals = [value] * k
    elif isinstance(value, list):
        if len(value) != k:
            raise InvalidInput(f"{where}: has {len(value)} values but there are {k} batch sizes")
        vals = value
    else:
        raise InvalidInput(f"{where}: expected a number or a list of {k} numbers, got {type(value).__name__}")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InvalidInput(f"{where}: values must be finite numbers >= 0, got {v!r}")
    return [float(v) for v in vals]


def check_measurements(doc: Any, label: str = "measurements") -> dict:
    """Validate a ``placer.measurements/v1`` document (see the module docstring).

    Raises
    ------
    InvalidInput
        One line naming *label*, the node/edge and the field.
    """
    if not isinstance(doc, dict) or doc.get("schema") != MEASUREMENTS_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidInput(f"{label}: field schema is {got!r}, expected \"{MEASUREMENTS_SCHEMA}\"")
    sizes = doc.get("batch_sizes")
    if (not isinstance(sizes, list) or len(sizes) < 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes)):
        raise InvalidInput(f"{label}: field batch_sizes: expected a list of at least two integers >= 1, got {sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise InvalidInput(f"{label}: field batch_sizes: repeated batch size in {sizes}")
    k = len(sizes)
    nodes, edges = doc.get("nodes"), doc.get("edges")
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise InvalidInput(f"{label}: fields nodes and edges must be lists")
    seen: set[str] = set()
    for i, nd in enumerate(nodes):
        if not isinstance(nd, dict) or not isinstance(nd.get("id"), str):
            raise InvalidInput(f"{label}: node #{i}: missing string field id")
        nid = nd["id"]
        if nid in seen:
            raise InvalidInput(f"{label}: node '{nid}' is defined twice")
        seen.add(nid)
        for f in ("memory_bytes", "compute_s"):
            if f not in nd:
                raise InvalidInput(f"{label}: node '{nid}': missing field {f}")
        for f in NODE_FITTED:
            if f in nd:
                _series(nd[f], k, f"{label}: node '{nid}' field {f}")
        for t, v in (nd.get("compute_by_type") or {}).items():
            _series(v, k, f"{label}: node '{nid}' field compute_by_type.{t}")
    for j, ed in enumerate(edges):
        if not isinstance(ed, dict) or not all(isinstance(ed.get(f), str) for f in ("src", "dst")):
            raise InvalidInput(f"{label}: edge #{j}: missing string fields src/dst")
        where = f"{label}: edge {ed['src']}->{ed['dst']} (#{j})"
        for end in ("src", "dst"):
            if ed[end] not in seen:
                raise InvalidInput(f"{where}: unknown {end} node '{ed[end]}'")
        if "bytes" not in ed:
            raise InvalidInput(f"{where}: missing field bytes")
        _series(ed["bytes"], k, f"{where} field bytes")
    validate(doc, MEASUREMENTS_SCHEMA, label)  # ranges and types (schemas/measurements.schema.json)
    return doc


def measurements_from_graphs(docs: list[dict], batch_sizes: list[int], *, name: str | None = None) -> dict:
    """Stack graph documents captured at *batch_sizes* into one measurements document.

    The graphs must have the same node ids and edges in the same order (a
    model traced at different batch sizes >= 2 does).

    Raises
    ------
    InvalidInput
        The graphs differ in structure (names the first differing node/edge).
    """
    if len(docs) != len(batch_sizes) or len(docs) < 2:
        raise InvalidInput("the Standard Evaluation needs graphs at two or more batch sizes")
    base = docs[0]
    for b, doc in zip(batch_sizes[1:], docs[1:]):
        if len(doc["nodes"]) != len(base["nodes"]) or len(doc["edges"]) != len(base["edges"]):
            raise InvalidInput(
                f"graph at batch {b} has {len(doc['nodes'])} nodes/{len(doc['edges'])} edges but batch "
                f"{batch_sizes[0]} has {len(base['nodes'])}/{len(base['edges'])}: the model's graph depends on the "
                f"batch size (use batch sizes >= 2)")
        for a, c in zip(base["nodes"], doc["nodes"]):
            if a["id"] != c["id"] or a.get("op") != c.get("op"):
                raise InvalidInput(f"graph at batch {b}: node '{c['id']}' where batch {batch_sizes[0]} has "
                                   f"'{a['id']}': the graph depends on the batch size")
        for a, c in zip(base["edges"], doc["edges"]):
            if (a["src"], a["dst"], a.get("tensor")) != (c["src"], c["dst"], c.get("tensor")):
                raise InvalidInput(f"graph at batch {b}: edge {c['src']}->{c['dst']} differs from batch "
                                   f"{batch_sizes[0]}: the graph depends on the batch size")
    nodes = []
    for i, nd in enumerate(base["nodes"]):
        out = {k: v for k, v in nd.items() if k not in NODE_FITTED and k != "compute_by_type"}
        for f in NODE_FITTED:
            if f in nd:
                out[f] = [doc["nodes"][i][f] for doc in docs]
        if nd.get("compute_by_type"):
            out["compute_by_type"] = {t: [doc["nodes"][i]["compute_by_type"][t] for doc in docs]
                                      for t in nd["compute_by_type"]}
        nodes.append(out)
    edges = []
    for j, ed in enumerate(base["edges"]):
        out = dict(ed)
        out["bytes"] = [doc["edges"][j]["bytes"] for doc in docs]
        edges.append(out)
    meta = {k: v for k, v in (base.get("meta") or {}).items() if k != "batch_size"}
    return {"schema": MEASUREMENTS_SCHEMA, "name": name or base.get("name", "graph"), "meta": meta,
            "batch_sizes": list(batch_sizes), "nodes": nodes, "edges": edges}


def extrapolate(meas: dict, target: int, *, name: str | None = None, sizes_used: Iterable[int] | None = None) -> dict:
    """The ``placer.graph/v1`` document predicted at batch size *target*.

    Parameters
    ----------
    meas : a checked ``placer.measurements/v1`` document.
    target : the batch size to predict (the large batch of Celeritas 4.2.1).
    name : graph name (default ``<name>_b<target>``).
    sizes_used : fit only on these batch sizes (leave-one-out validation).

    Returns
    -------
    dict, a graph document; ``meta.standard_evaluation`` records the fit,
    and every node's ``batch_line`` = ``{"batch": target, "compute_s": [a,
    b], "compute_by_type": {type: [a, b]}, "memory_bytes": [a, b]}`` the
    fitted lines ``y = a + b * batch`` (a constant is ``[y, 0]``), which the
    split cost model uses to time the node on part of the batch
    (:mod:`celeritas_cli.transform.split_cost`).

    References
    ----------
    Celeritas 4.2.1 (Rough Estimation: per-node linear regression on batch size).
    """
    if target < 1:
        raise InvalidInput(f"--target-batch must be >= 1, got {target}")
    sizes = meas["batch_sizes"]
    keep = [i for i, b in enumerate(sizes) if sizes_used is None or b in set(sizes_used)]
    xs = [float(sizes[i]) for i in keep]
    k = len(sizes)

    def fit(value: Any, field: str, where: str) -> float | int:
        ys = _series(value, k, where)
        return predict(xs, [ys[i] for i in keep], float(target), integer=field in INT_FIELDS)

    def line(value: Any, where: str) -> list[float]:
        ys = _series(value, k, where)
        ys = [ys[i] for i in keep]
        if all(y == ys[0] for y in ys):
            return [ys[0], 0.0]
        return list(fit_line(xs, ys))

    nodes = []
    for nd in meas["nodes"]:
        out: dict[str, Any] = {}
        lines: dict[str, Any] = {"batch": target}
        for key, v in nd.items():
            where = f"node '{nd['id']}' field {key}"
            if key in NODE_FITTED:
                out[key] = fit(v, key, where)
                if key in ("compute_s", "memory_bytes"):
                    lines[key] = line(v, where)
            elif key == "compute_by_type":
                out[key] = {t: fit(tv, "compute_s", where) for t, tv in v.items()}
                lines[key] = {t: line(tv, where) for t, tv in v.items()}
            elif key != "batch_line":
                out[key] = v
        out["batch_line"] = lines
        nodes.append(out)
    edges = []
    for ed in meas["edges"]:
        out = dict(ed)
        out["bytes"] = fit(ed["bytes"], "bytes", f"edge {ed['src']}->{ed['dst']}")
        edges.append(out)
    meta = dict(meas.get("meta") or {})
    meta["batch_size"] = target
    meta["standard_evaluation"] = {"method": "per-node least-squares line against batch size (Celeritas 4.2.1)",
                                   "batch_sizes": [sizes[i] for i in keep], "target_batch": target}
    return {"schema": GRAPH_SCHEMA, "name": name or f"{meas.get('name', 'graph')}_b{target}", "meta": meta,
            "nodes": nodes, "edges": edges}


# ---------------------------------------------------------------- deviation
def relative_deviations(estimated: dict, actual: dict, field: str) -> list[float]:
    """Per-node ``|est - act| / act`` of *field* (``memory_bytes`` or ``compute_s``),
    matching nodes by id.  A node whose actual value is 0 counts 0 when the
    estimate is 0 too and 1 (100 %) otherwise."""
    act = {nd["id"]: nd for nd in actual["nodes"]}
    out: list[float] = []
    for nd in estimated["nodes"]:
        other = act.get(nd["id"])
        if other is None or field not in nd or field not in other:
            continue
        e, a = float(nd[field]), float(other[field])
        if a == 0:
            out.append(0.0 if e == 0 else 1.0)
        else:
            out.append(abs(e - a) / a)
    return out


def summarize(devs: list[float]) -> dict:
    """Mean (Celeritas Table 5), median, 90th percentile, and the share of
    nodes within 0.5 % / 20 % (the CDF points Section 6.5.1 quotes)."""
    if not devs:
        return {"nodes": 0, "mean": 0.0, "median": 0.0, "p90": 0.0, "exact": 1.0, "within_20": 1.0}
    s = sorted(devs)
    n = len(s)
    return {"nodes": n, "mean": math.fsum(s) / n, "median": s[(n - 1) // 2], "p90": s[min(n - 1, int(0.9 * n))],
            "exact": sum(d <= 0.005 for d in s) / n, "within_20": sum(d <= 0.2 for d in s) / n}


def deviation(estimated: dict, actual: dict) -> dict:
    """Table 5 for one model: ``{"memory": summary, "time": summary}``."""
    return {"memory": summarize(relative_deviations(estimated, actual, "memory_bytes")),
            "time": summarize(relative_deviations(estimated, actual, "compute_s"))}


def leave_one_out(meas: dict) -> tuple[dict, dict, int] | None:
    """Fit on all but the largest batch size and predict it.

    Returns ``(estimated_doc, measured_doc, batch)`` for :func:`deviation`, or
    ``None`` with fewer than three batch sizes (two points always fit exactly).
    """
    sizes = meas["batch_sizes"]
    if len(sizes) < 3:
        return None
    big = max(sizes)
    rest = [b for b in sizes if b != big]
    est = extrapolate(meas, big, sizes_used=rest)
    i = sizes.index(big)
    k = len(sizes)
    actual_nodes = []
    for nd in meas["nodes"]:
        actual_nodes.append({"id": nd["id"],
                             "memory_bytes": _series(nd["memory_bytes"], k, nd["id"])[i],
                             "compute_s": _series(nd["compute_s"], k, nd["id"])[i]})
    return est, {"nodes": actual_nodes}, big


def print_deviation(table: dict, *, title: str, console=None) -> None:
    """Render :func:`deviation`'s result like Celeritas Table 5 (to stderr)."""
    from rich.table import Table

    if console is None:
        from ..log import stderr_console

        console = stderr_console()
    t = Table(title=title, title_justify="left")
    for col in ("", "nodes", "mean dev.", "median", "p90", "<=0.5%", "<=20%"):
        t.add_column(col, justify="right" if col else "left")
    for label, key in (("Mem Dev.", "memory"), ("Time Dev.", "time")):
        s = table[key]
        t.add_row(label, str(s["nodes"]), f"{100 * s['mean']:.2f}%", f"{100 * s['median']:.2f}%",
                  f"{100 * s['p90']:.2f}%", f"{100 * s['exact']:.0f}%", f"{100 * s['within_20']:.0f}%")
    console.print(t)
