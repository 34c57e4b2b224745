"""The model card: front matter a Hub user expects, inherited license/language, no local paths.

These tests render cards from hand-built manifests (no export needed), and parse them
back with ``huggingface_hub.ModelCard``, the way the Hub reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from typer.testing import CliRunner

from hub_export.cli import app
from hub_export.errors import InputError
from hub_export.hub.card import render_card, write_card
from hub_export.hub.source_card import read_source_card
from hub_export.pipeline.manifest import Manifest, Variant, sha256_file
from hub_export.pipeline.records import Verification

ENDPOINT = "https://hub.example"
SOURCE_CARD = """---
license: other
license_name: 'tiny-license: "v1"'
license_link: https://example.com/LICENSE
language:
- en
- fr
tags:
- not-inherited
datasets:
- some/dataset
---
# Tiny Llama

The source model's own card.
"""
# A path-like string anywhere in a card would leak the exporting machine's layout.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:tmp|home|root|Users|work|var|private|mnt|opt)/")


def _variant(qmode: str, *, verified: bool = True, qembedding: str | None = None) -> Variant:
    verification = (
        {
            "passed": True,
            "positions": 530,
            "mean_kl_vs_eager": 0.0238,
            "max_kl": 0.1,
            "min_top1": 0.8,
            "max_abs_diff": 0.00406,
            "top1_agreement": 1.0,
            "quality": {
                "text": "eval_en.txt",
                "tokens": 2048,
                "perplexity": 33.68,
                "fp32_perplexity": 22.39,
                "ratio": 1.504,
                "top1": 0.604,
                "kl": 0.4685,
            },
            "quant_max_abs_diff_vs_fp32": 0.0627,
            "quant_top1_vs_fp32": 0.889,
            "runner_generated_tokens": 15,
            "runner_prefill_tokens_per_s": 2800.0,
            "runner_decode_tokens_per_s": 1500.0,
            "runner_threads": 2,
            "second_quality": {
                "text": "eval_docs_en.txt",
                "tokens": 1024,
                "perplexity": 40.1,
                "fp32_perplexity": 27.0,
                "ratio": 1.485,
                "top1": 0.6,
                "kl": 0.5,
            },
            "failure": None,
        }
        if verified
        else {"skipped": True}
    )
    return Variant(
        file=f"model-{qmode}" + (f"-emb{qembedding}" if qembedding else "") + ".pte",
        qmode=qmode,
        qembedding=qembedding,
        group_size=32 if qmode == "8da4w" else None,
        max_seq_len=64,
        size_bytes=235776,
        sha256="0" * 64,
        metadata={"get_max_seq_len": 64, "get_eos_ids": [0]},
        verification=Verification.from_dict(verification),
        export_seconds=24.3,
    )


def _manifest(*, local: bool = False, variants: list[Variant] | None = None) -> Manifest:
    return Manifest(
        source={
            "id": "tiny-llama" if local else "acme/Tiny-Llama",
            "revision": None if local else "a" * 40,
            "local": local,
            "model_type": "llama",
            "architecture": "LlamaForCausalLM",
            "num_parameters": 106816,
        },
        versions={
            "torch": "2.13.0",
            "executorch": "1.5.1",
            "torchao": "0.18.0",
            "transformers": "5.24.0",
            "hub-export": "0.1.0",
        },
        variants=variants or [_variant("8da4w", qembedding="8w"), _variant("fp32")],
        command="hub-export export acme/Tiny-Llama --qmode 8da4w --qembedding 8w --qmode fp32 --max-seq-len 64",
        machine="Test CPU, 2 cores, Linux x86_64",
    )


def _data(card: str) -> dict:
    return ModelCard(card).data.to_dict()


def test_front_matter_key_by_key(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(SOURCE_CARD)
    card = render_card(
        _manifest(), read_source_card(tmp_path), endpoint=ENDPOINT, repo_id="alice/Tiny-Llama-ExecuTorch"
    )

    assert card.startswith("---\n")
    data = _data(card)
    assert data["base_model"] == "acme/Tiny-Llama"
    assert data["base_model_relation"] == "quantized"
    assert data["library_name"] == "executorch"
    assert data["pipeline_tag"] == "text-generation"
    assert data["license"] == "other"
    assert data["license_name"] == 'tiny-license: "v1"'  # quotes and a colon survive: safe_dump, not concatenation
    assert data["license_link"] == "https://example.com/LICENSE"
    assert data["language"] == ["en", "fr"]
    assert data["tags"] == ["executorch", "xnnpack", "8da4w", "fp32", "llama", "hub-export"]
    # Only what a quantized copy should carry over: not the source's tags or datasets.
    assert set(data) == {
        "base_model",
        "base_model_relation",
        "library_name",
        "pipeline_tag",
        "license",
        "license_name",
        "license_link",
        "language",
        "tags",
    }


def test_body_has_variants_usage_reproduction_and_limitations() -> None:
    card = render_card(_manifest(), {"license": "apache-2.0"}, endpoint=ENDPOINT, repo_id="alice/Tiny-Llama-ExecuTorch")
    body = ModelCard(card).text

    row = next(line for line in body.splitlines() if line.startswith("| `model-8da4w-emb8w.pte`"))
    for figure in (
        "8da4w (group 32)",
        "8w",
        "235.8 KB",
        "64 tokens",
        "33.7 (1.50x fp32); technical text 40.1 (1.49x fp32)",
        "60%",
        "0.024 / 100%",
        "2800 / 1500 (2 threads)",
    ):
        assert figure in row
    assert "| `model-fp32.pte` | fp32 | none |" in body
    assert "Test CPU, 2 cores, Linux x86_64" in body  # the machine the tokens/s were measured on
    assert "hub-export generate alice/Tiny-Llama-ExecuTorch --variant 8da4w" in body
    assert 'hf_hub_download("alice/Tiny-Llama-ExecuTorch", "model-8da4w-emb8w.pte")' in body
    assert "llama_main" in body and "--model_path=model-8da4w-emb8w.pte" in body
    assert "Android" in body and "iOS" in body
    assert "hub-export export acme/Tiny-Llama --qmode 8da4w --qembedding 8w --qmode fp32 --max-seq-len 64" in body
    assert "| executorch | 1.5.1 |" in body
    assert "Static KV cache" in body and "64 tokens" in body
    assert "Quantization error" in body
    assert f"({ENDPOINT}/acme/Tiny-Llama)" in body  # link to the source model's card
    assert "Every file was checked" in body


def test_local_source_has_no_base_model_and_no_absolute_path(tmp_path: Path) -> None:
    folder = tmp_path / "exports" / "tiny-llama"
    folder.mkdir(parents=True)
    _manifest(local=True).write(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    source = tmp_path / "tiny-llama"
    source.mkdir()
    (source / "README.md").write_text("---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# Tiny\n")

    path = write_card(folder, read_source_card(source), endpoint=ENDPOINT)

    card = path.read_text()
    data = _data(card)
    assert "base_model" not in data and "base_model_relation" not in data
    assert data["license"] == "apache-2.0" and data["language"] == ["en"]
    assert str(tmp_path) not in card
    assert ABSOLUTE_PATH.search(card) is None
    assert "uses full attention" in card  # from config.json: no sliding window


def test_sliding_window_and_unverified_variants_are_stated() -> None:
    manifest = _manifest(variants=[_variant("8da4w", verified=False)])
    card = render_card(manifest, config={"model_type": "mistral", "sliding_window": 4096})
    assert "window 4096 tokens" in card and "matches transformers token for token" in card
    assert "not verified" in card
    assert "Every file was checked" not in card


def test_card_cli_keeps_inherited_license_and_takes_a_template(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    _manifest().write(folder)
    (tmp_path / "SOURCE.md").write_text(SOURCE_CARD)
    runner = CliRunner()

    first = runner.invoke(app, ["card", str(folder), "--source-card", str(tmp_path / "SOURCE.md")])
    assert first.exit_code == 0, first.output
    # Re-rendering later, without the source card, keeps what the manifest remembered.
    (folder / "README.md").unlink()
    second = runner.invoke(app, ["card", str(folder)])
    assert second.exit_code == 0, second.output
    data = _data((folder / "README.md").read_text())
    assert data["license"] == "other" and data["language"] == ["en", "fr"]
    assert Manifest.read(folder).source["card_data"]["license"] == "other"

    template = tmp_path / "short.md.j2"
    template.write_text("# {{ source_id }}\n{% for v in variants %}- {{ v.file }}: {{ v.size }}\n{% endfor %}")
    third = runner.invoke(app, ["card", str(folder), "--template", str(template)])
    assert third.exit_code == 0, third.output
    card = (folder / "README.md").read_text()
    assert card.endswith("# acme/Tiny-Llama\n- model-8da4w-emb8w.pte: 235.8 KB\n- model-fp32.pte: 235.8 KB\n")
    assert _data(card)["library_name"] == "executorch"  # the front matter does not depend on the template


def test_bad_template_is_a_one_line_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        render_card(_manifest(), template=tmp_path / "missing.md.j2")
    broken = tmp_path / "broken.md.j2"
    broken.write_text("{{ no_such_value }}")
    with pytest.raises(InputError, match="failed to render"):
        render_card(_manifest(), template=broken)


# -- what the exporter declares about a local or GGUF source (--base-model, --license, --model-name) --------


def _local_manifest(**declared: str) -> Manifest:
    """An export of a local folder named ``smol-real-nopad``, with what its exporter declared."""
    manifest = _manifest(local=True)
    manifest.source = {**manifest.source, "id": "smol-real-nopad", "chat_template": True, **declared}
    manifest.command = "hub-export export smol-real-nopad --qmode 8da4w --max-seq-len 64"
    return manifest


def _reproduce_block(card: str) -> str:
    return re.search(r"## How to reproduce\n(.*?)### Versions", card, re.S).group(1)


def test_declared_base_model_names_links_and_licenses_a_local_export() -> None:
    manifest = _local_manifest(
        base_model="acme/Tiny-Llama-Instruct", license="apache-2.0", model_name="Tiny Llama Chat"
    )
    card = render_card(manifest, {"license": "mit", "language": ["en"]}, endpoint=ENDPOINT, repo_id="alice/tiny-et")

    data = _data(card)
    assert data["base_model"] == "acme/Tiny-Llama-Instruct" and data["base_model_relation"] == "quantized"
    assert data["license"] == "apache-2.0"  # --license over the inherited one
    assert data["language"] == ["en"]  # the rest is still inherited
    body = ModelCard(card).text
    assert body.startswith("# Tiny Llama Chat for ExecuTorch\n")
    assert f"[acme/Tiny-Llama-Instruct]({ENDPOINT}/acme/Tiny-Llama-Instruct)" in body
    assert "see that model's own documentation" not in body
    reproduce = _reproduce_block(body)
    # No folder nobody has: a placeholder, said to be one, and the declarations passed again.
    assert "replace `path/to/smol-real-nopad` with your copy" in reproduce
    assert (
        "hub-export export path/to/smol-real-nopad --base-model acme/Tiny-Llama-Instruct --license apache-2.0 "
        "--model-name 'Tiny Llama Chat' --qmode 8da4w --max-seq-len 64"
    ) in reproduce
    assert "hf download acme/Tiny-Llama-Instruct --local-dir path/to/smol-real-nopad" in reproduce
    assert re.search(r"^hub-export export smol-real-nopad", body, re.M) is None
    # A chat model's snippets use its template (and the line after it is not glued on).
    assert 'hub-export generate alice/tiny-et --variant 8da4w --prompt "What is the capital of France?"\n' in body
    assert "apply_chat_template" in body


def test_local_source_without_base_model_says_so_plainly() -> None:
    card = render_card(_local_manifest(), endpoint=ENDPOINT)

    data = _data(card)
    assert "base_model" not in data and "license" not in data
    body = ModelCard(card).text
    assert body.startswith("# smol-real-nopad for ExecuTorch\n")
    assert "a local checkpoint that is not on the Hub" in body
    assert "Which model it is was not declared" in body and "--base-model ORG/NAME" in body
    assert "License: not stated" in body
    reproduce = _reproduce_block(body)
    assert "hub-export export path/to/smol-real-nopad --qmode 8da4w" in reproduce
    assert "hf download" not in reproduce  # nothing to download: the model is unknown


def test_local_gguf_source_names_its_file() -> None:
    manifest = _local_manifest()
    manifest.source = {**manifest.source, "id": "SmolLM2-135M-Instruct",
                       "gguf": {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quantization": "Q4_1"}}  # fmt: skip
    manifest.command = "hub-export export models --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --qmode 8da4w"
    body = ModelCard(render_card(manifest, endpoint=ENDPOINT)).text
    assert "a local checkpoint (the GGUF file `SmolLM2-135M-Instruct.Q4_1.gguf`), not on the Hub" in body
    assert "hub-export export path/to/models --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --qmode 8da4w" in body

    manifest.source = {**manifest.source, "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    body = ModelCard(render_card(manifest, endpoint=ENDPOINT)).text
    assert body.startswith("# HuggingFaceTB/SmolLM2-135M-Instruct for ExecuTorch\n")  # named after its base
    assert "hf download" not in _reproduce_block(body)  # the base's safetensors are not the GGUF file


def test_a_declared_license_drops_the_inherited_license_name_and_link(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(SOURCE_CARD)  # license: other, with its name and link
    data = _data(render_card(_local_manifest(license="mit"), read_source_card(tmp_path)))
    assert data["license"] == "mit" and "license_name" not in data and "license_link" not in data
    assert data["language"] == ["en", "fr"]


def test_declarations_are_checked_before_anything_runs() -> None:
    from hub_export.hub.source_card import declared_source
    from hub_export.options import ExportOptions
    from hub_export.pipeline.export import _declared_source, export

    assert declared_source("acme/Base", " Apache-2.0 ", "  Tiny   Chat ") == {
        "base_model": "acme/Base", "license": "apache-2.0", "model_name": "Tiny Chat",
    }  # fmt: skip
    assert declared_source() == {}  # nothing given: the manifest records what it always did
    for bad in ("Base", "acme/bad--name", "a/b/c", "/tmp/model"):
        with pytest.raises(InputError, match="--base-model .* ORG/NAME"):
            declared_source(base_model=bad)
    with pytest.raises(InputError, match="--license .* apache-2.0"):
        declared_source(license="Apache License 2.0")
    with pytest.raises(InputError, match="--model-name"):
        declared_source(model_name="   ")
    # A Hub repo of safetensors is its own base model; refused before anything is downloaded.
    with pytest.raises(InputError, match="drop --base-model"):
        export("acme/Tiny-Llama", "unused-out", base_model="acme/Other")
    cli = CliRunner().invoke(app, ["export", "acme/Tiny-Llama", "-o", "unused-out", "--base-model", "acme/Other"])
    assert isinstance(cli.exception, InputError) and "drop --base-model" in str(cli.exception)
    cli = CliRunner().invoke(app, ["export", ".", "-o", "unused-out", "--license", "Apache License"])
    assert isinstance(cli.exception, InputError) and "--license" in str(cli.exception)
    gguf = ExportOptions(gguf_file="tiny.Q4_0.gguf", base_model="acme/Tiny")
    assert _declared_source("acme/Tiny-GGUF", gguf) == {"base_model": "acme/Tiny"}


def test_manifest_schema_takes_declarations_as_text_only() -> None:
    from hub_export.pipeline.manifest import check_manifest

    data = _local_manifest(base_model="acme/Base", license="mit", model_name="Tiny").to_dict()
    check_manifest(data)
    data["source"]["base_model"] = ["acme/Base"]
    with pytest.raises(InputError, match="base_model"):
        check_manifest(data)


def _fake_export(folder: Path) -> Path:
    """An export folder that push accepts (verified variant, hashes, tokenizer) without exporting anything."""
    folder.mkdir(parents=True)
    (folder / "model-8da4w.pte").write_bytes(b"not a real program")
    (folder / "tokenizer.json").write_text("{}")
    manifest = _local_manifest()
    manifest.variants = [_variant("8da4w")]
    manifest.variants[0].size_bytes = len(b"not a real program")
    manifest.variants[0].sha256 = sha256_file(folder / "model-8da4w.pte")
    manifest.write(folder)
    return folder


def test_push_from_a_local_export_with_base_model_inherits_its_card(local_hub, tmp_path: Path) -> None:
    from hub_export.hub.push import push

    api = local_hub.api(local_hub.alice_token)
    api.create_repo("acme/Base-Llama")
    base_card = b"---\nlicense: mit\nlanguage:\n- en\n- de\n---\n# Base Llama\n"
    api.upload_file(path_or_fileobj=base_card, path_in_repo="README.md", repo_id="acme/Base-Llama")
    folder = _fake_export(tmp_path / "out")

    pushed = CliRunner().invoke(app, [
        "push", "--from", str(folder), "alice/base-llama-et", "--base-model", "acme/Base-Llama",
        "--token", local_hub.alice_token, "--endpoint", local_hub.endpoint,
    ])  # fmt: skip
    assert pushed.exit_code == 0, pushed.output

    card = ModelCard.load("alice/base-llama-et")
    data = card.data.to_dict()
    assert data["base_model"] == "acme/Base-Llama" and data["base_model_relation"] == "quantized"
    assert data["license"] == "mit" and data["language"] == ["en", "de"]  # from the base model's card on the Hub
    assert card.text.startswith("# acme/Base-Llama for ExecuTorch\n")
    assert "hub-export export path/to/smol-real-nopad --base-model acme/Base-Llama" in card.text

    # A base model the Hub does not have: the push goes on, and the card says what it does not know.
    other = push(from_dir=_fake_export(tmp_path / "other"), repo_id="alice/missing-base-et",
                 base_model="acme/Not-There", token=local_hub.alice_token, endpoint=local_hub.endpoint)  # fmt: skip
    card = ModelCard.load(other.repo_id)
    assert card.data.to_dict()["base_model"] == "acme/Not-There" and "license" not in card.data.to_dict()
    assert "License: not stated" in card.text


def test_the_machine_names_its_vector_isa_because_it_picks_the_kernels():
    """Speed figures from an AVX-512 VNNI core and an AVX2 one differ about 3x: the card says which."""
    from hub_export.pipeline.manifest import machine_description

    zen4 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
    zen2 = "model name\t: AMD EPYC 7R32\nflags\t\t: fpu sse avx2 fma\n"
    assert machine_description(zen4).startswith("AMD EPYC 9R14 (AVX-512 VNNI), ")
    assert machine_description(zen2).startswith("AMD EPYC 7R32 (AVX2), ")
    assert "(" not in machine_description("model name : Plain CPU\nflags : fpu sse\n")


def test_the_vlm_snippets_text_from_a_chat_template_cannot_leave_its_code_block():
    """The text around the image comes from the source repo's chat template: hostile."""
    import ast

    from hub_export.hub.card import _python_string

    hostile = 'User:```\n</code><script>alert(1)</script>"; import os; os.system("x") #'
    literal = _python_string(hostile)
    assert "`" not in literal and "\n" not in literal
    assert ast.literal_eval(literal) == hostile  # still the same text once Python reads it
    assert _python_string(None) == '""' and len(_python_string("x" * 10_000)) < 500
