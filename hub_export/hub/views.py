"""What the Space shows of a published repo, in the card's and ``hub-export ls``'s words: the variants table,
the preview's dropdown entries, a card for display."""

from __future__ import annotations

from typing import Any

from hub_export.hub.card import human_size, variant_facts
from hub_export.pipeline.manifest import Manifest

TABLE_HEADERS = [
    "file", "this job", "size", "max context", "memory at full context", "verified", "verification", "perplexity (vs fp32)", "prefill tok/s",
    "decode tok/s",
]  # fmt: skip


def variant_rows(manifest: Manifest, this_job: list[str]) -> list[list[Any]]:
    """One row per variant in the repo (:data:`TABLE_HEADERS`), in the card's and ``hub-export ls``'s words."""
    rows = []
    for variant in manifest.variants:
        facts = variant_facts(variant)
        rows.append([
            variant.file, "yes" if variant.file in this_job else "", facts["size"], facts["context"], facts["memory"],
            "yes" if facts["verified"] else "no", facts["verification"], facts["quality"], facts["prefill_tps"],
            facts["decode_tps"],
        ])  # fmt: skip
    return rows


def variant_choices(manifest: Manifest) -> list[tuple[str, str]]:
    """Dropdown entries: label with size and context, value the file name (what ``pull`` takes)."""
    return [(f"{v.file} · {human_size(v.total_bytes)} · {v.max_seq_len} tokens", v.file) for v in manifest.variants]


def drafter_choices(manifest: Manifest | None) -> list[tuple[str, str]]:
    """The "several tokens per step" entries: off, prompt lookup, and each of the repo's variants as a draft
    (:func:`hub_export.service.drafter_choice` reads them)."""
    variants = manifest.variants if manifest is not None else []
    drafts = [(f"draft with {v.file} · {human_size(v.total_bytes)}", f"draft:{v.file}") for v in variants]
    return [("off", "off"), ("prompt lookup", "lookup"), *(drafts if len(drafts) > 1 else [])]


def card_markdown(text: str) -> str:
    """A model card for display: its YAML front matter as a code block, then the Markdown body."""
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end != -1:
            front, body = text[4:end], text[end + 4 :].lstrip("\n")
            return f"```yaml\n{front}\n```\n\n{body}"
    return text
