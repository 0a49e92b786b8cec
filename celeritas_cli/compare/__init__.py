"""``placer compare``: algorithms x graphs x clusters, judged by the simulator.

Each *cell* places one graph on one cluster with one registered algorithm
(optionally on a coarse graph made by a registered coarsening method), times
the placement (Celeritas 6.3 / Table 4), simulates it on the **original**
graph (the judge, docs/design.md) and keeps the makespan, OOM status, makespan /
lower bound, utilisation, transfer totals and times as one flat result row
(``placer.compare/v1``).  The package, by responsibility:

* :mod:`.rows` - the row: fields, identity (``--resume`` key), order, best;
* :mod:`.inputs` - graph discovery, default algorithms (from the registry),
  the ``--algos`` groups;
* :mod:`.tasks` - the cells to run and their parameters;
* :mod:`.cell` - one cell: load, coarsen, place, simulate;
* :mod:`.executors` - serial, worker processes with time limits, Ray;
* :mod:`.ndjson` - rows streamed as NDJSON and read back;
* :mod:`.formats` - Celeritas Table 3/4 as text (fitted to the terminal) or
  Markdown, CSV;
* :mod:`.plots` - bar panels and Gantt charts (``--plot``);
* :mod:`.html` - the whole comparison as one page (``--format html``);
* :mod:`.driver` - :func:`compare` (the rows) and :func:`run_compare`
  (what the command does: resume, progress, outputs).
"""

from .cell import failed_row, phase_limit, run_cell
from .driver import FORMATS, CompareOptions, CompareResult, compare, run_compare
from .executors import import_ray, run_processes, run_ray, run_tasks
from .formats import (
    CAVEAT_MARK,
    caveat_lines,
    format_csv,
    format_markdown,
    format_table,
    matrix,
    render,
)
from .inputs import NOT_BY_DEFAULT, default_algorithms, discover_graphs, extra_available
from .ndjson import NdjsonStream, read_rows, row_line
from .rows import (
    CSV_FIELDS,
    FAILED_STATUSES,
    GRAPH_SCHEMA,
    OK_STATUSES,
    ROW_SCHEMA,
    best_rows,
    cell_key,
    graph_stem,
    natural_key,
    sort_rows,
)
from .tasks import Task, algorithm_params, make_tasks

__all__ = ["CAVEAT_MARK", "CSV_FIELDS", "FAILED_STATUSES", "FORMATS", "GRAPH_SCHEMA", "NOT_BY_DEFAULT", "OK_STATUSES",
           "ROW_SCHEMA", "CompareOptions", "CompareResult", "NdjsonStream", "Task", "algorithm_params", "best_rows",
           "caveat_lines", "cell_key", "compare", "default_algorithms", "discover_graphs", "extra_available",
           "failed_row", "format_csv", "format_markdown", "format_table", "graph_stem", "import_ray", "make_tasks",
           "matrix", "natural_key", "phase_limit", "read_rows", "render", "row_line", "run_cell", "run_compare",
           "run_processes", "run_ray", "run_tasks", "sort_rows"]
