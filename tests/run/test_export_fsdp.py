"""``placer export`` of fsdp plans (celeritas_cli/run/fsdp_export.py): one program on a DeviceMesh
launched with torchrun, FSDP2 ``fully_shard`` per unit (stages 2-3), DDP with
ZeroRedundancyOptimizer (stage 1); a data-parallel plan as the same program with DDP ("stage 0").

The default suite checks the written program (it compiles, its tables, the torchrun line in its
docstring and on stderr, the refusals); the slow tests launch it with ``torchrun`` (gloo, CPU) and
compare its step with the unplaced one, computed here by hand in eager PyTorch."""

from __future__ import annotations

import os
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
from celeritas_cli.profile.models import resolve_model  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.export import fingerprint, torchrun_line  # noqa: E402
from celeritas_cli.run.export_plan import export_program  # noqa: E402
from celeritas_cli.run.fsdp_export import param_readers, unit_modules  # noqa: E402
from celeritas_cli.run.step import capture_real  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT / 'examples' / 'tiny_mlp.py'}:TinyMLP"
CFG = {"width": 16}
#: a language model whose output projection is its embedding's weight, read by the root's forward
#: (GPT's tied wte): FSDP2 cannot reshard it with its own module, so the root's group holds it
TIED_LM = '''
import torch
import torch.nn.functional as F
from torch import nn


class TiedLM(nn.Module):
    def __init__(self, width=16, vocab=11):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(2)])
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        h = self.wte(idx)
        for block in self.blocks:
            h = h + block(h)
        return F.linear(self.ln_f(h), self.wte.weight)

    def example_inputs(self, batch):
        return (torch.randint(0, self.vocab, (batch, 6)),)

    def example_target(self, batch):
        return torch.randint(0, self.vocab, (batch, 6))

    def loss(self, out, target):
        return F.cross_entropy(out.reshape(-1, self.vocab), target.reshape(-1))
'''


def tied_lm(tmp_path) -> str:
    (tmp_path / "tied_lm.py").write_text(TIED_LM)
    return f"{tmp_path / 'tied_lm.py'}:TiedLM"
_STEPS: dict = {}


def step_of(spec: str, batch: int):
    key = (spec, batch)
    if key not in _STEPS:
        _STEPS[key] = capture_real(spec, batch, config=CFG)
    return _STEPS[key]


def export_fsdp(tmp_path, stage: int, *, k: int = 2, batch: int = 4, spec: str = MLP, name: str = "fsdp.py",
                **params) -> tuple[Path, str, str]:
    """Profile *spec* (graph g.json), place it with fsdp at *stage* (0: data-parallel) on k CPU
    devices (c.json), export it to tmp_path/name: ``(path, source, torchrun line)``."""
    step = step_of(spec, batch)
    write_json(step.doc, str(tmp_path / "g.json"))
    cluster = uniform(k, dtype="cpu", name=f"{k}cpu")
    write_json(cluster.to_dict(), str(tmp_path / "c.json"))
    graph = Graph.from_dict(step.doc)
    placement = (registry.place(graph, cluster, "fsdp", params={"stage": stage, **params}) if stage else
                 registry.place(graph, cluster, "data-parallel", params=params))
    pre = api.prepare(spec, batch, placement, cluster, label="p.json", config=CFG, graph=graph,
                      graph_label=str(tmp_path / "g.json"), step=step)
    fp = fingerprint(graph=pre.sim_graph.name, graph_path=str(tmp_path / "g.json"), cluster=cluster, spec=spec)
    path = tmp_path / name
    src, what, line = export_program(pre, cluster, label="p.json", algorithm=placement.algorithm, fingerprint=fp,
                                     path=str(path))
    assert (f"ZeRO stage {stage}" if stage else "DistributedDataParallel program") in what
    path.write_text(src)
    return path, src, line


def tables(src: str) -> dict:
    """The generated module's top-level names, run without its main (nothing is launched)."""
    ns: dict = {"__name__": "placed_tables", "__file__": "fsdp.py"}
    exec(compile(src, "fsdp.py", "exec"), ns)
    return ns


