"""Model card: a README.md for an export folder or a published repo, from its manifest.

The YAML front matter is built in Python with ``yaml.safe_dump`` so that it is always
valid; the Markdown body is a Jinja2 template (``templates/model_card.md.j2``, or any
file given with ``--template``). Everything comes from ``manifest.json`` plus the
license and language inherited from the source model's card, which are kept in the
manifest's ``source["card_data"]`` so that a card can be re-rendered later.

The card holds no token and no absolute local path: it is published as is.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hub_export.errors import InputError, opt
from hub_export.hub.frontier import FRONTIER_PLOT, frontier_png, frontier_points
from hub_export.hub.source_card import CARD_NAME, DECLARED_FLAGS, inherited
from hub_export.pipeline import quantize
from hub_export.pipeline.calibrate import MixedPlan
from hub_export.pipeline.manifest import Manifest, Variant
from hub_export.pipeline.records import Quality
from hub_export.tasks.archs import attention_window
from hub_export.tasks.registry import TASKS, TEXT_GENERATION, Task


def templates_dir() -> Path:
    """The folder holding the bundled templates (``templates/`` at the repository top level).

    Example:
        >>> (templates_dir() / "model_card.md.j2").is_file()
        True
    """
    here = Path(__file__).resolve()  # hub_export/hub/card.py
    top_level = here.parents[2] / "templates"
    # An installed wheel carries them inside the package instead (hub_export.templates).
    packaged = here.parents[1] / "templates"
    return top_level if top_level.is_dir() or not packaged.is_dir() else packaged


def source_url(manifest: Manifest, endpoint: str | None = None) -> str | None:
    """The source model's page on the Hub, or None for a local folder source."""
    source = manifest.source
    if source.get("local") or not source.get("id"):
        return None
    return f"{(endpoint or _default_endpoint()).rstrip('/')}/{source['id']}"


def base_model(manifest: Manifest) -> str | None:
    """The Hub model these files are a quantized copy of: the one the exporter named, else a Hub source."""
    source = manifest.source
    if isinstance(source.get("base_model"), str) and source["base_model"]:
        return source["base_model"]
    if not source.get("local") and source.get("id"):
        return source["id"]
    return None


def model_name(manifest: Manifest) -> str:
    """What the card calls the model: the name given, else the base model, else the source's id or folder."""
    source = manifest.source
    return source.get("model_name") or base_model(manifest) or source.get("id") or "model"


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def task_of(manifest: Manifest) -> Task:
    """The task a manifest's files do (text generation for manifests that do not say)."""
    return TASKS.get(str(manifest.source.get("task") or "text-generation"), TEXT_GENERATION)


def card_metadata(manifest: Manifest, source_card_data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The front matter of the card, key by key, in the order a reader expects.

    Example:
        >>> card_metadata(manifest, {"license": "apache-2.0"})["tags"]
        ['executorch', 'xnnpack', '8da4w', 'llama', 'hub-export']
    """
    source = manifest.source
    data: dict[str, Any] = {}
    # A local folder has no Hub id to point at unless the exporter named one; the Hub wants
    # a relation only with a base.
    base = base_model(manifest)
    if base:
        data["base_model"] = base
        # A merged LoRA adapter changed the base's weights: the files are a fine-tune of it (quantized). Adapters
        # kept apart are what the Hub calls adapters of the base: small files that need the base's beside them.
        adapter = source.get("adapter")
        data["base_model_relation"] = (
            ("adapter" if adapter.get("separate_files") is True else "finetune")
            if isinstance(adapter, Mapping)
            else "quantized"
        )
    data["library_name"] = "executorch"
    data["pipeline_tag"] = task_of(manifest).pipeline_tag
    data.update(_terms(source, source_card_data if source_card_data is not None else source.get("card_data")))
    data["tags"] = _tags(manifest)
    return data


def _terms(source: Mapping[str, Any], card_data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inherited license and language, with the exporter's ``--license`` over the inherited one."""
    terms = inherited(card_data)
    declared = source.get("license")
    if declared and terms.get("license") != declared:
        # The inherited name and link describe another license: they would contradict it.
        terms = {k: v for k, v in terms.items() if k not in ("license_name", "license_link")}
        terms = {"license": declared, **{k: v for k, v in terms.items() if k != "license"}}
    return terms


def _tags(manifest: Manifest) -> list[str]:
    tags = ["executorch", "xnnpack"]
    tags += [v.qmode for v in manifest.variants]
    tags.append(manifest.source.get("model_type") or manifest.source.get("architecture") or "")
    tags.append("hub-export")
    unique: list[str] = []
    for tag in tags:
        if tag and tag not in unique:
            unique.append(tag)
    return unique


def front_matter(data: Mapping[str, Any]) -> str:
    """``data`` as a ``---`` delimited YAML block (safe_dump: valid YAML, never hand-built)."""
    body = yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True, default_flow_style=False)
    return f"---\n{body}---\n"


