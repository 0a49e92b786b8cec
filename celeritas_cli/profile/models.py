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
defines ``example_inputs(batch)`` returning the forward arguments (a tuple or
list), and optionally ``example_target(batch)`` and ``loss(output, target)``.

The user's code is guarded (:func:`user_code`): whatever it raises while it is
imported, built, or while one of its hooks (``forward``, ``example_inputs``,
``example_target``, ``loss``) runs -- any exception, ``SystemExit``, a
``BaseException`` subclass, a call of ``os._exit`` -- becomes one
:class:`~celeritas_cli.errors.InvalidInput` naming the spec, the hook, and the
file and line of the user's code it came from (exit code 1 in the CLI).
``os._exit`` ends the process without unwinding, so no ``except`` can see it;
the guard replaces ``os._exit`` while user code runs (in this process and
thread only; every other caller, and any other time, gets the real one).  A
child process would catch it too, but the capture's result (an fx graph on
fake tensors) is costly to ship back and torch would be imported twice.  What
no Python-level guard sees: ``posix._exit`` called directly, C code calling
``exit()``, a fatal signal.  Zoo models are placer's own code and run unguarded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import sysconfig
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import InvalidInput, PlacerError

HOOKS = ("forward", "example_inputs", "example_target", "loss")
"""The methods of a user's model that placer calls, each guarded by :func:`user_code`."""

_MESSAGE_MAX = 500  # characters of the user's exception message kept in the one-line error


def _require_torch():
    try:
        import torch
    except ImportError:
        from ..errors import MissingDependency

        raise MissingDependency("profiling PyTorch models needs torch: pip install -e .[torch]") from None
    return torch


# ------------------------------------------------------------------ os._exit guard
class _Exited(BaseException):
    """Raised in place of ``os._exit(status)`` while user code runs."""

    def __init__(self, status: Any):
        super().__init__(status)
        self.status = status


_GUARDED: dict[tuple[int, int], int] = {}  # (pid, thread) -> nesting depth of the user code it runs
_SAVED_EXIT: list[Callable] = [os._exit]  # os._exit as found when the first guard started


def _guarded_exit(status):
    """``os._exit`` while a guard is on: raises :class:`_Exited` in the guarded
    thread and process, exits for real anywhere else (a forked child, another thread)."""
    if (os.getpid(), threading.get_ident()) in _GUARDED:
        raise _Exited(status)
    _SAVED_EXIT[0](status)


@contextlib.contextmanager
def _exit_guard() -> Iterator[None]:
    me = (os.getpid(), threading.get_ident())
    if not _GUARDED:
        _SAVED_EXIT[:] = [os._exit]
        os._exit = _guarded_exit
    _GUARDED[me] = _GUARDED.get(me, 0) + 1
    try:
        yield
    finally:
        _GUARDED[me] -= 1
        if not _GUARDED[me]:
            del _GUARDED[me]
        if not _GUARDED and os._exit is _guarded_exit:
            os._exit = _SAVED_EXIT[0]


# ------------------------------------------------------------------ user errors
def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are not the user's: placer, the standard library, installed packages."""
    dirs = {str(Path(__file__).resolve().parents[1])}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _shown(filename: str, path: str | None) -> str:
    """How a file is named in a message: as the user typed it for the spec's
    own file, relative to the current directory when inside it, else absolute."""
    if path is not None and os.path.abspath(filename) == os.path.abspath(path):
        return path
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def user_frame(exc: BaseException, path: str | None = None) -> str:
    """``" (file.py:12)"``: the innermost line of the user's code in *exc*'s
    traceback (not placer, not the standard library, not an installed
    package); ``""`` when there is none.

    Example
    -------
    >>> try:
    ...     exec(compile("raise ValueError('x')", "/tmp/user_model.py", "exec"))
    ... except ValueError as exc:
    ...     user_frame(exc)
    ' (/tmp/user_model.py:1)'
    """
    skip = _library_dirs()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if name.startswith("<") or os.path.realpath(name).startswith(skip):
            continue
        return f" ({_shown(name, path)}:{frame.lineno})"
    return ""


def _user_error(spec: str, what: str, exc: BaseException, path: str | None = None) -> InvalidInput:
    """One line for what the user's code raised (or how it tried to exit), with the line it came from."""
    if isinstance(exc, _Exited):
        told = f"called os._exit({exc.status!r})"
    elif isinstance(exc, SystemExit):
        told = f"raised SystemExit({exc.code!r})"
    else:
        text = str(exc)
        if len(text) > _MESSAGE_MAX:
            text = text[:_MESSAGE_MAX] + "..."
        told = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return InvalidInput(f"--model {spec}: {what}: {told}{user_frame(exc, path)}")


