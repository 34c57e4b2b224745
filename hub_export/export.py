"""Export: source -> wrap -> quantize -> lower -> verify, into one output folder.

The source is downloaded once and every variant starts from its unquantized weights.
Variants are built one after another in this process, or, when there are several and
the machine has the cores and memory, several at once in worker processes
(:mod:`hub_export.workers`) that each map the same checkpoint. Output is written to a
hidden sibling folder and moved into place only when every variant has passed, so a
failed run leaves nothing behind.
"""

from __future__ import annotations

import copy
import gc
import logging
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from . import archs, quantize, source as source_stage
from .errors import InputError, VerificationError
from .manifest import Manifest, Variant, machine_description, package_versions, sha256_file
from .workers import VariantJob, export_in_workers, usable_cpus, worker_count

# torch, executorch and the stage modules that need them are imported where used, so
# that `import hub_export` and `hub-export --help` stay fast.
if TYPE_CHECKING:
    import torch

    from .verify import Reference

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_QUALITY_TOKENS = 2048  # hub_export.verify.DEFAULT_QUALITY_TOKENS, without importing torch here
COPIED_FILES = source_stage.CONFIG_FILES + source_stage.TOKENIZER_FILES

Progress = Callable[[str], None]


@dataclass
class ExportOptions:
    """What to build. Mirrors the ``hub-export export`` flags."""

    qmodes: Sequence[str] = ("8da4w",)
    qembedding: str | None = None
    group_size: int = quantize.DEFAULT_GROUP_SIZE
    max_seq_len: int | None = None
    verify: bool = True
    jobs: int | None = None  # variants built at once; None: as many as cores and memory allow
    share_embeddings: bool = False  # tied table stored once, in a .ptd data file per variant
    quality_tokens: int = DEFAULT_QUALITY_TOKENS  # evaluation-text predictions per variant; 0: prompt only

    def validate(self) -> None:
        if not self.qmodes:
            raise InputError("give at least one --qmode")
        if self.quality_tokens < 0:
            raise InputError(f"--quality-tokens must be 0 (off) or more (got {self.quality_tokens})")
        if self.jobs is not None and self.jobs < 1:
            raise InputError(f"--jobs must be at least 1 (got {self.jobs})")
        if self.share_embeddings:
            others = [mode for mode in self.qmodes if mode not in quantize.SHAREABLE_QMODES]
            if self.qembedding != "8w" or others:
                raise InputError(
                    "--share-embeddings needs --qembedding 8w and qmodes among "
                    f"{', '.join(quantize.SHAREABLE_QMODES)} (the output projection must be 8-bit per row like the "
                    f"table){'; drop ' + ', '.join(others) if others else ''}"
                )
        quantize.validate(list(self.qmodes), self.qembedding, self.group_size)
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise InputError(f"--max-seq-len must be at least 2 (got {self.max_seq_len})")


def variant_filename(qmode: str, qembedding: str | None) -> str:
    return f"model-{qmode}" + (f"-emb{qembedding}" if qembedding else "") + ".pte"


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _max_positions(config: dict) -> int | None:
    text = config.get("text_config", config)
    return text.get("max_position_embeddings") or text.get("n_positions")


def resolve_max_seq_len(config: dict, requested: int | None) -> int:
    """``requested`` checked against the model's limit, or a phone-friendly default."""
    limit = _max_positions(config)
    if requested is None:
        return min(limit or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    if limit and requested > limit:
        raise InputError(f"--max-seq-len {requested} is above the model's limit of {limit} positions")
    return requested


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def token_ids(model) -> tuple[int | None, list[int]]:
    """BOS id and the union of EOS ids from the generation config and the model config."""
    gen = getattr(model, "generation_config", None)
    text = _text_config(model.config)
    bos = getattr(gen, "bos_token_id", None)
    bos = bos if bos is not None else getattr(text, "bos_token_id", None)
    eos: list[int] = []
    for value in (getattr(gen, "eos_token_id", None), getattr(text, "eos_token_id", None)):
        eos += [i for i in _ids(value) if i not in eos]
    return (bos[0] if isinstance(bos, list) else bos), eos


def load_model(path: Path, trust_remote_code: bool):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True
    )
    return model.eval()


