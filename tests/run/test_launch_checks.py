"""The launch checks every exported program carries (celeritas_cli/run/export.py,
``launch_check_source``): a wrong launch says so in one line, exit status 1, before any step -
another process count than the plan's, a program exported for another graph file or cluster, a
model whose parameters differ from the profiled graph's, a model file changed since the export.

Most tests call the generated ``launch_check`` / ``model_check`` in this process (the module run
without its ``main``); two run the program as a process (``python fsdp.py``: no torchrun, so one
process of a two-process plan), one under torchrun (slow)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.jsonio import write_json  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.export import export_source, fingerprint  # noqa: E402

from .test_export_fsdp import MLP, ROOT, export_fsdp, step_of, torchrun  # noqa: E402

FILE_TEXT = (ROOT / "examples" / "tiny_mlp.py").read_text()


def load(path, name="placed_launch"):
    """The generated module, imported (its main does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def launch_env(monkeypatch):
    """A clean launch environment: rank 0 of the plan's two processes, no override."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PLACER_IGNORE_FINGERPRINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    return monkeypatch


@pytest.fixture
def own_model(tmp_path):
    """A copy of examples/tiny_mlp.py in tmp_path, the spec that loads it, the program exported for it."""
    (tmp_path / "tiny_mlp.py").write_text(FILE_TEXT)
    spec = f"{tmp_path / 'tiny_mlp.py'}:TinyMLP"
    path, _, _ = export_fsdp(tmp_path, 3, spec=spec)
    return spec, path


def stops(fn, *args) -> str:
    """The one line a check stops with (SystemExit whose code is the message: exit status 1)."""
    with pytest.raises(SystemExit) as exc:
        fn(*args)
    msg = exc.value.code
    assert isinstance(msg, str) and "\n" not in msg, msg
    return msg


def test_a_right_launch_passes_every_check(tmp_path, launch_env, own_model):
    spec, path = own_model
    launch_env.chdir(tmp_path)
    mod = load(path)
    mod.launch_check(["--graph", "g.json", "--cluster", "c.json"])
    mod.model_check(mod.build_model())


def test_another_process_count_is_refused_with_the_torchrun_line(tmp_path, launch_env):
    path, _, line = export_fsdp(tmp_path, 3)
    mod = load(path)
    launch_env.setenv("WORLD_SIZE", "3")
    msg = stops(mod.launch_check, [])
    assert msg == f"fsdp.py: started as 3 process(es), but the plan runs 2: launch it with `{line}`"
    launch_env.setenv("RANK", "2")       # the other ranks stop quietly, with the same status, after a grace
    slept = []
    launch_env.setattr("time.sleep", slept.append)
    with pytest.raises(SystemExit) as exc:
        mod.launch_check([])
    assert exc.value.code == 1 and slept == [2.0]


def test_another_graph_file_is_refused(tmp_path, launch_env):
    path, _, _ = export_fsdp(tmp_path, 3)
    mod = load(path)
    other = tmp_path / "other.json"
    write_json(step_of(MLP, 2).doc, str(other))          # the same model profiled at another batch
    msg = stops(mod.launch_check, ["--graph", str(other)])
    assert "exported for graph 'tinymlp_b4'" in msg and f"but {other} has sha256" in msg
    assert "no such file" in stops(mod.launch_check, ["--graph=missing.json"])


def test_the_exported_from_graph_file_changed_in_place_is_refused_unless_ignored(tmp_path, launch_env):
    path, _, _ = export_fsdp(tmp_path, 3)
    mod = load(path)
    mod.launch_check([])                                 # the file it was exported from, unchanged
    (tmp_path / "g.json").write_text((tmp_path / "g.json").read_text() + "\n")
    assert "exported for graph 'tinymlp_b4'" in stops(mod.launch_check, [])
    launch_env.setenv("PLACER_IGNORE_FINGERPRINT", "1")
    mod.launch_check([])
    launch_env.setenv("WORLD_SIZE", "1")                 # the process count is checked all the same
    assert "started as 1 process(es)" in stops(mod.launch_check, [])


def test_another_cluster_is_refused_by_name_and_by_digest(tmp_path, launch_env):
    path, _, _ = export_fsdp(tmp_path, 3)
    mod = load(path)
    msg = stops(mod.launch_check, ["--cluster", "4xV100-pcie"])
    assert "exported for cluster '2cpu'" in msg and "is '4xV100-pcie'" in msg
    edited = uniform(2, dtype="cpu", name="2cpu", bandwidth=1e6)   # the same name, other links
    write_json(edited.to_dict(), str(tmp_path / "edited.json"))
    assert "exported for cluster '2cpu'" in stops(mod.launch_check, ["--cluster", str(tmp_path / "edited.json")])
    assert stops(mod.launch_check, ["--cluster", "nope.json"]).startswith("fsdp.py: --cluster nope.json: ")


def test_a_model_with_other_layer_shapes_is_refused_naming_the_parameter(tmp_path, launch_env, own_model):
    spec, path = own_model
    mod = load(path)
    (tmp_path / "tiny_mlp.py").write_text(FILE_TEXT.replace("nn.Linear(width, width)", "nn.Linear(width, 2 * width)")
                                          .replace("nn.Linear(width, classes)", "nn.Linear(2 * width, classes)"))
    model = load(path, "placed_launch_2").build_model()   # a fresh import: the changed file
    msg = stops(mod.model_check, model)
    assert msg == (f"fsdp.py: {tmp_path / 'tiny_mlp.py'} no longer builds the profiled graph: parameter l2.weight "
                   f"is (32, 16) but the graph recorded (16, 16); profile, place and export it again")


def test_missing_and_extra_parameters_are_named(tmp_path, launch_env):
    path, _, _ = export_fsdp(tmp_path, 3)
    mod = load(path)
    nn = torch.nn
    fewer = nn.Module()
    fewer.l1 = nn.Linear(32, 16)
    assert "it has no parameter l2.weight (the graph recorded (16, 16))" in stops(mod.model_check, fewer)
    more = mod.build_model()
    more.extra = nn.Linear(2, 2)
    assert "it has a parameter extra.weight (2, 2) the graph did not record" in stops(mod.model_check, more)


def test_a_changed_model_file_with_the_same_shapes_is_refused_unless_ignored(tmp_path, launch_env, own_model):
    spec, path = own_model
    mod = load(path)
    (tmp_path / "tiny_mlp.py").write_text(FILE_TEXT + "\n# edited\n")
    msg = stops(mod.model_check, mod.build_model())
    assert "tiny_mlp.py changed since the export" in msg and "the same parameter shapes" in msg
    launch_env.setenv("PLACER_IGNORE_FINGERPRINT", "1")
    mod.model_check(mod.build_model())


def test_the_plain_export_checks_in_placed_step(tmp_path, launch_env):
    step = step_of(MLP, 4)
    c = uniform(2, dtype="cpu", name="2cpu")
    from celeritas_cli import registry
    from celeritas_cli.model.graph import Graph

    p = registry.place(Graph.from_dict(step.doc), c, "random", seed=1)
    pre = api.prepare(MLP, 4, p, c, config={"width": 16}, step=step)
    fp = fingerprint(graph=pre.sim_graph.name, graph_path=None, cluster=c, spec=MLP)
    src = export_source(pre.prog, c.ids, pre.tdev, graph="g", cluster="2cpu", label="p.json", algorithm="random",
                        fingerprint=fp)
    (tmp_path / "placed.py").write_text(src)
    mod = load(tmp_path / "placed.py", "placed_plain")
    assert mod.PROCESSES == 1
    from celeritas_cli.profile.models import resolve_model

    factory, _ = resolve_model(MLP, {"width": 16})
    msg = stops(mod.PlacedStep, factory())                  # WORLD_SIZE=2: a one-process plan under torchrun
    assert msg.startswith("placed.py: started as 2 process(es), but the plan runs 1")
    launch_env.setenv("WORLD_SIZE", "1")
    wide = resolve_model(MLP, {"width": 8})[0]()
    assert "parameter l1.weight is (8, 32) but the graph recorded (16, 32)" in stops(mod.PlacedStep, wide)
    mod.PlacedStep(factory())                               # the right model, one process


def run_plain(tmp_path, path, env: dict) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
             PLACER_EXPORT_OUT=str(tmp_path / "out"), **env)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in env:
            e.pop(key, None)
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=e, capture_output=True, text=True,
                          timeout=300)


def test_the_program_without_torchrun_stops_in_one_line_before_a_step(tmp_path):
    path, _, line = export_fsdp(tmp_path, 2)
    r = run_plain(tmp_path, path, {})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"fsdp.py: started as 1 process(es), but the plan runs 2: launch it "
                                             f"with `{line}`"]
    assert not list(tmp_path.glob("out.*"))                 # no step ran


def test_the_program_with_a_changed_model_stops_in_one_line_before_a_step(tmp_path, own_model):
    spec, path = own_model
    (tmp_path / "tiny_mlp.py").write_text(FILE_TEXT.replace("nn.Linear(32, width)", "nn.Linear(32, width + 1)"))
    r = run_plain(tmp_path, path, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert r.returncode == 1 and r.stdout == "", r.stderr[-2000:]
    [msg] = r.stderr.strip().splitlines()
    assert "no longer builds the profiled graph: parameter l1.weight is (17, 32)" in msg
    assert not list(tmp_path.glob("out.*"))


@pytest.mark.slow
def test_torchrun_with_another_process_count_says_so_once(tmp_path):
    """(Seconds: torchrun starts; the programs stop before torch loads.  The in-process test of
    the process count is the fast one.)"""
    path, _, line = export_fsdp(tmp_path, 3)
    r = torchrun(tmp_path, 3, path, env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode != 0 and "loss " not in r.stdout
    assert r.stderr.count(f"fsdp.py: started as 3 process(es), but the plan runs 2: launch it with `{line}`") == 1
    assert not list(tmp_path.glob("out.*"))


def test_a_bad_steps_argument_stops_in_one_line(tmp_path, launch_env):
    path, _, _ = export_fsdp(tmp_path, 3)
    mod = load(path)
    assert stops(mod.main, ["--steps", "two"]) == ("fsdp.py: --steps two: expected the number of timed steps after "
                                                   "the first (0 or more)")


def test_the_derived_export_checks_in_placed_step(tmp_path, launch_env):
    """placer's own code for a micro-batched plan (one process) carries the same checks."""
    from celeritas_cli.run.derived_export import export_derived
    from tests.profile.test_profile_torch import TinyMLP

    from .test_pipeline_run import MLP as MOD_MLP
    from .test_pipeline_run import plan
    from .test_pipeline_run import step_of as pipe_step

    p, c = plan(MOD_MLP, 8, 2, "1f1b", recompute=True)
    pre = api.prepare(MOD_MLP, 8, p, c, step=pipe_step(MOD_MLP, 8))
    fp = fingerprint(graph=pre.sim_graph.name, graph_path=None, cluster=c, spec=MOD_MLP)
    src, why = export_derived(pre, c, label="p.json", algorithm="pipeline", fingerprint=fp)
    assert why.startswith("placer's own code") and fp["model_file"] is None      # a module: no file to hash
    (tmp_path / "own.py").write_text(src)
    mod = load(tmp_path / "own.py", "own_launch")
    assert mod.PROCESSES == 1 and mod.FINGERPRINT == fp
    assert stops(mod.PlacedStep, TinyMLP()).startswith("own.py: started as 2 process(es), but the plan runs 1")
    launch_env.setenv("WORLD_SIZE", "1")
    narrow = TinyMLP()
    narrow.l2 = torch.nn.Linear(16, 3)
    msg = stops(mod.PlacedStep, narrow)
    assert msg.startswith(f"own.py: {MOD_MLP} no longer builds the profiled graph: parameter l2.weight is (3, 16)")
    mod.PlacedStep(TinyMLP())
