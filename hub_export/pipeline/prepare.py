"""Prepare: what every variant of a run starts from.

Resolve the source (a Hub download goes through the Hub cache), check it before its
weights are fetched, load the fp32 model once, compute the verification reference and,
for the ``mixed`` qmode, the calibration plan. An engine (:mod:`hub_export.pipeline.engines`)
runs this where it likes: in this process, or as a task on a node of a Ray cluster,
in which case the result travels without the model and with the few small files
(config, tokenizer) the export folder copies.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.errors import ExportError, InputError, opt
from hub_export.options import ExportOptions
from hub_export.pipeline import memory_budget, quantize, streaming
from hub_export.pipeline import source as source_stage
from hub_export.pipeline.calibrate import MixedPlan, plan_mixed, round_int4
from hub_export.pipeline.workers import available_memory
from hub_export.tasks import archs
from hub_export.tasks import registry as tasks
from hub_export.tasks.text_generation.chat import chat_template

if TYPE_CHECKING:
    from hub_export.pipeline.calibrate import MixedPlan
    from hub_export.pipeline.gptq import Int4Rounding
    from hub_export.pipeline.verify import Reference

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048
COPIED_FILES = source_stage.CONFIG_FILES + source_stage.TOKENIZER_FILES + source_stage.PROCESSOR_FILES

Say = Callable[..., None]


@dataclass
class SourceRequest:
    """Where a run's model comes from: what the user named, and how to reach it."""

    source: str
    options: ExportOptions
    token: str | None = field(default=None, repr=False)  # travels to a cluster's tasks, never into a repr
    endpoint: str | None = None
    cache_dir: str | Path | None = None


@dataclass
class Prepared:
    """A resolved, checked and measured source, ready for its variants to be built."""

    src: source_stage.Source
    max_seq_len: int
    record: dict  # the manifest's source record
    weight_bytes: int  # of the fp32 model: what sizes each variant build's memory
    files: dict[str, bytes]  # config and tokenizer files the export folder copies
    reference: Reference | None = None
    mixed_plan: MixedPlan | None = None
    int4_rounding: Int4Rounding | None = None  # GPTQ's int4 codes, made once per run for every 4-bit variant
    model: Any = field(default=None, repr=False, compare=False)  # in-process only; never pickled
    streamed: bool = (
        False  # read one decoder layer at a time (hub_export.pipeline.streaming): no model held between stages
    )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "model": None}