def weight_sharing_copy(model: "torch.nn.Module") -> "torch.nn.Module":
    """A copy of ``model`` whose modules are new but whose parameters are shared.

    Quantization *replaces* parameters on the copy's modules (it never writes into
    them), so the original keeps its fp32 weights for the next variant without the
    memory of a second fp32 model.
    """
    memo = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


def shared_fraction(model: "torch.nn.Module", original: "torch.nn.Module") -> float:
    """Share of ``original``'s parameter bytes that ``model`` still uses."""
    ours = {id(p) for p in model.parameters()}
    sizes = [(p.numel() * p.element_size(), id(p) in ours) for p in original.parameters()]
    total = sum(size for size, _ in sizes) or 1
    return sum(size for size, shared in sizes if shared) / total


def detach_from(model: "torch.nn.Module", original: "torch.nn.Module") -> None:
    """Give ``model`` its own copy of every parameter it still shares with ``original``."""
    import torch

    shared = {id(p) for p in original.parameters()}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in shared:
                module._parameters[name] = torch.nn.Parameter(param.detach().clone(), requires_grad=False)


def release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS (keeps peak RSS down)."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def map_large_allocations(threshold: int = 1 << 20) -> None:
    """Have glibc give every allocation above ``threshold`` bytes its own memory map.

    By default glibc raises its mmap threshold to the size of each block freed (up to
    32 MiB), after which tensor temporaries come from the heap, where freed memory stays
    resident. A fixed threshold returns them to the OS as soon as they are freed. On the
    SmolLM2-135M shape the quantization peak went from 1337-1581 MiB (varying run to run)
    to 1324-1343 MiB. A no-op where the C library is not glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # -3 = M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _libraries_quiet() -> bool:
    """Whether the caller silenced the frameworks' warnings (the CLI does); workers follow suit."""
    return logging.getLogger("torch").getEffectiveLevel() >= logging.ERROR


def _kind(qmode: str) -> str:
    if qmode == "fp32":
        return "fp32"
    return "dynamic" if qmode.startswith("8da") else "weight_only"


@dataclass
class _Run:
    """State shared by the variants of one export run."""

    model: "torch.nn.Module | None"
    src: source_stage.Source
    options: ExportOptions
    max_seq_len: int
    workdir: Path
    reference: "Reference | None"
    say: Progress
    variants: list[Variant] = field(default_factory=list)


def _export_variant(run: _Run, qmode: str, last: bool = False) -> Variant:
    from .lower import is_dynamic, runner_metadata, to_pte
    from .verify import expected_logits, verify
    from .wrap import ExportableDecoder, export_program

    opts = run.options
    name = variant_filename(qmode, opts.qembedding)
    started = time.perf_counter()
    run.say(f"[{name}] quantizing ({quantize.QMODES[qmode].description})")
    model = weight_sharing_copy(run.model)
    fallback = quantize.quantize_model(model, qmode, opts.qembedding, opts.group_size, opts.share_embeddings)
    expected = expected_logits(model, run.reference) if run.reference is not None else None
    if last and shared_fraction(model, run.model) < 0.1:
        # No later variant needs the fp32 weights: free them before lowering. The
        # few still shared (norms) are copied first, since they keep the memory map of
        # the whole checkpoint alive. (An fp32 variant shares nearly everything: there
        # a copy would only add memory.)
        detach_from(model, run.model)
        run.model = None
    release_memory()
    run.say(f"[{name}] exporting with torch.export (dynamic sequence length up to {run.max_seq_len - 1})")
    program = export_program(ExportableDecoder(model, run.max_seq_len))
    bos, eos = token_ids(model)
    metadata = runner_metadata(
        max_seq_len=run.max_seq_len,
        bos_id=bos,
        eos_ids=eos,
        vocab_size=_text_config(model.config).vocab_size,
        dynamic_shape=is_dynamic(program),
    )
    run.say(f"[{name}] lowering to ExecuTorch (XNNPACK)")
    path = run.workdir / name
    data_path = path.with_suffix(".ptd") if opts.share_embeddings else None
    to_pte(program, metadata, path, data_path)
    del program, model
    if last:
        run.model = None
    release_memory()
    seconds = time.perf_counter() - started

    verification: dict = {"skipped": True}
    if expected is not None:
        run.say(f"[{name}] verifying against eager and in TextLLMRunner")
        result = verify(path, expected, run.reference, run.src.path / "tokenizer.json", _kind(qmode))
        verification = result.to_dict()
        if not result.passed:
            raise VerificationError(f"{name} failed verification: {result.failure}")
    grouped = quantize.QMODES[qmode].grouped
    return Variant(
        file=name,
        qmode=qmode,
        qembedding=opts.qembedding,
        group_size=opts.group_size if grouped else None,
        max_seq_len=run.max_seq_len,
        size_bytes=path.stat().st_size,
        sha256=sha256_file(path),
        metadata=metadata,
        verification=verification,
        export_seconds=round(seconds, 2),
        per_channel_fallback=fallback,
        data_file=data_path.name if data_path else None,
        data_size_bytes=data_path.stat().st_size if data_path else None,
        data_sha256=sha256_file(data_path) if data_path else None,
    )


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


