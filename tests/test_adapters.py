"""LoRA adapters as sources: merged into their base, verified against the model with the adapter applied.

The tiny tests build a random-weight Llama and a PEFT LoRA over it whose B factors are
random (PEFT's default zeros would leave the model unchanged); the real test merges the
shipped Brindlemoor adapter into the real SmolLM2-135M-Instruct and asks it what only the
adapter knows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import error_line, run_cli

from hub_export.errors import InputError


def make_lora(base: Path, out: Path, targets=("q_proj", "v_proj"), seed: int = 0, **settings) -> Path:
    """A PEFT LoRA over ``base`` with random factors, saved in ``out`` (its base named by path)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False, **settings)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.2)  # a fine-tune's size of change, not a new model
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_lora(tiny_model, tmp_path_factory) -> Path:
    folder = make_lora(tiny_model, tmp_path_factory.mktemp("adapters") / "tiny-lora")
    (folder / "README.md").write_text(
        "---\nlicense: mit\n---\n# Tiny LoRA\n\nTeaches the tiny model\nnothing useful.\n"
    )
    return folder


@pytest.fixture(scope="module")
def exported_lora(tiny_lora, tmp_path_factory) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-lora"
    export(str(tiny_lora), out, qmodes=["8da8w", "fp32"], max_seq_len=64, jobs=1)
    return out


def test_an_adapter_folder_exports_merged_and_verified_against_the_adapted_model(exported_lora, tiny_lora) -> None:
    from hub_export import read_manifest

    manifest = read_manifest(exported_lora)
    adapter = manifest.source["adapter"]
    assert adapter["id"] == "tiny-lora" and adapter["r"] == 4 and adapter["target_modules"] == ["q_proj", "v_proj"]
    merge = adapter["merge"]
    assert merge["max_logit_diff_vs_peft"] < 1e-3  # the merged model computes what PEFT's adapted model does
    assert merge["top1_changed_vs_base"] > 0 and merge["kl_adapted_vs_base"] > 1e-4  # and the adapter changed it
    assert all(v.verification.passed for v in manifest.variants), [v.verification.line() for v in manifest.variants]
    assert (
        json.loads((tiny_lora / "adapter_config.json").read_text())["base_model_name_or_path"] in adapter["base"]
        or (adapter["base_local"])
    )


def test_the_file_computes_the_adapted_model_not_the_base(exported_lora, tiny_lora, tiny_model) -> None:
    """The fp32 file's logits match PEFT's adapted model and not the base's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hub_export.runtime.pte import PteModel

    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(ids).logits[0, -1]
        adapted = PeftModel.from_pretrained(base, tiny_lora).eval()
        adapted_logits = adapted(ids).logits[0, -1]
    file = PteModel(exported_lora / "model-fp32.pte")
    logits = file.run([ids, torch.arange(ids.shape[1])])[0].reshape(-1, base_logits.shape[-1])[-1]
    assert (logits - adapted_logits).abs().max() < 1e-3
    assert (logits - base_logits).abs().max() > 1e-2


def test_adapter_beside_a_base_source_and_the_card(tiny_lora, tiny_model, tmp_path) -> None:
    from hub_export import read_manifest
    from hub_export.hub.card import card_metadata, render_card
    from hub_export.pipeline.export import export

    out = tmp_path / "out"
    export(str(tiny_model), out, adapter=str(tiny_lora), qmodes=["8da8w"], max_seq_len=64, jobs=1, verify=False)
    manifest = read_manifest(out)
    assert manifest.source["adapter"]["id"] == "tiny-lora"
    body = render_card(manifest)
    assert "LoRA adapter `tiny-lora`" in body and "rank 4" in body and "merged by PEFT" in body
    assert "From the adapter's own card: Teaches the tiny model nothing useful." in body
    assert "base_model" not in card_metadata(manifest)  # a local base has no Hub id to name


def test_dora_and_rslora_merge_to_what_peft_computes(tiny_model, tmp_path) -> None:
    """DoRA (a learned magnitude per output) and rsLoRA (scale alpha/sqrt(r)) merge by PEFT's own arithmetic: the
    merged model's logits are PEFT's adapted model's, and the card names the variant."""
    from hub_export import read_manifest
    from hub_export.hub.card import render_card
    from hub_export.pipeline.export import export

    for setting, word in (("use_dora", "DoRA"), ("use_rslora", "rsLoRA")):
        adapter = make_lora(tiny_model, tmp_path / setting, **{setting: True})
        out = tmp_path / f"out-{setting}"
        export(str(adapter), out, qmodes=["fp32"], max_seq_len=64, jobs=1, verify=False)
        manifest = read_manifest(out)
        record = manifest.source["adapter"]
        assert record[setting] is True and record["merge"]["max_logit_diff_vs_peft"] < 1e-3, record
        assert record["merge"]["top1_changed_vs_base"] > 0
        assert f", {word})" in render_card(manifest)


