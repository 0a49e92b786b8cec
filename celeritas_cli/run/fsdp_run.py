"""``placer run`` on a sharded data-parallel placement (``place --algo fsdp``:
ZeRO stages 1-3, PyTorch FSDP): one process per replica, each holding its
shard of every unit's parameters and Adam state.

The plan is read the usual way: the placement's recipe (one ``fsdp`` step)
is rebuilt on the captured graph (or ``--graph``) by the simulator, and the
units come from :func:`~celeritas_cli.transform.fsdp_units.fsdp_plan` of that
graph at the recorded ``stage`` and ``unit_mb`` - the same function the
derivation builds from; nothing a file carries is trusted.  A plan in the
symmetric nccl form (``place --algo fsdp``'s default: replica 0's nodes, the
replica map, one collective node per replica and collective) is first
expanded and turned into the ring form (:func:`~.plan.executable`), whose
simulated step the run reports.  Replicas, shards
of the batch, devices and the node order are data parallelism's
(:func:`~.data_parallel.prepare_dp`, strong scaling, equal shares).

A unit's trained parameters (those with an ``optim.adam`` update; buffers
stay per replica, as FSDP leaves them) are flattened in parameter order into
one flat parameter, padded to a multiple of ``k`` and cut into ``k`` equal
chunks; rank ``q`` holds chunk ``q`` and its two Adam moments (FSDP section
3.2.1 and 4.2, "FlatParameter"; ZeRO section 5.1-5.3).  Per step, on rank
``q``:

* **stage 3** (``FULL_SHARD``): a unit's parameters are all-gathered
  (``all_gather_single``) when a node first reads them, and dropped after
  the last node of that pass that reads them, with every value derived from
  them (a transposed weight the trace keeps for the backward): reshard
  after forward, and the backward gathers again (FSDP section 3.3);
* **stages 1-2**: every rank holds the whole parameters; after the unit's
  update the updated chunks are all-gathered into them (ZeRO 5.1 / 7.2.1);
* **all stages**: once the unit's last gradient is produced, the flat
  gradient is reduce-scattered (``reduce_scatter_single``: gloo has it in
  torch 2.13, so no all-reduce stands in for it), divided by ``k``, and Adam (:func:`~celeritas_cli.profile.optim.adam_update`,
  elementwise, so one call on the chunk equals ``torch.optim.Adam`` per
  parameter) updates chunk ``q`` only.

The yardstick is data parallelism's (:func:`~.reference.replica_reference`:
the unplaced step on each shard, gradients averaged, Adam); the updated
parameters are assembled from the ranks' chunks.  Stages 1-3 compute the
same step; they differ in what each rank holds.

**Prefetch** (stage 3; FSDP section 3.4, forward and backward prefetch):
the first step records the order in which units are gathered (the same on
every rank: one program); from the second step on, when gather ``i`` is
waited for, gather ``i + 1`` of that order is started asynchronously, so it
overlaps the current unit's compute - one ahead, as the simulated plan
(:mod:`~celeritas_cli.transform.fsdp`'s rate limit) has it.

Deviations from the papers: the collectives are issued from the step's one
thread, on CPU gloo;
stage 2 frees nothing earlier than stage 1 here (a full gradient lives until
its update node reads it, as in the captured step); no mixed precision.

References
----------
Zhao et al., "PyTorch FSDP", VLDB 2023, sections 3.2-3.3 and 4.2;
Rajbhandari et al., "ZeRO", SC'20, section 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from .data_parallel import DPPrepared, prepare_dp, replica_job, replica_program, replica_report
from .executor import Runner

#: what each stage shards besides the batch (ZeRO section 5)
SHARDED = {1: ["optimizer state"], 2: ["optimizer state", "gradients"],
           3: ["optimizer state", "gradients", "parameters"]}


@dataclass
class FSDPPrepared(DPPrepared):
    """A sharded data-parallel placement applied to a captured step (:func:`prepare_fsdp`):
    data parallelism's replicas plus the ``stage`` and the units, ``(name, [parameter index])``."""

    stage: int = 3
    units: list = field(default_factory=list)
    passes: list = field(default_factory=list)      # per captured node: forward / backward / update


