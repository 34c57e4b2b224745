"""Peak memory of `hub-export transcribe` against the recording's length: one minute against hours.

    python -m benchmarks.long_audio                # 1 min and 10 h of 48 kHz stereo
    python -m benchmarks.long_audio --hours 1      # a shorter long run

Exports the packaged Whisper tiny.en (8da8w) once, writes 48 kHz 16-bit stereo WAV (RF64,
which holds more than 4 GB) where every 30 s window begins with one of the shipped spoken
sentences and is silent after it, runs `hub-export transcribe` on each length in a fresh
process and records its peak RSS (the kernel's, from wait4), wall time and windows printed.
Writes benchmarks/results/long-audio.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "benchmarks" / "work" / "long-audio"
RATE, WINDOW_SECONDS = 48_000, 30


def exported_whisper() -> Path:
    """The packaged Whisper tiny.en exported 8da8w, once."""
    from hub_export.models.packaged import packaged_whisper
    from hub_export.pipeline.export import export

    out = WORK / "whisper-tiny.en"
    if not (out / "manifest.json").is_file():
        export(str(packaged_whisper()), out, qmodes=["8da8w"], jobs=1)
    return out


def recording(seconds: int) -> Path:
    """48 kHz stereo 16-bit RF64 of ``seconds``: each 30 s window opens with a spoken sentence, then silence."""
    import numpy as np
    import soundfile
    import soxr

    from hub_export.tasks.speech.export import eval_clips

    path = WORK / f"speech-{seconds}s.wav"
    if path.is_file():
        return path
    window = np.zeros((RATE * WINDOW_SECONDS, 2), dtype=np.float32)
    clips = [soxr.resample(clip.waveform.numpy(), 16_000, RATE) for clip in eval_clips()]
    partial = path.with_suffix(".partial")
    with soundfile.SoundFile(partial, "w", RATE, 2, "PCM_16", format="RF64") as file:
        for index in range(-(-seconds // WINDOW_SECONDS)):
            window[:] = 0.0
            clip = clips[index % len(clips)]
            window[: clip.size] = clip[:, None]
            left = seconds - index * WINDOW_SECONDS
            file.write(window[: min(left, WINDOW_SECONDS) * RATE])
    partial.rename(path)
    return path


def run(export_dir: Path, audio: Path) -> dict:
    """``hub-export transcribe`` on ``audio`` in its own process: peak RSS, wall time, windows of text."""
    import soundfile

    command = [str(Path(sys.executable).parent / "hub-export"), "transcribe", str(export_dir), str(audio)]
    out, err = WORK / "stdout.txt", WORK / "stderr.txt"
    started = time.perf_counter()
    with out.open("w") as stdout, err.open("w") as stderr:
        env = {**os.environ, "COLUMNS": "250"}  # the summary line stays one line
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(process.pid, 0)  # the child's own peak, as the kernel counted it
        process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    summary = err.read_text().strip().splitlines()[-1:]
    if process.returncode:
        raise SystemExit(f"transcribe failed on {audio.name}: {summary}")
    return {
        "audio_seconds": soundfile.info(str(audio)).duration,
        "file_bytes": audio.stat().st_size,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "wall_seconds": wall,
        "windows": len([line for line in out.read_text().splitlines() if line.strip()]),
        "summary": summary[0] if summary else "",
    }


def markdown(record: dict) -> str:
    rows = [
        "| recording | file | peak RSS | wall | windows with text |",
        "|---|---|---:|---:|---:|",
    ]
    for run_ in record["runs"]:
        hours = run_["audio_seconds"] / 3600
        length = f"{hours:.0f} h" if hours >= 1 else f"{run_['audio_seconds'] / 60:.0f} min"
        rows.append(
            f"| {length} of 48 kHz stereo | {run_['file_bytes'] / 2**30:.2f} GiB | {run_['peak_rss_mb']:.0f} MB | "
            f"{run_['wall_seconds'] / 60:.1f} min | {run_['windows']} |"
        )
    growth = record["runs"][-1]["peak_rss_mb"] - record["runs"][0]["peak_rss_mb"]
    return (
        f"Machine: {record['machine']}. Whisper tiny.en 8da8w, `hub-export transcribe`.\n\n"
        + "\n".join(rows)
        + f"\n\nPeak RSS of the longest against one minute: {growth:+.0f} MB.\n"
    )


def main() -> None:
    from hub_export.pipeline.manifest import machine_description

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=10.0, help="the long recording's length (default 10)")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    export_dir = exported_whisper()
    lengths = [60, int(args.hours * 3600)]
    runs = []
    for seconds in lengths:
        audio = recording(seconds)
        print(f"transcribing {audio.name} ({audio.stat().st_size / 2**30:.2f} GiB) ...", flush=True)
        runs.append(run(export_dir, audio))
        print(json.dumps(runs[-1]), flush=True)
    record = {"machine": machine_description(), "command": "python -m benchmarks.long_audio", "runs": runs}
    if args.hours != 10.0:
        record["command"] += f" --hours {args.hours:g}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "long-audio.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "long-audio.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
