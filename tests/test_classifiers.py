"""Fill-mask and image classification: the file answers as the eager model does, verification tells a broken
file from an honest one, and the CLI, the card, the Hub round trip and the Space preview say what a user checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import error_line, run_cli

from hub_export.errors import InputError, SourceError


@pytest.fixture(scope="session")
def tiny_mlm(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_masked_lm

    return build_tiny_masked_lm(tmp_path_factory.mktemp("mlm") / "tiny-bert-mlm")


@pytest.fixture(scope="session")
def exported_mlm(tmp_path_factory, tiny_mlm) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-mlm"
    export(str(tiny_mlm), out, qmodes=["fp32", "8da8w"], jobs=1)
    return out


# --- fill-mask ----------------------------------------------------------------------------------


def test_fill_mask_files_are_verified_with_their_figures(exported_mlm) -> None:
    from hub_export.pipeline.manifest import Manifest

    manifest = Manifest.read(exported_mlm)
    assert manifest.source["task"] == "fill-mask" and manifest.source["mask_token"] == "[MASK]"
    for variant in manifest.variants:
        figures = variant.verification.figures
        assert variant.verification.verified and figures["inputs"] >= 60
        assert variant.metadata["get_mask_token_id"] == 4 and variant.metadata["get_max_seq_len"] == 512
    fp32 = manifest.variant("fp32").verification.figures
    assert fp32["top1_vs_fp32"] == 1.0 and fp32["mean_kl_vs_eager"] < 1e-5 and fp32["accuracy"] == fp32["fp32_accuracy"]


def test_fill_mask_gives_the_eager_models_words(exported_mlm, tiny_mlm) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForMaskedLM

    from hub_export import fill_mask

    text = "The river that runs through the old [MASK] was once the reason anyone settled here."
    result = fill_mask(exported_mlm / "model-fp32.pte", exported_mlm, text, top_k=3)
    tokenizer = Tokenizer.from_file(str(tiny_mlm / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode(text).ids])
    with torch.no_grad():
        logits = AutoModelForMaskedLM.from_pretrained(tiny_mlm).eval()(input_ids=ids).logits
    at = ids[0].tolist().index(tokenizer.token_to_id("[MASK]"))
    expected = [tokenizer.id_to_token(int(i)) for i in logits[0, at].topk(3).indices]
    assert len(result.masks) == 1 and [guess.token for guess in result.masks[0]] == expected
    assert result.masks[0][0].probability >= result.masks[0][1].probability > 0


def test_fill_mask_refuses_a_text_without_a_mask(exported_mlm) -> None:
    from hub_export import fill_mask

    with pytest.raises(InputError, match=r"the text has no mask token: write \[MASK\] where a word is missing"):
        fill_mask(exported_mlm / "model-8da8w.pte", exported_mlm, "Nothing is missing here.")


def test_the_label_judge_fails_scores_that_are_not_eagers(exported_mlm, tiny_mlm) -> None:
    """A file whose answers belong to other inputs (a mix-up of rows, what a wrong mask position would give) fails."""
    from transformers import AutoModelForMaskedLM

    from hub_export.pipeline.quantize import QMODES
    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.encoders import build_reference, pte_outputs
    from hub_export.tasks.fill_mask.export import judge
    from hub_export.tasks.registry import FILL_MASK

    reference = build_reference(FILL_MASK, AutoModelForMaskedLM.from_pretrained(tiny_mlm).eval(), tiny_mlm, 512)
    actual = pte_outputs(PteModel(exported_mlm / "model-fp32.pte"), reference)
    assert judge(actual, reference.outputs, reference, QMODES["fp32"], None).passed
    shifted = judge(actual.roll(1, 0), reference.outputs, reference, QMODES["fp32"], None)
    assert not shifted.passed and shifted.failure.startswith("mean KL from eager"), shifted.failure


def test_fill_mask_cli_and_card(exported_mlm, capsys) -> None:
    from huggingface_hub import ModelCard

    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    code, out, _ = run_cli(
        ["fill-mask", str(exported_mlm), "The old [MASK] stood by the river.", "--top-k", "3"], capsys
    )
    assert code == 0 and "word" in out and len([line for line in out.splitlines() if "│" in line]) == 3
    code, _, err = run_cli(["fill-mask", str(exported_mlm), "No mask here."], capsys)
    assert code == 2 and "the text has no mask token" in error_line(err)
    card = ModelCard(render_card(Manifest.read(exported_mlm), repo_id="alice/tiny-mlm"))
    assert card.data.pipeline_tag == "fill-mask"
    row = next(line for line in card.text.splitlines() if line.startswith("| `model-8da8w.pte`"))
    assert row.count("|") == 8 and "%" in row and "not verified" not in row
    assert 'hub-export fill-mask alice/tiny-mlm "The capital of France is [MASK]."' in card.text
    assert "TextLLMRunner" not in card.text and "perplexity" not in card.text


# --- image classification ---------------------------------------------------------------------


def test_image_classifier_files_are_verified_on_drawn_images(exported_vit) -> None:
    from hub_export.pipeline.manifest import Manifest

    manifest = Manifest.read(exported_vit)
    assert manifest.source["task"] == "image-classification" and manifest.source["image_size"] == [32, 32]
    assert (exported_vit / "preprocessor_config.json").is_file()
    for variant in manifest.variants:
        assert variant.verification.verified and variant.verification.figures["inputs"] == 32
        assert variant.metadata == {"get_image_height": 32, "get_image_width": 32, "get_num_labels": 10}
    assert manifest.variant("fp32").verification.figures["top1_vs_fp32"] == 1.0


def test_classify_gives_the_eager_models_labels(exported_vit, tiny_vit, picture) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hub_export import classify

    result = classify(exported_vit / "model-fp32.pte", exported_vit, picture, top_k=3)
    model = AutoModelForImageClassification.from_pretrained(tiny_vit).eval()
    pixels = AutoImageProcessor.from_pretrained(tiny_vit)(
        images=Image.open(picture).convert("RGB"), return_tensors="pt"
    )
    with torch.no_grad():
        probabilities = torch.softmax(model(**pixels).logits[0], -1)
    top = probabilities.topk(3)
    assert [label.label for label in result.labels] == [model.config.id2label[int(i)] for i in top.indices]
    assert result.labels[0].probability == pytest.approx(float(top.values[0]), abs=1e-4)


def test_classify_refuses_what_is_not_an_image(exported_vit, tmp_path) -> None:
    from hub_export import classify

    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(InputError, match="notes.png is not an image this reads; give a PNG, JPEG"):
        classify(exported_vit / "model-8da8w.pte", exported_vit, text)


def test_an_image_classifier_without_its_processor_or_with_a_text_length_is_refused(tiny_vit, tmp_path) -> None:
    import shutil

    from hub_export.pipeline.export import export

    bare = tmp_path / "bare"
    shutil.copytree(tiny_vit, bare)
    (bare / "preprocessor_config.json").unlink()
    with pytest.raises(SourceError, match="bare has no preprocessor_config.json"):
        export(str(bare), tmp_path / "out", qmodes=["fp32"], jobs=1)
    with pytest.raises(InputError, match="--max-seq-len applies to text"):
        export(str(tiny_vit), tmp_path / "out2", qmodes=["fp32"], max_seq_len=64, jobs=1)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_an_image_classifier_goes_through_push_pull_classify_and_the_preview(
    exported_vit, local_hub, picture, tmp_path, capsys
) -> None:
    from huggingface_hub import ModelCard

    from hub_export import push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-vit-classifier"
    hub = ["--endpoint", local_hub.endpoint, "--token", local_hub.alice_token]
    assert push(from_dir=str(exported_vit), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)
    card = ModelCard.load(repo_id, token=local_hub.alice_token)
    assert card.data.pipeline_tag == "image-classification" and "`cat`, `dog`, `car`" in card.text
    code, out, _ = run_cli(["ls", repo_id, *hub], capsys)
    assert code == 0 and "top-1" in out and "drawn images" in " ".join(out.split())
    local = run_cli(["classify", str(exported_vit), str(picture), "--variant", "8da8w"], capsys)[1]
    code, remote, _ = run_cli(["classify", repo_id, str(picture), "--variant", "8da8w", *hub], capsys)
    labels = lambda text: [line.split("│")[1].strip() for line in text.splitlines() if line.count("│") == 3]  # noqa: E731
    assert code == 0 and labels(remote) == labels(local) and len(labels(local)) == 5

    shown: list = []
    request = PreviewRequest(repo_id, "8da8w", "", 8, None, image=str(picture))
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path / "preview", shown.append)
    text = "".join(value for kind, value in shown if kind == "text")
    assert text.splitlines()[0].startswith(f"{result.labels[0].label}: ") and len(text.splitlines()) == 5
    with pytest.raises(InputError, match="this repo labels images: upload one"):
        preview(PreviewRequest(repo_id, None, "a cat", 8, None), local_hub.alice_token, local_hub.endpoint,
                tmp_path / "again", shown.append)  # fmt: skip


def test_the_space_preview_of_a_fill_mask_repo_lists_the_words(exported_mlm, local_hub, tmp_path) -> None:
    from hub_export import push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-mlm-preview"
    push(from_dir=str(exported_mlm), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)
    shown: list = []
    request = PreviewRequest(repo_id, "8da8w", "The [MASK] sat by the [MASK].", 8, None)
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path, shown.append)
    text = "".join(value for kind, value in shown if kind == "text")
    assert text.startswith("mask 1: ") and "\nmask 2: " in text and len(result.masks) == 2


# --- every family -------------------------------------------------------------------------------

MLM_FAMILIES = ["bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert"]
VISION_FAMILIES = ["vit", "deit", "mobilevit", "convnext", "efficientnet"]


def test_every_family_is_exported_by_a_test() -> None:
    from hub_export.tasks.archs import SUPPORTED_MODEL_TYPES

    assert SUPPORTED_MODEL_TYPES["fill-mask"] == set(MLM_FAMILIES)
    assert SUPPORTED_MODEL_TYPES["image-classification"] == set(VISION_FAMILIES)


@pytest.mark.extended
@pytest.mark.parametrize("model_type", MLM_FAMILIES[1:])
def test_each_fill_mask_family_exports_verified(model_type, tmp_path) -> None:
    from hub_export.models.tiny import build_tiny_masked_lm
    from hub_export.pipeline.export import export

    source = build_tiny_masked_lm(tmp_path / model_type, model_type)
    (variant,) = export(str(source), tmp_path / "out", qmodes=["8da8w"], max_seq_len=128, jobs=1).variants
    assert variant.verification.verified and variant.verification.figures["top1_vs_eager"] >= 0.95


@pytest.mark.extended
@pytest.mark.parametrize("model_type", VISION_FAMILIES[1:])
def test_each_image_family_exports_verified(model_type, tmp_path) -> None:
    from transformers import AutoModelForImageClassification

    from hub_export.models.tiny import build_tiny_image_classifier
    from hub_export.pipeline.export import export
    from hub_export.tasks.encoders import build_reference
    from hub_export.tasks.registry import IMAGE_CLASSIFICATION

    source = build_tiny_image_classifier(tmp_path / model_type, model_type)
    model = AutoModelForImageClassification.from_pretrained(source).eval()
    # The drawn images get different scores from the random model, so the check can tell a wrong file.
    assert build_reference(IMAGE_CLASSIFICATION, model, source, 32).outputs.std(0).mean() > 0.05
    (variant,) = export(str(source), tmp_path / "out", qmodes=["8da8w"], jobs=1).variants
    assert variant.verification.verified and variant.verification.figures["top1_vs_eager"] >= 0.95