def prepare_fsdp(spec: str, batch: int, placement, cluster, recipe: dict, **kw) -> FSDPPrepared:
    """:func:`~.data_parallel.prepare_dp` (capture, simulate the rebuilt recipe, shards, devices),
    then the units of :func:`~celeritas_cli.transform.fsdp_units.fsdp_plan` as parameter indices."""
    from ..transform.fsdp_units import fsdp_plan
    from ..transform.passes import node_passes

    label = kw.get("label", "placement")
    pre = prepare_dp(spec, batch, placement, cluster, recipe, **kw)
    g, sm = pre.sim_graph, pre.step.sm
    plan = fsdp_plan(g, int(recipe["stage"]), recipe.get("unit_mb", 0.0))
    idx = {nid: v for v, nid in enumerate(sm.ids)}
    units, seen = [], set()
    for u in plan.units:
        ps = sorted(sm.opt_param[idx[g.ids[v]]] for v in u.updates if idx[g.ids[v]] in sm.opt_param)
        if ps:
            units.append((u.name, ps))
            seen.update(ps)
    rest = sorted(set(sm.opt_param.values()) - seen)
    if rest:    # fsdp_plan puts every update's group in a unit; a graph whose updates it does not see is refused
        raise InvalidInput(f"{label}: parameter {sm.state_names[rest[0]]} is updated but in no FSDP unit of the "
                           f"recipe rebuilt on graph '{g.name}'")
    state = pre.step.state
    for name, ps in units:
        if len({state[p].dtype for p in ps}) > 1:
            raise InvalidInput(f"{label}: FSDP unit '{name}' mixes parameter dtypes "
                               f"({', '.join(sorted({str(state[p].dtype) for p in ps}))}); one flat parameter "
                               f"needs one dtype")
    passes = node_passes(g)
    fields = {k: getattr(pre, k) for k in pre.__dataclass_fields__}
    return FSDPPrepared(**fields, stage=int(recipe["stage"]), units=units,
                        passes=[passes[g.index[nid]] for nid in sm.ids])


# ------------------------------------------------------------------ ranks
class Collectives:
    """The collectives of an FSDP rank on the default process group: ``all_gather_single`` and
    ``reduce_scatter_single`` (``all_gather_into_tensor`` / ``reduce_scatter_tensor`` before
    them); the tests give ranks run as threads another object with these methods."""

    def all_gather(self, out, chunk, async_op: bool = False):
        """Gather every rank's *chunk* into *out*; with *async_op*, start it and return the work."""
        import torch.distributed as dist

        return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, chunk,
                                                                                          async_op=async_op)

    def reduce_scatter(self, out, flat):
        """Start summing *flat* over the ranks into this rank's chunk *out*; returns the work."""
        import torch.distributed as dist

        return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, flat, async_op=True)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


