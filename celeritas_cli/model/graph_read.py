"""Reading a ``placer.graph/v1`` document into columns for
:class:`~celeritas_cli.model.graph.Graph` (:meth:`Graph.from_dict`): one
pass over ``nodes`` and one over ``edges``, with the checks the JSON Schema
cannot make - finite numbers, known endpoints, duplicate ids, tensors whose
bytes agree, totals within :mod:`~celeritas_cli.model.limits` - each
rejected in one line naming the node, edge and field (docs/design.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import InvalidInput
from .jsonio import check_depth
from .limits import BYTES_MAX, TIME_MAX
from .residency import PASSES

#: node fields with a column of their own; any other field is kept in ``extra``
KNOWN_NODE_FIELDS = frozenset({"id", "op", "compute_s", "compute_by_type", "memory_bytes", "colocation",
                                "splittable", "members"})


@dataclass
class NodeColumns:
    """Per-node columns read from a document's ``nodes`` (:meth:`Graph.from_dict`)."""

    ids: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    op: list[str] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    cbt: list[dict | None] = field(default_factory=list)
    coloc: list[str | None] = field(default_factory=list)
    split: list[list[str] | None] = field(default_factory=list)
    members: list[list[str] | None] = field(default_factory=list)
    extra: list[dict | None] = field(default_factory=list)


@dataclass
class EdgeColumns:
    """Per-edge and per-tensor columns read from a document's ``edges`` (:meth:`Graph.from_dict`)."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    tensor: list[int] = field(default_factory=list)
    comm: list[dict | None] = field(default_factory=list)
    tsrc: list[int] = field(default_factory=list)
    tbytes: list[int] = field(default_factory=list)
    tname: list[str] = field(default_factory=list)
    tedges: list[list[int]] = field(default_factory=list)


def check_finite(values: dict, where: str) -> None:
    """Reject a non-finite number in a per-type / per-pair map, naming *where* and the key."""
    for key, val in values.items():
        if not math.isfinite(val):
            raise InvalidInput(f"{where}.{key}: must be a finite number, got {val}")


def read_nodes(nodes: list[dict], label: str) -> NodeColumns:
    """Columns of the (schema-valid) node list; rejects duplicate ids, non-finite times, deep extras."""
    out = NodeColumns()
    ids, index, compute, memory, op, cbt = out.ids, out.index, out.compute, out.memory, out.op, out.cbt
    coloc, split, members, extra = out.coloc, out.split, out.members, out.extra
    known = KNOWN_NODE_FIELDS
    for i, nd in enumerate(nodes):
        nid = nd["id"]
        if nid in index:
            raise InvalidInput(f"{label}: node '{nid}' is defined twice (nodes #{index[nid]} and #{i})")
        index[nid] = i
        ids.append(nid)
        c = float(nd["compute_s"])
        if not math.isfinite(c):
            raise InvalidInput(f"{label}: node '{nid}' field compute_s: must be a finite number, got {c}")
        compute.append(c)
        memory.append(int(nd["memory_bytes"]))
        op.append(nd.get("op", "op"))
        by = nd.get("compute_by_type")
        if by:
            check_finite(by, f"{label}: node '{nid}' field compute_by_type")
            by = {k: float(val) for k, val in by.items()}
        cbt.append(by or None)
        coloc.append(nd.get("colocation"))
        split.append(list(nd["splittable"]) if nd.get("splittable") else None)
        members.append(list(nd["members"]) if "members" in nd else None)
        if nd.keys() <= known:
            extra.append(None)
        else:
            ex = {k: v for k, v in nd.items() if k not in known}
            for k, val in ex.items():
                if isinstance(val, (dict, list)):  # (check_depth's own first test, without a call per field)
                    check_depth(val, label, f"node '{nid}' field {k}")
            if "resident_bytes" in ex:
                res = ex["resident_bytes"]
                if type(res) is not int or not 0 <= res <= memory[-1]:  # else check_resident returns it as is
                    ex["resident_bytes"] = check_resident(res, memory[-1], f"{label}: node '{nid}'")
            if "pass" in ex and ex["pass"] not in PASSES:
                raise InvalidInput(f"{label}: node '{nid}' field pass: must be {', '.join(PASSES[:-1])} or "
                                   f"{PASSES[-1]}, got {ex['pass']!r}")
            extra.append(ex)
    return out


def check_resident(value, memory: int, where: str) -> int:
    """``resident_bytes`` of a node holding *memory* bytes: an integer
    ``0 <= value <= memory`` (the schema checks the type and the sign; a
    float of integer value is read as that integer).

    >>> check_resident(3, 5, "g: node 'a'")
    3
    >>> check_resident(6, 5, "g: node 'a'")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    celeritas_cli.errors.InvalidInput: g: node 'a' field resident_bytes: 6 is more than its memory_bytes (5)...
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise InvalidInput(f"{where} field resident_bytes: must be a whole number of bytes >= 0, got {value!r}")
    value = int(value)
    if value > memory:
        raise InvalidInput(f"{where} field resident_bytes: {value} is more than its memory_bytes ({memory}); the "
                           f"resident state is a part of the node's memory")
    return value


