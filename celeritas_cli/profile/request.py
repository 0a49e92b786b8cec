"""One ``placer profile`` request, as a library call: :func:`make` turns a
:class:`ProfileRequest` into the document the command writes (a
``placer.graph/v1`` or ``placer.cluster/v1``) and what it reports on stderr.
The click command (:mod:`celeritas_cli.cli.profile_cmd`) only parses options
into a request, calls :func:`make` and prints; tests call :func:`make`.

Example
-------
>>> res = make(ProfileRequest(synthetic="layered", nodes=40, seed=1))
>>> res.kind, len(res.doc["nodes"]), res.table
('graph', 40, None)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import InvalidInput

#: the option naming each source, in the order the usage message lists them.
SOURCES = ("--model", "--from-measurements", "--comm-fit", "--comm-bench", "--synthetic")


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile: exactly one source (``model``, ``measurements``, ``comm_fit``, ``comm_bench``,
    ``synthetic``) and its options; fields are the ``placer profile`` options of the same names
    (``measurements`` and ``comm_fit`` are file names, ``-`` = stdin)."""

    model: str | None = None
    batch_size: int | None = None
    phase: str = "training"
    precision: str | None = None
    config: dict = field(default_factory=dict)
    batch_sizes: list[int] | None = None
    target_batch: int | None = None
    measurements: str | None = None
    measure: bool = False
    threads: int | None = None
    comm_fit: str | None = None
    comm_bench: bool = False
    processes: int | None = None
    synthetic: str | None = None
    nodes: int = 1000
    seed: int = 0

    def sources(self) -> list[str]:
        """The source options given, in :data:`SOURCES` order."""
        on = (self.model is not None, self.measurements is not None, self.comm_fit is not None,
              self.comm_bench, self.synthetic is not None)
        return [m for m, given in zip(SOURCES, on) if given]

    def usage_problem(self) -> str | None:
        """The first option combination ``placer profile`` rejects as a usage error, or ``None``."""
        modes = self.sources()
        if len(modes) != 1:
            return ("give exactly one of --model, --from-measurements, --comm-fit, --comm-bench, "
                    f"--synthetic (got {', '.join(modes) or 'none'})")
        mode = modes[0]
        if self.processes is not None and mode != "--comm-bench":
            return "--processes goes with --comm-bench"
        if self.precision is not None and mode != "--model":
            return "--precision goes with --model"
        if mode == "--from-measurements" and self.target_batch is None:
            return "--from-measurements needs --target-batch"
        if mode == "--model" and self.batch_sizes is None and self.target_batch is not None:
            return "--target-batch needs --batch-sizes (or --from-measurements)"
        return None


@dataclass
class Profiled:
    """The result of :func:`make`.

    Attributes
    ----------
    kind : ``graph`` (a ``placer.graph/v1`` document) or ``cluster`` (``placer.cluster/v1``).
    doc : the document.
    table : Standard Evaluation deviation table (:func:`.regression.deviation`), or ``None``.
    how : how the table was obtained, or why there is none (``""``: not a Standard Evaluation).
    """

    kind: str
    doc: dict
    table: dict | None = None
    how: str = ""


def make(req: ProfileRequest, progress: Callable[[str], None] | None = None) -> Profiled:
    """Carry out *req*; *progress* gets one-line messages (the CLI prints them on stderr).

    Raises
    ------
    InvalidInput
        An option combination the command rejects (:meth:`ProfileRequest.usage_problem`), bad input.
    MissingDependency
        torch is needed (``--model``, ``--comm-bench``) and missing.
    """
    problem = req.usage_problem()
    if problem:
        raise InvalidInput(problem)
    say = progress or (lambda msg: None)
    mode = req.sources()[0]
    if mode == "--synthetic":
        from . import synthetic

        return Profiled("graph", synthetic(req.synthetic, req.nodes, req.seed))
    if mode in ("--comm-fit", "--comm-bench"):
        return Profiled("cluster", _fitted_cluster(req, say))
    if mode == "--from-measurements":
        from ..model.jsonio import label_of, read_json
        from . import from_measurements

        doc, table, how = from_measurements(read_json(req.measurements), req.target_batch,
                                            label=label_of(req.measurements))
        return Profiled("graph", doc, table, how)
    if req.batch_sizes is not None:
        from . import standard_evaluation

        target = req.target_batch or req.batch_size or max(req.batch_sizes, default=0)
        doc, table, how = standard_evaluation(req.model, req.batch_sizes, target, phase=req.phase,
                                              config=req.config, measure=req.measure, threads=req.threads,
                                              progress=say, precision=req.precision)
        return Profiled("graph", doc, table, how)
    return Profiled("graph", _capture(req, say))


