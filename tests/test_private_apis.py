"""Every use of another library's private API goes through hub_export/patches/, where it is declared with the
versions it was written for and what happens without it: that folder is the one to check on an upgrade.

The scan reads the source with ``ast``: imports, attribute chains, keyword arguments, ``getattr``-style
calls and dotted-path strings (``importlib.import_module``, mock targets) that name a private part of an
upstream package. Project modules keep their own private names to themselves as well.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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
PROJECT = {"hub_export", "space"}
CONTRACT = ROOT / "hub_export" / "patches"
# Underscored names their libraries document as public API.
DOCUMENTED = {
    "torch._logging": "https://pytorch.org/docs/stable/logging.html",
    "torch._logging.set_logs": "https://pytorch.org/docs/stable/logging.html",
    "torch._check": "https://pytorch.org/docs/stable/generated/torch._check.html",
}
ATTRIBUTE_BUILTINS = {"getattr", "hasattr", "setattr", "delattr"}
DOTTED_UPSTREAM_PATH = re.compile(rf"(?:{'|'.join(sorted(UPSTREAM))})(?:\.\w+)+")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _has_private_part(dotted: str) -> bool:
    return any(_private(part) for part in dotted.split(".")[1:]) and dotted not in DOCUMENTED


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _from_path(node: ast.ImportFrom, name: str) -> str:
    """The dotted path ``from ... import name`` names, relative ones with their leading dots."""
    return "." * node.level + ".".join(part for part in (node.module, name) if part)


def _imported_names(tree: ast.AST, packages: set[str], relative: bool = False) -> dict[str, str]:
    """Local name -> the dotted path it stands for, for every import of ``packages`` (and relative ones if asked)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in packages:
                    # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``.
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom):
            if (node.level == 0 and (node.module or "").split(".")[0] in packages) or (node.level > 0 and relative):
                names.update({alias.asname or alias.name: _from_path(node, alias.name) for alias in node.names})
    return names


def _in_full(dotted: str, names: dict[str, str]) -> str | None:
    """``dotted`` with its first part replaced by the path it was imported as, or None when it is not imported."""
    root, _, rest = dotted.partition(".")
    if root not in names:
        return None
    return f"{names[root]}.{rest}" if rest else names[root]


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every private name of an upstream library that ``source`` imports, reads or passes."""
    tree = ast.parse(source)
    names = _imported_names(tree, UPSTREAM)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name)
                for alias in node.names
                if alias.name.split(".")[0] in UPSTREAM and _has_private_part(alias.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in UPSTREAM:
            found += [
                (node.lineno, f"{node.module}.{alias.name}")
                for alias in node.names
                if _has_private_part(f"{node.module}.{alias.name}")
            ]
    chained = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in chained:  # a whole chain: a.b._c.d
            full = _in_full(_dotted(node) or "", names)
            if full and _has_private_part(full):
                found.append((node.lineno, full))
        elif isinstance(node, ast.Call):
            callee = _in_full(_dotted(node.func) or "", names)
            if callee:
                found += [
                    (node.lineno, f"{callee}(...{kw.arg}=)") for kw in node.keywords if kw.arg and _private(kw.arg)
                ]
            if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BUILTINS and len(node.args) > 1:
                owner, attribute = _in_full(_dotted(node.args[0]) or "", names), node.args[1]
                if owner and isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                    if _has_private_part(f"{owner}.{attribute.value}"):
                        found.append((node.lineno, f"{owner}.{attribute.value}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if DOTTED_UPSTREAM_PATH.fullmatch(node.value) and _has_private_part(node.value):
                found.append((node.lineno, node.value))
    return sorted(set(found))


def sibling_private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private name of another project module that ``source`` imports or reads."""
    tree = ast.parse(source)
    names = _imported_names(tree, PROJECT, relative=True)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] in PROJECT):
            found += [(node.lineno, _from_path(node, alias.name)) for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
            if _private(node.attr):
                found.append((node.lineno, f"{names[node.value.id]}.{node.attr}"))
    return sorted(set(found))


def _project_files() -> list[Path]:
    return sorted(path for folder in ("hub_export", "space", "scripts") for path in (ROOT / folder).rglob("*.py"))


def test_private_upstream_apis_are_used_only_in_the_patches_contract() -> None:
    uses = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in _project_files()
        if CONTRACT not in path.parents
        for line, name in private_uses(path.read_text())
    ]
    assert not uses, "route these through hub_export/patches/ (declared, version-guarded) or use a public API:\n" + (
        "\n".join(uses)
    )


