"""Verify: prove a ``.pte`` computes what the eager model computes, and measure what it lost.

Two token sequences are run through the ``.pte`` in the ExecuTorch runtime, one
forward per token so the KV cache is exercised at every position:

- a short fixed prompt extended greedily by fp32 eager (prefill, then decode steps);
- windows of an English evaluation text shipped with the package
  (``hub_export/data/eval_en.txt``), ``quality_tokens`` predictions in all.

Pass or fail compares the runtime with the eager model carrying the *same*
quantization: next-token top-1 agreement and mean KL divergence over every position.
A broken file (wrong rope, a swapped layer, a mask off by one) moves the distribution
far; an honest difference between int8 kernels does not (thresholds below, measured).
What quantization itself costs is reported against fp32 eager on the evaluation
text: perplexity and its ratio to fp32's, top-1 agreement and KL.

To keep verification cheap in memory, reference distributions are stored as their
top ``TOP_K`` log-probabilities plus the mass of the rest (the KL of the rest is
taken as one bucket, which bounds it from below and is exact when the tails agree).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path

import torch

from hub_export.bug_log import as_bug
from hub_export.errors import VerificationError, first_line
from hub_export.patches import release_memory, set_threads, trim_heap
from hub_export.pipeline.records import Quality, Verification
from hub_export.progress import time_left
from hub_export.runtime.pte import PteModel, runner_generate
from hub_export.tasks.text_generation.export import eager_attention, sliced_embedding, sliced_head

VERIFY_PROMPT = "Once upon a time, in a small town by the sea, there lived"
DECODE_STEPS = 8
RUNNER_NEW_TOKENS = 16
EVAL_TEXT = "eval_en.txt"
SECOND_EVAL_TEXT = "eval_docs_en.txt"  # technical documentation: another register than the prose
DEFAULT_QUALITY_TOKENS = 2048
MAX_WINDOW = 512  # tokens per evaluation window (less when the cache is shorter)
TOP_K = 128
STATS_ROWS = 64  # positions whose full-vocabulary log-probs are held at once
# The judge compares the runtime with quantized eager on the prompt and the first
# windows of the text only: torchao's reference int8 kernels are slow in eager, and
# about 500 positions already separate a broken file from an honest one.
JUDGE_TEXT_TOKENS = 512

# Pass/fail: the runtime against the eager model with the same quantization.
# Measured on real SmolLM2-135M-Instruct and Gemma 3 270M (see the README, "How
# verification judges a file"): an honest export stays below a tenth of these KL
# bounds, while a layer swap, a rope change or a mask off by one exceeds them
# several times over. fp32 and weight-only files run the same float math as eager
# and get tight bounds; dynamically quantized activations are rounded by different
# int8 kernels (XNNPACK vs torchao's reference), which moves a few near-ties.
MAX_MEAN_KL = {"fp32": 1e-3, "weight_only": 0.02, "dynamic": 0.1}
MIN_TOP1 = {"fp32": 0.98, "weight_only": 0.9, "dynamic": 0.8}
# Near-ties: where the reference itself barely prefers its top token (random-weight
# models are full of them), the runtime picking the runner-up within this many nats
# of log-probability still counts as agreement for the judge.
TIE_NATS = {"fp32": 1e-3, "weight_only": 1e-2, "dynamic": 0.05}
FP32_MAX_ABS = 1e-3  # relative to the logit scale: an fp32 file must be float-exact


@dataclass
class TokenStats:
    """A compact next-token distribution per position: top-k log-probs and the target's."""

    top_ids: torch.Tensor  # [positions, k] long
    top_logprobs: torch.Tensor  # [positions, k] float32
    target_logprobs: torch.Tensor  # [positions] float32 (empty when there is no target)

    @classmethod
    def of(cls, logits: torch.Tensor, targets: torch.Tensor | None = None, k: int = TOP_K) -> TokenStats:
        """The stats of ``logits`` [positions, vocab], :data:`STATS_ROWS` positions at a time: a window's
        log-probs whole would be another copy of its logits (0.5 GB over Gemma's 262,144 words and 512 tokens)."""
        parts = []
        for start in range(0, max(logits.shape[0], 1), STATS_ROWS):
            logprobs = torch.log_softmax(logits[start : start + STATS_ROWS].float(), dim=-1)
            top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
            target = torch.empty(0)
            if targets is not None:
                target = logprobs.gather(-1, targets[start : start + STATS_ROWS].view(-1, 1)).squeeze(-1)
            parts.append(cls(top.indices, top.values, target))
        return cls.concat(parts)

    @classmethod
    def concat(cls, parts: list[TokenStats]) -> TokenStats:
        return cls(
            *(torch.cat([getattr(p, name) for p in parts]) for name in ("top_ids", "top_logprobs", "target_logprobs"))
        )

    @property
    def argmax(self) -> torch.Tensor:
        return self.top_ids[:, 0]


