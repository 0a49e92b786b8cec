"""Layer sequences: a training graph seen as the chain of layers pipeline
planners cut into stages, with the per-layer numbers their cost models
read.  Shared by placer's ``pipeline`` and the peers' rows (``gpipe``,
``pipedream``, ``alpa-stages``), so that every planner sees the same graph
the same way and differs only in how it cuts and judges.

Positions
---------
The forward nodes in a topological *order* (:func:`order_of`: ``"cpd"``,
Celeritas' CPD-TOPO 5.1.3; ``"alap"``, as late as possible - the ready
forward node of largest bottom level first, so a side branch, e.g. a skip
connection or a parameter read, comes just before its consumer and crosses
fewer cuts; ``"topo"``, the file's order, which for a captured model is
the program order a ``nn.Sequential`` user would cut, each weight read or
cast just before its use, :func:`program_order`) are the *positions*
``0 .. n-1``; every node is attributed to one
(:func:`~.pipeline.attribution`: a backward node with the forward nodes it
reads, an update with its parameters), so a contiguous range of positions
is a stage with its forward, backward and update work.

Per position :class:`LayerSequence` keeps prefix sums of

* the time of its nodes per micro-batch, forward and backward apart, on each
  *device class* (devices of one type and speed), at any batch fraction
  ``f`` (:meth:`LayerSequence.times`: the split cost model,
  :func:`~celeritas_cli.transform.split_cost.part_times`, never better than
  linear), and its once-per-step time (optimizer updates and other
  batch-independent nodes);
* its resident bytes (parameters, optimizer state), kept gradients
  (accumulated once per step) and batch-dependent activations (at the whole
  batch; a micro-batch keeps ``f`` of them), the memory terms of the
  time rule (``docs/design.md``, "Node memory");

and, per cut (the boundary before a position), the bytes and the number of
batch-dependent tensors crossing it forward (activations, and saved
activations a later stage's backward reads) and backward (gradients).

Layers
------
Planners whose dynamic programs are quadratic in the chain length (PipeDream,
Alpa) see at most ``L`` *layers* of consecutive positions of about equal
time (:meth:`LayerSequence.layer_bounds`); Alpa clusters operators into
layers of about equal FLOPs the same way (Zheng et al., OSDI'22, 5.2,
"operator clustering"), PipeDream profiles a model's layers.

References
----------
Zhang et al., Celeritas, 5.1.3 (CPD-TOPO); Zheng et al., "Alpa", OSDI'22,
5.2; Narayanan et al., "PipeDream", SOSP'19, 3.1.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import InvalidInput
from ..model.cluster import Cluster
from ..model.costs import CostModel, cost_model, upward_rank
from ..model.graph import Graph
from ..transform.microbatch import declares_resident, once_nodes
from ..transform.passes import node_passes
from ..transform.split_cost import batch_profile, part_times
from ..scheduling.orders import cpd_topo
from .cuts import attribution, forward_order

ORDERS = ("cpd", "alap", "topo")
__all__ = ["ORDERS", "LayerSequence", "Times", "alap_order", "block_partition", "order_of", "program_order"]


def alap_order(graph: Graph, costs: CostModel) -> list[int]:
    """A topological order taking, among the ready nodes, the one of largest
    bottom level (mean node times, no communication), ties by topological
    index: every node as late as possible.

    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> from celeritas_cli.model.costs import cost_model
    >>> nd = lambda i, c: {"id": i, "compute_s": c, "memory_bytes": 0}
    >>> g = build("a", [nd("x", 1), nd("side", 1), nd("y", 5), nd("z", 1)],
    ...           [{"src": "x", "dst": "y", "bytes": 1}, {"src": "y", "dst": "z", "bytes": 1},
    ...            {"src": "side", "dst": "z", "bytes": 1}])
    >>> [g.ids[v] for v in alap_order(g, cost_model(g, uniform(1)))]
    ['x', 'y', 'side', 'z']
    """
    rank = upward_rank(graph, costs.mean_time.__getitem__, lambda e: 0.0)
    topo = graph.topo_index()
    return _ready_first(graph, lambda v: (-rank[v], topo[v]))


def _ready_first(graph: Graph, key) -> list[int]:
    """A topological order taking, among the ready nodes, the one of smallest
    ``key(v)`` (a tuple that ends with a unique tie-break)."""
    need = [len(graph.pred[v]) for v in range(graph.n)]
    heap = [(key(v), v) for v in range(graph.n) if not need[v]]
    heapq.heapify(heap)
    out = []
    while heap:
        v = heapq.heappop(heap)[1]
        out.append(v)
        for s in graph.succ[v]:
            need[s] -= 1
            if not need[s]:
                heapq.heappush(heap, (key(s), s))
    return out


def program_order(graph: Graph) -> list[int]:
    """The graph's own topological order (the file's, the program order of
    a captured model), with every once-per-step node (a weight read, a cast
    of master weights to half precision; :func:`~celeritas_cli.transform.microbatch.once_nodes`)
    moved to just before the first node that needs it - as an eager program
    casts a layer's weights when the layer runs, where a trace may list all
    casts first.

    >>> from celeritas_cli.model.graph import build
    >>> nd = lambda i: {"id": i, "compute_s": 1, "memory_bytes": 0}
    >>> g = build("p", [nd("x"), {**nd("w2"), "op": "weights"}, nd("a"), nd("b")],
    ...           [{"src": "x", "dst": "a", "bytes": 1}, {"src": "a", "dst": "b", "bytes": 1},
    ...            {"src": "w2", "dst": "b", "bytes": 1}], meta={"batch_size": 2})
    >>> [g.ids[v] for v in program_order(g)]
    ['x', 'a', 'w2', 'b']
    """
    topo = graph.topo_index()
    once = [x or not graph.pred[v] for v, x in enumerate(once_nodes(graph))]
    key = list(topo)
    for v in reversed(graph.topo_order()):
        if once[v] and graph.succ[v]:
            key[v] = min(key[s] for s in graph.succ[v])
    return _ready_first(graph, lambda v: (key[v], not once[v], topo[v]))


def order_of(graph: Graph, name: str, costs: CostModel) -> list[int]:
    """The topological order called *name* (one of :data:`ORDERS`)."""
    if name == "cpd":
        return cpd_topo(graph, costs)
    if name == "alap":
        return alap_order(graph, costs)
    if name == "topo":
        return program_order(graph)
    raise InvalidInput(f"pipeline: unknown node order '{name}' (known: {', '.join(ORDERS)})")


def times_at(graph: Graph, costs: CostModel, cluster: Cluster, v: int, f: float, devices: Sequence[int],
             once: bool = False) -> list[float]:
    """Time of node *v* of *graph* on each of *devices* at batch fraction
    *f*: the cost model's at the whole batch and for a node that runs once
    per step (*once*), else :func:`~celeritas_cli.transform.split_cost.part_times`,
    as the micro-batch transform times a copy."""
    if f >= 1.0 or once:
        return [costs.node_time(v, d) for d in devices]
    t, by = part_times(graph, v, f)
    out = []
    for d in devices:
        dev = cluster.devices[d]
        out.append(by[dev.type] if by and dev.type in by else t / dev.speed)
    return out


@dataclass
class Times:
    """Prefix sums over positions, per device class, of the forward time
    ``fwd`` and backward time ``bwd`` of one micro-batch (batch fraction
    ``f``), of the part ``wgrad`` of the backward that only computes weight
    gradients (backward nodes whose every consumer runs once per step, an
    optimizer update: the previous stage does not wait for them), of the
    once-per-step time ``once`` and of its part in the forward pass,
    ``head`` (e.g. casting master weights to half precision: a stage runs
    it before its first micro-batch)."""

    f: float
    fwd: list[list[float]]
    bwd: list[list[float]]
    once: list[list[float]]
    wgrad: list[list[float]] | None = None
    head: list[list[float]] | None = None

    def head_time(self, c: int, a: int, b: int) -> float:
        """The once-per-step forward work of positions ``a .. b-1``."""
        return self.head[c][b] - self.head[c][a] if self.head is not None else 0.0

    def weight_gradients(self, c: int, a: int, b: int) -> float:
        """The weight-gradient part of the backward of positions ``a .. b-1``."""
        return self.wgrad[c][b] - self.wgrad[c][a] if self.wgrad is not None else 0.0

    def stage(self, c: int, a: int, b: int) -> tuple[float, float, float]:
        """``(forward, backward, once)`` time of positions ``a .. b-1`` on class *c*."""
        return (self.fwd[c][b] - self.fwd[c][a], self.bwd[c][b] - self.bwd[c][a],
                self.once[c][b] - self.once[c][a])


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in values:
        out.append(out[-1] + x)
    return out


class LayerSequence:
    """The positions of *graph* in a forward *order* with their prefix sums
    (module docstring).

    Parameters
    ----------
    graph : Graph
    cluster : Cluster
    costs : CostModel, optional
    order : str or list of int
        One of :data:`ORDERS`, or a topological order of *graph*.
    share : LayerSequence, optional
        Another sequence of the same graph and cluster whose node times
        (the costly part) this one reuses.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> nd = lambda i, p, c, mem=0: {"id": i, "compute_s": c, "memory_bytes": mem, "pass": p}
    >>> g = build("c", [nd("f0", "forward", 1, 8), nd("f1", "forward", 2, 8), nd("b1", "backward", 4),
    ...                 nd("b0", "backward", 2)],
    ...           [{"src": "f0", "dst": "f1", "bytes": 8}, {"src": "f1", "dst": "b1", "bytes": 8},
    ...            {"src": "b1", "dst": "b0", "bytes": 8}, {"src": "f0", "dst": "b0", "bytes": 8}],
    ...           meta={"batch_size": 4})
    >>> seq = LayerSequence(g, uniform(2), order="topo")
    >>> seq.n, seq.times(1.0).stage(0, 0, 1), seq.times(1.0).stage(0, 1, 2)
    (2, (1.0, 2.0, 0.0), (2.0, 4.0, 0.0))
    >>> seq.cross_fwd, seq.cross_bwd
    ([0, 8, 0], [0, 8, 0])
    """

    def __init__(self, graph: Graph, cluster: Cluster, costs: CostModel | None = None,
                 order: str | Sequence[int] = "cpd", share: "LayerSequence | None" = None):
        self.graph, self.cluster = graph, cluster
        self.costs = cost_model(graph, cluster, costs)
        self.order_name = order if isinstance(order, str) else "given"
        topo = order_of(graph, order, self.costs) if isinstance(order, str) else list(order)
        self.fwd = forward_order(graph, topo, self.costs)
        if not self.fwd:
            raise InvalidInput(f"pipeline: graph '{graph.name}' has no forward node to cut into stages")
        self.n = len(self.fwd)
        self.att = attribution(graph, self.fwd)
        keys = [(d.type, d.speed) for d in cluster.devices]
        self.class_keys = list(dict.fromkeys(keys))
        self.class_of = [self.class_keys.index(x) for x in keys]
        self.class_device = [self.class_of.index(c) for c in range(len(self.class_keys))]
        self.time_rule = declares_resident(graph)
        self.passes = node_passes(graph)
        self.once = once_nodes(graph)
        self.wgrad_node = self._weight_gradient_nodes()
        prof = batch_profile(graph)
        n = self.n
        res, grad, act, fact = [0] * n, [0] * n, [0] * n, [0] * n
        for v in range(graph.n):
            a = self.att[v]
            ex = (graph.node_extra[v] or {}) if graph.node_extra else {}
            fixed = prof.fixed_memory[v]
            r = min(int(ex.get("resident_bytes", graph.memory[v])), graph.memory[v]) if self.time_rule \
                else graph.memory[v]
            if self.once[v]:
                res[a] += graph.memory[v] if not self.time_rule else r
                continue
            res[a] += min(r, fixed)
            grad[a] += max(0, fixed - min(r, fixed))
            act[a] += graph.memory[v] - fixed
            if self.passes[v] == "forward":
                fact[a] += graph.memory[v] - fixed
        self.resident, self.gradients = _prefix(res), _prefix(grad)
        self.activation, self.forward_activation = _prefix(act), _prefix(fact)
        self.cross_fwd, self.cross_bwd, self.fixed_cross, self.count_fwd, self.count_bwd = self._crossings(prof)
        self._times: dict[float, Times] = {}
        self._node_times: dict[float, list[list[float]]] = share._node_times if share is not None else {}

    def _weight_gradient_nodes(self) -> list[bool]:
        """Backward nodes none of whose results flows, through the backward
        pass, to an earlier position: weight gradients and what only they
        need (an earlier stage never waits for them)."""
        g, att, passes, once = self.graph, self.att, self.passes, self.once
        feeds = [False] * g.n  # v's results reach a backward node at an earlier position
        for v in reversed(g.topo_order()):
            if passes[v] != "backward" or once[v]:
                continue
            feeds[v] = any(passes[s] == "backward" and not once[s] and (att[s] < att[v] or feeds[s])
                           for s in g.succ[v])
        return [passes[v] == "backward" and not once[v] and not feeds[v] for v in range(g.n)]

    def _crossings(self, prof) -> tuple[list[int], ...]:
        """Per cut: bytes of batch-dependent tensors crossing it forward and
        backward, bytes of batch-independent ones (parameter reads) crossing
        it forward, and the number of batch-dependent tensors crossing it
        forward and backward (each a transfer, a link latency)."""
        n, g = self.n, self.graph
        diffs = [[0] * (n + 1) for _ in range(5)]  # fw, bw, fx bytes; fw, bw tensors
        cons = g.tensor_consumers()
        for t, p in enumerate(g.tensor_src):
            a = self.att[p]
            ats = [self.att[d] for d in cons[t]]
            if not ats:
                continue
            hi, lo = max(ats), min(ats)
            fixed = prof.fixed_tensor[t]
            for which, x in ((2 if fixed else 0, g.tensor_bytes[t]), (None if fixed else 3, 1)):
                if hi > a and which is not None:  # cuts a+1 .. hi
                    diffs[which][a + 1] += x
                    diffs[which][hi + 1] -= x
            if lo < a and not fixed:  # cuts lo+1 .. a
                for which, x in ((1, g.tensor_bytes[t]), (4, 1)):
                    diffs[which][lo + 1] += x
                    diffs[which][a + 1] -= x
        out = []
        for arr in diffs:
            run, acc = 0, []
            for x in arr:
                run += x
                acc.append(run)
            acc[0] = 0
            acc[n] = 0
            out.append(acc)
        return tuple(out)

    # ------------------------------------------------------------------ times
    def node_times(self, v: int, f: float) -> list[float]:
        """Time of node *v* on each device class at batch fraction *f*
        (:func:`times_at`)."""
        return times_at(self.graph, self.costs, self.cluster, v, f, self.class_device, self.once[v])

    def times(self, f: float) -> Times:
        """The :class:`Times` of micro-batches of batch fraction *f* (cached)."""
        key = round(f, 12)
        if key not in self._times:
            n, k = self.n, len(self.class_keys)
            fw = [[0.0] * n for _ in range(k)]
            bw = [[0.0] * n for _ in range(k)]
            on = [[0.0] * n for _ in range(k)]
            wg = [[0.0] * n for _ in range(k)]
            hd = [[0.0] * n for _ in range(k)]
            per = self._node_times.get(key)
            if per is None:
                per = self._node_times[key] = [self.node_times(v, f) for v in range(self.graph.n)]
            for v in range(self.graph.n):
                a = self.att[v]
                arr = on if self.once[v] else fw if self.passes[v] == "forward" else bw
                for c, x in enumerate(per[v]):
                    arr[c][a] += x
                    if self.wgrad_node[v]:
                        wg[c][a] += x
                    if self.once[v] and self.passes[v] == "forward":
                        hd[c][a] += x
            self._times[key] = Times(f, [_prefix(x) for x in fw], [_prefix(x) for x in bw],
                                     [_prefix(x) for x in on], [_prefix(x) for x in wg], [_prefix(x) for x in hd])
        return self._times[key]

    # ----------------------------------------------------------------- memory
    def memory(self, a: int, b: int, f: float, in_flight: int, recompute: bool = False) -> int:
        """Bytes a device running positions ``a .. b-1`` holds at its peak
        with *in_flight* micro-batches of fraction *f* between their forward
        and their backward: resident state + one gradient buffer + the
        in-flight activations, each micro-batch also holding what it
        received across the stage's first cut.  *recompute*: only the
        received input is kept per micro-batch (Chen et al. 2016's
        checkpoint), plus one micro-batch's activations while its backward
        recomputes them.  A graph judged by the static rule holds every
        micro-batch's activation (*in_flight* is ignored)."""
        res = self.resident[b] - self.resident[a]
        grad = self.gradients[b] - self.gradients[a]
        act = self.activation[b] - self.activation[a]
        recv = self.cross_fwd[a] + self.fixed_cross[a]
        if not self.time_rule:
            return res + grad + act + recv
        per = math.ceil(f * (self.cross_fwd[a]))
        if recompute:
            keep = act - (self.forward_activation[b] - self.forward_activation[a])
            return res + grad + self.fixed_cross[a] + in_flight * (per + math.ceil(f * keep)) + math.ceil(f * act)
        return res + grad + self.fixed_cross[a] + in_flight * (per + math.ceil(f * act))

    # ----------------------------------------------------------------- layers
    def layer_bounds(self, layers: int) -> list[int]:
        """Positions grouped into at most *layers* contiguous layers of about
        equal time (whole batch, mean over device classes): ``bounds[l]`` is
        the first position of layer ``l``, ``bounds[-1] = n``.

        >>> from celeritas_cli.model.generate import layered
        >>> from celeritas_cli.model.cluster import uniform
        >>> b = LayerSequence(layered(60, seed=1), uniform(2)).layer_bounds(8)
        >>> b[0], len(b) <= 9, b == sorted(set(b))
        (0, True, True)
        """
        t = self.times(1.0)
        k = len(self.class_keys)
        total = [sum((t.fwd[c][p + 1] - t.fwd[c][p]) + (t.bwd[c][p + 1] - t.bwd[c][p]) + (t.once[c][p + 1] -
                                                                                         t.once[c][p])
                     for c in range(k)) / k for p in range(self.n)]
        if layers >= self.n:
            return list(range(self.n + 1))
        pre = _prefix(total)
        out = [0]
        for i in range(1, layers):
            p = bisect.bisect_left(pre, pre[-1] * i / layers)
            p = min(max(p, out[-1] + 1), self.n - (layers - i))
            out.append(p)
        out.append(self.n)
        return sorted(set(out))