def read_edges(edges: list[dict], index: dict[str, int], label: str) -> EdgeColumns:
    """Columns of the (schema-valid) edge list, numbering tensors ``(src, tensor)`` in order of first
    appearance; rejects unknown endpoints, self-loops, a tensor with two sizes, non-finite comm times."""
    out = EdgeColumns()
    tensor_ids: dict[tuple[int, str], int] = {}
    esrc, edst, ebytes, etensor, ecomm = out.src, out.dst, out.bytes, out.tensor, out.comm
    tsrc, tbytes, tname, tedges = out.tsrc, out.tbytes, out.tname, out.tedges
    for k, ed in enumerate(edges):
        s, d = ed["src"], ed["dst"]
        si, di = index.get(s), index.get(d)
        if si is None:
            raise InvalidInput(f"{label}: edge {s}->{d} (#{k}): unknown source node '{s}'")
        if di is None:
            raise InvalidInput(f"{label}: edge {s}->{d} (#{k}): unknown destination node '{d}'")
        if si == di:
            raise InvalidInput(f"{label}: edge {s}->{d} (#{k}): self-loop on node '{s}'")
        b = int(ed["bytes"])
        tkey = ed.get("tensor")
        key = (si, tkey if tkey is not None else f"\x00edge{k}")
        t = tensor_ids.get(key)
        if t is None:
            t = len(tsrc)
            tensor_ids[key] = t
            tsrc.append(si)
            tbytes.append(b)
            tname.append(tkey if tkey is not None else f"{s}->{d}#{k}")
            tedges.append([])
        elif tbytes[t] != b:
            raise InvalidInput(
                f"{label}: edge {s}->{d} (#{k}): tensor '{tkey}' of node '{s}' has {b} bytes here "
                f"but {tbytes[t]} on an earlier edge; edges sharing a tensor must agree")
        tedges[t].append(k)
        cm = ed.get("comm_s_by_pair")
        if cm:
            check_finite(cm, f"{label}: edge {s}->{d} (#{k}) field comm_s_by_pair")
        esrc.append(si)
        edst.append(di)
        ebytes.append(b)
        etensor.append(t)
        ecomm.append(dict(cm) if cm else None)
    return out


def check_totals(nd: NodeColumns, ed: EdgeColumns, label: str) -> None:
    """Totals within :mod:`~celeritas_cli.model.limits`: memory, distinct tensor bytes, compute."""
    for what, total in (("memory_bytes over all nodes", sum(nd.memory)),
                        ("bytes over all distinct tensors (edges)", sum(ed.tbytes))):
        if total > BYTES_MAX:
            raise InvalidInput(f"{label}: the total of {what} is {total}, above 2^53-1 bytes (8 PiB), "
                               f"the most placer accepts")
    # every sum of node times (a coarse node, a device's work) stays within one node's range
    work = math.fsum(max(c, *b.values()) if b else c for c, b in zip(nd.compute, nd.cbt))
    if work > TIME_MAX:
        raise InvalidInput(f"{label}: the total compute over all nodes is {work:.12g} s (compute_s or the "
                           f"slowest compute_by_type), above 1e12 s, the most placer accepts")
