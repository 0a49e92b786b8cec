"""Execute a :class:`~celeritas_cli.run.program.Program`: every graph node on
its device, every cross-device tensor through a *channel* (explicit copies in
one process, :mod:`torch.distributed` sends between processes).

:class:`Runner` is shared by both backends; it runs the nodes of the devices
it owns, in the program's sequence, and asks its channel for remote values.

- Values: a graph node's outputs stay on its device until their last reader
  there has run; a derived value (a view, a constant, a dropout mask) is
  computed on each device that reads it and kept until its last reader.
- Random ops replay the generator state the reference step saw just before
  them (:mod:`.reference`), so a dropout mask made on two devices, or in two
  processes, is the reference's mask.
- The optimizer update (``optim.adam`` nodes) runs on its placed device with
  the exact arithmetic of ``torch.optim.Adam`` (single-tensor path), out of
  place: nodes that read the parameter later in the same step still see the
  old value, as in the unplaced step; the new value is committed when the
  step ends.
- Timing: per node wall time on CPU devices (``time.perf_counter``), CUDA
  events on GPUs; a node's busy time excludes waiting for its inputs.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Any

from ..profile.optim import adam_update

#: Adam hyper-parameters (torch.optim.Adam's defaults).
ADAM = {"lr": 1.0e-3, "betas": (0.9, 0.999), "eps": 1.0e-8}


def is_random(fxn) -> bool:
    """True for an fx call of a seeded random aten op (``bernoulli_``, ``native_dropout`` ...)."""
    import torch

    tags = getattr(fxn.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def rng_state(device):
    """The generator state of *device* (CPU or one CUDA device)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def set_rng_state(device, state) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class Timer:
    """Busy time per device: wall time (perf_counter) and process CPU time
    (process_time) on CPU devices, CUDA events on GPUs (read at :meth:`totals`).
    On a loaded machine the CPU time is the busy time a device would have had
    alone; the wall time includes waiting for a CPU.  With *per_node*, every
    node's wall time and the CPU time of the thread that ran it (``time.thread_time``:
    without the backend's threads) are kept too (:meth:`node_rows`, ``placer run --node-times``)."""

    def __init__(self, torch_devices: dict[int, Any], per_node: bool = False):
        self.devs = torch_devices
        self.wall: dict[int, float] = {d: 0.0 for d in torch_devices}
        self.cpu: dict[int, float | None] = {d: (None if dev.type == "cuda" else 0.0)
                                             for d, dev in torch_devices.items()}
        self.events: dict[int, list] = {d: [] for d in torch_devices}
        self.per_node = per_node
        self.nodes: list[list] = []          # [v, d, host start (perf_counter), wall s or (event, event), cpu s]

    def start(self, d: int):
        dev = self.devs[d]
        if dev.type == "cuda":
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(dev))
            return ev, time.perf_counter()
        return time.perf_counter(), time.process_time(), time.thread_time()

    def stop(self, d: int, mark, v: int = -1) -> None:
        dev = self.devs[d]
        if dev.type == "cuda":
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(dev))
            self.events[d].append((mark[0], ev))
            if self.per_node:
                self.nodes.append([v, d, mark[1], (mark[0], ev), None])
        else:
            wall = time.perf_counter() - mark[0]
            cpu = time.process_time() - mark[1]
            self.wall[d] += wall
            self.cpu[d] += cpu
            if self.per_node:   # the node's thread: excludes the backend's threads (an all-reduce) and CPU waits
                self.nodes.append([v, d, mark[0], wall, time.thread_time() - mark[2]])

    def totals(self) -> dict[int, float]:
        """Wall (GPU: event) busy seconds per device."""
        out = dict(self.wall)
        for d, pairs in self.events.items():
            for a, b in pairs:
                b.synchronize()
                out[d] += a.elapsed_time(b) / 1000.0
        return out

    def node_rows(self, origin: float) -> list[tuple]:
        """``(node, device, start_s, wall_s, cpu_s or None)`` per node run, start relative to *origin*."""
        rows = []
        for v, d, t0, wall, cpu in self.nodes:
            if isinstance(wall, tuple):
                wall[1].synchronize()
                wall = wall[0].elapsed_time(wall[1]) / 1000.0
            rows.append((v, d, t0 - origin, wall, cpu))
        return rows


def stand_in(meta, device):
    """An uninitialised tensor with the shape, strides and dtype of traced value *meta*."""
    import torch

    return torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype, device=device)


def synchronize(devices) -> None:
    """Wait for every CUDA device among *devices* (torch devices)."""
    import torch

    for dev in devices:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)