def top1_within_ties(reference: TokenStats, logprobs: torch.Tensor, tie: float) -> float:
    """Share of positions where the candidate's top token is the reference's, or the candidate rates the
    reference's top token within ``tie`` nats of its own pick (a near-tie it merely broke the other way)."""
    gap = logprobs.max(-1).values - logprobs.gather(-1, reference.argmax.view(-1, 1)).squeeze(-1)
    return (gap <= tie).float().mean().item()


def kl_rows(reference: TokenStats, q_top: torch.Tensor) -> torch.Tensor:
    """KL(reference || candidate) per position, from the candidate's log-probs at the reference's top ids."""
    p = reference.top_logprobs.exp()
    head = (p * (reference.top_logprobs - q_top)).sum(-1)
    rest_p = (1 - p.sum(-1)).clamp_min(1e-12)
    rest_q = (1 - q_top.exp().sum(-1)).clamp_min(1e-12)
    tail = rest_p * (rest_p.log() - rest_q.log())
    return (head + tail).clamp_min(0)


def mean_kl(reference: TokenStats, logprobs: torch.Tensor) -> float:
    """Mean KL(reference || candidate) over positions; ``logprobs`` are the candidate's, full width."""
    return float(kl_rows(reference, logprobs.gather(-1, reference.top_ids)).mean())


@dataclass
class Sequences:
    """The token sequences every variant is run on."""

    prompt_tokens: torch.Tensor  # [1, prompt_len + decode steps]
    prompt_len: int
    windows: list[torch.Tensor] = field(default_factory=list)  # each [1, n], fed from position 0
    text_name: str = EVAL_TEXT
    second_windows: list[torch.Tensor] = field(default_factory=list)  # the second text's (quality only)
    second_name: str = SECOND_EVAL_TEXT
    runner_prompt: str = VERIFY_PROMPT
    runner_new_tokens: int = RUNNER_NEW_TOKENS

    @property
    def eval_predictions(self) -> int:
        return sum(w.shape[1] - 1 for w in self.windows)


@dataclass
class Reference:
    """The sequences and fp32 eager's logits (prompt) and distributions (evaluation text)."""

    sequences: Sequences
    fp32_prompt_logits: torch.Tensor  # [positions, vocab]
    fp32_text: TokenStats | None
    fp32_second: TokenStats | None = None


@dataclass
class Expected:
    """What the ``.pte`` must reproduce: the quantized eager model over the same sequences."""

    prompt_logits: torch.Tensor
    text: TokenStats | None


