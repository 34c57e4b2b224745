"""Sentence embeddings: an encoder and its sentence-transformers pooling as one ``.pte`` method.

The exported ``forward`` takes token ids and an attention mask, ``[1, seq]`` each with
``seq`` dynamic up to the file's ``get_max_seq_len``, and returns the pooled sentence
vector ``[1, dim]`` the model's sentence-transformers configuration asks for (mean or
CLS pooling, normalised or not). A device needs only the tokenizer and this file.

Verification runs real sentences (:func:`eval_sentences`) through the ``.pte`` and
compares its vectors with the eager model's (cosine similarity per sentence) and the
nearest neighbour of each sentence within the set (retrieval agreement). The module
implements the encoder stages of :mod:`hub_export.tasks.encoders` for ``feature-extraction``.

Example:
    >>> pooling = Pooling.of_folder("all-MiniLM-L6-v2")
    >>> pooling
    Pooling(mode='mean', normalize=True)
    >>> embedder = Embedder("out/model-8da8w.pte", "out")
    >>> embedder.vectors(embedder.encode(["A cat sat.", "A dog ran."])).shape
    torch.Size([2, 384])
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.runtime.pte import PteModel
from hub_export.tasks.archs import max_positions
from hub_export.tasks.encoders import EncoderReference, weight_bits

POOLING_MODES = ("mean", "cls", "max")
# sentence-transformers' Pooling config keys for the modes above
_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
EVAL_SENTENCES = 64  # real sentences of the shipped evaluation text every variant is checked on
# The least cosine similarity to eager's vector that any sentence may have, by kind of file.
# fp32 must be exact to rounding; 8-bit keeps direction to 1%; 4-bit weights move vectors
# further (all-MiniLM-L6-v2 8da4w: min 0.945, mean 0.965 on the 64 sentences).
MIN_COSINE_VS_FP32 = {32: 0.9999, 8: 0.99, 4: 0.90}
# The least cosine similarity to the quantized eager model's vector: the lowering's own
# error. Float math matches to rounding; int8 dynamic activations are rounded by other
# kernels in the runtime than in eager.
MIN_COSINE_VS_EAGER = {"fp32": 0.9999, "weight_only": 0.9999, "dynamic": 0.995}
DEFAULT_SEQ_LEN = 512  # BERT-class position tables; sentence-transformers' own setting wins when present


@dataclass(frozen=True)
class Pooling:
    """How token vectors become one sentence vector (sentence-transformers' ``Pooling`` + ``Normalize``)."""

    mode: str = "mean"
    normalize: bool = False

    @classmethod
    def of_folder(cls, folder: str | Path) -> Pooling:
        """The pooling a sentence-transformers folder declares; mean, unnormalised, for a plain encoder.

        Raises:
            InputError: the folder declares a pooling mode this export does not implement.
        """
        folder = Path(folder)
        modules = _json_or_none(folder / "modules.json")
        if not isinstance(modules, list):
            return cls()
        types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        normalize = "Normalize" in types
        pooling_path = str(types.get("Pooling", {}).get("path", "1_Pooling"))
        config = _json_or_none(folder / Path(pooling_path).name / "config.json") or {}
        chosen = [key for key, on in config.items() if key.startswith("pooling_mode_") and on is True]
        modes = [_POOLING_KEYS.get(key) for key in chosen]
        if len(chosen) > 1 or None in modes:
            raise InputError(
                f"{folder.name} pools with {', '.join(chosen)}; supported: one of {', '.join(_POOLING_KEYS)}"
            )
        return cls(mode=modes[0] if modes else "mean", normalize=normalize)


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class SentenceEmbedder(nn.Module):
    """``encoder`` followed by ``pooling``: (input_ids, attention_mask) ``[1, seq]`` -> ``[1, dim]``."""

    def __init__(self, encoder: nn.Module, pooling: Pooling):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling.mode == "cls":
            pooled = hidden[:, 0]
        elif self.pooling.mode == "max":
            pooled = (hidden + (mask - 1.0) * 1e9).max(dim=1).values
        else:
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return nn.functional.normalize(pooled, dim=-1) if self.pooling.normalize else pooled


def eval_sentences(count: int = EVAL_SENTENCES) -> list[str]:
    """The first ``count`` sentences of the shipped English evaluation text (never the calibration text)."""
    text = resources.files("hub_export").joinpath("data", "eval_en.txt").read_text(encoding="utf-8")
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 6]
    return sentences[:count]


