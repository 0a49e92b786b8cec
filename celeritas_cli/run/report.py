"""The ``placer.run/v1`` report: numerics check, measured vs simulated times,
bytes per link, and its table for people (``--format table``).

Fields (JSON Schema ``schemas/run.schema.json``):

- ``match``: loss and every updated parameter equal the unplaced step's
  within ``tolerance`` (``|a - b| <= atol + rtol * |b|``, elementwise);
  ``loss_max_abs_diff`` and ``params_max_abs_diff`` are the largest differences.
- ``measured_step_s``: median wall time of the timed steps (with several
  processes: per step the slowest rank's), ``measured_min_step_s`` the
  fastest of them (min-of-k, as ``--measure`` times nodes); ``simulated_step_s``: the
  simulator's makespan for the same graph, placement and cluster;
  ``measured_over_simulated`` their ratio.
- ``devices``: per device, the torch device it ran on, its nodes, and busy
  time measured (median over the timed steps of the sum of its nodes' wall
  times), the CPU time its process spent in them (CPU devices: on a loaded
  machine, what the busy time would be without waiting for a CPU) and the
  simulated busy time.
- ``load_average``: the machine's 1-minute load average when the run started,
  and ``cpus``: when the load exceeds the CPUs, measured wall times include
  waiting for a CPU (a note says so).
- ``links``: per directed link, bytes and transfers sent in one step, next to
  the simulator's (they are equal by construction: both come from the same
  capture), and the measured copy time where it could be timed (CPU copies in
  one process).
- ``notes``: what limits the comparison (roofline costs, devices sharing one
  CPU, ...).
"""

from __future__ import annotations

import os
import statistics

RUN_SCHEMA = "placer.run/v1"


def compare(loss, params: dict, ref, *, rtol: float, atol: float) -> dict:
    """Numerics of the placed step against the :class:`~.reference.Reference`.

    Example
    -------
    >>> import torch
    >>> from celeritas_cli.run.reference import Reference
    >>> ref = Reference(loss=torch.tensor(1.0), params={0: torch.ones(2)})
    >>> c = compare(torch.tensor(1.0), {0: torch.tensor([1.0, 1.5])}, ref, rtol=0.0, atol=0.1)
    >>> c["match"], c["params_max_abs_diff"]
    (False, 0.5)
    """
    import torch

    ref_loss = float(ref.loss)
    got = float(loss) if loss is not None else float("nan")
    loss_diff = abs(got - ref_loss)
    loss_ok = loss_diff <= atol + rtol * abs(ref_loss)
    worst = 0.0
    ok = set(params) == set(ref.params)
    for p, want in ref.params.items():
        have = params.get(p)
        if have is None:
            continue
        have = have.to(want.dtype)
        diff = (have - want).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok = ok and bool(torch.allclose(have, want, rtol=rtol, atol=atol))
    return {"match": bool(loss_ok and ok), "loss": got, "reference_loss": ref_loss, "loss_max_abs_diff": loss_diff,
            "params_compared": len(ref.params), "params_max_abs_diff": worst,
            "tolerance": {"rtol": rtol, "atol": atol}, "reference_device": ref.device}


def _notes(sim_graph, cluster, tdev: dict, used: list[int], graph_from_file: bool, backend: str,
           load: float | None) -> list[str]:
    notes = []
    types = {cluster.devices[d].type for d in used}
    measured = (sim_graph.meta or {}).get("measured")
    where = {("cuda" if v.startswith("cuda") else "cpu") for v in tdev.values()}
    if not graph_from_file:
        notes.append("simulated with the captured graph's roofline costs; for a fair comparison give --graph "
                     "from `placer profile --measure` and --cluster from `placer profile --comm-bench`")
    elif not isinstance(measured, dict):
        notes.append("the graph file has no measured node times (placer profile --measure): simulated times "
                     "are roofline estimates")
    if where == {"cpu"} and not types <= {"cpu"}:
        notes.append(f"the cluster's devices are {', '.join(sorted(types))} but ran on the CPU: simulated and "
                     f"measured times describe different machines")
    if backend == "local" and len(used) > 1 and len(set(tdev.values())) < len(used):
        notes.append("several cluster devices share one torch device in one process: their nodes run one after "
                     "another, so the measured step has no device parallelism (use --backend gloo on CPUs)")
    if isinstance(measured, dict) and measured.get("threads") is not None:
        notes.append(f"node times measured with {measured['threads']} thread(s)")
    cpus = os.cpu_count() or 1
    if load is not None and load > cpus:
        notes.append(f"the machine's load average was {load:.1f} on {cpus} CPUs: measured wall times include "
                     f"waiting for a CPU; devices' measured_cpu_s is the time they computed")
    return notes


