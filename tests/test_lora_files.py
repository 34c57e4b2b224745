"""Adapter files over one base (``--lora-files``): the base's weights in one ``.ptd`` that every adapter of that base
shares byte for byte, each adapter's program and factors in a small ``.pte``; each pair verified against the base
with the adapter applied, as PEFT computes it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from helpers import error_line, run_cli
from test_adapters import make_lora

from hub_export.errors import InputError


@pytest.fixture(scope="module")
def two_adapters(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora-files")
    return make_lora(tiny_model, root / "tone-a", seed=0), make_lora(tiny_model, root / "tone-b", seed=1,
                                                                     use_rslora=True)  # fmt: skip


@pytest.fixture(scope="module")
def exported_pair(two_adapters, tmp_path_factory) -> tuple[Path, Path]:
    from hub_export.pipeline.export import export

    root = tmp_path_factory.mktemp("lora-files-out")
    first, second = two_adapters
    export(str(first), root / "a", qmodes=["8da4w", "fp32"], max_seq_len=64, jobs=1, lora_files=True)
    export(str(second), root / "b", qmodes=["8da4w"], max_seq_len=64, jobs=1, lora_files=True)
    return root / "a", root / "b"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_adapter_of_a_base_writes_the_same_base_file(exported_pair) -> None:
    from hub_export import read_manifest

    first, second = exported_pair
    assert _sha(first / "base-8da4w.ptd") == _sha(second / "base-8da4w.ptd")
    for folder, name in zip(exported_pair, ("tone-a", "tone-b"), strict=True):
        manifest = read_manifest(folder)
        assert manifest.source["adapter"]["separate_files"] is True
        variant = next(v for v in manifest.variants if v.qmode == "8da4w")
        assert variant.verification.passed, variant.verification.line()
        assert (variant.file, variant.data_file) == (f"lora-{name}-8da4w.pte", "base-8da4w.ptd")
        assert variant.adapter["id"] == name and variant.adapter["sha256"] == manifest.source["adapter"]["sha256"]
        assert variant.data_sha256 == _sha(folder / "base-8da4w.ptd")  # what pull checks a downloaded base against
        # The program file holds no base weight: it is smaller than the base's.
        assert (folder / variant.file).stat().st_size < (folder / "base-8da4w.ptd").stat().st_size
    assert _sha(first / "lora-tone-a-8da4w.pte") != _sha(second / "lora-tone-b-8da4w.pte")


def test_attached_factors_compute_what_peft_computes(tiny_model, two_adapters) -> None:
    """Plain LoRA and rsLoRA (scale alpha/sqrt(r)) attached to the base give PEFT's logits."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hub_export.pipeline.adapter import read_adapter
    from hub_export.pipeline.lora_files import attach_lora, detach_lora

    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    for folder in two_adapters:
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
        with torch.no_grad():
            plain = base(ids).logits
            attached = attach_lora(base, read_adapter(folder, folder.name))
            ours = base(ids).logits
            detach_lora(attached)
            assert torch.equal(base(ids).logits, plain)  # detached: the base again
            peft = PeftModel.from_pretrained(base, folder).eval()(ids).logits
        assert (ours - peft).abs().max() < 1e-5 and (ours - plain).abs().max() > 1e-2


def test_the_pair_computes_the_adapted_model_and_runs_from_the_folder(exported_pair, two_adapters, tiny_model) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hub_export import generate
    from hub_export.runtime.pte import PteModel

    first = exported_pair[0]
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(base, two_adapters[0]).eval()(ids).logits[0, -1]
    file = PteModel(first / "lora-tone-a-fp32.pte")  # finds base-fp32.ptd beside it
    logits = file.run([ids, torch.arange(ids.shape[1])])[0].reshape(-1, adapted.shape[-1])[-1]
    assert (logits - adapted).abs().max() < 1e-3
    result = generate(first / "lora-tone-a-8da4w.pte", first, "Once upon a time", max_new_tokens=4, chat=False)
    assert result.generated_tokens >= 1


def test_a_program_over_another_base_file_does_not_load(exported_pair, tmp_path) -> None:
    """The factors were made for one base; the fp32 base's file in place of the 8da4w one is refused in one line."""
    from hub_export.errors import VerificationError
    from hub_export.runtime.pte import PteModel

    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(exported_pair[0] / "lora-tone-a-8da4w.pte", folder)
    shutil.copy(exported_pair[0] / "base-fp32.ptd", folder / "base-8da4w.ptd")
    with pytest.raises(VerificationError, match="lora-tone-a-8da4w.pte"):
        PteModel(folder / "lora-tone-a-8da4w.pte")


