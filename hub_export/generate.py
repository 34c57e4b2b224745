"""Generate: stream text from a ``.pte`` with the ExecuTorch runtime.

The decode loop is driven here rather than through ``TextLLMRunner`` so that text is
streamed UTF-8-safely: token ids are decoded incrementally with
``tokenizers.decoders.DecodeStream``, which holds back bytes until they form whole
characters (the runner's Python callback raises on half a character).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import InputError


@dataclass
class GenerationResult:
    """The text and the speed figures of one generation."""

    text: str
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str  # "eos", "max_new_tokens" or "context_full"

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # The first token comes out of prefill; decode speed counts the forwards after it.
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def _chat_prompt(tokenizer_dir: Path, prompt: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    config_path = tokenizer_dir / "tokenizer_config.json"
    template = None
    if (tokenizer_dir / "chat_template.jinja").is_file():
        template = (tokenizer_dir / "chat_template.jinja").read_text()
    elif config_path.is_file():
        template = json.loads(config_path.read_text()).get("chat_template")
    if not template or not isinstance(template, str):
        raise InputError("this model has no chat template; drop --chat to send the prompt as is")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True, bos_token="", eos_token=""
    )


def _sample(logits, temperature: float, generator) -> int:
    import torch

    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    pte_path: str | Path,
    tokenizer_dir: str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    chat: bool = False,
    on_text: Callable[[str], None] | None = None,
) -> GenerationResult:
    """Generate from ``prompt`` with a ``.pte``; ``on_text`` receives text as it streams.

    Example:
        >>> result = generate("out/model-8da4w.pte", "out", "Once upon a time", max_new_tokens=32,
        ...                   on_text=lambda piece: print(piece, end="", flush=True))
        >>> round(result.decode_tokens_per_s) > 0
        True
    """
    import torch
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    from .runtime import PteModel

    tokenizer_dir = Path(tokenizer_dir)
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise InputError(f"no tokenizer.json in {tokenizer_dir.name}/; pass --tokenizer with the export folder")
    if max_new_tokens < 1:
        raise InputError("--max-new-tokens must be at least 1")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    model = PteModel(pte_path)
    max_len = int(model.metadata.get("get_max_seq_len", 0))
    eos = set(model.metadata.get("get_eos_ids", []))

    text_prompt = _chat_prompt(tokenizer_dir, prompt) if chat else prompt
    ids = tokenizer.encode(text_prompt).ids
    if not ids:
        raise InputError("the prompt is empty after tokenization")
    if len(ids) >= max_len:
        raise InputError(f"the prompt is {len(ids)} tokens; this file holds at most {max_len - 1}")

    generator = torch.Generator().manual_seed(seed)
    stream = DecodeStream(skip_special_tokens=True)
    pieces: list[str] = []
    emit = on_text or (lambda piece: None)

    started = time.perf_counter()
    logits = model.forward(torch.tensor([ids], dtype=torch.long), start_pos=0)
    prefill_seconds = time.perf_counter() - started

    position, generated, stop = len(ids), 0, "max_new_tokens"
    decode_started = time.perf_counter()
    while True:
        token = _sample(logits, temperature, generator)
        generated += 1
        if token in eos:
            stop = "eos"
            break
        piece = stream.step(tokenizer, token)
        if piece:
            pieces.append(piece)
            emit(piece)
        if generated >= max_new_tokens:
            break
        if position >= max_len:
            stop = "context_full"
            break
        logits = model.forward(torch.tensor([[token]], dtype=torch.long), start_pos=position)
        position += 1
    decode_seconds = time.perf_counter() - decode_started
    return GenerationResult("".join(pieces), len(ids), generated, prefill_seconds, decode_seconds, stop)