def block_partition(sequence: Sequence[float], parts: int) -> list[int]:
    """Cut *sequence* into *parts* contiguous non-empty blocks of about equal
    sums: the block partition of Bárány and Grinberg ("Block partitions of
    sequences", Israel J. Math. 206, 2015; arXiv:1308.2452, section 2) that
    torchgpipe's ``balance_by_time`` uses (``torchgpipe/balance/blockpartition.py``):
    values normalised to ``[0, 1]``, equal-length blocks to start, then
    repeatedly the smallest block nearest to a largest one takes the
    neighbouring element on the largest block's side (torchgpipe takes the
    first smallest block, the paper the one closest to the largest), until the largest
    block exceeds the smallest by at most one normalised unit (the largest
    element).  Returns the first index of each block.

    >>> block_partition([1, 1, 1, 1, 8, 1, 1, 1], 2)
    [0, 4]
    >>> block_partition([5, 1, 1, 1], 2)  # a heuristic: the exact min-max cut is [0, 1]
    [0, 2]
    """
    n = len(sequence)
    if not 1 <= parts <= n:
        raise InvalidInput(f"pipeline: cannot cut {n} layers into {parts} blocks")
    lo = min(sequence)
    span = max(sequence) - lo
    norm = [0.0 if span == 0 else (x - lo) / span for x in sequence]
    pre = _prefix(norm)
    splits = [n // parts * (i + 1) for i in range(parts - 1)] + [n]

    def size(i: int) -> float:
        return pre[splits[i]] - pre[splits[i - 1] if i > 0 else 0]

    for _ in range(4 * n * parts + 16):  # the paper's bound on moves is polynomial; this one is generous
        big, p = max((size(i), i) for i in range(parts))
        while True:
            small = min(size(i) for i in range(parts))
            if big <= small + 1:
                return [0] + splits[:-1]
            q = min(i for i in range(parts) if size(i) == small)  # torchgpipe: the first smallest
            if p < q:
                h = q - 1
                splits[h] -= 1
            else:
                h = q + 1
                splits[q] += 1
            if p == h:
                break
    return [0] + splits[:-1]