class ShardedRunner(Runner):
    """The :class:`~.executor.Runner` of one FSDP rank (module docstring): flat chunks of every
    unit, gathers on first read (stage 3), reduce-scatter once a unit's gradients are ready,
    Adam on the chunk at the unit's last update node."""

    def __init__(self, prog, dev, me: int, channel, *, units: list[list[int]], stage: int, rank: int, k: int,
                 passes: list[str], stage_cpu: bool, comm=None, **kw):
        import torch

        super().__init__(prog, {me: dev}, [me], channel, **kw)
        self.units, self.stage, self.rank, self.k, self.stage_cpu = units, stage, rank, k, stage_cpu
        self.comm = comm or Collectives()
        self.unit_of = {p: u for u, ps in enumerate(units) for p in ps}
        self.numel = [sum(self.state[p].numel() for p in ps) for ps in units]
        self.chunk = [-(-n // k) for n in self.numel]
        self.shard, self.moms, self.count = [], [], [0] * len(units)
        for u, ps in enumerate(units):
            flat = self._flat([self.state[p] for p in ps], u)
            self.shard.append(flat[rank * self.chunk[u]:(rank + 1) * self.chunk[u]].clone())
            self.moms.append((torch.zeros_like(self.shard[u]), torch.zeros_like(self.shard[u])))
            for p in ps:
                self.moments.pop(p)
                self.steps_done.pop(p)
                if stage == 3:
                    del self.state[p]          # this rank holds its chunk only
        sm, seq = self.sm, prog.sequence
        self.update_of = {p: v for v, p in sm.opt_param.items()}
        self.last_update: dict[int, int] = {}
        self.producers: dict[int, list[int]] = {}          # node -> parameters whose gradient it makes
        self.need: list[set[int]] = [set() for _ in units]  # per unit: gradients a node makes
        for v in seq:
            p = sm.opt_param.get(v)
            if p in self.unit_of:
                self.last_update[self.unit_of[p]] = v
                src = sm.src.get(sm.grad_fx[v], ("const",))
                if src[0] == "node":
                    self.producers.setdefault(src[1], []).append(p)
                    self.need[self.unit_of[p]].add(p)
        self.drop: dict[int, list[int]] = {}      # stage 3: node -> units resharded after it
        if stage == 3:
            last: dict[tuple[int, str], int] = {}
            for v in seq:
                if v not in sm.opt_param:
                    for key in prog.reads[v]:
                        if isinstance(key, tuple) and key[0] == "state" and key[1] in self.unit_of:
                            last[(self.unit_of[key[1]], passes[v])] = v
            for (u, _), v in last.items():
                self.drop.setdefault(v, []).append(u)
        self.views: dict[int, list] = {u: [] for u in range(len(units))}   # derived values of a unit's parameters
        for a, role in prog.role.items():
            if role[0] == "derived":
                for u in self._units_under(a):
                    self.views[u].append(a)
        self.node_hook = self._after_node
        self.gathers = self.gathered_bytes = self.scattered_bytes = self.prefetched = 0
        #: stage 3: the units in the order the first step gathered them (module docstring, prefetch)
        self.gather_order: list[int] | None = None

    def _units_under(self, a) -> set[int]:
        """Units whose parameters derived value *a* (a view, a transpose) is computed from."""
        out, todo, seen = set(), list(a.all_input_nodes), set()
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            role = self.prog.role.get(n, ("",))
            if role[0] == "state" and role[1] in self.unit_of:
                out.add(self.unit_of[role[1]])
            elif role[0] == "derived":
                todo.extend(n.all_input_nodes)
        return out

    def _flat(self, tensors, u: int):
        import torch

        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.chunk[u] * self.k - flat.numel()))

    def _wire(self, t):
        return t.cpu() if self.stage_cpu else t

    def _start_gather(self, u: int, chunk, async_op: bool = False) -> tuple:
        """Start gathering unit *u* from every rank's *chunk*: ``(work or None, flat buffer, chunk)``."""
        import torch

        src = self._wire(chunk.contiguous())
        out = torch.empty(self.chunk[u] * self.k, dtype=src.dtype, device=src.device)
        work = self.comm.all_gather(out, src, async_op=async_op)
        self.gathers += 1
        self.gathered_bytes += out.numel() * out.element_size()
        return (work if async_op else None), out, chunk

    def _views(self, u: int, started: tuple) -> dict[int, Any]:
        """Unit *u*'s parameters from a started gather, once it is done: parameter index -> tensor."""
        work, out, chunk = started
        if work is not None:
            work.wait()
        out = out.to(chunk.device)
        views, off = {}, 0
        for p in self.units[u]:
            meta = self.prog.step.state[p]
            views[p] = out[off:off + meta.numel()].view(meta.shape)
            off += meta.numel()
        return views

    def _all_gather(self, u: int, chunk) -> dict[int, Any]:
        """Unit *u*'s parameters gathered from every rank's *chunk*: parameter index -> tensor."""
        return self._views(u, self._start_gather(u, chunk))

    def _gather_for_read(self, u: int) -> dict[int, Any]:
        """Stage 3: unit *u* for a node that reads it - the prefetched gather when one is in flight,
        else a gather now; then the next gather of the recorded order starts (module docstring)."""
        started = self.inflight.pop(u, None)
        if self.gather_order is None:
            self.order_now.append(u)
        else:
            self.prefetched += started is not None
            i = self.next_gather
            if i < len(self.gather_order) and self.gather_order[i] == u:
                self.next_gather = i + 1
                nxt = self.gather_order[i + 1] if i + 1 < len(self.gather_order) else None
                if nxt is not None and nxt not in self.inflight:
                    self.inflight[nxt] = self._start_gather(nxt, self.shard[nxt], async_op=True)
        return self._views(u, started or self._start_gather(u, self.shard[u]))

    # -------------------------------------------------------------- the seams
    def value(self, a, d: int):
        role = self.prog.role[a]
        if self.stage == 3 and role[0] == "state" and role[1] in self.unit_of:
            u = self.unit_of[role[1]]
            if u not in self.full:
                self.full[u] = self._gather_for_read(u)
            return self.full[u][role[1]]
        return super().value(a, d)

    def _grad(self, p: int, d: int):
        return self.value(self.sm.grad_fx[self.update_of[p]], d)

    def _reduce_scatter(self, u: int, d: int) -> None:
        """Start the reduce-scatter of unit *u*'s flat gradient (gloo has it in torch 2.13, so no
        all-reduce stands in for it); its chunk is waited for at the unit's update."""
        import torch

        flat = self._wire(self._flat([self._grad(q, d) for q in self.units[u]], u))
        out = torch.empty(self.chunk[u], dtype=flat.dtype, device=flat.device)
        self.scattered_bytes += flat.numel() * flat.element_size()
        self.reducing[u] = (self.comm.reduce_scatter(out, flat), out)

    def _after_node(self, v: int, d: int, runner) -> None:
        for u in self.drop.get(v, ()):      # reshard: the gathered parameters and what was derived from them
            self.full.pop(u, None)
            for a in self.views[u]:
                self.env[d].pop(a, None)
        for p in self.producers.get(v, ()):
            u = self.unit_of[p]
            left = self.left.setdefault(u, set(self.need[u]))
            left.discard(p)
            if not left:
                self._reduce_scatter(u, d)

    def run_node(self, v: int, d: int) -> None:
        p = self.sm.opt_param.get(v)
        if p not in self.unit_of:
            return super().run_node(v, d)
        u = self.unit_of[p]
        if self.last_update[u] != v:
            return                              # the unit's chunk is updated once, at its last update node
        if u not in self.reducing:              # no node produced its gradients (constants): reduce them now
            self._reduce_scatter(u, d)
        work, grad = self.reducing.pop(u)
        work.wait()
        grad = grad.to(self.shard[u].device).div_(self.k)
        self.count[u] += 1
        new = self.adam_update(self.shard[u], grad, self.moms[u], self.count[u])
        self.new_shard[u] = new
        if self.stage < 3:                      # ZeRO 1-2: every rank gets the whole updated parameters
            self.pending.update(self._all_gather(u, new))
        return None

    def step(self) -> dict:
        self.full, self.left, self.reducing, self.new_shard = {}, {}, {}, {}
        self.inflight, self.order_now, self.next_gather = {}, [], 0
        res = super().step()
        for started in self.inflight.values():     # a prefetch the step did not read (none in a valid order)
            if started[0] is not None:
                started[0].wait()
        if self.gather_order is None:
            self.gather_order = self.order_now
        for u, new in self.new_shard.items():
            self.shard[u] = new
        self.full = {}
        return res


