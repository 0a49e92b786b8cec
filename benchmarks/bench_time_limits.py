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

3. **auto on large graphs** (issue 24, N16): ``placer profile --synthetic
   layered --nodes N --seed 1`` then ``placer place G --time-limit S`` (auto)
   as a separate process, for 5,000 nodes / 2 s, 36,000 / 5 s and 200,000 /
   the default 10 s: wall time against ``S + 10 % + 1 s``, auto's status and
   makespan against METIS's (auto must be feasible where METIS is), the
   winner, and the machine's load (``os.getloadavg``) at the start of each
   run - this machine is shared, so a number without its load means little.
4. **Member costs** (``--costs``): what each portfolio member of ``auto``
   costs, in simulations of the graph it is given (its placement time,
   mapping included, over the median time of one simulation of that graph;
   for data parallelism, building, simulating and mapping the replicas'
   graph), against the estimate :func:`celeritas_cli.optimize.portfolio.member_cost`
   charges - on synthetic layered graphs of 1,000 to 36,000 nodes on 4 and 8
   devices.  Ratios, so less sensitive to the machine's load than seconds.

Prints Markdown to stdout (``benchmarks/run.py`` appends it to
BENCHMARKS.md).  Usage::

    python benchmarks/bench_time_limits.py [--quick] [--only solvers|learning|auto|costs]

Wall times on a shared machine are noisy; the point is the bound, not the
absolute numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
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
    from celeritas_cli.algorithms.placers.hierarchical import planner as hp
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


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def auto_rows(cases, tmp: Path) -> list[str]:
    """Section 3: auto on large synthetic graphs, whole-command wall time, against METIS."""
    out = ["## auto on large graphs: `placer place G --time-limit S`", "",
           "Synthetic layered graphs (`placer profile --synthetic layered --nodes N --seed 1`) on the default "
           "4xV100-pcie; wall time of the whole command (a separate process: start, imports, load, search, "
           "write) against S + 10 % + 1 s; METIS (`--algo metis`) for comparison; the load average of this "
           "shared machine when each run started.", "",
           "| nodes | S | wall (s) | allowed (s) | within | auto | METIS | feasible where METIS is | winner | "
           "load at start |", "|---:|---:|---:|---:|:---|:---|:---|:---|:---|:---|"]
    for nodes, limit in cases:
        graph = tmp / f"layered_{nodes}.json"
        placer("profile", "--synthetic", "layered", "--nodes", str(nodes), "--seed", "1", "-o", str(graph),
               timeout=600)
        allowed = (limit or 10.0) * 1.1 + 1.0
        at = load()
        log(f"  auto on {nodes} nodes, --time-limit {limit or 'default'} ({at})")
        dst = tmp / "auto.json"
        extra = ["--time-limit", str(limit)] if limit else []
        wall, proc = placer("place", str(graph), *extra, "-o", str(dst), timeout=allowed * 4 + 120)
        if proc.returncode != 0:
            out.append(f"| {nodes} | {limit or 10:g} | {wall:.1f} | {allowed:.1f} | - | exit {proc.returncode} | "
                       f"| | | {at} |")
            continue
        est = orjson.loads(dst.read_bytes())["estimate"]
        _, mp = placer("place", str(graph), "--algo", "metis", "--simulate", "-o", str(tmp / "metis.json"),
                       timeout=600)
        m = [ln for ln in mp.stderr.decode(errors="replace").splitlines() if "simulated makespan" in ln]
        metis_ok = bool(m) and "(OK)" in m[0]
        metis = m[0].split("simulated makespan ")[1].split(",")[0] if m else "-"
        auto_ok = est["status"] == "FEASIBLE"
        fits = "yes" if auto_ok or not metis_ok else "**NO**"
        out.append(f"| {nodes} | {limit or 10:g} | {wall:.1f} | {allowed:.1f} | "
                   f"{'yes' if wall <= allowed else '**NO**'} | {est['makespan_s']:.4g} s {est['status']} | "
                   f"{metis} | {fits} | {est.get('winner')}{' refined' if est.get('refined') else ''} | {at} |")
        graph.unlink()
    return out + [""]