def _capture(req: ProfileRequest, say: Callable[[str], None]) -> dict:
    """``--model`` at one batch size (the zoo model's paper batch, else 32, when none is given)."""
    from . import capture_model

    batch_size = req.batch_size
    if batch_size is None:
        from .capture import require_torch

        require_torch()
        from .zoo import ZOO

        batch_size = ZOO[req.model].paper_batch if req.model in ZOO else 32
        say(f"no --batch-size given, using {batch_size}")
    say(f"capturing {req.model} ({req.phase}{', ' + req.precision if req.precision else ''}) at batch {batch_size}")
    return capture_model(req.model, batch_size, phase=req.phase, config=req.config, measure=req.measure,
                         threads=req.threads, progress=say, precision=req.precision)


def _fitted_cluster(req: ProfileRequest, say: Callable[[str], None]) -> dict:
    """``--comm-fit`` / ``--comm-bench``: the samples (read, or measured on CUDA GPUs or between
    processes) fitted per device pair (:func:`.commfit.fit_cluster`), checked as a cluster."""
    from ..log import warn
    from ..model.cluster import Cluster
    from ..model.jsonio import label_of, read_json
    from .commfit import comm_bench, fit_cluster

    if req.comm_bench and req.processes is not None:
        from .commbench import bench_processes

        samples = bench_processes(req.processes, threads=req.threads, progress=say)
        label = "comm-bench"
    elif req.comm_bench:
        samples = comm_bench(progress=say)
        label = "comm-bench"
    else:
        samples = read_json(req.comm_fit)
        label = label_of(req.comm_fit)
    doc = fit_cluster(samples, label=label, warn=warn, weighting="relative" if req.processes else "none")
    if samples.get("meta"):
        doc["meta"]["comm_bench"] = samples["meta"]
    Cluster.from_dict(doc, label="fitted cluster")
    return doc


def fit_lines(doc: dict) -> list[str]:
    """One line per fitted link of a cluster made by :func:`make` (k, bandwidth, b, R^2, samples)."""
    return [f"{pair}: k = {f['k']:.4g} s/B (bandwidth {1 / f['k'] / 1e9:.3f} GB/s), b = {f['b']:.3g} s, "
            f"R^2 = {f['r2']:.4f}, {f['n']} samples" for pair, f in doc["meta"]["fit"].items()]


def summary_line(doc: dict) -> str:
    """Nodes, edges, CCR on the default cluster (4xV100-pcie), memory and compute of a graph document.

    Raises
    ------
    InvalidInput
        The document is not a valid graph.
    """
    from ..model.costs import cost_model
    from ..model.graph import Graph
    from ..model.io import load_cluster

    g = Graph.from_dict(doc, doc.get("name", "graph"))
    ccr = cost_model(g, load_cluster(None)).ccr() if g.m else 0.0
    measured = (doc.get("meta") or {}).get("measured")
    where = f"measured on {measured['device']}" if isinstance(measured, dict) else "V100"
    return (f"{g.name}: {g.n} nodes, {g.m} edges, CCR {ccr:.2f} on 4xV100-pcie, "
            f"memory {g.total_memory() / 2**30:.2f} GiB, compute {sum(g.compute):.4f} s ({where})")
