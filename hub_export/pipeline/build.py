"""Build one variant: quantize -> torch.export -> lower -> verify, from the run's fp32 model.

The in-process path (:mod:`hub_export.export`) and the worker processes
(:mod:`hub_export.pipeline.workers`) both build variants with :func:`build_variant`, so a file
built either way is byte-identical.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.errors import VerificationError
from hub_export.options import variant_filename
from hub_export.patches import release_memory
from hub_export.pipeline import lora_files, quantize, streaming
from hub_export.pipeline import source as source_stage
from hub_export.pipeline.lower import LoweringProgress, is_dynamic, runner_metadata, to_pte
from hub_export.pipeline.manifest import Variant, sha256_file
from hub_export.pipeline.records import Verification
from hub_export.pipeline.verify import expected_logits, text_config, token_ids, verify
from hub_export.runtime.inspection import delegation_record, inspect_pte
from hub_export.runtime.pte import ROWS_METHOD, MemoryProbe
from hub_export.tasks import encoders
from hub_export.tasks import registry as tasks
from hub_export.tasks.text_generation.export import (
    ExportableDecoder,
    export_program,
    export_rows_program,
    rows_limit,
)
from hub_export.tasks.text_generation.kv_cache import plan_layers

if TYPE_CHECKING:
    import torch

    from hub_export.options import ExportOptions
    from hub_export.pipeline.calibrate import MixedPlan
    from hub_export.pipeline.gptq import Int4Rounding
    from hub_export.pipeline.verify import Reference

# get_max_context_len of a file whose cache never fills (attention sink): the runner's
# limit on prompt plus generated tokens.
UNBOUNDED_CONTEXT = 1 << 30

Say = Callable[..., None]  # (message, stage, variant): a hub_export.progress.Tracker, or a worker's relay


def load_model(path: Path, trust_remote_code: bool, task: tasks.Task = tasks.TEXT_GENERATION):
    """The fp32 model of ``path``, in the class ``task`` loads (a causal LM, a bare encoder)."""
    import torch
    import transformers

    auto_class = getattr(transformers, task.auto_class)
    model = auto_class.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True
    )
    return model.eval()


def weight_sharing_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose modules are new but whose parameters are shared.

    Quantization *replaces* parameters on the copy's modules (it never writes into
    them), so the original keeps its fp32 weights for the next variant without the
    memory of a second fp32 model.
    """
    memo = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


def shared_fraction(model: torch.nn.Module, original: torch.nn.Module) -> float:
    """Share of ``original``'s parameter bytes that ``model`` still uses."""
    ours = {id(p) for p in model.parameters()}
    sizes = [(p.numel() * p.element_size(), id(p) in ours) for p in original.parameters()]
    total = sum(size for size, _ in sizes) or 1
    return sum(size for size, shared in sizes if shared) / total


def detach_from(model: torch.nn.Module, original: torch.nn.Module) -> None:
    """Give ``model`` its own copy of every parameter it still shares with ``original``."""
    import torch

    shared = {id(p) for p in original.parameters()}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in shared:
                module._parameters[name] = torch.nn.Parameter(param.detach().clone(), requires_grad=False)


def let_weights_go(model: torch.nn.Module) -> None:
    """Drop ``model``'s own references to its parameters and buffers, once a program exported from it holds
    them: lowering can then free each weight it has packed. Parameters shared with another model stay there."""
    for module in model.modules():
        module._parameters.clear()
        module._buffers.clear()


@dataclass
class RunState:
    """State shared by the variants of one export run."""

    model: torch.nn.Module | None
    src: source_stage.Source
    options: ExportOptions
    max_seq_len: int
    workdir: Path
    reference: Reference | None
    say: Say
    mixed_plan: MixedPlan | None = None  # the calibrated int8 layers of the mixed qmode, measured once per run
    int4_rounding: Int4Rounding | None = None  # GPTQ's int4 codes (--int4-scales gptq), made once per run
    variants: list[Variant] = field(default_factory=list)

    @property
    def task(self) -> tasks.Task:
        return tasks.task_for(self.src.config, self.options.task)


def build_variant(run: RunState, qmode: str, last: bool = False) -> Variant:
    """Quantize, export, lower and verify one variant of ``run`` into its staging folder.

    ``last``: no later variant of this process needs the fp32 weights, so they are
    released as soon as this one no longer shares them. A verified variant's memory is
    measured by a probe process started now, so its imports overlap the lowering.
    """
    builder = _build_text_variant if run.task.module is None else _build_encoder_variant
    return builder(run, qmode, last)


