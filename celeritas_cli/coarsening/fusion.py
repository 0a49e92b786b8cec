"""Moirai's operator-fusion coarsening (Moirai III-B, Algorithm 1).

Zhang et al., "Moirai: Towards optimal placement for distributed inference
on heterogeneous devices", section III-B "Graph Coarsening": an inference
backend fuses operator sequences matching *fusion rules* (ordered lists of
operator types; Table I: ``conv, bn`` / ``conv, bn, relu`` /
``conv, bn, add, relu``), and fused operators should be placed together.
Only *direct* connections (u's single output goes to v) and *multi-input*
connections (v has other inputs too) may be fused, never a *multi-output*
one (u's output also feeds another operator) - III-B, after [39].

Our reading of Algorithm 1 (the text gives its functions, not code):

* Visit nodes in topological order (the DFS of Algorithm 1 only needs
  each node once, before its successors); at an unfused node ``u0`` try
  the rules longest first (ties by rule order) and fuse the first that
  matches a path ``u0 -> u1 -> ... -> u_{L-1}`` where every ``u_i`` is
  unfused, has the rule's i-th type, and every ``u_i`` with ``i < L-1``
  has exactly one successor (so each link is a direct or multi-input
  connection; ``u_{i+1}`` may have other predecessors).
* Such a path cannot create a cycle: any other path from ``u_i`` leaves
  through its only out-edge, i.e. along the path itself.  The result is
  re-checked with :func:`celeritas_cli.transform.contract.is_acyclic`.

Op types match on the last dotted component of the node's ``op`` (or
the one before it, for overload names like "aten.add.Tensor"),
lower-cased, ignoring a leading namespace ("aten.convolution" ->
"convolution") and trailing underscores (in-place "relu_"), and through
aliases: ``conv`` matches convolution/_convolution/conv1d/conv2d/conv3d/
cudnn_convolution/mkldnn_convolution, ``bn`` matches batch_norm/
native_batch_norm/_native_batch_norm_legit(_no_training)/
cudnn_batch_norm/batchnorm/fusedbatchnorm(v3), ``add`` matches add/addv2,
``relu`` matches relu/relu6; any other rule element must equal the type.
Backward ops ("convolution_backward") match nothing.

The rules come from the ``rules`` parameter: a JSON list of lists of
types, given inline or as a path to a JSON file; default Table I.

When nothing is fused, :func:`why_nothing_fused` says why on stderr.  The
usual reason is a training graph: every forward output is also saved for
the backward pass (conv -> bn and conv -> convolution_backward), so each
link a rule would fuse is a multi-output connection, which III-B never fuses
- Moirai fuses inference graphs.
"""

from __future__ import annotations

import json
import os

from ..errors import InvalidInput
from ..log import warn
from ..model.cluster import Cluster
from ..model.costs import CostModel
from ..model.graph import Graph
from ..registry import Param, register_coarsener
from ..transform.contract import contract, is_acyclic

DEFAULT_RULES: list[list[str]] = [["conv", "bn"], ["conv", "bn", "relu"], ["conv", "bn", "add", "relu"]]

ALIASES: dict[str, frozenset[str]] = {
    "conv": frozenset({"conv", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
                       "cudnn_convolution", "mkldnn_convolution"}),
    "bn": frozenset({"bn", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "batchnorm",
                     "fusedbatchnorm", "fusedbatchnormv3"}),
    "add": frozenset({"add", "addv2"}),
    "relu": frozenset({"relu", "relu6"}),
}


def op_type(op: str) -> str:
    """Normalised type of an op name: last dotted component, lower case,
    trailing underscores removed.

    >>> op_type("aten.native_batch_norm"), op_type("relu_"), op_type("torch.ops.aten.add.Tensor")
    ('native_batch_norm', 'relu', 'tensor')
    """
    return op.rsplit(".", 1)[-1].lower().rstrip("_") or op.lower()


def matches(element: str, op: str) -> bool:
    """Whether a rule element (``conv``, ``bn``, ...) matches op name *op*
    (its last dotted component, or the one before it, for overload names
    such as ``aten.add.Tensor``).

    >>> matches("bn", "aten.native_batch_norm"), matches("add", "aten.add.Tensor"), matches("conv", "aten.mm")
    (True, True, False)
    """
    el = element.lower()
    names = ALIASES.get(el, frozenset({el}))
    parts = op.split(".")
    return any(op_type(x) in names for x in parts[-2:] if x)


def parse_rules(rules: str | None) -> list[list[str]]:
    """The rule list from a JSON string or a path to a JSON file (None: Table I)."""
    if rules is None or rules == "":
        return [list(r) for r in DEFAULT_RULES]
    text = rules
    source = "rules"
    if not rules.lstrip().startswith("[") and os.path.exists(rules):
        source = rules
        with open(rules, encoding="utf-8") as fh:
            text = fh.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"coarsening 'fusion' parameter {source}: not valid JSON ({exc.msg}); give a list of "
                           f"op-type lists, e.g. '[[\"conv\",\"bn\"]]', or a path to such a file") from None
    if not isinstance(doc, list) or not all(
            isinstance(r, list) and len(r) >= 2 and all(isinstance(x, str) and x for x in r) for r in doc):
        raise InvalidInput(f"coarsening 'fusion' parameter {source}: must be a list of lists of at least two "
                           f"op-type strings, e.g. [[\"conv\",\"bn\"],[\"conv\",\"bn\",\"relu\"]]")
    return [list(r) for r in doc]


