"""A user's model code goes wrong (issue 24, N05 / N06 / N07): whatever the
factory, ``forward``, ``example_inputs``, ``example_target`` or ``loss``
raises - ``SystemExit``, a ``BaseException`` subclass, ``os._exit`` included -
is one ``Error:`` line naming the hook, the file and the line, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from celeritas_cli.errors import InvalidInput
from celeritas_cli.profile import models

BASE_OK = textwrap.dedent('''\
    import torch
    from torch import nn
    class Net(nn.Module):
        def __init__(self, width=8):
            super().__init__(); self.l = nn.Linear(4, width); self.o = nn.Linear(width, 2)
        def forward(self, x): return self.o(torch.relu(self.l(x)))
        def example_inputs(self, b): return (torch.randn(b, 4),)
    ''')

#: file name -> (source, hook named in the error, what it says, line of the file it names)
CASES = {
    # the reproducers of the bad-input round
    "example_raises.py": ('from base_ok import Net as _N\nclass Net(_N):\n'
                          '    def example_inputs(self, b): raise IndexError("no inputs\\nsecond line")\n',
                          "example_inputs(2) failed", "IndexError: no inputs\\nsecond line", 3),
    "target_raises.py": ('from base_ok import Net as _N\nclass Net(_N):\n'
                         '    def example_target(self, b): raise KeyError("target")\n',
                         "example_target(2) failed", "KeyError: 'target'", 3),
    "factory_raises.py": ('def Net(**kw):\n    raise ValueError("line one\\nline two\\nline three")\n',
                          "building the model failed", "ValueError: line one\\nline two\\nline three", 2),
    "sysexit.py": "def Net(**kw):\n    raise SystemExit(3)\n",
    # and the rest of N05's list
    "loss_raises.py": ('from base_ok import Net as _N\nclass Net(_N):\n'
                       '    def loss(self, out, target): return out.sum() / {}[0]\n',
                       "loss(output, target) failed", "KeyError: 0", 3),
    "forward_raises.py": ('from base_ok import Net as _N\nclass Net(_N):\n'
                          '    def forward(self, x): return [x][2]\n',
                          "forward() failed", "IndexError: list index out of range", 3),
    "base_exception.py": ('from base_ok import Net as _N\nclass Odd(BaseException): pass\nclass Net(_N):\n'
                          '    def example_inputs(self, b): raise Odd("odd")\n',
                          "example_inputs(2) failed", "Odd: odd", 4),
    "import_exits.py": "import sys\nsys.exit('bye')\n",
}
CASES["sysexit.py"] = (CASES["sysexit.py"], "building the model failed", "raised SystemExit(3)", 2)
CASES["import_exits.py"] = (CASES["import_exits.py"], "failed", "raised SystemExit('bye')", 2)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "base_ok.py").write_text(BASE_OK)
    for name, (source, *_rest) in CASES.items():
        (tmp_path / name).write_text(source)
    (tmp_path / "not_iterable.py").write_text('from base_ok import Net as _N\nclass Net(_N):\n'
                                              '    def example_inputs(self, b): return 5\n')
    (tmp_path / "bare_tensor.py").write_text('import torch\nfrom base_ok import Net as _N\nclass Net(_N):\n'
                                             '    def example_inputs(self, b): return torch.randn(b, 4)\n')
    (tmp_path / "osexit.py").write_text("import os\ndef Net(**kw):\n    os._exit(0)\n")
    (tmp_path / "hook_osexit.py").write_text('import os\nfrom base_ok import Net as _N\nclass Net(_N):\n'
                                             '    def example_inputs(self, b): os._exit(7)\n')
    (tmp_path / "module_loss.py").write_text('import torch\nfrom torch import nn\nfrom base_ok import Net as _N\n'
                                             'class Net(_N):\n    def __init__(self):\n'
                                             '        super().__init__(); self.loss = nn.MSELoss()\n'
                                             '    def example_target(self, b): return torch.zeros(b, 2)\n')
    return tmp_path


def _profile(spec: str):
    from click.testing import CliRunner

    from celeritas_cli.cli import main

    return CliRunner().invoke(main, ["profile", "--model", spec, "-b", "2"])


def _one_error_line(res) -> str:
    assert res.exit_code == 1, res.output
    assert res.stdout == "" and "Traceback" not in res.stderr
    last = res.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("Error: --model "), res.stderr
    return last


@pytest.mark.parametrize("name", sorted(CASES))
def test_user_code_errors_are_one_line_with_file_and_line(model_dir, name):
    pytest.importorskip("torch")
    _, hook, says, line = CASES[name]
    spec = f"{model_dir / name}:Net"
    last = _one_error_line(_profile(spec))
    assert f"Error: --model {spec}: " in last and f"{hook}: {says} ({model_dir / name}:{line})" in last, last


def test_example_inputs_must_be_a_tuple_or_list(model_dir):
    pytest.importorskip("torch")
    last = _one_error_line(_profile(f"{model_dir / 'not_iterable.py'}:Net"))
    assert last.endswith("example_inputs(2) returned int, expected a tuple or list of the forward arguments, e.g. (x,)")
    last = _one_error_line(_profile(f"{model_dir / 'bare_tensor.py'}:Net"))
    assert "example_inputs(2) returned a Tensor, expected a tuple or list" in last


def test_a_module_loss_and_a_good_model_still_profile(model_dir):
    pytest.importorskip("torch")
    for name in ("module_loss.py", "base_ok.py"):
        res = _profile(f"{model_dir / name}:Net")
        assert res.exit_code == 0, res.output


def test_guarded_hooks_trace_the_same_graph(model_dir):
    """Cross-check: the guard is transparent - the graph of a guarded user model equals the graph of
    the same class traced directly, node for node."""
    pytest.importorskip("torch")
    from celeritas_cli.profile.capture import build_meta, profile_model, trace_step, trace_to_doc

    doc = profile_model(f"{model_dir / 'base_ok.py'}:Net", 4)
    factory, _ = models.resolve_model(f"{model_dir / 'base_ok.py'}:Net")
    cls = type(factory())
    direct = trace_to_doc(trace_step(build_meta(cls), 4), name=doc["name"], meta=doc["meta"])
    assert direct["nodes"] == doc["nodes"] and direct["edges"] == doc["edges"]


@pytest.mark.parametrize("name,hook,code", [("osexit.py", "building the model failed", 0),
                                            pytest.param("hook_osexit.py", "example_inputs(2) failed", 7,
                                                         marks=pytest.mark.slow)])  # the same guard, in a hook
def test_os_exit_in_user_code_is_an_error_not_an_exit(model_dir, name, hook, code):
    """os._exit cannot be caught by an except: a real process shows that the guard turns it into the
    error line and exit 1 (it exited 0 with empty stdout before)."""
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "celeritas_cli", "profile", "--model", f"{model_dir / name}:Net",
                        "-b", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stdout == "", p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith(f"{hook}: called os._exit({code}) ({model_dir / name}:"
                                                      f"{3 if name == 'osexit.py' else 4})")


def test_exit_guard_is_scoped_to_the_guarded_thread_and_restored(monkeypatch):
    """Inside the guard only the guarded thread's os._exit raises; another thread (or a forked child)
    exits for real; after the guard os._exit is what it was again."""
    exits = []

    def fake_exit(status):  # stands for the real one: nothing here may end pytest
        exits.append(status)

    monkeypatch.setattr(os, "_exit", fake_exit)
    with models._exit_guard():
        assert os._exit is models._guarded_exit
        worker = threading.Thread(target=os._exit, args=(5,))
        worker.start()
        worker.join()
        with pytest.raises(models._Exited):
            os._exit(6)
        with models._exit_guard():  # nested guards (a hook called while the model is built)
            pass
        assert os._exit is models._guarded_exit
    assert exits == [5]
    assert os._exit is fake_exit


def test_user_code_passes_placer_errors_and_ctrl_c_through():
    with pytest.raises(InvalidInput, match="^mine$"):
        with models.user_code("m.py:Net", "building"):
            raise InvalidInput("mine")
    with pytest.raises(KeyboardInterrupt):
        with models.user_code("m.py:Net", "building"):
            raise KeyboardInterrupt
    kept = r"^--model m.py:Net: building: RuntimeError: x{500}\.\.\. \(.*test_user_hooks.py:\d+\)$"
    with pytest.raises(InvalidInput, match=kept):
        with models.user_code("m.py:Net", "building"):
            raise RuntimeError("x" * 10_000)  # a message is kept to 500 characters
