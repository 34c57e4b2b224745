"""A GGUF checkpoint becomes a float32 safetensors folder a tensor at a time, with exactly transformers' weights."""

from __future__ import annotations

import json


def test_a_gguf_converts_a_tensor_at_a_time_to_exactly_what_transformers_loads(tmp_path, monkeypatch):
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline import gguf_source

    gguf = (
        packaged_smollm2()
    )  # the real SmolLM2-135M-Instruct, Q4_1: its q/k rows are permuted back as transformers does
    monkeypatch.setattr(gguf_source, "SHARD_BYTES", 64 << 20)  # several shards, as a large model writes
    monkeypatch.setenv("HUB_EXPORT_CACHE", str(tmp_path / "cache"))
    folder, record = gguf_source.converted_folder(gguf)
    assert record["quantization"] == "Q4_1"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted({name for name in index["weight_map"].values()})
    assert len(shards) > 3 and shards[-1].endswith(f"-of-{len(shards):05d}.safetensors")
    assert sorted(path.name for path in folder.glob("*.safetensors")) == shards
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # transformers' loader names the tensors after a model
    expected = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    assert set(index["weight_map"]) == set(expected)
    for name, tensor in expected.items():
        with safe_open(str(folder / index["weight_map"][name]), "pt") as shard:
            assert torch.equal(shard.get_tensor(name), tensor.float()), name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (folder / "generation_config.json").is_file() and (folder / "tokenizer.json").is_file()


def test_a_gguf_whose_tensors_do_not_map_one_to_one_converts_through_the_whole_model(tmp_path, monkeypatch):
    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline import gguf_source

    monkeypatch.setattr(gguf_source, "_ONE_TO_ONE", set())  # as a mixture-of-experts model's processor
    monkeypatch.setenv("HUB_EXPORT_CACHE", str(tmp_path / "cache"))
    folder, _ = gguf_source.converted_folder(packaged_smollm2())
    assert (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").exists()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