def fusion_clusters(graph: Graph, rules: list[list[str]]) -> tuple[list[int], int]:
    """``(cluster_of, number of fused groups)`` under the fusion rules."""
    n = graph.n
    order = sorted(range(len(rules)), key=lambda i: (-len(rules[i]), i))
    group = [-1] * n
    fused = 0
    for u0 in graph.topo_order():
        if group[u0] >= 0:
            continue
        for ri in order:
            rule = rules[ri]
            path = [u0]
            ok = matches(rule[0], graph.op[u0])
            while ok and len(path) < len(rule):
                u = path[-1]
                if len(graph.succ[u]) != 1:  # a multi-output connection is never fused
                    ok = False
                    break
                v = graph.succ[u][0]
                if group[v] >= 0 or not matches(rule[len(path)], graph.op[v]):
                    ok = False
                    break
                path.append(v)
            if ok:
                for v in path:
                    group[v] = u0
                fused += 1
                break
    cluster_of = [-1] * n
    number: dict[int, int] = {}
    for v in graph.topo_order():
        key = group[v] if group[v] >= 0 else v
        if key not in number:
            number[key] = len(number)
        cluster_of[v] = number[key]
    return cluster_of, fused


def why_nothing_fused(graph: Graph, rules: list[list[str]]) -> str:
    """The reason no rule matched, for a graph where :func:`fusion_clusters`
    fused nothing: no op of a rule's first type, or every path the rules
    would fuse leaves through a multi-output connection (a training graph).

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> g = build("t", [{"id": "c", "op": "aten.convolution", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "b", "op": "aten.native_batch_norm", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "cb", "op": "aten.convolution_backward", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "c", "dst": "b", "bytes": 1}, {"src": "c", "dst": "cb", "bytes": 1}])
    >>> print(why_nothing_fused(g, DEFAULT_RULES))  # doctest: +ELLIPSIS
    fusion fused nothing: 1 conv->bn link is a multi-output connection ... In a training graph ...
    """
    heads = [v for v in range(graph.n) if any(matches(r[0], graph.op[v]) for r in rules)]
    first = sorted({r[0] for r in rules})
    if not heads:
        return (f"fusion fused nothing: no op of the rules' first type ({', '.join(first)}) in {graph.name}; "
                f"give rules for its ops, e.g. -p rules='[[\"mm\",\"add\"]]', or use --method cpd")
    blocked: dict[str, int] = {}
    for v in heads:
        for r in rules:
            if matches(r[0], graph.op[v]) and len(graph.succ[v]) > 1 \
                    and any(matches(r[1], graph.op[w]) for w in graph.succ[v]):
                link = f"{r[0]}->{r[1]}"
                blocked[link] = blocked.get(link, 0) + 1
                break
    if not blocked:
        return (f"fusion fused nothing: {len(heads)} ops of the rules' first type ({', '.join(first)}) but no "
                f"op sequence of a rule follows them in {graph.name}")
    links = ", ".join(f"{n} {k}" for k, n in sorted(blocked.items(), key=lambda kv: -kv[1]))
    one = sum(blocked.values()) == 1
    training = graph.meta.get("phase") == "training" or any("backward" in op for op in graph.op)
    why = (" In a training graph every forward output is also saved for the backward pass, so fusion (for "
           "inference graphs) finds nothing: profile with --phase inference, or use --method cpd."
           if training else "")
    return (f"fusion fused nothing: {links} link{' is a' if one else 's are'} multi-output "
            f"connection{'' if one else 's'} (the first op's output also feeds another op), which Moirai III-B "
            f"never fuses.{why}")


@register_coarsener("fusion", paper="Moirai", section="III-B Graph Coarsening, Table I, Algorithm 1",
                    summary="Fuse op-type sequences (conv+bn[+add]+relu) over direct/multi-input links only.",
                    params={"rules": Param(str, None, "fusion rules: JSON list of op-type lists, or a JSON file")})
def fusion(graph: Graph, cluster: Cluster, *, costs: CostModel | None = None, rules: str | None = None) -> Graph:
    """Coarsen *graph* by Moirai's operator fusion rules (module docstring).

    Parameters
    ----------
    graph : Graph
    cluster : Cluster
        Unused (fusion is structural); part of the coarsener signature.
    rules : str, optional
        JSON list of op-type lists (inline or a file path); default Table I.

    Returns
    -------
    Graph
        The coarse graph (``meta.coarsening = "fusion"``, ``meta.fused_groups``);
        when nothing was fused, stderr says why (:func:`why_nothing_fused`).

    Raises
    ------
    InvalidInput
        Malformed rules.

    References
    ----------
    Moirai section III-B, Table I and Algorithm 1.

    Example
    -------
    >>> from celeritas_cli.model.graph import build
    >>> from celeritas_cli.model.cluster import uniform
    >>> g = build("f", [{"id": "c", "op": "aten.convolution", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "b", "op": "aten.native_batch_norm", "compute_s": 1, "memory_bytes": 0},
    ...                 {"id": "r", "op": "aten.relu", "compute_s": 1, "memory_bytes": 0}],
    ...           [{"src": "c", "dst": "b", "bytes": 1}, {"src": "b", "dst": "r", "bytes": 1}])
    >>> fusion(g, uniform(2)).members
    [['c', 'b', 'r']]
    """
    parsed = parse_rules(rules)
    cluster_of, fused = fusion_clusters(graph, parsed)
    if fused == 0 and graph.n:
        warn(f"placer: {why_nothing_fused(graph, parsed)}")
    if not is_acyclic(graph, cluster_of):  # pragma: no cover - impossible by the docstring's argument
        raise RuntimeError("fusion coarsening produced a cycle")
    return contract(graph, cluster_of, method="fusion", extra_meta={"fused_groups": fused})