def bind(fxn, value, device, *, shape_only: bool = False, src: dict | None = None, make=None):
    """``(args, kwargs)`` of fx call *fxn*: every input node ``n`` mapped to ``value(n)``, a
    ``device`` keyword set to *device* (what the runners execute and the exporters emit).  With
    *shape_only* (a factory op such as ``empty_like(x)``: ``x`` lends only its shape, strides and
    dtype), an input that is not a constant (*src*: the step map's) is ``make(traced value)``."""
    from torch.fx.node import map_arg

    def arg(n):
        if shape_only and src.get(n, ("const",))[0] != "const":
            return make(n.meta["val"])
        return value(n)

    args = map_arg(fxn.args, arg)
    kwargs = map_arg(fxn.kwargs, arg)
    if "device" in kwargs:
        kwargs = dict(kwargs, device=device)
    return args, kwargs


@contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to *n* inside the block, restored after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def median(values: list) -> float | None:
    """The median of *values*; ``None`` when there are none or one is ``None`` (a GPU's CPU time)."""
    return None if not values or any(v is None for v in values) else statistics.median(values)


class Executor:
    """The step loop every runner shares (:class:`Runner`, :class:`~.derived_executor.DerivedRunner`, the
    fsdp rank's :class:`~.fsdp_run.ShardedRunner`): the nodes of the devices *mine* of *prog* in
    its sequence, each node's received values fetched from the channel just before it, its sends
    posted when it finishes, values freed after their last reader, the updates committed when the
    step ends.

    A subclass sets ``state`` (the values the updates replace) and defines ``run_node(x, d)``,
    ``send_value(t)`` (the value transfer *t* carries, on its source device) and ``losses()``.
    """

    node_hook = None
    node_times = False

    def __init__(self, prog, torch_devices: dict[int, Any], mine, channel, rng_states: dict | None = None,
                 adam: dict | None = None):
        import torch

        self.prog, self.channel = prog, channel
        self.devs = {d: torch.device(torch_devices[d]) for d in mine}
        self.mine = set(mine)
        self.seq = [v for v in prog.sequence if prog.device_of[v] in self.mine]
        self.free = prog.free_after(self.mine)
        self.rng_states = rng_states or {}
        self.adam = dict(ADAM, **(adam or {}))
        self.moments: dict[Any, tuple] = {}               # update key -> Adam's two moments
        self.steps_done: dict[Any, int] = {}
        self.unowned: dict[tuple, Any] = {}
        self.env: dict[int, dict] = {d: {} for d in self.mine}
        self.pending: dict[Any, Any] = {}

    def adam_update(self, param, grad, moments: tuple, count: int):
        """``torch.optim.Adam``'s arithmetic (:func:`~celeritas_cli.profile.optim.adam_update`) at step *count*."""
        a = self.adam
        return adam_update(param, grad, *moments, count, lr=a["lr"], betas=a["betas"], eps=a["eps"])

    def update(self, key, param, grad) -> None:
        """The update of *key* (a parameter, or a replica's parameter): out of place, committed at the step's end."""
        self.steps_done[key] += 1
        self.pending[key] = self.adam_update(param, grad, self.moments[key], self.steps_done[key])

    def end_step(self) -> None:
        """What a subclass drops when a step ends (after the values and the updates)."""

    def step(self) -> dict:
        """Run one step; return ``{"loss", "busy", "cpu", "wall_s"}`` (busy and CPU
        seconds per device; loss: :meth:`losses`); with ``node_times`` also ``"t_start"``
        (perf_counter), ``"cpu_step"`` (this thread's CPU time in the step), ``"nodes"``
        (:meth:`Timer.node_rows`) and ``"events"`` (the channel's transfer events, :mod:`.timing`)."""
        prog = self.prog
        timer = Timer(self.devs, per_node=self.node_times)
        t_start = time.perf_counter()
        c_start = time.thread_time()
        self.channel.begin()
        for v in self.seq:
            d = prog.device_of[v]
            for ti in prog.needs[v]:
                t = prog.transfers[ti]
                if t.key not in self.env[d]:
                    self.env[d][t.key] = self.channel.fetch(t)
            mark = timer.start(d)
            self.run_node(v, d)
            timer.stop(d, mark, v)
            for ti in prog.sends[v]:
                t = prog.transfers[ti]
                self.channel.send(t, self.send_value(t))
            if self.node_hook is not None:
                self.node_hook(v, d, self)
            for dd, key in self.free.get(prog.position[v], ()):
                self.env[dd].pop(key, None)
        loss = self.losses()
        self.channel.end()
        synchronize(self.devs.values())
        wall = time.perf_counter() - t_start
        self.state.update(self.pending)
        self.pending = {}
        for d in self.mine:
            self.env[d].clear()
        self.end_step()
        out = {"loss": loss, "busy": timer.totals(), "cpu": dict(timer.cpu), "wall_s": wall}
        if self.node_times:
            out.update(t_start=t_start, cpu_step=time.thread_time() - c_start, nodes=timer.node_rows(t_start),
                       events=list(getattr(self.channel, "events", ())))
        return out


