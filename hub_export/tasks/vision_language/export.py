"""Vision-language models: an image and a prompt in, text out, as one ``.pte`` that ExecuTorch's
``MultimodalRunner`` runs.

The file has the three methods the runner calls (``extension/llm/runner``):

- ``vision_encoder``: RGB bytes ``[1, 3, size, size]`` (uint8) -> the image's embeddings in the
  text model's space ``[1, image_tokens, hidden]``. Rescaling and normalising happen inside
  (the processor's mean and std are baked in), so a device hands the runner the pixels of an
  image resized to ``size`` x ``size`` and nothing else;
- ``token_embedding``: token ids ``[1, n]`` -> ``[1, n, hidden]``;
- ``text_decoder``: embeddings ``[1, n, hidden]`` and their cache positions ``[n]`` -> the
  last position's next-token scores ``[1, 1, vocab]``, with the same static KV cache, fused
  attention and sliding-window rings as a text-generation file (:mod:`hub_export.tasks.text_generation.export`).

The runner prefills text, image and text again in order (each image's embeddings take
``image_tokens`` cache positions), then decodes one token at a time through
``token_embedding`` and ``text_decoder``. Around each image, the prompt carries the
family's marker tokens (SmolVLM: ``<fake_token_around_image><global-img>`` ...
``<fake_token_around_image>``): :func:`prompt_segments` lays them out from the model's chat
template, where the template writes its image placeholder.

Families differ in how pixels become embeddings (:data:`FAMILIES`): Idefics3/SmolVLM run a
SigLIP tower and a pixel-shuffle connector; LLaVA a CLIP tower's second-to-last layer and an
MLP projector; InternVL an InternViT tower, pixel shuffle and an MLP into a Qwen2 decoder. Verification (:func:`verify_variant`) checks each method against the eager
model with the same quantization on drawn images: the image embeddings' cosine, then the
decoder's KL and top-1 over the image-and-prompt prefix and a teacher-forced answer; it
reports what quantization cost against fp32 (same greedy answer, KL, the decoder's text
perplexity) and runs one image through ``MultimodalRunner`` itself.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError, VerificationError, first_line, opt
from hub_export.patches import delegable_norms
from hub_export.patches.lowering import forget_compiled_globals
from hub_export.pipeline import quantize
from hub_export.pipeline.build import token_ids as decoder_token_ids
from hub_export.pipeline.lower import runner_metadata
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.pipeline.verify import (  # the text decoder's bounds, one definition
    TIE_NATS,
    eval_text,
)
from hub_export.runtime.process_env import pte_process_env
from hub_export.tasks.archs import SUPPORTED_MODEL_TYPES
from hub_export.tasks.encoders import EncodedAndScored, first_failure, label_figures, score_checks, score_limits
from hub_export.tasks.image_classification.export import draw
from hub_export.tasks.speech.export import delegable_layer_norms
from hub_export.tasks.text_generation.export import needs_strict_tracing
from hub_export.tasks.text_generation.kv_cache import plan_layers
from hub_export.tasks.vision_language.model import (
    MAX_IMAGES,
    METHODS,
    Family,
    VisionLanguageModel,
    family_of,
    zero_cache,
)
from hub_export.tasks.vision_language.run import (
    EagerSteps,
    Prompt,
    VisionLanguageFile,
    build_prompt,
    greedy,
    greedy_until,
    load_image,
    perplexity,
    prompt_segments,
    render_chat,
    teacher_forced,
    text_scores,
    token_bytes,
)

DEFAULT_SEQ_LEN = 1024
EVAL_IMAGES = 6
NEW_TOKENS = 12  # the fp32 model's greedy answer each variant is teacher-forced on
PERPLEXITY_TOKENS = 128  # of the shipped prose, one decoder step each: the decoder's text perplexity
# Least cosine of the file's image embeddings to the eager model's (same quantization), by kind of file.
MIN_FEATURE_COSINE = {"fp32": 0.9999, "weight_only": 0.999, "dynamic": 0.99}
EXAMPLE_QUESTION = "What is in this picture?"
EVAL_QUESTIONS = (
    "What shape is in the picture?",
    "Which colours do you see?",
    "Describe this image in one sentence.",
)


# -- families ---------------------------------------------------------------------------------------------


# -- the file's methods -------------------------------------------------------------------------------------


# -- the encoder-task stages ----------------------------------------------------------------------------


def seq_len(folder: Path, config: dict, requested: int | None) -> int:
    """The decoder's cache: ``requested`` or :data:`DEFAULT_SEQ_LEN`, and room for at least one image and a prompt."""
    family = family_of(config)
    from transformers import AutoConfig

    loaded = AutoConfig.from_pretrained(folder)
    text_type = loaded.get_text_config().model_type
    if text_type not in SUPPORTED_MODEL_TYPES["text-generation"]:
        raise InputError(
            f"{loaded.model_type}'s text model is {text_type!r}, not a decoder hub-export exports; supported: "
            f"{', '.join(sorted(SUPPORTED_MODEL_TYPES['text-generation']))} (see `hub-export archs`)"
        )
    need = family.image_tokens(loaded) + 32
    length = requested or max(DEFAULT_SEQ_LEN, need)
    if length < need:
        raise InputError(
            f"{opt('max_seq_len')} {length} leaves no room for an image: one takes {family.image_tokens(loaded)} "
            f"positions; pass at least {need}",
            param="max_seq_len",
        )
    return length


