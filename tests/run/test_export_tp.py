"""``placer export`` of tensor-parallel plans (celeritas_cli/run/tp_export.py): the megatron row
with pp=1 (TP, TP x DP, sequence parallelism, recomputation) written as one program on a
("dp", "tp") DeviceMesh that torchrun launches, parallelize_module over mesh["tp"].

The default suite checks the pieces (which module gets which style, the mesh and batch tables,
the torchrun line, the refusals, the launch checks that stop a wrong launch before torch loads);
the slow tests launch the program with torchrun (2 and 4 processes, gloo, CPU) and compare its
step with the unplaced one, computed here by hand in eager PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.run.export import fingerprint  # noqa: E402
from celeritas_cli.run.export_plan import export_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: the zoo's GPT (celeritas_cli/profile/gpt.py) at a tiny size, fp32 (a module spec, not the bf16 zoo
#: entry), random tokens (zeros would leave most of the vocabulary-parallel table without a gradient),
#: dropout off (DTensor draws other masks than the unplaced step) and no QKV bias: a key bias gets no
#: gradient in exact arithmetic (softmax ignores a constant added to every key), and Adam's first step
#: turns its rounding noise into an update of up to lr, whichever order the sums take
TINY_GPT = '''
import torch
from torch import nn

from celeritas_cli.profile.gpt import GPT


class TinyGPT(GPT):
    def __init__(self, layers=2, d_model=32, heads=4, vocab=64, seq=16):
        super().__init__("1.3b", layers=layers, d_model=d_model, heads=heads, vocab=vocab, seq=seq, dropout=0.0)
        for blk in self.blocks:
            blk.qkv = nn.Linear(blk.qkv.in_features, blk.qkv.out_features, bias=False)

    def example_inputs(self, batch):
        return (torch.randint(0, self.vocab, (batch, self.seq)),)

    def example_target(self, batch):
        return torch.randint(0, self.vocab, (batch, self.seq))
'''
BATCH = 4
_STEPS: dict = {}


def write_model(folder: Path, source: str = TINY_GPT) -> str:
    """Write the model file into *folder*: its ``--model`` spec."""
    (folder / "tiny_gpt.py").write_text(source)
    return f"{folder / 'tiny_gpt.py'}:TinyGPT"


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> str:
    """The spec of TinyGPT, written once per module."""
    return write_model(tmp_path_factory.mktemp("tiny_gpt"))


def step_of(spec: str, batch: int = BATCH):
    """The captured step of *spec* (cached: a capture takes seconds)."""
    from celeritas_cli.run.step import capture_real

    if (spec, batch) not in _STEPS:
        _STEPS[(spec, batch)] = capture_real(spec, batch)
    return _STEPS[(spec, batch)]


def megatron_plan(tmp_path: Path, spec: str, n: int, **params):
    """Profile *spec* (tmp_path/g.json), a cluster of *n* CPUs (c.json), the megatron placement with
    *params* and pp=1 unless given (p.json): ``(step, graph, cluster, placement)``."""
    from celeritas_cli import registry
    from celeritas_cli.model.cluster import uniform
    from celeritas_cli.model.graph import Graph
    from celeritas_cli.model.jsonio import write_json

    step = step_of(spec)
    write_json(step.doc, str(tmp_path / "g.json"))
    cluster = uniform(n, dtype="cpu", name=f"{n}cpu")
    write_json(cluster.to_dict(), str(tmp_path / "c.json"))
    graph = Graph.from_dict(step.doc)
    placement = registry.place(graph, cluster, "megatron", params={"pp": 1, **params})
    write_json(placement.to_dict(), str(tmp_path / "p.json"))
    return step, graph, cluster, placement


def prepared(tmp_path: Path, spec: str, n: int, **params):
    """:func:`megatron_plan` prepared for placer run / export: ``(pre, cluster, placement)``."""
    from celeritas_cli.run import api

    step, graph, cluster, placement = megatron_plan(tmp_path, spec, n, **params)
    pre = api.prepare(spec, BATCH, placement, cluster, label="p.json", graph=graph,
                      graph_label=str(tmp_path / "g.json"), step=step)
    return pre, cluster, placement


def export_tp(tmp_path: Path, spec: str, n: int, name: str = "tp.py", **params):
    """Export the megatron plan (:func:`prepared`) to tmp_path/name: ``(path, source, what, line, pre)``."""
    pre, cluster, placement = prepared(tmp_path, spec, n, **params)
    fp = fingerprint(graph=pre.sim_graph.name, graph_path=str(tmp_path / "g.json"), cluster=cluster, spec=spec)
    path = tmp_path / name
    src, what, line = export_program(pre, cluster, label="p.json", algorithm=placement.algorithm, fingerprint=fp,
                                     path=str(path))
    path.write_text(src)
    return path, src, what, line, pre


def reference(spec: str, batch: int = BATCH):
    """The unplaced step by hand in eager PyTorch, as placer profile built the model: the loss on the
    whole batch, one torch.optim.Adam step.  ``(loss, updated parameters, initial parameters)``."""
    from celeritas_cli.profile.models import resolve_model

    factory, _ = resolve_model(spec, {})
    torch.manual_seed(0)
    model = factory()
    torch.manual_seed(1)
    x, y = model.example_inputs(batch)[0], model.example_target(batch)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = model.loss(model(x), y)
    loss.backward()
    loss = loss.detach()
    torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False).step()
    return float(loss), {n: p.detach().clone() for n, p in model.named_parameters()}, init


def tables(src: str) -> dict:
    """The generated module's top-level names, run without its main (nothing is launched)."""
    ns: dict = {"__name__": "placed_tables", "__file__": "tp.py"}
    exec(compile(src, "tp.py", "exec"), ns)
    return ns