class Runner(Executor):
    """Runs the nodes of the devices *mine* of a program, one step at a time.

    Parameters
    ----------
    prog : the :class:`~celeritas_cli.run.program.Program`.
    torch_devices : cluster device index -> ``torch.device`` (for the devices in *mine*).
    mine : cluster device indices this process runs.
    channel : moves values between devices (:class:`LocalChannel`, or the distributed one).
    rng_states : fx node name -> generator state to replay before that random op.
    adam : Adam hyper-parameters (default :data:`ADAM`).
    grad_hook : ``hook(param_index, grad) -> grad`` applied before each update, and
    node_hook : ``hook(node, device, runner)`` called after each node (and its sends): the seams of
        data parallelism (:mod:`.data_parallel`: start a gradient's all-reduce when its producer
        has run, wait for it before the update).
    node_times : keep every node's time and the channel's transfer events in each step's result
        (``placer run --node-times``, :mod:`.timing`).
    """

    def __init__(self, prog, torch_devices: dict[int, Any], mine, channel, rng_states: dict | None = None,
                 adam: dict | None = None, grad_hook=None, node_hook=None, node_times: bool = False):
        import torch

        super().__init__(prog, torch_devices, mine, channel, rng_states, adam)
        self.sm = prog.sm
        self.grad_hook = grad_hook
        self.node_hook = node_hook
        self.node_times = node_times
        step = prog.step
        self.gm = step.tr.gm
        self.state: dict[int, Any] = {}                   # state index -> tensor on its home device
        for s in range(len(step.state)):
            home = prog.home(("state", s))
            if home in self.mine:
                self.state[s] = step.state[s].to(self.devs[home], copy=True)
        self.inputs: dict[int, Any] = {}
        for v, fx in enumerate(self.sm.fx_of):
            if fx is not None and fx.op == "placeholder" and prog.device_of[v] in self.mine:
                j = self.sm.ids[v]
                val = step.target if j == "target" else step.inputs[int(j.split("_")[1])]
                self.inputs[v] = val.to(self.devs[prog.device_of[v]], copy=True)
        for v, p in self.sm.opt_param.items():
            if prog.device_of[v] in self.mine:
                dev = self.devs[prog.device_of[v]]
                self.moments[p] = (torch.zeros_like(step.state[p], device=dev),
                                   torch.zeros_like(step.state[p], device=dev))
                self.steps_done[p] = 0

    # ------------------------------------------------------------ values
    def value(self, a, d: int):
        """The value of fx node *a* on device *d*."""
        role = self.prog.role[a]
        kind = role[0]
        env = self.env[d]
        if kind in ("out", "state"):
            home = self.prog.home(role)
            if kind == "state" and home == d:
                return self.state[role[1]]
            if kind == "state" and home == -1:
                return self._unowned(role[1], d)
            if role in env:
                return env[role]
            if home == d:
                raise RuntimeError(f"{a.name} is read on device {d} before its producer ran (order bug)")
            val = self.channel.fetch(self.prog.transfers[self.prog.transfer_of[(role, d)]])
            env[role] = val
            return val
        if kind in ("derived", "factory"):
            if a not in env:
                env[a] = self.call(a, d, shape_only=kind == "factory")
            return env[a]
        if kind == "attr":
            if a not in env:
                env[a] = getattr(self.gm, a.target).to(self.devs[d])
            return env[a]
        return None

    def _unowned(self, s: int, d: int):
        if (s, d) not in self.unowned:
            self.unowned[(s, d)] = self.prog.step.state[s].to(self.devs[d], copy=True)
        return self.unowned[(s, d)]

    def call(self, fxn, d: int, shape_only: bool = False):
        """Run fx call *fxn* on device *d* (its inputs resolved there).  With
        *shape_only* (a factory op), inputs that are not constants are
        stand-ins of their traced shape, strides and dtype."""
        dev = self.devs[d]
        args, kwargs = bind(fxn, lambda n: self.value(n, d), dev, shape_only=shape_only, src=self.sm.src,
                            make=lambda m: stand_in(m, dev))
        if fxn.name in self.rng_states:
            set_rng_state(self.devs[d], self.rng_states[fxn.name])
        return fxn.target(*args, **kwargs)

    def run_node(self, v: int, d: int) -> None:
        sm = self.sm
        env = self.env[d]
        if v in sm.opt_param:
            p = sm.opt_param[v]
            grad = self.value(sm.grad_fx[v], d)
            if self.grad_hook is not None:
                grad = self.grad_hook(p, grad)
            self.update(p, self.value(self.prog.placeholder_of_state[p], d), grad)
            return
        fx = sm.fx_of[v]
        out = self.inputs[v] if fx.op == "placeholder" else self.call(fx, d)
        if isinstance(out, (tuple, list)):
            for k, o in enumerate(out):
                env[("out", v, k)] = o
        else:
            env[("out", v, 0)] = out

    def send_value(self, t):
        """The value transfer *t* carries, on its source device."""
        if t.key[0] == "state":
            return self.state[t.key[1]]
        return self.env[t.src][t.key]

    def losses(self):
        """The loss, ``None`` when the loss node is on another process."""
        prog = self.prog
        return self.value(self.sm.loss, prog.loss_device) if prog.loss_device in self.mine else None

    def params(self) -> dict[int, Any]:
        """Current value of every parameter updated on this process's devices."""
        return {p: self.state[p] for p in self.moments if p in self.state}


