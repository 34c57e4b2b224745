"""KV cache layouts: ring buffers, int8 values and attention sinks stay what eager computes, and say what they cost.

The eager checks run the wrapper (the code that is exported) against transformers' own
eager attention; the exported checks run the ``.pte`` in the ExecuTorch runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers import error_line, run_cli
from test_archs import COMMON, longrope_phi3_config

from hub_export.models.tiny import build_tiny_model
from hub_export.tasks.text_generation.kv_cache import plan_layers

WINDOW = 8
SINK, SINK_WINDOW = 4, 12
CHUNKINGS = ([40], [5] + [1] * 35, [12, 20, 8], [30, 10])  # chunks longer than the ring included


def gemma3_config():
    """One sliding layer (ring) and one global layer (linear cache)."""
    return transformers.Gemma3TextConfig(
        **COMMON, head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]
    )


def _eager(config):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def _wrapped_rows(model, layout, ids: torch.Tensor, chunks: list[int]) -> list[tuple[int, torch.Tensor]]:
    """(position, logits) after each chunk, fed through the exportable wrapper in eager mode."""
    from hub_export.tasks.text_generation.export import ExportableDecoder

    wrapped = ExportableDecoder(model, layout.max_seq_len, layout)
    rows, position = [], 0
    with torch.no_grad():
        for chunk in chunks:
            out = wrapped(ids[:, position : position + chunk], torch.arange(position, position + chunk))
            position += chunk
            rows.append((position - 1, out[0, -1]))
    return rows


def sink_reference(model, ids: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """What a sink file must compute, built from transformers' eager model: every position visible while it is
    among the first ``sink`` or the last ``window``, rope positions wrapped as ExecuTorch's export_llm wraps them."""
    n = ids.shape[1]
    q, k = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    visible = (k <= q) & ((k < sink) | (q - k < window))
    mask = torch.where(visible, 0.0, float("-inf")).view(1, 1, n, n)
    # Written out here rather than taken from hub_export: the reference must not share the code it checks.
    pos = torch.arange(n)
    positions = torch.where(pos < sink, pos, sink + (pos - sink) % window).view(1, -1)
    with torch.no_grad():
        return model(input_ids=ids, position_ids=positions, attention_mask=mask).logits[0]


# -- eager: the wrapper's math ---------------------------------------------------------------


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=["prompt", "token-by-token", "chunks", "long-chunk"])
def test_ring_cache_is_exact_for_any_chunking(chunks):
    config = gemma3_config()
    model = _eager(config)
    layout = plan_layers(config, 64)
    assert [layer.ring for layer in layout.layers] == [True, False] and layout.layers[0].slots == WINDOW
    ids = torch.randint(1, 512, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=ids).logits[0]
    for position, row in _wrapped_rows(model, layout, ids, chunks):
        assert (row - expected[position]).abs().max() < 1e-5, position


