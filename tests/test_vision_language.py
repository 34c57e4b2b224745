"""Vision-language files: the three methods compute what transformers' model computes, ExecuTorch's MultimodalRunner
generates from them, verification tells a wrong file from an honest one, and every face (CLI, API, card, preview)
takes images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hub_export.tasks.encoders import EncodedAndScored


@pytest.fixture(scope="session")
def tiny_smolvlm(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-smolvlm", "smolvlm")


@pytest.fixture(scope="session")
def exported_vlm(tmp_path_factory, tiny_smolvlm) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-smolvlm"
    export(str(tiny_smolvlm), out, qmodes=["fp32", "8da4w"], qembedding="8w", max_seq_len=128, jobs=1)
    return out


@pytest.fixture(scope="session")
def drawn_images(tmp_path_factory) -> list[Path]:
    from hub_export.tasks.image_classification.export import draw

    folder = tmp_path_factory.mktemp("images")
    paths = []
    for index in (0, 2, 4):
        image, _ = draw(index, 120)
        paths.append(folder / f"drawn-{index}.png")
        image.save(paths[-1])
    return paths


@pytest.mark.parametrize("model_type", ["idefics3", "smolvlm", "llava", "internvl"])
def test_the_three_methods_compute_what_transformers_computes(model_type, tmp_path, drawn_images) -> None:
    """Prefill of text, image and text, then decode steps, against transformers' own forward over the whole
    sequence with the image's tokens expanded as its processor expands them."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForImageTextToText

    from hub_export.models.tiny import build_tiny_vlm
    from hub_export.tasks.vision_language import export as vl
    from hub_export.tasks.vision_language import run as vl_run

    folder = build_tiny_vlm(tmp_path / model_type, model_type)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    wrapped = vl.wrap(model, folder, 128).eval()
    image = vl_run.load_image(drawn_images[1], wrapped.image_size)
    prompt = vl_run.build_prompt(folder, wrapped.family, "What shape is this?", [image], Tokenizer.from_file(
        str(folder / "tokenizer.json")))  # fmt: skip
    steps = vl_run.EagerSteps(wrapped)
    scores, position, _ = vl_run.prefill(steps, prompt)
    answer = [5, 9]
    rows = [scores] + [
        steps.decode(steps.embed(torch.tensor([[token]])), torch.tensor([position + i]))[0, -1]
        for i, token in enumerate(answer)
    ]
    # The image moves the answer: another image gives other scores (a check blind to images would pass anyway).
    other = vl_run.Prompt(prompt.parts, [vl_run.load_image(drawn_images[0], wrapped.image_size)])
    assert (vl_run.prefill(steps, other)[0] - scores).abs().max() > 1e-2
    ids = []
    for part in prompt.parts:
        ids += [model.config.image_token_id] * wrapped.image_tokens if isinstance(part, int) else part
    pixels = wrapped.vision_encoder.normalise(image)
    pixels = pixels.unsqueeze(0) if model_type in ("idefics3", "smolvlm") else pixels  # Idefics3: images per sample
    model.config.get_text_config()._attn_implementation = "eager"  # transformers' reference math, no cache ops
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + answer]), pixel_values=pixels).logits[0]
    expected = logits[len(ids) - 1 :]
    assert position == len(ids)
    assert torch.allclose(torch.stack(rows), expected, atol=1e-4), (torch.stack(rows) - expected).abs().max()


def test_the_file_has_the_runners_methods_and_is_verified(exported_vlm) -> None:
    from hub_export.pipeline.manifest import Manifest
    from hub_export.runtime.pte import PteModel

    manifest = Manifest.read(exported_vlm)
    assert manifest.source["task"] == "image-text-to-text"
    assert manifest.source["methods"] == ["vision_encoder", "token_embedding", "text_decoder"]
    model = PteModel(exported_vlm / "model-8da4w-emb8w.pte")
    assert {"vision_encoder", "token_embedding", "text_decoder"} <= set(model.methods)
    assert model.metadata["get_image_size"] == 64 and model.metadata["get_image_tokens"] == 16
    assert model.metadata["get_max_seq_len"] == 128 and model.metadata["use_kv_cache"]
    for variant in manifest.variants:
        figures = variant.verification.figures
        assert variant.verification.verified and figures["images"] == 6 and figures["runner_matches"] == 1.0
        assert figures["min_feature_cosine"] >= figures["min_feature_cosine_required"]
        assert figures["perplexity"] > 1 and figures["fp32_perplexity"] > 1
    assert "image cosine" in manifest.variant("8da4w").verification.summary()
    fp32 = manifest.variant("fp32")  # memory measured at full context, image included
    assert fp32.runtime_memory["context_tokens"] == 128 and fp32.runtime_memory["peak_rss_bytes"] > fp32.size_bytes
    assert fp32.kv_cache["layers"] == 2 and fp32.kv_cache["bytes_at_full_context"] > 0
    assert "text perplexity" in manifest.variant("8da4w").verification.quality_cell()


