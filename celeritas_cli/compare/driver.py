"""The whole comparison, the library entry of ``placer compare``:
:func:`compare` runs the cells and returns the rows; :func:`run_compare`
also resumes, streams NDJSON, shows progress, writes the table and the plot
- everything the command does, so tests and scripts call it directly.

Determinism: cells are generated in (graph, cluster, algorithm) order and
results are reported sorted that way by :func:`~.rows.sort_rows`; the
measured times vary, everything else is a function of the inputs and the
seed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .. import registry
from ..errors import InvalidInput, MissingDependency
from ..log import Progress, warn
from ..model.congestion import DEFAULT_CONGESTION
from ..model.jsonio import write_bytes
from .executors import import_ray, run_tasks
from .formats import render, table_width
from .inputs import default_algorithms, discover_graphs
from .ndjson import NdjsonStream, read_rows
from .rows import FAILED_STATUSES, cell_key, sort_rows
from .tasks import Task, kept_rows, make_tasks, tasks_to_run

FORMATS = ("table", "json", "csv", "markdown", "html")


def compare(graph_paths: Iterable[str], clusters: list, algorithms: list[str] | None = None, *,
            jobs: int = 1, executor: str = "auto", ray_address: str | None = None,
            previous: list[dict] | None = None, retry_failed: bool = False,
            on_plan: Callable[[int], None] | None = None, on_start: Callable[[Task], None] | None = None,
            on_result: Callable[[Task, dict], None] | None = None, **task_options) -> list[dict]:
    """Run the whole comparison and return every row (previous ones included),
    sorted by :func:`~.rows.sort_rows`.

    Parameters
    ----------
    graph_paths : iterable of str
        Graph files and directories (see :func:`~.inputs.discover_graphs`).
    clusters : list of Cluster
    algorithms : list of str, optional
        Default: :func:`~.inputs.default_algorithms`.
    jobs, executor, ray_address
        See :func:`~.executors.run_tasks`.
    previous : list of dict, optional
        Rows of an earlier run (``--resume``): their cells are skipped, except
        failed ones (error/timeout) when *retry_failed*.
    on_plan : callable, optional
        Called once with the number of cells left to run.
    on_start, on_result : callable, optional
        Called as each cell starts / finishes (progress, streaming output).
    **task_options
        Passed to :func:`~.tasks.make_tasks` (coarsen, seed, time_limit, ...).

    Returns
    -------
    list of dict
        ``placer.compare/v1`` rows.

    Raises
    ------
    InvalidInput
        An unknown algorithm, a missing graph path, a bad parameter.

    Example
    -------
    >>> from celeritas_cli.model.cluster import uniform
    >>> rows = compare(["sample_graphs/layered_60.json"], [uniform(2)], ["single-device", "random"])
    >>> [(r["algorithm"], r["status"]) for r in rows]
    [('single-device', 'OK'), ('random', 'OK')]
    """
    algorithms = list(algorithms) if algorithms else default_algorithms()
    for a in algorithms:
        registry.get(a)
    files = discover_graphs(graph_paths)
    tasks = make_tasks(files, clusters, algorithms, **task_options)
    kept = kept_rows(previous, retry_failed)
    todo = tasks_to_run(tasks, kept)
    if on_plan:
        on_plan(len(todo))
    rows = list(kept)
    for task, row in run_tasks(todo, jobs=jobs, executor=executor, ray_address=ray_address, on_start=on_start):
        rows.append(row)
        if on_result:
            on_result(task, row)
    return sort_rows(rows, algorithms)


@dataclass
class CompareOptions:
    """How ``placer compare`` runs and where its results go (one field per
    option of the command; see ``placer compare --help``)."""

    common_params: dict = field(default_factory=dict)
    per_algo_params: dict = field(default_factory=dict)
    quick: bool = False
    coarsen: str | None = None
    coarsen_params: dict = field(default_factory=dict)
    seed: int = 0
    time_limit: float | None = None
    congestion: str = DEFAULT_CONGESTION
    memory: str = "time"
    jobs: int = 1
    executor: str = "auto"
    ray_address: str | None = None
    fmt: str = "table"
    output: str = "-"
    resume: str | None = None
    retry_failed: bool = False
    plot: str | None = None
    progress: bool = True
    verbose: bool = False

    def task_options(self) -> dict:
        """The keyword arguments of :func:`~.tasks.make_tasks`."""
        return dict(coarsen=self.coarsen, coarsen_params=self.coarsen_params, common_params=self.common_params,
                    per_algo_params=self.per_algo_params, seed=self.seed, time_limit=self.time_limit,
                    congestion=self.congestion, quick=self.quick, keep_placement=bool(self.plot) or self.fmt == "html",
                    verbose=self.verbose, memory=self.memory)


@dataclass
class CompareResult:
    """What :func:`run_compare` did: every row (resumed ones included,
    sorted) and the failed ones (error / timeout)."""

    rows: list[dict]
    failed: list[dict]


class _Progress:
    """Progress of the cells on stderr (:class:`celeritas_cli.log.Progress`):
    a bar on a terminal, one line per finished cell when stderr is piped,
    nothing with ``progress=False`` (``-q``, ``--no-progress``); failures
    and the cells' own output are printed in every mode."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.todo = total
        self.done = 0
        self.view = Progress("compare", total, enabled=enabled)

    def start(self) -> None:
        self.view.start()

    def plan(self, todo: int) -> None:
        self.todo = todo
        self.view.update(total=todo, description=f"{todo} of {self.total} cells to run")
        if todo < self.total:
            self.view.line(f"compare: {todo} of {self.total} cells to run (the rest resumed)")

    def started(self, task: Task) -> None:
        self.view.update(description=task.label())

    def finished(self, task: Task | None = None, row: dict | None = None) -> None:
        self.done += 1
        self.view.update(advance=1)
        if self.view.mode == "lines" and task is not None:
            self.view.line(f"compare: {self.done}/{self.todo} {task.label()}: {_outcome(row or {})}")

    def print(self, msg: str) -> None:
        """A line in every mode (above the bar when there is one)."""
        self.view.note(msg)

    def stop(self, description: str = "done") -> None:
        self.view.stop(description)