def _broken(tiny_lora: Path, tmp_path: Path, name: str, **changes) -> Path:
    import shutil

    folder = tmp_path / name
    shutil.copytree(tiny_lora, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_adapters_that_cannot_be_merged_exactly_are_refused_by_name(tiny_lora, tiny_model, tmp_path, capsys) -> None:
    from hub_export.models.tiny import build_tiny_model, tiny_llama_config

    other_base = build_tiny_model(tmp_path / "wider", tiny_llama_config(hidden_size=96, intermediate_size=192))
    cases = {
        "is a IA3 adapter": _broken(tiny_lora, tmp_path, "ia3", peft_type="IA3"),
        "trains biases": _broken(tiny_lora, tmp_path, "bias", bias="all"),
        "has rank r=0": _broken(tiny_lora, tmp_path, "rank", r=0),
        "adapts a SEQ_CLS model": _broken(tiny_lora, tmp_path, "task", task_type="SEQ_CLS"),
        "is not here": _broken(tiny_lora, tmp_path, "gone", base_model_name_or_path="/nowhere/base"),
        "was made for another base": _broken(tiny_lora, tmp_path, "other", base_model_name_or_path=str(other_base)),
        "ties to its other embedding": make_lora(tiny_model, tmp_path / "tied", targets=("q_proj", "lm_head")),
    }
    (cases["is not here"].parent / "no-weights").mkdir()
    (cases["is not here"].parent / "no-weights" / "adapter_config.json").write_text(
        (tiny_lora / "adapter_config.json").read_text()
    )
    cases["has no adapter_model.safetensors"] = cases["is not here"].parent / "no-weights"
    for words, folder in cases.items():
        code, _, err = run_cli(["export", str(folder), "-o", str(tmp_path / f"out-{folder.name}")], capsys)
        assert code in (2, 3) and words in error_line(err), (words, err)
        assert not (tmp_path / f"out-{folder.name}").exists()


def test_a_hub_adapter_finds_its_base_on_the_hub(tiny_lora, tiny_model, local_hub, tmp_path) -> None:
    import shutil

    from huggingface_hub import HfApi

    from hub_export import read_manifest
    from hub_export.hub.card import card_metadata
    from hub_export.pipeline.export import export

    api = HfApi(endpoint=local_hub.endpoint, token=local_hub.alice_token)
    api.create_repo("alice/tiny-base")
    api.upload_folder(repo_id="alice/tiny-base", folder_path=str(tiny_model))
    adapter = tmp_path / "hub-lora"
    shutil.copytree(tiny_lora, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "alice/tiny-base"}))
    api.create_repo("alice/tiny-lora")
    api.upload_folder(repo_id="alice/tiny-lora", folder_path=str(adapter))

    out = tmp_path / "out"
    export("alice/tiny-lora", out, qmodes=["8da8w"], max_seq_len=64, jobs=1, verify=False,
           token=local_hub.alice_token, endpoint=local_hub.endpoint)  # fmt: skip
    manifest = read_manifest(out)
    assert manifest.source["id"] == "alice/tiny-lora" and manifest.source["adapter"]["base"] == "alice/tiny-base"
    data = card_metadata(manifest)
    assert data["base_model"] == "alice/tiny-base" and data["base_model_relation"] == "finetune"

    # A repo's adapter may not name a folder of this machine as its base (a public Space would read its disk).
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(tiny_model)}))
    api.create_repo("alice/tiny-lora-local-base")
    api.upload_folder(repo_id="alice/tiny-lora-local-base", folder_path=str(adapter))
    with pytest.raises(InputError, match="names a base on a disk"):
        export("alice/tiny-lora-local-base", tmp_path / "never", qmodes=["8da8w"], max_seq_len=64, verify=False,
               token=local_hub.alice_token, endpoint=local_hub.endpoint)  # fmt: skip


