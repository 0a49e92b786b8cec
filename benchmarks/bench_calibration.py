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
    python benchmarks/bench_calibration.py --kept out/calib      # fit and print again, no runs
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
    """Steps 1-5 of the module docstring for one model and batch; the runs are kept in *keep*."""
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.profile import capture_model
    from celeritas_cli.profile.calibrate import calibrate
    from celeritas_cli.run.step import capture_real

    spec, config = MODELS[name]
    label = f"{name}_b{batch}"
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
    use = [a for a in ALGOS if (calibrate_from is None or a in calibrate_from) and timed(first[a])]
    cal = calibrate(gdoc, cluster_doc, [first[a] for a in use], labels=use)
    g2, c2 = Graph.from_dict(cal.graph, f"{label} calibrated"), Cluster.from_dict(cal.cluster, "calibrated")
    placements["auto (calibrated)"] = place(g2, c2, "auto")
    for algo, p in placements.items():
        log(f"{label}: round 2: {algo} (load {load():.1f})")
        if p.derivation is not None:            # rebuilt from the calibrated graph: the carried one is stale
            p = copy.copy(p)
            p.split_graph = None
        second[algo] = run(spec, batch, p, algo, g2, c2, step, steps)
    kept = {"graph.json": gdoc, "graph_half.json": half, "cluster.json": cluster_doc, "used.json": use}
    kept.update({f"round1_{a}.json": rep for a, rep in first.items()})
    kept.update({f"round2_{a.replace(' ', '_')}.json": rep for a, rep in second.items()})
    if keep is not None:
        out = keep / label
        out.mkdir(parents=True, exist_ok=True)
        for fname, doc in kept.items():
            (out / fname).write_text(json.dumps(doc))
    return assess(label, kept)


def assess(label: str, kept: dict) -> dict:
    """Step 6: calibrate (wall and CPU clock) from round 1, simulate round 2's placements with both."""
    from celeritas_cli.model.cluster import Cluster
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.model.placement import Placement
    from celeritas_cli.profile.calibrate import calibrate
    from celeritas_cli.run.resimulate import resimulate
    from celeritas_cli.sim.simulator import simulate

    use = kept["used.json"]
    first = {k[len("round1_"):-5]: v for k, v in kept.items() if k.startswith("round1_")}
    second = {k[len("round2_"):-5].replace("_", " ").replace("single device", "single-device"): v
              for k, v in kept.items() if k.startswith("round2_")}
    dropped = sorted(a for a, rep in {**first, **second}.items() if not replayable(rep))
    first = {a: first[a] for a in ALGOS if a in first and a not in dropped}
    second = {a: rep for a, rep in second.items() if a not in dropped}
    untimed = sorted(a for a, rep in {**first, **second}.items() if not timed(rep))
    second = {a: second[a] for a in sorted(second, key=lambda a: (ALGOS + [a]).index(a))}
    gdoc, cluster_doc = kept["graph.json"], kept["cluster.json"]
    after, summaries = {}, {}
    for clock in ("wall", "cpu"):
        cal = calibrate(gdoc, cluster_doc, [first[a] for a in use], labels=use, clock=clock)
        rows = resimulate(list(second.values()), list(second), Graph.from_dict(cal.graph, f"{clock} fit"),
                          Cluster.from_dict(cal.cluster, f"{clock} fit"))
        after[clock] = {r["report"]: r["after_s"] for r in rows}
        summaries[clock] = cal.summary
    scheds: list = []
    dp = Placement.from_dict(first["data-parallel"]["node_times"]["placement"])
    simulate(Graph.from_dict(gdoc, label), Cluster.from_dict(cluster_doc), dp, schedule_out=scheds)
    return {"label": label.replace("_b", " b"), "graph": gdoc, "half": kept.get("graph_half.json"),
            "cluster": Cluster.from_dict(cluster_doc), "first": first, "second": second,
            "calibration": summaries["wall"], "calibration_cpu": summaries["cpu"], "wall_after": after["wall"],
            "cpu_after": after["cpu"], "used": use, "dp_sched": scheds[0], "untimed": untimed, "dropped": dropped,
            "first_timed": {a: rep for a, rep in first.items() if timed(rep)}}