def _outcome(row: dict) -> str:
    """``OK, makespan 0.123 s`` (a finished cell in one phrase).

    Example
    -------
    >>> _outcome({"status": "OOM", "makespan_s": 2.5, "placement_time_s": 0.01})
    'OOM, makespan 2.5 s, placed in 0.01 s'
    """
    text = str(row.get("status"))
    if row.get("makespan_s") is not None:
        text += f", makespan {row['makespan_s']:.4g} s"
    if row.get("placement_time_s") is not None:
        text += f", placed in {row['placement_time_s']:.2g} s"
    return text


class _BestPlacements:
    """The best placement found so far per (graph file, cluster), kept for
    ``--plot``: the smallest OK makespan, ties to the earlier algorithm in
    the compared order (the tables' rule, whatever order cells finish in)."""

    def __init__(self, algorithms: list[str]):
        self.position = {a: i for i, a in enumerate(algorithms)}
        self.rows: dict[tuple, dict] = {}

    def _rank(self, row: dict) -> tuple:
        return (row["makespan_s"], self.position.get(row.get("algorithm"), len(self.position)))

    def offer(self, row: dict, placement: dict | None) -> None:
        if placement is None or row.get("status") != "OK" or row.get("makespan_s") is None:
            return
        key = (row.get("graph_file"), row.get("cluster"))
        if key not in self.rows or self._rank(row) < self._rank(self.rows[key]):
            self.rows[key] = {**row, "_placement": placement}


def _check(clusters: list, options: CompareOptions) -> None:
    """What can be checked before any cell runs or any file is opened."""
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        raise InvalidInput(f"two clusters are both named '{next(n for n in names if names.count(n) > 1)}'; "
                           f"rename one (its \"name\" field)")
    if options.retry_failed and not options.resume:
        raise InvalidInput("retry_failed needs a file to resume")
    if options.fmt not in FORMATS:
        raise InvalidInput(f"unknown format '{options.fmt}' (use {', '.join(FORMATS)})")
    if options.plot and not options.plot.lower().endswith((".svg", ".png")):
        raise InvalidInput(f"{options.plot}: the plot file must end in .svg or .png")
    if options.plot and options.plot.lower().endswith(".png") and importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency("--plot .png needs matplotlib: pip install 'celeritas-cli[plot]', "
                                "or write .svg (no dependency)")
    if options.executor == "ray":
        import_ray()


