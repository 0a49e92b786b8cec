"""The one registry of placement algorithms and coarsening methods.

Every algorithm module in :mod:`celeritas_cli.algorithms` registers itself::

    @register("adjusting", paper="Celeritas", section="5.2, Algorithm 2",
              summary="...", params={"R": Param(int, 200, "exploration range")})
    def adjusting(graph, cluster, *, seed=0, costs=None, **params) -> Placement: ...

and every coarsening module in :mod:`celeritas_cli.coarsening` with
:func:`register_coarsener` (``func(graph, cluster, *, costs=None, **params) -> Graph``).
``costs`` is the :class:`~celeritas_cli.model.costs.CostModel` the caller
built once for (graph, cluster); a function called directly builds the
default one with :func:`~celeritas_cli.model.costs.cost_model`.
Modules are discovered by name (sorted), so adding an algorithm is adding a
module.  ``names()`` feeds ``--algo``'s choices, ``placer place --list`` and
the parametrised tests.  Optional dependencies (torch) are imported inside
the algorithm function, never at module import.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InvalidInput
from .log import stdout_to_stderr
from .model.costs import cost_model


@dataclass(frozen=True)
class Param:
    """One algorithm parameter: its type (int, float, bool, str), default,
    help, and the values it accepts: ``choices``, or a range ``min`` <= value
    <= ``max`` (``gt``: strictly above), or a ``check`` returning an error
    message (None when the value is fine).  Float parameters are always
    finite (no nan, no inf).

    Example
    -------
    >>> Param(float, 0.5, min=0.0, max=1.0).problem(1.5)
    'must be <= 1.0'
    >>> Param(int, 200, gt=0).range_text()
    '> 0'
    """

    type: type
    default: Any
    help: str = ""
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    check: Callable[[Any], str | None] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with *value* (already converted to ``type``), or None."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if isinstance(value, (int, float)):
            if self.gt is not None and not value > self.gt:
                return f"must be > {self.gt}"
            if self.min is not None and value < self.min:
                return f"must be >= {self.min}"
            if self.max is not None and value > self.max:
                return f"must be <= {self.max}"
        return self.check(value) if self.check is not None else None

    def range_text(self) -> str:
        """The accepted range for help texts (``">= 1"``, ``"0..1"``), or ``""``."""
        low = f"> {self.gt}" if self.gt is not None else (f">= {self.min}" if self.min is not None else "")
        if self.max is None:
            return low
        if self.min is not None and self.gt is None:
            return f"{self.min}..{self.max}"
        return f"{low}, <= {self.max}" if low else f"<= {self.max}"


@dataclass
class Entry:
    name: str
    func: Callable
    paper: str
    section: str
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    extra: str | None = None  # optional dependency group, e.g. "torch"
    kind: str = "placement"
    quick_params: dict[str, Any] = field(default_factory=dict)  # for tests / smoke runs
    uses_origin: bool = False  # judges its candidates on a coarse graph's original when known

    def coerce(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Validate and convert user parameters (strings from ``-p k=v``)
        against the declared ones, filling defaults."""
        out = {k: p.default for k, p in self.params.items()}
        for key, value in raw.items():
            if key not in self.params:
                known = ", ".join(sorted(self.params)) or "none"
                raise InvalidInput(f"{self.kind} '{self.name}' has no parameter '{key}' (it takes: {known})")
            out[key] = _convert(self.name, key, value, self.params[key])
        return out


def _convert(algo: str, key: str, value: Any, p: Param) -> Any:
    try:
        if p.type is bool:
            if isinstance(value, bool):
                v: Any = value
            elif str(value).lower() in ("1", "true", "yes", "on"):
                v = True
            elif str(value).lower() in ("0", "false", "no", "off"):
                v = False
            else:
                raise ValueError(value)
        elif value is None:
            v = None
        else:
            v = p.type(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"'{algo}' parameter {key}: expected {p.type.__name__}, got {value!r}") from None
    if p.choices is not None and v not in p.choices:
        raise InvalidInput(f"'{algo}' parameter {key}: must be one of {', '.join(map(str, p.choices))}, got {v!r}")
    problem = p.problem(v)
    if problem:
        raise InvalidInput(f"'{algo}' parameter {key}: {problem}, got {value!r}")
    return v


_ALGORITHMS: dict[str, Entry] = {}
_COARSENERS: dict[str, Entry] = {}
_ALGORITHMS_PKG = "celeritas_cli.algorithms"
_COARSENERS_PKG = "celeritas_cli.coarsening"
_loaded: set[str] = set()


def register(name: str, *, paper: str, section: str, summary: str,
             params: dict[str, Param] | None = None, extra: str | None = None,
             quick_params: dict[str, Any] | None = None, uses_origin: bool = False):
    """Decorator registering a placement algorithm under *name*.

    *extra* names the optional dependency group it needs (``"torch"``);
    *quick_params* are parameters for a quick run (tests, smoke compares),
    e.g. a short time limit for the MILP; *uses_origin* says that it judges
    its candidates on a coarse graph's original (``Graph.origin``), so
    ``placer place`` loads the original for it when the coarse graph names a
    readable file.
    """

    def deco(func: Callable) -> Callable:
        if name in _ALGORITHMS and _ALGORITHMS[name].func is not func:
            raise RuntimeError(f"placement algorithm {name!r} registered twice")
        _ALGORITHMS[name] = Entry(name, func, paper, section, summary, dict(params or {}), extra,
                                  quick_params=dict(quick_params or {}), uses_origin=uses_origin)
        return func

    return deco


