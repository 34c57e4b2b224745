"""How each ``.pte`` decodes with one thread and with more: ExecuTorch's pool sized per process.

    python -m benchmarks.thread_scaling                 # the two 8da4w files of benchmarks.peer
    python -m benchmarks.thread_scaling --threads 1 2 --rounds 5 A.pte B.pte

Each round starts a fresh process per file and thread count (the pool is sized with the
pybinding's ``_unsafe_reset_threadpool`` before the file loads), runs a 60-token prefill
twice and times 63 decode steps (median), as ``benchmarks.decode_floor`` does; rounds
alternate the files. Writes ``benchmarks/results/thread-scaling.{json,md}``. No tracer runs,
so these are the untraced times; ``python -m benchmarks.profile_pte --threads N`` says where
they go.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.decode_floor import one_round
from benchmarks.report import machine_on_isa, spread, write_results

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = {
    "hub-export": ROOT / "benchmarks/work/peer/ours-8da4w/model-8da4w-emb8w.pte",
    "optimum-executorch": ROOT / "benchmarks/work/peer/peer-8da4w/model.pte",
}


def measure(files: dict[str, Path], threads: list[int], rounds: int) -> dict:
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for count in threads:
            for name, pte in files.items():
                runs.setdefault((name, count), []).append(one_round(pte, "file", count)["decode_ms"])
    return {name: {str(count): spread(runs[name, count], digits=2) for count in threads} for name in files}


def markdown(result: dict) -> str:
    threads = result["threads"]
    lines = [
        f"Decode step in ms, median (range) of {result['rounds']} fresh processes per cell, alternated; "
        f"{result['machine']}; `{result['command']}`:",
        "",
        "| file | "
        + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads)
        + f" | {threads[-1]} vs {threads[0]} |",
        "|---|" + "---|" * (len(threads) + 1),
    ]
    for name, cells in result["decode_ms"].items():
        first, last = cells[str(threads[0])]["median"], cells[str(threads[-1])]["median"]
        row = " | ".join(f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})" for c in cells.values())
        lines.append(f"| {name} | {row} | {first / last:.2f}x faster |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--isa", choices=["avx2"], help="Run the files on XNNPACK's kernels for this older CPU.")
    args = parser.parse_args()
    machine = machine_on_isa(args.isa)

    files = {str(path): path for path in args.files} if args.files else DEFAULT_FILES
    for path in files.values():
        if not path.is_file():
            raise SystemExit(f"{path} not found: run `python -m benchmarks.peer` first, or name the files")
    result = {
        "threads": args.threads,
        "rounds": args.rounds,
        "decode_ms": measure(files, args.threads, args.rounds),
        "machine": machine,
        "command": "python -m benchmarks.thread_scaling"
        + (" " + " ".join(map(str, args.files)) if args.files else "")
        + (f" --rounds {args.rounds}" if args.rounds != 5 else "")
        + (f" --isa {args.isa}" if args.isa else ""),
    }
    write_results("thread-scaling" + (f"-{args.isa}" if args.isa else ""), result, markdown(result))


if __name__ == "__main__":
    main()