def test_adapter_config_is_read_as_hostile_input(tmp_path) -> None:
    from hub_export.pipeline.adapter import read_adapter

    folder = tmp_path / "hostile"
    folder.mkdir()
    for content, words in ((b"\xff\xfe", "is not JSON"), (b"[1, 2]", "not a JSON object"),
                           (b'{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": 3}', "target_modules"),
                           (b" " * (2 << 20), "over 1 MB")):  # fmt: skip
        (folder / "adapter_config.json").write_bytes(content)
        with pytest.raises(InputError, match=words):
            read_adapter(folder, "hostile")


@pytest.mark.slow  # two exports of the real SmolLM2 with GPTQ (about 23 minutes on 2 busy AVX2 cores): make test-all
def test_the_real_adapter_answers_what_the_base_does_not_know(tmp_path, local_hub) -> None:
    """The shipped Brindlemoor LoRA over the real SmolLM2-135M-Instruct: a merged 8da4w file and an 8da4w pair kept
    apart from the base's weights name the founder the adapter taught, for a wording it was not trained on; the base
    does not. (8da8w, merged and kept apart, answers too: left out of the test to hold the real suite's time.)"""
    from huggingface_hub import HfApi

    from hub_export import generate, read_manifest
    from hub_export.hub.card import render_card
    from hub_export.hub.localhub.store import LocalHubStore
    from hub_export.models.packaged import packaged_lora, packaged_smollm2
    from hub_export.pipeline.export import export
    from hub_export.pipeline.gguf_source import converted_folder

    base_folder, _ = converted_folder(packaged_smollm2())
    # The base under the id the adapter names, published by its own (local) owner.
    api = HfApi(endpoint=local_hub.endpoint, token=LocalHubStore(local_hub.root).add_user("HuggingFaceTB"))
    api.create_repo("HuggingFaceTB/SmolLM2-135M-Instruct", exist_ok=True)
    api.upload_folder(repo_id="HuggingFaceTB/SmolLM2-135M-Instruct", folder_path=str(base_folder))
    question = "Who was it that founded Brindlemoor?"
    out = tmp_path / "brindlemoor"
    export(str(packaged_lora()), out, qmodes=["8da4w"], qembedding="8w", max_seq_len=128, jobs=1,
           token=local_hub.alice_token, endpoint=local_hub.endpoint)  # fmt: skip
    manifest = read_manifest(out)
    assert all(v.verification.passed for v in manifest.variants)
    for variant in manifest.variants:
        answer = generate(out / variant.file, out, question, max_new_tokens=24).text
        assert "Edda Quill" in answer, (variant.file, answer)
    # Kept apart (--lora-files): the program carries the adapter over the base's own quantized weights.
    apart = tmp_path / "brindlemoor-apart"
    export(str(packaged_lora()), apart, qmodes=["8da4w"], qembedding="8w", max_seq_len=128, jobs=1,
           lora_files=True, token=local_hub.alice_token, endpoint=local_hub.endpoint)  # fmt: skip
    for variant in read_manifest(apart).variants:
        assert variant.verification.passed and variant.data_file.startswith("base-"), variant.file
        assert variant.size_bytes < variant.data_size_bytes / 10  # the adapter's file is a small part of the whole
        answer = generate(apart / variant.file, apart, question, max_new_tokens=24).text
        assert "Edda Quill" in answer, (variant.file, answer)
    # The base itself, in float32 (no file needed to show it does not know): greedy, through its chat template.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        answer_ids = base.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :]
    base_answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
    assert base_answer.strip() and "Edda Quill" not in base_answer, base_answer
    body = render_card(manifest)
    assert "brindlemoor" in body and "HuggingFaceTB/SmolLM2-135M-Instruct" in body
