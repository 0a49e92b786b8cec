"""Benchmark: does ``place --algo auto`` (the default) stay the best on inputs
unlike the model zoo on 4xV100-pcie it was first measured on?  Prints a
Markdown section (``benchmarks/run.py`` appends it to BENCHMARKS.md).

The matrix (deterministic: fixed generator seeds, bundled files):

* graphs - :func:`celeritas_cli.model.generate.layered_doc` training graphs
  of 300, 2,000 and 8,000 nodes, a low-CCR one (tensors 0.1x) and a
  high-CCR one (tensors 8x), an inference graph (no backward pass, no
  optimizer nodes); ``sample_graphs/*.json``; zoo graphs coarsened by
  ``cpd`` (so the input itself is an operator-group graph);
* clusters - every bundled preset (NVSwitch, 2x8 InfiniBand with via hops,
  a CPU + GPU host, Moirai's heterogeneous inter / intra server sets, the
  4xV100 default) and *tight* variants: every device's memory scaled by one
  factor so the cluster holds ``TIGHT`` (1.25) times the graph's memory.

For each (graph, cluster) row: ``auto`` with its defaults (10 s limit) -
wall time of the ``registry.place`` call, the candidate it refined, its
status - against every other registered algorithm with its quick parameters
(``placer compare --quick``), all judged by ``placer simulate``'s code on the
graph given (derived placements on the graph their recipe rebuilds).
``hierarchical`` (a 20 s reinforcement-learning run per cell) is left out;
``os-dpos`` only up to :data:`OS_DPOS_MAX` nodes and ``milp`` up to
:data:`MILP_MAX` nodes (minutes beyond).

Reported: best other and its makespan, auto's makespan, **auto / best
other** (> 1: auto loses), how many others fit in memory and whether auto
did (auto must fit whenever any other does), auto's wall time against its
limit (it must end within ``limit * 1.1 + 1`` s), then the geometric mean
and the rows that lose, overrun or OOM.

Options: ``--quick`` (a third of the rows); ``--rows SUBSTR`` (only rows
whose label contains it); ``--others-cache FILE`` (reuse / store the other
algorithms' results, which do not depend on auto: handy when iterating on
auto); ``--time-limit S`` (auto's limit, default 10).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from timing import fmt_makespan, run_cell  # noqa: E402  (benchmarks/timing.py)

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.compare.inputs import default_algorithms  # noqa: E402
from celeritas_cli.compare.tasks import algorithm_params  # noqa: E402
from celeritas_cli.model.cluster import Cluster  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.generate import layered_doc  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402

#: cluster memory / graph memory of the tight variants
TIGHT = 1.25
OS_DPOS_MAX = 400
MILP_MAX = 1500
SKIP = ("auto", "hierarchical")
PRESETS = ("4xV100-pcie", "8xA100-nvswitch", "8xH100-nvswitch", "2x8xA100-infiniband", "cpu-a100-pcie",
           "moirai-inter-server", "moirai-intra-server")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ inputs
def graph_of(name: str) -> Graph:
    """The graph a row label names (deterministic)."""
    if name.startswith("layered:"):  # layered:N:seed[:flags]
        parts = name.split(":")
        n, seed = int(parts[1]), int(parts[2])
        flags = parts[3] if len(parts) > 3 else ""
        kw: dict = {}
        if "inf" in flags:
            kw["training"] = False
        if "lowccr" in flags:
            kw["bytes_scale"] = 0.1
        if "highccr" in flags:
            kw["bytes_scale"] = 8.0
        return Graph.from_dict(layered_doc(n, seed=seed, name=name.replace(":", "_"), **kw), name)
    if name.startswith("cpd:"):  # cpd:zoo_graph:R
        _, zname, R = name.split(":")
        g = load_graph(str(ROOT / "sample_graphs" / "zoo" / f"{zname}.json.gz"))
        c = load_cluster("4xV100-pcie")
        return registry.coarsen(g, c, "cpd", params={"R": int(R)})
    return load_graph(str(ROOT / "sample_graphs" / name))


def tight(cluster: Cluster, graph: Graph, factor: float = TIGHT) -> Cluster:
    """*cluster* with every device's memory scaled by one factor so that the
    cluster holds *factor* times the graph's memory."""
    doc = orjson.loads(orjson.dumps(cluster.to_dict()))
    scale = factor * graph.total_memory() / cluster.total_memory()
    for d in doc["devices"]:
        d["memory_bytes"] = max(1, int(d["memory_bytes"] * scale))
    doc["name"] = f"{cluster.name}@{factor:g}x"
    return Cluster.from_dict(doc, doc["name"])


def cluster_of(name: str, graph: Graph) -> Cluster:
    if name.endswith("/tight"):
        return tight(load_cluster(name[: -len("/tight")]), graph)
    return load_cluster(name)


#: (graph, cluster) rows; the quick ones are marked True
ROWS: list[tuple[str, str, bool]] = [
    ("layered:300:11", "8xA100-nvswitch", True),
    ("layered:300:11", "moirai-inter-server/tight", True),
    ("layered:2000:12", "2x8xA100-infiniband", False),
    ("layered:2000:12", "moirai-intra-server/tight", True),
    ("layered:2000:12:lowccr", "cpu-a100-pcie", False),
    ("layered:2000:12:highccr", "moirai-inter-server", True),
    ("layered:2000:12:highccr", "4xV100-pcie/tight", False),
    ("layered:1500:13:inf", "8xH100-nvswitch", False),
    ("layered:1500:13:inf", "moirai-inter-server/tight", True),
    ("layered:8000:14", "8xA100-nvswitch/tight", False),
    ("layered:8000:14", "moirai-intra-server", False),
    ("layered_60.json", "cpu-a100-pcie/tight", True),
    ("layered_300.json", "2x8xA100-infiniband/tight", False),
    ("layered_1000.json", "moirai-inter-server", False),
    ("layered_3000_bigmem.json", "moirai-intra-server", True),
    ("layered_3000_bigmem.json", "4xV100-pcie", False),
    ("cpd:nmt:30", "moirai-intra-server", False),
    ("cpd:nmt:30", "8xA100-nvswitch/tight", True),
    ("cpd:inception_v3:4", "moirai-inter-server", False),
    ("cpd:transformer:8", "2x8xA100-infiniband/tight", False),
    ("cpd:resnet50:3", "cpu-a100-pcie", False),
]


