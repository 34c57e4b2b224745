"""Where a ``.pte``'s time goes: ExecuTorch's event tracer (ETDump) over one prefill and one decode step.

    python -m benchmarks.profile_pte FILE.pte [FILE.pte ...] [--prompt-tokens 60] [--steps 8]

For each file: the method's inputs, then a prefill of ``--prompt-tokens`` tokens at
position 0 and ``--steps`` decode steps after it, each run with the event tracer on.
Events are summed by name per phase (``DELEGATE_CALL`` is an XNNPACK partition;
``native_call_*`` an operator left outside XNNPACK, run by ExecuTorch's portable or
optimized kernels). Prints a table per file and writes
``benchmarks/results/profile-<name>.json``. Threads: ExecuTorch's default pool, or ``--threads N``
(``profile-<name>-tN.json``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.report import write_results


def _inputs(meta, tokens: list[int], position: int):
    """The forward inputs for ``tokens`` at ``position``: (ids [1, n], positions [n] or [1])."""
    import torch

    ids = torch.tensor([tokens], dtype=torch.long)
    second = meta.input_tensor_meta(1).sizes()
    positions = torch.arange(position, position + len(tokens), dtype=torch.long)
    if len(second) == 1 and second[0] == 1:
        positions = torch.tensor([position], dtype=torch.long)
    return [ids, positions]


def _phase_events(etdump: Path) -> list[dict[str, float]]:
    """Per executed forward call, the summed duration (ms) of each event name."""
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(etdump))
    calls: list[dict[str, float]] = []
    for block in inspector.event_blocks:
        events = [event for event in block.events if event.perf_data and event.name not in _LOADING]
        runs = max((len(event.perf_data.raw) for event in events), default=0)
        per_call = [defaultdict(float) for _ in range(runs)]
        for event in events:
            for index, value in enumerate(event.perf_data.raw):
                per_call[index][event.name] += value
        calls += [dict(call) for call in per_call if call]
    return calls


_LOADING = {"Program::load_method", "Method::init"}


def profile(pte: Path, prompt_tokens: int, steps: int) -> dict:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    import hub_export.runtime.pte

    hub_export.runtime.pte._load_kernels()
    module = _load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
    meta = module.method_meta("forward")
    inputs = [
        f"{meta.input_tensor_meta(i).dtype()} {list(meta.input_tensor_meta(i).sizes())}"
        for i in range(meta.num_inputs())
    ]
    tokens = [(17 * i + 5) % 400 + 10 for i in range(prompt_tokens)]  # inside every vocabulary here
    module.run_method("forward", _inputs(meta, tokens, 0))
    for step in range(steps):
        module.run_method("forward", _inputs(meta, [tokens[step % len(tokens)]], prompt_tokens + step))
    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) / "trace.etdp"
        module.write_etdump_result_to_file(str(dump))
        calls = _phase_events(dump)
    prefill, decode = calls[0], calls[1:]
    names = sorted({name for call in calls for name in call})
    decode_ms = {name: statistics.median([call.get(name, 0.0) for call in decode]) for name in names}
    return {
        "file": pte.name,
        "size_bytes": pte.stat().st_size,
        "inputs": inputs,
        "prompt_tokens": prompt_tokens,
        "decode_steps": steps,
        "prefill_ms": {name: round(value, 3) for name, value in sorted(prefill.items(), key=lambda kv: -kv[1])},
        "decode_ms_median": {name: round(value, 3) for name, value in sorted(decode_ms.items(), key=lambda kv: -kv[1])},
        "decode_counts": _counts(decode[0]),
    }


def _counts(call: dict[str, float]) -> dict:
    """What one forward call ran: XNNPACK partitions, XNNPACK operators, operators outside XNNPACK."""
    outside = sorted(name for name in call if name.startswith(("native_call_", "llama::", "quantized_decomposed::")))
    xnnpack_ops = [name for name in call if " #" in name or name.startswith(("Fully Connected", "Convert", "Multiply"))]
    return {"xnnpack_operator_events": len(xnnpack_ops), "outside_xnnpack": outside}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=60)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, help="Size of ExecuTorch's thread pool (default: one per core).")
    parser.add_argument("--isa", choices=["avx2"], help="Profile XNNPACK's kernels for this older CPU.")
    args = parser.parse_args()
    if args.isa:
        from hub_export.patches import restrict_xnnpack_isa

        restrict_xnnpack_isa(args.isa)  # before ExecuTorch's runtime loads
    if args.threads:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(args.threads)
    for pte in args.files:
        result = profile(pte, args.prompt_tokens, args.steps)
        suffix = (f"-t{args.threads}" if args.threads else "") + (f"-{args.isa}" if args.isa else "")
        write_results(f"profile-{pte.parent.name}-{pte.stem}{suffix}", result)
        print(f"\n{pte}: inputs {result['inputs']}")
        for phase in ("prefill_ms", "decode_ms_median"):
            total = sum(result[phase].values())
            print(f"  {phase}: total {total:.2f} ms")
            for name, value in list(result[phase].items())[:12]:
                print(f"    {value:9.3f} ms  {name}")


if __name__ == "__main__":
    main()
