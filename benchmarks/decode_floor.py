"""The floor under a decode step: XNNPACK running only the weight matmuls of one token.

    python -m benchmarks.decode_floor                 # 8da4w, after python -m benchmarks.peer
    python -m benchmarks.decode_floor --qmode 8da8w

A program that holds nothing but SmolLM2-135M's linear layers, in order (30 layers of
q, k, v, o, gate, up, down, then the vocabulary projection on the last position),
quantized as the peer benchmark's files are (``--qmode``, group 32), with the two RMS
norms a layer has (without them the random-weight products overflow to inf within 25
layers, and a kernel fed inf times no real work), chained by residual adds, the MLP's
product and one copy and product per layer for the keys and values, lowered whole to one
XNNPACK partition. A second program adds what ExecuTorch's attention costs: each layer
writes its keys and values with ``llama::update_cache`` and attends with
``llama::custom_sdpa``, as both tools' files do. Every ``.pte`` that holds these weights
and runs these kernels spends at least as long per token as the first program, and every
file built on ExecuTorch's attention operators at least as long as the second; rotary
embedding, the token embedding and delegate hops come on top. The two files of the last
``benchmarks.peer`` run for ``--qmode`` are timed the same way in the same run:
ExecuTorch's pybinding ``run_method`` in a fresh process per round, rounds alternated, a
60-token prefill timed after one untimed, then the median of 63 decode steps.

Writes ``benchmarks/results/decode-floor-QMODE.{json,md}``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.report import RESULTS, machine_on_isa, spread, write_results

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "decode-floor"
PROMPT_TOKENS = 60
DECODE_STEPS = 63
FLOOR = "weight matmuls only"
FLOOR_SDPA = "weight matmuls + cache writes + custom_sdpa"


def build_floor(qmode: str, path: Path, attention: bool = False) -> Path:
    """Lower the linears-and-norms program of SmolLM2-135M's shape to ``path`` (cached).

    With ``attention``, each layer also writes its keys and values with
    ``llama::update_cache`` and attends with ``llama::custom_sdpa`` over a 256-slot cache,
    as every file built on ExecuTorch's attention operators does; what it leaves out
    (rotary, embedding) costs little. Its prefill is the least such a file spends.
    """
    if path.is_file():
        return path
    import torch
    from torch import nn

    from benchmarks.models import smollm2_135m_config
    from hub_export.pipeline import lower, quantize
    from hub_export.runtime import pte as runtime

    config = smollm2_135m_config()
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    slots = 256
    runtime._load_kernels()

    def rms_norm(x):
        # every Llama-shaped file normalizes before attention and MLP; without it the products overflow
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (
                nn.Linear(hidden, hidden, False),
                nn.Linear(hidden, kv, False),
                nn.Linear(hidden, kv, False),
            )
            self.o = nn.Linear(hidden, hidden, False)
            self.gate, self.up, self.down = (
                nn.Linear(hidden, inner, False),
                nn.Linear(hidden, inner, False),
                nn.Linear(inner, hidden, False),
            )
            if attention:
                for name in ("k_cache", "v_cache"):
                    self.register_buffer(
                        name, torch.zeros(1, slots, config.num_key_value_heads, head_dim), persistent=False
                    )

        def mix(self, x, start_pos):
            if not attention:
                # keys and values scale the queries (a copy and a product: what attention adds is left out)
                keys = self.k(x)
                return self.q(x) * torch.cat([keys, self.v(x), keys], dim=-1)
            rows = x.shape[1]
            for projection, cache in ((self.k, self.k_cache), (self.v, self.v_cache)):
                torch.ops.llama.update_cache(projection(x).view(1, rows, -1, head_dim), cache, start_pos)
            query = self.q(x).view(1, rows, -1, head_dim)
            mixed = torch.ops.llama.custom_sdpa(
                query, self.k_cache, self.v_cache, start_pos, None, 0.0, True, head_dim**-0.5
            )
            return mixed.view(1, rows, hidden)

        def forward(self, x, start_pos):
            x = x + self.o(self.mix(rms_norm(x), start_pos))
            normed = rms_norm(x)
            return x + self.down(self.gate(normed) * self.up(normed))

    class Linears(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(config.num_hidden_layers))
            self.head = nn.Linear(hidden, config.vocab_size, False)

        def forward(self, x, cache_position):
            start_pos = cache_position[0].item()
            torch._check(start_pos >= 0)
            torch._check(start_pos < slots)
            for layer in self.layers:
                x = layer(x, start_pos)
            return self.head(x[:, -1:, :])

    torch.manual_seed(0)
    model = Linears().eval()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            # transformers' initializer_range; kernels fed inf would not be timing real work
            nn.init.normal_(module.weight, std=0.02)
    quantize.quantize_linears(model, qmode, 32)
    with torch.no_grad():
        if not torch.isfinite(model(torch.randn(1, PROMPT_TOKENS, hidden), torch.arange(PROMPT_TOKENS))).all():
            raise RuntimeError("the floor program overflows; its timings would not be real work")
        for buffer in model.buffers():
            buffer.zero_()
    seq = torch.export.Dim("seq", min=1, max=slots - 1)
    example = (torch.randn(1, 2, hidden), torch.arange(2))
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=({1: seq}, {0: seq}), strict=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    lower.to_pte(program, {}, path)
    return path


_ROUND = """
import json, statistics, sys, time
from hub_export.runtime.process_env import apply_xnnpack_isa
apply_xnnpack_isa()  # HUB_EXPORT_XNNPACK_ISA, where a benchmark sets it
import torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch
import hub_export.runtime.pte as runtime
runtime._load_kernels()
if len(sys.argv) > 5:
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    _unsafe_reset_threadpool(int(sys.argv[5]))
module = _load_for_executorch(sys.argv[1])
prompt, steps = int(sys.argv[2]), int(sys.argv[3])
kind = sys.argv[4]
def inputs(count, position):
    positions = torch.arange(position, position + count, dtype=torch.long)
    if kind == "floor":
        return [torch.randn(1, count, 576), positions]
    tokens = torch.tensor([[(17 * i + 5) % 400 + 10 for i in range(count)]], dtype=torch.long)
    return [tokens, positions]
