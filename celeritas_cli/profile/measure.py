"""``--measure``: time every node of a captured graph on the local device.

Celeritas 4.2.1 runs the model "for a few iterations" and FastT (section 4)
records each operation's real execution time per device.  Here each node's
aten call is replayed alone, after the constants it reads (a dropout mask, a
factory op: ``placer run`` makes them on the consumer's device, so they are
part of its time), on real tensors of the traced shapes and strides (floats
uniform in [0.5, 1.5): no negative or zero input turns a ``sqrt``, ``rsqrt``
or ``log`` into NaNs, whose slow path on CPUs would time something no
training step does; zero integers so indices stay valid) on CUDA when
present, else on the CPU: ``warmup`` runs, then ``repeats`` timed runs, keeping the minimum
(min-of-k is the usual estimator of an op's uncontended time).  On a CPU
with one torch thread (``--threads 1``, what each ``placer run --backend
gloo`` process gets on a small machine) the clock is the process's CPU time,
so that other jobs on a shared machine do not inflate the node times; else
the wall clock.  Noise is reported as ``(median - min) / min`` per node.

The measured time replaces ``compute_s`` (the local device becomes the
device of speed 1.0) and ``compute_by_type[<local type>]``; the roofline
times of the other device types stay.  Nodes whose call fails on random
inputs keep their roofline time and are counted in the summary.
"""

from __future__ import annotations

import math
import time

from .capture import Trace, require_torch
from ..model.devices import device_type_of


def local_device():
    """``(torch.device, type name)``: the first CUDA GPU if any, else the CPU."""
    torch = require_torch()
    if torch.cuda.is_available():
        return torch.device("cuda:0"), device_type_of(torch.cuda.get_device_name(0))
    return torch.device("cpu"), "cpu"


def _materialise(val, device, strided: bool = True):
    """A real tensor like traced value *val*: its shape, dtype and (with *strided*) strides."""
    import torch

    if not isinstance(val, torch.Tensor):
        return val
    shape = tuple(val.shape)
    stride = tuple(val.stride())
    if not strided or any(n == 0 for n in shape):
        size, shape_, stride_ = None, shape, None
    else:
        size, shape_, stride_ = 1 + sum((n - 1) * st for n, st in zip(shape, stride)), shape, stride
    flat = (size,) if size is not None else shape_
    if val.dtype.is_floating_point or val.dtype.is_complex:
        t = torch.rand(flat, dtype=val.dtype, device=device) + 0.5
    else:
        t = torch.zeros(flat, dtype=val.dtype, device=device)
    return t.as_strided(shape_, stride_) if size is not None else t


def _consts(fxn, src: dict) -> list:
    """The constants *fxn* reads (factory ops, dropout masks ...), in execution order: placer run
    makes them on the consumer's device, so their time is part of the consumer's."""
    order: list = []
    seen: set = set()

    def walk(a) -> None:
        for b in a.all_input_nodes:
            if b in seen or b.op != "call_function" or src.get(b, ("const",))[0] != "const":
                continue
            seen.add(b)
            walk(b)
            order.append(b)

    walk(fxn)
    return order


def _node_call(fxn, src: dict, device, strided: bool):
    """A no-argument callable replaying *fxn* (and the constants it reads) on materialised inputs."""
    from torch.fx.node import map_arg

    consts = _consts(fxn, src)
    made = {n: _materialise(n.meta.get("val"), device, strided)
            for c in consts + [fxn] for n in c.all_input_nodes if n not in consts}

    def kw(node, get):
        k = map_arg(node.kwargs, get)
        return dict(k, device=device) if "device" in k else k

    def call():
        env: dict = {}

        def get(n):
            return env[n] if n in env else made[n]

        for c in consts:
            env[c] = c.target(*map_arg(c.args, get), **kw(c, get))
        return fxn.target(*map_arg(fxn.args, get), **kw(fxn, get))

    return call


