"""Which decoder families export, how, and what to watch for.

One registry feeds the source checks, ``hub-export archs`` and the README table, so
the three never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class Family:
    """A model family and the ``model_type`` values that belong to it."""

    name: str
    model_types: tuple[str, ...]
    cache: str  # "static" or "static (window >= max_seq_len)"
    status: str  # "verified": exported, verified and run in tests; "experimental": not yet covered
    notes: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("Llama 2/3.x", ("llama",), "static", "verified", "tied and untied embeddings; rope scaling as in transformers"),
    Family("SmolLM2", ("llama",), "static", "verified", "Llama architecture, tied embeddings"),
    Family("Qwen2 / Qwen2.5", ("qwen2",), "static", "experimental", "q/k/v biases; sliding window disabled in released configs"),
    Family("Qwen3", ("qwen3",), "static", "experimental", "QK-norm"),
    Family("Mistral", ("mistral",), "static", "experimental", "sliding window exact while max_seq_len <= window"),
    Family("Phi-3 / Phi-4-mini", ("phi3",), "static", "experimental", "fused qkv; partial rotary (Phi-4-mini)"),
    Family("OLMo 2", ("olmo2",), "static", "experimental", "QK-norm over the full projection"),
    Family("Granite", ("granite",), "static", "experimental", "embedding/residual/attention/logit multipliers"),
    Family("SmolLM3", ("smollm3",), "static", "experimental", "NoPE layers"),
)

SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(t for f in FAMILIES for t in f.model_types)


def family_for(model_type: str) -> Family:
    """The family of ``model_type``, or an :class:`InputError` naming the supported ones."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise InputError(
        f"model_type {model_type!r} is not a supported decoder-only causal LM; "
        f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))} (see `hub-export archs`)"
    )


def check_config(config, max_seq_len: int) -> Family:
    """Refuse, before any work, a config this exporter cannot export faithfully."""
    family = family_for(config.model_type)
    return family


def markdown_table() -> str:
    """The support table as Markdown (README and ``hub-export archs --markdown``)."""
    rows = ["| Family | model_type | Cache | Status | Notes |", "|---|---|---|---|---|"]
    for f in FAMILIES:
        rows.append(f"| {f.name} | {', '.join(f.model_types)} | {f.cache} | {f.status} | {f.notes} |")
    return "\n".join(rows)
