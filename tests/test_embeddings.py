"""Sentence embeddings: the task is read from the checkpoint, the .pte pools as sentence-transformers does, and
verification, the CLI's embed and the card say what a user checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import error_line, run_cli

from hub_export.errors import InputError
from hub_export.options import ExportOptions
from hub_export.tasks.registry import task_for
from hub_export.tasks.sentence_embeddings.export import (
    Pooling,
    SentenceEmbedder,
    compare,
    eval_sentences,
    retrieval_agreement,
)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("encoders") / "tiny-bert")


@pytest.fixture(scope="session")
def exported_bert(tmp_path_factory, tiny_bert) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-bert"
    export(str(tiny_bert), out, qmodes=["8da8w", "fp32"], qembedding="8w", jobs=1)
    return out


# --- what a checkpoint is -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("architectures", "task"),
    [
        (["BertModel"], "feature-extraction"),
        (["XLMRobertaModel"], "feature-extraction"),
        (["LlamaForCausalLM"], "text-generation"),
        (["GPT2LMHeadModel"], "text-generation"),
        (["BertForMaskedLM"], "fill-mask"),
        (["ModernBertForMaskedLM"], "fill-mask"),
        (["ViTForImageClassification"], "image-classification"),
        (["MobileViTForImageClassification"], "image-classification"),
    ],
)
def test_the_task_is_read_from_the_architecture(architectures, task) -> None:
    assert task_for({"architectures": architectures, "model_type": "x"}).name == task


def test_a_task_not_exported_yet_is_refused_by_name() -> None:
    with pytest.raises(InputError) as refused:
        task_for({"architectures": ["BertForSequenceClassification"], "model_type": "bert"})
    assert str(refused.value) == (
        "BertForSequenceClassification is a text-classification model, which hub-export does not export yet; "
        "supported tasks: text-generation, feature-extraction, automatic-speech-recognition, text2text-generation, "
        "fill-mask, image-classification, image-text-to-text (see `hub-export archs`)"
    )


def test_decoder_only_qmodes_are_refused_for_embeddings() -> None:
    with pytest.raises(InputError, match="--qmode mixed does not apply to feature-extraction"):
        ExportOptions(task="feature-extraction", qmodes=("8da8w", "mixed"))


def _sentence_transformers_folder(tmp_path: Path, pooling: dict, normalize: bool) -> Path:
    modules = [
        {"type": "sentence_transformers.models.Transformer", "path": ""},
        {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
    ]
    modules += [{"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}] if normalize else []
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


@pytest.mark.parametrize(
    ("pooling", "normalize", "expected"),
    [
        ({"pooling_mode_mean_tokens": True}, True, Pooling("mean", True)),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, False, Pooling("cls", False)),
        ({"pooling_mode_max_tokens": True}, True, Pooling("max", True)),
    ],
)
def test_pooling_comes_from_the_sentence_transformers_config(tmp_path, pooling, normalize, expected) -> None:
    assert Pooling.of_folder(_sentence_transformers_folder(tmp_path, pooling, normalize)) == expected


def test_a_plain_encoder_pools_the_mean_unnormalised_and_other_poolings_are_refused(tmp_path) -> None:
    assert Pooling.of_folder(tmp_path) == Pooling("mean", False)
    folder = _sentence_transformers_folder(tmp_path, {"pooling_mode_weightedmean_tokens": True}, True)
    with pytest.raises(InputError, match="pools with pooling_mode_weightedmean_tokens; supported: one of"):
        Pooling.of_folder(folder)


def test_pooling_matches_sentence_transformers_arithmetic() -> None:
    class Encoder(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            hidden = torch.stack([input_ids.float(), 2 * input_ids.float()], dim=-1)
            return type("Out", (), {"last_hidden_state": hidden})

    ids, mask = torch.tensor([[1, 2, 6]]), torch.tensor([[1, 1, 0]])
    assert SentenceEmbedder(Encoder(), Pooling("mean", False))(ids, mask).tolist() == [[1.5, 3.0]]
    assert SentenceEmbedder(Encoder(), Pooling("cls", False))(ids, mask).tolist() == [[1.0, 2.0]]
    assert SentenceEmbedder(Encoder(), Pooling("max", False))(ids, mask).tolist() == [[2.0, 4.0]]  # 6 is masked
    unit = SentenceEmbedder(Encoder(), Pooling("mean", True))(ids, mask)
    assert torch.allclose(unit.norm(dim=-1), torch.ones(1))


def test_the_checks_see_a_swapped_vector_and_a_wrong_neighbour() -> None:
    torch.manual_seed(0)
    expected = torch.randn(8, 16)
    assert compare(expected.clone(), expected, 0.9999).passed
    broken = expected.clone()
    broken[3] = torch.randn(16)
    check = compare(broken, expected, 0.9999)
    assert not check.passed and "cosine similarity to eager" in check.failure and check.sentences == 8
    near = expected.clone()
    near[1] = expected[0] + 0.01 * torch.randn(16)  # sentence 1 becomes sentence 0's nearest neighbour
    assert retrieval_agreement(near, expected) < 1.0


def test_the_evaluation_sentences_are_real_and_not_the_calibration_text() -> None:
    from importlib import resources

    sentences = eval_sentences()
    calibration = resources.files("hub_export").joinpath("data", "calib_en.txt").read_text()
    assert len(sentences) == 64 and len(set(sentences)) == 64
    assert all(len(s.split()) >= 6 and s not in calibration for s in sentences)


# --- a tiny encoder end to end ---------------------------------------------------------------


def test_an_encoder_exports_verified_with_its_figures_in_the_manifest(exported_bert) -> None:
    manifest = json.loads((exported_bert / "manifest.json").read_text())
    assert manifest["source"]["task"] == "feature-extraction"
    assert manifest["source"]["pooling"] == {"mode": "mean", "normalize": True}
    for variant in manifest["variants"]:
        figures = variant["verification"]["figures"]
        assert variant["verification"]["passed"] is True and figures["sentences"] == 64
        assert figures["min_cosine_vs_eager"] >= figures["min_cosine_vs_eager_required"]
        assert figures["min_cosine_vs_fp32"] >= figures["min_cosine_vs_fp32_required"] == 0.99  # 8-bit table
        assert 0 <= figures["retrieval_vs_fp32"] <= 1
        assert variant["metadata"]["get_embedding_dim"] == 64 and variant["metadata"]["is_normalized"] is True


def test_the_pte_reproduces_the_eager_model_and_its_pooling(exported_bert, tiny_bert) -> None:
    from transformers import AutoModel

    from hub_export import embed

    texts = ["A cat sat on the mat.", "The harbour was quiet that morning.", "Prices rose again."]
    eager_model = SentenceEmbedder(AutoModel.from_pretrained(tiny_bert).eval(), Pooling.of_folder(tiny_bert))
    result = embed(exported_bert / "model-fp32-emb8w.pte", exported_bert, texts)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_bert / "tokenizer.json"))
    with torch.no_grad():
        eager = torch.cat(
            [
                eager_model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
                for ids in (tokenizer.encode(text).ids for text in texts)
            ]
        )
    # The fp32 file with an 8-bit table: close to eager, and unit length as the config says.
    assert torch.nn.functional.cosine_similarity(result.vectors, eager).min() > 0.99
    assert torch.allclose(result.vectors.norm(dim=-1), torch.ones(3), atol=1e-4)
    assert result.similarities.shape == (3, 3) and torch.allclose(result.similarities.diagonal(), torch.ones(3))


def test_embed_prints_similarities_and_json_vectors_in_order(exported_bert, capsys) -> None:
    texts = ["first text here", "a second, different one", "first text here"]
    code, out, err = run_cli(["embed", str(exported_bert), "--variant", "8da8w", *texts], capsys)
    assert code == 0, err
    assert "cosine similarity (model-8da8w-emb8w.pte, 64 dimensions)" in " ".join(out.split())
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    cells = [cell.strip() for cell in rows[0].split("│")[2:5]]
    assert len(rows) == 3 and cells[0] == cells[2] == "1.000" and float(cells[1]) < 1  # texts 1 and 3 are the same
    assert "3 texts" in err and "texts/s" in err

    code, out, _ = run_cli(["embed", str(exported_bert), "--variant", "8da8w", "--json", *texts], capsys)
    vectors = json.loads(out)
    assert code == 0 and len(vectors) == 3 and all(len(v) == 64 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]


def test_the_wrong_file_for_the_verb_is_one_line(exported_bert, exported_multi, capsys) -> None:
    code, _, err = run_cli(["generate", str(exported_bert), "--prompt", "hi"], capsys)
    assert code == 2 and "is a sentence-embedding file, which does not generate text; use `hub-export embed`" in (
        error_line(err)
    )
    code, _, err = run_cli(["embed", str(exported_multi), "hello"], capsys)
    assert code == 2 and "is not a sentence-embedding file" in error_line(err)


def test_the_card_speaks_of_embeddings(exported_bert) -> None:
    from huggingface_hub import ModelCard

    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    card = ModelCard(render_card(Manifest.read(exported_bert), repo_id="alice/tiny-bert-et"))
    assert card.data.pipeline_tag == "feature-extraction"
    assert "mean over the tokens, then\nnormalised" in card.text
    row = next(line for line in card.text.splitlines() if line.startswith("| `model-8da8w-emb8w.pte`"))
    assert row.count("|") == 8 and "8da8w" in row and "n/a" not in row
    assert 'hub-export embed alice/tiny-bert-et "A cat sat on the mat."' in card.text
    assert "TextLLMRunner" not in card.text and "KV cache" not in card.text


def test_a_broken_embedding_file_fails_verification(exported_bert, tiny_bert, tmp_path) -> None:
    from transformers import AutoModel

    from hub_export.pipeline.quantize import QMODES
    from hub_export.tasks.encoders import build_reference, eager_outputs, verify_variant
    from hub_export.tasks.registry import FEATURE_EXTRACTION

    broken = tmp_path / "broken.pte"
    data = bytearray((exported_bert / "model-fp32-emb8w.pte").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(range(256)) * 16
    broken.write_bytes(bytes(data))
    model = AutoModel.from_pretrained(tiny_bert).eval()
    reference = build_reference(FEATURE_EXTRACTION, model, tiny_bert, 128)
    expected = eager_outputs(SentenceEmbedder(model, Pooling.of_folder(tiny_bert)), reference)
    result = verify_variant(FEATURE_EXTRACTION, broken, expected, reference, QMODES["fp32"], "8w")
    assert not result.passed
    assert result.failure.startswith(("against eager: ", "runtime error: ")), result.failure


# --- more families, end to end -------------------------------------------------------------------


MORE_FAMILIES = ["roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert"]


def test_every_encoder_family_is_exported_by_a_test() -> None:
    from hub_export.tasks.archs import SUPPORTED_MODEL_TYPES

    assert SUPPORTED_MODEL_TYPES["feature-extraction"] == {"bert", *MORE_FAMILIES}


@pytest.mark.extended
@pytest.mark.parametrize("model_type", MORE_FAMILIES)
def test_each_encoder_family_exports_verified(model_type, tmp_path) -> None:
    from hub_export.models.tiny import build_tiny_encoder
    from hub_export.pipeline.export import export

    source = build_tiny_encoder(tmp_path / model_type, model_type, pooling="cls", normalize=False)
    manifest = export(str(source), tmp_path / "out", qmodes=["8da8w"], jobs=1)
    (variant,) = manifest.variants
    assert variant.verification.verified and manifest.source["pooling"] == {"mode": "cls", "normalize": False}
    assert variant.verification.figures["min_cosine_vs_eager"] >= 0.995


def test_an_embedding_repo_goes_through_push_ls_pull_and_embed(exported_bert, local_hub, tmp_path, capsys) -> None:
    from huggingface_hub import ModelCard

    from hub_export import pull, push

    repo_id = "alice/tiny-bert-embeddings"
    hub = dict(token=local_hub.alice_token, endpoint=local_hub.endpoint)
    assert push(from_dir=str(exported_bert), repo_id=repo_id, **hub).pushed
    assert ModelCard.load(repo_id, token=local_hub.alice_token).data.pipeline_tag == "feature-extraction"

    code, out, _ = run_cli(["ls", repo_id, "--endpoint", local_hub.endpoint, "--token", local_hub.alice_token], capsys)
    flat = " ".join(out.split())
    assert code == 0 and "quality vs fp32" in flat and "model-8da8w-emb8w.pte" in flat and "neighbours" in flat

    folder = pull(repo_id, variant="8da8w", output_dir=tmp_path / "pulled", **hub)
    local = json.loads(run_cli(["embed", str(folder), "--json", "a short text"], capsys)[1])
    code, out, _ = run_cli(["embed", repo_id, "--variant", "8da8w", "--json", "a short text",
                            "--endpoint", local_hub.endpoint, "--token", local_hub.alice_token], capsys)  # fmt: skip
    assert code == 0 and json.loads(out) == local and len(local[0]) == 64


def test_the_space_preview_of_an_embedding_repo_compares_the_lines(exported_bert, local_hub, tmp_path) -> None:
    from hub_export import push
    from hub_export.service import PreviewRequest, preview

    repo_id = "alice/tiny-bert-preview"
    push(from_dir=str(exported_bert), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)
    shown: list = []
    request = PreviewRequest(repo_id, "8da8w", "A cat sat on the mat.\nA cat sat on the mat.\nStocks fell.", 8, None)
    result = preview(request, local_hub.alice_token, local_hub.endpoint, tmp_path, shown.append)
    text = "".join(value for kind, value in shown if kind == "text")
    assert text.splitlines()[:3] == ["1. A cat sat on the mat.", "2. A cat sat on the mat.", "3. Stocks fell."]
    assert "cosine similarity 1-2: 1.000" in text and "cosine similarity 2-3: " in text
    assert len(result.tokens) == 3 and result.texts_per_s > 0
    with pytest.raises(InputError, match="type two or more, one per line"):
        preview(PreviewRequest(repo_id, None, "only one", 8, None), local_hub.alice_token, local_hub.endpoint,
                tmp_path / "again", shown.append)  # fmt: skip