def fsdp_rank_main(rank: int, job: dict, *, step=None, comm=None) -> dict:
    """One FSDP rank: the replica's program (:func:`~.data_parallel.replica_program`; *step*: the
    capture, when the caller has it), its :class:`ShardedRunner` (*comm*: :class:`Collectives`),
    one checked step then the timed ones."""
    from .dist import timed_steps
    from .executor import LocalChannel

    prog, me, dev = replica_program(rank, job, step)
    comm = comm or Collectives()
    runner = ShardedRunner(prog, dev, me, LocalChannel({me: dev}), units=job["units"], stage=job["stage"], rank=rank,
                           k=len(job["ranks"]), passes=job["passes"],
                           stage_cpu=job["dist_backend"] == "gloo" and dev.type == "cuda", comm=comm,
                           rng_states=job["rng_states"][rank])
    first = runner.step()
    out: dict[str, Any] = {"rank": rank, "device": me, "loss": first["loss"].detach().cpu(),
                           "chunks": [c.detach().cpu() for c in runner.shard],
                           "params": {p: t.detach().cpu() for p, t in runner.state.items() if p in runner.unit_of},
                           "gathers": runner.gathers, "gathered_bytes": runner.gathered_bytes,
                           "scattered_bytes": runner.scattered_bytes}
    out.update(timed_steps(runner, me, warmup=job["warmup"], steps=job["steps"], barrier=comm.barrier))
    later = job["warmup"] - 1 + job["steps"]
    out["prefetched"] = runner.prefetched // later if later > 0 else 0    # per step after the first
    out["chunks_last"] = [c.detach().cpu() for c in runner.shard]          # after every step (the tests)
    return out


def assemble(pre: FSDPPrepared, results: list[dict]) -> dict[int, Any]:
    """The updated parameters from the ranks' chunks (rank order), unpadded and reshaped."""
    import torch

    out = {}
    for u, (_, ps) in enumerate(pre.units):
        flat = torch.cat([r["chunks"][u] for r in results])
        off = 0
        for p in ps:
            t = pre.step.state[p]
            out[p] = flat[off:off + t.numel()].view(t.shape)
            off += t.numel()
    return out


