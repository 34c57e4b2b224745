"""Every use of another library's private API goes through hub_export/patches.py, where it is declared with the
versions it was written for and what happens without it: that file is the one to check on an upgrade."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = {
    "torch",
    "executorch",
    "torchao",
    "transformers",
    "huggingface_hub",
    "ray",
    "gradio",
    "tokenizers",
    "accelerate",
    "gguf",
    "typer",
    "click",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
}
CONTRACT = ROOT / "hub_export" / "patches.py"
# Underscored names their libraries document as public API.
DOCUMENTED = {
    "torch._logging": "https://pytorch.org/docs/stable/logging.html",
    "torch._logging.set_logs": "https://pytorch.org/docs/stable/logging.html",
    "torch._check": "https://pytorch.org/docs/stable/generated/torch._check.html",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every private name of an upstream library that ``source`` imports, reads or passes."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the upstream module or object it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UPSTREAM:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.asname and alias.name or alias.name.split(".")[0]
                    )
                    if any(_private(part) for part in alias.name.split(".")) and alias.name not in DOCUMENTED:
                        found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in UPSTREAM:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                if any(_private(part) for part in full.split(".")):
                    found.append((node.lineno, full))
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # a whole chain: a.b._c.d
            dotted = _dotted(node)
            root = dotted.split(".")[0] if dotted else None
            if root in aliases and any(_private(part) for part in dotted.split(".")[1:]):
                full = ".".join([aliases[root], *dotted.split(".")[1:]])
                if full not in DOCUMENTED:
                    found.append((node.lineno, full))
        elif isinstance(node, ast.Call):
            callee = _dotted(node.func)
            if callee and callee.split(".")[0] in aliases:
                found += [
                    (node.lineno, f"{aliases[callee.split('.')[0]]}...({kw.arg}=)")
                    for kw in node.keywords
                    if kw.arg and _private(kw.arg)
                ]
    return sorted(set(found))


def _project_files() -> list[Path]:
    return [
        path
        for folder in ("hub_export", "space", "scripts")
        for path in (ROOT / folder).rglob("*.py")
        if path != CONTRACT
    ]


def test_private_upstream_apis_are_used_only_in_the_patches_contract() -> None:
    uses = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in _project_files()
        for line, name in private_uses(path.read_text())
    ]
    assert uses == [], "route these through hub_export/patches.py (declared, version-guarded) or use a public API"


def test_the_scan_finds_each_kind_of_private_use() -> None:
    source = """
import ray
import torch._dynamo
from executorch.extension.pybindings._C import _load_for_executorch
from executorch.exir import EdgeCompileConfig
from huggingface_hub.utils.sha import git_hash as gh
attempt = ray._private.worker.global_worker
config = EdgeCompileConfig(_check_ir_validity=False)
ok = torch._logging.set_logs
"""
    assert private_uses(source) == [
        (3, "torch._dynamo"),
        (4, "executorch.extension.pybindings._C._load_for_executorch"),
        (7, "ray._private.worker.global_worker"),
        (8, "executorch.exir.EdgeCompileConfig...(_check_ir_validity=)"),
    ]  # git_hash is public in a public module; torch._logging.set_logs is documented
