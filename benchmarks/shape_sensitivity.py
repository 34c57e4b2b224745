"""How sensitive a random-weight shape is: whether any compiled program could match its eager logits.

    python -m benchmarks.shape_sensitivity --shapes llama3.2-1b phi4-mini

Verification asks a file's top token to agree with the quantized eager model's at 80% of
positions (near-ties within 0.05 nats counted). Random weights make flat distributions,
and a deep random stack can amplify a rounding anywhere into another top token: then a
file fails that no kernel could pass. For each shape (``benchmarks.scale``'s folders,
built if missing), the float32 eager model runs 256 tokens of the shipped evaluation
text; this prints the logits' spread, the median margin between the top two tokens, and
the share of positions whose top token survives a relative change of 1e-4 and 1e-3 in
the input embeddings. The whole float32 model is loaded (15 GB for Phi-4-mini).

Writes ``results/shape-sensitivity.{json,md}``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.report import write_results
from benchmarks.scale import model_folder, shapes

TOKENS = 256
NOISES = (1e-4, 1e-3)


def sensitivity(key: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hub_export.pipeline.verify import eval_text

    folder = model_folder(key)
    ids = AutoTokenizer.from_pretrained(folder)(eval_text(), return_tensors="pt").input_ids[:, :TOKENS]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(0)

    def logits(noise: float) -> torch.Tensor:
        with torch.no_grad():
            embeds = model.get_input_embeddings()(ids)
            embeds = embeds * (1 + noise * torch.randn(embeds.shape, generator=generator))
            return model(inputs_embeds=embeds).logits[0]

    started = time.perf_counter()
    base = logits(0.0)
    top2 = torch.log_softmax(base, -1).topk(2, -1).values
    row = {
        "shape": shapes()[key][0],
        "layers": model.config.num_hidden_layers,
        "logit_std": round(base.std().item(), 3),
        "median_top_margin_nats": round((top2[:, 0] - top2[:, 1]).median().item(), 3),
        "forward_s": round(time.perf_counter() - started, 1),
    }
    for noise in NOISES:
        moved = logits(noise)
        row[f"top1_kept_{noise:g}"] = round((moved.argmax(-1) == base.argmax(-1)).float().mean().item(), 3)
        row[f"max_logit_change_{noise:g}"] = round((moved - base).abs().max().item(), 4)
    print(row, flush=True)
    return row


def markdown(rows: list[dict], machine: str) -> str:
    head = "| shape | layers | logit std | median top-2 margin (nats) | " + " | ".join(
        f"top token kept at {n:g} | largest logit change at {n:g}" for n in NOISES
    )
    lines = [
        "# How sensitive each random-weight shape is",
        "",
        f"{machine}; `python -m benchmarks.shape_sensitivity --shapes {' '.join(r['key'] for r in rows)}`. "
        f"Float32 eager, {TOKENS} tokens of the shipped evaluation text, the input embeddings changed by a "
        "relative amount.",
        "",
        head + " |",
        "|" + "---|" * (4 + 2 * len(NOISES)),
    ]
    for r in rows:
        cells = [r["shape"], r["layers"], r["logit_std"], r["median_top_margin_nats"]]
        for n in NOISES:
            cells += [f"{r[f'top1_kept_{n:g}']:.1%}", r[f"max_logit_change_{n:g}"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from hub_export.pipeline.manifest import machine_description

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(shapes()), required=True)
    args = parser.parse_args(argv)
    rows = [{"key": key, **sensitivity(key)} for key in args.shapes]
    machine = machine_description()
    write_results("shape-sensitivity", {"machine": machine, "rows": rows}, markdown(rows, machine))


if __name__ == "__main__":
    main()
