"""Vision-language files run: a prompt with its images laid out as the family expects, then the file's methods called in turn (or the eager wrapper's, through the same loop)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hub_export.errors import InputError
from hub_export.tasks.text_generation.chat import render_chat_messages
from hub_export.tasks.vision_language.model import (
    MAX_IMAGES,
    METHODS,
    Family,
    VisionLanguageModel,
    family_of,
)


@dataclass
class Prompt:
    """A prompt as the runner takes it: token ids and images, in order (an image is its index in ``images``)."""

    parts: list[list[int] | int]
    images: list[torch.Tensor]  # uint8 [1, 3, size, size] each

    @property
    def text_tokens(self) -> int:
        return sum(len(p) for p in self.parts if isinstance(p, list))


def render_chat(folder: Path, question: str, images: int, system: str | None = None) -> str:
    """The chat template's user turn: ``images`` image placeholders, then ``question``, then the assistant's cue."""
    content = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": question}]
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    return render_chat_messages(folder, [*messages, {"role": "user", "content": content}])


def prompt_segments(text: str, family: Family, images: int) -> list[str | None]:
    """``text`` split at the template's image placeholders, with each image's marker text around it; None: an image.

    Raises:
        InputError: the template did not write one placeholder per image.
    """
    pieces = text.split(family.placeholder)
    if len(pieces) != images + 1:
        raise InputError(
            f"the chat template wrote {len(pieces) - 1} image placeholders ({family.placeholder}) for {images} images"
        )
    before, after = family.markers
    segments: list[str | None] = [pieces[0]]
    for piece in pieces[1:]:
        segments[-1] += before
        segments += [None, after + piece]
    return [s for s in segments if s != ""]


def load_image(path_or_image, size: int) -> torch.Tensor:
    """An image file (or PIL image) as the file's input: RGB, resized to ``size`` x ``size``, uint8 ``[1, 3, s, s]``.

    Raises:
        InputError: as :func:`hub_export.media.images.open_image` (missing, not an image, animated, too large).
    """
    import numpy as np
    from PIL import Image

    from hub_export.media.images import open_image  # Pillow: loaded when an image is read

    image = path_or_image if isinstance(path_or_image, Image.Image) else open_image(path_or_image, size)
    resized = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1).unsqueeze(0).contiguous()


def build_prompt(
    folder: Path,
    family: Family,
    question: str,
    images: list[torch.Tensor],
    tokenizer,
    chat: bool = True,
    system: str | None = None,
) -> Prompt:
    """A :class:`Prompt` for ``question`` about ``images``: the chat template's turn, or (``chat=False``) each
    image's markers followed by ``question`` as it is."""
    if len(images) > MAX_IMAGES:
        raise InputError(f"{len(images)} images in one prompt; a file takes at most {MAX_IMAGES}", param="image")
    if chat:
        text = render_chat(folder, question, len(images), system)
    else:
        text = family.placeholder * len(images) + question
    parts: list[list[int] | int] = []
    index = 0
    for segment in prompt_segments(text, family, len(images)):
        if segment is None:
            parts.append(index)
            index += 1
        else:
            parts.append(tokenizer.encode(segment, add_special_tokens=False).ids)
    return Prompt(parts, images)


