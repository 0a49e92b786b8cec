"""The communication cost model t = k·d + b (Celeritas 4.2.1, FastT section 4).

Celeritas 4.2.1: "the communication costs among nodes can be determined by a
linear fit t = kd + b, where d is the transmitted data size, and k and b are
constants calculated in advance using off-line analysis".  FastT (section 4,
Cost Models) groups transfers by source-destination device pair and fits
one line per group.  :func:`fit_cluster` does exactly that and writes the
result as a ``placer.cluster/v1`` document (bandwidth = 1/k, latency = b);
:func:`comm_bench` measures the samples on a machine with several CUDA GPUs
(torch imported lazily).

The samples file — ``placer.comm_samples/v1``
---------------------------------------------
JSON Schema: ``schemas/comm_samples.schema.json``; an example:
``examples/comm_samples.json``::

    {"schema": "placer.comm_samples/v1",
     "name": "my-4gpu-box",                                       # optional
     "devices": [{"id": "gpu0", "type": "V100", "memory_bytes": 34359738368}],  # optional
     "samples": [{"src": "gpu0", "dst": "gpu1", "bytes": 1048576, "seconds": 1.1e-4}]}

Each ordered pair with samples at two or more distinct sizes gets its own
link; the ``default`` link is the fit over all samples pooled.  Without
``devices``, the ids are taken from the samples (type ``generic``, 32 GiB,
with a warning).

Example
-------
>>> doc = {"schema": "placer.comm_samples/v1",
...        "devices": [{"id": "a", "memory_bytes": 1}, {"id": "b", "memory_bytes": 1}],
...        "samples": [{"src": "a", "dst": "b", "bytes": 0, "seconds": 1e-5},
...                    {"src": "a", "dst": "b", "bytes": 1e9, "seconds": 0.10001}]}
>>> c = fit_cluster(doc)
>>> round(c["links"]["default"]["bandwidth_Bps"] / 1e9, 3), round(c["links"]["default"]["latency_s"], 9)
(10.0, 1e-05)
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInput, MissingDependency
from ..model.jsonio import validate
from .regression import fit_line

SAMPLES_SCHEMA = "placer.comm_samples/v1"
GiB = 1024**3


def _r2(xs: list[float], ys: list[float], a: float, b: float) -> float:
    my = math.fsum(ys) / len(ys)
    ss_tot = math.fsum((y - my) ** 2 for y in ys)
    ss_res = math.fsum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def _fit_relative(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares on relative residuals (weights 1/y^2): ``(a, b)`` of ``y = a + b x``."""
    w = [1.0 / (y * y) if y > 0 else 0.0 for y in ys]
    sw = math.fsum(w)
    sx = math.fsum(wi * x for wi, x in zip(w, xs))
    sy = math.fsum(wi * y for wi, y in zip(w, ys))
    sxx = math.fsum(wi * x * x for wi, x in zip(w, xs))
    sxy = math.fsum(wi * x * y for wi, x, y in zip(w, xs, ys))
    den = sw * sxx - sx * sx
    if sw <= 0 or den <= 0:
        return fit_line(xs, ys)
    b = (sw * sxy - sx * sy) / den
    return (sy - b * sx) / sw, b