def wrap(model: nn.Module, folder: Path, max_seq_len: int = DEFAULT_SEQ_LEN) -> VisionLanguageModel:
    return VisionLanguageModel(model, folder, max_seq_len)


def export(wrapped: VisionLanguageModel, max_seq_len: int) -> dict[str, torch.export.ExportedProgram]:
    """The three methods: a fixed image size, a dynamic number of tokens (prefill) for the other two.

    The vision tower is traced with transformers' eager attention (matmul, softmax, matmul) and its LayerNorms in
    the 4D shape XNNPACK delegates: SDPA's decomposition leaves mask arithmetic (``eq``, ``any``, ``where``) and
    ``native_layer_norm`` outside XNNPACK, which split SmolVLM's 12-layer tower into 50 partitions.
    """
    tokens = torch.export.Dim("tokens", min=1, max=wrapped.text_decoder.max_seq_len - 1)
    image = torch.zeros(1, 3, wrapped.image_size, wrapped.image_size, dtype=torch.uint8)
    ids = torch.zeros(1, 2, dtype=torch.long)
    with torch.no_grad(), delegable_norms(wrapped), forget_compiled_globals():
        embeds = wrapped.token_embedding(ids)
        with vision_attention(wrapped, "eager"), delegable_layer_norms(wrapped.vision_encoder):
            vision = torch.export.export(wrapped.vision_encoder, (image,), strict=False)
        programs = {
            "vision_encoder": vision,
            "token_embedding": torch.export.export(
                wrapped.token_embedding, (ids,), dynamic_shapes=({1: tokens},), strict=False
            ),
            "text_decoder": torch.export.export(
                wrapped.text_decoder,
                (embeds, torch.arange(2)),
                dynamic_shapes=({1: tokens}, {0: tokens}),
                strict=_strict(wrapped.text_decoder.layout),
            ),
        }
    zero_cache(wrapped)
    return programs


@contextlib.contextmanager
def vision_attention(wrapped: VisionLanguageModel, name: str):
    """Run the vision tower with attention implementation ``name`` (transformers reads it at every forward)."""
    config = wrapped.config.vision_config
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


def _strict(layout) -> bool:
    return needs_strict_tracing(layout)


def token_ids(model: nn.Module) -> tuple[int | None, list[int]]:
    return decoder_token_ids(model)


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    """What ``MultimodalRunner`` reads (``extension/llm/runner/constants.h``), plus the image's geometry."""
    family = family_of(model.config)
    bos, eos = token_ids(model)
    values = runner_metadata(
        max_seq_len=max_seq_len,
        bos_id=bos,
        eos_ids=eos,
        vocab_size=int(model.config.get_text_config().vocab_size),
        dynamic_shape=True,
    )
    values.update(
        {
            "get_image_size": family.image_size(model.config),
            "get_image_tokens": family.image_tokens(model.config),
            "get_max_images": MAX_IMAGES,
        }
    )
    return values


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    """The family, the image geometry and the text around one image in a chat turn (for the card's snippet)."""
    family = family_of(model.config)
    record = {
        "methods": list(METHODS),
        "family": family.name,
        "image_size": family.image_size(model.config),
        "image_tokens": family.image_tokens(model.config),
        "max_images": MAX_IMAGES,
    }
    try:
        segments = prompt_segments(render_chat(folder, EXAMPLE_QUESTION, 1), family, 1)
    except InputError:
        return record
    if len(segments) == 3:
        record["image_prompt"] = [segments[0], segments[2]]
    return record


