"""hub-export: Hugging Face language models and encoders -> verified ExecuTorch ``.pte`` files on the Hub.

The pipeline, one module a stage: :mod:`~hub_export.pipeline.source` -> (:mod:`~hub_export.pipeline.calibrate`)
-> :mod:`~hub_export.tasks.text_generation.export` -> :mod:`~hub_export.pipeline.quantize` -> :mod:`~hub_export.pipeline.lower` ->
:mod:`~hub_export.pipeline.verify` -> :mod:`~hub_export.hub.card` -> :mod:`~hub_export.push` (:mod:`~hub_export.pull` back). What to
build is one :class:`ExportOptions`; :mod:`~hub_export.pipeline.build` makes one variant of it. The
CLI, and the Space through :mod:`~hub_export.service`, are thin layers over the functions below.

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

from hub_export.errors import (
    ExportError,
    HubError,
    HubExportError,
    InputError,
    InternalError,
    SourceError,
    VerificationError,
)
from hub_export.hub.card import render_card
from hub_export.hub.pull import list_variants, pull
from hub_export.hub.push import push
from hub_export.options import ExportOptions
from hub_export.pipeline.export import export, read_manifest
from hub_export.pipeline.manifest import Manifest, Variant
from hub_export.pipeline.quantize import QMODES
from hub_export.progress import ProgressEvent
from hub_export.runtime.process_env import prepare_pte_process

# Verbs live in modules of the same name (mlx-lm style). Binding the functions here,
# after their modules are imported, keeps `hub_export.export` the function even once
# `hub_export.export` the module is loaded. These modules import torch lazily.
from hub_export.tasks.archs import FAMILIES
from hub_export.tasks.fill_mask.run import FillMaskResult, fill_mask
from hub_export.tasks.image_classification.run import ClassifyResult, classify
from hub_export.tasks.sentence_embeddings.run import EmbedResult, embed
from hub_export.tasks.speech.run import TranscribedWindow, TranscriptionResult, stream_transcribe, transcribe
from hub_export.tasks.text_generation.run import (
    GenerationResponse,
    GenerationResult,
    Sampling,
    Speculation,
    generate,
    stream_generate,
)

__version__ = "0.1.0"

__all__ = [
    "export",
    "ExportOptions",
    "ProgressEvent",
    "read_manifest",
    "Manifest",
    "Variant",
    "generate",
    "stream_generate",
    "embed",
    "EmbedResult",
    "fill_mask",
    "FillMaskResult",
    "classify",
    "ClassifyResult",
    "transcribe",
    "TranscriptionResult",
    "stream_transcribe",
    "TranscribedWindow",
    "prepare_pte_process",
    "GenerationResponse",
    "Sampling",
    "Speculation",
    "GenerationResult",
    "push",
    "pull",
    "list_variants",
    "render_card",
    "QMODES",
    "FAMILIES",
    "ExportError",
    "HubExportError",
    "HubError",
    "InputError",
    "InternalError",
    "SourceError",
    "VerificationError",
    "__version__",
]