class _Steps:
    """The three methods of either the eager wrapper or a ``.pte`` (see :class:`VisionLanguageFile`)."""

    def vision(self, image: torch.Tensor) -> torch.Tensor: ...
    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...
    def decode(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...


class EagerSteps(_Steps):
    """The eager wrapper's methods (its attention runs ExecuTorch's custom ops' eager kernels, whose log lines
    about allocators are kept off the terminal)."""

    def __init__(self, wrapped: VisionLanguageModel):
        self.wrapped = wrapped

    def vision(self, image):
        with torch.no_grad():
            return self.wrapped.vision_encoder(image)

    def embed(self, ids):
        with torch.no_grad():
            return self.wrapped.token_embedding(ids)

    def decode(self, embeds, positions):
        from hub_export.runtime.pte import quiet_native_output  # the ExecuTorch runtime: loaded when a file is run

        with torch.no_grad(), quiet_native_output():
            return self.wrapped.text_decoder(embeds, positions)


class VisionLanguageFile(_Steps):
    """A vision-language ``.pte``, ready to run its methods (see :mod:`hub_export.runtime.pte`)."""

    def __init__(self, pte_path):
        from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded when a file is run

        self.model = pte_path if isinstance(pte_path, PteModel) else PteModel(pte_path)
        missing = [name for name in METHODS if name not in self.model.methods]
        if missing:
            raise InputError(
                f"{self.model.path.name} is not a vision-language file (it has no {', '.join(missing)} method)"
            )
        self.max_seq_len = int(self.model.metadata["get_max_seq_len"])
        self.image_size = int(self.model.metadata["get_image_size"])
        self.image_tokens = int(self.model.metadata["get_image_tokens"])

    def vision(self, image):
        if tuple(image.shape) != (1, 3, self.image_size, self.image_size):
            raise InputError(f"this file takes images of {self.image_size}x{self.image_size}; resize it first")
        return self.model.run([image], "vision_encoder")

    def embed(self, ids):
        return self.model.run([ids], "token_embedding")

    def decode(self, embeds, positions):
        return self.model.run([embeds, positions], "text_decoder")


class GenerationRun:
    """A prompt with images, ready for :func:`hub_export.tasks.text_generation.run.stream_generate`'s loop: ``prefill()`` and
    ``step(token, position)`` over a vision-language file's methods.

    Raises:
        InputError: an image cannot be read, too many images, or the prompt does not fit the file's context.
    """

    def __init__(self, model, folder: Path, tokenizer, question: str, images: list, chat: bool, system: str | None):
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError(f"no readable config.json in {folder.name}/; pass the export folder") from None
        self.file = VisionLanguageFile(model)
        self.family = family_of(config if isinstance(config, dict) else {})
        if len(images) > MAX_IMAGES:
            raise InputError(f"{len(images)} images in one prompt; a file takes at most {MAX_IMAGES}", param="image")
        pixels = [load_image(image, self.file.image_size) for image in images]
        self.prompt = build_prompt(folder, self.family, question, pixels, tokenizer, chat, system)
        self.ids = [token for part in self.prompt.parts if isinstance(part, list) for token in part]
        self.max_len = self.file.max_seq_len
        self.eos = set(self.file.model.metadata.get("get_eos_ids", []))
        needed = self.prompt.text_tokens + len(pixels) * self.file.image_tokens
        if needed >= self.max_len:
            raise InputError(
                f"the prompt takes {needed} positions ({len(pixels)} images of {self.file.image_tokens} and "
                f"{self.prompt.text_tokens} text tokens); this file holds at most {self.max_len - 1}: use fewer "
                "images or a shorter prompt"
            )

    def prefill(self):
        import time

        started = time.perf_counter()
        scores, position, _ = prefill(self.file, self.prompt)
        return scores, time.perf_counter() - started, position

    def step(self, token: int, position: int) -> torch.Tensor:
        return self.file.decode(self.file.embed(torch.tensor([[token]])), torch.tensor([position]))[0, -1]


def prefill(steps: _Steps, prompt: Prompt) -> tuple[torch.Tensor, int, list[torch.Tensor]]:
    """Run ``prompt`` through ``steps`` part by part, as the runner does: (last scores, positions used, image
    embeddings)."""
    position, scores, features = 0, None, []
    for part in prompt.parts:
        if isinstance(part, int):
            embeds = steps.vision(prompt.images[part])
            features.append(embeds)
        else:
            embeds = steps.embed(torch.tensor([part], dtype=torch.long))
        count = embeds.shape[1]
        scores = steps.decode(embeds, torch.arange(position, position + count))
        position += count
    return scores[0, -1], position, features


def greedy(steps: _Steps, prompt: Prompt, new_tokens: int, eos: set[int], max_seq_len: int) -> list[int]:
    """Greedy answer tokens (EOS excluded) to ``prompt``."""
    return greedy_until(steps, prompt, new_tokens, eos, max_seq_len)[0]


def greedy_until(
    steps: _Steps, prompt: Prompt, new_tokens: int, eos: set[int], max_seq_len: int
) -> tuple[list[int], int | None]:
    """(greedy answer tokens to ``prompt``, the end token that stopped them, or None)."""
    scores, position, _ = prefill(steps, prompt)
    tokens: list[int] = []
    while len(tokens) < new_tokens and position < max_seq_len:
        token = int(scores.argmax())
        if token in eos:
            return tokens, token
        tokens.append(token)
        scores = steps.decode(steps.embed(torch.tensor([[token]])), torch.tensor([position]))[0, -1]
        position += 1
    return tokens, None


def teacher_forced(steps: _Steps, prompt: Prompt, answer: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Scores ``[len(answer) + 1, vocab]``: after the prompt, then after each answer token; and the image embeddings."""
    scores, position, features = prefill(steps, prompt)
    rows = [scores]
    for token in answer:
        rows.append(steps.decode(steps.embed(torch.tensor([[token]])), torch.tensor([position]))[0, -1])
        position += 1
    return torch.stack(rows).float(), features


def text_scores(steps: _Steps, ids: list[int]) -> torch.Tensor:
    """The decoder's next-token scores after each of ``ids`` (no image), one step at a time: ``[len(ids), vocab]``."""
    rows = []
    for position, token in enumerate(ids):
        rows.append(steps.decode(steps.embed(torch.tensor([[token]])), torch.tensor([position]))[0, -1])
    return torch.stack(rows).float()


def perplexity(scores: torch.Tensor, ids: list[int]) -> float:
    logprobs = torch.log_softmax(scores[:-1].double(), -1)
    target = torch.tensor(ids[1:]).unsqueeze(1)
    return float(torch.exp(-logprobs.gather(1, target).mean()))


def token_bytes(tokenizer, token: int, byte_level: bool) -> bytes:
    """The bytes a token stands for: a byte-fallback piece (``<0xAB>``), a byte-level BPE piece mapped back
    through GPT-2's byte alphabet, or the decoded text."""
    piece = tokenizer.id_to_token(token) or ""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    if byte_level and all(ch in _BYTE_OF for ch in piece):
        return bytes(_BYTE_OF[ch] for ch in piece)
    return tokenizer.decode([token], skip_special_tokens=False).encode()


def _byte_alphabet() -> dict[str, int]:
    # GPT-2's reversible map from bytes to printable characters, inverted.
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_OF = _byte_alphabet()
