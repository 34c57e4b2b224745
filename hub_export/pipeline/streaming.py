"""Streamed export of a text model: the fp32 weights are read one decoder layer at a time, never held whole.

A causal LM in safetensors is prepared and built through a
:class:`~hub_export.pipeline.layerwise.LayerwiseModel`:

- preparing reads each decoder layer once for the fp32 verification reference and
  GPTQ's calibration together (:func:`prepare_streamed`); the reference's prompt is
  extended greedily first, one read of the layers per generated token;
- each variant quantizes the outer parts (embedding, head) first, then reads the
  layers again, quantizing each as it arrives (:func:`quantized_model`), so a
  variant holds its quantized weights and one fp32 layer.

Peak memory is then that of the quantized model plus lowering, instead of the fp32
model plus a quantized copy plus lowering. The files are byte-identical to those of a
model loaded whole: the same fp32 arithmetic reaches every layer, in the same order.

The ``mixed`` qmode measures each linear's effect on the whole model's output, which
needs the whole fp32 model: a run that asks for it loads the model whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hub_export.pipeline import quantize
from hub_export.pipeline.layerwise import LayerwiseModel
from hub_export.progress import time_left
from hub_export.tasks import registry as tasks

if TYPE_CHECKING:
    from torch import nn

    from hub_export.options import ExportOptions
    from hub_export.pipeline.gptq import Int4Rounding
    from hub_export.pipeline.source import Source
    from hub_export.pipeline.verify import Reference

Say = Callable[..., None]


def streams(options: ExportOptions, task: tasks.Task) -> bool:
    """Whether a source of ``task`` exported with ``options`` is read layer by layer (when its weights are
    safetensors): a causal LM whose code comes from transformers, and no qmode that needs the whole fp32 model."""
    return (
        task is tasks.TEXT_GENERATION
        and not options.trust_remote_code
        and not options.lora_files  # the adapter is attached to the loaded base, module by module
        and not any(quantize.QMODES[mode].calibrated for mode in options.qmodes)
    )


def can_stream(src: Source, options: ExportOptions, task: tasks.Task) -> bool:
    """Whether ``src`` is exported layer by layer: :func:`streams`, and its weights are safetensors."""
    return streams(options, task) and LayerwiseModel.can_stream(src.path)


def open_model(src: Source, tables: bool = True) -> LayerwiseModel:
    """``src``'s model on the meta device with its outer parts loaded (but, with ``tables=False``, the embedding
    table and a linear head, left on disk), and its generation config (EOS ids)."""
    from transformers import GenerationConfig

    layerwise = LayerwiseModel.open(src.path, tables=tables)
    if (src.path / "generation_config.json").is_file():
        layerwise.model.generation_config = GenerationConfig.from_pretrained(src.path)
    return layerwise


def prepare_streamed(
    src: Source, options: ExportOptions, seq_len: int, say: Say, reference_words: str
) -> tuple[LayerwiseModel, Reference | None, Int4Rounding | None]:
    """The fp32 reference and GPTQ's codes of ``src``, each decoder layer read once for both (plus one read per
    greedy token of the reference's prompt)."""
    # torch-heavy stages, loaded by the run (this module is imported by the option checks)
    from hub_export.pipeline.calibrate import round_int4_layerwise
    from hub_export.pipeline.verify import build_sequences, reference_of, reference_windows, token_ids

    layerwise = open_model(src)
    tokenizer_json = src.path / "tokenizer.json"
    passes, sequences = [], None
    if options.verify:
        say(f"computing the fp32 eager reference ({reference_words})", "reference")
        steps = iter(range(1, 1 << 30))

        def next_logits(tokens):
            say(f"reference: greedy token {next(steps)} of the prompt (every layer read once)")
            return layerwise.full_pass(tokens, eager=True)

        bos = token_ids(layerwise.model)[0]
        sequences = build_sequences(tokenizer_json, seq_len, options.quality_tokens, bos, logits_of=next_logits)
        passes.append(layerwise.start(reference_windows(sequences), eager=True))
    rounding = None
    if options.gptq:
        say("rounding int4 weights with GPTQ on the calibration text, one decoder layer at a time", "calibrate")
        rounding = round_int4_layerwise(layerwise, tokenizer_json, options, say, seq_len, passes)
        say(f"GPTQ: {len(rounding.packed)} linears on {rounding.tokens} tokens of {rounding.text} "
            f"({rounding.seconds:.0f} s)")  # fmt: skip
    elif passes:
        layerwise.release_tables()
        layerwise.walk(passes, say=say, what="reference")
    reference = None
    if sequences is not None:
        state = passes[0]
        index = {id(window): i for i, window in enumerate(state.windows)}
        reference = reference_of(sequences, lambda tokens: layerwise.logits(state, index[id(tokens)]))
        state.hidden.clear()
    return layerwise, reference, rounding


def quantized_model(
    src: Source, qmode: str, options: ExportOptions, recipe: quantize.Recipe, say: Callable[[str], None]
) -> tuple[nn.Module, list[str]]:
    """``src``'s model quantized as ``qmode`` says, each decoder layer read from the checkpoint and quantized before
    the next: (the model, the layers that fell back to per-channel int8)."""
    # The tables (the embedding, the head: 1.2 GB at Gemma 3's 262,144 x 1,152) are quantized from rows read a slice
    # at a time, never held whole, when this variant quantizes both; and first, before any layer is held.
    layerwise = open_model(src, tables=not (options.qembedding and quantize.QMODES[qmode].config is not None))
    model = layerwise.model
    settings = (qmode, options.qembedding, options.group_size, options.share_embeddings, recipe)
    outer = layerwise.prefix + "."
    outer_fallback = quantize.quantize_model(model, *settings, only=lambda name: not name.startswith(outer))
    unread = [name for name, param in model.named_parameters() if param.is_meta and not name.startswith(outer)]
    if unread:
        raise RuntimeError(f"{unread[0]} was left on disk to be quantized, and was not")
    fallback: list[str] = []
    started = time.perf_counter()
    for index in range(layerwise.count):
        prefix = layerwise.layer_prefix(index)
        layerwise.load_layer(index)
        fallback += quantize.quantize_model(model, *settings, only=lambda name, prefix=prefix: name.startswith(prefix))
        if (index + 1) % 4 == 0:
            say(f"quantizing: decoder layer {index + 1} of {layerwise.count}"
                f"{time_left(started, index + 1, layerwise.count)}")  # fmt: skip
    return model, fallback + outer_fallback
