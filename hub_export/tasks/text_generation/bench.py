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


def drafted_round(pte: str, tokenizer_dir: str, decoders: dict[str, dict], max_new_tokens: int,
                  threads: int | None = None, per_set: int | None = None) -> list[dict]:  # fmt: skip
    """One round, in this (fresh) process: every shipped prompt (``grounded``, then ``chat``) through the file
    alone (``"plain"``), then through each of ``decoders`` (name -> :func:`generate` settings; a ``"pte"``
    setting runs another file), greedy, through the chat template; ``per_set`` takes the first prompts of each set
    only. Returns one row per prompt."""
    from hub_export.tasks.text_generation.speculative import PROMPT_SETS, prompt_set  # the shipped prompts

    rows = []
    for kind in PROMPT_SETS:
        for prompt in prompt_set(kind)[:per_set]:
            row = {"set": kind, "prompt": prompt[:40]}
            try:
                for name, settings in {"plain": {}, **decoders}.items():
                    row[name] = _decode_figures(pte, tokenizer_dir, prompt, max_new_tokens, threads, dict(settings))
            except InputError as error:
                if error.code != "prompt_too_long":
                    raise
                continue  # a prompt longer than the file's context: not measured
            rows.append(row)
    return rows


def _decode_figures(pte: str, tokenizer_dir: str, prompt: str, max_new_tokens: int, threads, settings: dict) -> dict:
    from hub_export.tasks.text_generation.run import generate  # the ExecuTorch runtime: in the measuring process

    result = generate(settings.pop("pte", pte), tokenizer_dir, prompt, max_new_tokens=max_new_tokens,
                      threads=threads, **settings)  # fmt: skip
    figures = result.speculation
    return {
        "decode_tokens_per_s": result.decode_tokens_per_s,
        "tokens": result.generated_tokens,
        "text": result.text,
        "proposed": figures.proposed if figures else 0,
        "accepted": figures.accepted if figures else 0,
        "calls": figures.calls if figures else result.generated_tokens - 1,
    }


def summarize_drafted(rounds: list[list[dict]], decoders: list[str]) -> dict:
    """Per prompt set and decoder: speed-up over plain on the same prompt in the same process (median and range),
    decode tok/s, acceptance, tokens per call, and on how many prompts the text was the plain one."""
    table = {}
    from hub_export.tasks.text_generation.speculative import PROMPT_SETS  # the shipped prompts, in order

    for kind in sorted({row["set"] for one in rounds for row in one}, key=PROMPT_SETS.index):
        rows = [row for one in rounds for row in one if row["set"] == kind]
        for name in decoders:
            runs = [row[name] for row in rows]
            ratios = [row[name]["decode_tokens_per_s"] / row["plain"]["decode_tokens_per_s"] for row in rows]
            speeds = [run["decode_tokens_per_s"] for run in runs]
            proposed = sum(run["proposed"] for run in runs)
            table[f"{kind}/{name}"] = {
                "speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
                "decode_tokens_per_s": statistics.median(speeds),
                "acceptance": sum(run["accepted"] for run in runs) / proposed if proposed else None,
                "tokens_per_call": sum(run["tokens"] - 1 for run in runs) / max(1, sum(run["calls"] for run in runs)),
                "same_text": sum(run["text"] == row["plain"]["text"] for run, row in zip(runs, rows, strict=True)),
                "prompts": len(rows),
            }
    return table


def bench_drafted(pte: str | Path, tokenizer_dir: str | Path, decoders: dict[str, dict], max_new_tokens: int = 128,
                  repeat: int = 1, threads: int | None = None, per_set: int | None = None) -> dict:  # fmt: skip
    """:func:`drafted_round` ``repeat`` times, each in a fresh process, summarized by :func:`summarize_drafted`.

    Example:
        >>> table = bench_drafted("out/model-8da8w-emb8w.pte", "out", {"lookup": {"lookup": True}})
        >>> round(table["grounded/lookup"]["speedup"]["median"], 1)
        1.6
    """
    code = ("import json, sys; from hub_export.tasks.text_generation.bench import drafted_round; "
            "print(json.dumps(drafted_round(*json.loads(sys.argv[1]))))")  # fmt: skip
    rounds = []
    for _ in range(repeat):
        arguments = json.dumps([str(pte), str(tokenizer_dir), decoders, max_new_tokens, threads, per_set])
        done = subprocess.run([sys.executable, "-c", code, arguments], capture_output=True, text=True,
                              env=pte_process_env())  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise VerificationError(f"{Path(pte).name} failed while benchmarked ({last[:200]})")
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"table": summarize_drafted(rounds, list(decoders)), "rounds": rounds}


def lookup_record(pte: str | Path, tokenizer_dir: str | Path, max_rows: int, new_tokens: int = 48,
                  per_set: int = 2) -> dict:  # fmt: skip
    """What a manifest records of a ``--speculative`` file: prompt lookup's speed-up and acceptance on the first
    ``per_set`` prompts of each shipped set, ``new_tokens`` each, in a fresh process (:func:`bench_drafted`)."""
    table = bench_drafted(pte, tokenizer_dir, {"lookup": {"lookup": True}}, new_tokens, per_set=per_set)["table"]
    record: dict = {"max_rows": max_rows}
    if set(table) != {"grounded/lookup", "chat/lookup"}:
        return record  # the shipped prompts do not fit the file's context: not timed
    record |= {"new_tokens": new_tokens, "prompts": min(table[key]["prompts"] for key in table)}
    for kind in ("grounded", "chat"):
        row = table[f"{kind}/lookup"]
        record[f"{kind}_speedup"] = round(row["speedup"]["median"], 2)
        if row["acceptance"] is not None:
            record[f"{kind}_acceptance"] = round(row["acceptance"], 2)
    return record