def load_average() -> float | None:
    """The 1-minute load average (``None`` where the OS does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def build_report(*, step, counts: dict[int, int], placement, label, cluster, sim, sim_graph, graph_from_file, tdev,
                 backend, dist_backend, threads, steps, warmup, numerics, measured, congestion, load=None,
                 extra_notes: list[str] | None = None) -> dict:
    """Assemble the ``placer.run/v1`` document (see the module docstring); *counts*: nodes run
    per used cluster device."""
    walls = measured["walls"]
    med = statistics.median(walls)
    sim_s = sim["makespan_s"]
    sim_dev = {d["id"]: d for d in sim["devices"]}
    used = list(counts)
    devices = [{"id": cluster.ids[d], "torch_device": tdev[d], "nodes": counts[d],
                "measured_busy_s": measured["busy"].get(d, 0.0), "measured_cpu_s": measured["cpu"].get(d),
                "simulated_busy_s": sim_dev[cluster.ids[d]]["busy_s"]}
               for d in used]
    sim_links = {(ln["src"], ln["dst"]): ln for ln in sim["links"]}
    links = []
    keys = sorted(set(measured["link"]) | {(cluster.index[a], cluster.index[b]) for a, b in sim_links})
    unknown = measured.get("link_bytes_unknown", False)
    for a, b in keys:
        row = measured["link"].get((a, b), [None, None, None] if unknown else [0, 0, None])
        s = sim_links.get((cluster.ids[a], cluster.ids[b]), {"bytes": 0, "transfers": 0, "busy_s": 0.0})
        links.append({"src": cluster.ids[a], "dst": cluster.ids[b],
                      "bytes": None if row[0] is None else int(row[0]),
                      "transfers": None if row[1] is None else int(row[1]),
                      "simulated_bytes": int(s["bytes"]), "simulated_transfers": int(s["transfers"]),
                      "measured_busy_s": row[2], "simulated_busy_s": s["busy_s"]})
    doc = {"schema": RUN_SCHEMA, "model": step.spec, "config": step.config, "batch_size": step.batch,
           "seed": step.seed, "graph": sim_graph.name, "graph_source": "file" if graph_from_file else "capture",
           "placement": label, "algorithm": placement.algorithm, "cluster": cluster.name, "backend": backend,
           "dist_backend": dist_backend, "processes": len(used) if backend == "gloo" else 1,
           "threads": threads, "device_map": {cluster.ids[d]: tdev[d] for d in used},
           "steps": steps, "warmup": warmup, "load_average": load, "cpus": os.cpu_count()}
    doc.update(numerics)
    doc.update({"measured_step_s": med, "measured_min_step_s": min(walls), "measured_steps_s": walls,
                "simulated_step_s": sim_s,
                "measured_over_simulated": med / sim_s if sim_s > 0 else None,
                "simulation": {"congestion": congestion, "status": sim["status"],
                               "lower_bound_s": sim["lower_bound_s"]},
                "devices": devices, "links": links,
                "notes": list(extra_notes or []) + _notes(sim_graph, cluster, tdev, used, graph_from_file, backend,
                                                          load)})
    return doc


def render_table(report: dict, console=None) -> None:
    """Print the report for people (rich tables)."""
    from rich.table import Table
    from rich.text import Text

    from ..log import console as text_console

    console = console or text_console(width=120)
    ok = Text("match", style="green") if report["match"] else Text("MISMATCH", style="red")
    console.print(Text.assemble((str(report["model"]), "bold"),
                                f" batch {report['batch_size']}: {report['placement']} ({report['algorithm']}) on "
                                f"{report['cluster']}, backend {report['backend']}"
                                + (f" ({report['dist_backend']}, {report['processes']} processes)"
                                   if report['dist_backend'] else "")))
    console.print(Text.assemble("numerics: ", ok, f"  loss {report['loss']:.6g} vs {report['reference_loss']:.6g} "
                                f"unplaced (|diff| {report['loss_max_abs_diff']:.3g}); {report['params_compared']} "
                                f"parameters, max |diff| {report['params_max_abs_diff']:.3g}"))
    mb = report.get("microbatch")
    if mb:  # a micro-batched / pipelined / hybrid run (run/derived_run.py)
        exact = "exact" if mb["per_microbatch"]["params_max_abs_diff"] == 0 else "not exact"
        console.print(f"plan: {' + '.join(mb['recipe'])}, schedule {mb['schedule'] or 'from the orders'}, "
                      f"{mb['replicas']} replica(s) x {mb['micro_batches']} micro-batch(es) of "
                      f"{sorted(set(mb['instance_batches']))}, {mb['recomputed']} recomputed node(s); yardstick "
                      f"{mb['yardstick']}; per-micro-batch step {exact}")
    ratio = report["measured_over_simulated"]
    console.print(f"step: measured {report['measured_step_s']:.6g} s (median of {report['steps']}), simulated "
                  f"{report['simulated_step_s']:.6g} s" + (f", measured/simulated {ratio:.2f}" if ratio else ""))
    t = Table(title="devices")
    for col in ("device", "torch", "nodes", "busy measured (s)", "CPU (s)", "busy simulated (s)"):
        t.add_column(col, justify="left" if col in ("device", "torch") else "right")
    for d in report["devices"]:
        cpu = "-" if d["measured_cpu_s"] is None else f"{d['measured_cpu_s']:.6g}"
        t.add_row(d["id"], d["torch_device"], str(d["nodes"]), f"{d['measured_busy_s']:.6g}", cpu,
                  f"{d['simulated_busy_s']:.6g}")
    console.print(t)
    if report["links"]:
        lt = Table(title="links (one step)")
        for col in ("link", "transfers", "MiB", "simulated MiB", "busy measured (s)", "busy simulated (s)"):
            lt.add_column(col, justify="left" if col == "link" else "right")
        for ln in report["links"]:
            busy = "-" if ln["measured_busy_s"] is None else f"{ln['measured_busy_s']:.6g}"
            mib = "-" if ln["bytes"] is None else f"{ln['bytes'] / 2**20:.3f}"
            lt.add_row(f"{ln['src']}→{ln['dst']}", "-" if ln["transfers"] is None else str(ln["transfers"]), mib,
                       f"{ln['simulated_bytes'] / 2**20:.3f}", busy, f"{ln['simulated_busy_s']:.6g}")
        console.print(lt)
    for note in report["notes"]:
        console.print(f"note: {note}")