def test_the_card_says_which_files_a_device_needs(exported_pair) -> None:
    from hub_export import read_manifest
    from hub_export.hub.card import render_card

    body = render_card(read_manifest(exported_pair[0]))
    assert "kept apart from its base" in body and "runs over the matching `base-*.ptd`" in body
    assert "the base's weights: the adapter rides in the .pte" in body
    assert "base-8da4w.ptd" in body


def test_what_cannot_be_kept_apart_is_refused_in_one_line(tiny_model, two_adapters, tmp_path, capsys) -> None:
    dora = make_lora(tiny_model, tmp_path / "dora", use_dora=True)
    cases = {
        "the source is not an adapter": [str(tiny_model)],
        "uses use_dora, which only a merged file carries": [str(dora)],
        "drop --share-embeddings": [str(two_adapters[0]), "--share-embeddings", "--qembedding", "8w"],
    }
    for words, args in cases.items():
        out = tmp_path / f"out-{len(words)}"
        code, _, err = run_cli(["export", *args, "-o", str(out), "--lora-files", "-q", "8da8w", "--max-seq-len", "64"],
                               capsys)  # fmt: skip
        assert code == 2 and words in error_line(err), (words, err)
        assert not out.exists()
    with pytest.raises(InputError, match="lora-files"):
        from hub_export import ExportOptions

        ExportOptions(lora_files=True, share_embeddings=True, qembedding="8w", qmodes=["8da8w"])


def test_two_adapters_share_one_repo_and_the_second_uploads_only_its_own_files(exported_pair, local_hub, tmp_path,
                                                                                capsys) -> None:  # fmt: skip
    from hub_export import generate, pull, push
    from hub_export.hub.pull import list_variants
    from hub_export.pipeline.manifest import Manifest

    hub = {"token": local_hub.alice_token, "endpoint": local_hub.endpoint}
    first = push(from_dir=str(exported_pair[0]), repo_id="alice/tones-ExecuTorch", **hub)
    assert "base-8da4w.ptd" in first.files
    second = push(from_dir=str(exported_pair[1]), repo_id="alice/tones-ExecuTorch", **hub)
    assert "lora-tone-b-8da4w.pte" in second.files and "base-8da4w.ptd" not in second.files
    assert "base-8da4w.ptd" in second.unchanged

    listed = list_variants("alice/tones-ExecuTorch", **hub)
    assert {v.file for v in listed.variants} >= {"lora-tone-a-8da4w.pte", "lora-tone-b-8da4w.pte"}
    code, out, _ = run_cli(["ls", "alice/tones-ExecuTorch", "--endpoint", local_hub.endpoint], capsys)
    said = " ".join(out.split())
    assert code == 0 and "adapter tone-b: this file" in said and "the same for every adapter of the base" in said

    folder = pull("alice/tones-ExecuTorch", variant="lora-tone-b-8da4w.pte", output_dir=tmp_path / "pulled", **hub)
    assert (folder / "base-8da4w.ptd").is_file()  # checked against the manifest's sha256 as it came
    assert generate(folder / "lora-tone-b-8da4w.pte", folder, "Once upon a time", max_new_tokens=3,
                    chat=False).generated_tokens >= 1  # fmt: skip

    # An adapter of another base, or the same base with other bytes, may not join: its programs need other files.
    for name, change in (("holds adapters of", "base"), ("differs from the one", "data")):
        other = tmp_path / f"other-{change}"
        shutil.copytree(exported_pair[1], other)
        manifest = Manifest.read(other)
        if change == "base":
            manifest.source["adapter"]["base"] = "someone/another-base"
        else:
            (other / "base-8da4w.ptd").write_bytes((other / "base-8da4w.ptd").read_bytes()[:-1] + b"\0")
            for variant in manifest.variants:
                variant.data_sha256 = _sha(other / "base-8da4w.ptd")
        manifest.write(other)
        with pytest.raises(InputError, match=name):
            push(from_dir=str(other), repo_id="alice/tones-ExecuTorch", **hub)
