"""Audio read as a stream: checked from its header first, then decoded, mixed to mono and resampled
block by block, so memory does not grow with the recording's length.

libsndfile (through soundfile) decodes wav, flac, ogg/opus and mp3; python-soxr resamples
in a stream (its state carries across blocks, so the result does not depend on where the
blocks fall). Nothing is sized from the header: a header is only checked against what
speech can be and what the file's bytes can hold, and reading stops at the end of the data
or at ``max_seconds``.

Example:
    >>> with AudioReader("meeting.flac") as audio:
    ...     for window in audio.windows(480_000):
    ...         print(window.start, window.samples.shape)
    0.0 (480000,)
    30.0 (112000,)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hub_export.errors import InputError
from hub_export.media.files import open_regular
from hub_export.quiet import native_stderr_to_log

log = logging.getLogger("hub_export.media")

MIN_RATE, MAX_RATE = 1_000, 768_000  # Hz: below, not speech; above, no recorder makes it
MAX_CHANNELS = 64  # ambisonic and field recorders stay well under it
BLOCK_BYTES = 4 << 20  # decoded float32 frames read at once, whatever the rate and channel count

# Bytes per sample of the uncompressed encodings: a header claiming more samples than the file's bytes hold lies.
_PCM_BYTES = {"PCM_S8": 1, "PCM_U8": 1, "ULAW": 1, "ALAW": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4,
              "DOUBLE": 8}  # fmt: skip
# Compressed encodings: digital silence in FLAC's largest blocks packs about 4000 samples in a byte; a
# header claiming twice that is not a recording.
_MAX_SAMPLES_PER_BYTE = 8192


@dataclass(frozen=True)
class AudioInfo:
    """What a sound file's header says, once checked."""

    name: str
    rate: int
    channels: int
    frames: int  # as the header says: exact for wav and flac, an estimate for some mp3
    format: str  # "WAV", "FLAC", "OGG", "MP3"...
    subtype: str  # "PCM_16", "VORBIS"...

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


@dataclass(frozen=True)
class Window:
    """A stretch of the recording: mono float32 samples at the reader's rate, starting ``start`` seconds in."""

    start: float
    samples: np.ndarray