def resolve_max_seq_len(config: dict, requested: int | None, sink: tuple[int, int] | None = None) -> int:
    """``requested`` checked against the model's limit, or a phone-friendly default.

    Under an attention sink the cache holds SINK+WINDOW positions, and rope positions
    stay below that however long generation runs.
    """
    limit = archs.max_positions(config)
    if sink is not None:
        if limit and sum(sink) > limit:
            raise InputError(
                f"{opt('attention_sink')} {sink[0]},{sink[1]} needs {sum(sink)} positions; the model has {limit}",
                param="attention_sink",
                hint="choose a smaller window",
            )
        return sum(sink)
    if requested is None:
        return min(limit or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    if limit and requested > limit:
        raise InputError(
            f"{opt('max_seq_len')} {requested} is above the model's limit of {limit} positions", param="max_seq_len"
        )
    return requested


class ConfigView:
    """Attribute access over a config dict (its text config for multimodal wrappers)."""

    def __init__(self, data: dict):
        self._data = data.get("text_config", data) | {"model_type": data.get("model_type")}

    def __getattr__(self, name):
        return self._data.get(name)


def _source_record(src: source_stage.Source, model, task: tasks.Task, lora_files: bool = False) -> dict:
    record = {
        "task": task.name,
        "id": src.name,
        "revision": src.revision,
        "local": src.is_local,
        "model_type": src.model_type,
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    if src.gguf:
        record["gguf"] = dict(src.gguf)
    if src.adapter:
        # kept apart (--lora-files): the merge is only what the card's tokenizer and config came from
        record["adapter"] = {**src.adapter, "separate_files": True} if lora_files else dict(src.adapter)
    record["fingerprint"] = source_stage.fingerprint(src)
    record["chat_template"] = chat_template(src.path) is not None
    if task.module is not None:
        from hub_export.tasks.encoders import stages  # torch-heavy module: loaded by the run, as every stage

        record.update(stages(task).source_record(model, src.path))
    return record


def _check_task_options(options: ExportOptions, task: tasks.Task, config: dict, source: str) -> None:
    """Refuse options that do not apply to ``task`` or to this checkpoint."""
    if options.qmode_encoder is not None and task not in (
        tasks.AUTOMATIC_SPEECH_RECOGNITION,
        tasks.TEXT2TEXT_GENERATION,
        tasks.IMAGE_TEXT_TO_TEXT,
    ):
        raise InputError(
            f"{opt('qmode_encoder')} applies to models with an encoder (speech, text-to-text, vision-language), not "
            f"{task.name}; drop it",
            param="qmode_encoder",
        )
    if task is not tasks.TEXT_GENERATION:
        _check_encoder_options(options, task)
    elif options.share_embeddings and not ConfigView(config).tie_word_embeddings:
        raise InputError(
            f"{source} does not tie its input and output embeddings, so {opt('share_embeddings')} has "
            "nothing to share; drop the flag",
            param="share_embeddings",
        )
    elif options.speculative and options.sliding_cache == "ring" and _has_sliding_layers(config):
        raise InputError(
            f"{source} has sliding-window layers, whose ring buffer cannot take back a rejected draft's positions",
            hint=f"add {opt('sliding_cache')} full (those layers then keep every position, masked)",
            param="speculative",
        )


def _has_sliding_layers(config: dict) -> bool:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return any(window is not None for window in archs.layer_windows(text))


def _check_encoder_options(options: ExportOptions, task: tasks.Task) -> None:
    """Refuse the decoder's options (KV cache, attention sink, shared embeddings) for ``task``."""
    decoder_only = {
        "share_embeddings": options.share_embeddings,
        "speculative": options.speculative,
        "attention_sink": options.attention_sink is not None,
        "kv_cache": options.kv_cache != "fp32",
        "sliding_cache": options.sliding_cache != "ring",
        # calibration reads text through a causal LM; other tasks' int4 layers use HQQ's scales
        "calibration_text": options.calibration_text is not None,
    }
    for name, given in decoder_only.items():
        if given:
            raise InputError(f"{opt(name)} applies to text generation, not {task.name}; drop it", param=name)


def _text_reference(model, src: source_stage.Source, seq_len: int, options: ExportOptions):
    from hub_export.pipeline.build import token_ids  # torch-heavy, like every stage a run needs: loaded by the run
    from hub_export.pipeline.verify import build_reference as build_text_reference

    return build_text_reference(
        model, src.path / "tokenizer.json", seq_len, options.quality_tokens, token_ids(model)[0]
    )


def _encoder_reference(model, src: source_stage.Source, seq_len: int, options: ExportOptions):
    from hub_export.tasks.encoders import (
        build_reference,  # torch-heavy, like every stage a run needs: loaded by the run
    )

    return build_reference(tasks.task_for(src.config, options.task), model, src.path, seq_len)


# What each task's variants are checked against, built once per run from the fp32 model.
_REFERENCE_WORDS = {
    "text-generation": lambda options: f"prompt + {options.quality_tokens} tokens of evaluation text",
    "feature-extraction": lambda options: "64 sentences of evaluation text",
    "fill-mask": lambda options: "a masked word in each of 64 sentences of evaluation text",
    "image-classification": lambda options: "32 drawn images",
    "automatic-speech-recognition": lambda options: "transcripts of the shipped recordings",
    "text2text-generation": lambda options: "answers to 16 prompts of evaluation text",
    "image-text-to-text": lambda options: "answers about 6 drawn images, and 128 tokens of evaluation text",
}


def resolve_source(request: SourceRequest, say: Say | None = None, precheck=None) -> source_stage.Source:
    """``request``'s source on this machine, downloaded through its Hub cache."""
    options = request.options
    return source_stage.resolve(
        request.source,
        revision=options.revision,
        token=request.token,
        endpoint=request.endpoint,
        trust_remote_code=options.trust_remote_code,
        allow_pickle=options.allow_pickle,
        cache_dir=request.cache_dir,
        precheck=precheck,
        gguf_file=options.gguf_file,
        say=say,
        adapter=options.adapter,
        base_model=options.base_model,
    )


def prepare(request: SourceRequest, say: Say) -> Prepared:
    """Resolve, check, load and measure ``request``'s source (the model stays loaded in ``model``)."""
    # torch and the model stages load when a run starts, not on `import hub_export` (the CLI starts fast).
    from hub_export.patches import map_large_allocations
    from hub_export.pipeline.build import load_model

    options = request.options
    resolved_len: dict[str, int] = {}

    def precheck(config: dict) -> None:
        task = tasks.task_for(config, options.task)
        tasks.check_qmodes(task, options.qmodes)
        resolved_len["value"] = resolve_max_seq_len(config, options.max_seq_len, options.sink())
        archs.check_config(ConfigView(config), resolved_len["value"], options, task.name)
        _check_task_options(options, task, config, request.source)
        if task is tasks.TEXT_GENERATION:  # before any download: refuse what cannot fit, with the estimate
            weights = memory_budget.fp32_weight_bytes(config, options.trust_remote_code)
            memory_budget.check_fits(weights, options, streaming.streams(options, task), available_memory())

    say(f"resolving {request.source}", "resolve")
    src = resolve_source(request, say, precheck)
    task = tasks.task_for(src.config, options.task)
    seq_len = resolved_len["value"]
    if task.module is not None:
        from hub_export.tasks.encoders import stages  # torch-heavy module: loaded by the run, as every stage

        seq_len = stages(task).seq_len(src.path, src.config, options.max_seq_len)
    map_large_allocations()
    files = {name: (src.path / name).read_bytes() for name in COPIED_FILES if (src.path / name).is_file()}
    if streaming.can_stream(src, options, task):
        say(f"reading {src.name} ({src.model_type}, {task.name}) one decoder layer at a time", "load")
        layerwise, reference, int4_rounding = streaming.prepare_streamed(
            src, options, seq_len, say, _REFERENCE_WORDS[task.name](options)
        )
        return Prepared(src, seq_len, _source_record(src, layerwise.model, task), _fp32_bytes(layerwise.model), files,
                        reference, None, int4_rounding, streamed=True)  # fmt: skip
    say(f"loading {src.name} ({src.model_type}, {task.name})", "load")
    model = load_model(_weights_folder(src, options), options.trust_remote_code, task)
    reference = None
    if options.verify:
        say(f"computing the fp32 eager reference ({_REFERENCE_WORDS[task.name](options)})", "reference")
        make_reference = _text_reference if task.module is None else _encoder_reference
        with _adapter_applied(model, src, options):
            reference = make_reference(model, src, seq_len, options)
    mixed_plan, int4_rounding = _calibrate(model, src, task, options, say, seq_len)
    return Prepared(
        src=src,
        max_seq_len=seq_len,
        record=_source_record(src, model, task, options.lora_files),
        weight_bytes=_fp32_bytes(model),
        files=files,
        reference=reference,
        mixed_plan=mixed_plan,
        int4_rounding=int4_rounding,
        model=model,
    )


def _weights_folder(src: source_stage.Source, options: ExportOptions) -> Path:
    """Where the weights to quantize are: the base's own with ``--lora-files`` (the adapter stays apart, so every
    adapter of a base writes the same base file), else the source's (a merged adapter's merged folder)."""
    if not options.lora_files:
        return src.path
    if src.lora is None:
        raise InputError(f"{opt('lora_files')} keeps a LoRA adapter apart from its base; the source is not an "
                         f"adapter: pass an adapter folder or Hub id, or {opt('adapter')} beside the base")  # fmt: skip
    from hub_export.pipeline.lora_files import check_separable  # torch-heavy: loaded by the run

    check_separable(src.lora[0])
    return src.lora[1]


@contextlib.contextmanager
def _adapter_applied(model, src: source_stage.Source, options: ExportOptions):
    """With ``--lora-files``, the base ``model`` with the adapter attached while the reference is computed: every
    variant is checked against the model PEFT would run."""
    if not options.lora_files:
        yield
        return
    from hub_export.pipeline.lora_files import attach_lora, detach_lora  # torch-heavy: loaded by the run

    attached = attach_lora(model, src.lora[0])
    try:
        yield
    finally:
        detach_lora(attached)


def _fp32_bytes(model) -> int:
    """Bytes of ``model``'s parameters in float32, tied ones once (loaded, or still on the meta device)."""
    return sum(p.numel() * 4 for p in model.parameters())


def _calibrate(model, src: source_stage.Source, task: tasks.Task, options: ExportOptions, say: Say, seq_len: int):
    """What the calibration text decides once per run: GPTQ's int4 codes and the mixed qmode's int8 layers."""
    mixed_plan = int4_rounding = None
    steps = iter(["calibrate"])  # one progress step, whatever is calibrated (export._stage_count)
    if options.gptq and task.module is None:
        say("rounding int4 weights with GPTQ on the calibration text", next(steps, "note"))
        int4_rounding = round_int4(model, src.path / "tokenizer.json", options, say, seq_len)
        say(f"GPTQ: {len(int4_rounding.packed)} linears on {int4_rounding.tokens} tokens of {int4_rounding.text} "
            f"({int4_rounding.seconds:.0f} s)")  # fmt: skip
    elif options.gptq:
        say(f"int4 weights: HQQ scales (GPTQ calibrates causal language models, not {task.name})", next(steps))
    if any(quantize.QMODES[mode].calibrated for mode in options.qmodes):
        if options.calibration:
            say("measuring each linear layer's int4 sensitivity on the calibration text", next(steps, "note"))
            mixed_plan = plan_mixed(model, src.path / "tokenizer.json", options, say, rounding=int4_rounding)
            say(f"mixed: {mixed_plan.summary()} ({mixed_plan.seconds:.0f} s)")
        else:
            mixed_plan = MixedPlan(calibrated=False)
    return mixed_plan, int4_rounding


def source_on_this_node(src: source_stage.Source, request: SourceRequest) -> source_stage.Source:
    """``src`` as this machine can read it.

    The prepared folder when it is here (the same machine, or storage every node
    mounts); otherwise the same revision resolved again through this machine's Hub
    cache, so each node downloads a source once however many variants it builds.
    """
    if src.path.is_dir():
        return src
    if src.is_local:
        raise ExportError(
            f"{src.name} is a folder on the machine that prepared it, and this node cannot read {src.path}; "
            "export a Hub repo, or put the folder on storage every node mounts at the same path"
        )
    pinned = replace(request.options, revision=src.revision or request.options.revision)
    return resolve_source(SourceRequest(request.source, pinned, request.token, request.endpoint, request.cache_dir))
