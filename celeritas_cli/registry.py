"""The one registry of placement algorithms and coarsening methods.

Every algorithm module in :mod:`celeritas_cli.algorithms` registers itself::

    @register("adjusting", paper="Celeritas", section="5.2, Algorithm 2",
              summary="...", params={"R": Param(int, 200, "exploration range", min=1, max=10_000),
                                     "congestion": congestion_param("link rule of the EST")})
    def adjusting(graph, cluster, *, seed=0, costs=None, R=200,
                  congestion=DEFAULT_CONGESTION) -> Placement: ...

and every coarsening module in :mod:`celeritas_cli.coarsening` with
:func:`register_coarsener` (``func(graph, cluster, *, costs=None, **params) -> Graph``).
What :func:`place` passes and what it must return is the :class:`Algorithm`
protocol, which :func:`signature_problems` checks (the all-algorithms test).
Shared parameters have one definition each: :func:`congestion_param` and
:func:`time_limit_param` (0 = no limit; such an algorithm also takes
``deadline``, :func:`deadline`); :func:`with_flags` copies command-line flags
into an algorithm's parameters (``place``, ``compare``).

Modules are discovered by name (sorted), so adding an algorithm is adding a
module.  ``names()`` feeds ``--algo``'s choices, ``placer place --list`` and
the parametrised tests.  Optional dependencies (torch) are imported inside
the algorithm function, never at module import.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pkgutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .errors import InvalidInput, TimeLimit
from .log import stdout_to_stderr, warn
from .model.clock import OVERRUN, OVERRUN_S, TimeUp, cap_at, check_time, time_cap
from .model.params import (  # noqa: F401  (re-exported: the registry's public names)
    ASSUME_BATCH,
    DEVICES,
    INT_MAX,
    SEED,
    TIME_LIMIT_CAP,
    TIME_LIMIT_RULE,
    Param,
    congestion_param,
    deadline,
    evaluations_param,
    overhead_param,
    shares_param,
    time_limit_param,
)
from .model.costs import cost_model
from .transform.size import check_size

if TYPE_CHECKING:
    from .model.cluster import Cluster
    from .model.costs import CostModel
    from .model.graph import Graph
    from .model.placement import Placement

@dataclass
class Entry:
    """One registered algorithm or coarsening method: ``name`` (``--algo
    NAME``), ``func`` (:class:`Algorithm`), ``paper`` / ``section`` /
    ``summary`` (``placer place --list``), ``params`` (``-p KEY=VALUE``, each
    a :class:`Param` whose default equals the function's), ``extra`` (the
    optional dependency group it needs, e.g. ``"torch"``), ``kind``
    (``"placement"`` / ``"coarsening"``), ``quick_params`` (a quick run:
    tests, ``compare --quick``), ``uses_origin`` (judges candidates on a
    coarse graph's original, so ``placer place`` loads it),
    ``takes_deadline`` (its function takes ``deadline``; :func:`place`
    passes one, and every algorithm whose function takes ``time_limit``
    does) and ``takes_time_limit`` (its function takes ``time_limit``;
    every placement algorithm declares one, :func:`register` adds
    :data:`~.model.params.TIME_LIMIT_CAP` where it declares none, and
    :func:`place` enforces it, :mod:`~.model.clock`).
    """

    name: str
    func: Callable
    paper: str
    section: str
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    extra: str | None = None
    kind: str = "placement"
    quick_params: dict[str, Any] = field(default_factory=dict)
    uses_origin: bool = False
    takes_deadline: bool = False
    takes_time_limit: bool = False

    def __post_init__(self) -> None:
        try:
            keywords = inspect.signature(self.func).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            keywords = {}
        self.takes_deadline = "deadline" in keywords
        self.takes_time_limit = "time_limit" in keywords

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


class Algorithm(Protocol):
    """A placement algorithm, as :func:`place` calls it.

    Receives the graph to place (original, coarse or derived) and the
    cluster positionally; as keywords ``seed`` (int >= 0), ``costs`` (the
    :class:`~celeritas_cli.model.costs.CostModel` built once for (graph,
    cluster); None when called directly: build the default one), every
    declared :class:`Param` converted and checked, and -
    only an algorithm with a ``time_limit`` (:func:`time_limit_param`) -
    ``deadline``: the :func:`time.perf_counter` reading at which its wall
    clock ends, or None (no limit; a direct call without one counts
    ``time_limit`` from its own start, :func:`deadline`).  The counted
    budget (iterations, evaluations) follows ``time_limit``; the deadline
    only caps it, so a run the clock did not cut is repeatable.

    Returns a :class:`~celeritas_cli.model.placement.Placement` over the
    graph's node ids (or one carrying ``split_graph`` / ``derivation`` for a
    graph it derived) with its ``estimate``; :func:`place` fills
    ``algorithm``, ``params``, ``seed`` and ``placement_time_s``.  Fails with
    a one-line :class:`~celeritas_cli.errors.PlacerError`; writes only to
    stderr.  Defaults equal the ``Param``'s (:func:`signature_problems`).
    """

    def __call__(self, graph: Graph, cluster: Cluster, *, seed: int = 0, costs: CostModel | None = None,
                 **params: Any) -> Placement: ...


#: the shared parameters (:mod:`~.model.params`): an algorithm that takes one of these names declares it with the
#: shared declaration (its help may say what the algorithm does with it); ``time_limit`` by its default
SHARED: dict[str, Callable[[Param], Param]] = {
    "time_limit": lambda p: time_limit_param(p.default, ""),
    "congestion": lambda p: congestion_param(""),
    "assume_batch": lambda p: ASSUME_BATCH,
    "devices": lambda p: DEVICES,
    "evaluations": lambda p: evaluations_param(""),
    "shares": lambda p: shares_param(""),
    "overhead_s": lambda p: overhead_param(""),
}


def signature_problems(entry: Entry) -> list[str]:
    """What is wrong with *entry* against the :class:`Algorithm` protocol (a
    coarsener: ``(graph, cluster, *, costs=None, **params) -> Graph``): ``[]``
    when nothing.  Checks the positional ``(graph, cluster)``, the keywords
    ``seed`` / ``costs`` / ``deadline``, that every ``Param`` is a keyword
    with the same default (but the registry's ``time_limit`` cap,
    :data:`~.model.params.TIME_LIMIT_CAP`, which the function need not
    take) and every other keyword has a default, that a placement algorithm
    has a ``time_limit``, that every parameter of :data:`SHARED` is the
    shared declaration, that integer parameters have a ``max`` and that the
    ``quick_params`` are valid.

    >>> signature_problems(get("milp")), signature_problems(get("heft"))
    ([], [])
    """
    sig = inspect.signature(entry.func)
    positional = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw = {p.name: p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY}
    base = {"seed": SEED.default, "costs": None} if entry.kind == "placement" else {"costs": None}
    if "time_limit" in kw:
        base["deadline"] = None
    out = [] if positional == ["graph", "cluster"] else [f"positional parameters {positional}, not [graph, cluster]"]
    out += [f"keyword {k}={v!r} missing" for k, v in base.items() if k not in kw or kw[k].default != v]
    if entry.kind == "placement" and "time_limit" not in entry.params:
        out.append("declares no time_limit (registry.register adds the shared cap)")
    for name, prm in entry.params.items():
        if name == "time_limit" and name not in kw and prm == TIME_LIMIT_CAP:
            continue  # the registry's cap: enforced by place, never passed
        if name not in kw:
            out.append(f"parameter {name} is not a keyword-only parameter of the function")
        elif kw[name].default != prm.default or type(kw[name].default) is not type(prm.default):
            out.append(f"parameter {name}: default {prm.default!r}, the signature says {kw[name].default!r}")
        if prm.type is int and (prm.max is None or prm.max > INT_MAX):
            out.append(f"integer parameter {name} has no max")
    out += [f"keyword {k} is no Param and has no default" for k, p in kw.items()
            if k not in entry.params and k not in base and p.default is p.empty]
    if "deadline" in kw and "time_limit" not in kw:
        out.append("takes deadline but declares no time_limit")
    out += [f"parameter {k} is not the shared one (model.params)" for k, shared in SHARED.items()
            if k in entry.params and _no_help(entry.params[k]) != _no_help(shared(entry.params[k]))]
    try:
        entry.coerce(entry.quick_params)
    except InvalidInput as exc:
        out.append(f"quick_params: {exc}")
    want = "Placement" if entry.kind == "placement" else "Graph"
    if getattr(sig.return_annotation, "__name__", sig.return_annotation) != want:
        out.append(f"returns {sig.return_annotation}, not {want}")
    return out


def _no_help(p: Param) -> Param:
    return dataclasses.replace(p, help="")


def with_flags(entry: Entry, params: dict[str, Any], **flags: Any) -> tuple[dict[str, Any], list[str]]:
    """*params* plus each command-line flag (``congestion="port"``,
    ``time_limit=30.0``; ``None`` = not given) that *entry* declares and
    *params* does not set: an explicit ``-p`` wins.  Returns the parameters
    and one line per given flag left out (for ``placer place`` to warn).
    Used by ``placer place`` and ``placer compare``.

    >>> with_flags(get("heft"), {"insertion": "false"}, congestion="port", time_limit=5.0)
    ({'insertion': 'false', 'time_limit': 5.0}, ["--congestion ignored: 'heft' takes no congestion"])
    >>> with_flags(get("dpos"), {"congestion": "none"}, congestion="port")
    ({'congestion': 'none'}, ['--congestion ignored: -p congestion=none wins'])
    """
    out, left_out = dict(params), []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if key not in entry.params:
            left_out.append(f"{flag} ignored: '{entry.name}' takes no {key}")
        elif key in out:
            left_out.append(f"{flag} ignored: -p {key}={out[key]} wins")
        else:
            out[key] = value
    return out, left_out


_ALGORITHMS: dict[str, Entry] = {}
_COARSENERS: dict[str, Entry] = {}
_ALGORITHMS_PKG = "celeritas_cli.algorithms"
_COARSENERS_PKG = "celeritas_cli.coarsening"
_loaded: set[str] = set()


def register(name: str, *, paper: str, section: str, summary: str,
             params: dict[str, Param] | None = None, extra: str | None = None,
             quick_params: dict[str, Any] | None = None, uses_origin: bool = False):
    """Decorator registering a placement algorithm under *name*.

    An algorithm that declares no ``time_limit`` gets
    :data:`~.model.params.TIME_LIMIT_CAP`: :func:`place` stops it there
    (:mod:`~.model.clock`), its function never sees it.

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
        declared = dict(params or {})
        declared.setdefault("time_limit", TIME_LIMIT_CAP)  # every algorithm has a limit: place enforces it
        _ALGORITHMS[name] = Entry(name, func, paper, section, summary, declared, extra,
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
        for module in _modules(pkg_name):
            importlib.import_module(module)


#: the family subpackages of ``algorithms/`` (operator placers, pipeline
#: planners, sharding); their modules register algorithms as the package's own
#: do.  Any other subpackage (``placers/milp``) is one algorithm: imported whole.
_FAMILIES = ("placers", "pipelines", "sharding")


def _modules(pkg_name: str) -> list[str]:
    """The algorithm modules of *pkg_name*, families opened, sorted."""
    pkg = importlib.import_module(pkg_name)
    out = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        if pkg_name == _ALGORITHMS_PKG and info.name in _FAMILIES:
            out.extend(_modules_of_family(f"{pkg_name}.{info.name}"))
        else:
            out.append(f"{pkg_name}.{info.name}")
    return out


def _modules_of_family(family: str) -> list[str]:
    pkg = importlib.import_module(family)
    return [f"{family}.{i.name}" for i in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name)
            if not i.name.startswith("_")]


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
    leaf = _MODULE_OF.get(name, name.replace('-', '_'))
    for module in [f"{_ALGORITHMS_PKG}.{leaf}"] + [f"{_ALGORITHMS_PKG}.{f}.{leaf}" for f in _FAMILIES]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module exists but misses a dependency: say so as before
                raise
            continue
        return