# ------------------------------------------------------------------- cells


def others_for(graph: Graph) -> list[str]:
    out = []
    for a in default_algorithms():
        if a in SKIP or (a == "os-dpos" and graph.n > OS_DPOS_MAX) or (a == "milp" and graph.n > MILP_MAX):
            continue
        out.append(a)
    return out


def row(gname: str, cname: str, time_limit: float, cache: dict) -> dict:
    g = graph_of(gname)
    cluster = cluster_of(cname, g)
    costs = cost_model(g, cluster)
    key = f"{gname}|{cname}"
    res = cache.get(key)
    if res is None:
        res = {}
        for a in others_for(g):
            log(f"bench_generality: {gname} on {cname}: {a}")
            res[a] = run_cell(g, cluster, costs, a, algorithm_params(a, {}, {}, None, quick=True))
        cache[key] = res
    log(f"bench_generality: {gname} on {cname}: auto")
    mine = run_cell(g, cluster, costs, "auto", {"quiet": True, "time_limit": time_limit})
    ok = {a: r["makespan_s"] for a, r in res.items() if r["status"] == "OK"}
    best = min(ok, key=lambda a: (ok[a], a)) if ok else None
    ratio = mine["makespan_s"] / ok[best] if best is not None and mine["status"] == "OK" else None
    return {"graph": gname, "cluster": cname, "n": g.n, "best": best, "best_r": res.get(best), "auto": mine,
            "ratio": ratio, "fit": len(ok), "tried": len(res),
            "overrun": mine["wall_s"] > time_limit * 1.1 + 1.0,
            "oom": mine["status"] != "OK" and bool(ok)}


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def table(rows: list[dict], time_limit: float) -> list[str]:
    lines = ["| graph | cluster | nodes | best other | its makespan (s) | auto (s) | auto / best | others fit | "
             "auto status | auto's winner | auto wall (s) |",
             "|:---|:---|---:|:---|---:|---:|---:|---:|:---|:---|---:|"]
    for r in rows:
        a = r["auto"]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        won = f"{a.get('winner', '-')}{' + refinement' if a.get('refined') else ''}"
        flag = " (overrun)" if r["overrun"] else ""
        lines.append(f"| {r['graph']} | {r['cluster']} | {r['n']} | {r['best'] or '-'} | {fmt_makespan(r['best_r'])} | "
                     f"{fmt_makespan(a)} | **{ratio}** | {r['fit']}/{r['tried']} | {a['status']} | {won} | "
                     f"{a['wall_s']:.1f}{flag} |")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    loses = [f"{r['graph']} on {r['cluster']} ({r['ratio']:.3f})" for r in rows
             if r["ratio"] is not None and r["ratio"] > 1.0 + 1e-9]
    ooms = [f"{r['graph']} on {r['cluster']}" for r in rows if r["oom"]]
    over = [f"{r['graph']} on {r['cluster']} ({r['auto']['wall_s']:.1f} s)" for r in rows if r["overrun"]]
    return lines + ["",
                    f"Geometric mean of auto / best other: **{_gmean(ratios):.3f}** over {len(ratios)} rows; "
                    f"auto worse than the best other (> 1.000): {len(loses)} rows"
                    f"{': ' + '; '.join(loses) if loses else ''}.",
                    f"auto OOM while another algorithm fits: {len(ooms)}{': ' + '; '.join(ooms) if ooms else ''}. "
                    f"auto over its {time_limit:g} s limit (+10 % + 1 s): {len(over)}"
                    f"{': ' + '; '.join(over) if over else ''}.", ""]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", default="")
    ap.add_argument("--others-cache", default=None)
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args(argv)
    cache: dict = {}
    cpath = Path(args.others_cache) if args.others_cache else None
    if cpath is not None and cpath.exists():
        cache = orjson.loads(cpath.read_bytes())
    selected = [(g, c) for g, c, q in ROWS if (q or not args.quick) and args.rows in f"{g}|{c}"]
    rows = []
    for g, c in selected:
        rows.append(row(g, c, args.time_limit, cache))
        if cpath is not None:
            cpath.write_bytes(orjson.dumps(cache, option=orjson.OPT_INDENT_2))
    others = [a for a in default_algorithms() if a not in SKIP]
    out = ["## auto on unfamiliar inputs (benchmarks/bench_generality.py)", "",
           f"Synthetic graphs (layered: training, low / high CCR, inference), sample graphs and cpd-coarsened zoo "
           f"graphs on every bundled cluster and on tight variants (`/tight`: device memory scaled so the cluster "
           f"holds {TIGHT:g}x the graph). Others: {', '.join(others)} with quick parameters (os-dpos up to "
           f"{OS_DPOS_MAX} nodes, milp up to {MILP_MAX}); auto with its defaults and a {args.time_limit:g} s limit. "
           "Simulated makespan of one step; auto / best < 1: auto wins.", ""]
    out += table(rows, args.time_limit)
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