# ----------------------------------------------------------------------- fast
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_is_written_as_its_torch_mapping(tmp_path, stage):
    path, src, line = export_fsdp(tmp_path, stage)
    ns = tables(src)
    assert line == f"torchrun --nproc-per-node 2 {path}" and f"    {line}\n" in src.split('"""')[1]
    assert (ns["STAGE"], ns["PROCESSES"], ns["GLOBAL_BATCH"], ns["MODEL"], ns["CONFIG"]) == (stage, 2, 4, MLP, CFG)
    assert ns["RESHARD_AFTER_FORWARD"] is (stage == 3)
    # the module policy gives one unit per top-level Linear of TinyMLP; DDP (stages 0, 1) has none
    assert ns["UNITS"] == ([] if stage <= 1 else [("l1", ["l1"]), ("l2", ["l2"]), ("l3", ["l3"])])
    assert ("ZeroRedundancyOptimizer(net.parameters()" in src) and ("fully_shard(mods" in src)
    doc = src.split('"""')[1]
    assert {0: "Data parallelism: DistributedDataParallel", 1: "ZeRO-1", 2: "SHARD_GRAD_OP",
            3: "FULL_SHARD"}[stage] in doc
    assert doc.startswith(f"{'Data-parallel' if stage == 0 else f'ZeRO stage {stage}'} plan of tinymlp_b4 ")
    assert ns["PARAMETER_SHAPES"] == [("l1.weight", (16, 32)), ("l1.bias", (16,)), ("l2.weight", (16, 16)),
                                      ("l2.bias", (16,)), ("l3.weight", (10, 16)), ("l3.bias", (10,))]
    assert ns["SIMULATED_STEP_S"] > 0
    again = export_fsdp(tmp_path, stage, name="fsdp.py")[1]
    assert again == src                                                   # same inputs, same bytes


def test_cli_export_of_an_fsdp_plan_says_the_torchrun_line_on_stderr(tmp_path, monkeypatch):
    step = step_of(MLP, 4)
    write_json(step.doc, str(tmp_path / "g.json"))
    cluster = uniform(2, dtype="cpu", name="2cpu")
    write_json(cluster.to_dict(), str(tmp_path / "c.json"))
    p = registry.place(Graph.from_dict(step.doc), cluster, "fsdp", params={"stage": 3})
    write_json(p.to_dict(), str(tmp_path / "p.json"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["export", "--graph", "g.json", "-P", "p.json", "--cluster", "c.json", "-o",
                                  "out.py"])
    assert r.exit_code == 0, r.output
    assert "placer export: launch it with: torchrun --nproc-per-node 2 out.py" in r.stderr
    src = (tmp_path / "out.py").read_text()
    assert "    torchrun --nproc-per-node 2 out.py\n" in src
    ns = tables(src)
    assert ns["FINGERPRINT"]["graph_file"] == "g.json" and ns["FINGERPRINT"]["cluster"] == "2cpu"
    assert ns["FINGERPRINT"]["model_file"] == str(ROOT / "examples" / "tiny_mlp.py")


def test_size_policy_units_of_several_modules_are_one_fully_shard_group(tmp_path):
    # unit_mb = 2500 bytes: l1 (2112 bytes) is under it, l1 + l2 (3200) reach it, l3 is the next unit
    _, src, _ = export_fsdp(tmp_path, 3, unit_mb=2500 / 2**20)
    assert tables(src)["UNITS"] == [("unit0", ["l1", "l2"]), ("unit1", ["l3"])]


def test_unit_modules_takes_the_largest_whole_modules_and_leaves_a_weight_read_outside_to_the_root():
    nn = torch.nn

    class Tied(nn.Module):
        """emb.weight is read by emb, by head (the same Parameter) and, with *root_reads*, by the root."""

        def __init__(self, root_reads=False):
            super().__init__()
            self.root_reads = root_reads
            self.emb = nn.Embedding(5, 3)
            self.body = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            h = self.body(self.emb(x))
            return nn.functional.linear(h, self.emb.weight) if self.root_reads else self.head(h)

        def example_inputs(self, b):
            return (torch.zeros(b, 2, dtype=torch.long),)

    with torch.device("meta"):
        m, r = Tied(), Tied(root_reads=True)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["emb.weight", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"]
    units = [("emb", ["emb.weight"]), ("body", names[1:])]
    reads = param_readers(m, 2)
    assert reads == {"emb.weight": {"emb", "head"}, "body.0.weight": {"body.0"}, "body.0.bias": {"body.0"},
                     "body.1.weight": {"body.1"}, "body.1.bias": {"body.1"}}
    # head holds only the tied weight: emb and head are one group, which reads it alone
    assert unit_modules(m, units, reads) == ([("emb", ["emb", "head"]), ("body", ["body"])], [])
    # the root reads it (GPT's tied output projection): the root's group holds it
    assert param_readers(r, 2)["emb.weight"] == {"emb", ""}
    assert unit_modules(r, units, param_readers(r, 2)) == ([("emb", []), ("body", ["body"])], ["emb.weight"])
    # a unit cut inside a module (body.0's weight and bias apart): the root's group holds the cut parameters
    got = unit_modules(m, [("w", ["body.0.weight"]), ("rest", names[2:])], reads)
    assert got == ([("w", []), ("rest", ["body.1"])], ["body.0.weight", "body.0.bias"])


def test_a_tied_weight_the_root_reads_is_left_to_the_root_group(tmp_path):
    _, src, _ = export_fsdp(tmp_path, 3, spec=tied_lm(tmp_path))
    ns = tables(src)
    assert ns["UNITS"] == [("wte", []), ("blocks.0", ["blocks.0"]), ("blocks.1", ["blocks.1"]), ("ln_f", ["ln_f"])]
    assert ns["IN_ROOT"] == ["wte.weight"]


def test_torchrun_line_quotes_the_path():
    assert torchrun_line(2, "my dir/p.py") == "torchrun --nproc-per-node 2 'my dir/p.py'"


# ----------------------------------------------------------------------- slow
def reference(spec: str, k: int, batch: int, replicas=None) -> tuple[float, dict, dict]:
    """The unplaced step of the plan, by hand: the model built as the profile built it, each of the
    k replicas' losses on its rows, the gradients averaged, one torch.optim.Adam step.  Returns
    (mean loss, updated parameters, initial parameters).  *replicas*: those whose gradients count
    (all by default; the test that the comparison can fail leaves some out)."""
    factory, _ = resolve_model(spec, CFG)
    torch.manual_seed(0)
    model = factory()
    torch.manual_seed(1)
    xs, y = model.example_inputs(batch), model.example_target(batch)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    b = batch // k
    grads: dict = {}
    losses = []
    for r in range(k):
        model.zero_grad()
        loss = model.loss(model(*(x[r * b:(r + 1) * b] for x in xs)), y[r * b:(r + 1) * b])
        loss.backward()
        losses.append(float(loss.detach()))
        for n, p in model.named_parameters():
            if replicas is None or r in replicas:
                grads[n] = grads.get(n, 0) + p.grad / k
    for n, p in model.named_parameters():
        p.grad = grads[n]
    torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False).step()
    return sum(losses) / k, {n: p.detach().clone() for n, p in model.named_parameters()}, init


def torchrun(tmp_path, nproc: int, program: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
             **(env or {}))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(program),
           *args]
    return subprocess.run(cmd, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)


