"""Export time, peak memory and file size against parameter count: SmolLM2 135M, 360M, 1.7B, Gemma 3 1B,
Llama 3.2 1B, Qwen3-4B, Phi-4-mini.

Each shape is a real configuration at its real widths with random weights (bfloat16
safetensors shards, as the Hub ships them) and a real tokenizer where one is packaged
(SmolLM2's and Gemma 3's, from the packaged GGUFs); speed and memory do not depend on the values.
Each export runs the defaults (8da4w, GPTQ, 8-bit embeddings, verification) in a fresh
process; its peak is the largest memory of that process and its children together
(proportional set sizes summed, so pages a forked child shares count once), sampled every
0.2 s, beside the largest resident set of any one of them.

    python -m benchmarks.scale                       # every shape (hours: 4B and Phi-4-mini take over an hour each on 2 cores)
    python -m benchmarks.scale --shapes 135m 1.7b    # some of them
    python -m benchmarks.scale --markdown-only       # the table and plot from results/scale.json

Writes ``results/scale.json``, ``results/scale.md`` and ``results/scale.png`` (``scripts/update_docs.py`` puts
them in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.report import RESULTS, provenance, write_results

MODELS = Path(os.environ.get("HUB_EXPORT_BENCH_MODELS", Path.home() / ".cache" / "hub-export-bench"))
MAX_SEQ_LEN = 512
EXPORT = ["--qmode", "8da4w", "--qembedding", "8w", "--max-seq-len", str(MAX_SEQ_LEN)]


def shapes() -> dict:
    """Each shape's name, config and the packaged GGUF whose real tokenizer it gets (None: the demo tokenizer padded
    to the vocabulary). The 1-4B shapes are the structures people put on phones: Llama 3.2's rope scaling, Qwen3's
    QK-norm, Phi-4-mini's partial rotary and fused projections, Gemma 3's window layers."""
    from benchmarks import models
    from hub_export.models.packaged import packaged_gemma3, packaged_smollm2

    return {
        "135m": ("SmolLM2-135M", models.smollm2_135m_config, packaged_smollm2),
        "360m": ("SmolLM2-360M", models.smollm2_360m_config, packaged_smollm2),
        "gemma3-1b": ("Gemma 3 1B", models.gemma3_1b_config, packaged_gemma3),
        "llama3.2-1b": ("Llama 3.2 1B", models.llama3_2_1b_config, None),
        "1.7b": ("SmolLM2-1.7B", models.smollm2_1_7b_config, packaged_smollm2),
        "4b": ("Qwen3-4B", models.qwen3_4b_config, None),
        "phi4-mini": ("Phi-4-mini", models.phi4_mini_config, None),
    }


def model_folder(key: str) -> Path:
    """The shape's checkpoint folder, built once."""
    from benchmarks.models import build_large_shaped
    from hub_export.pipeline.gguf_source import converted_folder

    name, config, tokenizer_gguf = shapes()[key]
    tokenizer = converted_folder(tokenizer_gguf())[0] if tokenizer_gguf else None
    return build_large_shaped(MODELS / f"{key}-shaped", config(), tokenizer_folder=tokenizer)


def _tree_memory(pid: int) -> tuple[int, int]:
    """(the summed proportional set size of ``pid`` and its children, the largest RSS among them).

    PSS counts a page shared by several processes once in all, so a child forked from the export (which shares
    every page of its parent until it runs its own program) does not double the figure as summed RSS would."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    total = largest = 0
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += info.pss
        largest = max(largest, info.rss)
    return total, largest


def measure_export(folder: Path, out: Path, extra: list[str] = ()) -> dict:
    """Run ``hub-export export`` on ``folder`` in a fresh process: wall time, peak RSS of its process tree, rc."""
    command = [sys.executable, "-m", "hub_export.cli", "export", str(folder), "-o", str(out), *EXPORT, *extra]
    peak, largest, done = 0, 0, threading.Event()
    started = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)

        def sample():
            nonlocal peak, largest
            while not done.is_set():
                total, one = _tree_memory(process.pid)
                peak, largest = max(peak, total), max(largest, one)
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = process.wait()
        done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    return {"rc": rc, "seconds": round(seconds, 1), "peak_bytes": peak, "peak_process_rss_bytes": largest,
            "log": log.read_text()[-2000:]}  # fmt: skip


def export_row(out: Path, parameters: int, result: dict) -> dict:
    """What an export measured (``measure_export``'s result) and what its manifest in ``out`` states, as one row."""
    row = {
        "parameters": parameters,
        "fp32_bytes": parameters * 4,
        **{k: v for k, v in result.items() if k != "log"},
        "peak_over_fp32": round(result["peak_bytes"] / (parameters * 4), 3),
    }
    if result["rc"] != 0:
        row["error"] = result["log"][-600:]
        return row
    variant = json.loads((out / "manifest.json").read_text())["variants"][0]
    verification = variant["verification"]
    row.update(
        passed=verification["passed"],
        file=variant["file"],
        file_bytes=variant["size_bytes"],
        decode_tok_s=verification.get("runner_decode_tokens_per_s"),
        prefill_tok_s=verification.get("runner_prefill_tokens_per_s"),
        gptq_seconds=(variant.get("recipe") or {}).get("gptq", {}).get("seconds"),
    )
    return row


def run_shape(key: str, work: Path) -> dict:
    import torch

    folder = model_folder(key)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    from hub_export.pipeline.layerwise import LayerwiseModel

    params = sum(p.numel() for p in LayerwiseModel.open(folder).model.parameters())
    del torch
    out = work / f"{key}-out"
    row = {"shape": shapes()[key][0], "checkpoint_bytes": index["metadata"]["total_size"]}
    row.update(export_row(out, params, measure_export(folder, out)))
    if row["rc"] == 0:
        quality = json.loads((out / "manifest.json").read_text())["variants"][0]["verification"].get("quality") or {}
        row["ppl_ratio"] = quality.get("ratio")
    print(json.dumps(row), flush=True)
    return row


def machines(result: dict) -> list[str]:
    """The machines ``result``'s rows were measured on, in row order."""
    return list(dict.fromkeys(row["machine"] for row in result["rows"]))


def markdown(result: dict) -> str:
    gib = 1 << 30
    lines = [
        "# Export at scale: time, peak memory and file size against parameter count",
        "",
        *provenance(result["rows"], "shape"),
        f"Each export: `hub-export export FOLDER {' '.join(EXPORT)}` (defaults: GPTQ, verification); "
        "peak memory is its whole process tree's (the export and the worker process that quantizes and lowers).",
        "",
        "| shape | parameters | fp32 weights | export wall | GPTQ | peak memory | peak / fp32 | largest process RSS | file "
        "| decode tok/s | prefill tok/s | ppl ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        fmt = lambda v, f: "–" if v is None else f.format(v)  # noqa: E731
        lines.append(
            f"| {row['shape']} | {row['parameters'] / 1e9:.2f} B | {row['fp32_bytes'] / gib:.1f} GiB "
            f"| {row['seconds'] / 60:.1f} min | {fmt(row.get('gptq_seconds') and row['gptq_seconds'] / 60, '{:.1f} min')} "
            f"| {row['peak_bytes'] / gib:.2f} GiB | {row['peak_over_fp32']:.2f}x "
            f"| {row['peak_process_rss_bytes'] / gib:.2f} GiB "
            f"| {fmt(row.get('file_bytes') and row['file_bytes'] / gib, '{:.2f} GiB')} "
            f"| {fmt(row.get('decode_tok_s'), '{:.1f}')} | {fmt(row.get('prefill_tok_s'), '{:.0f}')} "
            f"| {fmt(row.get('ppl_ratio'), '{:.3f}')} |"
        )
    failed = [row for row in result["rows"] if row["rc"] != 0]
    if failed:
        lines += ["", "Exports that failed (their time and memory up to the failure):", ""]
        lines += [f"- {row['shape']}: {_last_error(row.get('error', ''))}" for row in failed]
    return "\n".join(lines) + "\n"


def _last_error(log: str) -> str:
    """The failed export's own one-line error, from the end of its log."""
    errors = [line.strip() for line in log.splitlines() if line.strip().startswith("Error:")]
    return (
        errors[-1] if errors else f"exit status non-zero ({log.strip().splitlines()[-1] if log.strip() else 'no log'})"
    )


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in result["rows"] if row["rc"] == 0]
    params = [row["parameters"] / 1e9 for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(params, [row["peak_bytes"] / 2**30 for row in rows], "o-", label="peak memory (PSS)")
    left.plot(params, [row["fp32_bytes"] / 2**30 for row in rows], "--", label="fp32 weights")
    left.plot(params, [0.75 * row["fp32_bytes"] / 2**30 for row in rows], ":", label="0.75x fp32")
    left.set_xlabel("parameters (billions)")
    left.set_ylabel("GiB")
    left.legend()
    right.plot(params, [row["seconds"] / 60 for row in rows], "o-")
    right.set_xlabel("parameters (billions)")
    right.set_ylabel("export wall time (min)")
    fig.suptitle(f"hub-export defaults (8da4w, GPTQ, 8-bit embeddings); {'; '.join(machines(result))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "scale.png", dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(shapes()), default=list(shapes()))
    parser.add_argument("--markdown-only", action="store_true")
    args = parser.parse_args(argv)
    path = RESULTS / "scale.json"
    if args.markdown_only:
        result = json.loads(path.read_text())
        write_results("scale", result, markdown(result))
    else:
        from hub_export.pipeline.manifest import machine_description

        previous = json.loads(path.read_text()) if path.is_file() else {"rows": []}
        rows = {row["shape"]: row for row in previous["rows"]}  # each keeps the machine and command it came from
        order = [name for name, _, _ in shapes().values()]
        with tempfile.TemporaryDirectory(prefix="scale-") as work:
            for key in args.shapes:
                row = run_shape(key, Path(work))
                row.update(machine=machine_description(), command=f"python -m benchmarks.scale --shapes {key}")
                rows[row["shape"]] = row
                result = {"rows": sorted(rows.values(), key=lambda row: order.index(row["shape"]))}
                write_results("scale", result, markdown(result))  # after each shape: a long run keeps what it has
    plot(result)


if __name__ == "__main__":
    main()