def _build_text_variant(run: RunState, qmode: str, last: bool) -> Variant:
    with MemoryProbe() if run.reference is not None else contextlib.nullcontext() as probe:
        return _build_variant(run, qmode, last, probe)


def _build_encoder_variant(run: RunState, qmode: str, last: bool) -> Variant:
    """One variant of an encoder task (:mod:`hub_export.tasks.encoders`): quantize a copy, wrap it as the task's
    method, export, lower, verify."""
    opts, task = run.options, run.task
    stages = encoders.stages(task)
    name = variant_filename(qmode, opts.qembedding)
    mode = quantize.QMODES[qmode]
    started = time.perf_counter()
    reference, folder, seq_len = run.reference, run.src.path, run.max_seq_len
    model, fallback, expected = _quantized_copy(
        run,
        qmode,
        name,
        None,
        last,
        lambda quantized: encoders.expected_answers(task, stages.wrap(quantized, folder, seq_len).eval(), reference),
        getattr(stages, "quantize_model", None),
    )
    wrapped = stages.wrap(model, folder, seq_len).eval()
    run.say(f"[{name}] exporting with torch.export ({task.takes})", "export", name)
    program = stages.export(wrapped, run.max_seq_len)
    metadata = stages.metadata(model, folder, run.max_seq_len)
    kv_cache = stages.kv_cache_record(model, run.max_seq_len) if hasattr(stages, "kv_cache_record") else None
    del wrapped, model
    if last:
        run.model = None
    release_memory()
    run.say(f"[{name}] lowering to ExecuTorch (XNNPACK)", "lower", name)
    path = run.workdir / name
    to_pte(
        program, metadata, path, on_partition=LoweringProgress(lambda said: run.say(f"[{name}] {said}", "note", name))
    )
    del program
    seconds = time.perf_counter() - started
    verification = Verification.skipped_record()
    if reference is not None:
        run.say(f"[{name}] verifying against eager on {len(reference.inputs)} inputs", "verify", name)
        verification = encoders.verify_variant(task, path, expected, reference, mode, opts.qembedding)
        if not verification.passed:
            raise VerificationError(f"{name} failed verification: {verification.failure}")
    record = _variant_record(run, qmode, path, metadata, verification, seconds, fallback)
    record.kv_cache = kv_cache
    if reference is not None and hasattr(stages, "measure_memory"):
        run.say(f"[{name}] measuring memory at full context ({run.max_seq_len} positions)", "note", name)
        record.runtime_memory = stages.measure_memory(path, reference)
    return record


@dataclass
class LoweredText:
    """A text variant's file, written but not yet verified: what verification needs from the process that
    quantized and lowered it (:func:`lower_text_variant`)."""

    qmode: str
    path: Path
    metadata: dict
    layout: Any  # hub_export.tasks.text_generation.kv_cache.CacheLayout
    expected: Any  # hub_export.pipeline.verify.Expected, or None without verification
    fallback: list[str]
    seconds: float


def _build_variant(run: RunState, qmode: str, last: bool, probe) -> Variant:
    return finish_text_variant(run, lower_text_variant(run, qmode, last), probe)


def lower_text_variant(run: RunState, qmode: str, last: bool) -> LoweredText:
    """Quantize, export and lower one text variant of ``run`` into its staging folder, and compute what its file
    must reproduce. A worker process can do this part alone and leave the checks to the parent, so that the
    memory the lowering leaves behind in its allocator is returned before the file is loaded to be verified."""
    name = variant_filename(qmode, run.options.qembedding)
    if run.options.lora_files:
        name = lora_files.program_name(run.src.lora[0].name, name)
    mode = quantize.QMODES[qmode]
    started = time.perf_counter()
    plan = run.mixed_plan if mode.calibrated else None
    model, fallback, expected = _quantized_copy(
        run, qmode, name, plan, last, lambda quantized: expected_logits(quantized, run.reference)
    )
    release_memory()
    path, metadata, layout = _lower(run, model, name, qmode)
    del model
    if last:
        run.model = None
    release_memory()
    return LoweredText(qmode, path, metadata, layout, expected, fallback, time.perf_counter() - started)


