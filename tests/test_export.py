"""The export pipeline: variants, manifest, verification, failures and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import error_line, run_cli

from hub_export.pipeline.manifest import Manifest, sha256_file

# --- a two-variant export (8da4w with 8-bit embeddings, fp32) of a tied model -------------


def test_export_writes_every_variant_with_tokenizer_and_manifest(exported_multi):
    names = sorted(p.name for p in exported_multi.iterdir())
    assert "model-8da4w-emb8w.pte" in names and "model-fp32-emb8w.pte" in names
    for required in (
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
        "manifest.json",
    ):
        assert required in names
    assert "chat_template" in json.loads((exported_multi / "tokenizer_config.json").read_text())
    assert not [n for n in exported_multi.parent.iterdir() if ".partial-" in n.name]


def test_manifest_records_what_a_user_needs(exported_multi):
    data = json.loads((exported_multi / "manifest.json").read_text())
    assert data["schema_version"] == 1
    assert data["source"]["id"] == "tiny-llama" and data["source"]["revision"] is None
    assert set(data["versions"]) == {"torch", "executorch", "torchao", "transformers", "hub-export"}
    assert data["versions"]["executorch"].startswith("1.5")
    manifest = Manifest.read(exported_multi)
    assert [v.qmode for v in manifest.variants] == ["8da4w", "fp32"]
    for variant in manifest.variants:
        path = exported_multi / variant.file
        assert variant.size_bytes == path.stat().st_size
        assert variant.sha256 == sha256_file(path)
        assert variant.max_seq_len == 64 and variant.qembedding == "8w"
        assert variant.export_seconds > 0
        check = variant.verification
        assert check.passed and check.mean_kl_vs_eager <= check.max_kl
        assert check.top1_within_ties >= check.min_top1 and check.runner_generated_tokens >= 1
        assert check.runner_threads is not None and check.runner_threads >= 1  # the rates say what ran them
        second = check.second_quality  # the technical text, half as many tokens as the prose
        assert second.text == "eval_docs_en.txt" and 0 < second.tokens <= check.quality.tokens
        assert second.perplexity > 1 and second.fp32_perplexity > 1
        # every variant is scored on the evaluation text (random weights: perplexity near the vocabulary size)
        assert check.quality.tokens >= 2000 and check.quality.perplexity > 1
    assert manifest.variant("8da4w").group_size == 32 and manifest.variant("fp32").group_size is None
    # fp32 must match eager almost exactly; the quantized variant must be far smaller.
    assert manifest.variant("fp32").verification.max_abs_diff < 1e-3
    assert manifest.variant("8da4w").size_bytes < 0.4 * manifest.variant("fp32").size_bytes


def test_manifest_has_no_absolute_path(exported_multi):
    text = (exported_multi / "manifest.json").read_text()
    assert str(exported_multi.parent) not in text and "/tmp" not in text and "hf_" not in text


def test_runner_metadata_is_in_the_pte(exported_multi):
    from hub_export.runtime.pte import PteModel

    manifest = Manifest.read(exported_multi)
    variant = manifest.variant("8da4w")
    metadata = PteModel(exported_multi / variant.file).metadata
    assert metadata == variant.metadata
    assert metadata["get_max_seq_len"] == 64 and metadata["get_max_context_len"] == 64
    assert metadata["get_eos_ids"] == [0]  # from generation_config and config, deduplicated
    assert metadata["get_vocab_size"] == 512
    assert metadata["enable_dynamic_shape"] is True and metadata["use_kv_cache"] is True
    assert metadata["use_sdpa_with_kv_cache"] is True
    assert "get_bos_id" not in metadata  # the tiny model has no BOS token


def test_pte_prefills_in_parallel_and_matches_token_by_token(exported_multi, tiny_model):
    """Prefilling N tokens at once gives the same logits as feeding them one by one."""
    import torch

    from hub_export.runtime.pte import PteModel

    model = PteModel(exported_multi / "model-fp32-emb8w.pte")
    ids = torch.tensor([[5, 17, 99, 3, 250, 7]])
    parallel = model.forward(ids, start_pos=0)
    for pos in range(ids.shape[1]):
        sequential = model.forward(ids[:, pos : pos + 1], start_pos=pos)
    assert torch.allclose(parallel, sequential, atol=1e-4)


@pytest.mark.extended
def test_static_graph_is_not_marked_dynamic(tiny_model, tmp_path):
    """A cache of 2 leaves room for one-token prefill only: the graph is static, and says so."""
    from hub_export.pipeline.export import export

    manifest = export(str(tiny_model), tmp_path / "out", qmodes=["fp32"], max_seq_len=2)
    variant = manifest.variants[0]
    assert variant.metadata["enable_dynamic_shape"] is False
    assert variant.metadata["get_max_seq_len"] == 2
    assert variant.verification.passed and variant.verification.max_abs_diff < 1e-3


# --- generation --------------------------------------------------------------------------


def test_progress_is_a_stream_of_counted_stages(exported_multi):
    """What the CLI's stage log and the Space's bar are drawn from, with the variants built in two workers."""
    import json

    events = json.loads((exported_multi.parent / "tiny-multi-progress.json").read_text())
    steps = [(stage, variant, done, total) for _, stage, variant, done, total in events if stage != "note"]
    assert [stage for stage, *_ in steps[:4]] == ["resolve", "load", "reference", "calibrate"]  # GPTQ, for 8da4w
    for file in ("model-8da4w-emb8w.pte", "model-fp32-emb8w.pte"):
        assert [stage for stage, variant, *_ in steps if variant == file] == ["quantize", "export", "lower", "verify"]
    assert [done for _, _, done, _ in steps] == list(range(1, 13))  # every step counted once, in order
    assert {total for *_, total in steps} == {12}  # 4 + 4 per variant, known from the start
    assert all(message for message, *_ in events)
    for file in ("model-8da4w-emb8w.pte", "model-fp32-emb8w.pte"):  # lowering reports each XNNPACK partition
        partitions = [m for m, stage, variant, *_ in events if variant == file and "lowering: XNNPACK partition" in m]
        total = len(partitions)  # of how many, and from the third on, the time left
        assert partitions and partitions[0].endswith(f"partition 1 of {total}"), partitions
        assert total < 3 or "left" in partitions[2], partitions
    for file in ("model-8da4w-emb8w.pte", "model-fp32-emb8w.pte"):  # the runtime's decoding, counted, with time left
        verifying = [m for m, stage, variant, *_ in events if variant == file and "verifying: " in m]
        assert verifying and "runtime steps" in verifying[0] and "left" in verifying[0], verifying


def test_generate_streams_utf8_text_and_reports_speed(exported_multi):
    from tokenizers import Tokenizer

    from hub_export.tasks.text_generation.run import generate, stream_generate

    pte = exported_multi / "model-8da4w-emb8w.pte"
    pieces: list[str] = []
    result = generate(pte, exported_multi, "Café 東京 🙂", max_new_tokens=40, on_text=pieces.append)
    assert "".join(pieces) == result.text
    assert result.prompt_tokens > 3 and 1 <= result.generated_tokens <= 40
    assert result.prefill_tokens_per_s > 0 and result.stop_reason in {"eos", "max_new_tokens"}

    responses = list(stream_generate(pte, exported_multi, "Café 東京 🙂", max_new_tokens=40))
    assert [r.stop_reason for r in responses[:-1]] == [None] * (len(responses) - 1) and responses[-1].stop_reason
    assert "".join(r.text for r in responses) == result.text  # generate is the stream, collected
    # Streamed pieces are whole characters: together they read as the tokens decoded at once.
    tokens = [r.token for r in responses if r.stop_reason != "eos"]
    whole = Tokenizer.from_file(str(exported_multi / "tokenizer.json")).decode(tokens, skip_special_tokens=True)
    assert result.text == whole


def test_generate_cli_prints_text_and_tokens_per_second(exported_multi, capsys):
    code, out, err = run_cli(
        ["generate", str(exported_multi), "--variant", "fp32", "-p", "Once upon a time", "--max-new-tokens", "12"],
        capsys,
    )
    assert code == 0, err
    assert "prefill" in err and "decode" in err and "tok/s" in err
    from hub_export.tasks.text_generation.run import generate

    expected = generate(exported_multi / "model-fp32-emb8w.pte", exported_multi, "Once upon a time", max_new_tokens=12)
    assert out == expected.text + "\n"  # the text itself, on stdout, and nothing else there


# --- more qmodes, untied embeddings and the group-size fallback ---------------------------


@pytest.fixture(scope="session")
def untied_odd_model(tmp_path_factory) -> Path:
    """Untied embeddings and an MLP width (80) that group size 32 does not divide."""
    from hub_export.models.tiny import build_tiny_model, tiny_llama_config

    config = tiny_llama_config(intermediate_size=80, tie_word_embeddings=False)
    return build_tiny_model(tmp_path_factory.mktemp("models") / "untied-odd", config=config, seed=1)


@pytest.mark.extended
def test_8da8w_and_grouped_fallback_with_4bit_embeddings(untied_odd_model, tmp_path, caplog):
    from hub_export.pipeline.export import export

    with caplog.at_level("WARNING"):
        manifest = export(
            str(untied_odd_model), tmp_path / "out", qmodes=["8da8w", "8da4w"], qembedding="4w", max_seq_len=48
        )
    by_mode = {v.qmode: v for v in manifest.variants}
    assert by_mode["8da8w"].verification.passed and by_mode["8da4w"].verification.passed
    assert by_mode["8da8w"].per_channel_fallback == []  # per-channel already
    fallback = by_mode["8da4w"].per_channel_fallback
    assert fallback and all(name.endswith("down_proj") for name in fallback)
    assert "group size 32 does not divide" in caplog.text
    assert by_mode["8da4w"].qembedding == "4w"


@pytest.fixture(scope="session")
def biased_model(tmp_path_factory) -> Path:
    """Biases on every projection (as in Qwen2's attention), tied embeddings."""
    from hub_export.models.tiny import build_tiny_model, tiny_llama_config

    config = tiny_llama_config(attention_bias=True, mlp_bias=True)
    return build_tiny_model(tmp_path_factory.mktemp("models") / "biased", config=config, seed=2)


@pytest.mark.extended
def test_weight_only_4w_and_8w_match_eager_and_shrink_the_file(biased_model, tmp_path):
    from hub_export.pipeline.export import export

    manifest = export(str(biased_model), tmp_path / "out", qmodes=["4w", "8w", "fp32"], max_seq_len=48)
    by_mode = {v.qmode: v for v in manifest.variants}
    for mode in ("4w", "8w"):
        check = by_mode[mode].verification
        assert check.passed and check.runner_generated_tokens >= 1
        # Float activations: the runtime must reproduce the quantized eager model almost
        # exactly, while quantization itself visibly moved the logits.
        assert check.relative_l2 < 1e-4, check
        assert check.quant_max_abs_diff_vs_fp32 > 100 * check.max_abs_diff, check
        assert by_mode[mode].group_size is None
    # Each linear weight costs 4, 1 and 1/2 bytes (the embedding stays fp32 in all three).
    from torch import nn
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(biased_model)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    saved_by_8w = by_mode["fp32"].size_bytes - by_mode["8w"].size_bytes
    saved_by_4w = by_mode["8w"].size_bytes - by_mode["4w"].size_bytes
    assert saved_by_8w == pytest.approx(3 * linear_weights, rel=0.1)
    assert saved_by_4w == pytest.approx(0.5 * linear_weights, rel=0.1)


# --- tied embeddings stored once (--share-embeddings) -------------------------------------


@pytest.mark.extended
def test_shared_embeddings_store_the_tied_table_once(exported_shared, tiny_model, tmp_path):
    from transformers import AutoConfig

    from hub_export.pipeline.export import export
    from hub_export.tasks.text_generation.run import generate

    shared = Manifest.read(exported_shared).variants[0]
    assert shared.file == "model-8da8w-emb8w.pte" and shared.data_file == "model-8da8w-emb8w.ptd"
    for name, digest in shared.files():
        assert sha256_file(exported_shared / name) == digest
    assert shared.data_size_bytes == (exported_shared / shared.data_file).stat().st_size
    assert shared.verification.passed and shared.verification.runner_generated_tokens > 0
    assert "--share-embeddings" in Manifest.read(exported_shared).command

    single = export(str(tiny_model), tmp_path / "one-file", qmodes=["8da8w"], qembedding="8w", max_seq_len=64)
    unshared = single.variants[0]
    assert unshared.data_file is None
    config = AutoConfig.from_pretrained(tiny_model)
    table = config.vocab_size * config.hidden_size  # int8: one byte per entry
    assert unshared.total_bytes - shared.total_bytes == pytest.approx(table, rel=0.05)

    result = generate(exported_shared / shared.file, exported_shared, "Once upon", max_new_tokens=8)
    assert result.generated_tokens > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["-q", "8da8w", "--qembedding", "4w"], "--share-embeddings needs --qembedding 8w"),
        (["-q", "8da8w", "-q", "4w", "--qembedding", "8w"], "drop 4w"),
    ],
    ids=["4-bit table", "4w qmode"],
)
def test_share_embeddings_refuses_what_cannot_share(tiny_model, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code, _, err = run_cli(["export", str(tiny_model), "-o", str(out), "--share-embeddings", *args], capsys)
    assert code == 2 and message in error_line(err)
    assert not out.exists()


def test_share_embeddings_refuses_an_untied_model(untied_odd_model, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["export", str(untied_odd_model), "-o", str(out), "--share-embeddings", "-q", "8da8w", "--qembedding", "8w"],
        capsys,
    )
    assert code == 2 and "does not tie its input and output embeddings" in error_line(err)
    assert not out.exists()


# --- verification catches a broken file ---------------------------------------------------


def test_verification_fails_on_a_corrupted_pte(exported_multi, tiny_model, tmp_path):
    from hub_export.pipeline.build import load_model
    from hub_export.pipeline.verify import build_reference, expected_logits, verify

    broken = tmp_path / "broken.pte"
    data = bytearray((exported_multi / "model-fp32-emb8w.pte").read_bytes())
    # Overwrite a stretch of the weights (delegate data sits in the second half).
    start = len(data) // 2
    data[start : start + 4096] = bytes(range(256)) * 16
    broken.write_bytes(bytes(data))
    model = load_model(tiny_model, False)
    reference = build_reference(model, tiny_model / "tokenizer.json", 64)
    result = verify(broken, expected_logits(model, reference), reference, tiny_model / "tokenizer.json", "fp32")
    assert not result.passed
    assert result.failure and ("KL" in result.failure or "runtime" in result.failure or "exceeds" in result.failure)


def test_verification_tells_a_bug_in_hub_export_from_a_broken_file(exported_multi, tiny_model, tmp_path, monkeypatch):
    import hub_export.pipeline.verify as verify_module
    from hub_export.errors import InternalError, VerificationError
    from hub_export.pipeline.build import load_model
    from hub_export.pipeline.verify import build_reference, expected_logits, verify

    monkeypatch.setenv("HUB_EXPORT_LOG_DIR", str(tmp_path / "logs"))
    model = load_model(tiny_model, False)
    reference = build_reference(model, tiny_model / "tokenizer.json", 64)
    expected = expected_logits(model, reference)
    pte = exported_multi / "model-fp32-emb8w.pte"

    def file_fails(*args, **kwargs):
        raise VerificationError("model-fp32-emb8w.pte failed in the ExecuTorch runtime (Error 0x12)")

    # The file's failure: a failed verification, recorded, no log.
    monkeypatch.setattr(verify_module, "_pte_rows", file_fails)
    result = verify(pte, expected, reference, tiny_model / "tokenizer.json", "fp32")
    assert not result.passed and result.failure == (
        "runtime error: model-fp32-emb8w.pte failed in the ExecuTorch runtime (Error 0x12)"
    )
    assert not (tmp_path / "logs").exists()

    def hub_export_bug(*args, **kwargs):
        return {}["a key hub-export forgot"]

    # Our bug: raised as one, with the traceback in the file the message names.
    monkeypatch.setattr(verify_module, "_pte_rows", hub_export_bug)
    with pytest.raises(InternalError) as caught:
        verify(pte, expected, reference, tiny_model / "tokenizer.json", "fp32")
    message = str(caught.value)
    assert "bug in hub-export" in message and "KeyError" in message and "verifying model-fp32-emb8w.pte" in message
    (log,) = (tmp_path / "logs").iterdir()
    assert log.name in message and caught.value.log_file == str(log)
    assert "hub_export_bug" in log.read_text() and "Traceback" in log.read_text()


def test_failed_verification_fails_the_command_and_leaves_nothing(tiny_model, tmp_path, capsys, monkeypatch):
    import hub_export.pipeline.build as build_module  # the build stage verifies through this name

    real_verify = build_module.verify

    def verify_corrupted(path, *args, **kwargs):  # the file is damaged after lowering (a worker wrote it)
        data = bytearray(path.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 4096] = b"\xff" * 4096
        path.write_bytes(bytes(data))
        return real_verify(path, *args, **kwargs)

    monkeypatch.setattr(build_module, "verify", verify_corrupted)
    out = tmp_path / "out"
    code, _, err = run_cli(["export", str(tiny_model), "-o", str(out), "-q", "fp32", "--max-seq-len", "32"], capsys)
    assert code == 4
    line = error_line(err)
    assert "model-fp32.pte failed verification: " in line
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


# --- bad input: one line, an exit code, nothing written -----------------------------------


def _variant_of(model: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "src"
    shutil.copytree(model, copy)
    edit(copy)
    return copy


def _edit_config(**changes):
    def edit(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


BAD_INPUTS = {
    "no such folder or repo": (lambda m, t: "./does/not/exist", [], 2, "neither an existing folder nor a Hub repo id"),
    "no config": (lambda m, t: _variant_of(m, t, lambda f: (f / "config.json").unlink()), [], 3, "has no config.json"),
    "not a causal LM": (
        lambda m, t: _variant_of(m, t, _edit_config(model_type="bert")),
        [],
        2,
        "not a supported decoder-only causal LM; supported: ",
    ),
    "remote code": (
        lambda m, t: _variant_of(m, t, _edit_config(auto_map={"AutoModelForCausalLM": "x.Y"})),
        [],
        2,
        "pass --trust-remote-code",
    ),
    "missing tokenizer": (
        lambda m, t: _variant_of(m, t, lambda f: (f / "tokenizer.json").unlink()),
        [],
        3,
        "has no tokenizer.json",
    ),
    "pickle weights": (
        lambda m, t: _variant_of(m, t, lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin")),
        [],
        2,
        "pass --allow-pickle",
    ),
    "max seq len above limit": (lambda m, t: m, ["--max-seq-len", "100000"], 2, "above the model's limit of 512"),
    "unknown qmode": (lambda m, t: m, ["-q", "int3"], 2, "unknown --qmode 'int3'"),
    "bad group size": (lambda m, t: m, ["--group-size", "48"], 2, "--group-size must be a positive multiple of 32"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(case, tiny_model, tmp_path, capsys):
    make_source, extra, exit_code, message = BAD_INPUTS[case]
    source = make_source(tiny_model, tmp_path)
    out = tmp_path / "out"
    code, stdout, err = run_cli(["export", str(source), "-o", str(out), *extra], capsys)
    assert code == exit_code, err
    assert message in error_line(err) and "Traceback" not in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_non_empty_output_folder_is_refused(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(["export", str(tiny_model), "-o", str(out), "-q", "fp32"], capsys)
    assert code == 2 and "not empty" in error_line(err)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


# --- Hub sources, through the local Hub ---------------------------------------------------


@pytest.fixture(scope="session")
def hub_model(local_hub, tiny_model):
    """The tiny model uploaded to alice's private repo on the local Hub."""
    api = local_hub.api(local_hub.alice_token)
    repo_id = "alice/tiny-source"
    api.create_repo(repo_id, private=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(tiny_model))
    return repo_id, commit.oid


def test_export_from_the_hub_records_repo_and_commit(local_hub, hub_model, tmp_path):
    from hub_export.pipeline.export import export

    repo_id, commit = hub_model
    manifest = export(
        repo_id,
        tmp_path / "out",
        qmodes=["fp32"],
        max_seq_len=32,
        endpoint=local_hub.endpoint,
        token=local_hub.alice_token,
        cache_dir=tmp_path / "cache",
    )
    assert manifest.source["id"] == repo_id and manifest.source["revision"] == commit
    assert manifest.variants[0].verification.passed
    text = (tmp_path / "out" / "manifest.json").read_text()
    assert local_hub.alice_token not in text and str(tmp_path) not in text


HUB_ERRORS = {
    "repo not found": ("alice/nope", "alice", 3, "not found on"),
    "private repo, other user": (
        "alice/tiny-source",
        "bob",
        3,
        "for a private repo use a token that can read it (--token",
    ),
    "private repo, anonymous": ("alice/tiny-source", None, 3, "not found on"),
    "revision not found": ("alice/tiny-source", "alice", 3, "revision 'v9' not found"),
    "gated repo, no access": (
        "alice/tiny-gated",
        "bob",
        3,
        "alice/tiny-gated is gated; accept its conditions on the Hub",
    ),
}


@pytest.fixture(scope="session")
def gated_hub_model(local_hub, tiny_model):
    """The tiny model in alice's public repo behind a gate that bob has not passed."""
    api = local_hub.api(local_hub.alice_token)
    api.create_repo("alice/tiny-gated")
    api.upload_folder(repo_id="alice/tiny-gated", folder_path=str(tiny_model))
    api.update_repo_settings("alice/tiny-gated", gated="manual")
    return "alice/tiny-gated"


@pytest.mark.parametrize("case", list(HUB_ERRORS))
def test_hub_errors_are_clear(case, local_hub, hub_model, gated_hub_model, tmp_path, capsys):
    repo_id, user, exit_code, message = HUB_ERRORS[case]
    args = ["export", repo_id, "-o", str(tmp_path / "out"), "--endpoint", local_hub.endpoint]
    token = {"alice": local_hub.alice_token, "bob": local_hub.bob_token}.get(user)
    if token:
        args += ["--token", token]
    if case == "revision not found":
        args += ["--revision", "v9"]
    code, out, err = run_cli(args, capsys)
    assert code == exit_code, err
    assert message in error_line(err)
    for secret in (local_hub.alice_token, local_hub.bob_token):
        assert secret not in err and secret not in out
    assert not (tmp_path / "out").exists()


def test_unreachable_endpoint(tmp_path, capsys):
    code, _, err = run_cli(
        ["export", "org/model", "-o", str(tmp_path / "out"), "--endpoint", "http://127.0.0.1:9"], capsys
    )
    assert code == 3 and "cannot reach" in error_line(err)


def test_inspect_shows_the_kv_cache_and_the_manifest_keeps_the_delegation(exported_multi, capsys) -> None:
    from helpers import run_cli

    from hub_export.pipeline.manifest import Manifest
    from hub_export.runtime.inspection import delegation_line

    code, out, _ = run_cli(["inspect", str(exported_multi), "--variant", "8da4w"], capsys)
    assert code == 0 and "KV cache:" in out and "context 64 tokens" in out and "recorded at export: forward" in out
    record = Manifest.read(exported_multi).variant("8da4w").delegation
    assert record["forward"]["partitions"] >= 1 and "llama::update_cache" in record["forward"]["outside"]
    assert delegation_line(record).startswith("forward: ")
