"""A calibration text the user names (--calibration-text): read within bounds, checked to be text enough to calibrate on, and its digest for the manifest."""

from __future__ import annotations

from hub_export.errors import InputError, opt

MAX_CALIBRATION_BYTES = 20_000_000


MIN_CALIBRATION_WORDS = 128  # the calibration reads 128 tokens; a word is at least one


def read_calibration_text(path: str) -> str:
    """The user's calibration text, checked: a readable UTF-8 text file of at least 128 words, at most 20 MB.

    Raises:
        InputError: missing, too large, binary, not UTF-8, empty or too short; the message says which.
    """
    from pathlib import Path

    file = Path(path)
    name = opt("calibration_text")
    if not file.is_file():
        raise InputError(f"{name}: no file at {path}", param="calibration_text")
    if file.stat().st_size > MAX_CALIBRATION_BYTES:
        raise InputError(f"{name}: {file.name} is over 20 MB; a few thousand words of your text are enough",
                         param="calibration_text")  # fmt: skip
    raw = file.read_bytes()
    if b"\x00" in raw:
        raise InputError(f"{name}: {file.name} is binary, not text; pass a UTF-8 text file", param="calibration_text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: {file.name} is not UTF-8; save it as UTF-8 text", param="calibration_text") from None
    words = len(text.split())
    if words < MIN_CALIBRATION_WORDS:
        raise InputError(f"{name}: {file.name} has {words} words; the calibration reads {MIN_CALIBRATION_WORDS} "
                         f"tokens, give at least {MIN_CALIBRATION_WORDS} words", param="calibration_text")  # fmt: skip
    return text


def calibration_text_digest(path: str) -> str:
    """The sha256 of the calibration text's bytes (what the manifest records instead of the text)."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