def check_against_reference(tmp_path, k: int, batch: int, prefix: Path, spec: str = MLP) -> None:
    want_loss, want, init = reference(spec, k, batch)
    for r in range(k):
        got = torch.load(f"{prefix}.{r}")
        assert got["loss"] == pytest.approx(want_loss, rel=1e-4)
        for n, w in want.items():
            torch.testing.assert_close(got["params"][n], w, rtol=1e-4, atol=1e-7)
            assert not torch.equal(got["params"][n], init[n])                # the step updated it


@pytest.mark.slow
@pytest.mark.parametrize("stage,params", [(0, {}), (1, {}), (2, {}), (3, {}), (2, {"unit_mb": 2500 / 2**20})])
def test_exported_program_under_torchrun_matches_the_unplaced_step(tmp_path, stage, params):
    path, _, _ = export_fsdp(tmp_path, stage, **params)
    r = torchrun(tmp_path, 2, path, "--steps", "2", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    check_against_reference(tmp_path, 2, 4, tmp_path / "out")
    lines = r.stdout.splitlines()
    assert any(ln.startswith("step: measured ") and "(median of 2), simulated " in ln for ln in lines), r.stdout
    assert sum(ln.startswith("loss ") for ln in lines) == 1                 # rank 0 reports


@pytest.mark.slow
def test_exported_program_with_a_tied_weight_in_the_root_group_matches(tmp_path):
    spec = tied_lm(tmp_path)
    path, _, _ = export_fsdp(tmp_path, 3, spec=spec)
    r = torchrun(tmp_path, 2, path, "--steps", "1", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    check_against_reference(tmp_path, 2, 4, tmp_path / "out", spec=spec)


@pytest.mark.slow
def test_exported_stage3_program_on_four_processes_matches(tmp_path):
    path, src, line = export_fsdp(tmp_path, 3, k=4, batch=8)
    assert line.startswith("torchrun --nproc-per-node 4 ")
    r = torchrun(tmp_path, 4, path, "--steps", "1", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    check_against_reference(tmp_path, 4, 8, tmp_path / "out")


def test_the_comparison_can_fail_a_gradient_not_reduced_over_the_replicas():
    """The yardstick is not blind: rank 0's gradient alone (no reduction) gives other parameters."""
    _, want, _ = reference(MLP, 2, 4)
    _, alone, _ = reference(MLP, 2, 4, replicas={0})
    assert any(not torch.allclose(alone[n], want[n], rtol=1e-4, atol=1e-7) for n in want)