#: algorithm names whose module is not the name with '-' -> '_'
_MODULE_OF = {"random": "random_placement"}

#: The names users know for what a registered algorithm does: alias -> (algorithm, the parameters the
#: alias fixes).  PyTorch's DistributedDataParallel is ``data-parallel``; DeepSpeed's ZeRO stages 1-3
#: (Rajbhandari et al. 2020, section 5) are ``fsdp`` with ``stage`` 1-3 (PyTorch FSDP is stage 3).
#: Pipeline schedules (1F1B, interleaved) are not algorithms but ``-p schedule=`` of ``pipeline``.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("data-parallel", {}),
    "zero": ("fsdp", {"stage": 3}),
    "zero1": ("fsdp", {"stage": 1}),
    "zero2": ("fsdp", {"stage": 2}),
    "zero3": ("fsdp", {"stage": 3}),
}


def _key(name: str) -> str:
    """How names compare: case, ``-``, ``_`` and spaces ignored (``ZeRO-3``, ``data_parallel``)."""
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def _canonical(name: str) -> tuple[str, dict[str, Any]] | None:
    """The registered name *name* is, or an alias names, with the parameters
    the alias fixes; None for an unknown name."""
    _load_one(name)
    if name not in _ALGORITHMS:
        _load(_ALGORITHMS_PKG)
    if name in _ALGORITHMS:
        return name, {}
    by_key = {_key(n): (n, {}) for n in _ALGORITHMS} | {_key(a): v for a, v in ALIASES.items()}
    return by_key.get(_key(name))


