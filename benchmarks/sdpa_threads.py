"""Why a Python process runs ``custom_sdpa`` slowly, and which setting fixes it.

    python -m benchmarks.sdpa_threads [--rounds 3]

A program of nothing but SmolLM2-135M's attention operators (30 layers of two
``llama::update_cache`` writes and ``llama::custom_sdpa`` over 256-slot caches, ``[1, S, 9, 64]``
queries) is run in fresh processes, ExecuTorch's pool at two threads, under each of the
settings below: a 60-token prefill (the median of 20 after one untimed) and a decode step
(the median of 30). ExecuTorch's LLM kernels library takes BLAS's ``sgemm_`` from the MKL
inside torch (``LD_DEBUG=bindings``), and MKL runs an OpenMP team inside each thread of
ExecuTorch's pool; the settings are the ways to stop that. hub-export keeps the second one
for every process that runs ``.pte`` files (``hub_export/runtime/process_env.py``).

Writes ``benchmarks/results/sdpa-threads.{json,md}``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.report import spread, write_results

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "benchmarks" / "work" / "sdpa-threads" / "attention-30l.pte"
LAYERS, SLOTS, HEADS, KV_HEADS, HEAD_DIM, PROMPT = 30, 256, 9, 3, 64, 60

# name -> (environment added before the process starts, code run after torch loads)
SETTINGS: dict[str, tuple[dict[str, str], str]] = {
    "torch's MKL as installed": ({}, ""),
    "MKL_NUM_THREADS=1 before torch loads (hub-export)": ({"MKL_NUM_THREADS": "1"}, ""),
    "OMP_NUM_THREADS=1 before torch loads": ({"OMP_NUM_THREADS": "1"}, ""),
    "torch.set_num_threads(1)": ({}, "torch.set_num_threads(1)"),
    "MKL_NUM_THREADS=1 after torch loads": ({}, "os.environ['MKL_NUM_THREADS'] = '1'"),
    "ExecuTorch's own sgemm_ (its kernels library made global first)": (
        {},
        "import ctypes, executorch; ctypes.CDLL(os.path.join(executorch.__path__[0], 'lib', "
        "'libexecutorch_kernels_optimized.so'), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)",
    ),
}

_ROUND = """
import json, os, statistics, sys, time
import torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool
{setup}
import executorch.extension.llm.custom_ops.custom_ops  # loads custom_sdpa, which binds sgemm_ here
_unsafe_reset_threadpool(2)
module = _load_for_executorch(sys.argv[1])
def inputs(count, position):
    return [torch.randn(1, count, {heads}, {dim}), torch.randn(1, count, {kv}, {dim}), torch.randn(1, count, {kv}, {dim}),
            torch.arange(position, position + count)]
prompt = inputs({prompt}, 0)
module.run_method("forward", prompt)
prefill = []
for _ in range(20):
    start = time.perf_counter(); module.run_method("forward", prompt); prefill.append(time.perf_counter() - start)
step = inputs(1, {prompt})
decode = []
for _ in range(30):
    start = time.perf_counter(); module.run_method("forward", step); decode.append(time.perf_counter() - start)
print(json.dumps({{"prefill_ms": statistics.median(prefill) * 1e3, "decode_ms": statistics.median(decode) * 1e3}}))
"""


def build_program(path: Path = PROGRAM) -> Path:
    """Lower the attention-only program to ``path`` (cached)."""
    if path.is_file():
        return path
    import torch
    from torch import nn

    from hub_export.pipeline import lower
    from hub_export.runtime import pte as runtime

    runtime._load_kernels()

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            for layer in range(LAYERS):
                for name in ("k", "v"):
                    self.register_buffer(f"{name}{layer}", torch.zeros(1, SLOTS, KV_HEADS, HEAD_DIM), persistent=False)

        def forward(self, query, key, value, positions):
            start = positions[0].item()
            torch._check(start >= 0)
            torch._check(start < SLOTS)
            for layer in range(LAYERS):
                keys, values = getattr(self, f"k{layer}"), getattr(self, f"v{layer}")
                torch.ops.llama.update_cache(key, keys, start)
                torch.ops.llama.update_cache(value, values, start)
                query = torch.ops.llama.custom_sdpa(query, keys, values, start, None, 0.0, True, HEAD_DIM**-0.5)
            return query

    seq = torch.export.Dim("seq", min=1, max=SLOTS - 1)
    example = (
        torch.randn(1, 2, HEADS, HEAD_DIM),
        torch.randn(1, 2, KV_HEADS, HEAD_DIM),
        torch.randn(1, 2, KV_HEADS, HEAD_DIM),
        torch.arange(2),
    )
    program = torch.export.export(
        Attention(), example, dynamic_shapes=({1: seq}, {1: seq}, {1: seq}, {0: seq}), strict=True
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    lower.to_pte(program, {}, path)
    return path


def one_round(pte: Path, setting: str) -> dict:
    added, setup = SETTINGS[setting]
    code = _ROUND.format(setup=setup, heads=HEADS, kv=KV_HEADS, dim=HEAD_DIM, prompt=PROMPT)
    env = {key: value for key, value in os.environ.items() if key not in ("MKL_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(pte)],
        capture_output=True,
        text=True,
        check=True,
        env={**env, **added},
        cwd=ROOT,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(result: dict) -> str:
    lines = [
        f"Attention operators alone ({LAYERS} layers of `update_cache` x2 + `custom_sdpa`, SmolLM2-135M's heads, "
        f"{SLOTS}-slot caches), ExecuTorch's pool at 2 threads; per call in ms, median (range) over "
        f"{result['rounds']} fresh processes per setting, alternated (each process: median of 20 prefills, "
        f"30 decode steps); {result['machine']}; `{result['command']}`:",
        "",
        f"| setting | {PROMPT}-token prefill | decode step |",
        "|---|---|---|",
    ]
    for setting, figures in result["timing"].items():
        prefill, decode = figures["prefill_ms"], figures["decode_ms"]
        lines.append(
            f"| {setting} | {prefill['median']:.1f} ({prefill['min']:.1f}-{prefill['max']:.1f}) | "
            f"{decode['median']:.2f} ({decode['min']:.2f}-{decode['max']:.2f}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from hub_export.pipeline.manifest import machine_description

    pte = build_program()
    runs: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    for _ in range(args.rounds):
        for setting in SETTINGS:
            runs[setting].append(one_round(pte, setting))
    result = {
        "rounds": args.rounds,
        "timing": {
            setting: {
                "prefill_ms": spread([r["prefill_ms"] for r in got], digits=2),
                "decode_ms": spread([r["decode_ms"] for r in got], digits=3),
            }
            for setting, got in runs.items()
        },
        "machine": machine_description(),
        "command": "python -m benchmarks.sdpa_threads" + (f" --rounds {args.rounds}" if args.rounds != 3 else ""),
    }
    write_results("sdpa-threads", result, markdown(result))


if __name__ == "__main__":
    main()
