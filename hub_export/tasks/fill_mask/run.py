"""Fill-mask: a text with mask tokens in, the words that fit each mask out, from an exported ``.pte``.

Example:
    >>> result = fill_mask("out/model-8da8w.pte", "out", "The capital of France is [MASK].")
    >>> [guess.token for guess in result.masks[0]][:3]
    ['paris', 'lyon', 'marseille']
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hub_export.errors import InputError


@dataclass(frozen=True)
class Guess:
    """One word that fits a mask, and the file's probability for it."""

    token: str
    probability: float


@dataclass
class FillMaskResult:
    """The best words for each mask of a text, in the order the masks appear."""

    masks: list[list[Guess]]
    tokens: int  # of the text, after truncation to the file's max_seq_len
    seconds: float  # running the file, tokenization aside


def fill_mask(pte_path: str | Path, tokenizer_dir: str | Path, text: str, top_k: int = 5) -> FillMaskResult:
    """The ``top_k`` words a fill-mask ``.pte`` puts at each mask token of ``text``.

    The file runs in this process: call :func:`hub_export.prepare_pte_process` before
    torch loads, as for :func:`hub_export.generate`.

    Raises:
        InputError: the text has no mask token, no tokenizer is next to the file, or the file is not a fill-mask file.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    import torch

    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.sentence_embeddings.export import (  # torch and ExecuTorch: loaded when a file is run
        encode,
        text_tokenizer,
    )

    tokenizer_json = Path(tokenizer_dir) / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise InputError(f"no tokenizer.json in {Path(tokenizer_dir).name}/; pass the export folder")
    model = PteModel(pte_path)
    mask_id = model.metadata.get("get_mask_token_id")
    if mask_id is None:
        raise InputError(f"{Path(pte_path).name} is not a fill-mask file (it has no get_mask_token_id)")
    tokenizer = text_tokenizer(tokenizer_json, int(model.metadata["get_max_seq_len"]))
    ids, attention = encode(tokenizer, text)
    positions = (ids[0] == int(mask_id)).nonzero().flatten().tolist()
    if not positions:
        raise InputError(
            f"the text has no mask token: write {tokenizer.id_to_token(int(mask_id))} where a word is missing"
        )
    started = time.perf_counter()
    scores = model.run([ids, attention])
    seconds = time.perf_counter() - started
    masks = []
    for position in positions:
        top = torch.softmax(scores[0, position].float(), -1).topk(top_k)
        masks.append(
            [Guess(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(top.values, top.indices, strict=True)]
        )
    return FillMaskResult(masks, int(ids.shape[1]), seconds)
