"""`--model` specs: zoo names, module:attr, path/to/file.py:attr (skipped without torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import orjson
import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from celeritas_cli.cli import main  # noqa: E402
from celeritas_cli.errors import InvalidInput  # noqa: E402
from celeritas_cli.profile.models import resolve_model  # noqa: E402

from ..conftest import ROOT  # noqa: E402

NOISY = textwrap.dedent('''
    import torch
    from torch import nn
    from helper_layer import make_layer   # a sibling module: the file's directory is on the path

    print("building the model")            # user code printing: must not reach stdout


    class Noisy(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            print("in __init__")
            self.l = make_layer(width)

        def forward(self, x):
            print("in forward")
            return self.l(x)

        def example_inputs(self, b):
            return (torch.randn(b, 4),)


    def broken():
        raise ValueError("no such layer")
    ''')


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "models dir"
    d.mkdir()
    (d / "noisy_model.py").write_text(NOISY)
    (d / "helper_layer.py").write_text("from torch import nn\n\ndef make_layer(w):\n    return nn.Linear(4, w)\n")
    return d


def test_resolve_file_path_spec(model_dir):
    factory, name = resolve_model(f"{model_dir}/noisy_model.py:Noisy", {"width": 3})
    assert name == "noisy" and factory().l.out_features == 3


def test_resolve_errors_are_one_line(model_dir, tmp_path):
    for spec, match in [(f"{tmp_path}/missing.py:Net", "no such file"),
                        (f"{model_dir}/noisy_model.py:Nope", "has no attribute 'Nope'"),
                        ("noisy_model.py", "a file needs :attr"),
                        ("no_such_module_xyz:Net", "cannot import module 'no_such_module_xyz'"),
                        ("nosuchzoo", "unknown model")]:
        with pytest.raises(InvalidInput, match=match) as info:
            resolve_model(spec)
        assert "\n" not in str(info.value)
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(InvalidInput, match=r"RuntimeError: boom \(.*bad\.py:2\)"):
        resolve_model(f"{bad}:x")


def test_profile_file_model_prints_go_to_stderr(model_dir, tmp_path):
    """A model printing while it is built and traced leaves stdout to the JSON
    document (a real subprocess: the redirection is at file-descriptor level)."""
    p = subprocess.run([sys.executable, "-m", "celeritas_cli", "profile", "--model",
                        f"{model_dir}/noisy_model.py:Noisy", "-b", "4"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["schema"] == "placer.graph/v1" and doc["name"] == "noisy_b4"
    assert "building the model" in p.stderr and "in forward" in p.stderr


def test_profile_factory_error_is_one_line(model_dir):
    r = CliRunner().invoke(main, ["profile", "--model", f"{model_dir}/noisy_model.py:broken", "-b", "4"])
    assert r.exit_code == 1
    assert "building the model failed: ValueError: no such layer" in r.output and "Traceback" not in r.output


def test_bundled_example_model_from_the_repo_root():
    r = CliRunner().invoke(main, ["profile", "--model", os.path.join(ROOT, "examples", "tiny_mlp.py") + ":TinyMLP",
                                  "-b", "8", "--config", "width=16"])
    assert r.exit_code == 0, r.output
    doc = orjson.loads(r.stdout)
    assert doc["meta"]["config"] == {"width": 16} and any(n["op"] == "aten.addmm" for n in doc["nodes"])
