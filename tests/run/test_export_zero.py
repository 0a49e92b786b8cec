"""ZeRO over the replicas of exported and run plans (issue 36): a data-parallel step with ``zero`` 1 or 2
(``--algo megatron -p use_distributed_optimizer=true``, ``--algo pipeline -p zero=1|2``) runs Megatron-LM's
distributed optimizer - every gradient reduce-scattered over mesh["dp"], Adam on the rank's shard, the
shards all-gathered (``ZeroAdam``, celeritas_cli/run/tp_export.py) - in the TP, TP x PP and pipeline x DP
programs, and ``placer run`` of such plans runs those programs' ranks.

The default suite checks ZeroAdam itself against torch.optim.Adam on the summed gradient (two ranks as two
threads over a stand-in for torch.distributed), the programs' tables and text, the pipeline's
replicated-Adam twin and the refusals that remain; the slow tests launch the TP x DP and pipeline x DP
programs with torchrun (4 processes each, gloo, CPU) and ``placer run`` them, against the unplaced step
(rtol 1e-4)."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.model.cluster import uniform  # noqa: E402
from celeritas_cli.model.graph import Graph  # noqa: E402
from celeritas_cli.pipelining.builder import staged_plan  # noqa: E402
from celeritas_cli.pipelining.cuts import forward_order, stages_from_cuts  # noqa: E402
from celeritas_cli.run import api  # noqa: E402
from celeritas_cli.run.derived_export import export_derived  # noqa: E402
from celeritas_cli.run.plan import without_zero  # noqa: E402
from celeritas_cli.run.tp_export import ZERO_SOURCE  # noqa: E402
from celeritas_cli.sim.simulator import simulate  # noqa: E402

from .test_export_pipeline_torchrun import DEEP, load, matches_unplaced  # noqa: E402
from .test_export_pipeline_torchrun import step_of as pipe_step_of  # noqa: E402
from .test_export_pipeline_torchrun import torchrun as pipe_torchrun  # noqa: E402
from .test_export_tp import (check_against_reference, export_tp, prepared, reference, tables,  # noqa: E402
                             torchrun, write_model)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> str:
    """The spec of test_export_tp's TinyGPT (tied head, no QKV bias, no dropout), written once per module."""
    return write_model(tmp_path_factory.mktemp("tiny_gpt"))


# ----------------------------------------------------------------------- fast: ZeroAdam itself
class _Done:
    def wait(self):
        return None


class ThreadRanks:
    """A stand-in for torch.distributed: *n* ranks as *n* threads; a collective's inputs meet at a
    barrier (the real collectives' semantics: reduce-scatter sums in rank order, all-gather
    concatenates)."""

    def __init__(self, n: int):
        self.n, self.barrier, self.slots, self.me = n, threading.Barrier(n), {}, threading.local()
        self.calls: list[tuple[int, str, int]] = []

    def get_world_size(self, group=None):
        return self.n

    def get_rank(self, group=None):
        return self.me.rank

    def _meet(self, t):
        self.slots[self.me.rank] = t.clone()
        self.barrier.wait()
        got = [self.slots[r] for r in range(self.n)]
        self.barrier.wait()
        return got

    def reduce_scatter_single(self, out, inp, group=None, async_op=False):
        self.calls.append((self.me.rank, "reduce-scatter", inp.numel()))
        got = self._meet(inp)
        total = got[0].clone()
        for g in got[1:]:
            total += g
        per = out.numel()
        out.copy_(total[self.me.rank * per:(self.me.rank + 1) * per])
        return _Done()

    def all_gather_single(self, out, inp, group=None, async_op=False):
        self.calls.append((self.me.rank, "all-gather", out.numel()))
        out.copy_(torch.cat(self._meet(inp)))
        return _Done()


def zero_adam(fake):
    ns = {"torch": torch, "dist": fake}
    exec(compile(ZERO_SOURCE, "zero.py", "exec"), ns)     # noqa: S102 - placer's own program text
    return ns["ZeroAdam"]


