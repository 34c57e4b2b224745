"""What the int4 group size buys in speed on each kernel family, and what it costs in quality.

    python -m benchmarks.group_size                       # groups 32 64 192 and per channel; about 10 minutes

Speed: a program of SmolLM2-135M's MLP products alone (10 layers of 576 -> 1536 -> 576,
one token, residual adds), 8da4w at each group size (per channel: the whole row), lowered
to XNNPACK; a fresh process per round and kernel family, rounds alternated, the median of
200 forwards after 20 untimed, one thread. "avx2" hides AVX-512 and VNNI from XNNPACK
(:func:`hub_export.patches.restrict_xnnpack_isa`), so it picks its AVX2 kernels as on an
AVX2-only CPU. Quality: the real SmolLM2 (its GGUF dequantized) rounded by GPTQ at each
group size, perplexity relative to fp32 on both evaluation texts, eager (as
``benchmarks.int4_rounding``; per channel is not measured: GPTQ rounds grouped weights).
Writes ``benchmarks/results/group-size.{json,md}``. A benchmark, not a test.
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
WORK = ROOT / "benchmarks" / "work" / "group-size"
LAYERS, HIDDEN, INTERMEDIATE = 10, 576, 1536
_ROUND = """
import json, statistics, sys, time
from hub_export.runtime.process_env import apply_xnnpack_isa
apply_xnnpack_isa()
import torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool
_unsafe_reset_threadpool(1)
module = _load_for_executorch(sys.argv[1])
x = torch.randn(1, 1, int(sys.argv[2]))
for _ in range(20):
    module.forward([x])
times = []
for _ in range(200):
    start = time.perf_counter()
    module.forward([x])
    times.append(time.perf_counter() - start)
print(json.dumps(statistics.median(times) * 1e3))
"""


def _mlp_program(group: int | None, path: Path) -> Path:
    """The MLP-products program at ``group`` (None: per channel), built once."""
    if path.is_file():
        return path
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torch import nn
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    class Products(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ups = nn.ModuleList(nn.Linear(HIDDEN, INTERMEDIATE, bias=False) for _ in range(LAYERS))
            self.downs = nn.ModuleList(nn.Linear(INTERMEDIATE, HIDDEN, bias=False) for _ in range(LAYERS))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for up, down in zip(self.ups, self.downs, strict=True):
                x = x + down(torch.nn.functional.silu(up(x)))
            return x

    torch.manual_seed(0)
    model = Products().eval()
    granularity = PerAxis(0) if group is None else PerGroup(group)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=granularity))
    exported = torch.export.export(model, (torch.randn(1, 1, HIDDEN),))
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(program.buffer)
    return path


def _time(pte: Path, isa: str) -> float:
    from hub_export.runtime.process_env import XNNPACK_ISA_ENV, pte_process_env

    env = {key: value for key, value in pte_process_env().items() if key != XNNPACK_ISA_ENV}
    env.update({XNNPACK_ISA_ENV: isa} if isa != "native" else {})
    done = subprocess.run([sys.executable, "-c", _ROUND, str(pte), str(HIDDEN)], capture_output=True, text=True,
                          check=True, cwd=ROOT, env=env)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_speed(groups: list[str], rounds: int) -> dict:
    programs = {g: _mlp_program(None if g == "channel" else int(g), WORK / f"mlp-{g}.pte") for g in groups}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for isa in ("native", "avx2"):
            for group, pte in programs.items():
                times.setdefault((isa, group), []).append(_time(pte, isa))
    return {isa: {g: spread(times[isa, g], digits=3) for g in groups} for isa in ("native", "avx2")}


def measure_quality(groups: list[int]) -> dict:
    from benchmarks.int4_rounding import TEXTS, _perplexity, reference, rounded
    from hub_export.options import ExportOptions

    model, folder, _, windows, fp32 = reference("smollm2")
    ratios = {}
    for group in groups:
        options = ExportOptions(qmodes=("8da4w",), qembedding="8w", int4_scales="gptq", group_size=group)
        quantized, _ = rounded(model, folder, options)
        ratios[str(group)] = {text: round(_perplexity(quantized, windows[text]) / fp32[text], 4) for text in TEXTS}
        print(f"group {group}: {ratios[str(group)]}", flush=True)
    return ratios


def markdown(result: dict) -> str:
    speed, quality = result["speed"], result["quality"]
    base = {isa: speed[isa]["32"]["median"] for isa in speed}
    lines = [
        f"8da4w at each int4 group size. Speed: {LAYERS} layers of SmolLM2-135M's MLP products ({HIDDEN} -> "
        f"{INTERMEDIATE} -> {HIDDEN}), one token, one thread, ms per forward, median (range) of {result['rounds']} "
        "fresh processes, alternated; quality: the real SmolLM2-135M-Instruct GPTQ-rounded at that group size, "
        f"perplexity / fp32, eager; {result['machine']}; `{result['command']}`:",
        "",
        "| group | native kernels | AVX2 kernels | AVX2: vs group 32 | prose | technical |",
        "|---|---|---|---|---|---|",
    ]
    for group in speed["native"]:
        native, avx2 = speed["native"][group], speed["avx2"][group]
        ratios = quality.get(group)
        prose = f"{ratios['eval_en.txt']:.3f}x" if ratios else "not measured"
        technical = f"{ratios['eval_docs_en.txt']:.3f}x" if ratios else "not measured"
        lines.append(
            f"| {group} | {native['median']:.3f} ({native['min']:.3f}-{native['max']:.3f}) | "
            f"{avx2['median']:.3f} ({avx2['min']:.3f}-{avx2['max']:.3f}) | "
            f"{base['avx2'] / avx2['median']:.2f}x faster | {prose} | {technical} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", nargs="+", default=["32", "64", "192", "channel"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-quality", action="store_true", help="Speed only.")
    args = parser.parse_args()
    from hub_export.pipeline.manifest import machine_description
    from hub_export.quiet import quiet_libraries, quiet_torch

    quiet_libraries()
    quiet_torch()
    os.environ.pop("HUB_EXPORT_XNNPACK_ISA", None)  # this process builds; each round sets its own
    groups = [int(g) for g in args.groups if g != "channel"]
    result = {
        "rounds": args.rounds,
        "speed": measure_speed(args.groups, args.rounds),
        "quality": {} if args.no_quality else measure_quality(groups),
        "machine": machine_description(),
        "command": "python -m benchmarks.group_size"
        + (f" --groups {' '.join(args.groups)}" if args.groups != ["32", "64", "192", "channel"] else "")
        + (f" --rounds {args.rounds}" if args.rounds != 5 else "")
        + (" --no-quality" if args.no_quality else ""),
    }
    write_results("group-size", result, markdown(result))


if __name__ == "__main__":
    main()
