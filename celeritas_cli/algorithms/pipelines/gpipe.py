"""``gpipe``: GPipe as torchgpipe runs it - the layer sequence cut into one
stage per device by ``balance_by_time``, ``m`` micro-batches in GPipe's
schedule, activations re-materialised.

GPipe (Huang et al., NeurIPS'19): "partition the network into K cells and
place the k-th cell on the k-th accelerator" (2.2), the mini-batch split
into M micro-batches that run all forwards and then all backwards, the
gradients accumulated and applied once (2.2), and re-materialisation: each
accelerator keeps only its cell's input activations and recomputes the rest
in the backward (2.3).  Its objective is balance: "minimize the variance in
the estimated costs of all cells" (2.2), and the bubble is negligible when
``M >= 4 K`` (4).

torchgpipe (Kim et al., "torchgpipe: On-the-fly Pipeline Parallelism for
Training Giant Models", 2020; ``torchgpipe.balance.balance_by_time``)
profiles the elapsed forward time of each layer of an ``nn.Sequential``
on one device and cuts the sequence with the block partition of Bárány and
Grinberg (:func:`~celeritas_cli.pipelining.layers.block_partition`); it
checkpoints every micro-batch but the last by default
(``checkpoint="except_last"``).

This row, on placer's graph:

* the layers are the forward operators in the graph's own topological order
  (the program order a ``nn.Sequential`` user cuts), each with the backward
  and update work attributed to it
  (:class:`~celeritas_cli.pipelining.layers.LayerSequence`); a layer's
  time is its forward time on the cluster's first device, as
  ``profile_times`` measures it - backward and optimizer work are not
  balanced, as in torchgpipe;
* ``K`` = the cluster's devices, stage ``k`` on the ``k``-th device;
  ``M`` = ``-p microbatches`` or ``4 K`` (at most the batch;
  :func:`~celeritas_cli.pipelining.params.step_microbatches`), in
  :data:`~celeritas_cli.pipelining.schedules.GPIPE`'s schedule;
* ``-p checkpoint``: ``except_last`` (default), ``always`` or ``never``;
  recomputation covers the forward nodes whose activations only their own
  stage's backward reads (:func:`~celeritas_cli.pipelining.schedules.recomputable`).

Assumptions and what placer does about them: identical devices (the cut
ignores that a slower or smaller device gets the same share), a chain of
layers (a DAG is cut along one topological order; skip connections cross
cuts), no traffic and no memory in the balance; placer's simulator judges
the plan with the real device speeds, memory over time and link
bandwidths, as every row.
"""

from __future__ import annotations

from ...model.cluster import Cluster
from ...model.costs import CostModel, cost_model
from ...model.graph import Graph
from ...model.placement import Placement
from ...registry import ASSUME_BATCH, Param, register
from ...pipelining.cuts import stages_from_cuts
from ...pipelining.builder import check_pipelinable
from ...pipelining.layers import LayerSequence, block_partition
from ...pipelining.params import N_MICROBATCHES, step_microbatches
from ...pipelining.schedules import GPIPE
from ...transform.batch import declared_batch
from .rows import realise

CHECKPOINTS = ("except_last", "always", "never")
#: the registry's name of this row (the algorithm; its schedule is GPIPE's)
ALGORITHM = "gpipe"


@register(ALGORITHM, paper="GPipe (Huang et al., NeurIPS 2019) as torchgpipe (Kim et al. 2020)",
          section="2.2-2.3, 4; torchgpipe balance_by_time (block partition)",
          summary="GPipe: the layer sequence cut into one stage per device balancing the layers' forward times "
                  "(torchgpipe's balance_by_time), M = 4K micro-batches, all forwards then all backwards, "
                  "activations recomputed; identical devices and a chain of layers assumed.",
          params={"microbatches": N_MICROBATCHES,
                  "checkpoint": Param(str, "except_last", "torchgpipe's re-materialisation: except_last, always, "
                                                          "never", choices=CHECKPOINTS),
                  "assume_batch": ASSUME_BATCH})
def gpipe(graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
          microbatches: int = N_MICROBATCHES.default,
          checkpoint: str = "except_last", assume_batch: int = 0) -> Placement:
    """GPipe's plan of *graph* on *cluster* (module docstring).

    Parameters
    ----------
    graph : Graph
        A training graph that declares its batch.
    cluster : Cluster
    seed : int
        Unused (deterministic).
    costs : CostModel, optional
    microbatches : int
        ``M``; 0 = ``4 K``.
    checkpoint : str
        ``except_last``, ``always`` or ``never``.
    assume_batch : int
        The batch of a graph that declares none.

    Returns
    -------
    Placement
        The GPipe pipeline over the derived graph, judged by the simulator
        (``makespan_s``, ``status``); ``balance`` lists the layers per stage.

    Raises
    ------
    InvalidInput
        A coarse graph (:func:`~celeritas_cli.pipelining.builder.check_pipelinable`), a graph without a batch, fewer forward operators than devices, or a
        cut whose stages do not form a chain.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = gpipe(layered(60, seed=1), uniform(2), assume_batch=32)
    >>> p.estimate["schedule"], p.estimate["microbatches"], len(p.estimate["balance"])
    ('gpipe', 8, 2)
    """
    check_pipelinable(graph)
    costs = cost_model(graph, cluster, costs)
    batch = declared_batch(graph, assume_batch or None, what="GPipe's micro-batches")
    seq = LayerSequence(graph, cluster, costs, order="topo")
    times = seq.times(1.0)
    c = seq.class_of[0]
    forward = [times.fwd[c][i + 1] - times.fwd[c][i] for i in range(seq.n)]
    K = min(cluster.k, seq.n)
    cuts = block_partition(forward, K)
    stage_of = stages_from_cuts(graph, seq.fwd, cuts)
    n_microbatches = step_microbatches(microbatches, batch, cluster.k)
    ids = [] if checkpoint == "never" else [graph.ids[v] for v in seq.fwd]
    balance = [b - a for a, b in zip(cuts, cuts[1:] + [seq.n])]
    est = {"balance": balance, "checkpoint": checkpoint, "objective": "balance of the layers' forward times "
           "(torchgpipe balance_by_time, block partition)"}
    return realise(graph, cluster, costs, stage_of, [1] * K, n_microbatches, batch, GPIPE, recompute=ids,
                   except_last=checkpoint == "except_last", assume_batch=assume_batch or None, algorithm=ALGORITHM,
                   params={"microbatches": n_microbatches, "checkpoint": checkpoint}, estimate=est)
