"""Benchmark: the acceptance protocol of issue 25 - does the simulator agree with real runs,
before and after ``placer calibrate``?  Prints a Markdown section; needs torch.

For two models placer's zoo does not have (``examples/small_vit.py:SmallViT`` and
``examples/small_unet.py:SmallUNet``) at each batch size:

1. the README's recipe: a cluster of 2 CPU processes over gloo (``placer profile --comm-bench
   --processes 2``, 1 thread each) and the graph with node times measured on 1 thread
   (``placer profile --measure --threads 1``);
2. seven placements made on them: single-device, data-parallel, metis, heft, m-topo, random
   (seed 1) and auto;
3. round 1: each run with ``placer run --backend gloo --node-times`` (median of ``--steps``);
4. ``placer calibrate`` from the round-1 reports (all of them: one run of each placement; or
   ``--calibrate-from ALGO,...``);
5. round 2: the same placements run again and simulated on the calibrated graph and cluster, plus
   auto on the calibrated files;
6. per placement measured / simulated (target within [0.75, 1.33]) and per model Kendall's tau
   between measured and simulated steps (target >= 0.7), before (round 1, the recipe's files) and
   after (round 2, calibrated), and the gap analysis of round 1 (:mod:`calib_analysis`).

The machine is shared: the load average (``os.getloadavg``) of every run is printed.  Usage::

    python benchmarks/bench_calibration.py                      # batch 8, 5 steps
    python benchmarks/bench_calibration.py --batches 8,32 --keep out/calib
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = {"vit": (str(ROOT / "examples" / "small_vit.py") + ":SmallViT", {}),
          "unet": (str(ROOT / "examples" / "small_unet.py") + ":SmallUNet", {})}
ALGOS = ["single-device", "data-parallel", "metis", "heft", "m-topo", "random", "auto"]
BAND = (0.75, 1.33)


def log(msg: str) -> None:
    print(f"bench_calibration: {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return os.getloadavg()[0]


def place(graph, cluster, algo: str):
    from celeritas_cli import registry

    params = {"evaluations": 300, "quiet": True} if algo == "auto" else {}
    return registry.place(graph, cluster, algo, seed=1, params=params)


def run(spec, batch, p, label, graph, cluster, step, steps):
    from celeritas_cli.run import api

    pre = api.prepare(spec, batch, p, cluster, label=label, graph=graph, step=step)
    return api.run_placement(spec, batch, p, cluster, label=label, backend="gloo", steps=steps, threads=1,
                             prepared=pre, node_times=True, timeout=900)


def protocol(name: str, batch: int, cluster_doc: dict, steps: int, calibrate_from: list[str] | None,
             keep: Path | None) -> dict:
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.profile import capture_model
    from celeritas_cli.profile.calibrate import calibrate
    from celeritas_cli.run.resimulate import resimulate
    from celeritas_cli.run.step import capture_real
    from celeritas_cli.sim.simulator import simulate

    spec, config = MODELS[name]
    label = f"{name} b{batch}"
    log(f"{label}: measuring node times at batch {batch} and {batch // 2} (1 thread)")
    gdoc = capture_model(spec, batch, config=config, measure=True, threads=1)
    half = capture_model(spec, batch // 2, config=config, measure=True, threads=1)
    g, c = Graph.from_dict(gdoc, label), Cluster.from_dict(cluster_doc, "cluster")
    step = capture_real(spec, batch, config=config)
    placements = {a: place(g, c, a) for a in ALGOS}
    first, second = {}, {}
    for algo, p in placements.items():
        log(f"{label}: round 1: {algo} (load {load():.1f})")
        first[algo] = run(spec, batch, p, algo, g, c, step, steps)
    use = [a for a in ALGOS if calibrate_from is None or a in calibrate_from]
    cal = calibrate(gdoc, cluster_doc, [first[a] for a in use], labels=use)
    cal_cpu = calibrate(gdoc, cluster_doc, [first[a] for a in use], labels=use, clock="cpu")
    g2, c2 = Graph.from_dict(cal.graph, f"{label} calibrated"), Cluster.from_dict(cal.cluster, "calibrated")
    placements["auto (calibrated)"] = place(g2, c2, "auto")
    for algo, p in placements.items():
        log(f"{label}: round 2: {algo} (load {load():.1f})")
        if p.derivation is not None:            # rebuilt from the calibrated graph: the carried one is stale
            p = copy.copy(p)
            p.split_graph = None
        second[algo] = run(spec, batch, p, algo, g2, c2, step, steps)
    scheds: list = []
    simulate(g, c, placements["data-parallel"], schedule_out=scheds)
    rows = resimulate(list(second.values()), list(second), Graph.from_dict(cal_cpu.graph, "cpu-clock fit"),
                      Cluster.from_dict(cal_cpu.cluster, "cpu-clock fit"))
    cpu_after = {r["report"]: r["after_s"] for r in rows}
    if keep is not None:
        out = keep / f"{name}_b{batch}"
        out.mkdir(parents=True, exist_ok=True)
        for fname, doc in (("graph.json", gdoc), ("graph_half.json", half), ("cluster.json", cluster_doc),
                           ("graph_calibrated.json", cal.graph), ("cluster_calibrated.json", cal.cluster),
                           ("graph_calibrated_cpu.json", cal_cpu.graph),
                           ("cluster_calibrated_cpu.json", cal_cpu.cluster)):
            (out / fname).write_text(json.dumps(doc))
        for rnd, reps in (("round1", first), ("round2", second)):
            for algo, rep in reps.items():
                (out / f"{rnd}_{algo.replace(' ', '_')}.json").write_text(json.dumps(rep))
    return {"label": label, "graph": gdoc, "half": half, "cluster": c, "first": first, "second": second,
            "calibration": cal.summary, "calibration_cpu": cal_cpu.summary, "cpu_after": cpu_after, "used": use,
            "dp_sched": scheds[0]}


def ratio(rep: dict) -> float:
    return rep["measured_step_s"] / rep["simulated_step_s"] if rep["simulated_step_s"] > 0 else float("nan")


def report(results: list[dict], cluster_doc: dict, steps: int, t0: float) -> None:
    from calib_analysis import (HEADERS, allreduce_row, contention_rows, dispatch_rows, overhead_row, ring_seconds,
                                split_row, transfer_rows)

    from celeritas_cli.profile.calibrate import kendall_tau

    fit = cluster_doc["meta"]["fit"]["default"]
    loads = [r[k][a]["load_average"] or 0.0 for r in results for k in ("first", "second") for a in r[k]]
    print("## Calibration: measured vs simulated before and after `placer calibrate` (issue 25)\n")
    print(f"Cluster: 2 CPU processes over gloo, 1 torch thread each, fitted on this machine (`placer profile "
          f"--comm-bench --processes 2`: latency {fit['b'] * 1e6:.0f} us, bandwidth {1 / fit['k'] / 1e9:.2f} GB/s). "
          f"Graphs: node times measured on 1 thread (`placer profile --measure --threads 1`). Runs: `placer run "
          f"--backend gloo --node-times`, median of {steps} steps. Round 1 is simulated with those files (before), "
          f"round 2 with the files `placer calibrate` wrote from round 1's reports (after). Load average during the "
          f"runs: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} CPUs.\n")
    print("| model | placement | load r1 | simulated before (ms) | measured r1 (ms) | measured / simulated before | "
          "load r2 | measured r2 (ms) | simulated after, wall fit (ms) | measured / simulated | "
          "simulated after, CPU fit (ms) | measured / simulated |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    taus = []

    def mark(x: float) -> str:
        return f"{x:.2f}" + ("" if BAND[0] <= x <= BAND[1] else " ✗")

    for r in results:
        for algo, rep2 in r["second"].items():
            rep1 = r["first"].get(algo)
            before = (f"{rep1['load_average']:.1f} | {rep1['simulated_step_s'] * 1e3:.2f} | "
                      f"{rep1['measured_step_s'] * 1e3:.2f} | {mark(ratio(rep1))}") if rep1 else "- | - | - | -"
            cpu = r["cpu_after"][algo]
            print(f"| {r['label']} | {algo} | {before} | {rep2['load_average']:.1f} | "
                  f"{rep2['measured_step_s'] * 1e3:.2f} | {rep2['simulated_step_s'] * 1e3:.2f} | {mark(ratio(rep2))} | "
                  f"{cpu * 1e3:.2f} | {mark(rep2['measured_step_s'] / cpu)} |")
        common = [a for a in ALGOS if a in r["first"]]
        meas1 = [r["first"][a]["measured_step_s"] for a in common]
        meas2 = [r["second"][a]["measured_step_s"] for a in common]
        tb = kendall_tau(meas1, [r["first"][a]["simulated_step_s"] for a in common])
        ta = kendall_tau(meas2, [r["second"][a]["simulated_step_s"] for a in common])
        tc = kendall_tau(meas2, [r["cpu_after"][a] for a in common])
        tm = kendall_tau(meas1, meas2)
        inside = sum(BAND[0] <= ratio(r["second"][a]) <= BAND[1] for a in common)
        inside_c = sum(BAND[0] <= r["second"][a]["measured_step_s"] / r["cpu_after"][a] <= BAND[1] for a in common)
        taus.append(f"| {r['label']} | {len(common)} | {tb:.2f} | {ta:.2f} | {tc:.2f} | {tm:.2f} | "
                    f"{sum(BAND[0] <= ratio(r['first'][a]) <= BAND[1] for a in common)} | {inside} | {inside_c} | "
                    f"{', '.join(r['used'])} |")
    print("\n| model | placements | Kendall tau before | after, wall fit | after, CPU fit | "
          "round 1 vs round 2 measured | in [0.75, 1.33] before | after, wall fit | after, CPU fit | "
          "calibrated from |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(taus))
    print("\n'round 1 vs round 2 measured' is the Kendall tau between the two measurements of the same placements: "
          "how far the machine's noise alone lets any model's ranking agree with a run.")
    print("\n### What calibrate fitted\n")
    print("| model | nodes | batch lines | fit error median / p90 | dispatch gap per node, median of runs (us) | "
          "contention | links (latency us, GB/s) |\n|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        for clock, s in (("wall", r["calibration"]), ("CPU", r["calibration_cpu"])):
            links = "; ".join(f"{k}: {v['latency_s'] * 1e6:.0f}, {v['bandwidth_Bps'] / 1e9:.2f}" for k, v in
                              s["links"].items()) or "-"
            kappa = ", ".join(f"{v['contention']:.2f}" for v in s["hosts"].values()) or "-"
            print(f"| {r['label']} ({clock}) | {s['nodes_fitted']} | {s['batch_lines']} | "
                  f"{100 * s['node_error']['median']:.1f}% / {100 * s['node_error']['p90']:.1f}% | "
                  f"{statistics.median(s['dispatch_s'].values()) * 1e6:.0f} | {kappa} | {links} |")
    print("\n### Where the gap comes from (round 1)\n")
    sections = [("Dispatch: time between nodes that is neither a node nor a wait", "dispatch",
                 lambda r: dispatch_rows(r["label"], r["first"])),
                ("Per-op overhead: single-device run vs isolated `--measure`", "overhead",
                 lambda r: [overhead_row(r["label"], r["first"]["single-device"], r["graph"])]),
                ("Split scaling: data-parallel replicas at b/2 vs the single-device run at b", "split",
                 lambda r: [split_row(r["label"], r["first"]["single-device"], r["first"]["data-parallel"],
                                      r["graph"], r["half"])]),
                ("Transfers under concurrency (those the receiver waited for)", "transfer",
                 lambda r: transfer_rows(r["label"], r["first"], r["cluster"])),
                ("Contention between the processes sharing the cores", "contention",
                 lambda r: contention_rows(r["label"], r["first"])),
                ("All-reduce overlap (data-parallel, DDP buckets)", "allreduce",
                 lambda r: [allreduce_row(r["label"], r["first"]["data-parallel"], ring_seconds(r["dp_sched"]))])]
    for title, key, rows in sections:
        print(f"**{title}**\n\n{HEADERS[key]}")
        for r in results:
            print("\n".join(rows(r)))
        print()
    print(f"Total benchmark time {time.perf_counter() - t0:.0f} s.\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8", help="comma-separated batch sizes (even)")
    ap.add_argument("--models", default="vit,unet", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--calibrate-from", default=None, help="placements whose round-1 runs calibrate (default: all)")
    ap.add_argument("--keep", default=None, help="directory for every report and calibrated file")
    args = ap.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("## Calibration\n\n_Note: torch is not installed (`make install-torch`); no results._\n")
        return
    from celeritas_cli.profile.commbench import bench_processes
    from celeritas_cli.profile.commfit import fit_cluster

    t0 = time.perf_counter()
    log(f"comm-bench: 2 processes over gloo (load {load():.1f})")
    samples = bench_processes(2, threads=1)
    cluster_doc = fit_cluster(samples, label="comm-bench", weighting="relative")
    cluster_doc["meta"]["comm_bench"] = samples["meta"]
    keep = Path(args.keep) if args.keep else None
    frm = [a.strip() for a in args.calibrate_from.split(",")] if args.calibrate_from else None
    results = [protocol(m, int(b), cluster_doc, args.steps, frm, keep)
               for b in args.batches.split(",") for m in args.models.split(",")]
    report(results, cluster_doc, args.steps, t0)


if __name__ == "__main__":
    main()
