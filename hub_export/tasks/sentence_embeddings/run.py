"""Embed: texts in, sentence vectors and their similarities out, from an exported ``.pte``.

Example:
    >>> result = embed("out/model-8da8w.pte", "out", ["A cat sat.", "A kitten sat.", "Stocks fell."])
    >>> bool(result.similarities[0, 1] > result.similarities[0, 2])
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hub_export.errors import InputError

if TYPE_CHECKING:
    import torch


@dataclass
class EmbedResult:
    """Vectors of texts from an embedding ``.pte``, their pairwise similarities and the speed."""

    vectors: torch.Tensor  # [n, dim], in the order of the texts
    similarities: torch.Tensor  # [n, n] cosine similarities
    tokens: list[int]  # per text, after truncation to the file's max_seq_len
    seconds: float  # running the file, tokenization aside

    @property
    def texts_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")


def embed(pte_path: str | Path, tokenizer_dir: str | Path, texts: list[str]) -> EmbedResult:
    """Embed ``texts`` with a sentence-embedding ``.pte`` (and the ``tokenizer.json`` in ``tokenizer_dir``).

    The file runs in this process: call :func:`hub_export.prepare_pte_process` before
    torch loads, as for :func:`hub_export.generate`.

    Raises:
        InputError: no texts, no tokenizer next to the file, or the file is not an embedding file.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    import torch

    from hub_export.tasks.sentence_embeddings.export import Embedder  # torch and ExecuTorch: loaded when a file is run

    if not texts:
        raise InputError("give at least one text to embed")
    embedder = Embedder(pte_path, tokenizer_dir)
    inputs = embedder.encode(texts)
    started = time.perf_counter()
    vectors = embedder.vectors(inputs)
    seconds = time.perf_counter() - started
    unit = torch.nn.functional.normalize(vectors, dim=-1)
    return EmbedResult(vectors, unit @ unit.T, [int(ids.shape[1]) for ids, _ in inputs], seconds)