def run_compare(graphs: Iterable[str], clusters: list, algorithms: list[str] | None = None,
                options: CompareOptions | None = None) -> CompareResult:
    """Run ``placer compare``: plan the cells (skipping those in
    ``options.resume``), run them with progress on stderr, stream NDJSON
    rows as they finish (``fmt="json"``) or write the tables at the end
    (atomically), draw ``options.plot``, and say on stderr how many cells
    failed.

    Parameters
    ----------
    graphs : iterable of str
        Graph files and directories.
    clusters : list of Cluster
        Distinct names.
    algorithms : list of str, optional
        Default: every registered algorithm whose extra is installed.
    options : CompareOptions, optional

    Returns
    -------
    CompareResult

    Raises
    ------
    InvalidInput, MissingDependency
        Bad options or inputs, found before any cell runs and before the
        output is opened.

    Example
    -------
    >>> from celeritas_cli.model.cluster import uniform
    >>> res = run_compare(["sample_graphs/layered_60.json"], [uniform(2)], ["single-device"],
    ...                   CompareOptions(fmt="csv", output="/dev/null", progress=False))
    >>> [r["status"] for r in res.rows], res.failed
    (['OK'], [])
    """
    options = options or CompareOptions()
    algorithms = list(algorithms) if algorithms else default_algorithms()
    _check(clusters, options)
    previous = read_rows(options.resume) if options.resume else None
    if options.resume and options.fmt != "json" and options.output != "-" \
            and os.path.realpath(options.output) == os.path.realpath(options.resume):
        raise InvalidInput(f"{options.output}: -o is the --resume file; {options.fmt} output would replace its rows "
                           f"(write the {options.fmt} to another file)")
    files = discover_graphs(graphs)
    make_tasks(files, clusters, algorithms, **options.task_options())  # bad parameters fail before any output
    stream = NdjsonStream(options.output, options.resume) if options.fmt == "json" else None
    if stream is not None and not stream.same_as_resume:
        for r in kept_rows(previous, options.retry_failed):
            stream.write(r)
    progress = _Progress(len(files) * len(clusters) * len(algorithms), options.progress)
    best = _BestPlacements(algorithms)
    placements: dict[tuple, dict] = {}  # --format html: each cell's placement, without its split_graph

    def on_result(task: Task, row: dict) -> None:
        for line in row.pop("_log", "").splitlines():
            if line.strip():  # "cell: milp: ..." rather than "cell: milp: milp: ..."
                progress.print(f"{task.label()}: {line.removeprefix(task.algorithm + ': ')}")
        if row.get("status") in FAILED_STATUSES:
            progress.print(f"{row['status']}: {task.label()}: {row.get('error')}")
        placement = row.pop("_placement", None)
        best.offer(row, placement)
        if options.fmt == "html" and placement is not None:
            placements[cell_key(row)] = {k: v for k, v in placement.items() if k != "split_graph"}
        if stream is not None:
            stream.write(row)
        progress.finished(task, row)

    try:
        progress.start()
        rows = compare(files, clusters, algorithms, jobs=options.jobs, executor=options.executor,
                       ray_address=options.ray_address, previous=previous, retry_failed=options.retry_failed,
                       on_plan=progress.plan, on_start=progress.started, on_result=on_result,
                       **options.task_options())
    except KeyboardInterrupt:
        progress.stop("interrupted")
        if stream is not None:
            stream.close()
        warn(_interrupted(options, progress.done, progress.todo, stream))
        raise
    finally:
        progress.stop()
        if stream is not None:
            stream.close()
    _write_outputs(rows, algorithms, best.rows, clusters, options, placements)
    failed = [r for r in rows if r.get("status") in FAILED_STATUSES]
    if failed:
        warn(f"placer: {len(failed)} of {len(rows)} cells failed or timed out")
    return CompareResult(rows, failed)


def _interrupted(options: CompareOptions, done: int, todo: int, stream: NdjsonStream | None) -> str:
    """What an interrupted run kept, and how to go on from it."""
    head = f"placer: interrupted after {done} of {todo} cells"
    if stream is not None and not stream.to_stdout:
        return (f"{head}; {options.output} keeps every finished cell ({stream.written} rows written): run the "
                f"same command with --resume {options.output} to run only the rest")
    if stream is not None:
        return (f"{head}; the rows on stdout are whole lines: save them to a file and pass --resume FILE to run "
                f"only the rest")
    return (f"{head}; nothing was written ({options.fmt} output comes at the end): --format json -o FILE keeps "
            f"each cell as it finishes, and --resume FILE runs only the rest")


def _write_outputs(rows: list[dict], algorithms: list[str], best: dict, clusters: list,
                   options: CompareOptions, placements: dict | None = None) -> None:
    """The tables (all formats but json, which was streamed), the page and the plot."""
    if options.fmt == "html":
        from .html import best_views, compare_page

        views = best_views(best, {c.name: c for c in clusters}, options.congestion, options.memory)
        write_bytes(compare_page(rows, algorithms, placements, views).encode(), options.output)
    elif options.fmt != "json":
        color = options.fmt == "table" and options.output == "-" and sys.stdout.isatty()
        width = table_width(options.output == "-" and sys.stdout.isatty())
        write_bytes(render(options.fmt, rows, algorithms, color=color, width=width).encode(), options.output)
    if options.plot:
        from .plots import write_plot

        write_plot(options.plot, rows, algorithms, best, {c.name: c for c in clusters}, options.congestion)
