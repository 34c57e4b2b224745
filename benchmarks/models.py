"""Benchmark models: real shapes, random weights, built offline."""

from __future__ import annotations

from pathlib import Path


def smollm2_135m_config():
    """SmolLM2-135M's shape: Llama, hidden 576, 30 layers, 9 heads / 3 KV heads, tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


def gemma3_270m_config(layers: int | None = None):
    """Gemma 3 270M's text config (18 layers: 5 sliding per global, window 512, one KV head of 256)."""
    from transformers import Gemma3TextConfig

    count = layers or 18
    return Gemma3TextConfig(
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=count,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        sliding_window=512,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(count)],
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        query_pre_attn_scalar=256,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def qwen3_0_6b_config(layers: int | None = None):
    """Qwen3-0.6B's shape (hidden 1024, 16 heads / 8 KV heads of 128, QK-norm, tied embeddings of 151,936 rows)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers or 28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def build_smollm2_shaped(folder: str | Path) -> Path:
    """Save the random-weight SmolLM2-135M-shaped model with a tokenizer covering its vocabulary."""
    return build_shaped(folder, smollm2_135m_config())


def build_shaped(folder: str | Path, config) -> Path:
    """Save a random-weight model of ``config``'s shape with a tokenizer covering its vocabulary."""
    from hub_export.models.tiny import build_tiny_model

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    build_tiny_model(folder, config=config)
    _tokenizer(folder, config.vocab_size, None)
    return folder


def smollm2_360m_config():
    """SmolLM2-360M's shape: Llama, hidden 960, 32 layers, 15 heads / 5 KV heads, tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def smollm2_1_7b_config():
    """SmolLM2-1.7B's shape: Llama, hidden 2048, 24 layers, 32 heads (no grouping), intermediate 8192, tied."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=8192, rope_theta=130000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def qwen3_4b_config():
    """Qwen3-4B's shape: hidden 2560, 36 layers, 32 heads / 8 KV heads of 128, QK-norm, intermediate 9728, tied
    embeddings of 151,936 rows."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
    )  # fmt: skip


def llama3_2_1b_config():
    """Llama 3.2 1B's shape: hidden 2048, 16 layers, 32 heads / 8 KV heads of 64, intermediate 8192, llama3 rope
    scaling (factor 32 over 8192 original positions), tied embeddings of 128,256 rows."""
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}  # fmt: skip
    return LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=rope,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
    )  # fmt: skip


def gemma3_1b_config():
    """Gemma 3 1B's text shape: hidden 1152, 26 layers (5 sliding per global, window 512), 4 heads / 1 KV head of
    256, intermediate 6912, tied embeddings of 262,144 rows."""
    from transformers import Gemma3TextConfig

    layers = 26
    return Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
        max_position_embeddings=32768, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=256, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        tie_word_embeddings=True,
    )  # fmt: skip


SHARD_BYTES = 2 << 30  # checkpoint shards as the Hub writes them (a few GB each)


def build_large_shaped(
    folder: str | Path, config, dtype: str = "bfloat16", tokenizer_folder: Path | None = None
) -> Path:
    """Save a random-weight checkpoint of ``config``'s shape one tensor at a time (a 4B model never in memory):
    safetensors shards in ``dtype`` (the Hub's checkpoints are bfloat16) with their index, normal(0, 0.02) weights,
    norms and biases as the model initialises them, and the tokenizer of ``tokenizer_folder`` (a real one) or the
    demo tokenizer padded to the vocabulary. Returns the folder; an existing one is kept."""
    import json

    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    names = dict(model.named_parameters())  # tied weights once
    generator = torch.Generator().manual_seed(0)
    weight_map, shard, shard_bytes, shards = {}, {}, 0, []

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            shards.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

    for name, param in names.items():
        if param.dim() == 1:
            tensor = _initial_vector(model, name)
        else:
            tensor = torch.empty(param.shape).normal_(0.0, 0.02, generator=generator)
        shard[name] = tensor.to(getattr(torch, dtype)).contiguous()
        shard_bytes += shard[name].numel() * shard[name].element_size()
        if shard_bytes >= SHARD_BYTES:
            flush()
    flush()
    total = sum(p.numel() * torch.tensor([], dtype=getattr(torch, dtype)).element_size() for p in names.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.dtype = dtype
    config.save_pretrained(folder)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=[config.eos_token_id]).save_pretrained(folder)
    _tokenizer(folder, config.vocab_size, tokenizer_folder)
    return folder


def _initial_vector(model, name: str):
    """A 1-D parameter as the model's own initialisation leaves it: a norm at its identity scale (1 where the norm
    multiplies by its weight, 0 for Gemma's ``1 + weight``), a bias at 0. Ones everywhere would double every
    Gemma norm, and a random 26-layer stack with doubled norms is chaotic: a 1e-3 relative change of its input
    moves the top token at many positions, so no compiled program could match its eager logits."""
    import torch

    owner, _, attribute = name.rpartition(".")
    module = model.get_submodule(owner)
    module.to_empty(device="cpu", recurse=False)
    with torch.no_grad():
        getattr(module, attribute).fill_(float("nan"))
    model._init_weights(module)
    vector = getattr(module, attribute).detach().clone()
    module.to("meta")
    if vector.isnan().any():
        raise ValueError(f"{type(module).__name__} leaves {name} uninitialised")
    return vector


def _tokenizer(folder: Path, vocab_size: int, real: Path | None) -> None:
    """Copy the ``real`` tokenizer's files into ``folder``, or save the demo tokenizer there padded with added
    tokens to ``vocab_size``, so every id the model can emit decodes (the runner looks each generated id up)."""
    import shutil

    from hub_export.models.tiny import train_tokenizer

    if real is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if (real / name).is_file():
                shutil.copy(real / name, folder / name)
        return
    tokenizer = train_tokenizer()
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(vocab_size - tokenizer.get_vocab_size())])
    tokenizer.save(str(folder / "tokenizer.json"))


def phi4_mini_config():
    """Phi-4-mini's shape (3.8B): Phi-3 layout with fused qkv and gate/up projections, hidden 3072, 32 layers,
    24 heads / 8 KV heads of 128, partial rotary 0.75 with longrope, tied embeddings of 200,064 rows. The longrope
    factor vectors (48 each) are not packaged here: an export of at most 4096 positions uses the short factors,
    set to 1.0, which changes neither the graph nor its cost."""
    from transformers import Phi3Config

    rope = {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48}
    return Phi3Config(
        vocab_size=200064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
        num_key_value_heads=8, max_position_embeddings=131072, original_max_position_embeddings=4096,
        rope_theta=10000.0, rope_scaling=rope, partial_rotary_factor=0.75, rms_norm_eps=1e-5, sliding_window=262144,
        tie_word_embeddings=True, bos_token_id=199999, eos_token_id=199999, pad_token_id=199999,
    )  # fmt: skip
