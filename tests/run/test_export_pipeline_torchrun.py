"""`placer export` of pipelines, replicated pipelines (pipeline x data parallelism) and data-parallel
plans as one torchrun program on a (dp, pp) DeviceMesh (issue 36): the program's tables, its launch
checks and refusals (fast), and its step under ``python -m torch.distributed.run`` with gloo on the
CPU against the unplaced step (slow: 2 and 4 processes)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli import registry  # noqa: E402
from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.model.jsonio import write_json  # noqa: E402
from celeritas_cli.pipelining.builder import staged_plan  # noqa: E402
from celeritas_cli.pipelining.cuts import forward_order, stages_from_cuts  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.derived_export import export_derived  # noqa: E402
from celeritas_cli.run.export import torchrun_line  # noqa: E402
from celeritas_cli.run.reference import reference_step  # noqa: E402
from celeritas_cli.run.step import capture_real  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
MLP = "tests.profile.test_profile_torch:TinyMLP"      # l1 = Linear(8, 16) -> ReLU -> l2 = Linear(16, 4)
_STEPS: dict = {}


class Deep(torch.nn.Module):
    """Four Linear(8, 8) with ReLUs and cross-entropy: four stages, one module each."""

    def __init__(self):
        super().__init__()
        self.l0, self.l1, self.l2, self.l3 = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(torch.relu(self.l0(x)))))))

    def example_inputs(self, b):
        return (torch.randn(b, 8),)

    def example_target(self, b):
        return torch.arange(b) % 8

    def loss(self, out, target):
        return torch.nn.functional.cross_entropy(out, target)


DEEP = f"{__name__}:Deep"


def step_of(batch: int = 8, spec: str = MLP):
    if (spec, batch) not in _STEPS:
        _STEPS[(spec, batch)] = capture_real(spec, batch)
    return _STEPS[(spec, batch)]


def pipeline_plan(groups, m: int = 2, schedule: str = "1f1b", batch: int = 8, spec: str = MLP):
    """``len(groups)`` stages, each starting at a Linear's addmm (MLP: cut where l2 starts); stage s on the
    devices groups[s] (one per replica; with model chunks, stage s on the devices of stage s mod p)."""
    g = Graph.from_dict(step_of(batch, spec).doc)
    fwd = forward_order(g, list(range(g.n)))
    heads = [u for u in fwd if g.ids[u].startswith("addmm")][1:len(groups)]
    stage_of = stages_from_cuts(g, fwd, [0] + [fwd.index(u) for u in heads])
    c = uniform(len({d for x in groups for d in x}))
    return staged_plan(g, c, stage_of, groups, m, schedule), c


def export(groups, m: int = 2, program: str = "pp.py", batch: int = 8, spec: str = MLP, schedule: str = "1f1b"):
    p, c = pipeline_plan(groups, m, schedule, batch, spec)
    pre = api.prepare(spec, batch, p, c, step=step_of(batch, spec))
    src, what = export_derived(pre, c, label="p.json", algorithm="pipeline", program=program)
    return pre, src, what


def load(src: str, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- fast: the program's text and tables
def test_replicated_pipeline_exports_a_2x2_mesh_program_with_its_torchrun_line(tmp_path):
    # stage 0 on gpu0 (replica 0) and gpu1 (replica 1), stage 1 on gpu2 and gpu3
    pre, src, what = export([[0, 1], [2, 3]])
    compile(src, "pp.py", "exec")
    assert what == ("a torch.distributed.pipelining program (1f1b, 2 stages split at l2, 2 micro-batches, x 2 "
                    "replicas on a 2 x 2 (dp, pp) DeviceMesh; torchrun --nproc-per-node 4 pp.py)")
    doc = src.split('"""')[1]
    assert "\n    torchrun --nproc-per-node 4 pp.py\n" in doc and "Pipeline x data-parallel plan" in doc
    assert 'init_device_mesh(device.type, (DP, PP), mesh_dim_names=("dp", "pp"))' in src
    assert "import Schedule1F1B as SCHEDULE" in src
    mod = load(src, tmp_path, "pp_mesh")
    assert (mod.DP, mod.PP, mod.N_MICROBATCHES) == (2, 2, 2)
    assert mod.TORCHRUN == "torchrun --nproc-per-node 4 pp.py"
    # global rank r * PP + j = replica r's pipeline rank j: r0 = (gpu0, gpu2), r1 = (gpu1, gpu3)
    assert mod.RANK_DEVICES == ["gpu0", "gpu2", "gpu1", "gpu3"] and mod.STAGE_DEVICES == ["gpu0", "gpu2"]
    # micro-batch i (rows 4i .. 4i+3) cut over the replicas: replica r takes rows 4i + 2r, 4i + 2r + 1
    assert mod.ROWS == [[(0, 2), (4, 2)], [(2, 2), (6, 2)]]
    assert mod.SPLIT_SPEC == {"l2": mod.SplitPoint.BEGINNING} and mod.stages_of(0) == [0] and mod.stages_of(1) == [1]
    assert mod.PARAMETERS == [["l1.weight", [16, 8]], ["l1.bias", [16]], ["l2.weight", [4, 16]], ["l2.bias", [4]]]
    assert mod.SIMULATED_STEP_S == pytest.approx(pre.sim["makespan_s"]) and mod.SIMULATED_STEP_S > 0