def test_int8_cache_stays_close_to_eager():
    config = gemma3_config()
    model = _eager(config)
    ids = torch.randint(1, 512, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=ids).logits[0], -1)
    rows = _wrapped_rows(model, plan_layers(config, 64, dtype="int8"), ids, [1] * 40)
    actual = torch.log_softmax(torch.stack([row for _, row in rows]), -1)
    kl = (expected.exp() * (expected - actual)).sum(-1)
    assert kl.max() < 1e-3
    assert (actual.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.95
    assert (actual - expected).abs().max() > 1e-6  # it really is quantized


@pytest.mark.parametrize("chunks", [[15] + [1] * 45, [5] * 12, [10, 1, 1, 30, 18]], ids=["decode", "chunks", "long"])
def test_attention_sink_matches_its_eager_reference_past_the_cache(chunks):
    config = transformers.LlamaConfig(**COMMON)
    model = _eager(config)
    ids = torch.randint(1, 512, (1, 60), generator=torch.Generator().manual_seed(2))
    expected = sink_reference(model, ids, SINK, SINK_WINDOW)
    with torch.no_grad():
        plain = model(input_ids=ids).logits[0]
    assert (expected[-1] - plain[-1]).abs().max() > 1e-3  # the reference is not plain attention
    layout = plan_layers(config, SINK + SINK_WINDOW, sink=(SINK, SINK_WINDOW))
    assert layout.unbounded and all(layer.slots == SINK + SINK_WINDOW for layer in layout.layers)
    for position, row in _wrapped_rows(model, layout, ids, chunks):
        assert (row - expected[position]).abs().max() < 1e-5, position


def test_gemma3_270m_cache_at_8k_tokens_shrinks_from_302_to_17_mb():
    """The issue's arithmetic, from the layouts: 18 x 8192 x 256 x 2 x 4 B with full fp32 caches; ring buffers
    on the 15 sliding layers and int8 values (plus a scale and zero point per row) leave about 16 MB."""
    from benchmarks.models import gemma3_270m_config

    config = gemma3_270m_config()
    full = plan_layers(config, 8192, "full", "fp32")
    ring = plan_layers(config, 8192, "ring", "fp32")
    small = plan_layers(config, 8192, "ring", "int8")
    assert full.bytes_at_full_context() == 18 * 8192 * 256 * 2 * 4 == 301_989_888
    assert sum(layer.ring for layer in ring.layers) == 15
    assert ring.bytes_at_full_context() == (3 * 8192 + 15 * 512) * 256 * 2 * 4
    assert small.bytes_at_full_context() == (3 * 8192 + 15 * 512) * (256 + 5) * 2 == 16_837_632
    assert small.bytes_per_token() == 3 * (256 + 5) * 2  # only the global layers grow with context
    assert full.to_dict()["bytes_per_token"] == 18 * 256 * 2 * 4


# -- refused at the start ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("sink") / "llama", config=transformers.LlamaConfig(**COMMON))


@pytest.mark.parametrize("args, message", [
    (["--attention-sink", "4"], "--attention-sink takes SINK,WINDOW, two whole numbers such as 4,2044"),
    (["--attention-sink", "4,12", "--sliding-cache", "full"], "cannot keep --sliding-cache full"),
    (["--attention-sink", "4,12", "--max-seq-len", "64"], "sets the cache size (SINK+WINDOW positions); drop --max-seq-len"),
    (["--attention-sink", "4,300"], "--attention-sink 4,300 needs 304 positions; the model has 256"),
    (["--kv-cache", "int4"], "unknown --kv-cache 'int4'; choose from fp32, int8"),
    (["--sliding-cache", "window"], "unknown --sliding-cache 'window'; choose from ring, full"),
])  # fmt: skip
def test_impossible_cache_options_are_one_line_refusals(llama_dir, tmp_path, capsys, args, message):
    code, _, err = run_cli(["export", str(llama_dir), "-o", str(tmp_path / "out"), "--no-verify", *args], capsys)
    assert code == 2
    assert message in error_line(err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", ["gpt2", "phi3-longrope"])
def test_attention_sink_is_refused_where_positions_cannot_wrap(tmp_path, capsys, model_type):
    if model_type == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
        )
        expected = "gpt2 has learned absolute positions instead of rope"
    else:
        config = longrope_phi3_config()
        expected = "cannot work with longrope rope"
    model = build_tiny_model(tmp_path / "model", config=config)
    code, _, err = run_cli(["export", str(model), "-o", str(tmp_path / "out"), "--attention-sink", "4,12"], capsys)
    assert code == 2 and expected in error_line(err)
    assert not (tmp_path / "out").exists()


# -- exported: the .pte in the ExecuTorch runtime ----------------------------------------------


@pytest.fixture(scope="module")
def sink_export(llama_dir, tmp_path_factory) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("sink-out") / "out"
    export(str(llama_dir), out, qmodes=["fp32"], attention_sink=f"{SINK},{SINK_WINDOW}", quality_tokens=64)
    return out


def test_sink_file_matches_the_eager_reference_past_its_cache(sink_export, llama_dir):
    from hub_export.runtime.pte import PteModel

    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, attn_implementation="eager").eval()
    ids = torch.randint(1, 512, (1, 60), generator=torch.Generator().manual_seed(3))
    expected = sink_reference(model, ids, SINK, SINK_WINDOW)
    pte = PteModel(sink_export / "model-fp32.pte")
    assert pte.metadata["get_max_seq_len"] == SINK + SINK_WINDOW
    assert pte.metadata["get_max_context_len"] > 10**6
    position = 0
    for chunk in [15, 1, 1, 10, 1, 15, 1, 1, 15]:  # 60 tokens, every forward within the file's chunk limit
        row = pte.forward(ids[:, position : position + chunk], start_pos=position)
        position += chunk
        assert (row - expected[position - 1]).abs().max() < 1e-4, position


def test_sink_file_generates_past_its_cache_in_both_runners(sink_export, capsys):
    from hub_export.runtime.pte import runner_generate

    stats = runner_generate(sink_export / "model-fp32.pte", sink_export / "tokenizer.json", "Once upon a time", 40)
    assert stats["generated_tokens"] >= 39 > SINK + SINK_WINDOW
    # A prompt longer than the cache (the chat template makes it so) is prefilled in chunks.
    code, out, err = run_cli(
        ["generate", str(sink_export / "model-fp32.pte"), "-p", "Once upon a time there was", "--max-new-tokens", "40"],
        capsys,
    )
    assert code == 0, err
    err = " ".join(err.split())  # the terminal may wrap the summary line
    assert "generated 40 tok" in err and "stop: max_new_tokens" in err
    prompt_tokens = int(err.split("prompt ")[1].split(" tok")[0])
    assert prompt_tokens > SINK + SINK_WINDOW  # prefilled in chunks


