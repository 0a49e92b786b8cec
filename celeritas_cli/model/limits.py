"""The ranges of numbers placer accepts on load (docs/design.md, "Valid ranges").

Every number in a graph, cluster or placement is checked against these when
the document is read, so nothing later can overflow: byte counts and their
sums stay exact in a double and below 2^63 when written, times stay far from
``inf`` in every sum, and the integer scaling of the CP-SAT model has room.
The JSON Schemas in ``schemas/`` carry the per-value limits; the totals are
checked in :meth:`Graph.from_dict <celeritas_cli.model.graph.Graph.from_dict>`.

Example
-------
>>> BYTES_MAX == 2**53 - 1, TIME_MAX
(True, 1000000000000.0)
"""

from __future__ import annotations

#: Largest byte count of one node, edge or device, and of a graph's total
#: memory and total tensor bytes: 2^53-1 (8 PiB), exact in a double.
BYTES_MAX = 2**53 - 1
#: Longest time (compute_s, compute_by_type, comm_s_by_pair, latency_s): 1e12 s.
TIME_MAX = 1e12
#: Device speed range (relative to a speed-1.0 device).
SPEED_MIN, SPEED_MAX = 1e-6, 1e6
#: Link bandwidth range in bytes per second.
BANDWIDTH_MIN, BANDWIDTH_MAX = 1.0, 1e18
#: Largest batch accepted from a file or ``--assume-batch`` (exact in a double).
BATCH_MAX = 2**53 - 1
#: Most devices in one cluster (so per-step transfer totals stay below 2^63 bytes).
DEVICES_MAX = 1024

#: Most bytes placer reads from one input document (a plain file, stdin, or a
#: ``*.gz`` file once decompressed): 512 MiB, about 1.5 million nodes of a
#: graph.  The environment variable ``PLACER_MAX_INPUT_MB`` overrides it.
INPUT_BYTES_MAX = 512 << 20

#: How the schemas' bounds read in messages (fastjsonschema prints the number).
WORDS = {
    str(BYTES_MAX): "2^53-1 bytes (8 PiB)",
    "1000000000000": "1e12 s", "1000000000000.0": "1e12 s",
    "1e-06": "1e-6", "1000000.0": "1e6", "1000000": "1e6",
    "1e+18": "1e18 B/s", "1000000000000000000": "1e18 B/s",
}

#: Largest value of an integer count parameter (evaluations, iterations, nodes, splits):
#: 1e9, far beyond what any run reaches, so every count is exact and fits the int64 of the
#: JSON writer (algorithms' ``Param(int, ..., max=...)``; issue 24, N01).
COUNT_MAX = 10**9
#: Longest single wait handed to a timer, a poll or a thread (1e6 s, about 11.6 days): the
#: operating system's limits are far lower than TIME_MAX (``poll`` takes an int of
#: milliseconds, a ``threading.Timer`` a ``time_t``), so waits are clamped to this and
#: re-armed by the caller's loop (issue 24, N03).
WAIT_MAX = 1e6


def wait_timeout(seconds: float) -> float | None:
    """*seconds* as a timeout for ``select`` / ``poll`` / ``Condition.wait``:
    ``None`` (wait without limit) for ``inf``, else clamped to ``0..WAIT_MAX``
    (the caller waits again when it wakes early).

    >>> wait_timeout(float("inf")), wait_timeout(-1.0), wait_timeout(1e12)
    (None, 0.0, 1000000.0)
    """
    if seconds == float("inf"):
        return None
    return min(max(0.0, seconds), WAIT_MAX)
