"""A placement applied to a captured step: the device of every fx value, the
execution order, and the cross-device transfers.

Every graph node runs on its placed device.  What the graph file folds away
is recomputed where it is needed, as the graph file assumes: a view of a
tensor is taken on the consumer's device from the transferred tensor, and a
constant (a factory op, a dropout mask, a causal mask) is made on each
device that uses it.  A tensor crosses to another device once per
(tensor, destination device), when its producer finishes (docs/design.md,
simulator point 3); a parameter read on another device than its owner's
crosses as the tensor ``"<owner>:<parameter>"``.  :meth:`Program.link_bytes`
totals these transfers per link, which must equal the simulator's, since
both are derived from the same capture (a test checks it).

References
----------
Celeritas 6.1 (the placed TensorFlow graph: a transfer per tensor and
destination device, variables colocated with their ``ApplyAdam``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput


@dataclass
class Transfer:
    """One tensor crossing from device ``src`` to device ``dst``.

    ``key`` is ``("out", v, k)`` (output ``k`` of graph node ``v``) or
    ``("state", s)`` (parameter or buffer ``s``, sent by its owner).
    ``producer`` is the graph node after which it is sent; ``index`` is its
    tag; ``meta`` the traced (fake) value, whose shape, strides and dtype the
    receiver allocates.
    """

    index: int
    key: tuple
    producer: int
    src: int
    dst: int
    nbytes: int
    meta: Any


class TransferPlan:
    """The cross-device transfers of a placed program (:class:`Program`, and the derived
    :class:`~.derived_program.DerivedProgram`): ``transfers`` in the order senders post them, ``sends``
    (producer -> transfer indices it sends when it finishes) and ``transfer_of`` ((key, dst) -> index)."""

    transfers: list
    sends: Any

    def post(self, pending: list[tuple[int, tuple, int]], made) -> None:
        """Number the transfers *pending* (``(position of the producer, key, destination device)``)
        in the order their senders post them: by producer position, then destination device (the
        tags :mod:`.dist` matches receives by).  ``made(key) -> (producer, source device, bytes, meta)``."""
        for _, key, d in sorted(pending, key=lambda x: (x[0], x[2])):
            producer, src, nbytes, meta = made(key)
            t = Transfer(index=len(self.transfers), key=key, producer=producer, src=src, dst=d, nbytes=nbytes,
                         meta=meta)
            self.transfers.append(t)
            self.sends[producer].append(t.index)
        self.transfer_of = {(t.key, t.dst): t.index for t in self.transfers}

    def link_bytes(self) -> dict[tuple[int, int], list[int]]:
        """``(src, dst) -> [bytes, transfers]`` of the planned transfers."""
        out: dict[tuple[int, int], list[int]] = {}
        for t in self.transfers:
            row = out.setdefault((t.src, t.dst), [0, 0])
            row[0] += t.nbytes
            row[1] += 1
        return out


class Program(TransferPlan):
    """The placed step.

    Parameters
    ----------
    step : the :class:`~celeritas_cli.run.step.RealStep`.
    device_of : graph node index -> cluster device index.
    sequence : every graph node index once, in a global execution order
        consistent with the graph (the simulated start order, which follows
        the placement's per-device ``order`` when it has one).

    Attributes
    ----------
    role : fx node -> ``("out", v, k)`` | ``("state", s)`` | ``("derived",)`` (a view or a constant,
        computed where read) | ``("factory",)`` (a constant made from another value's shape only, such
        as ``empty_like(x)``) | ``("attr",)`` | ``("none",)``.
    transfers : :class:`Transfer` list, in the order senders post them.
    needs, sends : graph node -> transfer indices it reads / sends when it finishes.
    free_after : sequence position -> ``(device, key)`` values dead after it.
    """

    def __init__(self, step, device_of: list[int], sequence: list[int]):
        sm = step.sm
        if sorted(sequence) != list(range(len(sm.ids))):
            raise ValueError("sequence must list every graph node once")
        self.step = step
        self.sm = sm
        self.device_of = list(device_of)
        self.sequence = list(sequence)
        self.position = {v: i for i, v in enumerate(sequence)}
        self.devices = sorted(set(device_of))
        self.role: dict[Any, tuple] = {}
        self._roles()
        self.placeholder_of_state = {s: fx for fx, r in self.role.items() if r[0] == "state" for s in (r[1],)}
        self.transfers: list[Transfer] = []
        self.needs: list[list[int]] = [[] for _ in sm.ids]
        self.sends: list[list[int]] = [[] for _ in sm.ids]
        self.reads: list[list[tuple]] = [[] for _ in sm.ids]     # every key / derived fx node a node touches
        self._plan()

    # ------------------------------------------------------------ roles
    def _roles(self) -> None:
        sm = self.sm
        own = {fx: v for v, fx in enumerate(sm.fx_of) if fx is not None}
        for fxn in self.step.tr.gm.graph.nodes:
            if fxn.op == "placeholder":
                s = sm.src.get(fxn, ("const",))
                self.role[fxn] = (("state", s[1]) if s[0] == "state" else
                                  ("out", s[1], 0) if s[0] == "node" else ("none",))
            elif fxn.op == "get_attr":
                self.role[fxn] = ("attr",)
            elif fxn.op == "call_function":
                if fxn in own:
                    val = fxn.meta.get("val")
                    self.role[fxn] = ("out", own[fxn], None if isinstance(val, (tuple, list)) else 0)
                elif (fxn.target is operator.getitem and fxn.args[0] in own and isinstance(fxn.args[1], int)
                      and isinstance(fxn.args[0].meta.get("val"), (tuple, list))):
                    self.role[fxn] = ("out", own[fxn.args[0]], fxn.args[1])
                elif sm.src.get(fxn, ("const",))[0] == "const" and any(
                        sm.src.get(b, ("const",))[0] != "const" for b in fxn.all_input_nodes):
                    # a factory op such as empty_like(x): x only lends its shape, dtype and strides
                    self.role[fxn] = ("factory",)
                else:
                    self.role[fxn] = ("derived",)

    def inputs_of(self, v: int) -> list:
        """The fx nodes graph node *v* reads (its gradient and parameter for an optimizer update)."""
        sm = self.sm
        if v in sm.opt_param:
            return [sm.grad_fx[v], self.placeholder_of_state[sm.opt_param[v]]]
        fx = sm.fx_of[v]
        return [] if fx.op == "placeholder" else list(fx.all_input_nodes)

    def home(self, key: tuple) -> int:
        """Device where the value *key* is made (its producer's, or its owner's for state)."""
        if key[0] == "out":
            return self.device_of[key[1]]
        owner = self.sm.owner.get(key[1])
        return -1 if owner is None else self.device_of[owner]

    # ------------------------------------------------------------- plan
    def _walk(self, a, acc: dict) -> None:
        """Base values (keys) and derived fx nodes fx node *a* depends on, into *acc* (ordered)."""
        r = self.role[a]
        if r[0] in ("out", "state"):
            acc.setdefault(r, None)
        elif r[0] in ("derived", "factory"):
            if a in acc:
                return
            for b in a.all_input_nodes:
                if r[0] == "derived" or self.sm.src.get(b, ("const",))[0] == "const":
                    self._walk(b, acc)
            acc[a] = None

    def _plan(self) -> None:
        sm = self.sm
        seen: set[tuple] = set()
        pending: list[tuple[int, tuple, int]] = []      # (position of producer, key, dst)
        for v in self.sequence:
            d = self.device_of[v]
            acc: dict = {}
            for a in self.inputs_of(v):
                self._walk(a, acc)
            self.reads[v] = list(acc)
            for key in acc:
                if not isinstance(key, tuple):
                    continue
                home = self.home(key)
                if home in (-1, d):
                    continue
                producer = key[1] if key[0] == "out" else sm.owner[key[1]]
                if key[0] == "out" and key[2] is None:
                    raise InvalidInput(f"node '{sm.ids[v]}' reads the whole multi-output value of "
                                       f"'{sm.ids[key[1]]}' across devices, which cannot be sent")
                if (key, d) not in seen:
                    seen.add((key, d))
                    pending.append((self.position[producer], key, d))
        self.post(pending, self._made)
        for v in self.sequence:
            d = self.device_of[v]
            self.needs[v] = [self.transfer_of[(key, d)] for key in self.reads[v] if (key, d) in self.transfer_of]
        src = sm.src.get(sm.loss, ("const",))
        #: the loss's base value and its device (the loss may be a view of it)
        self.loss_key = ("out", src[1], src[2]) if src[0] == "node" else None
        self.loss_device = self.device_of[src[1]] if src[0] == "node" else None

    def _made(self, key: tuple) -> tuple[int, int, int, Any]:
        """``(producer, its device, bytes, traced value)`` of the value *key* (:meth:`TransferPlan.post`)."""
        from ..profile.stepmap import nbytes, outputs

        sm = self.sm
        if key[0] == "state":
            producer = sm.owner[key[1]]
            val = self.placeholder_of_state[key[1]].meta.get("val")
            return producer, self.device_of[producer], nbytes(val), val
        v, k = key[1], key[2]
        return v, self.device_of[v], sm.out_bytes[v][k], outputs(sm.fx_of[v].meta.get("val"))[k]

    def free_after(self, devices) -> dict[int, list[tuple[int, Any]]]:
        """Position -> ``(device, key)`` pairs last read there, for the devices
        this process runs (keys: base values, received copies, derived fx nodes).
        Values read by nobody on a device are freed right after they are made
        (sends hold their own reference)."""
        devices = set(devices)
        last: dict[tuple[int, Any], int] = {}
        for v in self.sequence:
            d = self.device_of[v]
            if d not in devices:
                continue
            pos = self.position[v]
            for key in self.reads[v]:
                last[(d, key)] = pos
            val = self.sm.fx_of[v].meta.get("val") if self.sm.fx_of[v] is not None else None
            n_out = len(val) if isinstance(val, (tuple, list)) else 1
            for k in range(n_out):
                last.setdefault((d, ("out", v, k)), pos)
        keep = self.loss_key
        out: dict[int, list] = {}
        for (d, key), pos in last.items():
            if key == keep or (isinstance(key, tuple) and key[0] == "state" and self.home(key) == d):
                continue
            out.setdefault(pos, []).append((d, key))
        return out

    def tensor_name(self, t: Transfer) -> str:
        """The graph file's ``tensor`` name of a transfer (``<node>:<k>`` or ``<owner>:<param>``)."""
        sm = self.sm
        if t.key[0] == "out":
            return f"{sm.ids[t.key[1]]}:{t.key[2]}"
        return f"{sm.ids[t.producer]}:{sm.state_names[t.key[1]]}"
