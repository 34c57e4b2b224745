"""Transcribe: an audio file in, its text out, from an exported speech ``.pte`` (Whisper).

Audio is read with libsndfile (wav, flac, ogg, mp3), mixed to mono, resampled to 16 kHz
and cut into 30 s windows; each window runs the file's ``preprocessor``, ``encoder`` and
``text_decoder`` methods in turn (greedy decoding).

Example:
    >>> result = transcribe("out/model-8da4w-emb8w.pte", "out", "meeting.flac")
    >>> result.text, round(result.real_time_factor, 2)
    ('Please send the report to the office before noon on Friday.', 0.05)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hub_export.errors import InputError

if TYPE_CHECKING:
    from hub_export.tasks.speech.decoding import Segment


@dataclass
class TranscriptionResult:
    """The text of an audio file, window by window, and how long it took."""

    text: str
    windows: list[str]  # the text of each 30 s window, in order
    audio_seconds: float
    seconds: float  # running the file (all three methods), reading the audio aside
    segments: list[Segment] = field(default_factory=list)  # with timestamps=True: timed stretches of speech

    @property
    def real_time_factor(self) -> float:
        """Seconds of work per second of audio: below 1 is faster than real time."""
        return self.seconds / self.audio_seconds if self.audio_seconds else 0.0


def transcribe(
    pte_path: str | Path,
    folder: str | Path,
    audio: str | Path,
    language: str | None = None,
    translate: bool = False,
    timestamps: bool = False,
) -> TranscriptionResult:
    """Transcribe ``audio`` with a speech ``.pte`` (and ``config.json``, ``generation_config.json`` and
    ``tokenizer.json`` in ``folder``, the export folder).

    ``language`` (``"fr"``...) and ``translate`` (into English) apply to multilingual
    models; ``timestamps`` fills :attr:`TranscriptionResult.segments`. The file runs in this process: call :func:`hub_export.prepare_pte_process`
    before torch loads.

    Raises:
        InputError: the audio cannot be read, the folder lacks the model's files, or the file is not a speech file.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    from tokenizers import Tokenizer

    from hub_export.tasks.speech.decoding import (  # torch and ExecuTorch: loaded when a file is run
        SpeechFile,
        greedy_tokens,
        prompt_ids,
        read_audio,
        segments,
    )
    from hub_export.tasks.speech.export import SAMPLE_RATE, WINDOW_SAMPLES, generation_settings

    folder = Path(folder)
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise InputError(f"no {name} in {folder.name}/; pass the export folder")
    waveform = read_audio(audio)
    file = SpeechFile(pte_path)
    settings = generation_settings(folder)
    prompt = prompt_ids(settings, language, translate, timestamps)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def text_of(tokens: list[int]) -> str:
        return tokenizer.decode(tokens, skip_special_tokens=True).strip()

    windows, timed, started = [], [], time.perf_counter()
    for start in range(0, waveform.numel(), WINDOW_SAMPLES):
        features = file.features(waveform[start : start + WINDOW_SAMPLES])
        tokens = greedy_tokens(file.encode, file.decode, features, prompt, settings, file.max_seq_len, timestamps)
        windows.append(text_of(tokens))
        if timestamps:
            timed += segments(tokens, settings, text_of, start / SAMPLE_RATE)
    seconds = time.perf_counter() - started
    text = " ".join(window for window in windows if window)
    return TranscriptionResult(text, windows, waveform.numel() / SAMPLE_RATE, seconds, timed)
