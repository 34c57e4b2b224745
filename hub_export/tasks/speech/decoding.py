"""Running a speech file: audio read as 16 kHz mono, the decoder prompt, greedy decoding with timestamps into segments, and the word error rate verification reports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hub_export.errors import InputError

SAMPLE_RATE = 16000
METHODS = ("preprocessor", "encoder", "text_decoder")


def load_custom_ops() -> None:
    # Registers llama::update_cache / llama::custom_sdpa with torch, eager kernels included.
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


def read_audio(path: str | Path) -> torch.Tensor:
    """A short sound file (wav, flac, ogg, mp3) whole, as mono float32 samples at 16 kHz.

    Raises:
        InputError: as :class:`hub_export.media.audio.AudioReader`.
    """
    from hub_export.media import audio  # numpy, soundfile and soxr: loaded when audio is read

    return torch.from_numpy(audio.read_audio(path, SAMPLE_RATE))


def words(text: str) -> list[str]:
    """``text`` as lower-case words without punctuation: what a word error rate counts."""
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def word_error_rate(hypothesis: str, reference: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by edit distance over words.

    Example:
        >>> word_error_rate("the cat sat", "the cat sat down")
        0.25
    """
    hyp, ref = words(hypothesis), words(reference)
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, 1):
        current = [i]
        for j, hyp_word in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1] / max(len(ref), 1)


def corpus_wer(hypotheses: list[str], references: list[str]) -> float:
    """Word error rate over several texts: all edits over all reference words."""
    edits = sum(word_error_rate(h, r) * max(len(words(r)), 1) for h, r in zip(hypotheses, references, strict=True))
    return edits / max(sum(max(len(words(r)), 1) for r in references), 1)


def prompt_ids(
    settings: dict[str, Any], language: str | None = None, translate: bool = False, timestamps: bool = False
) -> list[int]:
    """The tokens a transcription starts from: start, language and task (multilingual models), and the
    no-timestamps token unless ``timestamps`` are asked for.

    Raises:
        InputError: a language the model does not know, a language or translation asked of an English-only model,
            or timestamps asked of a model without timestamp tokens.
    """
    ids = [settings["decoder_start_token_id"]]
    if settings["is_multilingual"]:
        language_id = settings["lang_to_id"].get(f"<|{language or 'en'}|>")
        if language_id is None:
            known = ", ".join(sorted(key.strip("<|>") for key in settings["lang_to_id"])[:12])
            raise InputError(f"the model does not know the language {language!r}; it knows {known}, ...")
        ids += [language_id, settings["task_to_id"]["translate" if translate else "transcribe"]]
    elif translate or language not in (None, "en"):
        raise InputError("this is an English-only model: it transcribes English and cannot translate; drop --language "
                         "and --translate")  # fmt: skip
    if timestamps and settings["no_timestamps_token_id"] is None:
        raise InputError("this model has no timestamp tokens; drop --timestamps")
    if not timestamps and settings["no_timestamps_token_id"] is not None:
        ids.append(int(settings["no_timestamps_token_id"]))
    return ids


def _next_token(row: torch.Tensor, tokens: list[int], settings: dict, timestamps: bool) -> int:
    """Greedy choice over ``row`` (one position's scores) under Whisper's rules.

    Always: the suppressed tokens, and at the start the begin-suppressed ones. With
    timestamps (transformers' timestamp rules, simplified): the first token is a timestamp
    (at most 1 s in), times never go back, and a timestamp is taken whenever all timestamps
    together are likelier than the best word.
    """
    row = row.float().clone()
    row[[i for i in settings["suppress_tokens"] if i < row.numel()]] = -float("inf")
    if not tokens:
        row[[i for i in settings["begin_suppress_tokens"] if i < row.numel()]] = -float("inf")
    if not timestamps:
        return int(row.argmax())
    first_time = int(settings["no_timestamps_token_id"]) + 1
    if not tokens:
        row[:first_time] = -float("inf")
        row[first_time + 50 + 1 :] = -float("inf")
    times = [t for t in tokens if t >= first_time]
    if times:
        row[first_time : times[-1]] = -float("inf")  # never back in time
    logprobs = torch.log_softmax(row, -1)
    if torch.logsumexp(logprobs[first_time:], 0) > logprobs[:first_time].max():
        return first_time + int(logprobs[first_time:].argmax())
    return int(logprobs.argmax())


def greedy_tokens(
    encode,
    decode,
    features: torch.Tensor,
    prompt: list[int],
    settings: dict,
    max_seq_len: int,
    timestamps: bool = False,
) -> list[int]:
    """The tokens greedy decoding produces after ``prompt`` (EOS excluded), under Whisper's rules (:func:`_next_token`).

    ``encode(features)`` and ``decode(ids, encoder_output, positions)`` are the file's
    methods or the eager model's: both are run through this one loop.
    """
    cross = encode(features)
    logits = decode(torch.tensor([prompt], dtype=torch.long), cross, torch.arange(len(prompt)))
    tokens: list[int] = []
    position = len(prompt)
    while position < max_seq_len:
        token = _next_token(logits[0, -1], tokens, settings, timestamps)
        if token == settings["eos_token_id"]:
            break
        tokens.append(token)
        logits = decode(torch.tensor([[token]], dtype=torch.long), cross, torch.tensor([position]))
        position += 1
    return tokens


@dataclass(frozen=True)
class Segment:
    """A stretch of speech and its text, times in seconds from the start of the audio."""

    start: float
    end: float
    text: str


def segments(tokens: list[int], settings: dict, decode_text, offset: float = 0.0) -> list[Segment]:
    """The timed segments of a transcript with timestamp tokens (each 0.02 s), ``offset`` seconds into the audio."""
    first_time = int(settings["no_timestamps_token_id"]) + 1
    found, start, words = [], None, []
    for token in tokens:
        if token < first_time:
            words.append(token)
            continue
        time = offset + (token - first_time) * 0.02
        if start is None:
            start = time
        elif words:
            found.append(Segment(round(start, 2), round(time, 2), decode_text(words)))
            start, words = None, []
        else:
            start = time
    if words:  # the window ended mid-segment
        found.append(
            Segment(round(start if start is not None else offset, 2), round(offset + 30.0, 2), decode_text(words))
        )
    return found


class EncoderDecoderFile:
    """A ``.pte`` with ``encoder`` and ``text_decoder`` methods (speech, text-to-text), ready to run them."""

    methods: tuple[str, ...] = ("encoder", "text_decoder")
    kind = "sequence-to-sequence"

    def __init__(self, pte_path: str | Path):
        from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded when a file is run

        self.model = PteModel(pte_path)
        missing = [name for name in self.methods if name not in self.model.methods]
        if missing:
            raise InputError(f"{Path(pte_path).name} is not a {self.kind} file (it has no {', '.join(missing)} method)")
        self.max_seq_len = int(self.model.metadata["get_max_seq_len"])

    def encode(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model.run([inputs], "encoder")

    def decode(self, ids: torch.Tensor, encoder_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.run([ids, encoder_output, positions], "text_decoder")


class SpeechFile(EncoderDecoderFile):
    """A speech ``.pte``'s three methods, ready to transcribe (see :mod:`hub_export.transcribe`)."""

    methods = METHODS
    kind = "speech"

    def features(self, waveform: torch.Tensor) -> torch.Tensor:
        return self.model.run([waveform.float().contiguous()], "preprocessor")