def test_multimodal_runner_generates_what_the_files_own_loop_does(exported_vlm, drawn_images) -> None:
    """ExecuTorch's MultimodalRunner (Python binding) on text, an image and text: the file's own greedy answer."""
    from tokenizers import Tokenizer

    from hub_export.tasks.vision_language import export as vl
    from hub_export.tasks.vision_language import model as vl_model
    from hub_export.tasks.vision_language import run as vl_run

    pte = exported_vlm / "model-fp32-emb8w.pte"
    file = vl_run.VisionLanguageFile(pte)
    tokenizer = Tokenizer.from_file(str(exported_vlm / "tokenizer.json"))
    image = vl_run.load_image(drawn_images[2], file.image_size)
    prompt = vl_run.build_prompt(exported_vlm, vl_model.IDEFICS3, "Describe it.", [image], tokenizer)
    own = vl_run.greedy(file, prompt, 10, set(file.model.metadata["get_eos_ids"]), file.max_seq_len)
    result = vl.runner_generate(pte, exported_vlm / "tokenizer.json", prompt, 10)
    reference = vl.VisionLanguageReference([], [prompt], [own], [], [], [], 1.0, [], 128,
                                           (exported_vlm / "tokenizer.json").read_text())  # fmt: skip
    assert own and result["text"].startswith(vl._decode(reference, own))
    assert result["stats"]["generated_tokens"] >= len(own) - 1  # the runner counts the prefill's token apart
    assert result["stats"]["prompt_tokens"] == prompt.text_tokens + file.image_tokens


def test_verification_fails_answers_about_other_images(exported_vlm, tiny_smolvlm) -> None:
    from transformers import AutoModelForImageTextToText

    from hub_export.pipeline.quantize import QMODES
    from hub_export.tasks.vision_language import export as vl

    model = AutoModelForImageTextToText.from_pretrained(tiny_smolvlm, dtype=torch.float32).eval()
    ref = vl.reference(model, tiny_smolvlm, 128)
    good = vl.expected(vl.wrap(model, tiny_smolvlm, 128).eval(), ref)
    pte = exported_vlm / "model-fp32-emb8w.pte"
    # Each prompt judged against the eager answers for the next image: a file that mixed up its inputs.
    shifted = EncodedAndScored(good.encoded[1:] + good.encoded[:1], good.scores)
    result = vl.verify_variant(pte, shifted, ref, QMODES["fp32"], "8w", runner_check=False)
    assert not result.passed and result.failure.startswith("image embeddings' cosine"), result.failure


