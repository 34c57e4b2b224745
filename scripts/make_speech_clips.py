"""Regenerate the speech clips hub-export ships for verification (``hub_export/data/speech``).

    python scripts/make_speech_clips.py

Each sentence is spoken by espeak-ng (Debian package ``espeak-ng``; its speech is a
program's output, free of licence terms), resampled to 16 kHz mono and stored as FLAC,
with the sentences in ``transcripts.json``. Whisper-class models transcribe these
robotic voices imperfectly; verification compares each file with the eager model on the
same audio, and reports the word error rate against the sentence beside it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile
from scipy.signal import resample_poly

SENTENCES = [
    "The weather today is cold and windy, so take a warm coat.",
    "Please send the report to the office before noon on Friday.",
    "She opened the window and listened to the birds in the garden.",
    "Our train leaves the station at seven and arrives in the city at nine.",
]
FOLDER = Path(__file__).resolve().parent.parent / "hub_export" / "data" / "speech"
RATE = 16000


def speak(sentence: str) -> np.ndarray:
    """``sentence`` spoken by espeak-ng at 16 kHz, float32 in [-1, 1]."""
    with tempfile.TemporaryDirectory() as work:
        wav = Path(work) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), sentence], check=True)
        audio, rate = soundfile.read(wav, dtype="float32")
    return resample_poly(audio, RATE, rate).astype(np.float32)


def main() -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    records = []
    for index, sentence in enumerate(SENTENCES, 1):
        name = f"clip-{index}.flac"
        soundfile.write(FOLDER / name, speak(sentence), RATE, subtype="PCM_16")
        records.append({"file": name, "text": sentence})
    (FOLDER / "transcripts.json").write_text(json.dumps(records, indent=2) + "\n")
    print(f"wrote {len(records)} clips to {FOLDER}")


if __name__ == "__main__":
    main()