def test_zero_adam_is_adam_on_the_summed_gradient_bit_for_bit():
    """Two replicas with different gradients, parameters of 15 and 5 elements (padded to 16 and 6), two
    steps: each rank's parameters equal torch.optim.Adam's on the sum of the two gradients, exactly (Adam
    is element-wise; both sum g0 + g1), and each rank's moments hold its half only."""
    torch.manual_seed(0)
    init = [torch.randn(5, 3), torch.randn(5)]
    grads = [[[torch.randn_like(p) for p in init] for _ in range(2)] for _ in range(2)]   # step, rank, param
    ref = [torch.nn.Parameter(p.clone()) for p in init]
    adam = torch.optim.Adam(ref, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    for g in grads:
        for q, a, b in zip(ref, g[0], g[1]):
            q.grad = a + b
        adam.step()
    fake = ThreadRanks(2)
    cls = zero_adam(fake)
    out, errors = {}, []

    def rank(r):
        try:
            fake.me.rank = r
            params = [torch.nn.Parameter(p.clone()) for p in init]
            opt = cls(params, None, 1e-3, (0.9, 0.999), 1e-8)
            for g in grads:
                opt.zero_grad()
                for q, x in zip(params, g[r]):
                    q.grad = x.clone()
                opt.step()
            out[r] = (params, [tuple(opt.opt.state[s]["exp_avg"].shape) for s in opt.shards])
        except Exception as exc:            # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            fake.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for r in range(2):
        params, moments = out[r]
        for got, want, before in zip(params, ref, init):
            assert torch.equal(got.detach(), want.detach()) and not torch.equal(got.detach(), before)
        assert moments == [(8,), (3,)]                  # ceil(15 / 2), ceil(5 / 2): this rank's shard only
    # per step and rank: one reduce-scatter of each padded gradient, then one all-gather of each parameter
    mine = [(kind, n) for r, kind, n in fake.calls if r == 0]
    assert mine == [("reduce-scatter", 16), ("reduce-scatter", 6), ("all-gather", 16), ("all-gather", 6)] * 2


# ----------------------------------------------------------------------- fast: the programs
def test_a_tp_x_dp_plan_with_the_distributed_optimizer_writes_the_sharded_step(tmp_path, gpt):
    path, src, what, line, pre = export_tp(tmp_path, gpt, 4, tp=2, dp=2, use_distributed_optimizer=True)
    dpst = next(s for s in pre.recipe if s["transform"] == "data-parallel")
    assert dpst["zero"] == 1 and pre.zero == 1
    ns = tables(src)
    assert (ns["ZERO"], ns["DP"], ns["TP"]) == (1, 2, 2) and "ZeroAdam" in ns
    assert "ZeRO-1 over the replicas (Adam sharded)" in what and line == f"torchrun --nproc-per-node 4 {path}"
    doc = " ".join(src.split('"""')[1].split())
    assert "ZeRO stage 1 (Megatron-LM's distributed optimizer): instead of the all-reduce, each gradient is " \
           "reduce-scattered over \"dp\"" in doc and "Stages 1 and 2 run this same program" in doc
    # the replicas' all-reduce is not armed under ZeRO: the optimizer reduce-scatters
    assert 'GradAllReduce(model, mesh["dp"]) if DP > 1 and not ZERO else None' in src
    assert 'opt = ZeroAdam(model.parameters(), mesh["dp"].get_group(), LR, BETAS, EPS)' in src
    plain = tables(export_tp(tmp_path, gpt, 4, name="plain.py", tp=2, dp=2)[1])
    assert plain["ZERO"] == 0 and plain["TP_PLAN"] == ns["TP_PLAN"] and plain["INSTANCES"] == ns["INSTANCES"]


def test_a_tp_x_pp_x_dp_plan_with_the_distributed_optimizer_is_no_longer_refused(tmp_path, gpt):
    """tp 2 x pp 2 x dp 2 (8 processes: not launched in the suite): the 3-D program carries ZERO and runs
    ZeroAdam over mesh["dp"] after the tied embedding's sum over its pipeline ranks."""
    _, src, what, _, pre = export_tp(tmp_path, gpt, 8, name="tp3d.py", tp=2, pp=2, dp=2, micro_batch_size=1,
                                     use_distributed_optimizer=True)
    assert (pre.pp, pre.dp, pre.zero) == (2, 2, 1) and "ZeRO-1 over the replicas" in what
    ns = tables(src)
    assert (ns["ZERO"], ns["DP"], ns["PP"], ns["TP"]) == (1, 2, 2, 2) and "ZeroAdam" in ns
    assert "if DP > 1 and not ZERO:" in src and 'opt = ZeroAdam(params, mesh["dp"].get_group(), LR, BETAS, EPS)' in src
    step = src[src.index("def train_step(job, device):"):src.index("def full_parameters")]
    assert step.index('dist.all_reduce(local(p.grad), group=job["shared"][n])') < step.index("opt.step()")


def zero_pipeline(zero: int, recompute: tuple = ()):
    """Deep (four Linear(8, 8)) cut before l2 into 2 stages, x 2 replicas on 4 CPUs, 2 micro-batches of 4
    (1F1B), ZeRO stage *zero* over the replicas, *recompute* the forward nodes recomputed:
    ``(placement, cluster)``."""
    g = Graph.from_dict(pipe_step_of(8, DEEP).doc)
    fwd = forward_order(g, list(range(g.n)))
    head = [u for u in fwd if g.ids[u].startswith("addmm")][2]
    c = uniform(4, dtype="cpu", name="4cpu")
    return staged_plan(g, c, stages_from_cuts(g, fwd, [0, fwd.index(head)]), [[0, 1], [2, 3]], 2, "1f1b",
                       zero=zero, recompute=recompute), c


def test_a_pipeline_with_zero_exports_the_pipelining_program_with_the_sharded_optimizer(tmp_path):
    p, c = zero_pipeline(1)
    assert p.derivation["steps"][-1]["zero"] == 1
    pre = api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP))
    assert pre.zero == 1
    # the simulated step is the zero plan's (reduce-scatter + all-gather), not the twin's (all-reduce)
    assert pre.sim["makespan_s"] == simulate(Graph.from_dict(pipe_step_of(8, DEEP).doc), c, p)["makespan_s"]
    src, what = export_derived(pre, c, label="p.json", algorithm="pipeline", program="pp.py")
    assert what == ("a torch.distributed.pipelining program (1f1b, 2 stages split at l2, 2 micro-batches, x 2 "
                    "replicas, ZeRO-1 over them (Adam sharded) on a 2 x 2 (dp, pp) DeviceMesh; torchrun "
                    "--nproc-per-node 4 pp.py)")
    mod = load(src, tmp_path, "pp_zero")
    assert (mod.ZERO, mod.DP, mod.PP) == (1, 2, 2) and hasattr(mod, "ZeroAdam")
    assert "if DP > 1 and not ZERO:" in src and "opt = ZeroAdam(params, dp_group, LR, BETAS, EPS)" in src
    doc = " ".join(mod.__doc__.split())
    assert "ZeRO stage 1 (Megatron-LM's distributed optimizer): no all_reduce;" in doc
    # the same plan without ZeRO: the same program but for ZERO (and the simulated step)
    q, _ = zero_pipeline(0)
    plain = api.prepare(DEEP, 8, q, c, label="p.json", step=pipe_step_of(8, DEEP))
    other, _ = export_derived(plain, c, label="p.json", algorithm="pipeline", program="pp.py")
    mod0 = load(other, tmp_path, "pp_plain")
    assert plain.zero == 0 and mod0.ZERO == 0 and (mod0.ROWS, mod0.SPLIT_SPEC) == (mod.ROWS, mod.SPLIT_SPEC)