def measure_doc(doc: dict, tr: Trace, *, warmup: int = 2, repeats: int = 5, threads: int | None = None,
                progress=None) -> dict:
    """Time each node of *doc* (captured from *tr*) and write the times into it.

    *threads* sets torch's intra-op threads while measuring (on the CPU, a
    node's time depends on it: measure with the threads each ``placer run``
    process will have).

    Returns
    -------
    dict, the summary: ``device``, ``threads``, ``measured``, ``failed``,
    ``noise_median``, ``noise_p90`` and ``noisy`` (nodes with noise above
    20 %).  The same summary is stored in ``doc["meta"]["measured"]``.
    """
    torch = require_torch()

    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(doc, tr, warmup, repeats, progress)
    finally:
        torch.set_num_threads(saved)


def _measure(doc: dict, tr: Trace, warmup: int, repeats: int, progress) -> dict:
    import torch

    from .stepmap import map_trace

    sm = map_trace(tr)
    device, dtype_name = local_device()
    by_name = {n.name: n for n in tr.gm.graph.nodes if n.op == "call_function"}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # one CPU thread: the process's CPU time is the op's time without the waits for a CPU that other
    # jobs on a shared machine cause (wall-clock min-of-k does not filter waits longer than an op)
    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.process_time if cpu_clock else time.perf_counter
    noises: list[float] = []
    failed = 0
    measured = 0
    total = len(doc["nodes"])
    for i, nd in enumerate(doc["nodes"]):
        fxn = by_name.get(nd["id"])
        if fxn is None and nd.get("op") != "optim.adam":
            continue
        if progress and i % 200 == 0:
            progress(f"measuring node {i}/{total} on {dtype_name}")
        try:
            if fxn is None:       # one Adam step on a parameter of this size (see capture: 12 FLOPs/element)
                from .optim import adam_update  # the update placer run executes

                n = max(1, int(nd.get("flops", 12)) // 12)
                p, g = torch.randn(n, device=device), torch.randn(n, device=device)
                m, v = torch.zeros(n, device=device), torch.zeros(n, device=device)
                target, args, kwargs = adam_update, (p, g, m, v, 1), {}
            else:
                target, args, kwargs = _node_call(fxn, sm.src, device, True), (), {}
                try:
                    with torch.no_grad():
                        target()
                except Exception:  # noqa: BLE001 - e.g. an in-place op on an input traced as overlapping
                    target = _node_call(fxn, sm.src, device, False)
            times = []
            with torch.no_grad():
                for r in range(warmup + repeats):
                    sync()
                    t0 = clock()
                    target(*args, **kwargs)
                    sync()
                    if r >= warmup:
                        times.append(clock() - t0)
            del target, args, kwargs
        except Exception:  # noqa: BLE001 - an op that cannot run on random inputs keeps its roofline time
            failed += 1
            continue
        times.sort()
        best = times[0]
        med = times[len(times) // 2]
        noises.append((med - best) / best if best > 0 else 0.0)
        nd["compute_s"] = best
        nd.setdefault("compute_by_type", {})[dtype_name] = best
        measured += 1
    noises.sort()
    summary = {"device": dtype_name, "threads": torch.get_num_threads(), "measured": measured, "failed": failed,
               "repeats": repeats, "warmup": warmup, "estimator": "min-of-k",
               "clock": "process CPU time" if cpu_clock else "wall",
               "noise_median": noises[len(noises) // 2] if noises else 0.0,
               "noise_p90": noises[min(len(noises) - 1, int(0.9 * len(noises)))] if noises else 0.0,
               "noisy": sum(x > 0.2 for x in noises)}
    doc.setdefault("meta", {})["measured"] = summary
    if math.isfinite(summary["noise_median"]):
        summary["noise_median"] = round(summary["noise_median"], 4)
        summary["noise_p90"] = round(summary["noise_p90"], 4)
    return summary