def quantize_model(model: nn.Module, qmode: str, options) -> list[str]:
    """``qmode`` for the text model's linear layers (``options.qmode_encoder`` for the vision tower and connector),
    ``qembedding`` for the token table; the patch convolution stays float."""
    family = family_of(model.config)
    quantize.drop_padding_index(model)
    vision = family.vision_module(model)
    text = family.language_model(model)
    quantize.quantize_embeddings(text, options.qembedding)
    fallback = quantize.quantize_linears(vision, options.qmode_encoder or qmode, options.group_size)
    fallback += quantize.quantize_linears(model, qmode, options.group_size, exclude=tuple(vision.modules()))
    return fallback


# -- prompts -------------------------------------------------------------------------------------------------


# -- running a prompt: the eager wrapper and the file share one loop ----------------------------------------


# -- reference and verification ---------------------------------------------------------------------------


@dataclass
class VisionLanguageReference:
    """The drawn images and questions every variant answers, and the fp32 eager model's answers."""

    items: list[str]  # what each image shows, in words
    prompts: list[Prompt]
    answers: list[list[int]]  # fp32 eager's greedy answer tokens
    scores: list[torch.Tensor]  # fp32 eager's teacher-forced scores
    features: list[torch.Tensor]  # fp32 eager's image embeddings
    text_ids: list[int]  # shipped prose for the decoder's perplexity
    fp32_perplexity: float
    eos: list[int]
    max_seq_len: int
    tokenizer_json: str

    @property
    def inputs(self) -> list[Prompt]:
        return self.prompts


def eval_prompts(folder: Path, family: Family, size: int, tokenizer) -> tuple[list[str], list[Prompt]]:
    items, prompts = [], []
    for index in range(EVAL_IMAGES):
        image, what = draw(index, size)
        items.append(what)
        question = EVAL_QUESTIONS[index % len(EVAL_QUESTIONS)]
        prompts.append(build_prompt(folder, family, question, [load_image(image, size)], tokenizer))
    return items, prompts


def _eval_text_ids(tokenizer) -> list[int]:
    return tokenizer.encode(eval_text(), add_special_tokens=False).ids[:PERPLEXITY_TOKENS]


