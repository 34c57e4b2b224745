"""hub-export: Hugging Face causal LMs -> verified ExecuTorch ``.pte`` files on the Hub.

The pipeline, one module a stage: :mod:`~hub_export.source` -> :mod:`~hub_export.wrap`
-> :mod:`~hub_export.quantize` -> :mod:`~hub_export.lower` -> :mod:`~hub_export.verify`
-> :mod:`~hub_export.card` -> :mod:`~hub_export.publish`. The CLI and the Space are thin
layers over the functions below.

Example:
    >>> import hub_export
    >>> manifest = hub_export.export("HuggingFaceTB/SmolLM2-135M", "out", qmodes=["8da4w"], max_seq_len=256)
    >>> hub_export.push(from_dir="out", repo_id="me/SmolLM2-135M-ExecuTorch")
    >>> folder = hub_export.pull("me/SmolLM2-135M-ExecuTorch", variant="8da4w")
    >>> hub_export.generate(folder / "model-8da4w.pte", folder, "Once upon a time").text

Heavy dependencies (torch, executorch) load on first use, so ``import hub_export``
and ``hub-export --help`` stay fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import HubExportError, HubError, InputError, SourceError, VerificationError

__version__ = "0.1.0"

_LAZY = {
    "export": ("export", "export"),
    "ExportOptions": ("export", "ExportOptions"),
    "read_manifest": ("export", "read_manifest"),
    "Manifest": ("manifest", "Manifest"),
    "Variant": ("manifest", "Variant"),
    "generate": ("generate", "generate"),
    "GenerationResult": ("generate", "GenerationResult"),
    "push": ("publish", "push"),
    "pull": ("publish", "pull"),
    "list_variants": ("publish", "list_variants"),
    "render_card": ("card", "render_card"),
    "QMODES": ("quantize", "QMODES"),
    "FAMILIES": ("archs", "FAMILIES"),
}

if TYPE_CHECKING:  # pragma: no cover
    from .archs import FAMILIES
    from .card import render_card
    from .export import ExportOptions, export, read_manifest
    from .generate import GenerationResult, generate
    from .manifest import Manifest, Variant
    from .publish import list_variants, pull, push
    from .quantize import QMODES


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'hub_export' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    value = getattr(import_module(f".{module_name}", __name__), attribute)
    globals()[name] = value
    return value


__all__ = [*_LAZY, "HubExportError", "HubError", "InputError", "SourceError", "VerificationError", "__version__"]
