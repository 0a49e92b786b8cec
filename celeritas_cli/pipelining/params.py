"""The pipeline parameters, declared once: the micro-batch count
(``-p microbatches=``; ``n_microbatches`` in code, as
``torch.distributed.pipelining``), the schedule and activation
recomputation.  Every pipeline planner
(:mod:`celeritas_cli.algorithms.pipelines`) registers these
:class:`~celeritas_cli.model.params.Param` objects and reads its defaults
from here.

The micro-batch count ``0`` means "the planner's rule", one rule per kind
of planner, both here:

* the ``pipeline`` search tries :data:`SEARCHED_MICROBATCHES` micro-batches
  per replica pipeline (whole samples each);
* the peers' rows (``gpipe``, ``pipedream``, ``alpa-stages``) run
  :func:`step_microbatches`: ``4 K`` micro-batches for the step on ``K``
  devices (GPipe, Huang et al. 2019, 4: "the bubble overhead is negligible
  when M >= 4 x K"; :data:`MICROBATCHES_PER_DEVICE`), at most the batch.
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..model.limits import COUNT_MAX
from ..model.params import Param
from ..transform.microbatch import microbatch_size
from ..transform.size import Size
from .schedules import SCHEDULES

#: GPipe 4 (M >= 4 K): the peers' micro-batches per device when ``microbatches`` is 0
MICROBATCHES_PER_DEVICE = 4
#: the micro-batch counts (per replica pipeline) the ``pipeline`` search tries when ``microbatches`` is 0
SEARCHED_MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
#: ``recompute``: ``auto`` recomputes a stage's activations only where it does not fit otherwise
RECOMPUTE_CHOICES = ("auto", "off", "on")
#: the value of ``schedule`` and ``recompute`` that leaves the choice to the search
AUTO = "auto"



def microbatched_size(graph, n_microbatches: int) -> Size:
    """The smallest derived graph *n_microbatches* micro-batches make (the
    micro-batched graph, before replicas): the micro-batch parameter's
    ``size``, so the registry refuses ``-p microbatches=10000000`` before
    anything runs."""
    return Size(*microbatch_size(graph, n_microbatches))


N_MICROBATCHES = Param(int, 0, "micro-batches, whole samples each; 0 = the planner's rule (pipeline: searched, "
                               f"{SEARCHED_MICROBATCHES[0]}..{SEARCHED_MICROBATCHES[-1]} per replica; gpipe, "
                               f"pipedream, alpa-stages: {MICROBATCHES_PER_DEVICE} x devices for the step, GPipe's "
                               "M >= 4K), at most the batch", min=0, max=COUNT_MAX, size=microbatched_size)
SCHEDULE = Param(str, AUTO, f"pipeline schedule ({', '.join(s.title for s in SCHEDULES.values())}); {AUTO} = "
                            "searched", choices=(AUTO, *SCHEDULES))
RECOMPUTE = Param(str, AUTO, f"activation recomputation: {AUTO} = only where a stage does not fit otherwise",
                  choices=RECOMPUTE_CHOICES)


def step_microbatches(requested: int, batch: int, k: int) -> int:
    """The micro-batches of the step for the peers' rows: *requested*, or
    ``4 k`` (GPipe's ``M >= 4 K`` with ``K`` = *k* devices), at most the
    *batch*.

    Raises
    ------
    InvalidInput
        More micro-batches requested than samples.

    >>> step_microbatches(0, 256, 4), step_microbatches(0, 16, 8), step_microbatches(6, 256, 4)
    (16, 16, 6)
    """
    if requested > batch:
        raise InvalidInput(f"parameter microbatches: {requested} micro-batches need at least as many samples; the "
                           f"batch is {batch}")
    return requested or min(MICROBATCHES_PER_DEVICE * k, batch)