def python(tmp_path, program: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The program run by plain python (no torchrun), with *env* on top of a clean environment."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    e.update(env or {})
    return subprocess.run([sys.executable, str(program), *args], cwd=tmp_path, env=e, capture_output=True, text=True,
                          timeout=300)


def torchrun(tmp_path, nproc: int, program: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
             **(env or {}))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(program),
           *args]
    return subprocess.run(cmd, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)


# ----------------------------------------------------------------------- fast
#: the styles of TinyGPT's modules by hand: each block's fused QKV by columns in its 3 parts (Q, K, V:
#: each rank its heads of each), the attention projection by rows, fc by columns, fc2 by rows, the
#: word embedding by vocabulary rows; the LM head is tied (F.linear(x, wte.weight) in the root): no
#: module of its own
PLAN = [("wte", "embedding", {})] + [x for b in (0, 1) for x in (
    (f"blocks.{b}.qkv", "colwise", {"split_factor": 3}), (f"blocks.{b}.proj", "rowwise", {}),
    (f"blocks.{b}.fc", "colwise", {}), (f"blocks.{b}.fc2", "rowwise", {}))]


def test_module_plan_maps_the_derivations_patterns_to_the_models_modules(tmp_path, gpt):
    pre, _, _ = prepared(tmp_path, gpt, 2, tp=2)
    assert (pre.tp, pre.dp, pre.sp, pre.module_plan) == (2, 1, False, PLAN)
    assert pre.notes and "tied" in pre.notes[0]
    assert pre.recompute is None and pre.recompute_layers == []
    # sequence parallelism adds every LayerNorm (SequenceParallel) and gathers ln_f's output for the tied head
    sp, _, _ = prepared(tmp_path, gpt, 2, tp=2, sequence_parallel=True, recompute="full")
    norms = [(f"blocks.{b}.{ln}", "sequence", {}) for b in (0, 1) for ln in ("ln1", "ln2")] + [("ln_f", "sequence", {})]
    assert sorted(sp.module_plan) == sorted(PLAN + norms + [("ln_f", "head_input", {})])
    assert sp.module_plan[-1] == ("ln_f", "head_input", {})
    # full recomputation: each block (the module holding an attention and the MLP after it) is checkpointed
    assert (sp.recompute, sp.recompute_layers) == ("full", ["blocks.0", "blocks.1"])


