"""Thread-pool work per decode step: how many parallel regions each ``.pte`` opens, counted at the pool.

    python -m benchmarks.threadpool_calls                    # the two 8da4w files of benchmarks.peer
    python -m benchmarks.threadpool_calls --isa avx2 A.pte B.pte

Every XNNPACK operator and ExecuTorch's ``custom_sdpa`` hand their work to pthreadpool
(``pthreadpool_parallelize_*`` in ExecuTorch's ``libexecutorch_threadpool.so``). The pool runs
a call on the calling thread alone when its range fits one tile; otherwise it wakes the
workers and waits for all of them at the end: a barrier. Linux uprobes (``perf probe``) count
the calls with their ranges, tiles and flags, in one fresh process per file and step count: a
60-token prefill, then S decode steps at two threads (``--threads``). The per-step figures are
the difference between two step counts divided by the extra steps, so loading and prefill
cancel out; the counts are exact, not sampled. The step time printed beside them was taken
with the probes on: compare it between files, not with untraced figures.

Writes ``benchmarks/results/threadpool-calls[-ISA].{json,md}``. Needs ``perf`` (Debian:
``apt-get install linux-perf``) and root (uprobes). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.report import machine_on_isa, write_results

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = {
    "hub-export": ROOT / "benchmarks/work/peer/ours-8da4w/model-8da4w-emb8w.pte",
    "optimum-executorch": ROOT / "benchmarks/work/peer/peer-8da4w/model.pte",
}
GROUP = "hubexport"
PROMPT_TOKENS = 60
STEPS = (64, 192)  # the extra 128 steps are what is counted; 60 + 192 stays inside a 256-token cache

# The pool's entry points the two files call, with where their ranges and tiles sit at entry
# (x86-64 System V: arguments 4-6 in rcx, r8, r9, then the stack above the return address).
# Each (range, tile) pair is one dimension; a dimension without a tile has tile 1.
_PROBES = {
    "1d": "pthreadpool_parallelize_1d r0=%cx:u64",
    "1d_tile_1d": "pthreadpool_parallelize_1d_tile_1d r0=%cx:u64 t0=%r8:u64",
    "1d_tile_1d_dynamic": "pthreadpool_parallelize_1d_tile_1d_dynamic r0=%cx:u64 t0=%r8:u64",
    "2d": "pthreadpool_parallelize_2d r0=%cx:u64 r1=%r8:u64",
    "2d_tile_1d": "pthreadpool_parallelize_2d_tile_1d r0=%cx:u64 r1=%r8:u64 t1=%r9:u64",
    "2d_tile_1d_dynamic": "pthreadpool_parallelize_2d_tile_1d_dynamic r0=%cx:u64 r1=%r8:u64 t1=%r9:u64",
    "2d_tile_2d": "pthreadpool_parallelize_2d_tile_2d r0=%cx:u64 r1=%r8:u64 t0=%r9:u64 t1=+8(%sp):u64",
    "2d_tile_2d_dynamic": "pthreadpool_parallelize_2d_tile_2d_dynamic r0=%cx:u64 r1=%r8:u64 t0=%r9:u64 t1=+8(%sp):u64",
    "3d_tile_1d": "pthreadpool_parallelize_3d_tile_1d r0=%cx:u64 r1=%r8:u64 r2=%r9:u64 t2=+8(%sp):u64",
    "3d_tile_1d_dynamic": "pthreadpool_parallelize_3d_tile_1d_dynamic r0=%cx:u64 r1=%r8:u64 r2=%r9:u64 t2=+8(%sp):u64",
    "3d_tile_2d": "pthreadpool_parallelize_3d_tile_2d r0=%cx:u64 r1=%r8:u64 r2=%r9:u64 t1=+8(%sp):u64 t2=+16(%sp):u64",
    "3d_tile_2d_dynamic": (
        "pthreadpool_parallelize_3d_tile_2d_dynamic r0=%cx:u64 r1=%r8:u64 r2=%r9:u64 t1=+8(%sp):u64 t2=+16(%sp):u64"
    ),
}

_DECODE = """
import json, statistics, sys, time
from hub_export.runtime.process_env import apply_xnnpack_isa
apply_xnnpack_isa()  # HUB_EXPORT_XNNPACK_ISA, where the benchmark sets it
import torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool
import hub_export.runtime.pte as runtime
runtime._load_kernels()
_unsafe_reset_threadpool(int(sys.argv[4]))
module = _load_for_executorch(sys.argv[1])
prompt, steps = int(sys.argv[2]), int(sys.argv[3])
tokens = torch.tensor([[(17 * i + 5) % 400 + 10 for i in range(prompt)]], dtype=torch.long)
module.run_method("forward", [tokens, torch.arange(prompt, dtype=torch.long)])
times = []
for step in range(steps):
    start = time.perf_counter()
    module.run_method("forward", [torch.tensor([[11]]), torch.tensor([prompt + step])])
    times.append(time.perf_counter() - start)
print(json.dumps({"decode_ms": statistics.median(times) * 1e3}))
"""


def threadpool_library() -> Path:
    """ExecuTorch's pthreadpool build, where every parallel region of a ``.pte`` starts."""
    from importlib.util import find_spec

    spec = find_spec("executorch")  # a namespace package: no __file__
    roots = list(spec.submodule_search_locations or []) if spec else []
    library = Path(roots[0] if roots else ".") / "lib" / "libexecutorch_threadpool.so"
    if not library.is_file():
        raise SystemExit(f"{library} not found: this ExecuTorch keeps its thread pool elsewhere")
    return library.resolve()


