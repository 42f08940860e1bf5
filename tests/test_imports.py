"""The package's import graph, read from the source (ast, nothing imported): no circles, no report
layer, and the attention teaching path standing on its own.

Every `import` and `from ... import` counts, at module level and inside functions (a lazy import
is still a dependency). `from pkg import name` is an edge to `pkg.name` where that is a module,
else to `pkg` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cs336_systems"
ATTENTION = f"{PACKAGE}.attention"
# Beside the teaching path: the speed work and the benchmarks that time both.
BESIDE_TEACHING = (f"{ATTENTION}.fast", f"{ATTENTION}.benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def imported_names(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module name `name` imports (internal ones resolved to a known module)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package that holds this module, `level - 1` up
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return out


def internal(target: str, known: set[str]) -> str | None:
    """The known module `target` names (itself or its longest known prefix), or None if external."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:n])) in known:
            return candidate
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {t for t in (internal(i, known) for i in imported_names(name, path, known))
                   if t is not None and t != name}
            for name, path in mods.items()}


@pytest.fixture(scope="module")
def raw_imports() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported_names(name, path, set(mods)) for name, path in mods.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_imports_at_every_level(graph):
    # function-level imports count: the api imports the Functions only when called
    assert f"{ATTENTION}.flash_triton" in graph[f"{ATTENTION}.api"]
    # `from . import x` is an edge to the module x
    assert f"{ATTENTION}.flash_launch" in graph[f"{ATTENTION}.fast.launch"]


def test_a_circle_is_found():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"], ["d"]]


def test_no_import_circle_in_the_package(graph):
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, f"modules that import each other: {circles}"


def test_the_package_never_imports_the_report_layer(raw_imports):
    bad = {m: sorted(i for i in imports if i == "report" or i.startswith("report."))
           for m, imports in raw_imports.items()}
    assert not {m: i for m, i in bad.items() if i}, "cs336_systems renders nothing: the report layer imports it, not back"


def test_the_attention_teaching_path_never_imports_the_work_beside_it(graph):
    teaching = [m for m in graph if m.startswith(ATTENTION) and not m.startswith(BESIDE_TEACHING)]
    assert f"{ATTENTION}.flash_triton" in teaching and f"{ATTENTION}.fast.launch" not in teaching
    bad = {m: sorted(t for t in graph[m] if t.startswith(BESIDE_TEACHING)) for m in teaching}
    assert not {m: t for m, t in bad.items() if t}


def test_the_speed_work_never_imports_the_benchmarks(graph):
    bad = {m: sorted(t for t in targets if t.startswith(f"{ATTENTION}.benchmarks"))
           for m, targets in graph.items() if m.startswith(f"{ATTENTION}.fast")}
    assert not {m: t for m, t in bad.items() if t}
