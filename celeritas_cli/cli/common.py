"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import atexit
import math
import os
import re
import sys
import threading

import click

from ..log import flush_c_stdio
from ..log import stderr_console, warn  # noqa: F401  (re-exported for the commands)
from ..model.congestion import CONGESTION_RULES, DEFAULT_CONGESTION
from ..model.io import DEFAULT_CLUSTER, load_cluster
from ..model.jsonio import write_json
from ..model.limits import TIME_MAX
from ..model.params import ASSUME_BATCH, SEED, TIME_LIMIT_CAP

cluster_option = click.option(
    "--cluster", "-c", "cluster_path", metavar="FILE|NAME", default=None,
    help=f"Cluster file, or the name of a bundled cluster (`placer clusters` lists them). "
         f"Default: {DEFAULT_CLUSTER} (4x V100-32GB over PCIe).")

def _nonempty_path(ctx, param, value):
    if value is not None and not str(value).strip():
        raise click.BadParameter("empty file name (use - for stdout)")
    return value


output_option = click.option(
    "-o", "--output", "output", metavar="FILE", default="-", show_default=True, callback=_nonempty_path,
    help="Where to write the JSON result, atomically (- = stdout).")

seed_option = click.option("--seed", type=click.IntRange(SEED.min, SEED.max), default=SEED.default, show_default=True,
                           help="Random seed (0 .. 2^63-1).")


def positive_seconds(ctx, param, value):
    """Click callback: seconds, ``0 < S <= 1e12`` (``nan``, ``inf`` and the rest are usage errors)."""
    if value is not None and not (math.isfinite(value) and 0 < value <= TIME_MAX):
        raise click.BadParameter(f"must be a number of seconds > 0 and <= 1e12, got {value}")
    return value


def time_limit_seconds(ctx, param, value):
    """Click callback of ``--time-limit``: seconds, ``0 <= S <= 1e12``, 0 = no
    limit - the rule of every algorithm's ``time_limit``
    (:func:`celeritas_cli.registry.time_limit_param`); ``nan``, ``inf`` and
    the rest are usage errors (exit 2) naming the option."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= TIME_LIMIT_CAP.max):
        raise click.BadParameter(f"must be a number of seconds from 0 (no limit) to 1e12, got {value}")
    return value


def time_limit_option(help: str):
    """``--time-limit S`` (default: not given), checked by :func:`time_limit_seconds`."""
    return click.option("--time-limit", type=float, default=None, metavar="S", callback=time_limit_seconds,
                        help=help)


def congestion_option(help: str, default: str | None = DEFAULT_CONGESTION):
    """``--congestion RULE``, one of :data:`~celeritas_cli.model.congestion.CONGESTION_RULES`
    (*default* None: not given, e.g. ``place``, where only a given flag reaches the algorithm)."""
    return click.option("--congestion", type=click.Choice(CONGESTION_RULES), default=default,
                        show_default=default is not None, help=help)


# C0 and C1 control characters (newline, carriage return, tab, escape, ...), DEL, and Unicode's
# line / paragraph separators: anything that would break a one-line message or drive a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """*text* with every control character escaped, so that an error stays
    one line however odd the ids, file names, device ids or exception
    messages it quotes (a node id with a newline, an ANSI escape in a
    file name).  Newline, carriage return and tab read ``\\n``, ``\\r``,
    ``\\t``; others ``\\xNN`` / ``\\uNNNN``; everything else, backslashes
    included, is left as it is.  The CLI passes every error message through
    it (:class:`celeritas_cli.cli.PlacerGroup`), so no command needs to.

    Example
    -------
    >>> print(one_line("node 'a\\nb': line one\\r\\nline two\\x1b[31m"))
    node 'a\\nb': line one\\r\\nline two\\x1b[31m
    """

    def escape(m: re.Match) -> str:
        ch = m.group()
        return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")

    return _CONTROL.sub(escape, text)


def nonnegative_finite(ctx, param, value):
    """Click callback: a finite number >= 0 (``nan``, ``inf`` and negatives are usage errors)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"must be a finite number >= 0, got {value}")
    return value