def add_probes(library: Path) -> None:
    for name, spec in _PROBES.items():
        subprocess.run(
            ["perf", "probe", "-q", "-x", str(library), "-a", f"{GROUP}:parallelize_{name}={spec}"], check=True
        )


def remove_probes() -> None:
    subprocess.run(["perf", "probe", "-q", "-d", f"{GROUP}:*"], capture_output=True)


def tiles(fields: dict[str, int]) -> int:
    """How many tiles a call splits into: above one, the pool wakes its workers and waits for them."""
    count = 1
    for dim in range(3):
        if f"r{dim}" in fields:
            count *= math.ceil(fields[f"r{dim}"] / max(fields.get(f"t{dim}", 1), 1))
    return count


def record(pte: Path, steps: int, threads: int) -> tuple[Counter, float]:
    """Run ``steps`` decode steps of ``pte`` under the probes: (calls by shape, median step ms)."""
    import json

    from hub_export.runtime.process_env import pte_process_env

    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "perf.data"
        command = [sys.executable, "-c", _DECODE, str(pte), str(PROMPT_TOKENS), str(steps), str(threads)]
        done = subprocess.run(
            ["perf", "record", "-q", "-e", f"{GROUP}:*", "-o", str(data), "--", *command],
            capture_output=True, text=True, check=True, cwd=ROOT, env=pte_process_env(),
        )  # fmt: skip
        step_ms = json.loads(done.stdout.strip().splitlines()[-1])["decode_ms"]
        script = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, text=True, check=True)
    calls: Counter = Counter()
    for line in script.stdout.splitlines():
        event = re.search(rf"{GROUP}:parallelize_(\w+):", line)
        if event:
            fields = {key: int(value, 0) for key, value in re.findall(r"\b([rt]\d)=(\w+)", line)}
            shape = " ".join(f"{key}={fields[key]}" for key in sorted(fields))
            calls[event.group(1), shape, tiles(fields)] += 1
    return calls, step_ms


def per_step(pte: Path, threads: int) -> dict:
    """Pool calls per decode step of ``pte``: the difference of two runs over their extra steps."""
    (few, _), (many, step_ms) = (record(pte, steps, threads) for steps in STEPS)
    extra = STEPS[1] - STEPS[0]
    shapes = {key: (many[key] - few[key]) / extra for key in many}
    shapes = {key: count for key, count in shapes.items() if count >= 0.5}
    parallel = {key: count for key, count in shapes.items() if key[2] > 1}
    return {
        "calls": round(sum(shapes.values()), 1),
        "parallel": round(sum(parallel.values()), 1),
        "single_tile": round(sum(shapes.values()) - sum(parallel.values()), 1),
        "step_ms_probed": round(step_ms, 2),
        "parallel_shapes": [
            {"entry": entry, "dims": shape, "tiles": count_tiles, "per_step": round(count, 1)}
            for (entry, shape, count_tiles), count in sorted(parallel.items(), key=lambda item: -item[1])
        ],
    }


def markdown(result: dict) -> str:
    files = result["files"]
    lines = [
        f"pthreadpool calls per decode step (uprobes on `pthreadpool_parallelize_*`; {result['threads']} threads, "
        f"60-token prefill, the difference of {STEPS[1]} and {STEPS[0]} decode steps); a call whose range fits one "
        "tile runs on the calling thread, any other wakes the workers and ends in a barrier; "
        f"{result['machine']}; `{result['command']}`:",
        "",
        "| file | pool calls | parallel (barriers) | single tile | decode step, probes on (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, figures in files.items():
        lines.append(
            f"| {name} | {figures['calls']:.0f} | {figures['parallel']:.0f} | {figures['single_tile']:.0f} | "
            f"{figures['step_ms_probed']:.2f} |"
        )
    lines += ["", "Parallel calls by entry point and shape (r: ranges, t: tiles), per decode step:", ""]
    names = list(files)
    lines += ["| entry | dims | tiles | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    rows: dict[tuple, dict[str, float]] = {}
    for name, figures in files.items():
        for shape in figures["parallel_shapes"]:
            rows.setdefault((shape["entry"], shape["dims"], shape["tiles"]), {})[name] = shape["per_step"]
    for (entry, dims, count_tiles), counts in sorted(rows.items(), key=lambda item: -max(item[1].values())):
        cells = " | ".join(f"{counts.get(name, 0):.0f}" for name in names)
        lines.append(f"| {entry} | {dims} | {count_tiles} | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", choices=["avx2"], help="Run the files on XNNPACK's kernels for this older CPU.")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf not found: install it (Debian: apt-get install linux-perf) and rerun")
    if os.geteuid() != 0:
        raise SystemExit("uprobes need root: rerun this benchmark as root (sudo)")
    files = {str(path): path for path in args.files} if args.files else DEFAULT_FILES
    for path in files.values():
        if not path.is_file():
            raise SystemExit(f"{path} not found: run `python -m benchmarks.peer` first, or name the files")
    machine = machine_on_isa(args.isa)
    remove_probes()  # left over from an interrupted run
    add_probes(threadpool_library())
    try:
        figures = {name: per_step(pte, args.threads) for name, pte in files.items()}
    finally:
        remove_probes()
    result = {
        "threads": args.threads,
        "files": figures,
        "machine": machine,
        "command": "python -m benchmarks.threadpool_calls"
        + (" " + " ".join(map(str, args.files)) if args.files else "")
        + (f" --threads {args.threads}" if args.threads != 2 else "")
        + (f" --isa {args.isa}" if args.isa else ""),
    }
    write_results("threadpool-calls" + (f"-{args.isa}" if args.isa else ""), result, markdown(result))


if __name__ == "__main__":
    main()