def test_the_megatron_row_without_tensor_parallelism_exports_its_distributed_optimizer(tmp_path):
    """megatron tp=1 pp=2 dp=2 with use_distributed_optimizer: a pipeline x DP recipe (no tensor-parallel
    step), exported as the pipelining program with ZERO = 1."""
    from celeritas_cli import registry

    g = Graph.from_dict(pipe_step_of(8, DEEP).doc)
    c = uniform(4, dtype="cpu", name="4cpu")
    p = registry.place(g, c, "megatron", params={"tp": 1, "pp": 2, "dp": 2, "use_distributed_optimizer": True})
    assert [s["transform"] for s in p.derivation["steps"]] == ["microbatch", "data-parallel"]
    pre = api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP))
    src, what = export_derived(pre, c, label="p.json", algorithm="megatron", program="pp.py")
    assert pre.zero == 1 and "x 2 replicas, ZeRO-1 over them (Adam sharded) on a 2 x 2 (dp, pp)" in what
    assert load(src, tmp_path, "meg_zero").ZERO == 1


def test_the_twin_of_a_zero_pipeline_has_its_all_reduces_where_the_reduce_scatters_were():
    p, _ = zero_pipeline(2)
    twin, zero = without_zero(p)
    assert zero == 2 and "zero" not in twin.derivation["steps"][-1] and p.derivation["steps"][-1]["zero"] == 2
    rs = sorted(n for n in p.assignment if "/rs/" in n)
    assert rs and not any("/rs/" in n or "/ag/" in n for n in twin.assignment)
    for n in rs:
        assert twin.assignment[n.replace("/rs/", "/")] == p.assignment[n]
    assert set(twin.assignment) - {n.replace("/rs/", "/") for n in rs} == \
        {n for n in p.assignment if "/rs/" not in n and "/ag/" not in n}
    assert without_zero(zero_pipeline(0)[0])[1] == 0