def text_config(config):
    """The text part of a (possibly multimodal) config."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def token_ids(model) -> tuple[int | None, list[int]]:
    """BOS id and the union of EOS ids from the generation config and the model config."""
    gen = getattr(model, "generation_config", None)
    text = text_config(model.config)
    bos = getattr(gen, "bos_token_id", None)
    bos = bos if bos is not None else getattr(text, "bos_token_id", None)
    eos: list[int] = []
    for value in (getattr(gen, "eos_token_id", None), getattr(text, "eos_token_id", None)):
        eos += [i for i in _ids(value) if i not in eos]
    return (bos[0] if isinstance(bos, list) else bos), eos


def eval_text(name: str = EVAL_TEXT) -> str:
    return resources.files("hub_export").joinpath("data", name).read_text(encoding="utf-8")


def _eager_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), eager_attention(model):
        return model(input_ids=tokens).logits[0].float()


def _bos_prefix(tokenizer, bos_id: int | None) -> list[int]:
    # Prepend BOS only where the tokenizer itself adds it (Gemma does, SmolLM2 does not).
    probe = tokenizer.encode("a").ids
    return [bos_id] if bos_id is not None and probe and probe[0] == bos_id else []


def build_sequences(
    tokenizer_json: Path,
    max_seq_len: int,
    quality_tokens: int,
    bos_id: int | None = None,
    model=None,
    logits_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Sequences:
    """Tokenize the prompt (extended greedily by ``model``, or by ``logits_of(tokens)``: eager fp32 logits
    [n, vocab]) and cut the evaluation text into windows."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    ids = tokenizer.encode(VERIFY_PROMPT).ids
    # Everything must fit the cache: prompt + decode steps <= max_seq_len.
    ids = ids[: min(len(ids), max(1, max_seq_len - DECODE_STEPS), 32)] or [0]
    steps = min(DECODE_STEPS, max_seq_len - len(ids))
    tokens = torch.tensor([ids], dtype=torch.long)
    if model is not None:
        logits_of = partial(_eager_logits, model)
    if logits_of is not None:
        for _ in range(steps):
            next_id = logits_of(tokens)[-1].argmax()
            tokens = torch.cat([tokens, next_id.view(1, 1)], dim=1)
    prefix = _bos_prefix(tokenizer, bos_id)
    windows = _windows(tokenizer, eval_text(), quality_tokens, max_seq_len, prefix)
    # The second text is scored on half as many tokens: it asks "does the recipe hold on other text", not
    # "how good is the file", and each token is one runtime call.
    second = _windows(tokenizer, eval_text(SECOND_EVAL_TEXT), quality_tokens // 2, max_seq_len, prefix)
    runner_prompt = _fitting_prompt(tokenizer, max_seq_len)
    runner_new_tokens = max(1, min(RUNNER_NEW_TOKENS, max_seq_len - len(tokenizer.encode(runner_prompt).ids)))
    return Sequences(tokens, len(ids), windows, EVAL_TEXT, second, SECOND_EVAL_TEXT, runner_prompt, runner_new_tokens)


def _windows(tokenizer, text: str, quality_tokens: int, max_seq_len: int, prefix: list[int]) -> list[torch.Tensor]:
    """``text`` cut into windows fed from position 0, ``quality_tokens`` predictions in all."""
    windows: list[torch.Tensor] = []
    if quality_tokens <= 0:
        return windows
    text_ids = tokenizer.encode(text, add_special_tokens=False).ids
    body = min(max_seq_len, MAX_WINDOW) - len(prefix)
    wanted, start = quality_tokens, 0
    while wanted > 0 and body >= 2 and start + 2 <= len(text_ids):
        # a window of n tokens yields n - 1 predictions (n with a BOS prefix)
        take = min(body, wanted + (0 if prefix else 1), len(text_ids) - start)
        chunk = prefix + text_ids[start : start + take]
        windows.append(torch.tensor([chunk], dtype=torch.long))
        wanted -= len(chunk) - 1
        start += take
    return windows


def _text_stats(logits_of: Callable[[torch.Tensor], torch.Tensor], windows: list[torch.Tensor]) -> TokenStats | None:
    if not windows:
        return None
    parts = []
    for window in windows:
        logits = logits_of(window)[:-1]
        parts.append(TokenStats.of(logits, window[0, 1:]))
        del logits
    return TokenStats.concat(parts)


def build_reference(
    model,
    tokenizer_json: Path,
    max_seq_len: int,
    quality_tokens: int = DEFAULT_QUALITY_TOKENS,
    bos_id: int | None = None,
) -> Reference:
    """The sequences and fp32 eager's view of them (``model`` is the unquantized model)."""
    sequences = build_sequences(tokenizer_json, max_seq_len, quality_tokens, bos_id, model)
    return reference_of(sequences, partial(_eager_logits, model))


def reference_windows(sequences: Sequences) -> list[torch.Tensor]:
    """Every token sequence the reference runs through the fp32 model: the prompt, then the texts' windows."""
    return [sequences.prompt_tokens, *sequences.windows, *sequences.second_windows]


def reference_of(sequences: Sequences, logits_of: Callable[[torch.Tensor], torch.Tensor]) -> Reference:
    """The reference of ``sequences`` given fp32 eager's logits [n, vocab] for each of :func:`reference_windows`."""
    prompt_logits = logits_of(sequences.prompt_tokens)[sequences.prompt_len - 1 :]
    return Reference(
        sequences,
        prompt_logits,
        _text_stats(logits_of, sequences.windows),
        _text_stats(logits_of, sequences.second_windows),
    )


def _fitting_prompt(tokenizer, max_seq_len: int) -> str:
    """The longest word prefix of the prompt that leaves the runner room to generate."""
    words = VERIFY_PROMPT.split()
    for count in range(len(words), 0, -1):
        text = " ".join(words[:count])
        if len(tokenizer.encode(text).ids) < max_seq_len:
            return text
    return words[0]


def expected_logits(quantized_model, reference: Reference) -> Expected:
    """The quantized eager model over the reference sequences.

    Taken before lowering, so the eager model can be freed before the runtime loads
    the program (an fp32 variant would otherwise hold its weights three times).
    """
    seq = reference.sequences
    with sliced_head(quantized_model), sliced_embedding(quantized_model):
        prompt = _eager_logits(quantized_model, seq.prompt_tokens)[seq.prompt_len - 1 :]
        return Expected(prompt, _text_stats(partial(_eager_logits, quantized_model), judged_windows(seq.windows)))


def judged_windows(windows: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leading windows (at least :data:`JUDGE_TEXT_TOKENS` predictions) the judge compares with eager."""
    chosen, count = [], 0
    for window in windows:
        if count >= JUDGE_TEXT_TOKENS:
            break
        chosen.append(window)
        count += window.shape[1] - 1
    return chosen


def _pte_rows(pte: PteModel, tokens: torch.Tensor, prefill: int, last: int):
    """Yield the runtime's logits: one row after prefilling ``prefill`` tokens, then one per decoded token up to ``last``."""
    yield pte.forward(tokens[:, :prefill], start_pos=0)
    for pos in range(prefill, last):
        yield pte.forward(tokens[:, pos : pos + 1], start_pos=pos)


def _runtime_steps(seq: Sequences) -> int:
    """How many calls verification makes to the runtime: the prompt's, then each evaluation window's."""
    prompt = seq.prompt_tokens.shape[1] - seq.prompt_len + 1
    return prompt + sum(max(int(w.shape[1]) - 1, 0) for w in [*seq.windows, *seq.second_windows])


def _relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Worst position's ``||actual - expected|| / ||expected||``."""
    return ((actual - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-12)).max().item()


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


@dataclass
class _TextRun:
    """What verification keeps of the runtime's pass over the text: a few numbers per position, not the
    full vocabulary (2,048 x 49,152 log-probs would add about 1 GB to the export's peak)."""

    argmax: torch.Tensor  # [N]
    target_lp: torch.Tensor  # [N]
    fp32_top: torch.Tensor | None  # [N, k]: log-probs at fp32's top ids
    eager_top: torch.Tensor | None  # [M, k]: log-probs at quantized eager's top ids (judged positions)
    eager_gap: torch.Tensor | None  # [M]: own max minus the log-prob of eager's top token
    finite: bool = True


class _Steps:
    """The runtime's calls during verification, counted, with a progress line and the time left about every tenth
    of them."""

    def __init__(self, say: Callable[[str], None], total: int):
        self.say, self.total, self.done, self.started = say, total, 0, time.perf_counter()
        self.every = max(16, total // 10)

    def counting(self, rows):
        for row in rows:
            yield row
            self.done += 1
            if self.done % self.every == 0:
                trim_heap()  # the steps' freed temporaries, which the heap would otherwise keep
                self.say(
                    f"verifying: {self.done} of {self.total} runtime steps{time_left(self.started, self.done, self.total)}"
                )


def runtime_scores(
    pte: PteModel, windows: list[torch.Tensor], say: Callable[[str], None] = lambda message: None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``.pte``'s log-probability of each next token of ``windows`` (token ids [1, n], each fed from position 0)
    and its top token there, one runtime step per position as verification scores a file; ``say`` gets progress.

    Example:
        >>> target_logprobs, top_ids = runtime_scores(PteModel(path), [torch.tensor([[1, 2, 3]])])
        >>> target_logprobs.shape
        torch.Size([2])
    """
    steps = _Steps(say, sum(int(window.shape[1]) - 1 for window in windows))
    run = _runtime_text(pte, windows, None, None, steps)
    if run is None:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    return run.target_lp, run.argmax


def _runtime_text(
    pte: PteModel, windows: list[torch.Tensor], fp32: TokenStats | None, eager: TokenStats | None, steps: _Steps
) -> _TextRun | None:
    """Run every evaluation window through the runtime, keeping only what the figures need."""
    if not windows:
        return None
    argmax, target_lp, fp32_top, eager_top, eager_gap, finite = [], [], [], [], [], True
    index = 0
    for window in windows:
        for offset, row in enumerate(steps.counting(_pte_rows(pte, window, 1, window.shape[1] - 1))):
            lp = torch.log_softmax(row.float(), -1)
            finite = finite and bool(torch.isfinite(lp).all())
            argmax.append(lp.argmax())
            # A 0-d tensor index gives a view that would pin the whole row (2,048 rows: 400 MB).
            target_lp.append(lp[window[0, offset + 1]].clone())
            if fp32 is not None:
                fp32_top.append(lp[fp32.top_ids[index]])
            if eager is not None and index < eager.top_ids.shape[0]:
                eager_top.append(lp[eager.top_ids[index]])
                eager_gap.append(lp.max() - lp[eager.argmax[index]])
            index += 1
    stack = lambda rows: torch.stack(rows) if rows else None  # noqa: E731
    return _TextRun(
        torch.stack(argmax), torch.stack(target_lp), stack(fp32_top), stack(eager_top), stack(eager_gap), finite
    )


def _quality(text_name: str, run: _TextRun, fp32: TokenStats) -> Quality:
    perplexity = math.exp(-run.target_lp.mean().item())
    fp32_perplexity = math.exp(-fp32.target_logprobs.mean().item())
    return Quality(
        text=text_name,
        tokens=int(run.target_lp.numel()),
        perplexity=perplexity,
        fp32_perplexity=fp32_perplexity,
        ratio=perplexity / fp32_perplexity,
        top1=(run.argmax == fp32.argmax).float().mean().item(),
        kl=float(kl_rows(fp32, run.fp32_top).mean()),
    )


class _Judgement:
    """The figures of one verification as they are gathered, and the record they make."""

    def __init__(self, expected: Expected, reference: Reference, kind: str):
        eager, fp32_logits = expected.prompt_logits, reference.fp32_prompt_logits
        self.scale = eager.abs().max().item()
        self.quant = dict(
            quant_max_abs_diff_vs_fp32=(eager - fp32_logits).abs().max().item(),
            quant_relative_l2_vs_fp32=_relative_l2(eager, fp32_logits),
            quant_top1_vs_fp32=_top1(eager, fp32_logits),
        )
        self.limits = dict(max_kl=MAX_MEAN_KL[kind], min_top1=MIN_TOP1[kind])
        self.second_quality: Quality | None = None
        self.figures = dict(
            positions=eager.shape[0],
            mean_kl_vs_eager=float("nan"),
            top1_agreement=0.0,
            top1_within_ties=0.0,
            max_abs_diff=float("nan"),
            relative_l2=float("nan"),
        )

    def result(
        self, passed: bool, failure: str | None = None, runner: dict | None = None, quality: Quality | None = None
    ) -> Verification:
        runner = runner or {}
        return Verification(
            passed,
            **self.figures,
            **self.limits,
            **self.quant,
            runner_generated_tokens=int(runner.get("generated_tokens", 0)),
            runner_prefill_tokens_per_s=runner.get("prefill_token_per_sec"),
            runner_decode_tokens_per_s=runner.get("decode_token_per_sec"),
            runner_threads=runner.get("threads") if isinstance(runner.get("threads"), int) else None,
            failure=failure,
            quality=quality,
            second_quality=self.second_quality,
        )


def verify(
    pte_path: Path,
    expected: Expected,
    reference: Reference,
    tokenizer_json: Path,
    kind: str,
    say: Callable[[str], None] = lambda message: None,
) -> Verification:
    """Compare ``pte_path`` with ``expected`` (:func:`expected_logits`), measure its quality, run the C++ runner.

    ``kind`` picks the thresholds: ``fp32``, ``dynamic`` (int8 dynamic activations) or
    ``weight_only``. A file that fails to load, run or match gives a failed
    :class:`Verification` naming why. ``say`` gets a progress line, with the time left, as the runtime decodes.

    Raises:
        InternalError: a bug in hub-export itself (its traceback is saved in a log file).
    """
    seq = reference.sequences
    judgement = _Judgement(expected, reference, kind)
    try:
        pte = PteModel(pte_path)
        steps = _Steps(say, _runtime_steps(seq))
        prompt_rows = torch.stack(
            list(steps.counting(_pte_rows(pte, seq.prompt_tokens, seq.prompt_len, seq.prompt_tokens.shape[1])))
        )
        text = _runtime_text(pte, seq.windows, reference.fp32_text, expected.text, steps)
        second = _runtime_text(pte, seq.second_windows, reference.fp32_second, None, steps)
        del pte  # the runner below loads its own copy of the program
        release_memory()  # before the runner's process starts beside this one
    except VerificationError as error:  # the file's own failure: it does not load, run or return logits
        return judgement.result(False, f"runtime error: {first_line(error)[:200]}")
    except Exception as error:  # anything else is hub-export's bug, not the file's
        raise as_bug(error, f"verifying {pte_path.name}") from error
    if not torch.isfinite(prompt_rows).all() or any(run is not None and not run.finite for run in (text, second)):
        return judgement.result(False, "the runtime produced non-finite logits")

    judgement.figures.update(_agreement(prompt_rows, expected, text, TIE_NATS[kind]))
    quality = None
    if reference.fp32_text is not None and text is not None:
        quality = _quality(seq.text_name, text, reference.fp32_text)
    if reference.fp32_second is not None and second is not None:
        judgement.second_quality = _quality(seq.second_name, second, reference.fp32_second)
    failure = _failure(judgement, kind)
    if failure:
        return judgement.result(False, failure, quality=quality)

    try:
        stats = runner_generate(pte_path, tokenizer_json, seq.runner_prompt, seq.runner_new_tokens)
    except VerificationError as error:
        return judgement.result(False, f"TextLLMRunner failed: {first_line(error)[:200]}", quality=quality)
    except Exception as error:
        raise as_bug(error, f"running {pte_path.name} in TextLLMRunner") from error
    # The runner ran on ExecuTorch's default threadpool (the performance cores), as sized in this process too.
    stats.setdefault("threads", set_threads(None))
    generated = int(stats.get("generated_tokens", 0))
    # The runner counts tokens after the first; a context with room for one new token
    # (--max-seq-len 2) can only prove the program runs.
    if generated < 1 and seq.runner_new_tokens > 1:
        return judgement.result(False, "TextLLMRunner generated no token", stats, quality)
    return judgement.result(True, None, stats, quality)


def _agreement(prompt_rows: torch.Tensor, expected: Expected, text: _TextRun | None, tie_nats: float) -> dict:
    """How closely the runtime's distributions follow quantized eager's, over the prompt and the judged text.

    A position agrees "within ties" when eager's top token is within ``tie_nats`` of the runtime's own top.
    """
    eager = expected.prompt_logits
    prompt_logprobs = torch.log_softmax(prompt_rows.float(), -1)
    eager_prompt = TokenStats.of(eager)
    kl = [kl_rows(eager_prompt, prompt_logprobs.gather(-1, eager_prompt.top_ids))]
    agree = [prompt_logprobs.argmax(-1) == eager_prompt.argmax]
    gaps = [prompt_logprobs.max(-1).values - prompt_logprobs.gather(-1, eager_prompt.argmax.view(-1, 1)).squeeze(-1)]
    if text is not None and text.eager_top is not None:
        judged = text.eager_top.shape[0]
        kl.append(
            kl_rows(
                TokenStats(expected.text.top_ids[:judged], expected.text.top_logprobs[:judged], torch.empty(0)),
                text.eager_top,
            )
        )
        agree.append(text.argmax[:judged] == expected.text.argmax[:judged])
        gaps.append(text.eager_gap)
    kl_all, gap_all = torch.cat(kl), torch.cat(gaps)
    return dict(
        positions=kl_all.shape[0],
        mean_kl_vs_eager=float(kl_all.mean()),
        top1_agreement=torch.cat(agree).float().mean().item(),
        top1_within_ties=(gap_all <= tie_nats).float().mean().item(),
        max_abs_diff=(prompt_rows - eager).abs().max().item(),
        relative_l2=_relative_l2(prompt_rows, eager),
    )


def _failure(judgement: _Judgement, kind: str) -> str | None:
    """Why the runtime's figures fail ``kind``'s thresholds, or None when they pass."""
    figures, limits = judgement.figures, judgement.limits
    kl, top1 = figures["mean_kl_vs_eager"], figures["top1_within_ties"]
    if kl > limits["max_kl"]:
        return (
            f"mean KL from eager {kl:.3g} exceeds {limits['max_kl']:.3g} over {figures['positions']} positions "
            f"(top-1 agreement {top1:.0%})"
        )
    if top1 < limits["min_top1"]:
        return (
            f"top-1 agreement with eager {top1:.0%} (near-ties counted) is below "
            f"{limits['min_top1']:.0%} over {figures['positions']} positions"
        )
    bound = FP32_MAX_ABS * max(judgement.scale, 1.0)
    if kind == "fp32" and figures["max_abs_diff"] > bound:
        return f"max abs logit diff {figures['max_abs_diff']:.3g} exceeds {bound:.3g} for a float32 file"
    return None
