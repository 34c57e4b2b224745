"""Rules of the code's shape that a reader relies on: checked, so they stay true.

- ``errors.py`` is a leaf: every module can raise without importing the rest.
- No import cycle between the package's modules, counting imports inside functions.
- A sibling imported inside a function says why beside it (start-up time, torch kept out).
- No function over 60 lines unless a comment right above it says why.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hub_export"
MAX_FUNCTION_LINES = 60
LONG_FUNCTION_REASON = "Over 60 lines"


def _modules() -> dict[str, Path]:
    return {path.stem: path for path in PACKAGE.glob("*.py") if path.stem != "__init__"}


def _sibling_imports(tree: ast.AST, modules: dict[str, Path]) -> list[tuple[ast.AST, str]]:
    """Every import of a module of the package in ``tree``: (the import node, the module's name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hub_export."):
            names = [node.module.split(".")[1]]
        else:
            continue
        found += [(node, name) for name in names if name in modules]
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {target for _, target in _sibling_imports(ast.parse(path.read_text()), modules) if target != name}
        for name, path in modules.items()
    }


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack = [(start, [start])]
    while stack:
        node, path = stack.pop()
        for target in sorted(graph[node]):
            if target == start:
                return [*path, start]
            if target not in path:
                stack.append((target, [*path, target]))
    return None


def test_errors_is_a_leaf() -> None:
    assert _import_graph()["errors"] == set()


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    graph = _import_graph()
    cycles = [cycle for name in graph if (cycle := _cycle_from(name, graph))]
    assert cycles == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle_from("a", {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle_from("a", {"a": {"b"}, "b": set()}) is None


def _functions(tree: ast.AST):
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_siblings_imported_inside_a_function_say_why() -> None:
    modules = _modules()
    unexplained = []
    for path in modules.values():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            for node, target in _sibling_imports(function, modules):
                # The reason: a comment on the import's line, or in the lines between the
                # function's start (its docstring) and the import.
                above = lines[max(function.lineno, node.lineno - 4) - 1 : node.end_lineno]
                if not any("#" in line for line in above):
                    unexplained.append(f"{path.name}:{node.lineno} {function.name} imports {target}")
    assert unexplained == []


def test_no_function_over_60_lines_without_a_reason() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in _functions(ast.parse(path.read_text())):
            first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
            length = function.end_lineno - function.lineno + 1
            if length > MAX_FUNCTION_LINES and LONG_FUNCTION_REASON not in lines[first - 2]:
                too_long.append(
                    f"{path.relative_to(PACKAGE.parent)}:{function.lineno} {function.name} ({length} lines)"
                )
    assert too_long == []
