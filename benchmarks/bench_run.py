"""Benchmark: `placer run` - is the simulator's step time what a real run
measures, and does it rank placements in the measured order? (issue 14)
Prints a Markdown section; needs torch (a note without it).

On this machine (no GPU): the cluster is 2 CPU processes talking gloo,
fitted by ``placer profile --comm-bench --processes 2`` (1 torch thread each),
and each model's graph has its node times measured on 1 thread
(``placer profile --measure --threads 1``), so simulation and execution
describe the same devices.  For each placement: the simulated makespan, the
measured step (``placer run --backend gloo``: 2 processes, median of the
timed steps, per step the slower rank's) and the numerics check.  Ranking:
whether sorting placements by simulated time gives the measured order, and
Kendall's tau between the two.  The machine is shared and noisy: one run,
ratios from the same run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

#: (zoo model, constructor config, batch) - small enough for a few CPU steps each.
MODELS = [("tensor_holography", {"convs": 12, "image": 64}, 4),
          ("transformer", {"layers": 2, "d_model": 256, "heads": 4, "vocab": 4000, "seq": 32}, 4)]
#: single device, balanced splits (contiguous: m-topo; min-cut: metis), a list scheduler (heft), random
#: (nodes scattered over both processes: a placement the simulator says is slow, as a control) and data
#: parallelism (2 replicas of half the batch, gradients all-reduced); plus auto when it is registered
ALGOS = ["single-device", "m-topo", "metis", "heft", "random", "data-parallel"]


def log(msg: str) -> None:
    print(f"bench_run: {msg}", file=sys.stderr, flush=True)


def kendall(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two score lists (1 = same order, -1 = reversed)."""
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return 1.0
    s = sum((1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0)
            for i, j in pairs)
    return s / len(pairs)


def main(steps: int = 5) -> None:
    print("## placer run: measured vs simulated step time\n")
    if importlib.util.find_spec("torch") is None:
        print("_Note: torch is not installed (`make install-torch`); no results._\n")
        return
    from celeritas_cli import registry
    from celeritas_cli.errors import InvalidInput
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.profile import capture_model
    from celeritas_cli.profile.commfit import fit_cluster
    from celeritas_cli.run import api
    from celeritas_cli.profile.commbench import bench_processes
    from celeritas_cli.run.step import capture_real

    t0 = time.perf_counter()
    log("comm-bench: 2 processes over gloo")
    cluster = Cluster.from_dict(fit_cluster(bench_processes(2, threads=1), weighting="relative"), "cluster")
    fit = cluster.doc["meta"]["fit"]["default"]
    algos = [a for a in ALGOS if a in registry.names()] + (["auto"] if "auto" in registry.names() else [])
    rows, rankings, loads, skipped = [], [], [], []
    for name, config, batch in MODELS:
        log(f"{name}: measuring node times (1 thread)")
        g = Graph.from_dict(capture_model(name, batch, config=config, measure=True, threads=1), name)
        step = capture_real(name, batch, config=config)
        sims, meas, mins, ran = [], [], [], []
        for algo in algos:
            p = registry.place(g, cluster, algo)
            log(f"{name}: {algo}: running on {len(set(p.assignment.values()))} process(es)")
            try:
                pre = api.prepare(name, batch, p, cluster, label=algo, config=config, graph=g, step=step)
                rep = api.run_placement(name, batch, p, cluster, label=algo, backend="gloo", steps=steps, threads=1,
                                        prepared=pre, timeout=900)
            except InvalidInput as exc:
                skipped.append(f"{name} b{batch} / {algo}: {exc}")
                continue
            ran.append(algo)
            used = sum(1 for d in rep["devices"] if d["nodes"])
            cpu = sum(d["measured_cpu_s"] or 0.0 for d in rep["devices"])
            sim_busy = sum(d["simulated_busy_s"] for d in rep["devices"])
            loads.append(rep["load_average"] or 0.0)
            rows.append((f"{name} b{batch}", algo, used, rep["simulated_step_s"], rep["measured_step_s"],
                         rep["measured_min_step_s"], rep["measured_over_simulated"],
                         cpu / sim_busy if sim_busy > 0 else float("nan"), rep["match"],
                         sum(ln["bytes"] or 0 for ln in rep["links"]) if rep.get("data_parallel") is None
                         else None))
            sims.append(rep["simulated_step_s"])
            meas.append(rep["measured_step_s"])
            mins.append(rep["measured_min_step_s"])
        by_sim = [a for _, a in sorted(zip(sims, ran))]
        for label, vals in (("median", meas), ("fastest", mins)):
            by_meas = [a for _, a in sorted(zip(vals, ran))]
            rankings.append((f"{name} b{batch}", label, by_sim, by_meas, kendall(sims, vals)))
    print(f"Cluster: 2 CPU processes over gloo, 1 torch thread each, fitted on this machine "
          f"(`placer profile --comm-bench --processes 2`: latency {fit['b'] * 1e6:.0f} us, bandwidth "
          f"{1 / fit['k'] / 1e9:.2f} GB/s). Graphs: zoo models at small configs, node times measured on 1 thread "
          f"(`placer profile --measure --threads 1`). Measured: `placer run --backend gloo`, median of {steps} "
          f"steps after 1 checked warm-up step, per step the slower process"
          f"{'' if 'auto' in algos else '; `auto` is not registered in this build'}.\n")
    for name, config, batch in MODELS:
        print(f"- {name} b{batch}: config {config}")
    print(f"\nThe machine's load average during the runs: {min(loads):.1f} to {max(loads):.1f} on "
          f"{os.cpu_count()} CPUs (other jobs share it). 'CPU / simulated busy' is the CPU time the processes "
          f"spent in their nodes over the simulated busy time, summed over devices: how well the measured node "
          f"times predict compute, without the waiting for a CPU that inflates wall times on a loaded machine.\n")
    print("| model | placement | devices | simulated (s) | measured median (s) | fastest (s) | "
          "median / simulated | CPU / simulated busy | match | bytes sent |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for model, algo, used, sim, mea, fast, ratio, cpu_ratio, match, nbytes in rows:
        sent = "all-reduce" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"
        print(f"| {model} | {algo} | {used} | {sim:.4f} | {mea:.4f} | {fast:.4f} | {ratio:.2f} | {cpu_ratio:.2f} | "
              f"{'yes' if match else 'NO'} | {sent} |")
    for note in skipped:
        print(f"\n_Not executed: {note}_")
    print("\n| model | measured step | order by simulated step | order by measured step | same order | "
          "Kendall tau |")
    print("|---|---|---|---|---|---:|")
    for model, label, by_sim, by_meas, tau in rankings:
        print(f"| {model} | {label} | {' < '.join(by_sim)} | {' < '.join(by_meas)} | "
              f"{'yes' if by_sim == by_meas else 'no'} | {tau:.2f} |")
    print(f"\nTotal benchmark time {time.perf_counter() - t0:.0f} s.\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
