"""Pipeline stages of a training graph: ``S`` contiguous cuts of a node
order restricted to the forward pass, the backward and the optimizer
updates following the forward nodes they belong to, so that the stages form
a chain (GPipe, Huang et al., NeurIPS 2019, 2.2: "partition the network into
K cells and place the k-th cell on the k-th accelerator"; Narayanan et al.,
SC'21, 2.2: a stage's forward feeds the next stage, its backward the
previous one).  The schedules over these stages are in
:mod:`celeritas_cli.pipelining.schedules`.

Stage assignment (:func:`stages_from_cuts`)
-------------------------------------------
Given the forward nodes in a topological order (:func:`forward_order`:
CPD-TOPO, Celeritas 5.1.3, or any order) and cut positions ``0 = c_0 < c_1
< ... < c_{S-1} < n_f``, every node is *attributed* to a position of that
order (:func:`attribution`) and takes the stage of the cut that position is
in:

* a forward node: its own position, or the first position of a forward
  node of its colocation group (variables and their readers stay
  together, as the simulator requires);
* an optimizer update: the position of its colocation group's forward node
  (the parameter's reader: an update stays with its parameters), else the
  latest position of what it reads;
* a backward node: the latest position among the forward nodes whose
  tensors it reads (the activations it was saved for, and parameter reads),
  the parameters whose gradients it sends to an update, and the backward
  nodes it feeds (gradients flow to the same or an earlier stage, so a node
  is never attributed below what it feeds: the backward of a cross-attention
  product that reads a key computed stages earlier stays with the
  attention); one with none of these takes the latest position of its
  inputs.

Since the stage of a position is non-decreasing in the position, forward
edges then go to the same or a later stage and backward edges to the same or
an earlier one: :func:`check_chain` verifies it (a colocation group that
spans the order can break it) and raises in one line otherwise.

Balance (:func:`balanced_stages`)
---------------------------------
Each position's load on a device is the time, on that device, of the nodes
attributed to it (forward + backward + update: a stage's whole work).
:func:`balanced_cuts` chooses the cuts minimising the largest stage time,
each stage timed on its own device (mixed clusters: a slower device gets
less work): bisection on the bottleneck ``T`` with the greedy feasibility
test (each stage in turn takes as many positions as fit under ``T`` while
leaving one per remaining stage), which is exact for contiguous cuts with a
fixed stage -> device order.

References
----------
Huang et al., "GPipe", NeurIPS 2019, 2.2; Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC'21, 2.2; Zhang et al., Celeritas, 5.1.3 (CPD-TOPO).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model
from ..model.graph import Graph
from ..transform.passes import node_passes
from ..transform.split_cost import is_update
from ..scheduling.orders import cpd_topo

__all__ = ["StageAssignment", "attribution", "balanced_cuts", "balanced_stages", "check_chain", "forward_order",
           "stage_forward_nodes", "stages_from_cuts"]


@dataclass
class StageAssignment:
    """Stages of a graph: ``stage_of[v]`` for every node, the forward
    ``order`` the cuts are positions of, the ``cuts`` (first position of
    each stage) and the ``stage_time_s`` of each stage on its device (when
    balanced)."""

    stage_of: list[int]
    stages: int
    order: list[int]
    cuts: list[int]
    stage_time_s: list[float] | None = None


def forward_order(graph: Graph, order: Sequence[int] | None = None, costs=None) -> list[int]:
    """The forward nodes of *graph* in *order* (default: CPD-TOPO with
    *costs*, :func:`~.orders.cpd_topo`).

    Raises
    ------
    InvalidInput
        *order* is not a permutation of the graph's nodes in topological order.
    """
    if order is None:
        order = cpd_topo(graph, costs)
    else:
        order = list(order)
        pos = [-1] * graph.n
        for i, v in enumerate(order):
            if not 0 <= v < graph.n or pos[v] != -1:
                raise InvalidInput(f"pipeline: the node order of graph '{graph.name}' is not a permutation of its "
                                   f"nodes")
            pos[v] = i
        if len(order) != graph.n:
            raise InvalidInput(f"pipeline: the node order of graph '{graph.name}' has {len(order)} nodes, the graph "
                               f"{graph.n}")
        if any(pos[src] > pos[dst] for src, dst in zip(graph.edge_src, graph.edge_dst)):
            raise InvalidInput(f"pipeline: the node order of graph '{graph.name}' is not a topological order")
    passes = node_passes(graph)
    return [v for v in order if passes[v] == "forward"]


def attribution(graph: Graph, fwd: Sequence[int]) -> list[int]:
    """The position in *fwd* every node is attributed to (module docstring).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i, p, **kw: {"id": i, "compute_s": 1, "memory_bytes": 0, "pass": p, **kw}
    >>> g = build("c", [nd("f0", "forward", colocation="w0"), nd("f1", "forward", colocation="w1"),
    ...                 nd("b1", "backward"), nd("b0", "backward"),
    ...                 nd("u0", "update", op="optim.sgd", colocation="w0"),
    ...                 nd("u1", "update", op="optim.sgd", colocation="w1")],
    ...           [{"src": "f0", "dst": "f1", "bytes": 1}, {"src": "f1", "dst": "b1", "bytes": 1},
    ...            {"src": "f0", "dst": "b1", "bytes": 1, "tensor": "x"}, {"src": "b1", "dst": "b0", "bytes": 1},
    ...            {"src": "b1", "dst": "u1", "bytes": 1, "tensor": "g"}, {"src": "b0", "dst": "u0", "bytes": 1}])
    >>> attribution(g, [0, 1])
    [0, 1, 1, 0, 0, 1]
    """
    n = graph.n
    passes = node_passes(graph)
    att = [-1] * n
    group_pos: dict[str, int] = {}
    for i, v in enumerate(fwd):
        att[v] = i
        c = graph.colocation[v]
        if c is not None and c not in group_pos:
            group_pos[c] = i
    topo = graph.topo_order()
    forced = [False] * n
    for v in range(n):
        c = graph.colocation[v]
        if c is not None and c in group_pos and passes[v] != "forward":
            att[v], forced[v] = group_pos[c], True
    for v in reversed(topo):  # backward: what it reads and feeds, never below a backward node it feeds
        if passes[v] != "backward" or forced[v]:
            continue
        want = max((att[u] for u in graph.pred[v] if passes[u] == "forward"), default=-1)
        for s in graph.succ[v]:
            if passes[s] == "backward" or (is_update(graph, s) and att[s] >= 0):
                want = max(want, att[s])
        att[v] = want
    for v in topo:  # the rest (updates without a forward node in their group, backward sources): what they read
        if att[v] < 0:
            att[v] = max((att[u] for u in graph.pred[v]), default=len(fwd) - 1)
    return att


def stages_from_cuts(graph: Graph, fwd: Sequence[int], cuts: Sequence[int]) -> list[int]:
    """``stage_of[v]`` for every node of *graph* from *cuts* (the first
    position of each stage in the forward order *fwd*), checked to form a
    chain (:func:`check_chain`).

    Raises
    ------
    InvalidInput
        Cuts that do not start at 0 or are not increasing within the
        order, or stages that do not form a chain.
    """
    cuts = list(cuts)
    if not cuts or cuts[0] != 0 or any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[-1] >= len(fwd):
        raise InvalidInput(f"pipeline: cuts {cuts} must start at 0 and increase within the {len(fwd)} forward nodes "
                           f"of graph '{graph.name}' (every stage needs one)")
    att = attribution(graph, fwd)
    stage_of = [bisect.bisect_right(cuts, a) - 1 for a in att]
    check_chain(graph, stage_of)
    return stage_of


def check_chain(graph: Graph, stage_of: Sequence[int]) -> None:
    """Raise unless every forward edge goes to the same or a later stage and
    every backward edge to the same or an earlier one.

    Raises
    ------
    InvalidInput
        Naming the first edge (in file order) that breaks the chain.
    """
    passes = node_passes(graph)
    for e in range(graph.m):
        s, d = graph.edge_src[e], graph.edge_dst[e]
        a, b = stage_of[s], stage_of[d]
        ps, pd = passes[s], passes[d]
        if (ps == pd == "forward" and b < a) or (ps == pd == "backward" and b > a) or \
                (ps == "backward" and pd == "forward"):
            raise InvalidInput(f"pipeline: the stages of graph '{graph.name}' do not form a chain: {ps} node "
                               f"'{graph.ids[s]}' (stage {a}) feeds {pd} node '{graph.ids[d]}' (stage {b})")


def balanced_cuts(prefix: Sequence[Sequence[float]], stages: int) -> list[int]:
    """Cuts of ``n`` positions into *stages* non-empty contiguous stages
    minimising the largest stage load, where ``prefix[s][i]`` is the load of
    positions ``0..i-1`` on stage ``s``'s device (module docstring).

    >>> balanced_cuts([[0, 1, 2, 3, 4, 5, 6]] * 2, 2), balanced_cuts([[0, 2, 4, 6], [0, 1, 2, 3]], 2)
    ([0, 3], [0, 1])
    """
    n = len(prefix[0]) - 1
    if not 1 <= stages <= n:
        raise InvalidInput(f"pipeline: cannot cut {n} forward nodes into {stages} stages")

    def greedy(t: float) -> list[int] | None:
        cuts, p = [], 0
        for s in range(stages):
            pre = prefix[s]
            cap = n - (stages - 1 - s)
            end = min(bisect.bisect_right(pre, pre[p] + t) - 1, cap) if s < stages - 1 else n
            if end <= p or pre[end] - pre[p] > t * (1 + 1e-12):
                return None
            cuts.append(p)
            p = end
        return cuts

    lo, hi = 0.0, max(pre[n] for pre in prefix[:stages])
    best = greedy(hi)
    for _ in range(100):
        mid = (lo + hi) / 2
        got = greedy(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
    assert best is not None
    return best


def balanced_stages(graph: Graph, cluster: Cluster, stage_devices: Sequence[int | str], *,
                    order: Sequence[int] | None = None, costs: CostModel | None = None,
                    microbatched: Graph | None = None) -> StageAssignment:
    """Stages of *graph* balanced by time, stage ``s`` timed on device
    ``stage_devices[s]`` (module docstring).

    Parameters
    ----------
    graph : Graph
        A training (or inference) graph, not micro-batched.
    cluster : Cluster
    stage_devices : list of int or str
        Device (index or id) of each stage, in pipeline order.
    order : list of int, optional
        A topological order of *graph* (default: CPD-TOPO with the mean
        costs, Celeritas Eq. 1).
    costs : CostModel, optional
    microbatched : Graph, optional
        *graph* micro-batched (:func:`~celeritas_cli.transform.microbatch.microbatch_graph`):
        a node's load is then the time of its copies, gradient
        accumulations and ``weights`` node (what a stage runs), not of the
        node on the whole batch.

    Returns
    -------
    StageAssignment

    Raises
    ------
    InvalidInput
        An unknown device, more stages than forward nodes, or stages that
        do not form a chain.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> nd = lambda i, p, c: {"id": i, "compute_s": c, "memory_bytes": 0, "pass": p}
    >>> g = build("c", [nd("f0", "forward", 1), nd("f1", "forward", 1), nd("f2", "forward", 2),
    ...                 nd("b2", "backward", 2), nd("b1", "backward", 1), nd("b0", "backward", 1)],
    ...           [{"src": "f0", "dst": "f1", "bytes": 1}, {"src": "f1", "dst": "f2", "bytes": 1},
    ...            {"src": "f2", "dst": "b2", "bytes": 1}, {"src": "b2", "dst": "b1", "bytes": 1},
    ...            {"src": "b1", "dst": "b0", "bytes": 1}, {"src": "f1", "dst": "b1", "bytes": 1},
    ...            {"src": "f0", "dst": "b0", "bytes": 1}])
    >>> st = balanced_stages(g, uniform(2), [0, 1])
    >>> st.stage_of, st.stage_time_s
    ([0, 0, 1, 1, 0, 0], [4.0, 4.0])
    """
    costs = cost_model(graph, cluster, costs)
    devs = [_device(cluster, d) for d in stage_devices]
    fwd = forward_order(graph, order, costs)
    att = attribution(graph, fwd)
    timed, dcosts, of = graph, costs, list(range(graph.n))
    if microbatched is not None:
        timed, dcosts = microbatched, costs.for_graph(microbatched)
        of = [graph.index[_origin(microbatched, x)] for x in range(microbatched.n)]
    prefix = []
    for d in devs:
        load = [0.0] * len(fwd)
        for x, v in enumerate(of):
            load[att[v]] += dcosts.node_time(x, d)
        pre = [0.0]
        for x in load:
            pre.append(pre[-1] + x)
        prefix.append(pre)
    cuts = balanced_cuts(prefix, len(devs))
    stage_of = stages_from_cuts(graph, fwd, cuts)
    ends = cuts[1:] + [len(fwd)]
    times = [prefix[s][e] - prefix[s][c] for s, (c, e) in enumerate(zip(cuts, ends))]
    return StageAssignment(stage_of=stage_of, stages=len(devs), order=list(fwd), cuts=cuts, stage_time_s=times)


def stage_forward_nodes(graph: Graph, stage_of: Sequence[int], stages: Sequence[int]) -> list[str]:
    """Ids of the forward nodes of *graph* in *stages*: the ``recompute``
    list that recomputes whole stages (:func:`~.builder.staged_plan`).

    >>> from celeritas_cli.model.graph import build
    >>> g = build("s", [{"id": "a", "compute_s": 1, "memory_bytes": 0, "pass": "forward"},
    ...                 {"id": "b", "compute_s": 1, "memory_bytes": 0, "pass": "backward"}], [])
    >>> stage_forward_nodes(g, [0, 0], [0])
    ['a']
    """
    want = set(stages)
    passes = node_passes(graph)
    return [graph.ids[v] for v in range(graph.n) if stage_of[v] in want and passes[v] == "forward"]


def _origin(derived: Graph, x: int) -> str:
    """The id, in the graph *derived* was micro-batched from, of the node
    *derived*'s node *x* copies or was made from (its own id for a once node)."""
    ex = (derived.node_extra[x] or {}) if derived.node_extra else {}
    origin = ex.get("origin")
    return origin if isinstance(origin, str) else derived.ids[x]


def _device(cluster: Cluster, d: int | str) -> int:
    if isinstance(d, str):
        if d not in cluster.index:
            raise InvalidInput(f"pipeline: cluster '{cluster.name}' has no device '{d}' "
                               f"(it has {', '.join(cluster.ids)})")
        return cluster.index[d]
    if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < cluster.k:
        raise InvalidInput(f"pipeline: device index {d!r} is not one of cluster '{cluster.name}''s 0..{cluster.k - 1}")
    return d