def get_cluster(path: str | None, *, quiet: bool = False):
    """Load the cluster, saying on stderr when the default is used."""
    if path is None and not quiet:
        warn(f"placer: no --cluster given, using the default {DEFAULT_CLUSTER} (4x V100-32GB, PCIe)")
    return load_cluster(path)


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("R=200", "M=0.25")`` -> ``{"R": "200", "M": "0.25"}`` (usage error otherwise)."""
    out: dict[str, str] = {}
    for item in pairs:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="-p/--param")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def emit(doc: dict, output: str) -> None:
    """Write the JSON document (stdout or atomically to a file)."""
    write_json(doc, output)


#: True in the ``placer`` process itself (set by :func:`celeritas_cli.cli.run`): :func:`finish` may end it
FAST_EXIT = False


def finish(status: int = 0) -> None:
    """End the ``placer`` process now with exit *status*: its result (or
    its error) is written.

    Called last by the commands that hold a whole graph (place, simulate,
    coarsen), so the interpreter does not free every node, edge and list of
    it one by one on the way out - about 0.3 s of CPU on a 200,000-node graph,
    more on a loaded machine, all after the answer is written, yet part of
    the command's wall time that ``--time-limit`` is to bound.  Safe: stdout, stderr and the C library's
    buffers are flushed and the atexit handlers run (what a normal exit does
    besides freeing memory); output files are already closed (written
    atomically).  Only in the ``placer`` process (:func:`~celeritas_cli.cli.run`),
    never when a command runs inside another program (click's CliRunner, a
    test), and not while another thread runs.
    """
    if not FAST_EXIT or threading.active_count() > 1:
        return
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: let the normal exit deal with it
        return
    if run_exitfuncs is None:
        return
    run_exitfuncs()
    try:  # an atexit handler may have written more
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        status = 120  # what CPython's own exit returns when it cannot flush them
    flush_c_stdio()
    os._exit(status)


def stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


assume_batch_option = click.option(
    "--assume-batch", "assume_batch", type=click.IntRange(1, ASSUME_BATCH.max), default=None, metavar="N",
    help="The batch the graph's costs hold for, when the graph does not say (meta.batch_size): lets the "
         "algorithms that split the batch (data-parallel, os-dpos, fd-dps -p split=true, auto) do so; "
         "recorded in the placement's recipe. Same as -p assume_batch=N.")

max_derived_option = click.option(
    "--max-derived-nodes", "max_derived_nodes", type=click.IntRange(1, 2**31), default=None, metavar="N",
    help="Largest derived graph (data-parallel replicas, split operations) placer builds, in nodes "
         "(default 1,000,000, and 4 edges per node); a recipe over it is refused before anything is built.")


def placement_cluster(placement, cluster_path: str | None, label: str):
    """The cluster to simulate *placement* on.

    ``--cluster`` when given: a warning on stderr when its digest differs
    from the one the placement records (another cluster, or an edited copy
    under the same name).  Without ``--cluster``: the bundled cluster the
    placement names, when its digest matches; a placement without a digest
    (an older file) gets today's rule (the bundled cluster it names, else
    the default).

    Raises
    ------
    InvalidInput
        Without ``--cluster``, a placement made on a cluster that is not the
        bundled one of its name (one line saying which file to pass).
    """
    from ..errors import InvalidInput
    from ..model.io import bundled_cluster_names

    digest = placement.cluster_digest
    made = f"cluster '{placement.cluster}'" + (f" (file {placement.cluster_file})" if placement.cluster_file else "")
    if cluster_path is not None:
        cluster = get_cluster(cluster_path)
        if digest and cluster.digest() != digest:
            warn(f"placer: warning: {label} was made for {made}, digest {digest}; the cluster given, "
                 f"'{cluster.name}', has digest {cluster.digest()} (another cluster, or an edited copy): the result "
                 f"is for the cluster given")
        return cluster
    bundled = placement.cluster in bundled_cluster_names()
    if digest is None:  # made before placements recorded their cluster: as before, said on stderr
        if bundled:
            warn(f"placer: warning: {label} records no cluster digest (made by an older placer), so placer cannot "
                 f"tell whether it was made on the bundled '{placement.cluster}' or on an edited copy of that name; "
                 f"simulating on the bundled one: pass --cluster FILE if it was made on a file")
        return get_cluster(placement.cluster if bundled else None, quiet=bundled)
    how = f"pass the cluster file it was made on: --cluster {placement.cluster_file or 'FILE'}"
    if not bundled:
        raise InvalidInput(f"{label}: was made for {made}, which is not a bundled cluster; {how}")
    cluster = get_cluster(placement.cluster, quiet=True)
    if cluster.digest() != digest:
        raise InvalidInput(f"{label}: was made for {made} with digest {digest}, but the bundled "
                           f"'{placement.cluster}' has digest {cluster.digest()} (an edited copy under the same "
                           f"name); {how}")
    return cluster
