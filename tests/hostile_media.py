"""Hostile audio and image files, made at test time, and a driver that runs CLI verbs on them in a capped process.

The corpus replays what a hostile or unlucky user hands the media verbs: headers that lie
about rates, channels and lengths, decompression bombs, animations, non-numbers, files that
are not files, and seeded random damage to good headers. Run as a script, this module runs
``hub-export ARGS`` once per case in one process whose address space is capped, and prints
each case's exit code, stderr, wall time and peak RSS as JSON.
"""

from __future__ import annotations

import io
import json
import os
import random
import socket
import struct
import sys
import time
import zlib
from pathlib import Path


def _wav(path: Path, samples, rate: int = 16000, subtype: str = "PCM_16") -> Path:
    import soundfile

    soundfile.write(path, samples, rate, subtype=subtype)
    return path


def _tone(seconds: float = 2.0, rate: int = 16000):
    import numpy as np

    t = np.arange(int(seconds * rate), dtype=np.float32) / rate
    return (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def tone_wav(path: Path, seconds: float = 2.0) -> Path:
    """A good recording: a quiet 440 Hz tone, 16 kHz 16-bit mono WAV."""
    return _wav(path, _tone(seconds))


def _patched(source: Path, target: Path, offset: int, value: bytes, keep: int | None = None) -> Path:
    data = bytearray(source.read_bytes())
    data[offset : offset + len(value)] = value
    target.write_bytes(bytes(data[:keep]))
    return target


def not_files(folder: Path, suffix: str) -> dict[str, Path]:
    """A FIFO, a socket, a directory and links to a device and a FIFO, each named like a media file."""
    fifo = folder / f"fifo{suffix}"
    os.mkfifo(fifo)
    sock = folder / f"socket{suffix}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))  # the socket file stays after the socket object is gone
    server.close()
    directory = folder / f"folder{suffix}"
    directory.mkdir()
    zero = folder / f"zero{suffix}"
    zero.symlink_to("/dev/zero")
    linked = folder / f"linked-fifo{suffix}"
    linked.symlink_to(fifo)
    return {"fifo": fifo, "socket": sock, "directory": directory, "device link": zero, "fifo link": linked}


def audio_corpus(folder: Path) -> dict[str, Path]:
    """Hostile audio files by what is wrong with them; each must be refused in one line."""
    import numpy as np
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    good = tone_wav(folder / "good.wav")
    cases = {
        "1 Hz": _patched(good, folder / "rate-1.wav", 24, struct.pack("<II", 1, 2)),
        "2^31-1 Hz": _patched(good, folder / "rate-max.wav", 24, struct.pack("<II", 2**31 - 1, 2**31 - 1)),
        "0 channels": _patched(good, folder / "channels-0.wav", 22, struct.pack("<H", 0)),
        "5000 channels": _patched(good, folder / "channels-5000.wav", 22, struct.pack("<H", 5000)),
        "empty": folder / "empty.wav",
        "header only": _patched(good, folder / "header-only.wav", 0, b"", keep=44),
        "garbage mp3": folder / "garbage.mp3",
        "all NaN": _wav(folder / "nan.wav", np.full(32000, np.nan, np.float32), subtype="FLOAT"),
        "all infinite": _wav(folder / "inf.wav", np.full(32000, np.inf, np.float32), subtype="FLOAT"),
    }
    cases["empty"].write_bytes(b"")
    cases["garbage mp3"].write_bytes(b"\xff\xfb\x90\x00" + random.Random(0).randbytes(5000))
    # A 132-byte FLAC whose STREAMINFO claims 2^36 - 1 samples.
    soundfile.write(folder / "short.flac", _tone(0.25), 16000)
    flac = bytearray((folder / "short.flac").read_bytes())
    fields = int.from_bytes(flac[18:26], "big") | (1 << 36) - 1
    (folder / "huge.flac").write_bytes(bytes(flac[:18]) + fields.to_bytes(8, "big") + bytes(flac[26:132]))
    cases["FLAC claiming 2^36 samples"] = folder / "huge.flac"
    # A 3 kB MP3 whose Xing header claims 2^32 - 1 frames.
    soundfile.write(folder / "short.mp3", _tone(), 16000, format="MP3")
    mp3 = bytearray((folder / "short.mp3").read_bytes())
    xing = max(mp3.find(b"Xing"), mp3.find(b"Info"))
    if xing > 0:
        mp3[xing + 8 : xing + 12] = struct.pack(">I", 2**32 - 1)
        (folder / "xing.mp3").write_bytes(bytes(mp3[:3000]))
        cases["MP3 claiming 2^32 frames"] = folder / "xing.mp3"
    cases.update(not_files(folder, ".wav"))
    return cases


def damaged_headers(good: Path, folder: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` copies of ``good`` with one to four random bytes of its first 64 overwritten."""
    rng = random.Random(seed)
    data = good.read_bytes()
    paths = []
    for index in range(count):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(min(64, len(data)))] = rng.randrange(256)
        path = folder / f"damaged-{index}{good.suffix}"
        path.write_bytes(bytes(damaged))
        paths.append(path)
    return paths


def _png(width: int, height: int, rows: int | None = None, depth: int = 8, color: int = 2) -> bytes:
    """A PNG whose header says ``width`` x ``height``; ``rows`` of zeros are actually stored (all by default)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    packer = zlib.compressobj(1)
    row = bytes(1 + width * channels * depth // 8)
    body = b"".join(packer.compress(row) for _ in range(height if rows is None else rows)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def image_corpus(folder: Path) -> dict[str, Path]:
    """Hostile image files by what is wrong with them; each must be refused in one line."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    cases = {
        # 1.4 MB, every row stored: 179 megapixels of 16-bit RGBA, just under Pillow's own bomb limit.
        "179-megapixel 16-bit PNG": folder / "big16.png",
        "PNG bomb": folder / "bomb.png",
        "GIF bomb": folder / "bomb.gif",
        "JPEG bomb": folder / "bomb.jpg",
        "animated GIF": folder / "animated.gif",
        "truncated PNG": folder / "truncated.png",
        "SVG": folder / "drawing.svg",
        "PostScript named .jpg": folder / "postscript.jpg",
        "zero-width PNG": folder / "zero-width.png",
    }
    cases["179-megapixel 16-bit PNG"].write_bytes(_png(13370, 13370, depth=16, color=6))
    cases["PNG bomb"].write_bytes(_png(50000, 50000, rows=16))
    frames = [Image.new("P", (4000, 4000), shade) for shade in range(3)]
    frames[0].save(cases["animated GIF"], save_all=True, append_images=frames[1:])
    _patched(cases["animated GIF"], cases["GIF bomb"], 6, struct.pack("<HH", 50000, 50000))
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, "JPEG")
    jpeg = bytearray(buffer.getvalue())
    frame = jpeg.find(b"\xff\xc0")  # the baseline frame header: height and width follow its length and precision
    jpeg[frame + 5 : frame + 9] = struct.pack(">HH", 65000, 65000)
    cases["JPEG bomb"].write_bytes(bytes(jpeg))
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 10)).save(buffer, "PNG")
    cases["truncated PNG"].write_bytes(buffer.getvalue()[:70])
    cases["SVG"].write_text("<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>")
    cases["PostScript named .jpg"].write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n")
    cases["zero-width PNG"].write_bytes(_png(0, 10, rows=0))
    cases.update(not_files(folder, ".png"))
    return cases


def _run_capped(argv: list[str]) -> dict:
    """``hub-export ARGV`` in this process: exit code, everything written to stderr (fd 2 included), time, RSS."""
    import resource
    import tempfile

    from hub_export.cli import main

    sys.argv = ["hub-export", *argv]
    sys.stdout = io.StringIO()
    started = time.perf_counter()
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException as error:
            code, _ = -1, print(f"driver: {type(error).__name__}: {error}", file=sys.stderr)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        err = captured.read().decode(errors="replace")
    out, sys.stdout = sys.stdout.getvalue(), sys.__stdout__
    return {
        "code": code,
        "stdout": out,
        "stderr": err,
        "seconds": time.perf_counter() - started,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    """``python tests/hostile_media.py CASES.json RESULTS.json``: CASES is a list of argv lists; RESULTS gets one
    result per case."""
    import resource

    cap = 8 << 30  # the address space: a verb sized from a lying header fails here instead of taking the machine
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    os.environ.setdefault("COLUMNS", "200")  # one error line stays one line
    spec, out = Path(sys.argv[1]), Path(sys.argv[2])
    results = [_run_capped(argv) for argv in json.loads(spec.read_text())]
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
