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

With ``--qmode 8da4w`` the model is the one verification compares a file with: quantized
as the export quantizes it (8-bit embeddings, min-max int4 scales; read one decoder
layer at a time), its activations rounded to int8 per token as it runs. An XNNPACK file
computes the same math in another order, so its activations round differently wherever a
value sits near a rounding boundary; a change of 1e-6 in the input is the quantized model
against a copy of itself off by float rounding. The table then adds the judge's own
figures between the two: top-1 agreement with near-ties (0.05 nats) counted, and the mean
KL: what no kernel can beat on that shape.

    python -m benchmarks.shape_sensitivity --qmode 8da4w --shapes llama3.2-1b phi4-mini

Writes ``results/shape-sensitivity.{json,md}`` (``shape-sensitivity-8da4w`` with a qmode). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.report import write_results
from benchmarks.scale import model_folder, shapes

TOKENS = 256
NOISES = (1e-4, 1e-3)
QUANTIZED_NOISES = (1e-6, 1e-4)
TIE_NATS = 0.05  # verification's near-tie margin for dynamically quantized files


def _model(folder, qmode: str | None):
    """The float32 eager model, or the one verification compares a ``qmode`` file with (read layer by layer)."""
    import torch
    from transformers import AutoModelForCausalLM

    if qmode is None:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    from hub_export.options import ExportOptions
    from hub_export.pipeline.source import Source
    from hub_export.pipeline.streaming import quantized_model
    from hub_export.tasks.text_generation.export import set_attention

    options = ExportOptions(qmodes=(qmode,), qembedding="8w", int4_scales="minmax")
    model, _ = quantized_model(Source(folder, folder.name, None, True), qmode, options, options.recipe(), print)
    set_attention(model, "eager")  # what verification's reference runs
    return model.eval()


def _judged(base, moved) -> dict:
    """The judge's figures for ``moved`` against ``base``: top-1 agreement with near-ties counted, mean KL."""
    import torch

    reference, candidate = torch.log_softmax(base.float(), -1), torch.log_softmax(moved.float(), -1)
    gap = reference.max(-1).values - reference.gather(-1, candidate.argmax(-1, keepdim=True)).squeeze(-1)
    kl = (reference.exp() * (reference - candidate)).sum(-1)
    return {"within_ties": round((gap <= TIE_NATS).float().mean().item(), 3), "mean_kl": float(kl.mean())}


def sensitivity(key: str, qmode: str | None = None) -> dict:
    import torch
    from transformers import AutoTokenizer

    from hub_export.pipeline.verify import eval_text

    folder = model_folder(key)
    ids = AutoTokenizer.from_pretrained(folder)(eval_text(), return_tensors="pt").input_ids[:, :TOKENS]
    model = _model(folder, qmode)
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
    for noise in QUANTIZED_NOISES if qmode else NOISES:
        moved = logits(noise)
        row[f"top1_kept_{noise:g}"] = round((moved.argmax(-1) == base.argmax(-1)).float().mean().item(), 3)
        row[f"max_logit_change_{noise:g}"] = round((moved - base).abs().max().item(), 4)
        if qmode:
            judged = _judged(base, moved)
            row[f"within_ties_{noise:g}"], row[f"mean_kl_{noise:g}"] = judged["within_ties"], judged["mean_kl"]
    print(row, flush=True)
    return row


def markdown(rows: list[dict], machine: str, qmode: str | None = None) -> str:
    noises = QUANTIZED_NOISES if qmode else NOISES
    judged = (" | top-1 within ties at {n:g} | mean KL at {n:g}") if qmode else ""
    head = "| shape | layers | logit std | median top-2 margin (nats) | " + " | ".join(
        f"top token kept at {n:g} | largest logit change at {n:g}{judged.format(n=n)}" for n in noises
    )
    model = (f"The {qmode} eager model verification compares a file with (8-bit embeddings, min-max int4 scales)"
             if qmode else "Float32 eager")  # fmt: skip
    command = f"python -m benchmarks.shape_sensitivity {f'--qmode {qmode} ' if qmode else ''}--shapes"
    lines = [
        "# How sensitive each random-weight shape is" + (f": the {qmode} model" if qmode else ""),
        "",
        f"{machine}; `{command} {' '.join(r['key'] for r in rows)}`. "
        f"{model}, {TOKENS} tokens of the shipped evaluation text, the input embeddings changed by a "
        "relative amount." + (f" Near-ties: within {TIE_NATS} nats, as the judge counts them." if qmode else ""),
        "",
        head + " |",
        "|" + "---|" * (4 + (4 if qmode else 2) * len(noises)),
    ]
    for r in rows:
        cells = [r["shape"], r["layers"], r["logit_std"], r["median_top_margin_nats"]]
        for n in noises:
            cells += [f"{r[f'top1_kept_{n:g}']:.1%}", r[f"max_logit_change_{n:g}"]]
            if qmode:
                cells += [f"{r[f'within_ties_{n:g}']:.1%}", f"{r[f'mean_kl_{n:g}']:.2g}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from hub_export.pipeline.manifest import machine_description

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(shapes()), required=True)
    parser.add_argument("--qmode", choices=["8da4w", "8da8w"], help="the quantized eager model verification uses")
    args = parser.parse_args(argv)
    rows = [{"key": key, **sensitivity(key, args.qmode)} for key in args.shapes]
    machine = machine_description()
    name = "shape-sensitivity" + (f"-{args.qmode}" if args.qmode else "")
    result = {"machine": machine, "qmode": args.qmode, "rows": rows}
    write_results(name, result, markdown(rows, machine, args.qmode))


if __name__ == "__main__":
    main()
