"""A vision-language file at real widths: SmolVLM-256M's shape with the real SmolLM2-135M-Instruct decoder.

    python -m benchmarks.vlm [--qmode 8da4w --qmode 8da8w] [--max-seq-len 1024]

No package ships a SmolVLM checkpoint; :func:`hub_export.models.tiny.build_smolvlm_shaped` builds SmolVLM-256M's
vision tower and connector at real widths (random weights) around the packaged SmolLM2-135M-Instruct. Each
variant is exported and verified by ``hub_export.export`` (8-bit embeddings), then timed in ExecuTorch's
``MultimodalRunner`` (a fresh process per run, its own figures) on a drawn 512-px image and a question: the image's
encoder alone (median of 5 calls through the file's ``vision_encoder``), prefill and decode rates. Writes
``benchmarks/results/vlm-smolvlm-shaped.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hub_export.pipeline.manifest import machine_description
from hub_export.runtime.process_env import prepare_pte_process

RESULTS = Path(__file__).parent / "results"
NAME = "vlm-smolvlm-shaped"
QUESTION = "Describe this picture."
NEW_TOKENS = 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", action="append", dest="qmodes")
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hub-export-vlm-bench")
    args = parser.parse_args()
    prepare_pte_process()
    import torch
    from tokenizers import Tokenizer

    from hub_export.models.tiny import build_smolvlm_shaped
    from hub_export.pipeline.export import export
    from hub_export.pipeline.manifest import Manifest
    from hub_export.tasks.image_classification.export import draw
    from hub_export.tasks.vision_language import export as vl
    from hub_export.tasks.vision_language import model as vl_model
    from hub_export.tasks.vision_language import run as vl_run

    qmodes = args.qmodes or ["8da4w", "8da8w"]
    source = args.work / "smolvlm-shaped"
    if not (source / "config.json").is_file():
        build_smolvlm_shaped(source)
    out = args.work / "export"
    started = time.perf_counter()
    export(str(source), out, qmodes=qmodes, qembedding="8w", max_seq_len=args.max_seq_len, jobs=1)
    export_seconds = time.perf_counter() - started
    manifest = Manifest.read(out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    rows = []
    for variant in manifest.variants:
        file = vl_run.VisionLanguageFile(out / variant.file)
        image = vl_run.load_image(draw(0, 512)[0], file.image_size)
        vision = []
        for _ in range(5):
            begun = time.perf_counter()
            file.vision(image)
            vision.append(time.perf_counter() - begun)
        prompt = vl_run.build_prompt(out, vl_model.IDEFICS3, QUESTION, [image], tokenizer)
        result = vl.runner_generate(out / variant.file, out / "tokenizer.json", prompt, NEW_TOKENS)
        stats = result["stats"]
        decode_seconds = (stats["inference_end_ms"] - stats["prompt_eval_end_ms"]) / 1000
        prefill_seconds = (stats["prompt_eval_end_ms"] - stats["inference_start_ms"]) / 1000
        figures = variant.verification.figures or {}
        rows.append(
            {
                "file": variant.file,
                "size_mb": round(variant.size_bytes / 1e6, 1),
                "vision_encoder_ms": round(statistics.median(vision) * 1000, 1),
                "prompt_positions": stats["prompt_tokens"],
                "prefill_seconds": round(prefill_seconds, 3),
                "generated_tokens": stats["generated_tokens"],
                "decode_tokens_per_s": round(stats["generated_tokens"] / decode_seconds, 1) if decode_seconds else None,
                "runner_peak_rss_mb": round(stats.get("peak_rss_kib", 0) / 1024),
                "verification": variant.verification.line(),
                "perplexity_ratio": round(figures.get("perplexity_ratio", float("nan")), 3),
                "fp32_perplexity": round(figures.get("fp32_perplexity", float("nan")), 2),
                "runner_matches": figures.get("runner_matches"),
                "export_seconds": variant.export_seconds,
                "answer": result["text"][:120],
            }
        )
        del file
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    record = {"machine": machine_description(), "max_seq_len": args.max_seq_len, "export_seconds": export_seconds,
              "variants": rows}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{NAME}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        "# SmolVLM-256M-shaped (real SmolLM2-135M-Instruct decoder, random SigLIP tower at real widths)",
        "",
        f"`python -m benchmarks.vlm` on {record['machine']}; context {args.max_seq_len}, 8-bit embeddings; one drawn "
        f'512-px image and "{QUESTION}" (64 image tokens); timings from ExecuTorch\'s MultimodalRunner.',
        "",
        "| file | size | vision encoder | prompt positions | prefill | decode | runner peak RSS | text perplexity vs fp32 "
        "| runner = own loop |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| `{row['file']}` | {row['size_mb']} MB | {row['vision_encoder_ms']} ms | {row['prompt_positions']} | "
            f"{row['prefill_seconds']} s | {row['decode_tokens_per_s']} tok/s | {row['runner_peak_rss_mb']} MB | "
            f"x{row['perplexity_ratio']} "
            f"(fp32 {row['fp32_perplexity']}) | {'yes' if row['runner_matches'] == 1.0 else 'no'} |"
        )
    lines += [""]
    lines += [f"- `{row['file']}`: {row['verification']}" for row in rows]
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
