"""Verify: prove a ``.pte`` computes what the eager model computes.

The ``.pte`` is run in the ExecuTorch runtime on a fixed token sequence, prefill then
token-by-token decode (so the KV cache is exercised), and its logits are compared
position by position with the eager model carrying the *same* quantization. The
quantization error itself is reported against fp32 eager, and the C++
``TextLLMRunner`` must generate from the file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .runtime import PteModel, runner_generate
from .wrap import eager_attention

VERIFY_PROMPT = "Once upon a time, in a small town by the sea, there lived"
DECODE_STEPS = 8
RUNNER_NEW_TOKENS = 16

# The runtime must match eager closely. Dynamically quantized activations are rounded
# by different int8 kernels (XNNPACK vs torchao's reference) and the differences add
# up over depth: on a 30-layer SmolLM2-135M-shaped model, 8da4w + 8-bit embeddings,
# the runtime was 2.9% of the logit scale from eager while quantization itself moved
# the logits by 40% (rel. L2) from fp32. So a dynamic variant passes if the runtime
# adds at most a quarter of the error quantization already causes, or 5% of the
# logit scale, whichever is larger.
RELATIVE_TOLERANCE = {"fp32": 1e-4, "dynamic": 5e-2, "weight_only": 1e-3}
QUANT_ERROR_SHARE = {"fp32": 0.0, "dynamic": 0.25, "weight_only": 0.05}
ABSOLUTE_TOLERANCE = 1e-4


@dataclass
class Verification:
    """Figures from one verification run (all logits over the same positions)."""

    passed: bool
    positions: int
    max_abs_diff: float
    relative_l2: float
    tolerance: float
    top1_agreement: float
    quant_max_abs_diff_vs_fp32: float
    quant_relative_l2_vs_fp32: float
    quant_top1_vs_fp32: float
    runner_generated_tokens: int
    runner_prefill_tokens_per_s: float | None
    runner_decode_tokens_per_s: float | None
    failure: str | None = None

    def to_dict(self) -> dict:
        return {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Reference:
    """The verification sequence and fp32 eager logits over it."""

    prompt_len: int
    tokens: torch.Tensor  # [1, prompt_len + DECODE_STEPS]
    fp32_logits: torch.Tensor  # [positions, vocab], positions = decode steps + 1
    runner_prompt: str = VERIFY_PROMPT
    runner_new_tokens: int = RUNNER_NEW_TOKENS


def _eager_logits(model, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    with torch.no_grad(), eager_attention(model):
        logits = model(input_ids=tokens).logits[0]
    return logits[prompt_len - 1 :].float()


def build_reference(model, tokenizer_json: Path, max_seq_len: int) -> Reference:
    """Tokenize the fixed prompt, extend it greedily with fp32 eager, keep the logits."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    ids = tokenizer.encode(VERIFY_PROMPT).ids
    # Everything must fit the cache: prompt + decode steps <= max_seq_len.
    ids = ids[: min(len(ids), max(1, max_seq_len - DECODE_STEPS), 32)] or [0]
    steps = min(DECODE_STEPS, max_seq_len - len(ids))
    tokens = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad(), eager_attention(model):
        for _ in range(steps):
            next_id = model(input_ids=tokens).logits[0, -1].argmax()
            tokens = torch.cat([tokens, next_id.view(1, 1)], dim=1)
    runner_prompt = _fitting_prompt(tokenizer, max_seq_len)
    runner_new_tokens = max(1, min(RUNNER_NEW_TOKENS, max_seq_len - len(tokenizer.encode(runner_prompt).ids)))
    return Reference(len(ids), tokens, _eager_logits(model, tokens, len(ids)), runner_prompt, runner_new_tokens)


def _fitting_prompt(tokenizer, max_seq_len: int) -> str:
    """The longest word prefix of the prompt that leaves the runner room to generate."""
    words = VERIFY_PROMPT.split()
    for count in range(len(words), 0, -1):
        text = " ".join(words[:count])
        if len(tokenizer.encode(text).ids) < max_seq_len:
            return text
    return words[0]