def cost_rows(sizes, ks) -> list[str]:
    """Section 4: portfolio members' cost in simulations of their input graph, against the charge."""
    from celeritas_cli import registry
    from celeritas_cli.model.cluster import uniform
    from celeritas_cli.model.costs import cost_model
    from celeritas_cli.model.generate import layered
    from celeritas_cli.optimize.portfolio import COST, Spec, member_cost
    from celeritas_cli.optimize.runner import Runner
    from celeritas_cli.sim.simulator import run_schedule

    algos = ["metis", "m-topo", "single-device", "scotch", "heft", "dpos", "order-place", "data-parallel"]
    out = ["## Portfolio member costs (simulations of the input graph)", "",
           "Measured: the member's placement time (mapping onto the graph it is judged on included) over the "
           "median of three simulations of the input graph; charged: what `auto` charges "
           "(`optimize/portfolio.py`, `member_cost`).  Synthetic layered graphs, uniform clusters with "
           "memory to spare.", "",
           "| nodes | k | one simulation (s) | " + " | ".join(f"{a} measured / charged" for a in algos) + " |",
           "|---:|---:|---:|" + "---:|" * len(algos)]
    for n in sizes:
        g = layered(n, seed=1)
        for k in ks:
            c = uniform(k, memory=2**42)
            costs = cost_model(g, c)
            base = registry.place(g, c, "single-device", costs=costs)
            dev, _ = base.resolve(g, c, "x")
            sims = []
            for _ in range(3):
                t0 = time.perf_counter()
                run_schedule(g, c, dev, None, costs=costs)
                sims.append(time.perf_counter() - t0)
            sim = sorted(sims)[1]
            cells = []
            for a in algos:
                if a not in registry.names():
                    cells.append("-")
                    continue
                log(f"  cost of {a} on {n} nodes, k={k} ({load()})")
                runner = Runner(g, c, costs)
                t0 = time.perf_counter()
                runner.run(Spec(a))
                took = time.perf_counter() - t0
                cells.append(f"{took / sim:.2g} / {member_cost(Spec(a), k):.3g}")
            out.append(f"| {n} | {k} | {sim:.3g} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"_COST table: {', '.join(f'{a} {v:g}' for a, v in sorted(COST.items()))}; {load()} at the end._")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    ap.add_argument("--only", choices=("solvers", "learning", "auto", "costs"), default=None,
                    help="one section (default: solvers, learning and auto; costs only when named)")
    ap.add_argument("--costs", action="store_true", help="also measure the portfolio members' costs")
    args = ap.parse_args(argv)
    want = {args.only} if args.only else {"solvers", "learning", "auto"} | ({"costs"} if args.costs else set())
    torch = importlib.util.find_spec("torch") is not None
    doc = ["# Time limits, deterministic budgets, learning under memory pressure (`bench_time_limits.py`)", ""]
    with tempfile.TemporaryDirectory(prefix="placer-tl-") as tmpdir:
        tmp = Path(tmpdir)
        if "solvers" in want:
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
        if "auto" in want:
            log("auto on large graphs")
            doc += auto_rows([(5000, 2.0), (36000, 5.0)] + ([] if args.quick else [(200000, None)]), tmp)
    if "learning" in want:
        if torch:
            log("hierarchical learning curve")
            doc += learning_curve(30 if args.quick else 60)
        else:
            doc += ["_torch is not installed: the Hierarchical Planner cases were skipped._", ""]
    if "costs" in want:
        log("member costs")
        doc += cost_rows((1000, 5000) if args.quick else (1000, 5000, 36000), (4, 8))
    print("\n".join(doc).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
