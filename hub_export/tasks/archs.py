"""Which model families export, for which task, how, and what to watch for.

One registry feeds the source checks, ``hub-export archs`` and the README table, so
the three never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hub_export.errors import InputError, opt


@dataclass(frozen=True)
class Family:
    """A model family and the ``model_type`` values that belong to it."""

    name: str
    model_types: tuple[str, ...]
    cache: str  # "static": full-length KV cache; "+ ring (window)": sliding layers keep a ring buffer of their window
    status: str  # "verified": exported, verified and run in tests; "experimental": not yet covered
    notes: str = ""
    task: str = "text-generation"  # hub_export.tasks.registry.TASKS


# One line a family: a table reads best as one.
# fmt: off
FAMILIES: tuple[Family, ...] = (
    Family("Llama 2/3.x, SmolLM2", ("llama",), "static", "verified", "tied or untied embeddings; llama3/linear/yarn rope scaling"),
    Family("Qwen2 / Qwen2.5", ("qwen2",), "static", "verified", "q/k/v biases; tied embeddings (small sizes)"),
    Family("Qwen3", ("qwen3",), "static", "verified", "QK-norm; head_dim independent of hidden size"),
    Family("Mistral", ("mistral",), "static + ring (window)", "verified", "sliding window exact past the window"),
    Family("Phi-3 / Phi-4-mini", ("phi3",), "static", "verified", "fused qkv/gate-up; partial rotary; longrope only up to its original context"),
    Family("Gemma 2", ("gemma2",), "static + ring (window)", "verified", "attention/final logit soft-capping; alternating sliding layers"),
    Family("Gemma 3 (text)", ("gemma3_text",), "static + ring (window)", "verified", "QK-norm; sliding layers with local rope"),
    Family("SmolLM3", ("smollm3",), "static", "verified", "NoPE layers"),
    Family("OLMo 2", ("olmo2",), "static", "verified", "QK-norm over the full projection"),
    Family("Granite", ("granite",), "static", "verified", "embedding/residual/attention/logit multipliers"),
    Family("StableLM", ("stablelm",), "static", "verified", "LayerNorm; partial rotary"),
    Family("Starcoder2", ("starcoder2",), "static + ring (window)", "verified", "biases; LayerNorm; GELU MLP"),
    Family("GPT-2", ("gpt2",), "static", "verified", "learned absolute positions; Conv1D projections"),
    Family("GPT-NeoX / Pythia", ("gpt_neox",), "static", "verified", "parallel residual; partial rotary"),
    Family("BERT, MiniLM", ("bert",), "none", "verified", "mean/CLS/max pooling, normalised as configured", "feature-extraction"),
    Family("RoBERTa / XLM-R", ("roberta", "xlm-roberta"), "none", "verified", "position ids offset by padding", "feature-extraction"),
    Family("DistilBERT", ("distilbert",), "none", "verified", "no token types", "feature-extraction"),
    Family("MPNet", ("mpnet",), "none", "verified", "relative position bias", "feature-extraction"),
    Family("ModernBERT", ("modernbert",), "none", "verified", "global + sliding-window (local) attention layers", "feature-extraction"),
    Family("Whisper", ("whisper",), "static (decoder)", "verified", "mel front end, encoder and cached decoder as methods of one file; cross-attention K/V once per window", "automatic-speech-recognition"),
    Family("T5 / Flan-T5", ("t5",), "static (decoder)", "verified", "relative position bias over the cache; cross-attention K/V once per input", "text2text-generation"),
    Family("BERT", ("bert",), "none", "verified", "MLM head tied to the token embeddings", "fill-mask"),
    Family("RoBERTa / XLM-R", ("roberta", "xlm-roberta"), "none", "verified", "<mask> token", "fill-mask"),
    Family("DistilBERT", ("distilbert",), "none", "verified", "", "fill-mask"),
    Family("MPNet", ("mpnet",), "none", "verified", "", "fill-mask"),
    Family("ModernBERT", ("modernbert",), "none", "verified", "global + sliding-window (local) attention layers", "fill-mask"),
    Family("ViT", ("vit",), "none", "verified", "patch embeddings + [CLS] head", "image-classification"),
    Family("DeiT", ("deit",), "none", "verified", "distillation token; head averages both", "image-classification"),
    Family("MobileViT", ("mobilevit",), "none", "verified", "convolutions + transformer blocks", "image-classification"),
    Family("ConvNeXt", ("convnext",), "none", "verified", "all-convolutional", "image-classification"),
    Family("EfficientNet", ("efficientnet",), "none", "verified", "depthwise convolutions, squeeze-excite", "image-classification"),
    Family("SmolVLM / SmolVLM2 / Idefics3", ("smolvlm", "idefics3"), "static (decoder)", "verified", "SigLIP tower + pixel-shuffle connector + Llama decoder; one image tile at the tower's size (no splitting)", "image-text-to-text"),
    Family("LLaVA", ("llava",), "static (decoder)", "verified", "CLIP tower (a chosen layer, [CLS] dropped) + MLP projector + any supported decoder", "image-text-to-text"),
    Family("InternVL 2.5 / 3", ("internvl",), "static (decoder)", "verified", "InternViT tower + pixel shuffle + MLP + Qwen2 decoder; one 448-px tile (no dynamic tiling)", "image-text-to-text"),
)
# fmt: on

# What each task accepts, by model_type.
SUPPORTED_MODEL_TYPES: dict[str, frozenset[str]] = {
    task: frozenset(t for f in FAMILIES if f.task == task for t in f.model_types)
    for task in dict.fromkeys(f.task for f in FAMILIES)
}
_WHAT = {
    "text-generation": "decoder-only causal LM",
    "feature-extraction": "sentence-embedding encoder",
    "fill-mask": "masked language model",
    "automatic-speech-recognition": "speech recognition model",
    "text2text-generation": "text-to-text (encoder-decoder) model",
    "image-classification": "image classifier",
    "image-text-to-text": "vision-language model",
}


def family_for(model_type: str, task: str = "text-generation") -> Family:
    """The family of ``model_type`` for ``task``, or an :class:`InputError` naming the supported ones."""
    for family in FAMILIES:
        if model_type in family.model_types and family.task == task:
            return family
    supported = SUPPORTED_MODEL_TYPES.get(task, frozenset())
    raise InputError(
        f"model_type {model_type!r} is not a supported {_WHAT.get(task, task)}; "
        f"supported: {', '.join(sorted(supported))} (see `hub-export archs`)"
    )


def max_positions(config: Mapping[str, Any]) -> int | None:
    """The most positions a checkpoint's ``config.json`` allows a sequence (its text config's, for multimodal ones).

    Example:
        >>> max_positions({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1})
        512
    """
    text = config.get("text_config", config)
    limit = text.get("max_position_embeddings") or text.get("n_positions")
    if limit and text.get("model_type") in ("roberta", "xlm-roberta"):
        # RoBERTa numbers positions from padding_idx + 1: two of its table's rows are never a token's.
        limit -= int(text.get("pad_token_id") or 1) + 1
    return limit


# Rope types whose frequencies change at run time with the sequence length: an exported
# graph freezes one branch, so they are exact only while every position stays within
# the original context.
LENGTH_DEPENDENT_ROPE = {"longrope", "dynamic"}


def _rope_parameters(config) -> list[dict]:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return []
    # Models with per-layer-type rope (e.g. Gemma 3) nest one dict per layer type.
    nested = [v for v in rope.values() if isinstance(v, dict)]
    return nested or [rope]


def check_rope(config, max_seq_len: int) -> None:
    """Refuse a rope that would silently change numerics in the exported graph."""
    for rope in _rope_parameters(config):
        kind = rope.get("rope_type") or rope.get("type") or "default"
        original = rope.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if kind in LENGTH_DEPENDENT_ROPE and original and max_seq_len > original:
            raise InputError(
                f"{kind} rope switches its frequencies past {original} positions at run time, which an exported "
                f"graph cannot reproduce exactly; use {opt('max_seq_len')} {original} or less"
            )


def check_config(config, max_seq_len: int, options=None, task: str = "text-generation") -> Family:
    """Refuse, before any work, a config this exporter cannot export faithfully for ``task``."""
    family = family_for(config.model_type, task)
    if task != "text-generation":
        return family
    check_rope(config, max_seq_len)
    if options is not None and options.attention_sink is not None:
        check_attention_sink(config)
    return family


def check_attention_sink(config) -> None:
    """Refuse an attention sink where wrapping positions inside the cache cannot work."""
    if config.model_type in LEARNED_POSITIONS:
        raise InputError(
            f"{opt('attention_sink')} wraps rope positions, and {config.model_type} has learned "
            "absolute positions instead of rope; export it without the sink",
            param="attention_sink",
        )
    for rope in _rope_parameters(config):
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if kind in LENGTH_DEPENDENT_ROPE:
            raise InputError(
                f"{opt('attention_sink')} cannot work with {kind} rope, whose frequencies change with "
                "the sequence length; export it without the sink",
                param="attention_sink",
            )


LEARNED_POSITIONS = {"gpt2"}  # absolute position embeddings: no rope to wrap


def attention_window(settings: Mapping[str, Any]) -> int | None:
    """A text config's sliding window, or None when every layer attends to the whole context.

    transformers' rule: the window counts only when it is set, not switched off by
    ``use_sliding_window: false``, and (for models that list their layer kinds) some
    layer is a ``sliding_attention`` one.

    Example:
        >>> attention_window({"sliding_window": 4096})
        4096
        >>> attention_window({"sliding_window": 4096, "use_sliding_window": False}) is None
        True
    """
    window = settings.get("sliding_window")
    kinds = settings.get("layer_types") or []
    if not window or settings.get("use_sliding_window", True) is False:
        return None
    if kinds and "sliding_attention" not in kinds:
        return None
    return int(window)


def layer_windows(settings: Mapping[str, Any]) -> list[int | None]:
    """Each layer's sliding window (None: full attention), by :func:`attention_window`'s rule.

    Example:
        >>> layer_windows({"num_hidden_layers": 3, "sliding_window": 512,
        ...                "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]})
        [512, 512, None]
    """
    window = attention_window(settings)
    kinds = settings.get("layer_types") or []
    if kinds:
        return [window if kind == "sliding_attention" else None for kind in kinds]
    return [window] * int(settings["num_hidden_layers"])


def markdown_table() -> str:
    """The support table as Markdown (README and ``hub-export archs --markdown``)."""
    rows = ["| Task | Family | model_type | Cache | Status | Notes |", "|---|---|---|---|---|---|"]
    for f in FAMILIES:
        rows.append(f"| {f.task} | {f.name} | {', '.join(f.model_types)} | {f.cache} | {f.status} | {f.notes} |")
    return "\n".join(rows)