module.run_method("forward", inputs(prompt, 0))
start = time.perf_counter()
module.run_method("forward", inputs(prompt, 0))
prefill = time.perf_counter() - start
times = []
for step in range(steps):
    start = time.perf_counter()
    module.run_method("forward", inputs(1, prompt + step))
    times.append(time.perf_counter() - start)
print(json.dumps({"prefill_ms": prefill * 1e3, "decode_ms": statistics.median(times) * 1e3}))
"""


def round_env(stock_mkl: bool = False) -> dict[str, str]:
    """A round's environment: hub-export's ``.pte`` process (MKL on one thread), or the caller's as it is."""
    from hub_export.runtime.process_env import pte_process_env

    if stock_mkl:
        return {key: value for key, value in os.environ.items() if key != "MKL_NUM_THREADS"}
    return pte_process_env()


def one_round(pte: Path, kind: str, threads: int | None = None, stock_mkl: bool = False) -> dict:
    """One fresh process: a prefill (after one untimed), then the median decode step; ``threads`` sizes the pool."""
    extra = [str(threads)] if threads else []
    done = subprocess.run(
        [sys.executable, "-c", _ROUND, str(pte), str(PROMPT_TOKENS), str(DECODE_STEPS), kind, *extra],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=round_env(stock_mkl),
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(files: dict[str, tuple[Path, str]], rounds: int, stock_mkl: bool = False) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in files}
    for _ in range(rounds):
        for name, (pte, kind) in files.items():
            runs[name].append(one_round(pte, kind, stock_mkl=stock_mkl))
    return {
        name: {
            "prefill_ms": spread([r["prefill_ms"] for r in got], digits=2),
            "decode_ms": spread([r["decode_ms"] for r in got], digits=2),
        }
        for name, got in runs.items()
    }


