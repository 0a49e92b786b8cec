"""Finding the model to profile: ``--model NAME``, ``module:attr`` or ``path/to/file.py:attr``.

:func:`resolve_model` is the one resolver of ``--model`` specs; ``placer
profile`` uses it, and so can any command that takes a user's model.

A spec is one of

* a zoo name (``transformer``, ``resnet50``, ...: :mod:`celeritas_cli.profile.zoo`);
* ``module:attr`` -- an importable module (the current directory is on the
  path, as with gunicorn or uvicorn) and a callable in it, dotted for nested
  attributes (``pkg.models:Net``, ``models:factories.build``);
* ``path/to/file.py:attr`` -- a Python file anywhere, loaded by path; its
  directory is put on ``sys.path`` first, so the file's own sibling imports work.

The callable returns an ``nn.Module`` (a class or a factory function) that
defines ``example_inputs(batch)`` returning the forward arguments, and
optionally ``example_target(batch)`` and ``loss(output, target)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidInput


def _require_torch():
    try:
        import torch
    except ImportError:
        from ..errors import MissingDependency

        raise MissingDependency("profiling PyTorch models needs torch: pip install -e .[torch]") from None
    return torch


def _user_error(spec: str, what: str, exc: BaseException, path: str | None = None) -> InvalidInput:
    """One line for an exception raised by the user's code, with the line of their file it came from."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
        if mine:
            where = f" (line {mine[-1].lineno})"
    return InvalidInput(f"--model {spec}: {what}: {type(exc).__name__}: {exc}{where}")


def _is_path(left: str) -> bool:
    return left.endswith(".py") or "/" in left or os.sep in left


def _load_file(spec: str, path_text: str):
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InvalidInput(f"--model {spec}: no such file {path_text!r}")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = f"placer_model_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise InvalidInput(f"--model {spec}: {path_text!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed: say where, in one line
        sys.modules.pop(name, None)
        raise _user_error(spec, f"running {path_text} failed", exc, str(path)) from None
    return module


def _import_module(spec: str, modname: str):
    if os.getcwd() not in sys.path:  # like gunicorn/uvicorn: module:attr resolves from the current directory
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(modname)
    except ImportError as exc:
        raise InvalidInput(f"--model {spec}: cannot import module {modname!r}: {exc}") from None
    except Exception as exc:
        raise _user_error(spec, f"importing {modname!r} failed", exc) from None


def resolve_model(spec: str, config: dict | None = None) -> tuple[Callable[[], Any], str]:
    """Return ``(factory, name)`` for a zoo name, ``module:attr`` or
    ``path/to/file.py:attr``: calling ``factory()`` builds the ``nn.Module``
    with *config* as keyword arguments; *name* (lower-case attribute or zoo
    name) names the graph.

    Parameters
    ----------
    spec : str
        The ``--model`` value (see the module docstring).
    config : dict, optional
        Keyword arguments of the model's constructor (``--config k=v``).

    Returns
    -------
    (factory, name)

    Raises
    ------
    InvalidInput
        Unknown zoo name, no such file, module not importable, the file or
        module raised while loading, attribute missing or not callable.
    MissingDependency
        torch is not installed.

    Example
    -------
    Not run (needs torch and a file)::

        factory, name = resolve_model("models/mlp.py:TinyMLP", {"width": 2})
        model = factory()
    """
    _require_torch()
    config = dict(config or {})
    if ":" in spec:
        left, attr = spec.rsplit(":", 1)
        if not left or not attr:
            raise InvalidInput(f"--model {spec}: expected module:attr or path/to/file.py:attr")
        module = _load_file(spec, left) if _is_path(left) else _import_module(spec, left)
        factory: Any = module
        for part in attr.split("."):
            if not hasattr(factory, part):
                raise InvalidInput(f"--model {spec}: {left!r} has no attribute {attr!r}")
            factory = getattr(factory, part)
        if not callable(factory):
            raise InvalidInput(f"--model {spec}: {attr!r} is not callable (expected an nn.Module factory)")
        return (lambda: factory(**config)), attr.split(".")[-1].lower()
    from .zoo import ZOO

    if spec not in ZOO:
        hint = " (a file needs :attr, e.g. model.py:Net)" if spec.endswith(".py") else ""
        raise InvalidInput(f"--model {spec!r}: unknown model{hint}; the zoo has {', '.join(ZOO)}, "
                           f"or give module:attr or path/to/file.py:attr for your own nn.Module factory")
    entry = ZOO[spec]
    return (lambda: entry.factory(**config)), spec
