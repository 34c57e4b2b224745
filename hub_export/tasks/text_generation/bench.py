"""Bench: prefill and decode speed of a text-generation ``.pte``, what llama-bench is for GGUF files.

Each repeat runs in a fresh process set up as for any ``.pte`` (:mod:`hub_export.runtime.process_env`),
so its threads, caches and memory are the file's alone: ``prompt_tokens`` token ids go in
(one call when the file takes a dynamic length, else one at a time), then ``gen_tokens``
greedy steps, end-of-sequence ignored, through the file's ``forward`` from ExecuTorch's
Python binding (the C++ runner's binding cannot ignore EOS). Peak resident memory is the
process's high-water mark.

Example:
    >>> result = bench("out/model-8da4w-emb8w.pte", prompt_tokens=128, gen_tokens=128, repeat=3)
    >>> round(result.median("decode_tokens_per_s"))
    212
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hub_export.errors import InputError, VerificationError
from hub_export.runtime.process_env import XNNPACK_ISA_ENV, XNNPACK_ISAS, apply_xnnpack_isa, pte_process_env


@dataclass
class BenchResult:
    """Every repeat's figures: prefill and decode tokens/s, peak RSS, threads."""

    file: str
    prompt_tokens: int
    gen_tokens: int
    runs: list[dict] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(run[name] for run in self.runs)

    def spread(self, name: str) -> tuple[float, float]:
        values = [run[name] for run in self.runs]
        return min(values), max(values)


def run_once(pte: str, prompt_tokens: int, gen_tokens: int, threads: int | None) -> dict:
    """One repeat, in this (fresh) process: the figures as a dict."""
    isa = apply_xnnpack_isa()  # before ExecuTorch loads: XNNPACK picks its kernels once
    import torch

    from hub_export.patches import set_threads  # ExecuTorch's threadpool: sized in the measuring process only
    from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded in the measuring process only

    in_use = set_threads(threads)
    model = PteModel(pte)
    limit, vocab = int(model.metadata["get_max_seq_len"]), int(model.metadata["get_vocab_size"])
    dynamic = bool(model.metadata.get("enable_dynamic_shape"))
    ids = torch.randint(4, vocab, (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    if dynamic:
        logits = model.forward(ids, start_pos=0)
    else:
        for position in range(prompt_tokens):
            logits = model.forward(ids[:, position : position + 1], start_pos=position)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    for step in range(gen_tokens):
        token = torch.tensor([[int(logits.argmax())]])
        logits = model.forward(token, start_pos=prompt_tokens + step)
    decode = time.perf_counter() - started
    return {
        "prefill_tokens_per_s": prompt_tokens / prefill,
        "decode_tokens_per_s": gen_tokens / decode,
        "peak_rss_bytes": _peak_rss(),
        "threads": in_use,
        "isa": isa or "native",
        "max_seq_len": limit,
    }


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def bench(
    pte: str | Path,
    prompt_tokens: int = 128,
    gen_tokens: int = 128,
    threads: int | None = None,
    repeat: int = 3,
    isa: str | None = None,
) -> BenchResult:
    """Measure ``pte`` ``repeat`` times, each in a fresh process (see the module's docstring).

    ``isa="avx2"`` runs XNNPACK's AVX2 kernels on a CPU that has newer ones (AVX-512, VNNI): what the file does on an
    AVX2 laptop's code path, on this machine's cores (:func:`hub_export.patches.restrict_xnnpack_isa`).

    Raises:
        InputError: the file is not a text-generation file, or prompt and generated tokens exceed its context.
        VerificationError: the file fails to load or run.
    """
    from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded when a file is run

    pte = Path(pte)
    metadata = PteModel(pte).metadata
    if "get_max_context_len" not in metadata or "enable_dynamic_shape" not in metadata:  # the LLM runner's metadata
        raise InputError(f"{pte.name} is not a text-generation file; bench measures prefill and decode of those")
    if prompt_tokens < 1 or gen_tokens < 1 or prompt_tokens + gen_tokens > int(metadata["get_max_seq_len"]):
        raise InputError(
            f"--prompt-tokens {prompt_tokens} + --gen-tokens {gen_tokens} must fit the file's context of "
            f"{metadata['get_max_seq_len']} tokens"
        )
    if isa is not None and isa not in XNNPACK_ISAS:
        raise InputError(f"unknown --isa {isa!r}; choose one of: {', '.join(XNNPACK_ISAS)}")
    result = BenchResult(pte.name, prompt_tokens, gen_tokens)
    code = "import json, sys; from hub_export.tasks.text_generation.bench import run_once; print(json.dumps(run_once(*json.loads(sys.argv[1]))))"
    env = {**pte_process_env(), **({XNNPACK_ISA_ENV: isa} if isa else {})}
    for _ in range(repeat):
        arguments = json.dumps([str(pte), prompt_tokens, gen_tokens, threads])
        done = subprocess.run([sys.executable, "-c", code, arguments], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise VerificationError(f"{pte.name} failed while benchmarked ({last[:200]})")
        result.runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return result