class LocalChannel:
    """Transfers inside one process: an explicit copy to the destination
    device, made when the producer finishes (a clone when both cluster devices
    map to the same torch device), once per (tensor, destination device)."""

    def __init__(self, torch_devices: dict[int, Any]):
        import torch

        self.devs = {d: torch.device(x) for d, x in torch_devices.items()}
        self.copies: dict[int, Any] = {}
        self.link: dict[tuple[int, int], list] = {}       # (src, dst) -> [bytes, transfers, seconds]
        self.events: list[tuple] = []                      # ("copy", transfer, t0, t1) of timed copies

    def begin(self) -> None:
        self.copies = {}
        self.events = []

    def send(self, t, value) -> None:
        dst = self.devs[t.dst]
        timed = dst.type == "cpu" and self.devs[t.src].type == "cpu"
        t0 = time.perf_counter()
        if dst == value.device:
            copy = value.clone()
        else:   # asynchronous only into a GPU: a non-blocking copy to the CPU may be read before it lands
            copy = value.to(dst, non_blocking=dst.type == "cuda", copy=True)
        row = self.link.setdefault((t.src, t.dst), [0, 0, 0.0 if timed else None])
        row[0] += copy.numel() * copy.element_size()
        row[1] += 1
        if timed:
            t1 = time.perf_counter()
            row[2] += t1 - t0
            self.events.append(("copy", t.index, t0, t1))
        self.copies[t.index] = copy

    def fetch(self, t):
        return self.copies.pop(t.index)

    def end(self) -> None:
        self.copies = {}


def cpu_loss(loss):
    """A step's ``"loss"`` on the CPU: one tensor, ``{instance: tensor}`` (a derived program) or ``None``."""
    if loss is None:
        return None
    return {i: v.detach().cpu() for i, v in loss.items()} if isinstance(loss, dict) else loss.detach().cpu()


def measure_local(runner, channel: LocalChannel, *, steps: int, warmup: int, node_times: bool = False,
                  link_seconds: bool = True) -> dict:
    """Every device in this process: the checked step (its loss and parameters, CPU), ``warmup - 1``
    more warm-up steps, then *steps* timed ones: walls, median busy and CPU seconds per device, the
    first step's bytes per link (with the timed steps' median copy seconds when *link_seconds*),
    and with *node_times* one :func:`.timing.record` per timed step."""
    from .timing import host, record

    devices = sorted(runner.mine)
    timing: list[dict] = []
    first = runner.step()
    loss = cpu_loss(first["loss"])
    params = {p: t.detach().cpu() for p, t in runner.params().items()}
    link = {k: list(v) for k, v in channel.link.items()}
    walls, busy, cpu = [], {d: [] for d in devices}, {d: [] for d in devices}
    link_s: dict[tuple[int, int], list] = {}
    for i in range(warmup - 1 + steps):
        channel.link = {}
        res = runner.step()
        if i >= warmup - 1:
            walls.append(res["wall_s"])
            for d, b in res["busy"].items():
                busy[d].append(b)
                cpu[d].append(res["cpu"][d])
            for k, row in channel.link.items():
                link_s.setdefault(k, []).append(row[2])
            if node_times:
                timing.append(record(res))
    for k, row in link.items():
        row[2] = median(link_s.get(k)) if link_seconds else None
    return {"loss": loss, "params": params, "walls": walls,
            "busy": {d: statistics.median(b) for d, b in busy.items()}, "cpu": {d: median(c) for d, c in cpu.items()},
            "link": link, "timing": [{"device": None, "host": host(), "timing": timing}]}
