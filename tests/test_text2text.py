"""Text-to-text (T5-class): the file's two methods compute what transformers' T5 computes, answers as the eager
model does, and verification tells a wrong file from an honest one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_t5(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_t5

    return build_tiny_t5(tmp_path_factory.mktemp("t5") / "tiny-t5")


@pytest.fixture(scope="session")
def exported_t5(tmp_path_factory, tiny_t5) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-t5"
    export(str(tiny_t5), out, qmodes=["fp32", "8da8w"], jobs=1)
    return out


@pytest.mark.parametrize("gated", [False, True], ids=["t5", "flan-t5"])
def test_the_cached_decoder_matches_transformers_t5(gated, tmp_path) -> None:
    from transformers import T5ForConditionalGeneration

    from hub_export.models.tiny import build_tiny_t5
    from hub_export.tasks.text_to_text.export import wrap

    source = build_tiny_t5(tmp_path / "t5", gated=gated)
    model = T5ForConditionalGeneration.from_pretrained(source).eval()
    wrapped = wrap(model, source, 32).eval()
    input_ids = torch.tensor([[5, 17, 42, 99, 7, 1]])
    decoder_ids = torch.tensor([[0, 12, 30, 44, 8]])
    with torch.no_grad():
        expected = model(input_ids=input_ids, decoder_input_ids=decoder_ids).logits
        cross = wrapped.encoder(input_ids)
        prefill = wrapped.text_decoder(decoder_ids[:, :3], cross, torch.arange(3))
        steps = [wrapped.text_decoder(decoder_ids[:, i : i + 1], cross, torch.tensor([i])) for i in (3, 4)]
    actual = torch.cat([prefill, *steps], dim=1)
    assert torch.allclose(actual, expected, atol=1e-4), (actual - expected).abs().max()


def test_t5_files_are_verified_and_answer_as_eager(exported_t5, tiny_t5) -> None:
    from tokenizers import Tokenizer
    from transformers import T5ForConditionalGeneration

    from hub_export.pipeline.manifest import Manifest
    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.text_to_text.run import generate_text

    manifest = Manifest.read(exported_t5)
    assert manifest.source["task"] == "text2text-generation" and manifest.source["methods"] == [
        "encoder",
        "text_decoder",
    ]
    assert set(PteModel(exported_t5 / "model-8da8w.pte").methods) == {"encoder", "text_decoder"}
    for variant in manifest.variants:
        assert variant.verification.verified and variant.verification.figures["prompts"] == 16
    assert manifest.variant("fp32").verification.figures["same_answer_as_fp32"] == 1.0

    prompt = "summarize: the river runs through the old town"
    answer = generate_text(exported_t5 / "model-fp32.pte", exported_t5, prompt, max_new_tokens=12)
    tokenizer = Tokenizer.from_file(str(tiny_t5 / "tokenizer.json"))
    model = T5ForConditionalGeneration.from_pretrained(tiny_t5).eval()
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        eager = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False, num_beams=1)[0].tolist()
    assert answer == tokenizer.decode(eager, skip_special_tokens=True).strip()


def test_verification_fails_a_file_of_another_t5(exported_t5, tiny_t5, tmp_path) -> None:
    import shutil

    from transformers import T5Config, T5ForConditionalGeneration

    from hub_export.pipeline.quantize import QMODES
    from hub_export.tasks.text_to_text.export import expected, reference, verify_variant, wrap

    other = tmp_path / "other"  # the same shape and tokenizer, other weights
    torch.manual_seed(1)
    T5ForConditionalGeneration(T5Config.from_pretrained(tiny_t5)).save_pretrained(other)
    shutil.copy(tiny_t5 / "tokenizer.json", other / "tokenizer.json")
    model = T5ForConditionalGeneration.from_pretrained(other).eval()
    ref = reference(model, other, 128)
    result = verify_variant(exported_t5 / "model-fp32.pte", expected(wrap(model, other, 128), ref), ref,
                            QMODES["fp32"], None)  # fmt: skip
    assert not result.passed and result.failure.startswith("mean KL from eager"), result.failure


def test_the_text2text_card_and_preview(exported_t5, local_hub, tmp_path) -> None:
    from huggingface_hub import ModelCard

    from hub_export import push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-t5"
    push(from_dir=str(exported_t5), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)
    card = ModelCard.load(repo_id, token=local_hub.alice_token)
    assert card.data.pipeline_tag == "text2text-generation" and "Same answer as fp32" in card.text
    shown: list = []
    request = PreviewRequest(repo_id, "8da8w", "summarize: the river runs through the old town", 8, None)
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path, shown.append)
    assert "".join(value for kind, value in shown if kind == "text") == result


def test_generate_answers_with_a_t5_file(exported_t5, capsys) -> None:
    from helpers import run_cli

    from hub_export.tasks.text_to_text.run import generate_text

    prompt = "summarize: the old town sits by the river"
    code, out, err = run_cli(["generate", str(exported_t5), "--variant", "8da8w", "--prompt", prompt,
                              "--max-new-tokens", "10"], capsys)  # fmt: skip
    assert code == 0 and "greedy answer in" in err
    assert out.strip() == generate_text(exported_t5 / "model-8da8w.pte", exported_t5, prompt, max_new_tokens=10)
