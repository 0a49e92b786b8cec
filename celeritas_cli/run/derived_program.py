"""A derived placement as a program: for every node of the derived graph
(:mod:`.plan`), the action it runs, the values it reads and where they
come from, and the transfers between devices.

Values are named by *keys*:

* ``("v", y, u, k)``: output ``k`` of captured node ``u`` as derived node
  ``y`` computed it (a micro-batch copy, a recompute clone, an
  accumulation, a ring result);
* ``("s", r, s)``: parameter or buffer ``s`` of replica ``r``, held by the
  owner's ``weights`` node (:func:`~.plan.state_homes`);
* ``("f", y)``: the flat gradient bucket of a ring ``bucket`` node;
  ``("r", y)``: the chunk a reduce-scatter or all-gather node holds;
* ``("chunk", key, a, b)``: elements ``a:b`` of the flattened value *key*
  (what a ring step reads from a gradient or a bucket).

A node reads ``("out", u, k)`` of its captured op from the in-edge that
carries tensor ``"<u>:<k>"`` (the graph's tensor names survive every
rewrite), so a backward copy reads a recomputed activation from the clone
and a forward copy from the original, as the recipe says.  Gradient
accumulations, ring steps and updates read a micro-batch copy's gradient
weighted by its instance's share of the batch (:meth:`.plan.Layout.weight`).

A value crosses to another device once per (key, destination), sent when
its producer finishes, received just before its first reader; transfers are
numbered in the order their senders post them (:mod:`.dist`), so the
channels of :mod:`.executor` and :mod:`.dist` carry them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .plan import DerivedPrepared, batch_layout, node_infos, state_homes
from .program import Program, TransferPlan

GRADIENT_READERS = ("accum", "update", "reduce-scatter", "bucket")


def chunk_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """Element ranges of the ``k`` ring chunks of ``n`` elements (the first
    ``n % k`` one larger, as :func:`~celeritas_cli.transform.allreduce.chunk_sizes`).

    >>> chunk_ranges(4, 3)
    [(0, 2), (2, 3), (3, 4)]
    """
    out, at = [], 0
    for c in range(k):
        size = n // k + (1 if c < n % k else 0)
        out.append((at, at + size))
        at += size
    return out


class TraceView:
    """One captured trace (the step at one batch size) as a one-device
    :class:`~.program.Program`: roles, what every node reads, and which
    constants depend on a random op (dropout masks: replayed from the whole
    batch's, :mod:`.derived_executor`)."""

    def __init__(self, step):
        from .executor import is_random

        self.step = step
        self.sm = step.sm
        self.prog = Program(step, [0] * len(step.sm.ids), list(range(len(step.sm.ids))))
        self.role = self.prog.role
        self.by_name = {n.name: n for n in step.tr.gm.graph.nodes}
        self.random: set = set()
        for n in step.tr.gm.graph.nodes:
            if self.is_const(n) and (n.op == "call_function" and is_random(n)
                                     or any(b in self.random for b in n.all_input_nodes)):
                self.random.add(n)

    def is_const(self, a) -> bool:
        return self.sm.src.get(a, ("const",))[0] == "const" and self.role.get(a, ("none",))[0] in ("derived",
                                                                                                 "factory")

    def out_meta(self, u: int, k: int):
        from ..profile.stepmap import outputs

        return outputs(self.sm.fx_of[u].meta.get("val"))[k]

    def base_keys(self, v: int) -> list[tuple]:
        """``("out", u, k)`` / ``("state", s)`` values node *v* reads (through views)."""
        return [key for key in self.prog.reads[v] if isinstance(key, tuple)]


@dataclass
class Action:
    """What derived node *x* runs: ``kind`` (``input``, ``op``, ``update``,
    ``weights``, ``accum``, ``bucket``, ``reduce-scatter``, ``all-gather``,
    ``result``), its instance and trace size, and its resolved inputs."""

    kind: str
    inst: tuple[int, int]
    size: int
    v: int | None = None
    res: dict | None = None                 # ("out", u, k) -> (key, weight)
    parts: list | None = None               # accum: [(out key, prev key, prev w, part key, part w)]
    ring: dict | None = None                # ring nodes: own / recv / chunks / keys


class DerivedProgram(TransferPlan):
    """The program of an :class:`~.plan.DerivedPrepared` (module docstring).

    Attributes
    ----------
    actions : derived node -> :class:`Action`.
    reads : derived node -> keys it reads on its device (local, or received).
    transfers, needs, sends : as :class:`~.program.Program` (``Transfer.key`` is a key above).
    loss_keys : instance -> (device, key of the loss's base value, the node that made it).
    """

    def __init__(self, pre: DerivedPrepared):
        self.pre = pre
        self.graph, self.infos, self.layout = pre.graph, pre.infos, pre.layout
        self.device_of = list(pre.device_of)
        self.sequence = list(pre.sequence)
        self.position = {x: i for i, x in enumerate(self.sequence)}
        self.devices = sorted(set(self.device_of))
        self.views = {n: TraceView(s) for n, s in pre.steps_by_size.items()}
        base = pre.steps_by_size[pre.layout.total]
        self.sm = base.sm
        from ..model.graph import Graph

        self.base_graph = Graph.from_dict(base.doc, base.doc["name"])    # the captured graph (sm's node order)
        self.cap_index = {nid: v for v, nid in enumerate(self.sm.ids)}
        self.homes = state_homes(self.graph, self.infos, self.sm)
        self.actions: dict[int, Action] = {}
        self.reads: dict[int, list[tuple]] = {}
        self._edge_src()
        #: bucket index -> the tensor names its ring reduces (on its bucket and result nodes only)
        self.bucket_tensors = {int(i.ring["bucket"]): i.ring["tensor"] for i in self.infos
                               if i.kind == "ring" and "bucket" in i.ring and "tensor" in i.ring}
        for x in range(self.graph.n):
            self._plan(x)
        self._transfers()
        self.loss_keys = self._loss_keys()

    # ------------------------------------------------------------ helpers
    def inst(self, x: int) -> tuple[int, int]:
        info = self.infos[x]
        return info.r, 0 if info.i is None else info.i

    def size(self, x: int) -> int:
        return self.layout.sizes[self.inst(x)]

    def weight(self, y: int) -> float:
        """The weight of derived node *y*'s gradients: its instance's share
        of the batch for a per-instance op, 1 for what is already summed."""
        info = self.infos[y]
        if info.kind not in ("node", "recompute") or (self.layout.m > 1 and info.i is None):
            return 1.0
        return self.layout.weight(self.inst(y))

    def home(self, key: tuple) -> int:
        if key[0] == "chunk":
            return self.home(key[1])
        if key[0] == "s":
            h = self.homes.get((key[1], key[2]))
            return -1 if h is None else self.device_of[h]
        return self.device_of[key[1]]

    def producer(self, key: tuple) -> int:
        if key[0] == "chunk":
            return self.producer(key[1])
        if key[0] == "s":
            return self.homes[(key[1], key[2])]
        return key[1]

    def _edge_src(self) -> None:
        g = self.graph
        self.in_named: list[dict[str, list[int]]] = [{} for _ in range(g.n)]
        for e in range(g.m):
            name = g.tensor_name[g.edge_tensor[e]]
            self.in_named[g.edge_dst[e]].setdefault(name, []).append(g.edge_src[e])

    def _by_name(self, x: int, u: int, k: int) -> int:
        """The derived node *x* reads output ``k`` of captured node *u* from."""
        name = f"{self.sm.ids[u]}:{k}"
        srcs = self.in_named[x].get(name)
        if not srcs:  # a bucket result may prefix the name with the producer's id
            srcs = [y for nm, ys in self.in_named[x].items() if nm.endswith("/" + name) for y in ys]
        if len(srcs) != 1:
            raise InvalidInput(f"placer run: derived node '{self.graph.ids[x]}' reads tensor '{name}' from "
                               f"{len(srcs) or 'no'} in-edge(s); the derived graph does not say where it comes from")
        return srcs[0]

    def _resolve(self, x: int, keys: list[tuple]) -> dict:
        info = self.infos[x]
        scale = self.actions_kind(x) in GRADIENT_READERS
        res = {}
        for key in keys:
            if key[0] == "state":
                res[key] = (("s", info.r, key[1]), 1.0)
            elif key[2] is None:
                raise InvalidInput(f"placer run: node '{self.graph.ids[x]}' reads the whole multi-output value of "
                                   f"'{self.sm.ids[key[1]]}', which cannot be resolved")
            else:
                y = self._by_name(x, key[1], key[2])
                res[key] = (("v", y, key[1], key[2]), self.weight(y) if scale else 1.0)
        return res

    def actions_kind(self, x: int) -> str:
        info = self.infos[x]
        if info.kind == "ring":
            return info.ring["phase"]
        if info.kind == "node" and info.v in self.sm.opt_param:
            return "update"
        return info.kind

    # --------------------------------------------------------------- plan
    def _plan(self, x: int) -> None:
        info = self.infos[x]
        kind = self.actions_kind(x)
        inst = self.inst(x)
        size = self.layout.sizes[inst]
        if kind in ("node", "recompute", "update"):
            view = self.views[size]
            fx = view.sm.fx_of[info.v]
            keys = view.base_keys(info.v)
            act = Action("input" if fx is not None and fx.op == "placeholder" else
                         "update" if kind == "update" else "op", inst, size, v=info.v, res=self._resolve(x, keys))
            self.reads[x] = [k for k, _ in act.res.values()]
        elif kind == "weights":
            act = Action("weights", inst, size, v=info.v)
            self.reads[x] = []
        elif kind == "accum":
            act = self._accum(x, inst, size)
        else:
            act = self._ring(x, inst, size, kind)
        self.actions[x] = act

    def _accum(self, x: int, inst, size) -> Action:
        g, info = self.graph, self.infos[x]
        preds = list(dict.fromkeys(g.pred[x]))
        part = [y for y in preds if self.infos[y].kind == "node" and self.infos[y].i == info.i]
        prev = [y for y in preds if y not in part]
        if len(part) != 1 or len(prev) != 1:
            raise InvalidInput(f"placer run: accumulation '{g.ids[x]}' does not read one partial gradient and one "
                               f"running sum")
        u = info.v
        ks = self.acc_outputs(u)
        parts = [(("v", x, u, k), ("v", prev[0], u, k), self.weight(prev[0]), ("v", part[0], u, k),
                  self.weight(part[0])) for k in ks]
        self.reads[x] = [p for row in parts for p in (row[1], row[3])]
        return Action("accum", inst, size, v=u, parts=parts)

    def acc_outputs(self, u: int) -> list[int]:
        """Outputs of captured node *u* that an optimizer update reads (the gradients it accumulates)."""
        view = self.views[self.layout.total]
        out = []
        for w in self.sm.opt_param:
            for key in view.base_keys(w):
                if key[0] == "out" and key[1] == u and key[2] not in out:
                    out.append(key[2])
        return sorted(out)

    def _ring_keys(self, ring: dict) -> list[tuple[int, int]]:
        names = ring["tensor"] if "tensor" in ring else self.bucket_tensors.get(int(ring.get("bucket", -1)), [])
        names = names if isinstance(names, list) else [names]
        out = []
        for nm in names:
            u, _, k = str(nm).rpartition(":")
            if u not in self.cap_index or not k.isdigit():
                raise InvalidInput(f"placer run: a ring all-reduce reduces tensor '{nm}', which is no output of a "
                                   f"captured node")
            out.append((self.cap_index[u], int(k)))
        return out

    def _ring(self, x: int, inst, size, kind: str) -> Action:
        g, info = self.graph, self.infos[x]
        ring = info.ring
        keys = self._ring_keys(ring)
        view = self.views[self.layout.total]
        metas = [view.out_meta(u, k) for u, k in keys]
        if len({m.dtype for m in metas}) != 1:
            raise InvalidInput(f"placer run: ring '{g.ids[x]}' reduces gradients of different dtypes")
        n = sum(int(m.numel()) for m in metas)
        nrep = self.layout.k
        ranges = chunk_ranges(n, nrep)
        preds = list(dict.fromkeys(g.pred[x]))
        spec: dict[str, Any] = {"keys": keys, "numel": n, "dtype": metas[0].dtype, "shapes": [m.shape for m in metas],
                                "ranges": ranges}
        if kind == "bucket":
            spec["grads"] = []
            for u, k in keys:
                y = self._by_name(x, u, k)
                spec["grads"].append((("v", y, u, k), self.weight(y)))
            self.reads[x] = [kk for kk, _ in spec["grads"]]
        elif kind == "reduce-scatter":
            c, s = int(ring["chunk"]), int(ring["step"])
            a, b = ranges[c]

            def source(y):  # the gradient (or bucket) a ring step reads a chunk of
                if self.infos[y].kind == "ring":
                    return ("f", y), 1.0
                if len(keys) != 1:
                    raise InvalidInput(f"placer run: ring '{g.ids[x]}' reads a bucket from a non-bucket node")
                return ("v", y, keys[0][0], keys[0][1]), self.weight(y)

            if s == 0:  # the raw chunks of this replica's gradient and of the previous replica's
                own = [y for y in preds if self.infos[y].r == info.r]
                recv = [y for y in preds if self.infos[y].r != info.r]
                (rk, rw), (ok, ow) = source(recv[0]), source(own[0])
                spec.update(recv=(("chunk", rk, a, b), rw), own=(("chunk", ok, a, b), ow))
            else:  # the previous step's partial sum, and this replica's chunk
                recv = [y for y in preds if self.actions_kind(y) == "reduce-scatter"]
                own = [y for y in preds if y not in recv]
                ok, ow = source(own[0])
                spec.update(recv=(("r", recv[0]), 1.0), own=(("chunk", ok, a, b), ow))
            spec["range"] = (a, b)
            self.reads[x] = [spec["recv"][0], spec["own"][0]]
        elif kind == "all-gather":
            spec["recv"] = (("r", preds[0]), 1.0)
            spec["range"] = ranges[int(ring["chunk"])]
            self.reads[x] = [spec["recv"][0]]
        elif kind == "result":
            spec["chunks"] = [(("r", y), ranges[int(self.infos[y].ring["chunk"])]) for y in preds]
            self.reads[x] = [k for k, _ in spec["chunks"]]
        else:
            raise InvalidInput(f"placer run: unknown ring phase '{kind}' of node '{g.ids[x]}'")
        return Action(kind, inst, size, ring=spec)

    def _loss_keys(self) -> dict:
        view = self.views[self.layout.total]
        src = view.sm.src.get(view.sm.loss, ("const",))
        if src[0] != "node":
            raise InvalidInput("placer run: the loss of the captured step is not computed by a graph node")
        out = {}
        for x, info in enumerate(self.infos):
            if info.kind == "node" and info.v == src[1]:
                out[self.inst(x)] = (self.device_of[x], ("v", x, src[1], src[2]), x)
        if set(out) != set(self.layout.sizes):
            raise InvalidInput("placer run: not every micro-batch and replica computes the loss")
        return out

    # ---------------------------------------------------------- transfers
    def _meta(self, key: tuple):
        import torch

        if key[0] == "chunk":
            base = self._meta(key[1]) if key[1][0] == "v" else None
            dtype = base.dtype if base is not None else self.actions[key[1][1]].ring["dtype"]
            return torch.empty(key[3] - key[2], dtype=dtype, device="meta")
        if key[0] == "r":
            a, b = self.actions[key[1]].ring["range"]
            return torch.empty(b - a, dtype=self.actions[key[1]].ring["dtype"], device="meta")
        if key[0] == "s":
            return self.views[self.layout.total].prog.placeholder_of_state[key[2]].meta.get("val")
        y = key[1]
        size = self.size(y) if self.infos[y].kind in ("node", "recompute") else self.layout.total
        return self.views[size].out_meta(key[2], key[3])

    def _transfers(self) -> None:
        seen: set[tuple] = set()
        pending = []
        for x in self.sequence:
            d = self.device_of[x]
            for key in self.reads[x]:
                h = self.home(key)
                if h in (-1, d) or (key, d) in seen:
                    continue
                p = self.producer(key)
                if self.position[p] >= self.position[x]:
                    raise InvalidInput(f"placer run: '{self.graph.ids[x]}' reads a value of '{self.graph.ids[p]}', "
                                       f"which runs after it in the placement's order")
                seen.add((key, d))
                pending.append((self.position[p], key, d))
        self.transfers = []
        self.sends: dict[int, list[int]] = {x: [] for x in range(self.graph.n)}

        def made(key):
            meta = self._meta(key)
            return self.producer(key), self.home(key), int(meta.numel()) * meta.element_size(), meta

        self.post(pending, made)
        self.needs = {x: [self.transfer_of[(k, self.device_of[x])] for k in dict.fromkeys(self.reads[x])
                          if (k, self.device_of[x]) in self.transfer_of] for x in self.sequence}

    def free_after(self, devices) -> dict[int, list[tuple[int, tuple]]]:
        """Position -> ``(device, key)`` values last read there, on *devices*
        (a chunk read locally keeps its base value alive; the losses are kept)."""
        devices = set(devices)
        last: dict[tuple[int, tuple], int] = {}
        keep = {key for _, key, _ in self.loss_keys.values()}
        for x in self.sequence:
            d = self.device_of[x]
            if d not in devices:
                continue
            pos = self.position[x]
            for key in self.produces(x):
                last.setdefault((d, key), pos)
            for key in self.reads[x]:
                local = self.home(key) == d
                last[(d, key[1] if key[0] == "chunk" and local else key)] = pos
        out: dict[int, list] = {}
        for (d, key), pos in last.items():
            if key in keep or key[0] == "s":
                continue
            out.setdefault(pos, []).append((d, key))
        return out

    def produces(self, x: int) -> list[tuple]:
        """The keys derived node *x* puts in its device's values."""
        act = self.actions[x]
        if act.kind in ("input", "op"):
            fx = self.views[act.size].sm.fx_of[act.v]
            val = fx.meta.get("val")
            return [("v", x, act.v, k) for k in range(len(val) if isinstance(val, (tuple, list)) else 1)]
        if act.kind == "accum":
            return [row[0] for row in act.parts]
        if act.kind == "bucket":
            return [("f", x)]
        if act.kind in ("reduce-scatter", "all-gather"):
            return [("r", x)]
        if act.kind == "result":
            return [("v", x, u, k) for u, k in act.ring["keys"]]
        return []


def derived_job(pre: DerivedPrepared, rng_states: dict, *, steps: int, warmup: int, threads: int, timeout: float,
           dist_backend: str | None = None) -> dict:
    """What every rank of a derived program needs (:func:`~.dist.rank_main`) to rebuild it
    (:func:`program_from_job`) and run its device; *dist_backend* overrides the process group's."""
    from .checks import job_core

    job = job_core(pre.whole, pre.devices, pre.tdev, rng_states, steps=steps, warmup=warmup, threads=threads,
                   timeout=timeout)
    job.update(batch=pre.batch, recipe=pre.recipe, sizes=sorted(pre.steps_by_size), device_of=pre.device_of,
               sequence=pre.sequence, inputs=pre.inputs)
    if dist_backend is not None:
        job["dist_backend"] = dist_backend
    return job


def program_from_job(job: dict) -> DerivedProgram:
    """The :class:`DerivedProgram` of a rank: the same captures (same seed:
    bit-identical values), the derived graph rebuilt from the recipe, the
    parent's devices and sequence."""
    from ..model.graph import Graph
    from .step import worker_capture

    steps = {n: worker_capture(job, n) for n in job["sizes"]}
    base = steps[job["batch"]]
    derived, infos = node_infos(Graph.from_dict(base.doc, base.doc["name"]), job["recipe"])
    layout = batch_layout(job["recipe"], job["batch"])
    pre = DerivedPrepared(batch=job["batch"], steps_by_size=steps, whole=steps[layout.total], recipe=job["recipe"],
                     layout=layout, graph=derived, infos=infos, device_of=job["device_of"], sequence=job["sequence"],
                     inputs=job["inputs"], sim={}, sim_graph=None, tdev=job["torch_devices"], graph_from_file=False)
    return DerivedProgram(pre)