def fit_link(samples: list[tuple[float, float]], where: str, *, weighting: str = "none") -> dict:
    """Fit ``seconds = k * bytes + b`` to ``(bytes, seconds)`` pairs.

    ``weighting="none"`` is the plain least-squares line of Celeritas 4.2.1;
    ``"relative"`` minimises relative residuals (weights 1/t^2), so that
    with sizes spanning several orders of magnitude the latency ``b`` is
    fitted on the small transfers and the slope on the large ones instead
    of both on the largest (used for ``--comm-bench --processes``).

    Example
    -------
    >>> pts = [(1e3, 1.01e-4), (1e5, 2.0e-4), (1e6, 1.1e-3), (1e8, 0.12)]   # 100 us + 1 GB/s, last one slow
    >>> plain, rel = fit_link(pts, "x"), fit_link(pts, "x", weighting="relative")
    >>> round(plain["latency_s"], 6), round(rel["latency_s"], 6)
    (2.7e-05, 9.8e-05)

    Returns
    -------
    dict with ``k`` (s/byte), ``b`` (s), ``bandwidth_Bps`` = 1/k,
    ``latency_s`` = max(b, 0), ``r2`` and ``n``.

    Raises
    ------
    InvalidInput
        Fewer than two distinct sizes, or a non-positive slope (time does
        not grow with size: the samples are noise).
    """
    xs = [float(d) for d, _ in samples]
    ys = [float(t) for _, t in samples]
    if len(set(xs)) < 2:
        raise InvalidInput(f"{where}: need samples at two or more distinct byte sizes to fit t = k*d + b")
    b, k = _fit_relative(xs, ys) if weighting == "relative" else fit_line(xs, ys)
    if not k > 0:
        raise InvalidInput(f"{where}: fitted slope k = {k:.3g} s/byte is not positive; the samples do not grow "
                           f"with size (measure larger transfers)")
    return {"k": k, "b": b, "bandwidth_Bps": 1.0 / k, "latency_s": max(0.0, b), "r2": _r2(xs, ys, b, k),
            "n": len(xs)}