def register_coarsener(name: str, *, paper: str, section: str, summary: str,
                       params: dict[str, Param] | None = None):
    """Decorator registering a coarsening method under *name*."""

    def deco(func: Callable) -> Callable:
        _COARSENERS[name] = Entry(name, func, paper, section, summary, dict(params or {}), None, "coarsening")
        return func

    return deco


def _load(*packages: str) -> None:
    """Import the modules of *packages* (default: both), which register
    themselves; each package once (``placer coarsen`` needs no placer)."""
    for pkg_name in packages or (_ALGORITHMS_PKG, _COARSENERS_PKG):
        if pkg_name in _loaded:
            continue
        _loaded.add(pkg_name)
        pkg = importlib.import_module(pkg_name)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{pkg_name}.{info.name}")


def names() -> list[str]:
    """Registered placement algorithm names, sorted."""
    _load(_ALGORITHMS_PKG)
    return sorted(_ALGORITHMS)


def _load_one(name: str) -> None:
    """Import the module named after algorithm *name* (one module per
    algorithm: ``m-etf`` -> ``m_etf``, ``random`` -> ``random_placement``),
    so looking one algorithm up does not import every placer; the full
    package is loaded when that does not register it."""
    if name in _ALGORITHMS or _ALGORITHMS_PKG in _loaded:
        return
    module = f"{_ALGORITHMS_PKG}.{_MODULE_OF.get(name, name.replace('-', '_'))}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # the module exists but misses a dependency: say so as before
            raise


#: algorithm names whose module is not the name with '-' -> '_'
_MODULE_OF = {"random": "random_placement"}


def get(name: str) -> Entry:
    _load_one(name)
    if name not in _ALGORITHMS:
        _load(_ALGORITHMS_PKG)
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise InvalidInput(f"unknown algorithm '{name}' (known: {', '.join(sorted(_ALGORITHMS))})") from None


def entries() -> list[Entry]:
    _load(_ALGORITHMS_PKG)
    return [_ALGORITHMS[n] for n in sorted(_ALGORITHMS)]


def coarsener_names() -> list[str]:
    _load(_COARSENERS_PKG)
    return sorted(_COARSENERS)


def get_coarsener(name: str) -> Entry:
    _load(_COARSENERS_PKG)
    try:
        return _COARSENERS[name]
    except KeyError:
        raise InvalidInput(f"unknown coarsening method '{name}' (known: {', '.join(sorted(_COARSENERS))})") from None


def place(graph, cluster, algo: str, *, seed: int = 0, params: dict[str, Any] | None = None, costs=None):
    """Run registered algorithm *algo* and return its :class:`Placement`,
    with ``algorithm``, ``params``, ``seed`` and ``placement_time_s`` filled in
    (wall time of the algorithm itself, like Celeritas Table 4).  A result
    made on a derived graph (``derived``) gets an estimate said to hold for
    that graph (``estimate.graph == "split"``).

    *costs* is the cost model to place under (default: the file's costs,
    :func:`celeritas_cli.model.costs.cost_model`); it is built once here and
    passed to the algorithm as its ``costs`` keyword.

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = place(layered(20, seed=1), uniform(2), "single-device")
    >>> sorted(set(p.assignment.values()))
    ['gpu0']
    """
    entry = get(algo)
    kwargs = entry.coerce(params or {})
    t0 = time.perf_counter()
    costs = cost_model(graph, cluster, costs)
    with stdout_to_stderr():  # C libraries (METIS) print to fd 1; stdout is for the JSON document
        result = entry.func(graph, cluster, seed=seed, costs=costs, **kwargs)
    result.placement_time_s = time.perf_counter() - t0
    if result.derived is not None and result.estimate.graph != "split":
        result.estimate = result.estimate.with_graph("split", result.derived.n)
    result.algorithm = algo
    result.params = {**kwargs, **result.params}
    result.seed = seed
    return result


def coarsen(graph, cluster, method: str, *, params: dict[str, Any] | None = None, costs=None):
    """Run registered coarsening *method*; returns the coarse :class:`Graph`
    (*costs* as in :func:`place`), whose ``origin`` is the original graph
    (so algorithms can judge their candidates on it)."""
    entry = get_coarsener(method)
    kwargs = entry.coerce(params or {})
    costs = cost_model(graph, cluster, costs)
    with stdout_to_stderr():
        coarse = entry.func(graph, cluster, costs=costs, **kwargs)
    if coarse is not graph and coarse.is_coarse and coarse.origin is None:
        coarse.origin = graph.origin if graph.is_coarse else graph
    return coarse