def markdown(result: dict) -> str:
    timing = result["timing"]
    peer, ours, floor = timing["optimum-executorch"], timing["hub-export"], timing[FLOOR]
    attention = timing.get(FLOOR_SDPA)
    prefill_target = peer["prefill_ms"]["median"] / result["targets"]["prefill"]
    decode_target = peer["decode_ms"]["median"] / result["targets"]["decode"]

    def cell(figure: dict) -> str:
        return f"{figure['median']:.1f} ({figure['min']:.1f}-{figure['max']:.1f})"

    lines = [
        f"Per-call time in ms, median (range) of {result['rounds']} fresh processes, alternated; "
        f"{result['qmode']}, SmolLM2-135M shapes; prefill {PROMPT_TOKENS} tokens, decode the median of "
        f"{DECODE_STEPS} steps; torch's MKL threads in each process: {result.get('mkl_num_threads', 'default')}; "
        f"{result['machine']}; `{result['command']}`:",
        "",
        "| | prefill | decode step |",
        "|---|---|---|",
        f"| optimum-executorch's file | {cell(peer['prefill_ms'])} | {cell(peer['decode_ms'])} |",
        f"| hub-export's file | {cell(ours['prefill_ms'])} | {cell(ours['decode_ms'])} |",
        f"| the weight matmuls and norms alone (floor) | {cell(floor['prefill_ms'])} | {cell(floor['decode_ms'])} |",
        *(
            [
                f"| the same plus cache writes and `custom_sdpa` | {cell(attention['prefill_ms'])} | "
                f"{cell(attention['decode_ms'])} |"
            ]
            if attention
            else []
        ),
        f"| target: peer / {result['targets']['prefill']} (prefill), / {result['targets']['decode']} (decode) | "
        f"{prefill_target:.1f} | {decode_target:.1f} |",
        "",
        f"Decode: the matmuls and norms alone take {floor['decode_ms']['median'] / peer['decode_ms']['median']:.0%} of the "
        f"peer's step; the target leaves "
        f"{decode_target - floor['decode_ms']['median']:.2f} ms per token "
        f"for everything else, {ours['decode_ms']['median'] - floor['decode_ms']['median']:.2f} ms in hub-export's file "
        f"and {peer['decode_ms']['median'] - floor['decode_ms']['median']:.2f} ms in the peer's.",
        f"Prefill: the matmuls and norms alone take {floor['prefill_ms']['median'] / peer['prefill_ms']['median']:.0%} of the "
        f"peer's; the target leaves "
        f"{prefill_target - floor['prefill_ms']['median']:.1f} ms for "
        f"everything else, {ours['prefill_ms']['median'] - floor['prefill_ms']['median']:.1f} ms in hub-export's file "
        f"and {peer['prefill_ms']['median'] - floor['prefill_ms']['median']:.1f} ms in the peer's.",
    ]
    if attention:
        lines.append(
            f"With ExecuTorch's attention operators, the least a file spends on a {PROMPT_TOKENS}-token prefill is "
            f"{attention['prefill_ms']['median']:.1f} ms ({attention['prefill_ms']['median'] / prefill_target:.2f}x "
            f"the prefill target of {prefill_target:.1f} ms), and {attention['decode_ms']['median']:.2f} ms a decode "
            f"step ({attention['decode_ms']['median'] / decode_target:.2f}x the decode target)."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", default="8da4w", choices=["8da4w", "8da8w"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--stock-mkl",
        action="store_true",
        help="Leave torch's MKL threads at its default in the rounds (hub-export runs .pte files with one).",
    )
    parser.add_argument("--isa", choices=["avx2"], help="Run every program on XNNPACK's kernels for this older CPU.")
    args = parser.parse_args()
    machine = machine_on_isa(args.isa)
    peer_run = RESULTS / f"peer-{args.qmode}.json"
    if not peer_run.is_file():
        raise SystemExit(f"no {peer_run.name}: run python -m benchmarks.peer --qmode {args.qmode} first")
    exported = json.loads(peer_run.read_text())["export"]
    files = {name: (ROOT / record["pte"], "file") for name, record in exported.items()}
    files[FLOOR] = (build_floor(args.qmode, WORK / f"normed-{args.qmode}.pte"), "floor")
    files[FLOOR_SDPA] = (build_floor(args.qmode, WORK / f"normed-sdpa-{args.qmode}.pte", attention=True), "floor")
    result = {
        "qmode": args.qmode,
        "rounds": args.rounds,
        "timing": measure(files, args.rounds, args.stock_mkl),
        "mkl_num_threads": round_env(args.stock_mkl).get("MKL_NUM_THREADS", "default"),
        # What the files are held to against the peer's: on AVX2, decode 1.1x and prefill 1.25x.
        "targets": {"decode": 1.1, "prefill": 1.25} if args.isa else {"decode": 1.25, "prefill": 1.5},
        "machine": machine,
        "command": f"python -m benchmarks.decode_floor --qmode {args.qmode}"
        + (" --stock-mkl" if args.stock_mkl else "")
        + (f" --rounds {args.rounds}" if args.rounds != 15 else "")
        + (f" --isa {args.isa}" if args.isa else ""),
    }
    name = (
        f"decode-floor-{args.qmode}" + ("-stock-mkl" if args.stock_mkl else "") + (f"-{args.isa}" if args.isa else "")
    )
    write_results(name, result, markdown(result))


if __name__ == "__main__":
    main()