def finish_text_variant(run: RunState, lowered: LoweredText, probe) -> Variant:
    """Verify ``lowered``'s file against eager and in TextLLMRunner, measure its memory, and make its record."""
    opts = run.options
    mode = quantize.QMODES[lowered.qmode]
    name, path, layout = lowered.path.name, lowered.path, lowered.layout
    plan = run.mixed_plan if mode.calibrated else None
    verification, runtime_memory, speculative = Verification.skipped_record(), None, None
    if lowered.expected is not None:
        run.say(f"[{name}] verifying against eager and in TextLLMRunner", "verify", name)
        verification = verify(
            path,
            lowered.expected,
            run.reference,
            run.src.path / "tokenizer.json",
            judge_kind(mode.tolerance, opts.kv_cache),
            lambda message: run.say(f"[{name}] {message}", "note", name),
        )
        if not verification.passed:
            raise VerificationError(f"{name} failed verification: {verification.failure}")
        if "get_max_rows" in lowered.metadata:
            from hub_export.tasks.text_generation.bench import lookup_record  # runs the file in a fresh process
            from hub_export.tasks.text_generation.speculative import check_rows  # runs the file: loads ExecuTorch

            rows = lowered.metadata["get_max_rows"]
            run.say(f"[{name}] checking {ROWS_METHOD} on {rows} rows against forward", "note", name)
            verification.rows = check_rows(path, rows)
            run.say(f"[{name}] timing prompt lookup against plain decoding on 4 shipped prompts", "note", name)
            speculative = lookup_record(path, run.src.path, rows)
        run.say(f"[{name}] measuring memory at full context ({run.max_seq_len} positions)", "note", name)
        runtime_memory = probe.measure(path, extra_tokens=8 if layout.unbounded else 0)
    record = _variant_record(
        run, lowered.qmode, path, lowered.metadata, verification, lowered.seconds, lowered.fallback, plan
    )
    record.kv_cache, record.runtime_memory = {**layout.to_dict(), "sliding": opts.sliding_cache}, runtime_memory
    if speculative is None and "get_max_rows" in lowered.metadata:  # not verified: the method is there, not timed
        speculative = {"max_rows": lowered.metadata["get_max_rows"]}
    record.speculative = speculative
    return record


def _variant_record(
    run: RunState,
    qmode: str,
    path: Path,
    metadata: dict,
    verification: Verification,
    seconds: float,
    fallback: list[str],
    plan: MixedPlan | None = None,
) -> Variant:
    """The manifest's record of the variant just written to ``path`` (with its ``.ptd``, if any)."""
    opts, mode = run.options, quantize.QMODES[qmode]
    data_path = _data_path(path, opts, qmode)
    delegation = delegation_record(inspect_pte(path))
    return Variant(
        file=path.name, qmode=qmode, qembedding=opts.qembedding, group_size=opts.group_size if mode.grouped else None,
        max_seq_len=run.max_seq_len, size_bytes=path.stat().st_size, sha256=sha256_file(path), metadata=metadata,
        verification=verification, export_seconds=round(seconds, 2), per_channel_fallback=fallback,
        data_file=data_path.name if data_path else None,
        data_size_bytes=data_path.stat().st_size if data_path else None,
        data_sha256=sha256_file(data_path) if data_path else None,
        recipe=_recipe_record(mode, opts, plan, run.int4_rounding), asked=opts.variant_settings(), delegation=delegation,
        adapter=lora_files.variant_record(run.src.lora[0]) if opts.lora_files else None,
    )  # fmt: skip


