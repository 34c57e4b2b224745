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
    from hub_export.demo import build_tiny_model, train_tokenizer

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    build_tiny_model(folder, config=config)
    # The demo tokenizer has 512 tokens; pad it with added tokens so every id the model
    # can emit decodes (the runner looks each generated id up).
    tokenizer = train_tokenizer()
    missing = config.vocab_size - tokenizer.get_vocab_size()
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(missing)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder
