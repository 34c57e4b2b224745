"""Fill-mask: a masked language model (BERT-class MLM head) as one ``.pte`` method.

The exported ``forward`` takes token ids and an attention mask, ``[1, seq]`` each with
``seq`` dynamic up to the file's ``get_max_seq_len`` (what optimum-executorch's fill-mask
file takes), and returns the token scores ``[1, seq, vocab]``; the rows at the mask
token (``get_mask_token_id``) rank the words that fit there.

Verification masks one whole word in each of 64 real sentences of the shipped
evaluation text and compares the file's scores at the mask with the eager model's
(:func:`hub_export.tasks.encoders.judge_labels`): KL and top-1 against the same quantization
decide pass/fail; top-1/top-5 agreement with fp32 and how often the masked word itself
comes first are the quality figures. The module implements the encoder stages of
:mod:`hub_export.tasks.encoders` for ``fill-mask``.

Example:
    >>> reference = eval_inputs(Path("bert-folder"), config, 128)
    >>> reference.items[0]
    'The river that runs through the old town was once the [MASK] reason anyone settled here.'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.tasks.encoders import EncoderReference, judge_labels
from hub_export.tasks.sentence_embeddings import export as embeddings

seq_len = embeddings.seq_len  # the same limits as any text encoder
export = embeddings.export  # the same inputs: (input_ids, attention_mask), dynamic length
_MASK_SPELLINGS = ("[MASK]", "<mask>")  # BERT/DistilBERT/ModernBERT, RoBERTa/XLM-R/MPNet
MIN_WORD_CHARS = 3  # a masked word: letters only, at least this long, one token


class MaskedLM(nn.Module):
    """(input_ids, attention_mask) ``[1, seq]`` -> token scores ``[1, seq, vocab]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def mask_token(folder: Path) -> tuple[str, int]:
    """The mask token of the tokenizer in ``folder`` and its id.

    Raises:
        InputError: the tokenizer has no mask token (the checkpoint is not a masked LM's).
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("mask_token")
    except (OSError, ValueError, AttributeError):
        declared = None
    if isinstance(declared, dict):
        declared = declared.get("content")
    for spelling in ([declared] if isinstance(declared, str) else []) + list(_MASK_SPELLINGS):
        token_id = tokenizer.token_to_id(spelling)
        if token_id is not None:
            return spelling, token_id
    raise InputError(
        f"the tokenizer in {folder.name}/ has no mask token ({' or '.join(_MASK_SPELLINGS)}); "
        "fill-mask needs a masked language model's tokenizer"
    )


def wrap(model: nn.Module, folder: Path, max_seq_len: int = 0) -> MaskedLM:
    return MaskedLM(model)


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    """The constant methods of a fill-mask ``.pte``."""
    return {
        "get_max_seq_len": max_seq_len,
        "get_vocab_size": int(model.config.vocab_size),
        "get_mask_token_id": mask_token(folder)[1],
    }


def _word_to_mask(encoding, text: str) -> int | None:
    """The position of the one-token, all-letter word nearest the middle of ``encoding``, if any."""
    counts: dict[int, int] = {}
    for word in encoding.word_ids:
        if word is not None:
            counts[word] = counts.get(word, 0) + 1
    candidates = []
    for position, (word, (start, end)) in enumerate(zip(encoding.word_ids, encoding.offsets, strict=True)):
        piece = text[start:end].strip()
        if word is not None and counts[word] == 1 and piece.isalpha() and len(piece) >= MIN_WORD_CHARS:
            candidates.append(position)
    middle = len(encoding.ids) / 2
    return min(candidates, key=lambda position: abs(position - middle)) if candidates else None


def eval_inputs(folder: Path, config, max_seq_len: int, sentences: list[str] | None = None) -> EncoderReference:
    """One whole word masked in each of ``sentences`` (default: the evaluation sentences), as the file takes them."""
    spelling, mask_id = mask_token(folder)
    tokenizer = embeddings.text_tokenizer(folder / "tokenizer.json", max_seq_len)
    items, inputs, positions, targets = [], [], [], []
    for sentence in sentences or embeddings.eval_sentences():
        encoding = tokenizer.encode(sentence)
        position = _word_to_mask(encoding, sentence)
        if position is None:
            continue
        ids = torch.tensor([encoding.ids], dtype=torch.long)
        targets.append(int(ids[0, position]))
        ids[0, position] = mask_id
        start, end = encoding.offsets[position]
        items.append(sentence[:start] + spelling + sentence[end:])
        inputs.append((ids, torch.ones_like(ids)))
        positions.append(position)
    if not inputs:
        raise InputError(f"no word of the evaluation text is a single token of {folder.name}'s tokenizer")
    return EncoderReference(items, inputs, positions=positions, targets=targets, notes={"mask_token_id": mask_id})


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    return {"mask_token": mask_token(folder)[0], "vocab_size": int(model.config.vocab_size)}


def judge(
    actual: torch.Tensor, expected: torch.Tensor, reference: EncoderReference, mode: QMode, qembedding: str | None
) -> Verification:
    """The file's scores at the masked words against eager's (see :func:`hub_export.tasks.encoders.judge_labels`)."""
    return judge_labels(actual, expected, reference, mode, "masked words")
