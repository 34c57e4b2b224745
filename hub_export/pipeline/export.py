"""Export: source -> wrap -> quantize -> lower -> verify, into one output folder.

The source is prepared once (:mod:`hub_export.pipeline.prepare`) and every variant starts from
its unquantized weights. An engine (:mod:`hub_export.pipeline.engines`) does the work: on this
machine, one variant after another or several at once in worker processes, or on a
Ray cluster. Output is written to a hidden sibling folder and moved into place only
when every variant has passed, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.errors import InputError, SourceError, opt
from hub_export.hub.source_card import declared_source as checked
from hub_export.options import DEFAULT_QUALITY_TOKENS, ExportOptions, options_with, variant_filename
from hub_export.pipeline import quantize
from hub_export.pipeline.engines import LocalEngine
from hub_export.pipeline.manifest import Manifest, machine_description, package_versions
from hub_export.pipeline.prepare import SourceRequest
from hub_export.progress import Callback, Tracker, tracker

if TYPE_CHECKING:
    from hub_export.pipeline.engines import Engine

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _declared_source(
    source: str, options: ExportOptions, token: str | None = None, endpoint: str | None = None
) -> dict[str, str]:
    """The checked ``--base-model``/``--license``/``--model-name`` of an export, for its source record.

    ``--base-model`` is for what hub-export cannot identify (a local folder, a GGUF file):
    a Hub repo of safetensors is its own base model, and naming another would mislabel it.
    """

    declared = checked(options.base_model, options.license, options.model_name)
    is_local = Path(source).expanduser().exists()
    is_gguf = options.gguf_file is not None or source.endswith(".gguf")
    # An adapter's --base-model is the base it is merged into (a Hub adapter's own base otherwise).
    if "base_model" in declared and not (
        is_local or is_gguf or options.adapter or _is_hub_adapter(source, options, token, endpoint)
    ):
        raise InputError(
            f"{opt('base_model')} is for local folders and GGUF files; {source} is a Hub repo, which the card links as its "
            f"base model already: drop {opt('base_model')}",
            param="base_model",
        )
    return declared


def _is_hub_adapter(source: str, options: ExportOptions, token: str | None, endpoint: str | None) -> bool:
    from hub_export.pipeline.source import is_adapter  # a Hub call: made only when --base-model needs it

    try:
        return is_adapter(source, options.revision, token, endpoint)
    except SourceError:  # a Hub out of reach cannot tell; the refusal below stands
        return False


def _adapter_base(record: dict) -> dict[str, str]:
    adapter = record.get("adapter")
    return {"base_model": adapter["base"]} if adapter and not adapter.get("base_local") else {}


def _check_output(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise InputError(f"{output_dir} is not empty; choose another {opt('output')} or pass {opt('overwrite')}")


def _staging_folder(output_dir: Path) -> Path:
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))


def _publish_folder(workdir: Path, output_dir: Path) -> None:
    if output_dir.exists():
        shutil.rmtree(output_dir)
    workdir.rename(output_dir)


# Over 60 lines for its docstring only: the public entry point documents every argument and what it raises.
def export(
    source: str,
    output_dir: str | Path,
    options: ExportOptions | None = None,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    overwrite: bool = False,
    cache_dir: str | Path | None = None,
    command: str | None = None,
    progress: Callback | Tracker | None = None,
    engine: Engine | None = None,
    **option_values: Any,
) -> Manifest:
    """Export ``source`` to verified ExecuTorch ``.pte`` variants in ``output_dir``.

    What to build is an :class:`~hub_export.options.ExportOptions`, given whole as
    ``options`` or field by field as keywords (``qmodes=["8da4w"]``); keywords given
    beside ``options`` replace its fields. ``jobs`` is how many variants are built at
    once, each in its own process; ``share_embeddings`` stores a tied embedding table
    once, in a ``.ptd`` data file per variant; ``quality_tokens`` is how many tokens of
    the shipped English evaluation text each variant is scored on (0: off);
    ``gguf_file`` reads the weights from that ``.gguf``; ``base_model``, ``license`` and
    ``model_name`` say what a local or GGUF source is, for the card. ``token``,
    ``endpoint`` and ``cache_dir`` say where the source comes from; ``progress``
    receives a :class:`~hub_export.progress.ProgressEvent` (a ``str``) per stage;
    ``engine`` is where the work runs (:mod:`hub_export.pipeline.engines`: this machine by
    default, or a Ray cluster), with byte-identical files either way.

    Example:
        >>> manifest = export("HuggingFaceTB/SmolLM2-135M", "out", qmodes=["8da4w", "fp32"], max_seq_len=256)
        >>> [v.file for v in manifest.variants]
        ['model-8da4w.pte', 'model-fp32.pte']

    Raises:
        InputError: bad options, or ``output_dir`` is not empty without ``overwrite``.
        SourceError: the source cannot be fetched or read.
        HubError: a Hub request failed (access, a missing repo).
        VerificationError: a ``.pte`` does not match the eager model; nothing is written.
        ExportError: a variant could not be built (a worker died, out of memory).
        InternalError: a bug in hub-export (its traceback is saved in a log file).
    """
    options = options_with(options, option_values)
    declared = _declared_source(source, options, token, endpoint)
    say = tracker(progress, log.info)
    say.expect(_stage_count(options))
    output_dir = Path(output_dir)
    engine = engine or LocalEngine()
    request = SourceRequest(source, options, token, endpoint, cache_dir)
    _check_output(output_dir, overwrite)  # before any download
    prepared = engine.prepare(request, say)
    _check_output(output_dir, overwrite)
    workdir = _staging_folder(output_dir)
    try:
        variants = engine.build(prepared, request, workdir, say)
        for name, content in prepared.files.items():
            (workdir / name).write_bytes(content)
        manifest = Manifest(
            # what the exporter said the model is (--base-model, ...); a merged adapter's base is its base model
            source={**prepared.record, **_adapter_base(prepared.record), **declared},
            versions=package_versions(),
            variants=variants,
            command=command or options.command(_shown_source(source)),
            machine=machine_description(),
        )
        manifest.write(workdir)
        _publish_folder(workdir, output_dir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return manifest


def _stage_count(options: ExportOptions) -> int:
    """How many progress stages an export of ``options`` reports: source, calibration, then each variant's."""
    calibrated = options.gptq or (
        any(quantize.QMODES[mode].calibrated for mode in options.qmodes) and options.calibration
    )
    return (3 if options.verify else 2) + calibrated + (4 if options.verify else 3) * len(options.qmodes)


def _shown_source(source: str) -> str:
    """The source as the reproduce command names it: a local path by its last part only (no home folders)."""
    return source if not Path(source).expanduser().exists() else Path(source).name


def read_manifest(folder: str | Path) -> Manifest:
    """The :class:`Manifest` of an export folder.

    Raises:
        InputError: ``folder`` has no readable, valid ``manifest.json``.
    """
    return Manifest.read(Path(folder))


__all__ = ["export", "ExportOptions", "read_manifest", "variant_filename", "DEFAULT_QUALITY_TOKENS"]