def test_plain_pipeline_is_a_1x2_mesh_and_stderr_names_the_program_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    p, c = pipeline_plan([[0], [1]], m=4)
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--model", MLP, "-b", "8", "-o", "g.json"]).exit_code == 0
    write_json(p.to_dict(), "p.json")
    write_json(c.to_dict(), "c.json")
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o", "out/p p.py"])
    assert r.exit_code == 0, r.output
    assert "launch it with: torchrun --nproc-per-node 2 'out/p p.py'" in r.stderr
    src = (tmp_path / "out" / "p p.py").read_text()
    assert "DP, PP, N_MICROBATCHES = 1, 2, 4" in src and "ROWS = [[(0, 2), (2, 2), (4, 2), (6, 2)]]" in src
    assert "\n    torchrun --nproc-per-node 2 'out/p p.py'\n" in src


def test_torchrun_line_quotes_the_program():
    assert torchrun_line(2, "pipe.py") == "torchrun --nproc-per-node 2 pipe.py"
    assert shlex.split(torchrun_line(8, "my dir/x.py")) == ["torchrun", "--nproc-per-node", "8", "my dir/x.py"]


def test_interleaved_replicated_pipeline_runs_two_chunks_per_rank(tmp_path):
    # 4 stages (l0 | l1 | l2 | l3), stage s on the devices of stage s mod 2, x 2 replicas: 4 processes
    _, src, what = export([[0, 2], [1, 3], [0, 2], [1, 3]], m=4, spec=DEEP, schedule="interleaved")
    assert what.startswith("a torch.distributed.pipelining program (interleaved, 4 stages split at l1, l2, l3, "
                           "4 micro-batches, x 2 replicas on a 2 x 2 (dp, pp) DeviceMesh; torchrun --nproc-per-node 4")
    mod = load(src, tmp_path, "pp_interleaved")
    assert "import ScheduleInterleaved1F1B as SCHEDULE" in src and (mod.DP, mod.PP) == (2, 2)
    assert mod.stages_of(0) == [0, 2] and mod.stages_of(1) == [1, 3]
    assert mod.STAGE_DEVICES == ["gpu0", "gpu1", "gpu0", "gpu1"] and mod.RANK_DEVICES == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert mod.ROWS == [[(0, 1), (2, 1), (4, 1), (6, 1)], [(1, 1), (3, 1), (5, 1), (7, 1)]]


# ---------------------------------------------------------------- fast: launch checks and refusals
def test_wrong_launches_stop_in_one_line_before_any_step(tmp_path, monkeypatch, capsys):
    _, src, _ = export([[0, 1], [2, 3]])
    mod = load(src, tmp_path, "pp_launch")
    monkeypatch.setattr(sys, "argv", ["pp.py"])
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as exc:            # python pp.py: not under torchrun
        mod.main()
    assert str(exc.value) == "start this program with torchrun, one process per rank: torchrun --nproc-per-node 4 pp.py"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exc:            # torchrun --nproc-per-node 2
        mod.main()
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err == ("torchrun started 2 processes but the plan has 4 ranks (2 replica(s) x 2 pipeline rank(s)): "
                   "torchrun --nproc-per-node 4 pp.py\n")
    from tests.profile.test_profile_torch import TinyMLP

    mod.check_model(TinyMLP())                        # the profiled model passes
    wide = TinyMLP()
    wide.l1 = torch.nn.Linear(8, 32)                  # a model file whose layer shapes changed
    with pytest.raises(SystemExit) as exc:
        mod.check_model(wide)
    assert str(exc.value) == (f"{MLP} no longer builds the profiled model (l1.weight is [32, 8], was l1.weight "
                              f"[16, 8]): profile, place and export it again")