class AudioReader:
    """A sound file opened for streaming: :attr:`info` is checked, :meth:`windows` decodes as it goes.

    Samples that are not numbers (NaN, infinite) are read as silence and counted
    (:attr:`non_finite`, :meth:`notes`); a window made only of them is refused. Samples
    beyond full scale are clipped to it.

    Raises:
        InputError: the path is not a regular file, not audio libsndfile reads, or its header
            holds values no recording has (each named in the message).
    """

    def __init__(self, path: str | Path, rate: int = 16_000):
        import soundfile

        self.path, self.rate = Path(path), rate
        self._raw = open_regular(self.path, "audio")
        try:
            with native_stderr_to_log(log):
                self._file = soundfile.SoundFile(self._raw)
        except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError, TypeError) as error:
            self._raw.close()
            raise InputError(
                f"cannot read {self.path.name} as audio ({type(error).__name__}); give a wav, flac, ogg or mp3 file"
            ) from None
        try:
            self.info = self._checked_info()
        except InputError:
            self.close()
            raise
        self.non_finite = 0  # samples (after mixing) that were NaN or infinite, read as silence
        self.clipped = 0
        self.decoded = 0  # samples (after mixing, before resampling) read so far
        self.stopped_early = False  # reading ended at max_seconds, before the end of the file

    def _checked_info(self) -> AudioInfo:
        file, name = self._file, self.path.name
        info = AudioInfo(name, int(file.samplerate), int(file.channels), int(file.frames), file.format, file.subtype)
        if not MIN_RATE <= info.rate <= MAX_RATE:
            raise InputError(
                f"{name}: the header says {info.rate} Hz; audio is read at {MIN_RATE // 1000} kHz to "
                f"{MAX_RATE // 1000} kHz, so the file is damaged or not a recording"
            )
        if not 1 <= info.channels <= MAX_CHANNELS:
            raise InputError(
                f"{name}: the header says {info.channels} channels; at most {MAX_CHANNELS} are read, so the file is "
                "damaged or not a recording"
            )
        size = max(self.path.stat().st_size, 1)
        per_sample = None if info.format == "FLAC" else _PCM_BYTES.get(info.subtype)  # FLAC names its bit depth
        most = size // per_sample if per_sample else size * _MAX_SAMPLES_PER_BYTE
        if info.frames < 0 or info.frames * info.channels > most:
            raise InputError(
                f"{name}: the header says {info.frames} frames of {info.channels} channel(s), more than its "
                f"{size} bytes can hold; the file is damaged"
            )
        if info.frames == 0:
            raise InputError(f"{name} holds no audio samples")
        return info

    def windows(self, samples: int, max_seconds: float | None = None) -> Iterator[Window]:
        """Consecutive windows of ``samples`` mono samples at :attr:`rate` (the last one shorter), decoded as they
        are asked for; reading stops after ``max_seconds`` of the recording (then :attr:`stopped_early`).

        Raises:
            InputError: a whole window is not numbers (the file is damaged), or nothing could be decoded.
        """
        buffer, filled, start = np.zeros(samples, dtype=np.float32), 0, 0
        for chunk in self._resampled(max_seconds):
            while chunk.size:
                taken = min(chunk.size, samples - filled)
                buffer[filled : filled + taken] = chunk[:taken]
                filled, chunk = filled + taken, chunk[taken:]
                if filled == samples:
                    yield Window(start / self.rate, buffer)
                    buffer, filled, start = np.zeros(samples, dtype=np.float32), 0, start + samples
        if filled:
            yield Window(start / self.rate, buffer[:filled])
        elif start == 0:
            raise InputError(f"{self.path.name} holds no audio samples that could be decoded")

    def _resampled(self, max_seconds: float | None) -> Iterator[np.ndarray]:
        import soxr

        info = self.info
        stream = None if info.rate == self.rate else soxr.ResampleStream(info.rate, self.rate, 1, dtype="float32")
        limit = None if max_seconds is None else int(max_seconds * info.rate)
        block = max(1, min(info.rate, BLOCK_BYTES // (4 * info.channels)))
        window_frames, bad_run = 30 * info.rate, 0
        while limit is None or self.decoded < limit:
            want = block if limit is None else min(block, limit - self.decoded)
            mono = self._read(want)
            if mono is None:
                break
            self.decoded += mono.size
            bad = ~np.isfinite(mono)
            if bad.any():
                count = int(bad.sum())
                self.non_finite, mono[bad] = self.non_finite + count, 0.0
                bad_run = bad_run + count if count == mono.size else 0
                if bad_run >= window_frames:
                    at = (self.decoded - bad_run) / info.rate
                    raise InputError(
                        f"{self.path.name} is damaged: 30 s from {at:.0f} s on are not numbers (NaN or infinite)"
                    )
            else:
                bad_run = 0
            loud = np.abs(mono) > 1.0
            if loud.any():
                self.clipped += int(loud.sum())
                np.clip(mono, -1.0, 1.0, out=mono)
            yield mono if stream is None else stream.resample_chunk(mono)
        else:
            self.stopped_early = self._read(1) is not None
        if self.decoded and self.non_finite == self.decoded:
            raise InputError(f"{self.path.name} is damaged: none of its samples are numbers (NaN or infinite)")
        if stream is not None:
            yield stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)

    def _read(self, frames: int) -> np.ndarray | None:
        """Up to ``frames`` frames mixed to mono float32, or None at the end of the data."""
        import soundfile

        try:
            with native_stderr_to_log(log):
                data = self._file.read(frames, dtype="float32", always_2d=True)
        except (soundfile.LibsndfileError, RuntimeError, ValueError) as error:
            raise InputError(f"{self.path.name} is damaged: decoding failed ({type(error).__name__})") from None
        if not data.shape[0]:
            return None
        return data[:, 0].copy() if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)

    def notes(self) -> list[str]:
        """What the user should know about the samples read so far, one sentence each."""
        notes = []
        if self.non_finite:
            share = self.non_finite / max(self.decoded, 1)
            notes.append(
                f"{self.path.name}: {self.non_finite} samples ({share:.1%}) were not numbers (NaN or infinite) and "
                "were read as silence"
            )
        if self.clipped:
            notes.append(f"{self.path.name}: {self.clipped} samples beyond full scale were clipped")
        return notes

    def close(self) -> None:
        self._file.close()
        self._raw.close()

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_audio(path: str | Path, rate: int = 16_000, max_seconds: float | None = None) -> np.ndarray:
    """A short sound file whole: mono float32 samples at ``rate`` (a reference clip; long audio wants
    :class:`AudioReader`'s windows).

    Raises:
        InputError: as :class:`AudioReader`.
    """
    with AudioReader(path, rate) as audio:
        parts = [window.samples for window in audio.windows(rate * 30, max_seconds)]
    return np.concatenate(parts)
