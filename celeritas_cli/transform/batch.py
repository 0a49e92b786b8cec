"""The batch a graph declares, and how it divides into whole samples.

Every rewrite that splits the batch (data-parallel replicas, micro-batches,
sharded data parallelism, batch splits of an operation) is physically
possible only where the graph says what its batch is: ``meta.batch_size``
(``placer profile`` writes it; the synthetic generator and the sample graphs
declare one), or a batch the user asserts (``--assume-batch N``, recorded in
the recipe).  A single-sample latency graph, or a converted file that does
not say, has no batch to split, and the rewrite refuses in one line.

A batch of ``B`` samples divides into ``parts`` shares of whole samples,
each at least one sample: :func:`whole_samples`.
"""

from __future__ import annotations

import math
from typing import Any

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
    at least one: equal (the first ``batch % parts`` one larger) or in
    proportion to *weights* (largest remainders, ties by index; a share
    rounded to none takes one sample from the largest).

    Raises
    ------
    InvalidInput
        ``batch < parts``: some share would get no sample.

    Example
    -------
    >>> whole_samples(10, 4), whole_samples(8, 2, [1.0, 3.0])
    ([3, 3, 2, 2], [2, 6])
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
    return out