def test_plans_the_program_cannot_express_say_why_in_one_line(tmp_path, monkeypatch):
    # uneven micro-batches (7 samples in 4 + 3): placer's own code instead, the reason in the one line
    _, _, what = export([[0], [1]], m=2, batch=7)
    assert what.startswith("placer's own code") and what.endswith(
        "not a pipelining schedule: replica 0's micro-batches hold [4, 3] samples: the exported stages are traced "
        "at one micro-batch size")
    # a pipeline after a rewrite placer does not execute (operation splitting): refused, exit 1, one line
    monkeypatch.chdir(tmp_path)
    p, c = pipeline_plan([[0], [1]])
    p.derivation["steps"].insert(0, {"transform": "split", "node": "addmm", "dim": "batch", "n": 2})
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--model", MLP, "-b", "8", "-o", "g.json"]).exit_code == 0
    write_json(p.to_dict(), "p.json")
    write_json(c.to_dict(), "c.json")
    r = runner.invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o", "x.py"])
    assert r.exit_code == 1 and r.stdout == "" and not (tmp_path / "x.py").exists()
    lines = r.stderr.strip().splitlines()
    assert "not a split step" in lines[-1] and "Traceback" not in r.stderr


# ---------------------------------------------------------------- fast: the one-process step, in process
def test_one_rank_program_accumulates_weighted_microbatches_like_the_unplaced_step(tmp_path, monkeypatch):
    """A 1 x 1 mesh (one stage, 2 micro-batches of 4: gradient accumulation) run by main() in this
    process: loss and Adam-updated parameters are the unplaced step's."""
    g = Graph.from_dict(step_of().doc)
    p = staged_plan(g, uniform(1), [0] * g.n, [[0]], 2, "gpipe")
    pre = api.prepare(MLP, 8, p, uniform(1), step=step_of())
    src, what = export_derived(pre, uniform(1), label="p.json", algorithm="pipeline", program="one.py")
    assert "1 x 1 (dp, pp) DeviceMesh" in what
    mod = load(src, tmp_path, "one_rank")
    assert mod.ROWS == [[(0, 4), (4, 4)]]
    monkeypatch.setattr(sys, "argv", ["one.py", "--steps", "1", "--warmup", "0", "--save", str(tmp_path / "out"),
                                      "--report", str(tmp_path / "r.json")])
    for k, v in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    threads = torch.get_num_threads()
    try:
        mod.main()
    finally:
        torch.set_num_threads(threads)
    got = torch.load(tmp_path / "out.0", weights_only=False)
    ref = reference_step(step_of())
    assert float(got["loss"]) == pytest.approx(float(ref.loss), rel=1e-6)
    for q, want in ref.params.items():
        assert torch.allclose(got[step_of().sm.state_names[q]], want, rtol=1e-4, atol=1e-6)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["simulated_step_s"] == pytest.approx(pre.sim["makespan_s"]) and rep["steps"] == 1
    assert rep["measured_over_simulated"] == pytest.approx(rep["measured_step_s"] / rep["simulated_step_s"])


# ---------------------------------------------------------------- slow: torchrun processes, gloo, CPU
def torchrun(program: Path, nproc: int, out: Path, cwd: Path = ROOT, *extra: str):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                           "--master-port", str(free_port()), str(program), "--steps", "1", "--warmup", "0",
                           "--save", str(out), *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def matches_unplaced(out: Path, nproc: int, batch: int = 8, spec: str = MLP):
    """Every rank's parameters (each replica's copy) and the loss against the unplaced step, rtol 1e-4."""
    ref = reference_step(step_of(batch, spec))
    names = step_of(batch, spec).sm.state_names
    seen = set()
    for rank in range(nproc):
        got = torch.load(f"{out}.{rank}", weights_only=False)
        assert float(got.pop("loss")) == pytest.approx(float(ref.loss), rel=1e-4)
        for q, want in ref.params.items():
            if names[q] in got:
                assert torch.allclose(got[names[q]], want, rtol=1e-4, atol=1e-6), (rank, names[q])
                seen.add(names[q])
    assert seen == {names[q] for q in ref.params}