def _pte_logits(pte: PteModel, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    rows = [pte.forward(tokens[:, :prompt_len], start_pos=0)]
    for pos in range(prompt_len, tokens.shape[1]):
        rows.append(pte.forward(tokens[:, pos : pos + 1], start_pos=pos))
    return torch.stack(rows).float()


def _relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Worst position's ``||actual - expected|| / ||expected||``."""
    return ((actual - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-12)).max().item()


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def _ties_ok(candidate: torch.Tensor, reference: torch.Tensor, tolerance: float) -> bool:
    # A different argmax is acceptable only where the reference itself cannot tell the
    # two tokens apart within the tolerance (random-weight models have near-ties).
    picked = reference.gather(-1, candidate.argmax(-1, keepdim=True)).squeeze(-1)
    return bool((reference.max(-1).values - picked <= 2 * tolerance).all())


def expected_logits(quantized_model, reference: Reference) -> torch.Tensor:
    """What the ``.pte`` must reproduce: the quantized eager model's logits over the reference sequence.

    Taken before lowering, so the eager model can be freed before the runtime loads
    the program (an fp32 variant would otherwise hold its weights three times).
    """
    return _eager_logits(quantized_model, reference.tokens, reference.prompt_len)


def verify(
    pte_path: Path,
    expected: torch.Tensor,
    reference: Reference,
    tokenizer_json: Path,
    kind: str,
) -> Verification:
    """Compare ``pte_path`` against ``expected`` (:func:`expected_logits`) and run it in the C++ runner.

    ``kind`` picks the tolerance: ``fp32``, ``dynamic`` (int8 dynamic activations) or
    ``weight_only``.
    """
    eager = expected
    scale = eager.abs().max().item()
    quant_diff = (eager - reference.fp32_logits).abs().max().item()
    quant_rel = _relative_l2(eager, reference.fp32_logits)
    tolerance = ABSOLUTE_TOLERANCE + max(RELATIVE_TOLERANCE[kind] * scale, QUANT_ERROR_SHARE[kind] * quant_diff)
    quant_top1 = _top1(eager, reference.fp32_logits)

    def failed(reason: str, diff: float = float("nan"), top1: float = 0.0, rel: float = float("nan")) -> Verification:
        return Verification(
            False, eager.shape[0], diff, rel, tolerance, top1, quant_diff, quant_rel, quant_top1, 0, None, None, reason
        )

    try:
        pte = PteModel(pte_path)
        actual = _pte_logits(pte, reference.tokens, reference.prompt_len)
        del pte  # the runner below loads its own copy of the program
    except Exception as error:  # a corrupt file fails in many ways; all mean "broken"
        return failed(f"runtime error: {str(error).splitlines()[0][:200]}")
    if not torch.isfinite(actual).all():
        return failed("the runtime produced non-finite logits")
    diff = (actual - eager).abs().max().item()
    rel = _relative_l2(actual, eager)
    top1 = _top1(actual, eager)
    if diff > tolerance:
        return failed(f"max abs logit diff {diff:.3g} exceeds tolerance {tolerance:.3g}", diff, top1, rel)
    if not _ties_ok(actual, eager, tolerance):
        return failed(f"top-1 token differs from eager at some position (agreement {top1:.0%})", diff, top1, rel)

    try:
        stats = runner_generate(pte_path, tokenizer_json, reference.runner_prompt, reference.runner_new_tokens)
    except Exception as error:
        return failed(f"TextLLMRunner failed: {str(error).splitlines()[0][:200]}", diff, top1, rel)
    generated = int(stats.get("generated_tokens", 0))
    # The runner counts tokens after the first; a context with room for one new token
    # (--max-seq-len 2) can only prove the program runs.
    if generated < 1 and reference.runner_new_tokens > 1:
        return failed("TextLLMRunner generated no token", diff, top1, rel)
    return Verification(
        True,
        eager.shape[0],
        diff,
        rel,
        tolerance,
        top1,
        quant_diff,
        quant_rel,
        quant_top1,
        generated,
        stats.get("prefill_token_per_sec"),
        stats.get("decode_token_per_sec"),
    )