def test_project_modules_use_only_each_others_public_names() -> None:
    uses = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in _project_files()
        for line, name in sibling_private_uses(path.read_text())
    ]
    assert not uses, "make these public in their module, or give it a public function that does the job:\n" + (
        "\n".join(uses)
    )


def test_the_scan_finds_each_kind_of_private_use() -> None:
    source = """
import importlib
import ray
import torch._dynamo
from executorch.extension.pybindings._C import _load_for_executorch
from executorch.exir import EdgeCompileConfig
from huggingface_hub.utils.sha import git_hash as gh
from torch._logging import set_logs
attempt = ray._private.worker.global_worker
config = EdgeCompileConfig(_check_ir_validity=False)
ok = torch._logging.set_logs
viewer = getattr(torch.fx.passes.infra.partitioner, "_DependencyViewer")
traced = importlib.import_module("torch._dynamo.functional_export")
public = getattr(torch, "nn"), "torch.nn.functional", "see torch._dynamo for more"
"""
    assert private_uses(source) == [
        (4, "torch._dynamo"),
        (5, "executorch.extension.pybindings._C._load_for_executorch"),
        (9, "ray._private.worker.global_worker"),
        (10, "executorch.exir.EdgeCompileConfig(..._check_ir_validity=)"),
        (12, "torch.fx.passes.infra.partitioner._DependencyViewer"),
        (13, "torch._dynamo.functional_export"),
    ]  # git_hash is public in a public module; torch._logging is documented; prose is not a path


def test_the_scan_finds_a_module_reaching_into_anothers_private_names() -> None:
    source = """
from . import quantize
from .errors import InputError
from .quantize import _granularity, QMODES
from hub_export.pipeline import calibrate as measure
config = quantize._dynamic_act(4)(quantize.DEFAULT_GROUP_SIZE)
rows = measure._layer_rows
fine = quantize.dynamic_activation_config(4, 32), self._own
"""
    assert sibling_private_uses(source) == [
        (4, ".quantize._granularity"),
        (6, ".quantize._dynamic_act"),
        (7, "hub_export.pipeline.calibrate._layer_rows"),
    ]


@pytest.fixture
def upgraded(monkeypatch):
    """Every package looks like a version the patches were not written for."""
    from hub_export import patches

    monkeypatch.setattr(patches, "_version", lambda package: "9.9.9")
    monkeypatch.setattr(patches, "_announced", set())
    return patches


def test_the_private_settings_apply_on_the_versions_they_were_written_for() -> None:
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig

    from hub_export import patches

    config = patches.edge_compile_config()
    assert (config._check_ir_validity, config._skip_dim_order) == (False, True)
    configs = patches.xnnpack_partitioner_configs()
    assert len(configs) == len(ALL_PARTITIONER_CONFIGS) and LinearConfig not in configs
    assert [c for c in configs if c not in ALL_PARTITIONER_CONFIGS][0].__bases__ == (LinearConfig,)
    assert patches.ray_task_attempt() is None  # outside a Ray task


def test_on_other_versions_the_private_settings_give_way_to_the_stock_ones(upgraded, caplog) -> None:
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.exir import EdgeCompileConfig

    with caplog.at_level("WARNING", logger="hub_export.patches"):
        for _ in range(2):
            assert upgraded.edge_compile_config() == EdgeCompileConfig()
            assert upgraded.xnnpack_partitioner_configs() == list(ALL_PARTITIONER_CONFIGS)
            assert upgraded.ray_task_attempt() is None
    warnings = [record.getMessage() for record in caplog.records if record.name == "hub_export.patches"]
    assert len(warnings) == 3  # once each, with what the user gets instead
    assert all("9.9.9" in warning for warning in warnings)
    for patch in (upgraded.EDGE_SETTINGS, upgraded.WEIGHT_ONLY_LINEARS, upgraded.RAY_ATTEMPTS):
        assert sum(patch.name in warning and patch.without in warning for warning in warnings) == 1
