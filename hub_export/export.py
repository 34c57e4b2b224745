"""Export: source -> wrap -> quantize -> lower -> verify, into one output folder.

The source is downloaded once and every variant starts from its unquantized weights.
Variants are built one after another in this process, or, when there are several and
the machine has the cores and memory, several at once in worker processes
(:mod:`hub_export.workers`) that each map the same checkpoint. Output is written to a
hidden sibling folder and moved into place only when every variant has passed, so a
failed run leaves nothing behind.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from . import archs, quantize, source as source_stage
from .build import RunState, build_variant, load_model, token_ids
from .errors import InputError, opt
from .manifest import Manifest, machine_description, package_versions
from .options import DEFAULT_QUALITY_TOKENS, ExportOptions, options_with, variant_filename
from .patches import map_large_allocations, release_memory
from .progress import Callback, Tracker, tracker
from .workers import VariantJob, export_in_workers, usable_cpus, worker_count

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048
COPIED_FILES = source_stage.CONFIG_FILES + source_stage.TOKENIZER_FILES

Progress = Callable[[str], None]


def _max_positions(config: dict) -> int | None:
    text = config.get("text_config", config)
    return text.get("max_position_embeddings") or text.get("n_positions")


def resolve_max_seq_len(config: dict, requested: int | None) -> int:
    """``requested`` checked against the model's limit, or a phone-friendly default."""
    limit = _max_positions(config)
    if requested is None:
        return min(limit or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    if limit and requested > limit:
        raise InputError(f"{opt('max_seq_len')} {requested} is above the model's limit of {limit} positions", param="max_seq_len")
    return requested


def _libraries_quiet() -> bool:
    """Whether the caller silenced the frameworks' warnings (the CLI does); workers follow suit."""
    return logging.getLogger("torch").getEffectiveLevel() >= logging.ERROR


def _copy_source_files(src: source_stage.Source, workdir: Path) -> None:
    for name in COPIED_FILES:
        if (src.path / name).is_file():
            shutil.copyfile(src.path / name, workdir / name)


def _source_record(src: source_stage.Source, model, declared: dict | None = None) -> dict:
    record = {
        "id": src.name,
        "revision": src.revision,
        "local": src.is_local,
        "model_type": src.model_type,
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    if src.gguf:
        record["gguf"] = dict(src.gguf)
    record["fingerprint"] = source_stage.fingerprint(src)
    from .generate import chat_template

    record["chat_template"] = chat_template(src.path) is not None
    record.update(declared or {})  # what the exporter said the model is (--base-model, --license, --model-name)
    return record


def _declared_source(source: str, options: ExportOptions) -> dict[str, str]:
    """The checked ``--base-model``/``--license``/``--model-name`` of an export, for its source record.

    ``--base-model`` is for what hub-export cannot identify (a local folder, a GGUF file):
    a Hub repo of safetensors is its own base model, and naming another would mislabel it.
    """
    from .card import declared_source as checked

    declared = checked(options.base_model, options.license, options.model_name)
    is_local = Path(source).expanduser().exists()
    is_gguf = options.gguf_file is not None or source.endswith(".gguf")
    if "base_model" in declared and not (is_local or is_gguf):
        raise InputError(
            f"{opt('base_model')} is for local folders and GGUF files; {source} is a Hub repo, which the card links as its "
            f"base model already: drop {opt('base_model')}", param="base_model",
        )
    return declared


def _prepare_output(output_dir: Path, overwrite: bool) -> Path:
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise InputError(f"{output_dir} is not empty; choose another {opt('output')} or pass {opt('overwrite')}")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))


