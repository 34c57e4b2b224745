"""Hostile audio and images through the media verbs: one line, exit code 2, bounded time and memory.

Each corpus runs through the real CLI in one child process whose address space is capped at
8 GB (tests/hostile_media.py), after one good file that sets the baseline: a case that
allocated from a lying header, hung on a FIFO, or let a decoder print on the terminal fails
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_media import audio_corpus, damaged_headers, image_corpus, not_files, tone_wav

from hub_export.errors import InputError

HERE = Path(__file__).parent
MAX_SECONDS = 30  # for one case, loading the file included
MAX_GROWTH_MB = 300  # peak RSS over the good file's, across the whole corpus


def _run(cases: list[list[str]], folder: Path) -> list[dict]:
    spec, results = folder / "cases.json", folder / "results.json"
    spec.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    subprocess.run([sys.executable, str(HERE / "hostile_media.py"), str(spec), str(results)], env=env, check=True,
                   timeout=MAX_SECONDS * (len(cases) + 2))  # fmt: skip
    return json.loads(results.read_text())


def _refused(what: str, path: Path, result: dict) -> None:
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert result["code"] == 2, (what, result)
    assert len(lines) == 1 and lines[0].startswith("Error:") and path.name in lines[0], (what, result["stderr"])
    assert result["seconds"] < MAX_SECONDS, (what, result["seconds"])


def _bounded(results: list[dict]) -> None:
    growth = max(result["peak_mb"] for result in results) - results[0]["peak_mb"]
    assert growth < MAX_GROWTH_MB, [(result["peak_mb"], result["stderr"][:80]) for result in results]


def test_transcribe_refuses_hostile_audio_in_one_line(exported_whisper, spoken, tmp_path) -> None:
    corpus = audio_corpus(tmp_path / "audio")
    base = ["transcribe", str(exported_whisper), "--variant", "8da8w"]
    results = _run([[*base, str(spoken)]] + [[*base, str(path)] for path in corpus.values()], tmp_path)
    good = results[0]
    assert good["code"] == 0 and good["stdout"].strip() and "real-time factor" in good["stderr"], good
    for (what, path), result in zip(corpus.items(), results[1:], strict=True):
        _refused(what, path, result)
    _bounded(results)


def test_randomly_damaged_audio_headers_are_read_or_refused_in_one_line(exported_whisper, tmp_path) -> None:
    good = tone_wav(tmp_path / "good.wav")
    damaged = damaged_headers(good, tmp_path, count=24, seed=7)
    base = ["transcribe", str(exported_whisper), "--variant", "8da8w"]
    results = _run([[*base, str(path)] for path in [good, *damaged]], tmp_path)
    assert results[0]["code"] == 0, results[0]
    for path, result in zip(damaged, results[1:], strict=True):
        assert result["code"] in (0, 2), (path.name, result)
        if result["code"] == 2:
            _refused("damaged header", path, result)
        assert "Traceback" not in result["stderr"] and result["seconds"] < MAX_SECONDS
    _bounded(results)


def test_classify_refuses_hostile_images_in_one_line(exported_vit, picture, tmp_path) -> None:
    corpus = image_corpus(tmp_path / "images")
    base = ["classify", str(exported_vit), "--variant", "8da8w"]
    results = _run([[*base, str(picture)]] + [[*base, str(path)] for path in corpus.values()], tmp_path)
    assert results[0]["code"] == 0, results[0]
    for (what, path), result in zip(corpus.items(), results[1:], strict=True):
        _refused(what, path, result)
    _bounded(results)


def test_a_large_image_is_read_within_its_budget(tmp_path) -> None:
    """A 25-megapixel PNG is decoded (it is within the budget) and a 48-megapixel JPEG at an eighth of its scale."""
    import resource

    from PIL import Image

    from hub_export.media.images import open_image

    Image.new("RGB", (8000, 6000), (40, 90, 200)).save(tmp_path / "photo.jpg", quality=80)
    Image.new("RGB", (5000, 5000), (200, 90, 40)).save(tmp_path / "scan.png")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    photo = open_image(tmp_path / "photo.jpg", size=224)
    assert photo.size == (1000, 750) and photo.getpixel((10, 10))[2] > 150  # decoded at an eighth of its scale
    scan = open_image(tmp_path / "scan.png", size=224)
    assert min(scan.size) >= 448 and scan.mode == "RGB"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 400


def test_audio_streams_in_windows_with_the_same_samples_as_a_whole_read(tmp_path) -> None:
    """Resampling block by block gives what resampling the whole recording gives, at every block boundary."""
    import numpy as np
    import soundfile
    import soxr

    from hub_export.media.audio import AudioReader

    rng = np.random.default_rng(0)
    stereo = (rng.standard_normal((48000 * 75, 2)) * 0.1).astype(np.float32)  # 75 s: three windows
    soundfile.write(tmp_path / "long.flac", stereo, 48000)
    whole = soxr.resample(stereo.mean(axis=1), 48000, 16000)
    with AudioReader(tmp_path / "long.flac") as audio:
        windows = list(audio.windows(16000 * 30))
    assert [w.start for w in windows] == [0.0, 30.0, 60.0] and windows[-1].samples.size == 16000 * 15
    streamed = np.concatenate([w.samples for w in windows])
    assert streamed.size == whole.size and np.abs(streamed - whole).max() < 1e-4


def test_max_seconds_stops_reading_and_non_numbers_are_counted(tmp_path) -> None:
    import numpy as np
    import soundfile

    from hub_export.media.audio import AudioReader

    samples = np.full(16000 * 40, 0.05, np.float32)
    samples[:160] = np.nan
    soundfile.write(tmp_path / "partly.wav", samples, 16000, subtype="FLOAT")
    with AudioReader(tmp_path / "partly.wav") as audio:
        windows = list(audio.windows(16000 * 30, max_seconds=35))
        assert sum(w.samples.size for w in windows) == 16000 * 35 and audio.stopped_early
        assert audio.notes() == [
            "partly.wav: 160 samples (0.0%) were not numbers (NaN or infinite) and were read as silence"
        ]
        assert np.isfinite(windows[0].samples).all()


@pytest.mark.parametrize("suffix", [".wav", ".png"])
def test_the_api_refuses_what_is_not_a_file_without_waiting(tmp_path, suffix) -> None:
    from hub_export.media.audio import AudioReader
    from hub_export.media.images import open_image

    read = AudioReader if suffix == ".wav" else open_image
    for path in not_files(tmp_path, suffix).values():
        with pytest.raises(InputError, match="not a file|is a directory"):
            read(path)
