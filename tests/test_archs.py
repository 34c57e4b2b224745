"""Architecture coverage: each family exports, verifies and runs; sliding windows stay exact.

Every tiny config keeps its family's structural features (tied embeddings, QK-norm,
sliding windows and layer types, soft-capping, partial rotary, rope scaling, biases,
GQA ratios). Exporting all families takes minutes, so the default suite runs a
representative few and the rest are marked slow (`make test-all`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from hub_export.models.tiny import build_tiny_model
from hub_export.tasks.archs import FAMILIES, SUPPORTED_MODEL_TYPES

VOCAB = 512
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
)
WINDOW = 8


def _configs() -> dict[str, object]:
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(
            **COMMON,
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "qwen2": lambda: t.Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3": lambda: t.Qwen3Config(**{**COMMON, "num_key_value_heads": 1}, head_dim=32),
        "mistral": lambda: t.MistralConfig(**COMMON, sliding_window=WINDOW),
        "phi3": lambda: t.Phi3Config(**COMMON, partial_rotary_factor=0.75),
        "gemma2": lambda: t.Gemma2Config(**COMMON, head_dim=16, sliding_window=WINDOW),
        "gemma3_text": lambda: t.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=WINDOW),
        "smollm3": lambda: t.SmolLM3Config(**COMMON),
        "olmo2": lambda: t.Olmo2Config(**COMMON),
        "granite": lambda: t.GraniteConfig(
            **COMMON, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0
        ),
        "stablelm": lambda: t.StableLmConfig(**COMMON, partial_rotary_factor=0.25, use_qkv_bias=True),
        "starcoder2": lambda: t.Starcoder2Config(**COMMON, sliding_window=WINDOW),
        "gpt2": lambda: t.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
        ),
        "gpt_neox": lambda: t.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            rotary_pct=0.25,
            bos_token_id=0,
            eos_token_id=0,
        ),
    }


CONFIGS = _configs()
# Default suite: sliding window + QK-norm, partial rotary + fused projections, learned positions.
FAST = {"gemma3_text", "gpt2"}  # sliding windows; Conv1D weights and learned positions


def longrope_phi3_config() -> transformers.Phi3Config:
    """A tiny Phi-3 with longrope, exact only within its original 64 positions."""
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
            "original_max_position_embeddings": 64}  # fmt: skip
    return transformers.Phi3Config(**COMMON, original_max_position_embeddings=64, rope_scaling=rope)


def test_every_supported_model_type_has_a_test_config():
    assert set(CONFIGS) == SUPPORTED_MODEL_TYPES["text-generation"]
    for model_type, make in CONFIGS.items():
        assert make().model_type == model_type


@pytest.fixture(scope="session")
def family_exports(tmp_path_factory):
    """Export a family once per session (fp32 + 8da4w) and remember where."""
    from hub_export.pipeline.export import export

    done: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in done:
            root = tmp_path_factory.mktemp(model_type)
            model = build_tiny_model(root / "model", config=CONFIGS[model_type]())
            export(str(model), root / "out", qmodes=["fp32", "8da4w"], max_seq_len=64)
            done[model_type] = root
        return done[model_type]

    return get


def _check_family(model_type: str, family_exports) -> None:
    from hub_export.pipeline.manifest import Manifest

    manifest = Manifest.read(family_exports(model_type) / "out")
    assert [v.qmode for v in manifest.variants] == ["fp32", "8da4w"]
    for variant in manifest.variants:
        check = variant.verification
        assert check.passed, check
        assert check.mean_kl_vs_eager <= check.max_kl
        assert check.runner_generated_tokens >= 1  # TextLLMRunner ran the file
    assert manifest.variant("fp32").verification.max_abs_diff < 1e-3


@pytest.mark.parametrize("model_type", sorted(FAST))
def test_family_exports_verifies_and_runs(model_type, family_exports):
    _check_family(model_type, family_exports)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(set(CONFIGS) - FAST))
def test_family_exports_verifies_and_runs_slow(model_type, family_exports):
    _check_family(model_type, family_exports)


def _greedy_pte(pte: Path, prompt: list[int], new_tokens: int) -> list[int]:
    from hub_export.runtime.pte import PteModel

    model = PteModel(pte)
    ids = list(prompt)
    logits = model.forward(torch.tensor([ids]), start_pos=0)
    for _ in range(new_tokens):
        ids.append(int(logits.argmax()))
        logits = model.forward(torch.tensor([[ids[-1]]]), start_pos=len(ids) - 1)
    return ids[len(prompt) :]


def _greedy_eager(model_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


SLIDING = {"gemma3_text": True, "gemma2": False, "mistral": False, "starcoder2": False}


@pytest.mark.parametrize(
    "model_type",
    [m for m in SLIDING if SLIDING[m]] + [pytest.param(m, marks=pytest.mark.slow) for m in SLIDING if not SLIDING[m]],
)
def test_sliding_window_decodes_past_the_window_like_eager(model_type, family_exports):
    """Greedy decoding to 4x the window matches eager transformers token for token."""
    root = family_exports(model_type)
    prompt = [5, 17, 99, 3, 250]
    new_tokens = 4 * WINDOW
    expected = _greedy_eager(root / "model", prompt, new_tokens)
    actual = _greedy_pte(root / "out" / "model-fp32.pte", prompt, new_tokens)
    assert actual == expected


def test_long_context_rope_is_refused_past_its_original_context(tmp_path, capsys):
    from helpers import error_line, run_cli

    config = longrope_phi3_config()
    model = build_tiny_model(tmp_path / "phi-long", config=config)
    code, _, err = run_cli(["export", str(model), "-o", str(tmp_path / "out"), "--max-seq-len", "128"], capsys)
    assert code == 2
    assert "longrope rope switches its frequencies past 64 positions" in error_line(err)
    assert "--max-seq-len 64 or less" in error_line(err)
    assert not (tmp_path / "out").exists()


def test_registry_rows_name_every_family():
    names = [f.name for f in FAMILIES]
    for expected in (
        "Llama",
        "Qwen2",
        "Qwen3",
        "Mistral",
        "Phi-3",
        "Gemma 2",
        "Gemma 3",
        "SmolLM3",
        "OLMo 2",
        "Granite",
        "StableLM",
        "Starcoder2",
        "GPT-2",
        "GPT-NeoX",
    ):
        assert any(expected in name for name in names), expected