def test_the_mesh_and_the_batch_of_a_tp_x_dp_plan(tmp_path, gpt):
    path, src, what, line, pre = export_tp(tmp_path, gpt, 4, tp=2, dp=2)
    ns = tables(src)
    assert line == f"torchrun --nproc-per-node 4 {path}" and f"    {line}\n" in src.split('"""')[1]
    assert "DeviceMesh of 2 replica(s) x 2 tensor ranks" in what
    assert (ns["DP"], ns["TP"], ns["PROCESSES"], ns["GLOBAL_BATCH"], ns["SEQUENCE_PARALLEL"]) == (2, 2, 4, 4, False)
    assert ns["TP_PLAN"] == PLAN and ns["PRECISION"] == "fp32" and ns["MODEL"] == gpt
    # Megatron's rank order: tensor ranks innermost (replica r's tensor rank t on device r * 2 + t)
    assert ns["RANK_DEVICES"] == ["gpu0", "gpu1", "gpu2", "gpu3"] and pre.devices == [0, 1, 2, 3]
    # every replica's micro-batches are rows of the global batch: together each row once
    rows = sorted(row + i for _, row, n in ns["INSTANCES"] for i in range(n))
    assert rows == list(range(4))
    assert {r for r, _, _ in ns["INSTANCES"]} == {0, 1}
    assert all(sum(n for r2, _, n in ns["INSTANCES"] if r2 == r) == 2 for r in (0, 1))
    assert ns["SIMULATED_STEP_S"] == pytest.approx(pre.sim["makespan_s"]) and ns["SIMULATED_STEP_S"] > 0
    assert ns["PARAMETER_SHAPES"][:2] == [("wte.weight", (64, 32)), ("wpe.weight", (16, 32))]
    again = export_tp(tmp_path, gpt, 4, tp=2, dp=2)[1]
    assert again == src                                                  # same inputs, same bytes


def test_cli_export_of_a_tp_plan_says_the_torchrun_line_on_stderr(tmp_path, monkeypatch, gpt):
    megatron_plan(tmp_path, gpt, 2, tp=2, sequence_parallel=True)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o",
                                  "out.py"])
    assert r.exit_code == 0, r.output
    assert "placer export: launch it with: torchrun --nproc-per-node 2 out.py" in r.stderr
    assert "a tensor-parallel program" in r.stderr and "sequence parallel" in r.stderr
    src = (tmp_path / "out.py").read_text()
    assert "    torchrun --nproc-per-node 2 out.py\n" in src
    ns = tables(src)
    assert ns["FINGERPRINT"]["graph_file"] == "g.json" and ns["FINGERPRINT"]["cluster"] == "2cpu"
    assert ns["SEQUENCE_PARALLEL"] is True


def test_a_wrong_process_count_or_graph_stops_before_torch_loads(tmp_path, gpt):
    path, _, _, line, _ = export_tp(tmp_path, gpt, 2, tp=2)
    r = python(tmp_path, path)                                   # no torchrun: one process
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"tp.py: started as 1 process(es), but the plan runs 2: launch it with `{line}`"]
    other = tmp_path / "other.json"
    other.write_text((tmp_path / "g.json").read_text() + "\n")                   # other bytes
    r = python(tmp_path, path, "--graph", str(other), env={"WORLD_SIZE": "2", "RANK": "0"})
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "exported for graph" in r.stderr and "other.json has sha256" in r.stderr


def test_a_model_file_that_no_longer_builds_the_graph_stops_before_any_step(tmp_path):
    spec = write_model(tmp_path)
    path, _, _, _, _ = export_tp(tmp_path, spec, 2, tp=2)
    write_model(tmp_path, TINY_GPT.replace("d_model=32", "d_model=48"))        # other layer shapes
    r = python(tmp_path, path, env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        (f"tp.py: {tmp_path / 'tiny_gpt.py'} no longer builds the profiled graph: parameter wte.weight is "
         f"(64, 48) but the graph recorded (64, 32); profile, place and export it again")]