def fsdp_job(pre: FSDPPrepared, states: list, **kw) -> dict:
    """What every FSDP rank needs: data parallelism's job (:func:`~.data_parallel.replica_job`) plus
    the stage, the units' parameter indices and every node's pass."""
    job = replica_job(pre, states, **kw)
    job.update(stage=pre.stage, units=[ps for _, ps in pre.units], passes=pre.passes)
    return job


def check_results(pre: FSDPPrepared, results: list[dict], ref, *, rtol: float, atol: float) -> tuple[dict, float]:
    """The numerics (:func:`~.report.compare`) of the ranks' mean loss and the parameters assembled
    from their chunks against *ref*, and how far a rank's whole parameters (stages 1-2) are from
    the assembled ones (above *atol*: no match)."""
    import torch

    from .report import compare

    params = assemble(pre, results)
    numerics = compare(torch.tensor(sum(float(r["loss"]) for r in results) / pre.k), params, ref, rtol=rtol,
                       atol=atol)
    spread = max((float((r["params"][p] - params[p]).abs().max()) for r in results for p in r["params"]),
                 default=0.0)
    if spread > atol:
        numerics["match"] = False
    return numerics, spread


def run_fsdp(pre: FSDPPrepared, placement, cluster, *, label: str, steps: int, warmup: int, threads: int,
             timeout: float, rtol: float, atol: float, congestion: str, load, progress=None) -> dict:
    """Reference, the sharded replicas (:func:`fsdp_rank_main`), the ``placer.run/v1`` report with an
    ``fsdp`` section."""
    from ..profile.launch import launch
    from .reference import replica_reference

    say = progress or (lambda msg: None)
    ref, states = replica_reference(pre, threads, say)
    job = fsdp_job(pre, states, steps=steps, warmup=warmup, threads=threads, timeout=timeout)
    backend = job["dist_backend"]
    say(f"starting {pre.k} sharded replicas (stage {pre.stage}, {len(pre.units)} units, {backend}, batch "
        f"{pre.replica_batch} each, {threads} thread(s)): 1 checked step, {warmup - 1} more warm-up, {steps} timed")
    results = launch("celeritas_cli.run.fsdp_run", job, pre.k, timeout=timeout, what="placer run")
    numerics, spread = check_results(pre, results, ref, rtol=rtol, atol=atol)
    r0 = results[0]
    state, names = pre.step.state, pre.step.sm.state_names
    units = [{"name": name, "params": [names[p] for p in ps], "numel": sum(state[p].numel() for p in ps),
              "chunk_numel": -(-sum(state[p].numel() for p in ps) // pre.k)} for name, ps in pre.units]
    held = "its chunk of every unit's parameters" if pre.stage == 3 else "whole parameters"
    notes = [f"fsdp stage {pre.stage}: {pre.k} replicas of batch {pre.replica_batch} (global batch "
             f"{pre.global_batch}), {len(units)} units; each rank holds {held} and the Adam moments of its chunk; "
             f"sharded: {', '.join(SHARDED[pre.stage])}; the yardstick is the unplaced step on each shard with the "
             f"gradients averaged (as data parallelism)"
             + (f"; the ranks' whole parameters differ from the gathered chunks by at most {spread:.3g}"
                if pre.stage < 3 else ""),
             f"collectives are torch.distributed's ({backend}); from the second step on, "
             f"{r0.get('prefetched', 0)} of the {r0['gathers']} all-gathers per step and rank were prefetched one "
             f"ahead (FSDP 3.4; the first step records their order); {r0['gathered_bytes']} bytes "
             f"gathered, {r0['scattered_bytes']} gradient bytes reduce-scattered; bytes per link are the simulated "
             f"rings' only"]
    if pre.stage == 2:
        notes.append("stage 2 runs as stage 1 here: a full gradient lives until its update node, not freed after "
                     "its reduce-scatter")
    report = replica_report(pre, placement, cluster, results, numerics, notes, label=label, steps=steps,
                            warmup=warmup, threads=threads, congestion=congestion, load=load)
    report["batch_size"] = pre.global_batch
    report["fsdp"] = {"replicas": pre.k, "stage": pre.stage, "sharded": SHARDED[pre.stage],
                      "replica_batch": pre.replica_batch, "global_batch": pre.global_batch, "units": units,
                      "gathers_per_step": r0["gathers"], "prefetched_per_step": r0.get("prefetched", 0),
                      "gathered_bytes": r0["gathered_bytes"],
                      "reduce_scattered_bytes": r0["scattered_bytes"]}
    return report


if __name__ == "__main__":
    from ..profile.launch import worker_main

    worker_main(fsdp_rank_main)