def timed(rep: dict) -> bool:
    """Whether a run report has per-node times (``placer run --node-times`` records none for micro-batched,
    pipelined or sharded plans yet), which calibrate needs."""
    return isinstance(rep.get("node_times"), dict)


def replayable(rep: dict) -> bool:
    """Whether a run report keeps the plan that ran (``node_times.placement`` or ``ran_placement``), which
    the tables need to simulate it again."""
    return timed(rep) or isinstance(rep.get("ran_placement"), dict)


def load_kept(path: Path) -> dict:
    return {f.name: json.loads(f.read_text()) for f in sorted(path.glob("*.json"))}


def ratio(rep: dict) -> float:
    return rep["measured_step_s"] / rep["simulated_step_s"] if rep["simulated_step_s"] > 0 else float("nan")


def report(results: list[dict], cluster_doc: dict, steps: int, t0: float, kept: bool = False) -> None:
    from calib_analysis import (HEADERS, allreduce_row, contention_rows, dispatch_rows, overhead_row, ring_seconds,
                                split_row, transfer_rows)

    from celeritas_cli.run.resimulate import kendall_tau

    fit = cluster_doc["meta"]["fit"]["default"]
    loads = [r[k][a]["load_average"] or 0.0 for r in results for k in ("first", "second") for a in r[k]]
    print("## Calibration: measured vs simulated before and after `placer calibrate` (issue 25)\n")
    print(f"Cluster: 2 CPU processes over gloo, 1 torch thread each, fitted on this machine (`placer profile "
          f"--comm-bench --processes 2`: latency {fit['b'] * 1e6:.0f} us, bandwidth {1 / fit['k'] / 1e9:.2f} GB/s). "
          f"Graphs: node times measured on 1 thread (`placer profile --measure --threads 1`). Runs: `placer run "
          f"--backend gloo --node-times`, median of {steps} steps. Round 1 is simulated with those files (before), "
          f"round 2 with the files `placer calibrate` wrote from round 1's reports (after). Load average during the "
          f"runs: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} CPUs.\n")
    for r in results:
        if r["untimed"]:
            print(f"{r['label']}: {', '.join(r['untimed'])}: a micro-batched, pipelined or sharded plan, for which "
                  "`placer run --node-times` records no per-node times yet: measured and simulated in the tables, "
                  "not calibrated from.\n")
        if r["dropped"]:
            print(f"{r['label']}: left out of the tables: {', '.join(r['dropped'])} (the run report keeps no plan "
                  "to simulate again: made before `ran_placement`).\n")
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
            cpu, wall = r["cpu_after"][algo], r["wall_after"][algo]
            print(f"| {r['label']} | {algo} | {before} | {rep2['load_average']:.1f} | "
                  f"{rep2['measured_step_s'] * 1e3:.2f} | {wall * 1e3:.2f} | {mark(rep2['measured_step_s'] / wall)} | "
                  f"{cpu * 1e3:.2f} | {mark(rep2['measured_step_s'] / cpu)} |")
        common = [a for a in ALGOS if a in r["first"]]
        meas1 = [r["first"][a]["measured_step_s"] for a in common]
        meas2 = [r["second"][a]["measured_step_s"] for a in common]
        tb = kendall_tau(meas1, [r["first"][a]["simulated_step_s"] for a in common])
        ta = kendall_tau(meas2, [r["wall_after"][a] for a in common])
        tc = kendall_tau(meas2, [r["cpu_after"][a] for a in common])
        tm = kendall_tau(meas1, meas2)
        inside = sum(BAND[0] <= r["second"][a]["measured_step_s"] / r["wall_after"][a] <= BAND[1] for a in common)
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
    print("\n### Without the load: the CPU-clock fit against the processes' CPU time\n")
    print("The step's thread CPU time of the busiest process (`node_times.step_cpu_s`, round 2) is what a step "
          "would take on a quiet machine if no process ever waited for another; it bounds the quiet step from "
          "below (exactly for one process, and data parallelism waits only for its exposed all-reduce).\n")
    print("| model | placement | busiest process CPU (ms) | simulated, CPU fit (ms) | CPU / simulated |\n"
          "|---|---|---:|---:|---:|")
    for r in results:
        for algo, rep2 in r["second"].items():
            if not timed(rep2):
                continue
            cpu = max((rep2["node_times"].get("step_cpu_s") or {"-": float("nan")}).values())
            print(f"| {r['label']} | {algo} | {cpu * 1e3:.2f} | {r['cpu_after'][algo] * 1e3:.2f} | "
                  f"{cpu / r['cpu_after'][algo]:.2f} |")
    print("\n### What calibrate fitted\n")
    print("| model | nodes | batch lines | fit error median / p90 | dispatch per node (us) | send (us + us/MB) | "
          "receive (us) | collective step (us) | contention | links (latency us, GB/s) |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        for clock, s in (("wall", r["calibration"]), ("CPU", r["calibration_cpu"])):
            links = "; ".join(f"{k}: {v['latency_s'] * 1e6:.0f}, {v['bandwidth_Bps'] / 1e9:.2f}" for k, v in
                              s["links"].items()) or "-"
            kappa = ", ".join(f"{v['contention']:.2f}" for v in s["hosts"].values()) or "-"
            print(f"| {r['label']} ({clock}) | {s['nodes_fitted']} | {s['batch_lines']} | "
                  f"{100 * s['node_error']['median']:.1f}% / {100 * s['node_error']['p90']:.1f}% | "
                  f"{s['dispatch']['per_node_s'] * 1e6:.0f} | {s['dispatch']['send_s'][0] * 1e6:.0f} + "
                  f"{s['dispatch']['send_s'][1] * 1e12:.0f} | {s['dispatch']['recv_s'][0] * 1e6:.0f} | "
                  f"{s['collective']['collective_step_s'] * 1e6:.0f} | {kappa} | "
                  f"{links} |")
    print("\n### Where the gap comes from (round 1)\n")
    sections = [("Dispatch: time between nodes that is neither a node nor a wait", "dispatch",
                 lambda r: dispatch_rows(r["label"], r["first_timed"])),
                ("Per-op overhead: single-device run vs isolated `--measure`", "overhead",
                 lambda r: [overhead_row(r["label"], r["first"]["single-device"], r["graph"])]),
                ("Split scaling: data-parallel replicas at b/2 vs the single-device run at b", "split",
                 lambda r: [split_row(r["label"], r["first"]["single-device"], r["first"]["data-parallel"],
                                      r["graph"], r["half"])]),
                ("Transfers under concurrency (those the receiver waited for)", "transfer",
                 lambda r: transfer_rows(r["label"], r["first_timed"], r["cluster"])),
                ("Contention between the processes sharing the cores", "contention",
                 lambda r: contention_rows(r["label"], r["first_timed"])),
                ("All-reduce overlap (data-parallel, DDP buckets)", "allreduce",
                 lambda r: [allreduce_row(r["label"], r["first"]["data-parallel"], ring_seconds(r["dp_sched"]))])]
    for title, key, rows in sections:
        print(f"**{title}**\n\n{HEADERS[key]}")
        for r in results:
            print("\n".join(rows(r)))
        print()
    print(f"Total benchmark time {time.perf_counter() - t0:.0f} s{' (fitted again from kept runs)' if kept else ''}.\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8", help="comma-separated batch sizes (even)")
    ap.add_argument("--models", default="vit,unet", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--calibrate-from", default=None, help="placements whose round-1 runs calibrate (default: all)")
    ap.add_argument("--keep", default=None, help="directory for every report and calibrated file")
    ap.add_argument("--kept", default=None, help="no runs: fit and print again from a --keep directory")
    args = ap.parse_args()
    if args.kept:
        dirs = sorted(p for p in Path(args.kept).iterdir() if (p / "used.json").exists())
        results = [assess(p.name, load_kept(p)) for p in dirs]
        report(results, results[0]["cluster"].doc, results[0]["first"]["metis"]["steps"], time.perf_counter(), True)
        return
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
