"""Benchmark: do ``--time-limit`` and the deterministic budgets hold, and does
the Hierarchical Planner learn under memory pressure?  (issue 18.4-18.6)

1. **Time limits.**  ``placer place G --algo A --time-limit S`` is run as a
   separate process for milp and hierarchical on original and ``cpd``-coarse
   zoo graphs; the wall time of the whole call (interpreter start, imports,
   loading, warm start, search or training, writing) must stay within
   ``S + 10 % + 1 s``.  Cases marked "x2" run twice with ``--no-timings`` and
   compare the placement files byte for byte (the counted budgets: CP-SAT
   deterministic time, training iterations).
2. **Learning under memory pressure.**  The Hierarchical Planner on a
   memory-bound coarse InceptionV3 (more memory than one device holds) with
   the paper's fixed OOM penalty and with our masked sampling: share of
   sampled placements that overflow, and the best feasible makespan so far,
   every few iterations.

Prints Markdown to stdout (``benchmarks/run.py`` appends it to
BENCHMARKS.md).  Usage::

    python benchmarks/bench_time_limits.py [--quick]

Wall times on a shared machine are noisy; the point is the bound, not the
absolute numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ZOO = ROOT / "sample_graphs" / "zoo"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def placer(*args: str, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "celeritas_cli", *args], cwd=ROOT, capture_output=True,
                          timeout=timeout)
    return time.perf_counter() - t0, proc


def coarse(path: Path, tmp: Path) -> Path:
    out = tmp / (path.name.replace(".json.gz", "").replace(".json", "") + "_cpd.json")
    placer("coarsen", str(path), "-o", str(out), timeout=300)
    return out


def note_of(est: dict, params: dict, stderr: str) -> str:
    notes = []
    if "iterations" in est:
        notes.append(f"{est['iterations']} of {params.get('iterations')} iterations")
    if est.get("det_time_used") is not None:
        notes.append(f"det time {est['det_time_used']:.3g} of {params.get('det_time', 0):.3g}")
    if est.get("source") == "hint":
        notes.append(f"returned warm start {est.get('hint')}")
    if "too large to solve" in stderr:
        notes.append("model not built: too large, coarsen first")
    if "wall clock" in stderr:
        notes.append("wall clock cut (stderr says so)")
    return "; ".join(notes) or "-"


def time_limit_rows(cases, tmp: Path) -> list[str]:
    out = ["## Time limits: `placer place G --algo A --time-limit S`", "",
           "Wall time of the whole call (a separate process: start, imports, load, warm start, search or "
           "training, write) against the allowed S + 10 % + 1 s.  `x2`: run twice with `--no-timings`, "
           "files compared byte for byte.", "",
           "| graph | nodes | algorithm | S | wall (s) | allowed (s) | within | status | runs | note |",
           "|:---|---:|:---|---:|---:|---:|:---|:---|:---|:---|"]
    for graph, algo, limit, twice in cases:
        allowed = limit * 1.1 + 1.0
        docs, walls, est, params, err = [], [], {}, {}, ""
        for i in range(2 if twice else 1):
            dst = tmp / f"p{i}.json"
            log(f"  {graph.name} {algo} --time-limit {limit:g} (run {i + 1})")
            extra = ["-p", "progress=false"] if algo == "hierarchical" else []
            wall, proc = placer("place", str(graph), "--algo", algo, "--time-limit", str(limit), "--no-timings",
                                *extra, "-o", str(dst), timeout=allowed * 3 + 60)
            walls.append(wall)
            err = proc.stderr.decode(errors="replace")
            if proc.returncode != 0:
                est = {"status": f"exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
                break
            doc = dst.read_bytes()
            docs.append(doc)
            est, params = orjson.loads(doc)["estimate"], orjson.loads(doc)["params"]
        nodes = orjson.loads(graph.read_bytes()) if graph.suffix == ".json" else None
        n = len(nodes["nodes"]) if nodes else _nodes_gz(graph)
        status = est.get("status", "-")
        if est.get("graph") and est["graph"] != "original":
            status += f" ({est['graph']} graph)"
        runs = "1" if not twice else ("identical" if len(docs) == 2 and docs[0] == docs[1] else "DIFFER")
        worst = max(walls)
        out.append(f"| {graph.name} | {n} | {algo} | {limit:g} | {worst:.1f} | {allowed:.1f} | "
                   f"{'yes' if worst <= allowed else '**NO**'} | {status} | {runs} | {note_of(est, params, err)} |")
    return out + [""]


def _nodes_gz(path: Path) -> int:
    import gzip

    return len(orjson.loads(gzip.decompress(path.read_bytes()))["nodes"])


def learning_curve(iterations: int) -> list[str]:
    from celeritas_cli import registry
    from celeritas_cli.algorithms.hierarchical import planner as hp
    from celeritas_cli.model.io import load_cluster, load_graph
    from celeritas_cli.sim.simulator import simulate

    g = load_graph(ZOO / "inception_v3.json.gz")
    cl = load_cluster("4xV100-pcie")
    cg = registry.coarsen(g, cl, "cpd", params={"R": 20})
    rnd = simulate(g, cl, registry.place(cg, cl, "random"))
    out = [f"## Hierarchical Planner under memory pressure ({cg.name}, {cg.n} nodes, "
           f"{g.total_memory() / 2**30:.1f} GiB on {cl.k} x {cl.devices[0].memory / 2**30:.0f} GiB)", "",
           f"{iterations} iterations x 8 samples, seed 0, no time limit; random placement: "
           f"{rnd['makespan_s']:.4g} s ({rnd['status']}).  Per block of iterations: share of samples over "
           f"memory / best feasible makespan so far (s).", ""]
    block = max(1, iterations // 6)
    curves = {}
    for mode in ("fixed", "graded", "mask"):
        log(f"  learning curve, oom_mode={mode}")
        hist: list = []
        t0 = time.perf_counter()
        p = hp.hierarchical(cg, cl, seed=0, iterations=iterations, time_limit=0.0, progress=False, oom_mode=mode,
                            history=hist)
        curves[mode] = (hist, p, time.perf_counter() - t0)
    heads = [f"it {i}-{min(i + block, iterations) - 1}" for i in range(0, iterations, block)]
    out += ["| oom_mode | " + " | ".join(heads) + " | result (original graph) | time (s) |",
            "|:---|" + "---:|" * len(heads) + "---:|---:|"]
    for mode, (hist, p, took) in curves.items():
        cells = []
        for i in range(0, iterations, block):
            part = hist[i:i + block]
            share = sum(h["oom"] for h in part) / max(1, sum(h["samples"] for h in part))
            best = part[-1]["best_feasible_s"]
            cells.append(f"{share:.0%} / {best:.3g}" if best is not None else f"{share:.0%} / -")
        rep = simulate(g, cl, p)
        out.append(f"| {mode}{' (paper)' if mode == 'fixed' else ''} | " + " | ".join(cells)
                   + f" | {rep['makespan_s']:.4g} s ({rep['status']}) | {took:.0f} |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    args = ap.parse_args(argv)
    torch = importlib.util.find_spec("torch") is not None
    doc = ["# Time limits, deterministic budgets, learning under memory pressure (`bench_time_limits.py`)", ""]
    with tempfile.TemporaryDirectory(prefix="placer-tl-") as tmpdir:
        tmp = Path(tmpdir)
        tr, inc = ZOO / "transformer.json.gz", ZOO / "inception_v3.json.gz"
        tr_c, inc_c = coarse(tr, tmp), coarse(inc, tmp)
        cases = [(tr, "milp", 10.0, False), (tr_c, "milp", 10.0, True), (inc_c, "milp", 10.0, True),
                 (ROOT / "sample_graphs" / "layered_300.json", "milp", 5.0, True)]
        if not args.quick:
            cases.insert(1, (tr, "milp", 30.0, False))
        if torch:
            cases += [(tr, "hierarchical", 10.0, False), (inc, "hierarchical", 10.0, False),
                      (tr_c, "hierarchical", 10.0, True), (inc_c, "hierarchical", 10.0, True)]
        log("time limits")
        doc += time_limit_rows(cases, tmp)
    if torch:
        log("hierarchical learning curve")
        doc += learning_curve(30 if args.quick else 60)
    else:
        doc += ["_torch is not installed: the Hierarchical Planner cases were skipped._", ""]
    print("\n".join(doc).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
