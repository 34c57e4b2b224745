"""Transcribe: an audio file in, its text out, from an exported speech ``.pte`` (Whisper).

Audio is streamed (:class:`hub_export.media.audio.AudioReader`): read, mixed to mono and
resampled to 16 kHz block by block and cut into 30 s windows; each window runs the file's
``preprocessor``, ``encoder`` and ``text_decoder`` methods in turn (greedy decoding) and its
text is yielded as soon as it is decoded, so memory stays flat however long the recording.

Example:
    >>> result = transcribe("out/model-8da4w-emb8w.pte", "out", "meeting.flac")
    >>> result.text, round(result.real_time_factor, 2)
    ('Please send the report to the office before noon on Friday.', 0.05)
    >>> for window in stream_transcribe("out/model-8da4w-emb8w.pte", "out", "lecture.mp3", max_seconds=600):
    ...     print(f"[{window.start:.0f} s] {window.text}")
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hub_export.errors import InputError

if TYPE_CHECKING:
    from hub_export.tasks.speech.decoding import Segment


@dataclass
class TranscribedWindow:
    """One 30 s window's text, yielded by :func:`stream_transcribe` as soon as it is decoded."""

    index: int
    start: float  # seconds into the recording
    end: float
    text: str
    seconds: float  # running the file on this window
    audio_seconds: float  # the recording's length as its header says (an estimate for some mp3): for progress
    segments: list[Segment] = field(default_factory=list)  # with timestamps=True
    last: bool = False
    notes: list[str] = field(default_factory=list)  # on the last window: what the user should know about the audio
    stopped_early: bool = False  # on the last window: reading stopped at max_seconds


@dataclass
class TranscriptionResult:
    """The text of an audio file, window by window, and how long it took."""

    text: str
    windows: list[str]  # the text of each 30 s window, in order
    audio_seconds: float
    seconds: float  # running the file (all three methods), reading the audio aside
    segments: list[Segment] = field(default_factory=list)  # with timestamps=True: timed stretches of speech
    notes: list[str] = field(default_factory=list)  # what the user should know about the audio (damaged samples)
    stopped_early: bool = False  # max_seconds ended the reading before the end of the recording

    @classmethod
    def from_windows(cls, windows: list[TranscribedWindow]) -> TranscriptionResult:
        """The whole recording's result from :func:`stream_transcribe`'s windows, all of them, in order."""
        last = windows[-1]
        return cls(
            " ".join(window.text for window in windows if window.text),
            [window.text for window in windows],
            last.end,
            sum(window.seconds for window in windows),
            [segment for window in windows for segment in window.segments],
            last.notes,
            last.stopped_early,
        )

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
    max_seconds: float | None = None,
) -> TranscriptionResult:
    """Transcribe ``audio`` with a speech ``.pte`` (and ``config.json``, ``generation_config.json`` and
    ``tokenizer.json`` in ``folder``, the export folder); :func:`stream_transcribe` yields the same window by window.

    ``language`` (``"fr"``...) and ``translate`` (into English) apply to multilingual
    models; ``timestamps`` fills :attr:`TranscriptionResult.segments`; ``max_seconds`` reads
    at most that much of the recording. The file runs in this process: call
    :func:`hub_export.prepare_pte_process` before torch loads.

    Raises:
        InputError: the audio cannot be read, the folder lacks the model's files, or the file is not a speech file.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    return TranscriptionResult.from_windows(
        list(stream_transcribe(pte_path, folder, audio, language, translate, timestamps, max_seconds))
    )


def stream_transcribe(
    pte_path: str | Path,
    folder: str | Path,
    audio: str | Path,
    language: str | None = None,
    translate: bool = False,
    timestamps: bool = False,
    max_seconds: float | None = None,
) -> Iterator[TranscribedWindow]:
    """Transcribe ``audio`` window by window, as :func:`transcribe` does, yielding each window's text as soon as
    it is decoded; the last window carries the notes on the audio.

    Raises:
        InputError, VerificationError: as :func:`transcribe`, when the window they concern is reached.
    """
    import torch
    from tokenizers import Tokenizer

    from hub_export.media.audio import AudioReader
    from hub_export.tasks.speech.decoding import (  # torch and ExecuTorch: loaded when a file is run
        SpeechFile,
        greedy_tokens,
        prompt_ids,
        segments,
    )
    from hub_export.tasks.speech.export import SAMPLE_RATE, WINDOW_SAMPLES, generation_settings

    folder = _checked(Path(folder), max_seconds)
    with AudioReader(audio, SAMPLE_RATE) as reader:
        file = SpeechFile(pte_path)
        settings = generation_settings(folder)
        prompt = prompt_ids(settings, language, translate, timestamps)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))

        def text_of(tokens: list[int]) -> str:
            return tokenizer.decode(tokens, skip_special_tokens=True).strip()

        total = reader.info.seconds if max_seconds is None else min(reader.info.seconds, max_seconds)
        # One window read ahead, so the window yielded knows whether it is the last.
        pending = reader.windows(WINDOW_SAMPLES, max_seconds)
        window, index = next(pending), 0
        while window is not None:
            following = next(pending, None)
            started = time.perf_counter()
            features = file.features(torch.from_numpy(window.samples))
            tokens = greedy_tokens(file.encode, file.decode, features, prompt, settings, file.max_seq_len, timestamps)
            timed = segments(tokens, settings, text_of, window.start) if timestamps else []
            last = following is None
            end, seconds = window.start + window.samples.size / SAMPLE_RATE, time.perf_counter() - started
            yield TranscribedWindow(index, window.start, end, text_of(tokens), seconds, total, timed, last,
                                    reader.notes() if last else [], reader.stopped_early if last else False)  # fmt: skip
            window, index = following, index + 1


def _checked(folder: Path, max_seconds: float | None) -> Path:
    """The export folder, with the files a transcription reads; ``max_seconds`` above 0 when given."""
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise InputError(f"no {name} in {folder.name}/; pass the export folder")
    if max_seconds is not None and not max_seconds > 0:
        raise InputError(f"--max-seconds must be above 0 (got {max_seconds})", param="max_seconds")
    return folder
