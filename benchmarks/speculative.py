"""Speculative decoding against plain decoding, in the same processes, on the shipped prompt sets.

    python -m benchmarks.speculative FOLDER [--target 8da8w] [--draft 8da4w] [--rounds 3] [--max-new-tokens 128]
    python -m benchmarks.speculative FOLDER --rows-only [--target 8da4w] [--name NAME]

FOLDER is an export made with ``--speculative`` holding the target and draft variants (e.g.
``hub-export export SmolLM2-135M-Instruct.Q4_1.gguf -o out --qmode 8da8w --qmode 8da4w --qembedding 8w
--speculative``). Each round is a fresh process (set up as ``hub-export generate`` runs) that takes every
prompt of ``grounded`` and ``chat`` (:func:`hub_export.tasks.text_generation.speculative.prompt_set`)
through four decoders in turn, greedy, through the chat template: the target alone, the target with
``lookup``, the target with the draft variant, and the draft alone. Per prompt the speed-up is the
decoder's decode tokens/s over the target alone in the same process; the table gives its median over
prompts and rounds, with acceptance and tokens per call. Every drafted output is compared with the
target's own: "same text" counts the prompts where they are identical.

The rows table times ``forward_rows`` with 1..16 rows against ``forward`` on one token (median of 30
calls each, interleaved), which is what a rejected draft of ``rows - 1`` tokens costs, and gives how far
the file's logits move when a position is computed inside a chunk rather than alone (float rounding,
which dynamic int8 activation quantization can round to a whole step).
Writes ``benchmarks/results/speculative[-NAME].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.report import machine_on_isa, write_results
from hub_export.runtime.process_env import pte_process_env
from hub_export.tasks.text_generation.bench import bench_drafted, summarize_drafted

_ROWS = """
import json, statistics, sys, time
from hub_export.runtime.process_env import prepare_pte_process
prepare_pte_process()
import torch
from hub_export.runtime.pte import PteModel
model = PteModel(sys.argv[1], load=("forward", "forward_rows"))
prompt = torch.tensor([[(17 * i + 5) % 400 + 10 for i in range(60)]])
model.forward(prompt, 0)
sizes = [1, 2, 3, 4, 6, 8, 12, 16]
times = {"forward": []} | {size: [] for size in sizes}
for _ in range(30):
    start = time.perf_counter(); model.forward(prompt[:, :1], 60); times["forward"].append(time.perf_counter() - start)
    for size in sizes:
        ids = prompt[:, :size]
        start = time.perf_counter()
        model.forward_rows(ids, 60, torch.arange(size))
        times[size].append(time.perf_counter() - start)
costs = {str(key): statistics.median(value) * 1e3 for key, value in times.items()}
whole = model.forward(prompt, 0).clone()  # the same logits, computed with the last token in the chunk or alone
model.forward(prompt[:, :-1], 0)
alone = model.forward(prompt[:, -1:], 59)
costs["chunk_noise"] = float((whole - alone).abs().max())
print(json.dumps(costs))
"""


def _variant(folder: Path, qmode: str) -> Path:
    matches = sorted(folder.glob(f"*-{qmode}*.pte"))
    if len(matches) != 1:
        raise SystemExit(f"expected one {qmode} .pte in {folder}, found {len(matches)}")
    return matches[0]


def _run(code: str, *arguments: str) -> object:
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True,
                          env=pte_process_env())  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(result: dict) -> str:
    lines = [
        f"### Speculative decoding: {result['target']}" + (f" (draft {result['draft']})" if result["draft"] else ""),
        "",
        f"Machine: {result['machine']}. {result['rounds']} fresh processes, each prompt through every decoder in "
        f"turn, greedy, chat template, up to {result['max_new_tokens']} new tokens. Speed-up: decode tokens/s over "
        "the target alone on the same prompt in the same process (median, range over prompts and rounds).",
        "",
        "| prompts | decoder | speed-up | decode tok/s | accepted | tokens per call | same text as plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in result["table"].items():
        kind, name = key.split("/")
        speedup, speed = row["speedup"], row["decode_tokens_per_s"]
        accepted = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else "-"
        lines.append(
            f"| {kind} | {name} | {speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f}) | "
            f"{speed:.0f} | {accepted} | {row['tokens_per_call']:.2f} | {row['same_text']} of {row['prompts']} |"
        )
    return "\n".join(lines) + "\n"


def rows_markdown(name: str, machine: str, costs: dict) -> str:
    base = costs["forward"]
    noise = costs.get("chunk_noise")
    lines = [
        f"### forward_rows cost: {name}",
        "",
        f"Machine: {machine}. Median of 30 interleaved calls at position 60; a draft of `rows - 1` tokens that is "
        "rejected costs the difference to `forward` on one token.",
        "",
        "| rows | ms per call | x forward (1 token) |",
        "|---|---|---|",
        f"| forward | {base:.2f} | 1.00 |",
    ]
    lines += [
        f"| {key} | {value:.2f} | {value / base:.2f} |"
        for key, value in costs.items()
        if key not in ("forward", "chunk_noise")
    ]
    if noise is not None:
        lines += [
            "",
            f"Largest difference in the 60th position's logits between scoring it inside the 60-token chunk and "
            f"alone after 59: {noise:.2g}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--target", default="8da8w")
    parser.add_argument("--draft", default="8da4w", help="the draft variant, or none (lookup only)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rows-only", action="store_true", help="only the forward_rows cost table")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    machine = machine_on_isa(None)
    target = _variant(args.folder, args.target)
    suffix = f"-{args.name}" if args.name else ""
    costs = _run(_ROWS, str(target))
    write_results(f"speculative-rows{suffix}", {"file": target.name, "machine": machine, "ms": costs},
                  rows_markdown(target.name, machine, costs))  # fmt: skip
    if args.rows_only:
        return
    decoders = {"lookup": {"lookup": True}}
    draft = None if args.draft == "none" else _variant(args.folder, args.draft)
    if draft is not None:
        decoders |= {"draft": {"draft": str(draft)}, "draft alone": {"pte": str(draft)}}
    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}", file=sys.stderr, flush=True)
        rounds.append(bench_drafted(target, args.folder, decoders, args.max_new_tokens)["rounds"][0])
    result = {
        "target": target.name,
        "draft": draft.name if draft else None,
        "machine": machine,
        "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "table": summarize_drafted(rounds, list(decoders)),
        "runs": rounds,
    }
    write_results(f"speculative{suffix}", result, markdown(result))
    print(
        f"median speed-up over all: {statistics.median(r['speedup']['median'] for r in result['table'].values()):.2f}"
    )


if __name__ == "__main__":
    main()