# ----------------------------------------------------------------------- slow
def check_against_reference(prefix: Path, n: int, spec: str) -> float:
    """Every rank's saved loss and whole parameters against the unplaced step (rtol 1e-4, atol 1e-7):
    the largest difference relative to max(|value|, 1e-3) (the updates are 1e-3: Adam's lr)."""
    want_loss, want, init = reference(spec)
    worst = 0.0
    for r in range(n):
        got = torch.load(f"{prefix}.{r}")
        assert got["loss"] == pytest.approx(want_loss, rel=1e-4)
        for name, w in want.items():
            torch.testing.assert_close(got["params"][name], w, rtol=1e-4, atol=1e-7)
            assert not torch.equal(got["params"][name], init[name])            # the step updated it
            worst = max(worst, float(((got["params"][name] - w).abs() / w.abs().clamp_min(1e-3)).max()))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("n,params", [
    (2, {"tp": 2}),
    (2, {"tp": 2, "sequence_parallel": True}),
    (4, {"tp": 2, "dp": 2}),
    (4, {"tp": 2, "dp": 2, "sequence_parallel": True, "recompute": "full", "micro_batch_size": 2}),
])
def test_exported_program_under_torchrun_matches_the_unplaced_step(tmp_path, gpt, n, params):
    path, _, _, _, _ = export_tp(tmp_path, gpt, n, **params)
    r = torchrun(tmp_path, n, path, "--steps", "1", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_against_reference(tmp_path / "out", n, gpt) < 1e-4
    lines = r.stdout.splitlines()
    assert any(ln.startswith("step: measured ") and "(median of 1), simulated " in ln for ln in lines), r.stdout
    assert sum(ln.startswith("loss ") for ln in lines) == 1                 # rank 0 reports


@pytest.mark.slow
def test_torchrun_with_another_process_count_is_refused_before_any_step(tmp_path, gpt):
    path, _, _, line, _ = export_tp(tmp_path, gpt, 2, tp=2)
    r = torchrun(tmp_path, 4, path)
    assert r.returncode != 0 and "loss " not in r.stdout
    assert f"tp.py: started as 4 process(es), but the plan runs 2: launch it with `{line}`" in r.stderr


#: runs the exported program's step once under torch's CommDebugMode and prints, on rank 0, the
#: collectives of the forward (with the update) and of the backward pass by kind (JSON)
COUNT = '''
import json, sys

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

ns = {"__name__": "placed", "__file__": sys.argv[1]}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), ns)
dist.init_process_group("gloo")
model, opt, allreduce, batches, mesh = ns["setup"](ns["build_model"](), torch.device("cpu"))
mode = CommDebugMode()
with mode:
    ns["train_step"](model, opt, allreduce, batches, torch.device("cpu"))
if dist.get_rank() == 0:
    glob = mode.comm_module_counts["Global"]
    print(json.dumps({p: {str(k).rsplit(".", 1)[-1]: v for k, v in glob[p].items()} for p in ("forward", "backward")}))
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True])
def test_the_programs_collectives_are_the_derivations(tmp_path, gpt, sp):
    """Two independent paths to the same plan: the collectives torch's DTensor issues for the program
    (counted by CommDebugMode, one micro-batch) against those the tensor-parallel derivation puts in the
    simulated graph, up to the documented deviations: loss_parallel's cross entropy all-reduces the max,
    the sum of exponentials and the target logit apart (3, the derivation 1); under sequence
    parallelism autograd keeps a column-parallel layer's gathered input for its weight gradient
    (Megatron gathers it again) and a row-parallel bias's gradient comes from the gathered output
    gradient (the derivation all-reduces it before its update)."""
    from collections import Counter

    from celeritas_cli.model.graph import Graph
    from celeritas_cli.transform.tensor_parallel import COL_DW, plan_tensor_parallel

    path, _, _, _, pre = export_tp(tmp_path, gpt, 2, tp=2, sequence_parallel=sp, micro_batch_size=BATCH)
    assert len(pre.instances) == 1
    (tmp_path / "count.py").write_text(COUNT)
    r = torchrun(tmp_path, 2, tmp_path / "count.py", str(path))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    g = Graph.from_dict(step_of(gpt).doc)
    plan = plan_tensor_parallel(g, 2, sp)
    rowwise = {p for p, s, _ in pre.module_plan if s == "rowwise"}
    want: Counter = Counter()
    for c in plan.collectives:
        use = c.consumers[0]
        what = (g.node_extra[use] or {}).get("pass")
        if c.kind == "all-gather" and what == "backward" and plan.role.get(use) == COL_DW:
            continue                                     # gathered again for the weight gradient
        if what == "update" and g.ids[use].removeprefix("adam.").rsplit(".", 1)[0] in rowwise:
            continue                                     # a row-parallel bias's gradient
        want[("backward" if what == "backward" else "forward", c.kind)] += 1
    want[("forward", "all-reduce")] += 2                 # the cross entropy's three statistics, not one
    names = {"all-reduce": "all_reduce", "all-gather": "all_gather_into_tensor",
             "reduce-scatter": "reduce_scatter_tensor"}
    have = Counter({(p, k): got[p].get(names[k], 0) for p in ("forward", "backward") for k in names})
    assert +have == +want
    assert sum(v for k, v in got["backward"].items() if k not in names.values()) == 0     # nothing else
