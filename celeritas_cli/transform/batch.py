"""The batch a graph declares, and how it divides into whole samples.

Every rewrite that splits the batch (data-parallel replicas, micro-batches,
sharded data parallelism, batch splits of an operation) is physically
possible only where the graph says what its batch is: ``meta.batch_size``
(``placer profile`` writes it; the synthetic generator and the sample graphs
declare one), or a batch the user asserts (``--assume-batch N``, recorded in
the recipe).  A single-sample latency graph, or a converted file that does
not say, has no batch to split, and the rewrite refuses in one line.

A batch of ``B`` samples divides into ``parts`` shares of whole samples,
each at least one sample: :func:`whole_samples`.  Shares for parts of
different speeds are rounded by placer's rule (not a paper's): of all the
roundings into whole samples, one whose slowest part is fastest
(:func:`balance_samples`), so rounding never overloads a slow device to
keep a fraction closer.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import InvalidInput
from ..model.graph import Graph
from ..model.limits import BATCH_MAX  # noqa: F401  (re-exported)


def declared_batch(graph: Graph, assume: int | None = None, *, what: str = "splitting the batch") -> int:
    """The batch size *graph*'s costs hold for: ``assume`` when given (a
    batch the user asserts), else ``meta.batch_size``.

    Raises
    ------
    InvalidInput
        The graph declares no batch (or a non-integer or non-positive one)
        and none is assumed: *what* is not physically possible.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("g", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], [], meta={"batch_size": 8})
    >>> declared_batch(g), declared_batch(g, 4)
    (8, 4)
    >>> declared_batch(build("h", [{"id": "a", "compute_s": 1, "memory_bytes": 0}], []))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: graph 'h' declares no batch size (meta.batch_size)...
    """
    if assume is not None:
        return _check_batch(assume, f"graph '{graph.name}': the assumed batch size")
    value: Any = graph.meta.get("batch_size")
    if value is None:
        raise InvalidInput(
            f"graph '{graph.name}' declares no batch size (meta.batch_size), so {what} is not possible: a graph "
            f"without a batch (a single-sample latency graph, a converted file) has none to split; if you know "
            f"the batch its costs hold for, say so with --assume-batch N (or -p assume_batch=N)")
    return _check_batch(value, f"graph '{graph.name}': meta.batch_size")


def _check_batch(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not 1 <= value <= BATCH_MAX:
        raise InvalidInput(f"{where} must be a whole number of samples 1..{BATCH_MAX}, got {value!r}")
    return int(value)


def whole_samples(batch: int, parts: int, weights: list[float] | None = None, *, what: str = "the batch") -> list[int]:
    """*batch* samples divided into *parts* shares of whole samples, each
    at least one: equal (the first ``batch % parts`` one larger) or, for
    parts of speeds *weights*, the rounding whose slowest part is fastest:
    part ``i`` with ``b`` samples takes ``b / weights[i]``, and
    :func:`balance_samples` minimises the largest of these from the largest
    remainders of the proportional shares (ties by index; a share rounded to
    none takes one sample from the largest).  Largest remainders alone can
    give a slow part the extra sample: 152/152/104/104 where 153/153/103/103
    is faster (issue 33, J3).

    Raises
    ------
    InvalidInput
        ``batch < parts``: some share would get no sample.

    Example
    -------
    >>> whole_samples(10, 4), whole_samples(8, 2, [1.0, 3.0])
    ([3, 3, 2, 2], [2, 6])
    >>> whole_samples(7, 3, [1.0, 1.0, 2.6])  # largest remainders: [2, 1, 4] (2 s); balanced: 1.92 s
    [1, 1, 5]
    >>> whole_samples(3, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: the batch of 3 samples cannot be split 4 ways...
    """
    if parts < 1:
        raise InvalidInput(f"{what}: cannot be split into {parts} parts")
    if batch < parts:
        raise InvalidInput(f"{what} of {batch} sample{'s' if batch != 1 else ''} cannot be split {parts} ways: "
                           f"every part needs at least one whole sample")
    if weights is None:
        q, r = divmod(batch, parts)
        return [q + (1 if i < r else 0) for i in range(parts)]
    if len(weights) != parts or not all(math.isfinite(w) and w > 0 for w in weights):
        raise InvalidInput(f"{what}: need {parts} positive weights, got {weights!r}")
    total = math.fsum(weights)
    exact = [batch * w / total for w in weights]
    out = [int(math.floor(x)) for x in exact]
    for i in sorted(range(parts), key=lambda i: (-(exact[i] - out[i]), i))[:batch - sum(out)]:
        out[i] += 1
    for i in range(parts):  # every share at least one sample, taken from the largest
        if out[i] == 0:
            j = max(range(parts), key=lambda j: (out[j], -j))
            out[j] -= 1
            out[i] = 1
    return balance_samples(out, lambda i, b: b / weights[i])


def balance_samples(samples: list[int], time_of: Callable[[int, int], float],
                    fits: Callable[[int, int], bool] | None = None) -> list[int]:
    """Whole samples per part, starting from *samples* (each at least one),
    moved until the slowest part is as fast as any rounding allows, where
    part ``i`` with ``b`` samples takes ``time_of(i, b)``, non-decreasing
    in ``b``.  Placer's rule, not a paper's: while the first part ``i`` at
    the largest time ``M`` has more than one sample and some other part
    ``j`` would take less than ``M`` with one sample more (the first with
    the smallest such time), ``i`` gives ``j`` one sample.

    Exact (for any non-decreasing *time_of*): if some rounding ``y`` had a
    slowest time ``M* < M``, then ``y_i < x_i`` for the part ``i`` at
    ``M``, so some ``j`` has ``y_j > x_j`` and ``time_of(j, x_j + 1) <=
    M* < M``: a move exists, so the procedure has not stopped; and every
    move lowers ``(M, parts at M)`` or ``i``'s samples, so it stops.  From a
    rounding of the proportional shares it moves a few samples; every
    ``time_of(i, b)`` is asked once.  With *fits*, a part ``j`` takes a
    sample only where ``fits(j, b + 1)`` (its memory at ``b + 1`` samples),
    so no move puts a part over its memory: the rule is then exact among the
    roundings that keep every part that takes samples within it.

    Example
    -------
    >>> balance_samples([1, 3], lambda i, b: b * (1, 2)[i])  # times 1 and 6: [2, 2] takes 4, [3, 1] 3
    [3, 1]
    """
    out = list(samples)
    seen: dict[tuple[int, int], float] = {}

    def at(i: int, b: int) -> float:
        if (i, b) not in seen:
            seen[i, b] = time_of(i, b)
        return seen[i, b]

    while True:
        times = [at(i, b) for i, b in enumerate(out)]
        worst = max(times)
        i = times.index(worst)
        after = [(at(j, out[j] + 1), j) for j in range(len(out)) if j != i and (fits is None or fits(j, out[j] + 1))]
        if out[i] <= 1 or not after or min(after)[0] >= worst:
            return out
        out[i] -= 1
        out[min(after)[1]] += 1