def test_refusals_that_remain_say_why_in_one_line(tmp_path, gpt):
    # a zero pipeline torch.distributed.pipelining cannot run (recomputation: no pipelining schedule expresses
    # it): placer's own code keeps Adam replicated, so export refuses it
    p, c = zero_pipeline(1, recompute=("relu",))
    pre = api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP))
    with pytest.raises(InvalidInput, match=r"^p.json: its replicas shard the optimizer \(zero=1\), which placer "
                                           r"exports as a torch.distributed.pipelining program only") as e:
        export_derived(pre, c, label="p.json", algorithm="pipeline")
    assert "\n" not in str(e.value) and "the recipe is microbatch + recompute + data-parallel" in str(e.value)
    with pytest.raises(InvalidInput, match=r"^p.json: its replicas shard the optimizer \(zero=1\), which placer runs "
                                           r"in the torch.distributed.pipelining program only, and that cannot run"):
        api.run_placement(DEEP, 8, p, c, label="p.json", backend="gloo", prepared=pre)
    # placer run of a zero pipeline in one process (placer's own executor): refused, before anything runs
    p, c = zero_pipeline(1)
    with pytest.raises(InvalidInput, match=r"^p.json: a pipeline whose replicas shard the optimizer \(zero=1\) "
                                           r"runs with --backend gloo"):
        api.run_placement(DEEP, 8, p, c, label="p.json", backend="local",
                          prepared=api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP)))
    # a tensor-parallel data-parallel step with a ZeRO stage the programs do not run
    from celeritas_cli.run.tp_run import prepare_tp

    _, _, placement = prepared(tmp_path, gpt, 4, tp=2, dp=2)
    recipe = [dict(s) for s in placement.derivation["steps"]]
    recipe[-1]["zero"] = 3
    with pytest.raises(InvalidInput, match=r"^p.json: its data-parallel step has zero=3; the programs run ZeRO "
                                           r"stage 1 or 2"):
        prepare_tp(gpt, 4, placement, uniform(4, dtype="cpu"), recipe, label="p.json", config=None)


# ----------------------------------------------------------------------- slow
@pytest.mark.slow
def test_tp_x_dp_with_the_distributed_optimizer_under_torchrun_matches_the_unplaced_step(tmp_path, gpt):
    path, _, _, _, _ = export_tp(tmp_path, gpt, 4, tp=2, dp=2, use_distributed_optimizer=True)
    r = torchrun(tmp_path, 4, path, "--steps", "1", env={"PLACER_EXPORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_against_reference(tmp_path / "out", 4, gpt) < 1e-4
    assert sum(ln.startswith("loss ") for ln in r.stdout.splitlines()) == 1


@pytest.mark.slow
def test_pipeline_x_dp_with_zero_under_torchrun_matches_the_unplaced_step(tmp_path):
    p, c = zero_pipeline(1)
    pre = api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP))
    src, _ = export_derived(pre, c, label="p.json", algorithm="pipeline", program="pp.py")
    (tmp_path / "pp.py").write_text(src)
    r = pipe_torchrun(tmp_path / "pp.py", 4, tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    matches_unplaced(tmp_path / "out", 4, spec=DEEP)


@pytest.mark.slow
def test_placer_run_of_a_pipeline_with_zero_matches_the_unplaced_step():
    p, c = zero_pipeline(2)
    pre = api.prepare(DEEP, 8, p, c, label="p.json", step=pipe_step_of(8, DEEP))
    report = api.run_placement(DEEP, 8, p, c, label="p.json", backend="gloo", steps=1, warmup=1, prepared=pre)
    assert report["match"], report["notes"]
    assert report["processes"] == 4 and report["plan"] == "micro-batched"
    assert report["pipelining"] == {**report["pipelining"], "dp": 2, "pp": 2, "zero": 2, "micro_batches": 2}
    assert report["pipelining"]["params_max_rel_diff"] < 1e-4 and report["params_compared"] == 8
    assert report["simulated_step_s"] == pytest.approx(pre.sim["makespan_s"])


@pytest.mark.slow
def test_placer_run_of_tp_x_dp_with_the_distributed_optimizer_matches(tmp_path, gpt):
    pre, cluster, placement = prepared(tmp_path, gpt, 4, tp=2, dp=2, use_distributed_optimizer=True)
    report = api.run_placement(gpt, 4, placement, cluster, label="p.json", backend="gloo", steps=1, warmup=1,
                               prepared=pre)
    assert report["match"], report["notes"]
    tpd = report["tensor_parallel"]
    assert (tpd["tp"], tpd["dp"], tpd["zero"]) == (2, 2, 1) and tpd["params_max_rel_diff"] < 1e-4
    assert report["params_compared"] == len(reference(gpt)[1])
    assert any("ZeRO stage 1 over the replicas" in n for n in report["notes"])