def test_generate_streams_an_answer_about_images(exported_vlm, drawn_images, capsys) -> None:
    from helpers import run_cli

    from hub_export.tasks.text_generation.run import generate

    args = ["generate", str(exported_vlm), "--variant", "8da4w", "--image", str(drawn_images[0]), "--image",
            str(drawn_images[1]), "--prompt", "Compare the two pictures.", "--max-new-tokens", "8"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "prefill" in err and "decode" in err and "chat template" in err
    result = generate(exported_vlm / "model-8da4w-emb8w.pte", exported_vlm, "Compare the two pictures.",
                      images=drawn_images[:2], max_new_tokens=8)  # fmt: skip
    assert out.rstrip("\n") == result.text
    assert result.prompt_tokens > 2 * 16  # both images' embeddings are in the prompt
    alone = generate(exported_vlm / "model-8da4w-emb8w.pte", exported_vlm, "Compare the two pictures.",
                     images=drawn_images[2:], max_new_tokens=8)  # fmt: skip
    assert alone.prompt_tokens == result.prompt_tokens - 16 - 3  # an image: its embeddings and 3 marker tokens


def test_bad_images_are_refused_in_one_line(exported_vlm, drawn_images, tmp_path, capsys) -> None:
    from helpers import run_cli
    from PIL import Image

    animated = tmp_path / "clip.gif"
    frames = [Image.new("RGB", (16, 16), colour) for colour in ("red", "blue")]
    frames[0].save(animated, save_all=True, append_images=frames[1:])
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    base = ["generate", str(exported_vlm), "--variant", "8da4w", "--prompt", "Hi"]
    cases = {
        "no file at": ["--image", str(tmp_path / "missing.png")],
        "is not an image": ["--image", str(not_image)],
        "is animated": ["--image", str(animated)],
        "at most 8": [arg for _ in range(9) for arg in ("--image", str(drawn_images[0]))],
        "this file holds at most 127": [arg for _ in range(8) for arg in ("--image", str(drawn_images[0]))],
    }
    for words, extra in cases.items():
        code, out, err = run_cli(base + extra, capsys)
        assert code != 0 and words in err, (words, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_hostile_images_are_refused_by_generate_in_one_line(exported_vlm, tmp_path, capsys) -> None:
    """Bombs, animations, damaged files and files that are not files, as the CLI's --image and the API take them."""
    from helpers import error_line, run_cli
    from hostile_media import image_corpus

    from hub_export.errors import InputError
    from hub_export.tasks.vision_language.run import load_image

    base = ["generate", str(exported_vlm), "--variant", "8da4w", "--prompt", "Hi", "--image"]
    for what, path in image_corpus(tmp_path / "images").items():
        code, _, err = run_cli([*base, str(path)], capsys)
        assert code == 2 and path.name in error_line(err), (what, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (what, err)
        with pytest.raises(InputError, match=path.name):
            load_image(path, 64)


def test_images_are_refused_by_a_text_file(tmp_path, drawn_images) -> None:
    from hub_export.errors import InputError
    from hub_export.models.tiny import build_tiny_model
    from hub_export.pipeline.export import export
    from hub_export.tasks.text_generation.run import generate

    out = tmp_path / "out"
    export(str(build_tiny_model(tmp_path / "tiny")), out, qmodes=["fp32"], verify=False, jobs=1)
    with pytest.raises(InputError, match="does not take images"):
        generate(out / "model-fp32.pte", out, "Hi", images=drawn_images[:1])


def test_the_task_is_read_from_the_config_and_its_options_checked(tiny_smolvlm) -> None:
    from hub_export.errors import InputError
    from hub_export.tasks import registry as tasks
    from hub_export.tasks.vision_language.export import seq_len

    for model_type in ("smolvlm", "idefics3", "llava", "internvl"):
        assert tasks.task_for({"model_type": model_type}) is tasks.IMAGE_TEXT_TO_TEXT
    with pytest.raises(InputError, match="mixed does not apply to image-text-to-text"):
        tasks.check_qmodes(tasks.IMAGE_TEXT_TO_TEXT, ["mixed"])
    with pytest.raises(InputError, match="leaves no room for an image"):
        seq_len(tiny_smolvlm, {"model_type": "smolvlm"}, 24)
    with pytest.raises(InputError, match="PaliGemma.*does not export yet"):
        tasks.task_for({"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"]})


def test_the_card_push_pull_and_preview(exported_vlm, drawn_images, local_hub, tmp_path) -> None:
    from huggingface_hub import ModelCard

    from hub_export import pull, push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-smolvlm"
    push(from_dir=str(exported_vlm), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)
    card = ModelCard.load(repo_id, token=local_hub.alice_token)
    assert card.data.pipeline_tag == "image-text-to-text"
    assert "MultimodalRunner" in card.text and "make_image_input" in card.text and "resize((64, 64))" in card.text
    assert '"<fake_token_around_image><global-img>"' not in card.text  # the markers follow the chat turn's text
    assert "<global-img>" in card.text and "Image KL, top-1 vs fp32" in card.text
    assert "Memory at full context" in card.text and "| ~" not in card.text  # measured, not estimated
    pulled = pull(repo_id, variant="8da4w", output_dir=tmp_path / "pulled", endpoint=local_hub.endpoint,
                  token=local_hub.alice_token)  # fmt: skip
    assert (pulled / "preprocessor_config.json").is_file() and (pulled / "tokenizer.json").is_file()
    shown: list = []
    request = PreviewRequest(repo_id, "8da4w", "", 6, None, image=str(drawn_images[0]))
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path / "preview", shown.append)
    assert "".join(value for kind, value in shown if kind == "text") == result.text
    assert any("from the image" in value for kind, value in shown if kind == "stage")


def test_running_the_vision_encoder_between_decoder_calls_keeps_the_cache(exported_vlm, drawn_images) -> None:
    """The runtime shares each planned arena among a file's methods: the KV cache must live in its own, or the
    image's encoder overwrites the prompt's cached keys between two prefill chunks."""
    from hub_export.tasks.vision_language import run as vl_run

    file = vl_run.VisionLanguageFile(exported_vlm / "model-fp32-emb8w.pte")
    image = vl_run.load_image(drawn_images[0], file.image_size)
    prefix = file.embed(torch.tensor([[3, 17, 29, 41, 55, 60, 71]]))
    embeds = file.vision(image)
    file.decode(prefix, torch.arange(7))
    undisturbed = file.decode(embeds, torch.arange(7, 7 + embeds.shape[1]))
    file.decode(prefix, torch.arange(7))
    file.vision(vl_run.load_image(drawn_images[1], file.image_size))  # runs between the two chunks
    disturbed = file.decode(embeds, torch.arange(7, 7 + embeds.shape[1]))
    assert torch.allclose(undisturbed, disturbed, atol=1e-5), (undisturbed - disturbed).abs().max()


@pytest.mark.parametrize("model_type", ["llava", "internvl"])
def test_the_other_families_export_verified_files_the_runner_takes(model_type, tmp_path) -> None:
    from hub_export.models.tiny import build_tiny_vlm
    from hub_export.pipeline.export import export
    from hub_export.pipeline.manifest import Manifest

    out = tmp_path / "out"
    # The vision tower and connector may take their own qmode (--qmode-encoder).
    encoder = "8da8w" if model_type == "internvl" else None
    export(str(build_tiny_vlm(tmp_path / model_type, model_type)), out, qmodes=["8da4w"], max_seq_len=128, jobs=1,
           qmode_encoder=encoder)  # fmt: skip
    variant = Manifest.read(out).variants[0]
    assert variant.verification.verified and variant.verification.figures["runner_matches"] == 1.0
    assert variant.asked["qmode_encoder"] == encoder