def _publish_folder(workdir: Path, output_dir: Path) -> None:
    if output_dir.exists():
        shutil.rmtree(output_dir)
    workdir.rename(output_dir)


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
    receives a :class:`~hub_export.progress.ProgressEvent` (a ``str``) per stage.

    Example:
        >>> manifest = export("HuggingFaceTB/SmolLM2-135M", "out", qmodes=["8da4w", "fp32"], max_seq_len=256)
        >>> [v.file for v in manifest.variants]
        ['model-8da4w.pte', 'model-fp32.pte']
    """
    options = options_with(options, option_values)
    declared = _declared_source(source, options)
    say = tracker(progress, log.info)
    calibrated = any(quantize.QMODES[mode].calibrated for mode in options.qmodes) and options.calibration
    say.expect((3 if options.verify else 2) + calibrated + (4 if options.verify else 3) * len(options.qmodes))
    output_dir = Path(output_dir)
    resolved_len: dict[str, int] = {}

    def precheck(config: dict) -> None:
        resolved_len["value"] = resolve_max_seq_len(config, options.max_seq_len)
        archs.check_config(_ConfigView(config), resolved_len["value"])
        if options.share_embeddings and not _ConfigView(config).tie_word_embeddings:
            raise InputError(
                f"{source} does not tie its input and output embeddings, so {opt('share_embeddings')} has nothing to share; "
                "drop the flag", param="share_embeddings",
            )

    say(f"resolving {source}", "resolve")
    src = source_stage.resolve(
        source,
        revision=options.revision,
        token=token,
        endpoint=endpoint,
        trust_remote_code=options.trust_remote_code,
        allow_pickle=options.allow_pickle,
        cache_dir=cache_dir,
        precheck=precheck,
        gguf_file=options.gguf_file,
        say=say,
    )
    seq_len = resolved_len["value"]
    map_large_allocations()
    workdir = _prepare_output(output_dir, overwrite)
    try:
        say(f"loading {src.name} ({src.model_type})", "load")
        model = load_model(src.path, options.trust_remote_code)
        reference = None
        if options.verify:
            from .verify import build_reference

            say(f"computing the fp32 eager reference (prompt + {options.quality_tokens} tokens of evaluation text)",
                "reference")
            reference = build_reference(model, src.path / "tokenizer.json", seq_len, options.quality_tokens,
                                        token_ids(model)[0])
        mixed_plan = None
        if calibrated:
            from .calibrate import plan_mixed

            say("measuring each linear layer's int4 sensitivity on the calibration text", "calibrate")
            mixed_plan = plan_mixed(model, src.path / "tokenizer.json", options, say)
            say(f"mixed: {mixed_plan.summary()} ({mixed_plan.seconds:.0f} s)")
        elif any(quantize.QMODES[mode].calibrated for mode in options.qmodes):
            from .calibrate import MixedPlan

            mixed_plan = MixedPlan(calibrated=False)
        source_record = _source_record(src, model, declared)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        workers = worker_count(options.jobs, len(options.qmodes), weight_bytes)
        if workers > 1:
            del model
            release_memory()
            say(f"building {len(options.qmodes)} variants, {workers} at a time in worker processes")
            variant_jobs = [
                VariantJob(index, qmode, src, options, seq_len, workdir, reference,
                           threads=max(1, usable_cpus() // workers), quiet=_libraries_quiet(), mixed_plan=mixed_plan)
                for index, qmode in enumerate(options.qmodes)
            ]
            variants = export_in_workers(variant_jobs, workers, say)
        else:
            run = RunState(model, src, options, seq_len, workdir, reference, say, mixed_plan)
            del model  # the run owns it now, and drops it once the last variant no longer needs it
            for index, qmode in enumerate(options.qmodes):
                run.variants.append(build_variant(run, qmode, last=index == len(options.qmodes) - 1))
            variants = run.variants
        _copy_source_files(src, workdir)
        manifest = Manifest(
            source=source_record,
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


def _shown_source(source: str) -> str:
    """The source as the reproduce command names it: a local path by its last part only (no home folders)."""
    return source if not Path(source).expanduser().exists() else Path(source).name


class _ConfigView:
    """Attribute access over a config dict (its text config for multimodal wrappers)."""

    def __init__(self, data: dict):
        self._data = data.get("text_config", data) | {"model_type": data.get("model_type")}

    def __getattr__(self, name):
        return self._data.get(name)


def read_manifest(folder: str | Path) -> Manifest:
    """The :class:`Manifest` of an export folder."""
    return Manifest.read(Path(folder))


__all__ = ["export", "ExportOptions", "read_manifest", "variant_filename", "DEFAULT_QUALITY_TOKENS"]
