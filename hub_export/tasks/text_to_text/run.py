"""Text-to-text: a text in, the file's greedy answer out, from an exported T5-class ``.pte``."""

from __future__ import annotations

from pathlib import Path

import torch

from hub_export.errors import InputError
from hub_export.tasks.speech.decoding import EncoderDecoderFile
from hub_export.tasks.text_to_text.export import DEFAULT_SOURCE_LEN, METHODS, greedy


def generate_text(pte_path: str | Path, folder: str | Path, text: str, max_new_tokens: int = 64) -> str:
    """The file's greedy answer to ``text`` (with ``tokenizer.json`` in ``folder``).

    Raises:
        InputError: the folder has no tokenizer, or the file is not a text-to-text file.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    from tokenizers import Tokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise InputError(f"no tokenizer.json in {folder.name}/; pass the export folder")
    file = EncoderDecoderFile(pte_path)
    if set(file.model.methods) != set(METHODS) or "get_num_mel_bins" in file.model.metadata:
        raise InputError(f"{Path(pte_path).name} is not a text-to-text file (it needs encoder and text_decoder)")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode(text).ids[:DEFAULT_SOURCE_LEN]], dtype=torch.long)
    settings = {"decoder_start_token_id": int(file.model.metadata["decoder_start_token_id"]),
                "eos_token_id": int(file.model.metadata["get_eos_id"])}  # fmt: skip
    answer = greedy(file.encode, file.decode, ids, settings, max_new_tokens, file.max_seq_len)
    return tokenizer.decode(answer, skip_special_tokens=True).strip()