def _spelled(alias: str) -> str:
    """``zero2`` -> ``fsdp -p stage=2``."""
    name, fixed = ALIASES[alias]
    return name + "".join(f" -p {k}={v}" for k, v in fixed.items())


def alias_text() -> str:
    """The aliases in words, for ``placer place --help``.

    >>> alias_text()
    'ddp = data-parallel; zero = fsdp -p stage=3; zero1 = fsdp -p stage=1; zero2 = fsdp -p stage=2; zero3 = fsdp -p stage=3'
    """
    return "; ".join(f"{a} = {_spelled(a)}" for a in ALIASES)


def resolve(name: str, params: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The registered name *name* stands for and the parameters with what an
    alias fixes (:data:`ALIASES`): ``("fsdp", {"stage": 3, ...})`` for
    ``zero3``.  A registered name spelled in another case or with ``_`` for
    ``-`` is that name.  *params* may repeat what the alias fixes, not
    contradict it.

    Raises
    ------
    InvalidInput
        An unknown name (:func:`get`'s message), or a parameter that
        contradicts the alias.

    >>> resolve("zero2", {"unit_mb": "8"})
    ('fsdp', {'stage': 2, 'unit_mb': '8'})
    >>> resolve("DDP"), resolve("Data_Parallel")
    (('data-parallel', {}), ('data-parallel', {}))
    """
    params = dict(params or {})
    found = _canonical(name)
    if found is None:
        get(name)  # raises the one message of an unknown name
    canonical, fixed = found
    for k, v in fixed.items():
        if k in params and str(params[k]) != str(v):
            raise InvalidInput(f"'{name}' is {canonical} with {k}={v}, but {k}={params[k]} was given; use "
                               f"--algo {canonical} -p {k}={params[k]}")
    return canonical, {**fixed, **params}


def did_you_mean(name: str) -> str:
    """``"; did you mean 'fsdp'?"`` when *name* is close to registered names
    or aliases (:func:`difflib.get_close_matches`, at most three), else ``""``.

    >>> did_you_mean("fsdb"), did_you_mean("hef"), did_you_mean("qqqqq")
    ("; did you mean 'fsdp'?", "; did you mean 'heft'?", '')
    >>> did_you_mean("zero4")
    "; did you mean 'zero' (fsdp -p stage=3), 'zero3' (fsdp -p stage=3) or 'zero2' (fsdp -p stage=2)?"
    """
    _load(_ALGORITHMS_PKG)
    close = difflib.get_close_matches(name.lower(), sorted(set(_ALGORITHMS) | set(ALIASES)), n=3, cutoff=0.6)
    shown = [f"'{c}'" if c in _ALGORITHMS else f"'{c}' ({_spelled(c)})" for c in close]
    if not shown:
        return ""
    return "; did you mean " + (shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]) + "?"


def get(name: str) -> Entry:
    """The :class:`Entry` of placement algorithm *name* (or of the one an
    alias names, :func:`resolve`), importing only its module when that
    registers it (``placer place --algo heft`` does not import torch or
    OR-Tools).

    Raises
    ------
    InvalidInput
        An unknown name (the message offers the closest known names and
        lists the rest).

    >>> get("heft").paper
    'Topcuoglu et al., IEEE TPDS 2002'
    >>> get("zero3").name
    'fsdp'
    """
    found = _canonical(name)
    if found is None:
        raise InvalidInput(f"unknown algorithm '{name}'{did_you_mean(name)} (known: {', '.join(sorted(_ALGORITHMS))}; "
                           f"aliases: {', '.join(ALIASES)})")
    return _ALGORITHMS[found[0]]


def entries() -> list[Entry]:
    """Every registered placement algorithm's :class:`Entry`, sorted by name
    (all algorithm modules imported; ``placer place --list``, the tests).

    >>> [e.name for e in entries()][:4]
    ['3d', 'adjusting', 'alpa-stages', 'auto']
    """
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


def place(graph, cluster, algo: str, *, seed: int = 0, params: dict[str, Any] | None = None, costs=None,
          started: float | None = None):
    """Run registered algorithm *algo* and return its :class:`Placement`,
    with ``algorithm``, ``params``, ``seed`` and ``placement_time_s`` filled in
    (wall time of the algorithm itself, like Celeritas Table 4).  A result
    made on a derived graph (``derived``) gets an estimate said to hold for
    that graph (``estimate.graph == "split"``).

    *params* are checked and converted (:meth:`Entry.coerce`) before
    anything runs.  *costs* is the cost model to place under (default: the
    file's costs, :func:`celeritas_cli.model.costs.cost_model`); it is built
    once here and passed to the algorithm as its ``costs`` keyword.

    The limit: every algorithm has a ``time_limit``, counted from *started*
    (a :func:`time.perf_counter` reading; default: now), so ``placer
    place`` passes the command's start and ``--time-limit`` bounds the
    whole command, loading included.  An algorithm whose function takes
    ``time_limit`` also gets ``deadline`` (:func:`deadline`; the
    :class:`Algorithm` protocol) and stops there by itself; whatever it
    does, it is stopped at the cap (:mod:`~.model.clock`: the limit + 5 %
    + 0.5 s), and answers with the best plan it recorded
    (:func:`~.model.clock.keep_best`, said in a warning) or fails with a
    one-line :class:`~.errors.TimeLimit` naming the limit.  A parameter
    whose value makes a derived graph over the budget is refused before
    the algorithm runs (:func:`refuse_derived_size`).

    Example
    -------
    >>> from celeritas_cli.model.generate import layered
    >>> from celeritas_cli.model.cluster import uniform
    >>> p = place(layered(20, seed=1), uniform(2), "single-device")
    >>> sorted(set(p.assignment.values()))
    ['gpu0']
    """
    algo, params = resolve(algo, params)
    entry = get(algo)
    kwargs = entry.coerce(params)
    t0 = time.perf_counter()
    start = t0 if started is None else started
    limit = kwargs.get("time_limit") or 0.0
    call = {k: v for k, v in kwargs.items() if k != "time_limit" or entry.takes_time_limit}
    clock = {"deadline": deadline(limit, start)} if entry.takes_deadline else {}
    refuse_derived_size(entry, graph, cluster, kwargs)
    costs = cost_model(graph, cluster, costs)
    cap = None
    try:
        # C libraries (METIS) print to fd 1; stdout is for the JSON document
        with stdout_to_stderr(), time_cap(cap_at(start, limit), limit, algo) as cap:
            check_time()  # the limit counts from the command's start: loading may have spent it
            result = entry.func(graph, cluster, seed=seed, costs=costs, **call, **clock)
    except TimeUp as exc:
        if cap is None or exc.cap is not cap:
            raise  # an enclosing call's limit (auto's, over a member): that call answers
        result = cap.best() if cap.best is not None else None
        if result is None:
            raise TimeLimit(cap.message()) from None
        warn(f"placer: {algo}: stopped at its time limit of {limit:g} s (+{100 * OVERRUN:g} % + {OVERRUN_S:g} s); "
             f"the answer is the best plan it had found, another run may differ")
    result.placement_time_s = time.perf_counter() - t0
    if result.derived is not None and result.estimate.graph != "split":
        result.estimate = result.estimate.with_graph("split", result.derived.n)
    result.algorithm = algo
    shown = call if "time_limit" in call or "time_limit" not in (params or {}) else kwargs
    result.params = {**shown, **result.params}
    result.seed = seed
    return result


def refuse_derived_size(entry: Entry, graph, cluster, kwargs: dict[str, Any]) -> None:
    """Refuse, before *entry* runs, a parameter value whose derived graph
    is over the budget (a :class:`Param` with ``size``,
    :func:`~.transform.size.check_size`): ``-p microbatches=10000000``
    answers at once instead of growing until the machine runs out of memory.

    Raises
    ------
    InvalidInput
        ``"<algo>: -p <key>=<value> would build a derived graph of N nodes
        ... (--max-derived-nodes)"``.
    """
    for key, prm in entry.params.items():
        value = kwargs.get(key, prm.default)
        if prm.size is None or value == prm.default:
            continue
        size = prm.size(graph, value)
        if size is not None:
            check_size(size, f"{entry.name}: -p {key}={value}", f"lower -p {key}", getattr(cluster, "k", None))


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