def human_size(size: int) -> str:
    """Decimal units, as the Hub shows file sizes.

    Example:
        >>> human_size(235776)
        '235.8 KB'
    """
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def _figure(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def quality_cell(quality: Quality | None) -> str:
    """``35.3 (1.71x fp32)``: the variant's perplexity on the evaluation text and its ratio to fp32's."""
    return quality.cell() if quality is not None else "n/a"


def _quality_text(variants: list[Variant]) -> dict[str, Any] | None:
    for variant in variants:
        quality = variant.verification.quality
        if quality is not None and quality.fp32_perplexity is not None:
            return {"name": quality.text, "tokens": quality.tokens, "fp32_perplexity": f"{quality.fp32_perplexity:.1f}"}
    return None


def _lookup_line(variant: Variant) -> str | None:
    """What ``--lookup`` did at export ("1.72x on prompts that quote their input, 1.03x on chat"), or None."""
    record = variant.speculative
    if not record:
        return None
    grounded, chat = record.get("grounded_speedup"), record.get("chat_speedup")
    if grounded is None or chat is None:
        return "not timed at export (unverified, or the shipped prompts exceed its context)"
    return f"{grounded:.2f}x on prompts that quote or rework their input, {chat:.2f}x on open chat"


def _adapter_files_line(variant: Variant) -> str | None:
    """What a device needs for a ``--lora-files`` program: "adapter tone-a: this file (2.1 MB) + base-8da4w.ptd
    (104 MB, the same for every adapter of the base)", or None."""
    adapter = variant.adapter
    if not isinstance(adapter, Mapping) or not variant.data_file or variant.data_size_bytes is None:
        return None
    return (f"adapter {adapter.get('id')}: this file ({human_size(variant.size_bytes)}) + {variant.data_file} "
            f"({human_size(variant.data_size_bytes)}, the same for every adapter of the base)")  # fmt: skip


def variant_facts(variant: Variant) -> dict[str, Any]:
    """A variant's facts as displayed text: the one wording of the card, ``hub-export ls`` and the Space's table."""
    check = variant.verification
    quality = check.quality
    return {
        "file": variant.file,
        "data_file": variant.data_file,
        "qmode": variant.qmode,
        "qembedding": variant.qembedding or "none",
        "group_size": variant.group_size,
        "size": human_size(variant.total_bytes),
        "max_seq_len": variant.max_seq_len,
        "sha256": variant.sha256,
        "eos_ids": list(variant.metadata.get("get_eos_ids", [])),
        "verified": check.verified,
        "skipped": check.skipped,
        "verification": check.summary(),
        "kl": "n/a" if check.skipped else _figure(check.mean_kl_vs_eager, ".2g"),
        "top1": "n/a" if check.skipped else _figure(check.top1_agreement, ".0%"),
        "quality": check.quality_cell() if check.figures else quality_cell(quality),
        "second_quality": quality_cell(check.second_quality) if check.second_quality else None,
        "cosine_vs_eager": _figure((check.figures or {}).get("min_cosine_vs_eager"), ".4f"),
        "cosine_vs_fp32": _figure((check.figures or {}).get("mean_cosine_vs_fp32"), ".4f"),
        "min_cosine_vs_fp32": _figure((check.figures or {}).get("min_cosine_vs_fp32"), ".4f"),
        "retrieval": _figure((check.figures or {}).get("retrieval_vs_fp32"), ".0%"),
        "embedding_dim": variant.metadata.get("get_embedding_dim"),
        **_label_facts(check.figures or {}),
        "quality_top1": _figure(quality.top1 if quality else None, ".0%"),
        "prefill_tps": _figure(check.speed("prefill"), ".0f"),
        "decode_tps": _figure(check.speed("decode"), ".0f"),
        "speed_threads": check.runner_threads if check.speed("decode") and check.runner_threads else None,
        "int4_scales": (variant.recipe or {}).get("int4_scales"),
        "lookup": _lookup_line(variant),
        "adapter_files": _adapter_files_line(variant),
        "mixed": _mixed_line(variant),
        "rounding": _rounding_line(variant),
        **memory_facts(variant),
    }


def _label_facts(figures: Mapping[str, float]) -> dict[str, str]:
    """A fill-mask or image-classification variant's figures as text."""
    return {
        "top1_vs_eager": _figure(figures.get("top1_vs_eager"), ".0%"),
        "kl_vs_eager": _figure(figures.get("mean_kl_vs_eager"), ".2g"),
        "top1_vs_fp32": _figure(figures.get("top1_vs_fp32"), ".0%"),
        "top5_vs_fp32": _figure(figures.get("top5_overlap_vs_fp32"), ".0%"),
        "accuracy": _figure(figures.get("accuracy"), ".0%"),
        "fp32_accuracy": _figure(figures.get("fp32_accuracy"), ".0%"),
        "wer": _figure(figures.get("wer"), ".1%"),
        "fp32_wer": _figure(figures.get("fp32_wer"), ".1%"),
        "wer_vs_fp32": _figure(figures.get("wer_vs_fp32"), ".1%"),
        "encoder_cosine": _figure(figures.get("min_encoder_cosine"), ".4f"),
        "same_answer": _figure(figures.get("same_answer_as_fp32"), ".0%"),
        "image_cosine": _figure(figures.get("min_feature_cosine"), ".4f"),
        "image_kl": _figure(figures.get("image_kl_vs_fp32"), ".3f"),
        "image_top1": _figure(figures.get("image_top1_vs_fp32"), ".0%"),
        "perplexity_ratio": _figure(figures.get("perplexity_ratio"), ".3f"),
        "runner": {1.0: "yes", 0.0: "no"}.get(figures.get("runner_matches"), "n/a"),
    }


_UNSAFE_LABEL = re.compile(r"[^\w .,'()/+-]")


def label_names(config: Mapping[str, Any] | None, limit: int = 12) -> tuple[list[str], int]:
    """(the first ``limit`` label names of a classifier's config, how many it has), made safe to print in a card:
    a config is the source repo's text, so anything beyond letters, digits and plain punctuation is dropped."""
    id2label = (config or {}).get("id2label")
    if not isinstance(id2label, Mapping):
        return [], 0
    names = [
        _UNSAFE_LABEL.sub("", str(value))[:60]
        for _, value in sorted(id2label.items(), key=lambda kv: str(kv[0]).zfill(8))
    ]
    return names[:limit], len(names)


def memory_facts(variant: Variant) -> dict[str, str]:
    """The context, KV cache and memory cells of a variant.

    Example:
        >>> v = Variant("m.pte", "8da4w", None, 32, 2048, 10**8, "0" * 64, {}, Verification(), 1.0,
        ...             kv_cache={"dtype": "int8", "bytes_at_full_context": 4_500_000, "ring_layers": 15, "layers": 18},
        ...             runtime_memory={"peak_rss_bytes": 130_000_000, "context_tokens": 2048})
        >>> memory_facts(v)["memory"], memory_facts(v)["kv_cache"]
        ('130.0 MB', 'int8, 4.5 MB (15 of 18 layers ring)')
    """
    cache = variant.kv_cache or {}
    sink = cache.get("attention_sink")
    context = f"unbounded (sink {sink[0]} + window {sink[1]})" if sink else f"{variant.max_seq_len} tokens"
    if "bytes_at_full_context" not in cache:
        return {"context": context, "kv_cache": "n/a", "memory": "n/a"}
    kv = f"{cache.get('dtype', 'fp32')}, {human_size(cache['bytes_at_full_context'])}"
    if cache.get("ring_layers") and not sink:
        kv += f" ({cache['ring_layers']} of {cache.get('layers', '?')} layers ring)"
    measured = (variant.runtime_memory or {}).get("peak_rss_bytes")
    estimate = variant.total_bytes + cache["bytes_at_full_context"]
    return {
        "context": context,
        "kv_cache": kv,
        "memory": human_size(measured) if measured else f"~{human_size(estimate)} (weights + cache)",
    }


def _rounding_line(variant: Variant) -> str | None:
    """How GPTQ calibrated the int4 codes, in a few words (the text label is schema-checked, plain)."""
    gptq = (variant.recipe or {}).get("gptq")
    if not isinstance(gptq, dict):
        return None
    return f"int4 weights GPTQ-rounded on {int(gptq.get('tokens', 0))} tokens of {gptq.get('text', '')}"


def _mixed_line(variant: Variant) -> str | None:
    """The mixed qmode's plan in one line (layer names are schema-checked: letters, digits, dots)."""

    plan = MixedPlan.from_dict((variant.recipe or {}).get("mixed"))
    return plan.summary() if plan is not None else None


def _gguf_view(gguf: Any) -> dict[str, str] | None:
    if not isinstance(gguf, Mapping) or not isinstance(gguf.get("file"), str):
        return None
    return {"file": gguf["file"], "quantization": str(gguf.get("quantization") or "unknown")}


def _adapter_view(adapter: Any, endpoint: str | None) -> dict[str, Any] | None:
    """A merged LoRA adapter as the card states it (a manifest is untrusted: only well-typed values pass)."""
    if not isinstance(adapter, Mapping) or not isinstance(adapter.get("id"), str):
        return None
    local = adapter.get("revision") is None
    merge = adapter.get("merge") if isinstance(adapter.get("merge"), Mapping) else {}
    number = lambda value: value if isinstance(value, (int, float)) and not isinstance(value, bool) else None  # noqa: E731
    targets = adapter.get("target_modules")
    return {
        "id": adapter["id"],
        "url": None if local else f"{(endpoint or _default_endpoint()).rstrip('/')}/{adapter['id']}",
        "rank": number(adapter.get("r")),
        "alpha": number(adapter.get("lora_alpha")),
        "targets": ", ".join(t for t in targets if isinstance(t, str)) if isinstance(targets, list) else "",
        "dora": adapter.get("use_dora") is True,
        "rslora": adapter.get("use_rslora") is True,
        "separate": adapter.get("separate_files") is True,
        "max_logit_diff": number(merge.get("max_logit_diff_vs_peft")),
        "top1_changed": number(merge.get("top1_changed_vs_base")),
        "summary": adapter["summary"][:400] if isinstance(adapter.get("summary"), str) else None,
    }


def card_context(
    manifest: Manifest,
    source_card_data: Mapping[str, Any] | None = None,
    endpoint: str | None = None,
    repo_id: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the template may use, already formatted (templates stay logic-free)."""
    source = manifest.source
    variants = [variant_facts(v) for v in manifest.variants]
    card_data = card_metadata(manifest, source_card_data)
    base = base_model(manifest)
    return {
        "card_data": card_data,
        "model_name": model_name(manifest),
        "base_model": base,
        "base_model_url": f"{(endpoint or _default_endpoint()).rstrip('/')}/{base}" if base else None,
        "license": card_data.get("license"),
        "source_id": source.get("id") or "model",
        "source_url": source_url(manifest, endpoint),
        "source_local": bool(source.get("local")),
        "local_placeholder": local_placeholder(manifest),
        "source_revision": source.get("revision"),
        "model_type": source.get("model_type") or "",
        "architecture": source.get("architecture") or "",
        "num_parameters": source.get("num_parameters"),
        "gguf": _gguf_view(source.get("gguf")),
        "adapter": _adapter_view(source.get("adapter"), endpoint),
        "quality_text": _quality_text(manifest.variants),
        "chat": bool(source.get("chat_template")),
        "task": task_of(manifest).name,
        "pooling": source.get("pooling") or {},
        "embedding_dim": source.get("embedding_dim"),
        "mask_token": source.get("mask_token") if source.get("mask_token") in ("[MASK]", "<mask>") else None,
        "image_size": _image_size(source.get("image_size")),
        "image_side": source.get("image_size")
        if isinstance(source.get("image_size"), int) and 0 < source.get("image_size") < 100_000
        else None,
        "prompt_before": _python_string((source.get("image_prompt") or ["", ""])[0]),
        "prompt_after": _python_string((source.get("image_prompt") or ["", ""])[1]),
        "max_images": source.get("max_images") if isinstance(source.get("max_images"), int) else None,
        "labels": label_names(config)[0],
        "num_labels": label_names(config)[1],
        "repo_id": repo_id,
        "variants": variants,
        "qmodes": [quantize.QMODES[mode] for mode in dict.fromkeys(v.qmode for v in manifest.variants)],
        "frontier_plot": FRONTIER_PLOT if len(frontier_points(manifest)) > 2 else None,
        "first": variants[0] if variants else None,
        "machine": manifest.machine or "an unrecorded machine",
        "commands": reproduce_commands(manifest),
        "versions": dict(manifest.versions),
        "hub_export_version": manifest.versions.get("hub-export", ""),
        "max_seq_lens": sorted({v.max_seq_len for v in manifest.variants}),
        "sliding_window": sliding_window(config),
        "ring_cache": any((v.kv_cache or {}).get("ring_layers") for v in manifest.variants),
        "attention_sink": any((v.kv_cache or {}).get("attention_sink") for v in manifest.variants),
        "config_known": bool(config),
        "all_verified": all(v["verified"] for v in variants),
    }


def _python_string(value: Any) -> str:
    """``value`` as a Python string literal that is safe inside a Markdown code block (the text comes from the
    source repo's chat template: hostile)."""
    text = value if isinstance(value, str) else ""
    return json.dumps(text[:400]).replace("`", "\\u0060")


def _image_size(value: Any) -> str | None:
    """``224x224`` from a manifest's ``[height, width]``, or None."""
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and 0 < v < 100_000 for v in value):
        return f"{value[0]}x{value[1]}"
    return None


def local_placeholder(manifest: Manifest) -> str | None:
    """``path/to/NAME``: what a reproduce command names instead of a local source nobody else has."""
    source = manifest.source
    if not source.get("local"):
        return None
    gguf = _gguf_view(source.get("gguf"))
    # A GGUF given as a file path was recorded by its file name; a folder by the folder's.
    name = _recorded_source(manifest) or (gguf["file"] if gguf else source.get("id")) or "model"
    return f"path/to/{Path(name).name}"


def _recorded_source(manifest: Manifest) -> str | None:
    """The source argument of the manifest's first ``hub-export export`` command."""
    for line in manifest.command.splitlines():
        words = _words(line)
        if words and words[:2] == ["hub-export", "export"] and len(words) > 2:
            return words[2]
    return None


def _words(line: str) -> list[str] | None:
    try:
        return shlex.split(line)
    except ValueError:
        return None


def reproduce_commands(manifest: Manifest) -> list[str]:
    """The manifest's export commands, made runnable by a reader of the card.

    A local source becomes a ``path/to/NAME`` placeholder (the folder name alone would
    name a folder nobody has), and what the exporter declared (``--base-model``,
    ``--license``, ``--model-name``) is passed again, so the command rebuilds this card too.
    """
    placeholder = local_placeholder(manifest)
    commands = []
    for line in manifest.command.splitlines():
        words = _words(line)
        if not line.strip() or not words or words[:2] != ["hub-export", "export"] or len(words) < 3:
            if line.strip():
                commands.append(line)
            continue
        if placeholder:
            words[2] = placeholder
        missing = [
            part
            for key, flag in DECLARED_FLAGS.items()
            if isinstance(manifest.source.get(key), str) and manifest.source[key] and flag not in words
            for part in (flag, manifest.source[key])
        ]
        words[3:3] = missing  # after the source, where the export recorded them
        commands.append(shlex.join(words))
    return commands


def sliding_window(config: Mapping[str, Any] | None) -> int | None:
    """The attention window of a model config (its text config, for multimodal ones), or None when
    it attends to the whole context: the rule the export's cache follows (:func:`hub_export.tasks.archs.attention_window`).

    Example:
        >>> sliding_window({"model_type": "mistral", "sliding_window": 4096})
        4096
        >>> sliding_window({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False})
    """

    return attention_window(dict((config or {}).get("text_config") or config or {}))


def _environment(template: Path | None):
    from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined

    # A user's template may include the bundled parts (_card_about.md.j2, ...) by name.
    folders = [str(template.parent)] if template else []
    return Environment(
        loader=ChoiceLoader([FileSystemLoader(folders + [str(templates_dir())])]),
        autoescape=False,  # Markdown, not HTML
        undefined=StrictUndefined,  # a typo in a template fails loudly instead of printing nothing
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_card(
    manifest: Manifest,
    source_card_data: Mapping[str, Any] | None = None,
    template: str | Path | None = None,
    endpoint: str | None = None,
    *,
    repo_id: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> str:
    """The model card (front matter + Markdown body) for ``manifest``.

    ``source_card_data`` is the source card's front matter (license and language are
    inherited; default: ``manifest.source["card_data"]``). ``template`` replaces the
    bundled body template; it gets the context of :func:`card_context`. ``endpoint``
    is used for the link to the source model, ``repo_id`` in the usage commands, and
    ``config`` (the model's ``config.json``) for the sliding-window note.

    Example:
        >>> manifest = Manifest.read("out")
        >>> card = render_card(manifest, {"license": "apache-2.0"}, repo_id="alice/tiny-ExecuTorch")
        >>> card.splitlines()[0]
        '---'

    Raises:
        InputError: ``template`` is not a valid Jinja template or fails to render.
    """
    from jinja2 import TemplateError

    path = Path(template) if template else None
    if path is not None and not path.is_file():
        raise InputError(f"template {path.name} not found; pass an existing file to {opt('template')}")
    context = card_context(manifest, source_card_data, endpoint, repo_id, config)
    try:
        name = path.name if path else task_of(manifest).card_template
        body = _environment(path).get_template(name).render(**context)
    except TemplateError as error:
        raise InputError(f"the card template failed to render: {error}") from None
    return front_matter(context["card_data"]) + body.lstrip("\n")


def read_config(folder: str | Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict, or ``{}`` when absent or unreadable."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_card(
    folder: str | Path,
    source_card_data: Mapping[str, Any] | None = None,
    template: str | Path | None = None,
    endpoint: str | None = None,
    *,
    repo_id: str | None = None,
) -> Path:
    """Render ``folder/README.md`` from ``folder/manifest.json`` and return its path.

    Example:
        >>> write_card("out", template="my_card.md.j2")
        PosixPath('out/README.md')
    """
    folder = Path(folder)
    manifest = Manifest.read(folder)
    text = render_card(manifest, source_card_data, template, endpoint, repo_id=repo_id, config=read_config(folder))
    plot = frontier_png(manifest)
    if plot is not None:
        (folder / FRONTIER_PLOT).write_bytes(plot)
    path = folder / CARD_NAME
    path.write_text(text, encoding="utf-8")
    return path
