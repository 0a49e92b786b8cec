"""The ``placer`` process ends with ``os._exit`` once a command's result is
written (cli/common.py ``finish``, issue 24.5): the output, stderr, C stdio
buffers and atexit handlers must all survive it, the exit code too, and it
must never fire inside another program (click's CliRunner) or beside a
running thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from click.testing import CliRunner

from celeritas_cli.cli import common, main

from ..conftest import SAMPLES

G60 = str(SAMPLES / "layered_60.json")
PLACE = ["place", G60, "--algo", "random", "--no-timings"]

# the placer process with an atexit handler that leaves a C-library printf in its buffer (stdout is a pipe:
# fully buffered), as a C extension's output would be: only a flush of the C library's stdio writes it
SCRIPT = """
import atexit, ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
def bye():
    libc.printf(b"c-stdio-buffered")
    print("atexit ran", file=sys.stderr)
atexit.register(bye)
from celeritas_cli.cli import run
sys.argv = ["placer", *sys.argv[1:]]
run()
"""


def _placer(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # it would unbuffer C stdio too
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, timeout=120, env=env)


def test_the_result_on_stdout_is_whole_and_as_in_process():
    expected = CliRunner().invoke(main, PLACE).stdout_bytes
    got = _placer(*PLACE)
    assert got.returncode == 0, got.stderr
    assert got.stdout == expected + b"c-stdio-buffered"
    assert got.stderr.decode().rstrip().endswith("atexit ran")
    assert "no --cluster given" in got.stderr.decode()


def test_an_output_file_is_whole_and_the_c_buffers_are_flushed(tmp_path):
    out = tmp_path / "p.json"
    got = _placer(*PLACE, "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert out.read_bytes() == CliRunner().invoke(main, PLACE).stdout_bytes
    assert got.stdout == b"c-stdio-buffered" and b"atexit ran" in got.stderr


def test_errors_keep_their_exit_code_and_message(tmp_path):
    got = _placer("simulate", G60, "-P", str(tmp_path / "missing.json"))
    assert got.returncode == 1 and got.stdout == b"c-stdio-buffered"  # the normal exit (no fast exit on errors)
    assert got.stderr.decode().count("\n") == 2 and "missing.json" in got.stderr.decode()  # + "atexit ran"


def test_finish_does_nothing_outside_the_placer_process_or_beside_a_thread(monkeypatch):
    finish = common.finish
    finish()  # FAST_EXIT is False in a test process: returns
    monkeypatch.setattr(common, "FAST_EXIT", True)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        finish()  # another thread runs: returns instead of ending the process under it
    finally:
        stop.set()
        worker.join()