def check_samples(doc: Any, label: str = "samples") -> dict:
    """Validate a ``placer.comm_samples/v1`` document (see the module docstring)."""
    if not isinstance(doc, dict) or doc.get("schema") != SAMPLES_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidInput(f"{label}: field schema is {got!r}, expected \"{SAMPLES_SCHEMA}\"")
    samples = doc.get("samples")
    if not isinstance(samples, list) or not samples:
        raise InvalidInput(f"{label}: field samples: expected a non-empty list of {{src, dst, bytes, seconds}}")
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            raise InvalidInput(f"{label}: sample #{i}: expected an object")
        for f in ("src", "dst"):
            if not isinstance(s.get(f), str):
                raise InvalidInput(f"{label}: sample #{i}: missing string field {f}")
        if s["src"] == s["dst"]:
            raise InvalidInput(f"{label}: sample #{i}: src and dst are both '{s['src']}'")
        for f in ("bytes", "seconds"):
            v = s.get(f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidInput(f"{label}: sample #{i} ({s['src']}->{s['dst']}) field {f}: "
                                   f"expected a finite number >= 0, got {v!r}")
    devices = doc.get("devices")
    if devices is not None:
        if not isinstance(devices, list) or not all(isinstance(d, dict) and isinstance(d.get("id"), str)
                                                    for d in devices):
            raise InvalidInput(f"{label}: field devices: expected a list of {{id, type, memory_bytes}}")
        known = {d["id"] for d in devices}
        for i, s in enumerate(samples):
            for f in ("src", "dst"):
                if s[f] not in known:
                    raise InvalidInput(f"{label}: sample #{i}: unknown device '{s[f]}' (not in devices)")
    validate(doc, SAMPLES_SCHEMA, label)  # ranges and types (schemas/comm_samples.schema.json)
    return doc


def fit_cluster(doc: dict, *, label: str = "samples", name: str | None = None, warn=None,
                weighting: str = "none") -> dict:
    """Fit every device pair of a samples document; return a cluster document.

    Parameters
    ----------
    doc : ``placer.comm_samples/v1`` document.
    name : cluster name (default: the document's, else ``fitted``).
    weighting : ``none`` or ``relative`` (:func:`fit_link`).
    warn : callable taking one line, for warnings (default: silent).

    Returns
    -------
    dict, a ``placer.cluster/v1`` document; ``meta.fit`` records k, b, R²
    and the sample count per pair.

    References
    ----------
    Celeritas 4.2.1 (t = k·d + b); FastT section 4 (one fit per device pair).
    """
    check_samples(doc, label)
    samples = doc["samples"]
    if doc.get("devices") is not None:
        devices = [{"id": d["id"], "type": d.get("type", "generic"),
                    "memory_bytes": int(d.get("memory_bytes", 32 * GiB)), "speed": float(d.get("speed", 1.0))}
                   for d in doc["devices"]]
    else:
        ids: list[str] = []
        for s in samples:
            for f in ("src", "dst"):
                if s[f] not in ids:
                    ids.append(s[f])
        if warn:
            warn(f"{label}: no devices listed; assuming type 'generic' with 32 GiB each for {', '.join(ids)}")
        devices = [{"id": i, "type": "generic", "memory_bytes": 32 * GiB, "speed": 1.0} for i in ids]
    by_pair: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in samples:
        by_pair.setdefault((s["src"], s["dst"]), []).append((float(s["bytes"]), float(s["seconds"])))
    pooled = fit_link([(float(s["bytes"]), float(s["seconds"])) for s in samples], f"{label}: all samples",
                      weighting=weighting)
    pairs, fits = [], {}
    order = {d["id"]: i for i, d in enumerate(devices)}
    for (src, dst) in sorted(by_pair, key=lambda p: (order[p[0]], order[p[1]])):
        pts = by_pair[(src, dst)]
        if len({d for d, _ in pts}) < 2:
            if warn:
                warn(f"{label}: pair {src}->{dst} has samples at one size only; it uses the pooled default link")
            continue
        f = fit_link(pts, f"{label}: pair {src}->{dst}", weighting=weighting)
        pairs.append({"src": src, "dst": dst, "bandwidth_Bps": f["bandwidth_Bps"], "latency_s": f["latency_s"]})
        fits[f"{src}->{dst}"] = {k: f[k] for k in ("k", "b", "r2", "n")}
    fits["default"] = {k: pooled[k] for k in ("k", "b", "r2", "n")}
    return {"schema": "placer.cluster/v1", "name": name or doc.get("name") or "fitted",
            "meta": {"source": "placer profile --comm-fit: t = k*d + b per device pair (Celeritas 4.2.1)",
                     "weighting": weighting, "fit": fits},
            "devices": devices,
            "links": {"default": {"bandwidth_Bps": pooled["bandwidth_Bps"], "latency_s": pooled["latency_s"]},
                      "pairs": pairs}}


def comm_bench(*, sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2, progress=None) -> dict:
    """Measure peer-to-peer copy times between every ordered pair of local CUDA GPUs.

    For each pair and each size (default 1 KiB ... 256 MiB, powers of 4), a
    float32 buffer is copied ``warmup`` times, then ``repeats`` times with
    CUDA events; the minimum is kept (min-of-k).

    Returns
    -------
    dict, a ``placer.comm_samples/v1`` document for :func:`fit_cluster`.

    Raises
    ------
    MissingDependency
        torch is not installed.
    InvalidInput
        Fewer than two CUDA devices.
    """
    try:
        import torch
    except ImportError:
        raise MissingDependency("--comm-bench needs torch: pip install -e .[torch]") from None
    from ..model.devices import device_type_of

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        raise InvalidInput(f"--comm-bench needs a machine with two or more CUDA GPUs, this one has {n}; add "
                           f"--processes 2 to measure transfers between processes (placer run --backend gloo), "
                           f"or measure elsewhere and use --comm-fit samples.json")
    sizes = sizes or [1024 * 4**i for i in range(10)]
    devices = []
    for i in range(n):
        props = torch.cuda.get_device_properties(i)
        devices.append({"id": f"gpu{i}", "type": device_type_of(props.name), "memory_bytes": int(props.total_memory)})
    samples = []
    for a in range(n):
        for c in range(n):
            if a == c:
                continue
            if progress:
                progress(f"comm-bench gpu{a}->gpu{c}")
            for size in sizes:
                src = torch.empty(size // 4, dtype=torch.float32, device=f"cuda:{a}")
                dst = torch.empty(size // 4, dtype=torch.float32, device=f"cuda:{c}")
                best = math.inf
                for r in range(warmup + repeats):
                    torch.cuda.synchronize(a)
                    torch.cuda.synchronize(c)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    with torch.cuda.device(a):
                        start.record()
                        dst.copy_(src, non_blocking=True)
                        end.record()
                    end.synchronize()
                    torch.cuda.synchronize(c)
                    if r >= warmup:
                        best = min(best, start.elapsed_time(end) / 1000.0)
                samples.append({"src": f"gpu{a}", "dst": f"gpu{c}", "bytes": (size // 4) * 4, "seconds": best})
                del src, dst
    return {"schema": SAMPLES_SCHEMA, "name": f"{n}x{devices[0]['type']}-measured", "devices": devices,
            "samples": samples}
