"""`placer compare --executor ray` against a Ray cluster this test starts
(`ray start --head` in a temporary directory, on the loopback address,
stopped by its process id afterwards), and `--ray-address auto` without a
running cluster: one line saying so.  Needs the ``ray`` extra (installed by
``.ci/run``); skipped without it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from celeritas_cli.cli import main
from celeritas_cli.model.cluster import uniform
from celeritas_cli.model.generate import layered
from celeritas_cli.model.jsonio import write_json

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path_factory, monkeypatch):
    """A one-node Ray cluster on 127.0.0.1 (2 CPUs, no dashboard, no token:
    loopback only), its address; stopped by the pid of its `ray start
    --block` process (SIGTERM stops what it started), never by `ray stop`,
    which would stop every Ray instance on the machine."""
    cli = Path(sys.executable).with_name("ray")
    if not cli.exists():
        pytest.skip("the ray command is not installed beside this Python")
    temp = tmp_path_factory.mktemp("ray")  # Ray's session files, sockets and logs
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    log = open(temp / "ray_start.log", "wb")
    proc = subprocess.Popen([str(cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--include-dashboard=false",
                             "--disable-usage-stats"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while b"Ray runtime started" not in (temp / "ray_start.log").read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ray start --head did not come up: " + (temp / "ray_start.log").read_text()[-2000:])
            time.sleep(0.5)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        proc.terminate()  # `ray start --block` stops its processes on SIGTERM
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session it started, by its id
            proc.wait(10)
        log.close()


@pytest.fixture
def graph_files(tmp_path):
    g = tmp_path / "g.json"
    write_json(layered(60, seed=1).to_dict(), g)
    cl = tmp_path / "two.json"
    write_json(uniform(2, name="two").to_dict(), cl)
    return g, cl


def test_compare_on_a_local_ray_cluster(ray_head, graph_files):
    g, cl = graph_files
    base = ["compare", str(g), "--cluster", str(cl), "--algos", "heft,m-topo,single-device", "--format", "json", "-q"]
    on_ray = CliRunner().invoke(main, base + ["--executor", "ray", "--ray-address", ray_head, "-j", "2"])
    assert on_ray.exit_code == 0, on_ray.output
    here = CliRunner().invoke(main, base)
    assert here.exit_code == 0, here.output

    def cells(out: str) -> list[tuple]:
        rows = [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]
        return sorted((r["algorithm"], r["status"], r["makespan_s"]) for r in rows)

    assert len(cells(on_ray.stdout)) == 3 and cells(on_ray.stdout) == cells(here.stdout)


def test_ray_address_auto_without_a_cluster_says_so(graph_files, monkeypatch, tmp_path):
    g, cl = graph_files
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(address="auto", logging_level="ERROR")
    except Exception:
        pass
    else:  # someone runs a Ray cluster on this machine: nothing to test here
        ray.shutdown()
        pytest.skip("a Ray cluster is running on this machine")
    res = CliRunner().invoke(main, ["compare", str(g), "--cluster", str(cl), "--algos", "heft", "-q",
                                    "--executor", "ray", "--ray-address", "auto"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "--ray-address auto: no running Ray cluster" in lines[0]
    assert "ray start --head" in lines[0]