def test_manifest_and_card_state_the_cache_and_the_memory(sink_export):
    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    manifest = Manifest.read(sink_export)
    variant = manifest.variant("fp32")
    assert variant.verification.verified
    cache = variant.kv_cache
    assert cache["attention_sink"] == [SINK, SINK_WINDOW] and cache["dtype"] == "fp32"
    assert (
        cache["bytes_at_full_context"] == 2 * (SINK + SINK_WINDOW) * 2 * 2 * 16 * 4
    )  # layers x slots x K,V x heads x dim x 4 B
    memory = variant.runtime_memory
    assert memory["context_tokens"] > SINK + SINK_WINDOW and memory["peak_rss_bytes"] > 0
    card = render_card(manifest)
    assert "| Memory at full context |" in card.replace("Max context | KV cache | Memory", "| Memory")
    assert "unbounded (sink 4 + window 12)" in card and "**Attention sink**" in card


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory) -> tuple[Path, Path]:
    from hub_export.pipeline.export import export

    root = tmp_path_factory.mktemp("int8")
    model = build_tiny_model(root / "gemma3", config=gemma3_config())
    export(str(model), root / "out", qmodes=["fp32"], kv_cache="int8", max_seq_len=64, quality_tokens=128)
    return model, root / "out"


def test_int8_cache_file_passes_verification_and_reports_its_cost(int8_export):
    from hub_export.pipeline.manifest import Manifest

    variant = Manifest.read(int8_export[1]).variant("fp32")
    check = variant.verification
    assert check.verified and check.quality is not None
    assert 0 < check.mean_kl_vs_eager < 0.1  # the cache's rounding shows in the figures, within the dynamic bound
    assert variant.kv_cache["dtype"] == "int8" and variant.kv_cache["ring_layers"] == 1
    fp32_bytes = plan_layers(gemma3_config(), 64, "ring", "fp32").bytes_at_full_context()
    assert variant.kv_cache["bytes_at_full_context"] < 0.4 * fp32_bytes


def test_int8_cache_file_decodes_past_the_window_close_to_eager(int8_export):
    from hub_export.runtime.pte import PteModel

    model_dir, out = int8_export
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = torch.randint(1, 512, (1, 4 * WINDOW), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=ids).logits[0], -1)
    pte = PteModel(out / "model-fp32.pte")
    rows = [pte.forward(ids[:, :1], start_pos=0)] + [
        pte.forward(ids[:, p : p + 1], start_pos=p) for p in range(1, ids.shape[1])
    ]
    actual = torch.log_softmax(torch.stack(rows), -1)
    assert (expected.exp() * (expected - actual)).sum(-1).max() < 1e-3
    # Where the file picks another token, eager rated it within a near-tie of its own pick (random weights).
    gap = expected.max(-1).values - expected.gather(-1, actual.argmax(-1, keepdim=True)).squeeze(-1)
    assert gap.max() < 0.02


# -- hostile manifests ------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("kv_cache", {"dtype": "fp16"}, "kv_cache has an unknown dtype"),
    ("kv_cache", {"bytes_at_full_context": -1}, "bytes_at_full_context is -1, not a count"),
    ("kv_cache", {"evil": 1}, "kv_cache has unknown key 'evil'"),
    ("runtime_memory", {"peak_rss_bytes": "a lot"}, "peak_rss_bytes is 'a lot', not a count"),
    ("runtime_memory", [1], "runtime_memory is a list, not an object"),
])  # fmt: skip
def test_a_hostile_memory_record_is_a_one_line_error(sink_export, field, value, message):
    from hub_export.errors import InputError
    from hub_export.pipeline.manifest import Manifest

    data = json.loads((sink_export / "manifest.json").read_text())
    data["variants"][0][field] = value
    with pytest.raises(InputError) as raised:
        Manifest.from_dict(data)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_only_full_caches_are_traced_non_strict():
    """Ring, windowed and sink caches guard on ``min`` over the sequence length, which only TorchDynamo's tracing can prove."""
    from hub_export.tasks.text_generation.export import needs_strict_tracing

    config = gemma3_config()
    assert needs_strict_tracing(plan_layers(config, 64))  # a ring layer
    assert needs_strict_tracing(plan_layers(config, 64, "full"))  # no ring, but a sliding window's mask
    llama = transformers.LlamaConfig(**COMMON)
    assert not needs_strict_tracing(plan_layers(llama, 64))
    assert needs_strict_tracing(plan_layers(llama, SINK + SINK_WINDOW, sink=(SINK, SINK_WINDOW)))
