"""`placer run` launched by torchrun: two local processes over env:// (the torchrun processes are
the ranks; rank 0 writes the report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import validate, write_json  # noqa: E402
from celeritas_cli.profile import capture_model  # noqa: E402
from celeritas_cli.run.torchrun import under_torchrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT / 'examples' / 'tiny_mlp.py'}:TinyMLP"


def torchrun(tmp_path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "celeritas_cli", "run", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def inputs(tmp_path, algo: str) -> None:
    g = capture_model(MLP, 4, config={"width": 16})
    write_json(g, str(tmp_path / "g.json"))
    c = uniform(2, dtype="cpu", name="2cpu")
    write_json(c.to_dict(), str(tmp_path / "c.json"))
    p = registry.place(Graph.from_dict(g), c, algo, seed=1)
    write_json(p.to_dict(), str(tmp_path / "p.json"))


def test_two_torchrun_processes_run_a_placement_across_them(tmp_path):
    inputs(tmp_path, "random")
    r = torchrun(tmp_path, 2, "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "--steps", "1",
                 "--node-times", "-o", "rep.json")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "rep.json").read_text())
    validate(rep, "placer.run/v1", "report")
    assert rep["match"] and rep["loss_max_abs_diff"] == 0.0 and rep["params_max_abs_diff"] == 0.0
    assert rep["launcher"] == "torchrun" and rep["processes"] == 2 and rep["dist_backend"] == "gloo"
    assert {n["device"] for n in rep["node_times"]["nodes"]} == {"gpu0", "gpu1"}
    for ln in rep["links"]:
        assert (ln["bytes"], ln["transfers"]) == (ln["simulated_bytes"], ln["simulated_transfers"])


@pytest.mark.slow
def test_torchrun_with_the_wrong_process_count_stops_every_rank_in_one_line(tmp_path):
    inputs(tmp_path, "random")
    r = torchrun(tmp_path, 3, "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "--steps", "1")
    assert r.returncode != 0 and not (tmp_path / "rep.json").exists()
    assert "torchrun started 3 processes but the placement uses 2 device(s)" in r.stderr
    assert r.stderr.count("Error: rank 0 stopped: torchrun started 3 processes") == 2


def test_torchrun_is_recognised_by_its_environment():
    assert under_torchrun({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "2"})
    assert not under_torchrun({"RANK": "1", "WORLD_SIZE": "2"})