def _quantized_copy(
    run: RunState,
    qmode: str,
    name: str,
    plan: MixedPlan | None,
    last: bool,
    expect: Callable[[torch.nn.Module], Any],
    quantizer: Callable[..., list[str]] | None = None,
):
    """(a quantized copy of ``run``'s model, the layers that fell back to per-channel int8, what the ``.pte`` must
    reproduce: the copy's logits on the verification sequences, or None without verification).

    ``quantizer(model, qmode, options)``: a task's own recipe (a speech encoder's qmode apart).
    """
    opts = run.options
    run.say(f"[{name}] quantizing ({quantize.QMODES[qmode].description})", "quantize", name)
    recipe = opts.recipe(frozenset(plan.eight_bit) if plan else frozenset(), run.int4_rounding)
    if run.model is None and quantizer is None and streaming.can_stream(run.src, opts, run.task):
        # read from the checkpoint one decoder layer at a time, each quantized as it arrives
        model, fallback = streaming.quantized_model(
            run.src, qmode, opts, recipe, lambda message: run.say(f"[{name}] {message}", "note", name)
        )
        if last and run.int4_rounding is not None:
            run.int4_rounding.forget_codes()  # the model holds them now; no later variant of this process needs them
        return model, fallback, expect(model) if run.reference is not None else None
    model = weight_sharing_copy(run.model)
    if quantizer is not None:
        fallback = quantizer(model, qmode, opts)
    else:
        fallback = quantize.quantize_model(
            model, qmode, opts.qembedding, opts.group_size, opts.share_embeddings, recipe
        )
    if opts.lora_files:  # the base quantized as its own export is; the adapter's factors stay fp32 beside it
        lora_files.attach_lora(model, run.src.lora[0])
    expected = expect(model) if run.reference is not None else None
    if last and shared_fraction(model, run.model) < 0.1:
        # No later variant needs the fp32 weights: free them before lowering. The
        # few still shared (norms) are copied first, since they keep the memory map of
        # the whole checkpoint alive. (An fp32 variant shares nearly everything: there
        # a copy would only add memory.)
        detach_from(model, run.model)
        run.model = None
    return model, fallback, expected


def _lower(run: RunState, model, name: str, qmode: str):
    """Export ``model`` with its KV cache and lower it to ``name`` in the staging folder: (path, metadata, layout)."""
    opts = run.options
    run.say(
        f"[{name}] exporting with torch.export (dynamic sequence length up to {run.max_seq_len - 1})", "export", name
    )
    layout = plan_layers(text_config(model.config), run.max_seq_len, opts.sliding_cache, opts.kv_cache, opts.sink())
    wrapped = ExportableDecoder(model, run.max_seq_len, layout)
    programs = {"forward": export_program(wrapped)}
    bos, eos = token_ids(model)
    metadata = runner_metadata(
        max_seq_len=run.max_seq_len,
        bos_id=bos,
        eos_ids=eos,
        vocab_size=text_config(model.config).vocab_size,
        dynamic_shape=is_dynamic(programs["forward"]),
        max_context_len=UNBOUNDED_CONTEXT if layout.unbounded else None,
    )
    if opts.speculative:
        metadata["get_max_rows"] = rows_limit(run.max_seq_len)
        run.say(f"[{name}] exporting {ROWS_METHOD} (up to {metadata['get_max_rows']} rows of logits per call)", "note",
                name)  # fmt: skip
        programs[ROWS_METHOD] = export_rows_program(wrapped)
    del wrapped
    let_weights_go(model)  # the programs hold what lowering needs; to_pte lets them go once lowered
    run.say(f"[{name}] lowering to ExecuTorch (XNNPACK)", "lower", name)
    path = run.workdir / name
    to_pte(
        programs,
        metadata,
        path,
        _data_path(path, opts, qmode),
        on_partition=LoweringProgress(lambda said: run.say(f"[{name}] {said}", "note", name)),
        kept=lora_files.is_adapter_weight if opts.lora_files else None,
    )
    return path, metadata, layout


def _data_path(path: Path, options: ExportOptions, qmode: str) -> Path | None:
    """The ``.ptd`` a variant's weights go to: the base's shared file (``--lora-files``), the variant's own
    (``--share-embeddings``), or none (every weight in the ``.pte``)."""
    if options.lora_files:
        return path.with_name(lora_files.base_data_name(variant_filename(qmode, options.qembedding)))
    return path.with_suffix(".ptd") if options.share_embeddings else None


def judge_kind(kind: str, kv_cache: str) -> str:
    """The verification thresholds of a variant: an int8 KV cache rounds activations like dynamic quantization."""
    return "dynamic" if kv_cache == "int8" else kind


def _recipe_record(
    mode: quantize.QMode, options: ExportOptions, plan: MixedPlan | None, rounding: Int4Rounding | None
) -> dict | None:
    """What the manifest says about how the variant was quantized beyond its qmode."""
    record: dict = {}
    if mode.weight_bits == 4:
        record["int4_scales"] = options.recipe(rounding=rounding).scales_of(mode)
        if record["int4_scales"] == "gptq":
            record["gptq"] = rounding.record()
    if plan is not None:
        record["mixed"] = plan.to_dict()
    return record or None