def text_tokenizer(tokenizer_json: str | Path, max_seq_len: int):
    """The ``tokenizers`` tokenizer of a text encoder: one text at a time, cut to ``max_seq_len`` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_seq_len)
    return tokenizer


def encode(tokenizer, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), ``[1, seq]`` each, for one text."""
    encoding = tokenizer.encode(text)
    ids = torch.tensor([encoding.ids], dtype=torch.long)
    return ids, torch.ones_like(ids)


# -- the encoder stages (hub_export.tasks.encoders) -------------------------------------------------------


def seq_len(folder: Path, config: dict, requested: int | None) -> int:
    """A text encoder's longest input: ``requested``, else sentence-transformers' ``max_seq_length``, else the
    smaller of the model's limit and :data:`DEFAULT_SEQ_LEN`."""
    if requested is not None:
        return requested
    limit = max_positions(config) or DEFAULT_SEQ_LEN
    declared = (_json_or_none(folder / "sentence_bert_config.json") or {}).get("max_seq_length")
    if isinstance(declared, int) and not isinstance(declared, bool) and 2 <= declared <= limit:
        return declared
    return min(limit, DEFAULT_SEQ_LEN)


def wrap(model: nn.Module, folder: Path, max_seq_len: int = 0) -> SentenceEmbedder:
    return SentenceEmbedder(model, Pooling.of_folder(folder))


def export(wrapped: nn.Module, max_seq_len: int) -> torch.export.ExportedProgram:
    """``wrapped`` (token ids, attention mask) traced with a sequence length from 2 to ``max_seq_len`` (a
    sentence has at least its two special tokens)."""
    seq = torch.export.Dim("seq", min=2, max=max_seq_len)
    example = torch.ones(1, min(16, max_seq_len), dtype=torch.long)
    with torch.no_grad():
        return torch.export.export(
            wrapped,
            (example, torch.ones_like(example)),
            dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}},
            strict=False,
        )


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    """The constant methods of an embedding ``.pte``: what a device reads before it tokenizes."""
    pooling = Pooling.of_folder(folder)
    return {
        "get_max_seq_len": max_seq_len,
        "get_embedding_dim": int(model.config.hidden_size),
        "get_pooling_mode": POOLING_MODES.index(pooling.mode),  # 0 mean, 1 cls, 2 max
        "is_normalized": pooling.normalize,
    }


def eval_inputs(folder: Path, config, max_seq_len: int, sentences: list[str] | None = None) -> EncoderReference:
    """``sentences`` (default: :func:`eval_sentences`) tokenized as the file takes them."""
    sentences = sentences or eval_sentences()
    tokenizer = text_tokenizer(folder / "tokenizer.json", max_seq_len)
    return EncoderReference(sentences, [encode(tokenizer, sentence) for sentence in sentences])


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    pooling = Pooling.of_folder(folder)
    return {
        "pooling": {"mode": pooling.mode, "normalize": pooling.normalize},
        "embedding_dim": int(model.config.hidden_size),
    }


