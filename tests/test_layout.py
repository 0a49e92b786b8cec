"""The package's layout as a graph of subpackage imports (issue: the house
before the new wing).

Every ``import`` / ``from ... import`` of a ``celeritas_cli`` module,
including the lazy ones inside functions (they are dependencies too), is an
edge from the importing subpackage (or top-level module: ``registry``,
``errors``, ``log``) to the imported one.  The graph must have no cycle,
``transform/`` (graph rewrites) may depend only on ``model/`` and the
top-level ``errors`` / ``log``, nothing below the CLI imports ``cli/``, and
every subpackage has a test folder ``tests/<subpackage>/``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "celeritas_cli"
TESTS = ROOT / "tests"


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """The module at *path*, parsed once per test session (every test here walks the same files)."""
    return ast.parse(path.read_text(), str(path))


def _unit(parts: list[str]) -> str:
    """Subpackage (or top-level module) a module path inside the package belongs to."""
    return parts[0].removesuffix(".py")


@functools.lru_cache(maxsize=None)
def import_graph(pkg: Path = PKG) -> nx.DiGraph:
    """Edges ``a -> b``: a module of subpackage ``a`` imports one of ``b`` (built once per session:
    the tests read it and never change it)."""
    graph = nx.DiGraph()
    for path in sorted(pkg.rglob("*.py")):
        rel = list(path.relative_to(pkg).parts)
        src = _unit(rel)
        graph.add_node(src)
        mod = [p.removesuffix(".py") for p in rel]
        is_init = mod[-1] == "__init__"
        if is_init:
            mod = mod[:-1]
        for node in ast.walk(_tree(path)):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod[: len(mod) - node.level + (1 if is_init else 0)]
                    if node.module:
                        targets.append(base + node.module.split("."))
                    else:
                        targets.extend(base + [a.name] for a in node.names)
                elif node.module and node.module.split(".")[0] == "celeritas_cli":
                    targets.append(node.module.split(".")[1:])
            elif isinstance(node, ast.Import):
                targets.extend(a.name.split(".")[1:] for a in node.names if a.name.startswith("celeritas_cli."))
            for t in targets:
                if t and _unit(t) not in (src, "__init__", "__version__"):
                    graph.add_edge(src, _unit(t), where=str(path.relative_to(pkg.parent)))
    return graph


def test_import_graph_has_no_cycle():
    graph = import_graph()
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "subpackage import cycles: " + "; ".join(
        " -> ".join(c + [c[0]]) + f" ({graph.edges[c[0], c[1 % len(c)]]['where']})" for c in cycles)


def test_transform_depends_only_on_the_model():
    graph = import_graph()
    assert "transform" in graph
    assert set(graph.successors("transform")) <= {"model", "errors", "log"}, {
        d: graph.edges["transform", d]["where"] for d in graph.successors("transform")}


def test_model_is_the_bottom_layer():
    graph = import_graph()
    assert set(graph.successors("model")) <= {"errors", "log"}


def test_nothing_below_the_cli_imports_it():
    graph = import_graph()
    users = {a for a in graph.predecessors("cli")} - {"__main__"}
    assert not users, users


#: module-level cycles inside one subpackage that are known and left to their owners
KNOWN_MODULE_CYCLES = [{"sim.bounds", "sim.simulator"}]


@functools.lru_cache(maxsize=None)
def module_import_graph(pkg: Path = PKG) -> nx.DiGraph:
    """Edges ``a -> b`` between modules (``run.api -> run.checks``), lazy
    imports included; package ``__init__`` modules are left out (they
    re-export their modules by design)."""
    mods = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = [p.removesuffix(".py") for p in path.relative_to(pkg).parts]
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, parts[-1] == "__init__")
    graph = nx.DiGraph()
    for name, (path, is_init) in mods.items():
        if is_init:
            continue
        here = name.split(".")[:-1]
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
                names = [".".join(base)] + [".".join(base + [a.name]) for a in node.names]
                for t in names:
                    if t in mods and not mods[t][1] and t != name:
                        graph.add_edge(name, t)
    return graph


def test_no_module_import_cycle():
    """No two modules import each other (``run.api`` and ``run.data_parallel``
    did, issue 26), except the known ones listed above."""
    cycles = [set(c) for c in nx.simple_cycles(module_import_graph())]
    assert [c for c in cycles if c not in KNOWN_MODULE_CYCLES] == []


def test_every_subpackage_has_tests():
    subpackages = sorted(p.name for p in PKG.iterdir()
                         if p.is_dir() and (p / "__init__.py").exists())
    missing = [name for name in subpackages
               if not any((TESTS / name).glob("test_*.py"))]
    assert subpackages and not missing, f"subpackages without tests/<name>/test_*.py: {missing}"


def test_the_checker_sees_a_cycle(tmp_path):
    """The graph builder is not blind: a two-package cycle through a lazy import is found."""
    pkg = tmp_path / "celeritas_cli"
    for name, body in {"a": "def f():\n    from ..b import x\n", "b": "from ..a import y\n"}.items():
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
        (pkg / name / "m.py").write_text(body)
    graph = import_graph(pkg)
    assert sorted(map(sorted, nx.simple_cycles(graph))) == [["a", "b"]]
