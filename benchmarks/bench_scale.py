"""Benchmark (issue 34): plans for 16 to 1,024 GPUs.

GPT 1.3B and 6.7B (the zoo's decoders, bf16, profiled at 8 sequences per GPU:
``placer profile --model gpt_1.3b --batch-sizes 4,8 --target-batch 8*GPUs``)
on clusters of DGX A100 servers (8 GPUs on NVSwitch, 8 HDR 200 Gb/s NICs):
16, 64, 256 and 1,024 GPUs (the bundled ``2xDGX-A100`` and ``128xDGX-A100``,
and ``placer clusters make --servers 8 / 32``).  For each, every command as a
user types it, in its own process: default ``placer place`` (auto, its 10 s
limit), ``--algo data-parallel``, ``--algo fsdp``, ``--algo pipeline``
(``--time-limit 60``), ``--algo 3d`` (its 10 s), and ``placer simulate`` of
auto's answer.  Reported: the
command's wall time and peak memory (its own ``ru_maxrss``), the simulated
step, status, the placement file's size.  Wall times are one run each on a
shared machine; the load is printed.

Usage::

    python benchmarks/bench_scale.py [--gpus 16,64,256,1024] [--models gpt_1.3b,gpt_6.7b] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTERS = {16: ("2xDGX-A100", None), 64: (None, 8), 256: (None, 32), 1024: ("128xDGX-A100", None)}
ROWS = (("auto", []), ("data-parallel", ["--algo", "data-parallel"]), ("fsdp", ["--algo", "fsdp"]),
        ("pipeline", ["--algo", "pipeline", "--time-limit", "60"]), ("3d", ["--algo", "3d"]))
#: a child runs one placer command in-process and reports its own peak memory on its last stderr line
CHILD = ("import resource, sys\n"
         "from celeritas_cli.cli import main\n"
         "code = 0\n"
         "try:\n    main(sys.argv[1:], prog_name='placer')\n"
         "except SystemExit as e:\n    code = e.code or 0\n"
         "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
         "sys.exit(code)\n")


def placer(args: list[str], timeout: float = 1800) -> tuple[int, float, float, str]:
    """``(exit code, wall seconds, peak MiB, stderr)`` of one placer command."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, time.perf_counter() - t0, float("nan"), "timeout"
    wall = time.perf_counter() - t0
    rss = next((float(x.split()[1]) / 1024 for x in r.stderr.splitlines()[::-1] if x.startswith("MAXRSS")),
               float("nan"))
    return r.returncode, wall, rss, r.stderr


def graph_for(model: str, gpus: int, cache: Path) -> Path:
    path = cache / f"{model}_b{8 * gpus}.json.gz"
    if not path.exists():
        code, _, _, err = placer(["profile", "--model", model, "--batch-sizes", "4,8", "--target-batch",
                                  str(8 * gpus), "-o", str(path)])
        if code:
            raise SystemExit(f"profile {model} at batch {8 * gpus} failed: {err.strip().splitlines()[-2:]}")
    return path


def cluster_for(gpus: int, cache: Path) -> str:
    name, servers = CLUSTERS[gpus]
    if name:
        return name
    path = cache / f"{servers}xA100.json"
    if not path.exists():
        placer(["clusters", "make", "--servers", str(servers), "-o", str(path)])
    return str(path)


def row(model: str, gpus: int, cache: Path, tmp: Path, only: set[str] | None = None) -> list[dict]:
    g, c = graph_for(model, gpus, cache), cluster_for(gpus, cache)
    out = []
    for name, extra in ROWS:
        if only and name not in only:
            continue
        pfile = tmp / f"{model}_{gpus}_{name}.json"
        code, wall, rss, err = placer(["place", str(g), "--cluster", c, *extra, "--no-timings", "-o", str(pfile)])
        cell = {"model": model, "gpus": gpus, "row": name, "place_s": wall, "place_mib": rss}
        if code:
            lines = [x for x in err.splitlines() if x.strip() and not x.startswith("MAXRSS")]
            cell["error"] = (lines[-1] if lines else f"exit {code}")[:160]
        else:
            p = json.loads(pfile.read_text())
            cell.update(makespan_s=p["estimate"].get("makespan_s"), status=p["estimate"].get("status"),
                        file_kib=pfile.stat().st_size / 1024, plan=str(p["estimate"].get("plan", ""))[:90])
            if name == "auto":
                code, wall, rss, err = placer(["simulate", str(g), "-P", str(pfile), "--cluster", c, "-o",
                                               str(tmp / "r.json")])
                cell["simulate_s"], cell["simulate_mib"] = wall, rss
                if not code:
                    r = json.loads((tmp / "r.json").read_text())
                    cell["simulated_s"], cell["sim_status"] = r["makespan_s"], r["status"]
        out.append(cell)
        print(f"  {model} {gpus} {name}: {json.dumps(cell)[:300]}", file=sys.stderr, flush=True)
    return out


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="16,64,256,1024")
    ap.add_argument("--models", default="gpt_1.3b,gpt_6.7b")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "placer-bench-scale"))
    ap.add_argument("--rows", default="", help="comma-separated rows to run (default all: auto,data-parallel,fsdp,"
                                               "pipeline,3d)")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for gpus in (int(x) for x in args.gpus.split(",")):
                cells += row(model, gpus, cache, Path(tmp), {x for x in args.rows.split(",") if x} or None)
    print("## Plans for 16 to 1,024 GPUs (bench_scale.py, issue 34)\n")
    print(f"GPT decoders, bf16, 8 sequences per GPU, DGX A100 servers of 8 GPUs; one run each, load "
          f"{load[0]:.1f} at the start.  Wall time and peak memory are the whole command's (process start, "
          f"imports and file reading included).\n")
    print("| model | GPUs | row | step (s) | status | place (s) | peak (MiB) | file (KiB) | simulate (s) | plan |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---|")
    for c in cells:
        if "error" in c:
            print(f"| {c['model']} | {c['gpus']} | {c['row']} | - | refused | {c['place_s']:.1f} | "
                  f"{fmt(c['place_mib'], '.0f')} | - | - | {c['error']} |")
            continue
        print(f"| {c['model']} | {c['gpus']} | {c['row']} | {fmt(c.get('makespan_s'), '.4g')} | {c.get('status')} "
              f"| {c['place_s']:.1f} | {fmt(c['place_mib'], '.0f')} | {c['file_kib']:.0f} | "
              f"{fmt(c.get('simulate_s'), '.1f')} | {c.get('plan', '')} |")


if __name__ == "__main__":
    main()