def judge(
    actual: torch.Tensor, expected: torch.Tensor, reference: EncoderReference, mode: QMode, qembedding: str | None
) -> Verification:
    """Judge the file's vectors against the quantized eager model's (``expected``) and measure what quantization
    kept of fp32's (``reference.outputs``).

    Passes when the worst sentence's cosine to eager is within the lowering's tolerance
    (:data:`MIN_COSINE_VS_EAGER`) and to fp32 within the quantization's
    (:data:`MIN_COSINE_VS_FP32`, by the fewest bits of the weights and the embedding table).
    """
    limits = {
        "min_cosine_vs_eager_required": MIN_COSINE_VS_EAGER[mode.tolerance],
        "min_cosine_vs_fp32_required": MIN_COSINE_VS_FP32[weight_bits(mode, qembedding)],
    }
    against_eager = compare(actual, expected, limits["min_cosine_vs_eager_required"])
    against_fp32 = compare(actual, reference.outputs, limits["min_cosine_vs_fp32_required"])
    figures = {
        **limits,
        "sentences": float(against_eager.sentences),
        "min_cosine_vs_eager": against_eager.min_cosine,
        "mean_cosine_vs_eager": against_eager.mean_cosine,
        "min_cosine_vs_fp32": against_fp32.min_cosine,
        "mean_cosine_vs_fp32": against_fp32.mean_cosine,
        "retrieval_vs_fp32": against_fp32.retrieval_agreement,
    }
    failure = against_eager.failure and f"against eager: {against_eager.failure}"
    failure = failure or (against_fp32.failure and f"against fp32: {against_fp32.failure}")
    return Verification(failure is None, positions=against_eager.sentences, failure=failure, figures=figures)


# -- comparing vectors -------------------------------------------------------------------------------


@dataclass
class EmbeddingCheck:
    """How a ``.pte``'s vectors compare with eager's on the reference sentences."""

    sentences: int
    min_cosine: float
    mean_cosine: float
    retrieval_agreement: float  # share of sentences whose nearest other sentence is eager's
    threshold: float
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None


def retrieval_agreement(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Share of rows whose most similar other row (cosine) is the same in ``actual`` as in ``expected``."""

    def nearest(vectors: torch.Tensor) -> torch.Tensor:
        unit = nn.functional.normalize(vectors.float(), dim=-1)
        similarity = unit @ unit.T
        similarity.fill_diagonal_(-2.0)
        return similarity.argmax(dim=1)

    return (nearest(actual) == nearest(expected)).float().mean().item()


def compare(actual: torch.Tensor, expected: torch.Tensor, threshold: float) -> EmbeddingCheck:
    """Cosine and retrieval figures of ``actual`` against ``expected`` (``[N, dim]`` each), judged by ``threshold``."""
    cosine = nn.functional.cosine_similarity(actual.float(), expected.float(), dim=-1)
    check = EmbeddingCheck(
        sentences=int(actual.shape[0]),
        min_cosine=cosine.min().item(),
        mean_cosine=cosine.mean().item(),
        retrieval_agreement=retrieval_agreement(actual, expected),
        threshold=threshold,
    )
    if not torch.isfinite(actual).all():
        check.failure = "the runtime produced non-finite vectors"
    elif check.min_cosine < threshold:
        check.failure = (
            f"cosine similarity to eager {check.min_cosine:.4f} on the worst of {check.sentences} "
            f"sentences is below {threshold}"
        )
    return check


def run_inputs(model: PteModel, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``model``'s vectors for encoded texts, one call each (batch 1), ``[len(inputs), dim]`` in float32."""
    return torch.cat([model.run([ids, mask]) for ids, mask in inputs]).float()


class Embedder:
    """An embedding ``.pte`` and its tokenizer, ready to embed texts.

    Example:
        >>> embedder = Embedder("out/model-8da8w.pte", "out")
        >>> embedder.vectors(embedder.encode(["A cat sat.", "A kitten sat.", "Stocks fell."])).shape
        torch.Size([3, 384])
    """

    def __init__(self, pte_path: str | Path, tokenizer_dir: str | Path):
        tokenizer_json = Path(tokenizer_dir) / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise InputError(f"no tokenizer.json in {Path(tokenizer_dir).name}/; pass the export folder")
        self.model = PteModel(pte_path)
        if "get_embedding_dim" not in self.model.metadata:
            raise InputError(f"{Path(pte_path).name} is not a sentence-embedding file (it has no get_embedding_dim)")
        self.max_seq_len = int(self.model.metadata["get_max_seq_len"])
        self.tokenizer = text_tokenizer(tokenizer_json, self.max_seq_len)

    def encode(self, texts: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each text's (input_ids, attention_mask), cut to the file's ``get_max_seq_len``."""
        return [encode(self.tokenizer, text) for text in texts]

    def vectors(self, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One vector per encoded text, ``[len(inputs), dim]``, in order."""
        return run_inputs(self.model, inputs)