@contextlib.contextmanager
def user_code(spec: str, what: str, path: str | None = None) -> Iterator[None]:
    """Run the block as the user's code: anything it raises (``SystemExit``
    and other ``BaseException`` subclasses included, Ctrl-C excepted) or an
    ``os._exit`` it calls becomes one :class:`InvalidInput` naming *spec*,
    *what* it was doing and the file and line (module docstring).

    Example
    -------
    >>> with user_code("m.py:Net", "building the model"):
    ...     raise SystemExit(3)
    Traceback (most recent call last):
    celeritas_cli.errors.InvalidInput: --model m.py:Net: building the model: raised SystemExit(3)
    """
    with _exit_guard():
        try:
            yield
        except (PlacerError, KeyboardInterrupt):  # ours (a nested guard's message), or the user's Ctrl-C
            raise
        except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything
            raise _user_error(spec, what, exc, path) from None


def _label(name: str, args: tuple) -> str:
    if name in ("example_inputs", "example_target"):
        return f"{name}({', '.join(repr(a) for a in args)})"
    return {"forward": "forward()", "loss": "loss(output, target)"}[name]


def _guard_hook(fn: Callable, name: str, spec: str, path: str | None) -> Callable:
    @functools.wraps(fn)
    def hook(*args, **kwargs):
        with user_code(spec, f"{_label(name, args)} failed", path):
            out = fn(*args, **kwargs)
        if name == "example_inputs" and not isinstance(out, (tuple, list)):
            got = "a Tensor" if isinstance(out, _require_torch().Tensor) else type(out).__name__
            raise InvalidInput(f"--model {spec}: {_label(name, args)} returned {got}, expected a tuple or list of "
                               f"the forward arguments, e.g. (x,)")
        return out

    hook.__placer_guarded__ = True
    return hook


def _guarded_factory(factory: Callable, config: dict, spec: str, path: str | None) -> Callable[[], Any]:
    """``factory(**config)`` run as user code, its model's :data:`HOOKS` guarded too."""

    def build():
        with user_code(spec, "building the model failed", path):
            model = factory(**config)
        torch = _require_torch()
        if isinstance(model, torch.nn.Module):
            for name in HOOKS:
                fn = getattr(model, name, None)
                # a hook that is a submodule (self.loss = nn.MSELoss()) is left alone: nn.Module refuses
                # to replace a child module with a function
                if callable(fn) and not isinstance(fn, torch.nn.Module) \
                        and not getattr(fn, "__placer_guarded__", False):
                    object.__setattr__(model, name, _guard_hook(fn, name, spec, path))
        return model

    return build


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
        with user_code(spec, f"running {path_text} failed", path_text):
            module_spec.loader.exec_module(module)
    except InvalidInput:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(spec: str, modname: str):
    if os.getcwd() not in sys.path:  # like gunicorn/uvicorn: module:attr resolves from the current directory
        sys.path.insert(0, os.getcwd())
    try:
        with user_code(spec, f"importing {modname!r} failed"):
            try:
                return importlib.import_module(modname)
            except ImportError as exc:
                raise _NotImportable(str(exc)) from None
    except _NotImportable as exc:
        raise InvalidInput(f"--model {spec}: cannot import module {modname!r}: {exc}") from None


class _NotImportable(PlacerError):
    """The module itself cannot be found or imported (passes through :func:`user_code`)."""


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
        module raised while loading, attribute missing or not callable; and,
        when ``factory()`` is called, whatever the user's code raised while
        building the model or in one of its :data:`HOOKS` (:func:`user_code`).
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
        path = left if _is_path(left) else None
        module = _load_file(spec, left) if path else _import_module(spec, left)
        factory: Any = module
        for part in attr.split("."):
            if not hasattr(factory, part):
                raise InvalidInput(f"--model {spec}: {left!r} has no attribute {attr!r}")
            factory = getattr(factory, part)
        if not callable(factory):
            raise InvalidInput(f"--model {spec}: {attr!r} is not callable (expected an nn.Module factory)")
        return _guarded_factory(factory, config, spec, path), attr.split(".")[-1].lower()
    from .zoo import ZOO

    if spec not in ZOO:
        hint = " (a file needs :attr, e.g. model.py:Net)" if spec.endswith(".py") else ""
        raise InvalidInput(f"--model {spec!r}: unknown model{hint}; the zoo has {', '.join(ZOO)}, "
                           f"or give module:attr or path/to/file.py:attr for your own nn.Module factory")
    entry = ZOO[spec]
    return (lambda: entry.factory(**config)), spec