def reference(model: nn.Module, folder: Path, max_seq_len: int) -> VisionLanguageReference:
    """Answer the drawn images with the fp32 eager model, through the loop the file will run."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    wrapped = wrap(model, folder, max_seq_len).eval()
    steps = EagerSteps(wrapped)
    items, prompts = eval_prompts(folder, wrapped.family, wrapped.image_size, tokenizer)
    _, eos = token_ids(model)
    answers, scores, features = [], [], []
    for prompt in prompts:
        answer = greedy(steps, prompt, NEW_TOKENS, set(eos), max_seq_len)
        rows, embeds = teacher_forced(steps, prompt, answer)
        answers.append(answer)
        scores.append(rows)
        features.append(torch.cat(embeds, dim=1))
    text_ids = _eval_text_ids(tokenizer)
    fp32_perplexity = perplexity(text_scores(steps, text_ids), text_ids)
    zero_cache(wrapped)
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    return VisionLanguageReference(items, prompts, answers, scores, features, text_ids, fp32_perplexity, eos,
                                   max_seq_len, tokenizer_json)  # fmt: skip


def expected(wrapped: VisionLanguageModel, reference: VisionLanguageReference) -> EncodedAndScored:
    steps = EagerSteps(wrapped)
    features, scores = [], []
    for prompt, answer in zip(reference.prompts, reference.answers, strict=True):
        rows, embeds = teacher_forced(steps, prompt, answer)
        scores.append(rows)
        features.append(torch.cat(embeds, dim=1))
    zero_cache(wrapped)
    return EncodedAndScored(features, scores)


def _decode(reference: VisionLanguageReference, tokens: list[int]) -> str:
    """``tokens`` as the runner prints them: each token's bytes, leaving out a token that is one byte but neither
    printable nor a space (the runner's ``safe_printf`` skips those), decoded with replacement as
    :func:`runner_generate` decodes the runner's output."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(reference.tokenizer_json)
    byte_level = json.loads(reference.tokenizer_json).get("decoder", {}) or {}
    byte_level = byte_level.get("type") == "ByteLevel"
    out = bytearray()
    for token in tokens:
        raw = token_bytes(tokenizer, token, byte_level)
        if len(raw) == 1 and not (32 <= raw[0] < 127 or raw[0] in b" \t\n\v\f\r"):
            continue
        out += raw
    return out.decode(errors="replace")


def _checks(figures: dict, limits: dict) -> list[tuple[bool, str]]:
    """(failed, why) of each pass/fail check against the eager model with the same quantization."""
    return [
        (figures["min_feature_cosine"] < limits["min_feature_cosine_required"], f"image embeddings' cosine to eager "
         f"{figures['min_feature_cosine']:.4f} is below {limits['min_feature_cosine_required']}"),
        *score_checks(figures, limits),
    ]  # fmt: skip


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def verify_variant(
    pte_path: str | Path,
    expected: EncodedAndScored,
    reference: VisionLanguageReference,
    mode: QMode,
    qembedding: str | None,
    runner_check: bool = True,
) -> Verification:
    """Each method against quantized eager (pass/fail), the answers against fp32's (quality), one prompt in
    ``MultimodalRunner``."""
    kind = mode.tolerance
    limits = {"min_feature_cosine_required": MIN_FEATURE_COSINE[kind], **score_limits(mode)}
    try:
        file = VisionLanguageFile(pte_path)
        rows, cosines, answers, stops = [], [], [], []
        for index, prompt in enumerate(reference.prompts):
            scores, embeds = teacher_forced(file, prompt, reference.answers[index])
            rows.append(scores)
            cosines.append(_cosine(torch.cat(embeds, dim=1), expected.encoded[index]))
            answer, stop = greedy_until(file, prompt, NEW_TOKENS, set(reference.eos), file.max_seq_len)
            answers.append(answer)
            stops.append(stop)
        text = text_scores(file, reference.text_ids)
        runner = runner_answer(pte_path, reference) if runner_check else None
    except (VerificationError, InputError) as error:
        return Verification(False, failure=f"runtime error: {first_line(error)[:200]}", figures=limits)
    eager = label_figures(torch.cat(rows), torch.cat(expected.scores), TIE_NATS[kind])
    fp32 = label_figures(torch.cat(rows), torch.cat(reference.scores), TIE_NATS[kind])
    same = [a == b for a, b in zip(answers, reference.answers, strict=True)]
    figures = {
        **limits,
        "images": float(len(rows)),
        "min_feature_cosine": min(cosines),
        "mean_kl_vs_eager": eager["mean_kl"],
        "top1_vs_eager": eager["top1_within_ties"],
        "image_kl_vs_fp32": fp32["mean_kl"],
        "image_top1_vs_fp32": fp32["top1"],
        "same_answer_as_fp32": sum(same) / len(same),
        "perplexity": perplexity(text, reference.text_ids),
        "fp32_perplexity": reference.fp32_perplexity,
    }
    figures["perplexity_ratio"] = figures["perplexity"] / reference.fp32_perplexity
    checks = _checks(figures, limits)
    if runner is not None:
        # What the runner prints: the answer, then the end token's text where one stopped it (the runner prints
        # it, and when the very first token is an end token it goes on generating after it).
        own = _decode(reference, answers[0] + ([stops[0]] if stops[0] is not None else []))
        figures["runner_matches"] = float(runner.startswith(own))
        checks.append((not runner.startswith(own), f"MultimodalRunner answered {runner[:40]!r}, the file's own loop "
                       f"{own[:40]!r}"))  # fmt: skip
    failure = first_failure(checks)
    positions = int(sum(r.shape[0] for r in rows))
    return Verification(failure is None, positions=positions, failure=failure, figures=figures)


# -- MultimodalRunner ----------------------------------------------------------------------------------------


RUNNER_TIMEOUT_S = 600.0
MULTIMODAL_PROBE = Path(__file__).with_name("runner_probe.py")


def runner_generate(pte_path: str | Path, tokenizer_json: str | Path, prompt: Prompt, max_new_tokens: int) -> dict:
    """Generate greedily with ExecuTorch's ``MultimodalRunner`` in a fresh process (``multimodal_probe.py``):
    {"text": the answer's bytes decoded with replacement, "stats": the runner's own figures}.

    Raises:
        VerificationError: the runner fails on the file.
    """
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hub-export-runner-") as scratch:
        parts = []
        for index, part in enumerate(prompt.parts):
            if isinstance(part, int):
                image = prompt.images[part][0]
                path = Path(scratch) / f"image-{index}.rgb"
                path.write_bytes(image.contiguous().numpy().tobytes())
                parts.append({"image": str(path), "size": int(image.shape[-1])})
            else:
                parts.append({"tokens": list(part)})
        (Path(scratch) / "parts.json").write_text(json.dumps(parts))
        out = Path(scratch) / "stats.json"
        command = [sys.executable, str(MULTIMODAL_PROBE), str(pte_path), str(tokenizer_json), str(int(max_new_tokens)),
                   str(Path(scratch) / "parts.json"), str(out)]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, env=pte_process_env(), timeout=RUNNER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise VerificationError(f"MultimodalRunner did not finish within {RUNNER_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
            why = lines[-1].strip() if lines else f"it exited with status {done.returncode}"
            raise VerificationError(f"MultimodalRunner failed on {Path(pte_path).name}: {why[:200]}")
        # The runner prints the answer, then a newline and its stats line ("PyTorchObserver {...}").
        text = done.stdout.decode(errors="replace")
        text = text[: text.rfind("PyTorchObserver")] if "PyTorchObserver" in text else text
        return {"text": text.removesuffix("\n"), "stats": json.loads(out.read_text())}


def measure_memory(pte_path: str | Path, reference: VisionLanguageReference) -> dict[str, Any]:
    """The runner's memory at full context: an image and enough text to fill every cache position but the last,
    then one new token; the growth of the runner process's peak resident memory over what its imports held."""
    import tempfile
    import time

    from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded when a file is run

    metadata = PteModel(pte_path).metadata
    max_seq_len, image_tokens = int(metadata["get_max_seq_len"]), int(metadata["get_image_tokens"])
    filler = max_seq_len - image_tokens - 2
    text = (reference.text_ids * (filler // max(len(reference.text_ids), 1) + 1))[:filler]
    image = reference.prompts[0].images[0]
    prompt = Prompt([text, 0], [image])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hub-export-memory-") as scratch:
        path = Path(scratch) / "tokenizer.json"
        path.write_text(reference.tokenizer_json, encoding="utf-8")
        stats = runner_generate(pte_path, path, prompt, 1)["stats"]
    growth = (stats.get("peak_rss_kib", 0) - stats.get("baseline_rss_kib", 0)) * 1024
    return {"peak_rss_bytes": max(growth, 0), "context_tokens": max_seq_len,
            "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip


def kv_cache_record(model: nn.Module, max_seq_len: int) -> dict[str, Any]:
    """The text decoder's KV cache layout, as a text-generation file's manifest records it."""
    return {**plan_layers(model.config.get_text_config(), max_seq_len).to_dict(), "sliding": "ring"}


def runner_answer(pte_path: str | Path, reference: VisionLanguageReference) -> str:
    """The runner's greedy answer to the first reference prompt, at most :data:`NEW_TOKENS` tokens."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hub-export-runner-") as scratch:
        path = Path(scratch) / "tokenizer.json"
        path.write_text(reference.tokenizer_json, encoding="utf-8")
        # As many new tokens as the file's own greedy answer may have (not fp32's, which may stop sooner).
        return runner_generate(pte_path, path, reference.prompts[0], NEW_TOKENS)["text"]
