"""The package's modules import one another without a circle.

A circle at module level works only by import order: whichever module of it is imported
first sees the others half-built, so moving one import line can break the package at
start-up. The graph is read from the source (``ast``), not from ``sys.modules``: an edge
is a top-level ``import``/``from ... import`` of a package module, wherever it sits at
module level (``try``, ``if``), except under ``if TYPE_CHECKING:`` (never run) and inside
functions and classes' methods (run late, when every module is whole). ``from pkg import
name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. Importing
``a.b`` also runs ``a/__init__.py``, but Python finds a package in ``sys.modules`` while
its ``__init__`` runs, so parent packages are not counted as edges.

The package has no circle: the test fails on the first one that appears, naming its
modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import langgraph_idem_saver

PACKAGE = Path(langgraph_idem_saver.__file__).parent
NAME = "langgraph_idem_saver"

# The shared saver code and the import of LangGraph's tables never name a backend, at
# any level (not in a function, not for type checking): each backend hands its reader of
# LangGraph's tables through ``IdemSaverBase._langgraph_tables``.
BACKEND_FREE = ("saver_base", "ledger_policy", "import_langgraph", "import_copy")

# The engine's helpers see it through ``engine.context`` (an ``EngineContext`` the engine
# builds once), never the engine itself: not at run time, not for type checking.
ENGINE_HELPERS = (
    "engine.adoption",
    "engine.unknown",
    "engine.earlier",
    "engine.nested",
    "engine.outcomes",
    "middleware_calls",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run when the module is imported (not in functions or
    classes, not under ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block)
            for handler in node.handlers:
                yield from _module_level(handler.body)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from _module_level(node.body)


def imports_of(name: str, path: Path, known: set[str], *, everywhere: bool = False) -> set[str]:
    """The package modules ``name`` imports at module level (``everywhere``: at any
    level, in functions and under ``if TYPE_CHECKING:`` too)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    statements = (
        [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        if everywhere
        else _module_level(tree.body)
    )
    for node in statements:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
            continue
        if node.level:
            base = name.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:
            if f"{source}.{alias.name}" in known:
                found.add(f"{source}.{alias.name}")
            elif source in known:
                found.add(source)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
    return out


def test_the_graph_is_read() -> None:
    """The reader sees the edges it must (else "no circle" would prove nothing)."""
    graph = import_graph()
    assert f"{NAME}.saver_codec" in graph[f"{NAME}.list_deltas"]  # from a.b import c
    assert f"{NAME}.sqlite.sql" in graph[f"{NAME}.sqlite.saver"]  # from a import b
    assert f"{NAME}.sqlite.host" in graph[f"{NAME}.sqlite.import_sql"]
    # ``everywhere`` adds what runs late: an import in a function, or only for mypy
    files = modules()
    late = f"{NAME}.cli.commands.maintain"
    assert f"{NAME}.saver_base" not in graph[late]
    assert f"{NAME}.saver_base" in imports_of(late, files[late], set(files), everywhere=True)


def test_circles_are_found() -> None:
    """The control: a circle made on purpose is found, whole; a chain is not one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve(tmp_path: Path) -> None:
    """``from . import x`` in a package's ``__init__`` and in a module name the right
    modules."""
    known = {f"{NAME}.sub", f"{NAME}.sub.x", f"{NAME}.sub.y", f"{NAME}.top"}
    init = tmp_path / "__init__.py"
    init.write_text("from . import x\nfrom ..top import thing\n")
    mod = tmp_path / "y.py"
    mod.write_text(
        "from .x import f\nif TYPE_CHECKING:\n    from .. import top\ndef g():\n"
        "    from .. import top\n"
    )
    assert imports_of(f"{NAME}.sub", init, known) == {f"{NAME}.sub.x", f"{NAME}.top"}
    assert imports_of(f"{NAME}.sub.y", mod, known) == {f"{NAME}.sub.x"}


def imported_anywhere_by(module: str) -> set[str]:
    """The package's modules ``module`` imports, at module level or inside functions."""
    found = modules()
    name = f"{NAME}.{module}"
    return imports_of(name, found[name], set(found), everywhere=True)


def test_no_import_circle() -> None:
    found = [sorted(c) for c in circles(import_graph())]
    assert not found, f"import circle(s) at module level: {found}"


@pytest.mark.parametrize("module", BACKEND_FREE)
def test_the_shared_saver_code_names_no_backend(module: str) -> None:
    imported = imported_anywhere_by(module)
    backends = sorted(m for m in imported if m.startswith((f"{NAME}.sqlite", f"{NAME}.postgres")))
    assert not backends, f"{module} imports {backends}"
    text = modules()[f"{NAME}.{module}"].read_text(encoding="utf-8")
    assert "isinstance(saver, Async" not in text and ".__module__" not in text


# The Postgres SQL text (statements, the functions migrations create, the migrations)
# and the pure helpers it is built with: none reaches a runtime module, so the
# migrations sit below ``connection.py``, which runs them.
PG_SQL_TEXT = ("sql", "tuple_sql", "ledger_sql", "delta_history_sql", "migrations")
PG_TEXT_HELPERS = ("functions", "blob_chain")


def reached_from(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen - {start}


@pytest.mark.parametrize("module", PG_SQL_TEXT)
def test_postgres_sql_text_imports_no_runtime_module(module: str) -> None:
    prefix = f"{NAME}.postgres."
    reached = reached_from(import_graph(), prefix + module)
    runtime = sorted(
        m
        for m in reached
        if m.startswith(prefix) and m.removeprefix(prefix) not in PG_SQL_TEXT + PG_TEXT_HELPERS
    )
    assert not runtime, f"postgres.{module} reaches {runtime}"


@pytest.mark.parametrize("module", ENGINE_HELPERS)
def test_the_engine_helpers_never_import_the_engine(module: str) -> None:
    imported = imported_anywhere_by(module)
    assert f"{NAME}.engine.core" not in imported, f"{module} imports engine.core"
    assert f"{NAME}.engine" not in imported, f"{module} imports the engine package"