@pytest.mark.slow
@pytest.mark.parametrize("groups, m, spec, schedule", [
    ([[0], [1]], 2, MLP, "1f1b"),
    ([[0, 1], [2, 3]], 2, MLP, "1f1b"),
    ([[0, 2], [1, 3], [0, 2], [1, 3]], 4, DEEP, "interleaved"),
], ids=["2-stages", "2-stages-x-2-replicas", "interleaved-2-ranks-x-2-replicas"])
def test_exported_program_under_torchrun_steps_like_the_unplaced_step(tmp_path, groups, m, spec, schedule):
    nproc = len({d for x in groups for d in x})
    _, src, _ = export(groups, m, program="pp.py", spec=spec, schedule=schedule)
    (tmp_path / "pp.py").write_text(src)
    r = torchrun(tmp_path / "pp.py", nproc, tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^step: measured [\d.e-]+ s \(median of 1\), simulated [\d.e-]+ s, measured/simulated",
                     r.stdout, re.M), r.stdout
    matches_unplaced(tmp_path / "out", nproc, spec=spec)


def export_block(text: str) -> tuple[list[str], list[str]]:
    """The page's bash block that exports a plan and launches it with torchrun (its last line), as
    ``(lines the block needs from earlier blocks, the block's lines)``: an earlier line is needed
    when it writes (``-o``) a file the block reads and does not write itself."""
    blocks = [[ln.split("  #")[0].strip() for ln in b.splitlines() if ln.strip()]
              for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    at = next(i for i, b in enumerate(blocks) if b[-1].startswith("torchrun ")
              and any(ln.startswith("placer export ") for ln in b))
    block = blocks[at]
    written = {m for ln in block for m in re.findall(r"-o (\S+)", ln)}
    read = {f for ln in block for f in re.findall(r"(\S+\.json)\b", ln)} - written
    earlier = [ln for b in blocks[:at] for ln in b if set(re.findall(r"-o (\S+)", ln)) & read]
    return earlier, block


def test_the_pages_blocks_export_then_launch():
    for page, want in (("README.md", []), ("docs/running.md", ["cpu2.json"])):
        earlier, block = export_block((ROOT / page).read_text())
        assert [re.search(r"-o (\S+)", ln).group(1) for ln in earlier] == want
        assert block[0].startswith("placer profile --model ") and block[-1].startswith("torchrun --nproc-per-node ")


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/running.md"])
def test_the_pages_export_then_torchrun_lines_run_verbatim(tmp_path, page):
    """The page's block that ends in a torchrun line, every line as written (and the earlier lines
    that make the files it reads), in a fresh clone: tests/test_readme.py runs the placer lines of
    every page, this one the torchrun line too."""
    earlier, block = export_block((ROOT / page).read_text())
    for name in ("celeritas_cli", "examples", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for line in earlier + block:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"{line}\n{r.stderr[-3000:]}"
    assert re.search(r"^step: measured [\d.e-]+ s \(median of \d+\), simulated", r.stdout, re.M), r.stdout


def test_the_pipelining_program_carries_the_shared_launch_checks(tmp_path):
    """run/export.launch_check_source: the process count and parameter shapes always, the files when exported
    with their fingerprint; called before the first step (after the program's own process-count check)."""
    _, src, _ = export([[0, 1], [2, 3]])
    mod = load(src, tmp_path, "pp_checks")
    assert mod.PROCESSES == 4 and mod.LAUNCH == "torchrun --nproc-per-node 4 pp.py"
    assert mod.PARAMETER_SHAPES and all(isinstance(n, str) for n, _ in mod.PARAMETER_SHAPES)
    main = src[src.index("def main():"):]
    assert main.index("launch_check()") < main.index("dist.init_process_group")
    assert main.index("check_model(model)") < main.index("model_check(model)")