def _declared_source(
    source: str, gguf_file: str | None, base_model: str | None, license: str | None, model_name: str | None
) -> dict[str, str]:
    """The checked ``--base-model``/``--license``/``--model-name`` of an export, for its source record.

    ``--base-model`` is for what hub-export cannot identify (a local folder, a GGUF file):
    a Hub repo of safetensors is its own base model, and naming another would mislabel it.
    """
    from .card import declared_source as checked

    declared = checked(base_model, license, model_name)
    is_local = Path(source).expanduser().exists()
    is_gguf = gguf_file is not None or source.endswith(".gguf")
    if "base_model" in declared and not (is_local or is_gguf):
        raise InputError(
            f"--base-model is for local folders and GGUF files; {source} is a Hub repo, which the card links as its "
            "base model already: drop --base-model"
        )
    return declared


def _prepare_output(output_dir: Path, overwrite: bool) -> Path:
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise InputError(f"{output_dir} is not empty; choose another -o or pass --overwrite")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))


def _publish_folder(workdir: Path, output_dir: Path) -> None:
    if output_dir.exists():
        shutil.rmtree(output_dir)
    workdir.rename(output_dir)


def export(
    source: str,
    output_dir: str | Path,
    *,
    qmodes: Sequence[str] = ("8da4w",),
    qembedding: str | None = None,
    group_size: int = quantize.DEFAULT_GROUP_SIZE,
    max_seq_len: int | None = None,
    verify: bool = True,
    jobs: int | None = None,
    share_embeddings: bool = False,
    quality_tokens: int = DEFAULT_QUALITY_TOKENS,
    gguf_file: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    model_name: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    overwrite: bool = False,
    cache_dir: str | Path | None = None,
    command: str | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Export ``source`` to verified ExecuTorch ``.pte`` variants in ``output_dir``.

    ``jobs`` is how many variants are built at once, each in its own process; by
    default as many as there are cores and memory for (one when there is one variant).
    ``share_embeddings`` stores a tied embedding table once: each variant becomes a
    ``.pte`` plus a ``.ptd`` data file holding its weights (see
    :func:`hub_export.quantize.quantize_model`). ``quality_tokens`` is how many tokens
    of the shipped English evaluation text each variant is scored on (perplexity,
    top-1 and KL against fp32; 0 turns it off). ``gguf_file`` reads the weights from
    that ``.gguf`` in the repo or folder instead of safetensors. ``base_model`` (the Hub
    model a local or GGUF source is a copy of), ``license`` and ``model_name`` are
    recorded in the manifest's source record for the model card.

    Example:
        >>> manifest = export("HuggingFaceTB/SmolLM2-135M", "out", qmodes=["8da4w", "fp32"], max_seq_len=256)
        >>> [v.file for v in manifest.variants]
        ['model-8da4w.pte', 'model-fp32.pte']
    """
    options = ExportOptions(qmodes, qembedding, group_size, max_seq_len, verify, jobs, share_embeddings, quality_tokens)
    options.validate()
    declared = _declared_source(source, gguf_file, base_model, license, model_name)
    say = progress or (lambda message: log.info(message))
    output_dir = Path(output_dir)
    resolved_len: dict[str, int] = {}

    def precheck(config: dict) -> None:
        resolved_len["value"] = resolve_max_seq_len(config, options.max_seq_len)
        archs.check_config(_ConfigView(config), resolved_len["value"])
        if options.share_embeddings and not _ConfigView(config).tie_word_embeddings:
            raise InputError(
                f"{source} does not tie its input and output embeddings, so --share-embeddings has nothing to share; "
                "drop the flag"
            )

    say(f"resolving {source}")
    src = source_stage.resolve(
        source,
        revision=revision,
        token=token,
        endpoint=endpoint,
        trust_remote_code=trust_remote_code,
        allow_pickle=allow_pickle,
        cache_dir=cache_dir,
        precheck=precheck,
        gguf_file=gguf_file,
        say=say,
    )
    seq_len = resolved_len["value"]
    map_large_allocations()
    workdir = _prepare_output(output_dir, overwrite)
    try:
        say(f"loading {src.name} ({src.model_type})")
        model = load_model(src.path, trust_remote_code)
        reference = None
        if options.verify:
            from .verify import build_reference

            say(f"computing the fp32 eager reference (prompt + {options.quality_tokens} tokens of evaluation text)")
            reference = build_reference(model, src.path / "tokenizer.json", seq_len, options.quality_tokens,
                                        token_ids(model)[0])
        source_record = _source_record(src, model, declared)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        workers = worker_count(options.jobs, len(options.qmodes), weight_bytes)
        if workers > 1:
            del model
            release_memory()
            say(f"building {len(options.qmodes)} variants, {workers} at a time in worker processes")
            variant_jobs = [
                VariantJob(index, qmode, src, options, seq_len, workdir, reference, trust_remote_code,
                           threads=max(1, usable_cpus() // workers), quiet=_libraries_quiet())
                for index, qmode in enumerate(options.qmodes)
            ]
            variants = export_in_workers(variant_jobs, workers, say)
        else:
            run = _Run(model, src, options, seq_len, workdir, reference, say)
            del model  # the run owns it now, and drops it once the last variant no longer needs it
            for index, qmode in enumerate(options.qmodes):
                run.variants.append(_export_variant(run, qmode, last=index == len(options.qmodes) - 1))
            variants = run.variants
        _copy_source_files(src, workdir)
        manifest = Manifest(
            source=source_record,
            versions=package_versions(),
            variants=variants,
            command=command or _default_command(source, options, revision, gguf_file, declared),
            machine=machine_description(),
        )
        manifest.write(workdir)
        _publish_folder(workdir, output_dir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return manifest


def _default_command(
    source: str, options: ExportOptions, revision: str | None, gguf_file: str | None = None, declared: dict | None = None
) -> str:
    parts = ["hub-export", "export", source if not Path(source).expanduser().exists() else Path(source).name]
    for key, value in (declared or {}).items():
        parts += ["--" + key.replace("_", "-"), value]
    if revision:
        parts += ["--revision", revision]
    if gguf_file:
        parts += ["--gguf-file", gguf_file]
    for mode in options.qmodes:
        parts += ["--qmode", mode]
    if options.qembedding:
        parts += ["--qembedding", options.qembedding]
    if options.group_size != quantize.DEFAULT_GROUP_SIZE:
        parts += ["--group-size", str(options.group_size)]
    if options.max_seq_len:
        parts += ["--max-seq-len", str(options.max_seq_len)]
    if options.share_embeddings:
        parts.append("--share-embeddings")
    if options.quality_tokens != DEFAULT_QUALITY_TOKENS:
        parts += ["--quality-tokens", str(options.quality_tokens)]
    return shlex.join(parts)


class _ConfigView:
    """Attribute access over a config dict (its text config for multimodal wrappers)."""

    def __init__(self, data: dict):
        self._data = data.get("text_config", data) | {"model_type": data.get("model_type")}

    def __getattr__(self, name):
        return self._data.get(name)


def read_manifest(folder: str | Path) -> Manifest:
    """The :class:`Manifest` of an export folder."""
    return Manifest.read(Path(folder))


__all__ = ["export", "ExportOptions", "read_manifest", "variant_filename"]
