"""Benchmark: sharded data parallelism (``place --algo fsdp -p stage=1|2|3``,
ZeRO / PyTorch FSDP) against data parallelism (``data-parallel``, DDP
buckets of 25 MiB) on the model zoo, judged by the simulator.

Per cluster and model: each plan's simulated step, status (OOM under the
judge's time rule), largest per-GPU peak, the bytes each GPU sends, the
simulated model FLOPs utilisation (``sim/mfu.py``), and the step against
the work bound of the model (total work on the cluster's fastest device
type / number of devices: no plan of the step can beat it).

Prints Markdown to stdout.  Usage::

    python benchmarks/bench_fsdp.py [--clusters 8xA100-nvswitch] [--models gpt_6.7b,gpt_1.3b]
        [--stages 1,2,3] [--no-dp] [--proportional]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.model.costs import cost_model  # noqa: E402
from celeritas_cli.model.io import load_cluster, load_graph  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402

GiB = 2**30
ZOO = ROOT / "sample_graphs" / "zoo"


def work_bound(graph, cluster) -> float:
    """Total work / devices, each node at its fastest device: a bound on any plan of the step."""
    costs = cost_model(graph, cluster)
    return sum(min(costs.time[v]) for v in range(graph.n)) / cluster.k


def row(graph, cluster, algo: str, params: dict) -> dict:
    p = registry.place(graph, cluster, algo, params=params)
    rep = simulate(graph, cluster, p)
    est = p.estimate
    return {"makespan": rep["makespan_s"], "status": rep["status"], "mfu": rep.get("mfu"),
            "peak": max(d["memory_bytes"] for d in rep["devices"]),
            "sent": est.get("bytes_per_device", est.get("allreduce_bytes_per_device"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="8xA100-nvswitch,4xV100-pcie,moirai-intra-server")
    ap.add_argument("--models", default="")
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--no-dp", action="store_true")
    ap.add_argument("--proportional", action="store_true", help="also stage 3 with -p shares=proportional")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m] or sorted(p.name.removesuffix(".json.gz") for p in ZOO.glob("*.json.gz"))
    print("| cluster | model | plan | step (s) | status | peak GiB | sent GiB/GPU | MFU | step / work bound |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|")
    for cname in args.clusters.split(","):
        cluster = load_cluster(cname)
        for model in models:
            graph = load_graph(str(ZOO / f"{model}.json.gz"))
            wb = work_bound(graph, cluster)
            plans = ([] if args.no_dp else [("data-parallel", "data-parallel", {})]) + \
                [(f"fsdp stage {s}", "fsdp", {"stage": int(s)}) for s in args.stages.split(",")] + \
                ([("fsdp stage 3, proportional", "fsdp", {"stage": 3, "shares": "proportional"})]
                 if args.proportional else [])
            for label, algo, params in plans:
                print(f"{cname} {model} {label}", file=sys.stderr, flush=True)
                r = row(graph, cluster, algo, params)
                mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
                sent = f"{r['sent'] / GiB:.2f}" if r["sent"] is not None else "-"
                print(f"| {cname} | {model} | {label} | {r['makespan']:.4f} | {r['status']} | {r['peak'] / GiB:.1f} "
                      f"| {sent} | {mfu} | {r['makespan'] / wb:.3f} |", flush=True)


if __name__ == "__main__":
    main()
