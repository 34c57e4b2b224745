"""Rules of the code's shape that a reader relies on: checked, so they stay true.

- The package's top shows the product: ``pipeline/``, ``tasks/`` (one folder per task, each with the
  module that exports its model and the one that runs its file), ``hub/``, ``runtime/``, ``cli/``
  (one module per verb), ``models/``, and a few shared leaves; no module over 600 lines.
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
    """Every module of the package by dotted name below ``hub_export`` (``pipeline.gptq``; a package by its folder)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            modules[".".join(parts)] = path
    return modules


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sibling_imports(tree: ast.AST, modules: dict[str, Path], importer: str = "") -> list[tuple[ast.AST, str]]:
    """Every import of a module of the package in ``tree`` (written in ``importer``): (the import node, the
    module's dotted name). ``from hub_export.pipeline import gptq`` imports ``pipeline.gptq``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:  # relative: from the importer's package, one folder up per extra dot
            package = importer.split(".")
            if modules.get(importer, PACKAGE).name != "__init__.py":
                package = package[:-1]
            base = package[: len(package) - node.level + 1]
            prefix = ".".join([*base, node.module] if node.module else base)
        elif (node.module or "").startswith("hub_export."):
            prefix = node.module.removeprefix("hub_export.")
        elif node.module == "hub_export":
            prefix = ""
        else:
            continue
        for alias in node.names:
            candidate = f"{prefix}.{alias.name}" if prefix else alias.name
            target = candidate if candidate in modules else prefix
            if target in modules:
                found.append((node, target))
    return found


def _import_graph() -> dict[str, set[str]]:
    """Which modules each module imports; a package's ``__init__`` is not counted as imported by its own
    modules (Python runs it first either way, and ours hold only a docstring)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = {target for _, target in _sibling_imports(ast.parse(path.read_text()), modules, name)}
        graph[name] = {target for target in targets if target != name and not name.startswith(target + ".")}
    return graph


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


def _import_run(function: ast.AST, node: ast.AST) -> tuple[int, int]:
    """(first line, last line) of the consecutive import statements around ``node`` in its block."""
    for block in ast.walk(function):
        for field in ("body", "orelse", "finalbody", "handlers"):
            statements = getattr(block, field, None)
            if not isinstance(statements, list) or node not in statements:
                continue
            start = end = statements.index(node)
            while start > 0 and isinstance(statements[start - 1], (ast.Import, ast.ImportFrom)):
                start -= 1
            while end + 1 < len(statements) and isinstance(statements[end + 1], (ast.Import, ast.ImportFrom)):
                end += 1
            return statements[start].lineno, statements[end].end_lineno
    return node.lineno, node.end_lineno


def test_siblings_imported_inside_a_function_say_why() -> None:
    modules = _modules()
    unexplained = []
    for path in modules.values():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            for node, target in _sibling_imports(function, modules, _module_of(path)):
                # The reason: a comment in the run of imports that holds this one (sorted, the commented
                # line need not be the first), or in the lines between the function's start and the import.
                first, last = _import_run(function, node)
                above = lines[max(function.lineno, first - 4) - 1 : last]
                if not any("#" in line for line in above):
                    unexplained.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {function.name} imports {target}")
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


TOP_LEVEL = {
    "__init__.py", "errors.py", "options.py", "progress.py", "patches", "quiet.py", "redact.py", "bug_log.py",
    "service.py", "cli", "pipeline", "tasks", "hub", "runtime", "media", "models", "data",
}  # fmt: skip
MAX_MODULE_LINES = 600


def test_the_top_of_the_package_shows_the_product() -> None:
    """A new module goes into the folder of its idea; a new shared leaf is a decision, made here."""
    found = {path.name for path in PACKAGE.iterdir() if path.name != "__pycache__"}
    assert found == TOP_LEVEL


def test_each_task_folder_holds_how_its_model_is_exported_and_how_its_file_is_run() -> None:
    from hub_export.tasks.registry import TASKS

    for task in TASKS.values():
        if task.module is None:  # the decoder: text generation
            folder = PACKAGE / "tasks" / "text_generation"
        else:
            folder = PACKAGE / "tasks" / task.module.split(".")[0]
        assert (folder / "export.py").is_file(), folder
        assert (folder / "run.py").is_file() or (folder / "runner_probe.py").is_file(), folder


def test_every_package_folder_is_installed() -> None:
    """pyproject lists the packages by name: a folder it forgets works here and is missing from the wheel."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        "hub_export" + "".join("." + part for part in init.parent.relative_to(PACKAGE).parts)
        for init in PACKAGE.rglob("__init__.py")
    }
    assert folders <= listed


def test_no_module_over_600_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE)} ({count} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []
