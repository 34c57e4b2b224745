"""Decode-step time of several ``.pte`` files measured side by side, in the same processes.

    python -m benchmarks.paired_decode A.pte B.pte [C.pte ...] [--rounds 6] [--isa avx2] [--name NAME]

Fresh-process medians of one file at a time move by 10-20% here between runs (the machine's
speed drifts), which hides a difference of a few percent between two files. This loads
every file into one process, runs the same 60-token prefill on each, then interleaves
their decode steps (A, B, C, A, B, C, ...; 150 steps each, the same token and position for
all; a program of ``benchmarks.decode_floor`` gets hidden states instead of tokens), so drift
hits every file alike, and reports each file's median step. ``--rounds``
fresh processes rotate the order of the files; the ratio to the first file is taken within
each process, and its median and range over the rounds are the figure to read. The pool
has ExecuTorch's default size (one thread per core), MKL one thread, as ``hub-export
generate`` runs. Writes ``benchmarks/results/paired-decode[-NAME].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.report import machine_on_isa, spread, write_results

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 60
STEPS = 150

_ROUND = """
import json, statistics, sys, time
from hub_export.runtime.process_env import apply_xnnpack_isa
apply_xnnpack_isa()  # HUB_EXPORT_XNNPACK_ISA, where a benchmark sets it
import torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch
import hub_export.runtime.pte as runtime
runtime._load_kernels()
prompt, steps = int(sys.argv[1]), int(sys.argv[2])
modules = [_load_for_executorch(path) for path in sys.argv[3:]]
def takes_tokens(module):
    return module.method_meta("forward").input_tensor_meta(0).dtype() == 4  # int64 ids, else hidden states
kinds = [takes_tokens(module) for module in modules]
def inputs(tokens, count, position):
    if tokens:
        first = torch.tensor([[(17 * i + 5) % 400 + 10 for i in range(count)]], dtype=torch.long)
    else:  # a program of benchmarks.decode_floor: hidden states in
        first = torch.randn(1, count, 576, generator=torch.Generator().manual_seed(position))
    return [first, torch.arange(position, position + count, dtype=torch.long)]
for module, tokens in zip(modules, kinds):
    module.run_method("forward", inputs(tokens, prompt, 0))
times = [[] for _ in modules]
for step in range(steps):
    for index, module in enumerate(modules):
        args = inputs(kinds[index], 1, prompt + step)
        start = time.perf_counter()
        module.run_method("forward", args)
        times[index].append(time.perf_counter() - start)
print(json.dumps([statistics.median(t) * 1e3 for t in times]))
"""


def one_round(files: list[Path]) -> list[float]:
    """One fresh process over ``files`` in this order: each file's median decode step (ms)."""
    from hub_export.runtime.process_env import pte_process_env

    done = subprocess.run(
        [sys.executable, "-c", _ROUND, str(PROMPT_TOKENS), str(STEPS), *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=pte_process_env(),
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(files: list[Path], rounds: int) -> dict:
    """Per file: its median step over the rounds and its step time relative to the first file's."""
    steps: dict[int, list[float]] = {index: [] for index in range(len(files))}
    for round_index in range(rounds):
        shift = round_index % len(files)
        order = list(range(len(files)))[shift:] + list(range(len(files)))[:shift]
        for index, ms in zip(order, one_round([files[i] for i in order]), strict=True):
            steps[index].append(ms)
    return {
        str(files[index]): {
            "decode_ms": spread(got, digits=3),
            "vs_first": spread([a / b for a, b in zip(got, steps[0], strict=True)], digits=3),
        }
        for index, got in steps.items()
    }


def markdown(result: dict) -> str:
    first = next(iter(result["files"]))
    lines = [
        f"Decode step in one process per round, files interleaved step by step ({STEPS} steps each after a "
        f"{PROMPT_TOKENS}-token prefill), {result['rounds']} fresh processes with the order rotated; "
        f"{result['machine']}; `{result['command']}`:",
        "",
        f"| file | decode step (ms), median (range) | time vs {first}, median (range) |",
        "|---|---|---|",
    ]
    for name, got in result["files"].items():
        d, r = got["decode_ms"], got["vs_first"]
        lines.append(
            f"| {name} | {d['median']:.3f} ({d['min']:.3f}-{d['max']:.3f}) | "
            f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--isa", choices=["avx2"], help="Run every file on XNNPACK's kernels for this older CPU.")
    parser.add_argument("--name", help="Suffix of the results files (paired-decode-NAME).")
    args = parser.parse_args()
    if len(args.files) < 2:
        raise SystemExit("give at least two .pte files to compare")
    machine = machine_on_isa(args.isa)
    files = [path.resolve() for path in args.files]
    timing = measure(files, args.rounds)
    result = {
        "machine": machine,
        "rounds": args.rounds,
        "command": "python -m benchmarks.paired_decode "
        + " ".join(str(path) for path in args.files)
        + f" --rounds {args.rounds}"
        + (f" --isa {args.isa}" if args.isa else "")
        + (f" --name {args.name}" if args.name else ""),
        "files": {
            str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path): timing[str(path)] for path in files
        },
    }
    write_results("paired-decode" + (f"-{args.name}" if args.name else ""), result, markdown(result))


if __name__ == "__main__":
    main()
