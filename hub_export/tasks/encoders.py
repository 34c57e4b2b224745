"""Encoders: one call in, one answer out. The stages that sentence embeddings, fill-mask and image
classification share.

An encoder task's module (:mod:`hub_export.tasks.sentence_embeddings.export`, :mod:`hub_export.tasks.fill_mask.export`,
:mod:`hub_export.tasks.image_classification.export`) implements the same few functions, and the
build runs them in the same order for every variant:

- ``seq_len(folder, config, requested)``: the longest input the file takes;
- ``wrap(model, folder)``: the ``nn.Module`` whose ``forward`` is the file's method;
- ``export(wrapped, seq_len)``: ``torch.export`` with the task's dynamic shapes;
- ``metadata(model, folder, seq_len)``: the file's constant methods;
- ``eval_inputs(folder, config, seq_len)``: the real inputs every variant is checked on,
  as an :class:`EncoderReference` without outputs;
- ``judge(actual, expected, reference, mode, qembedding)``: the :class:`Verification`;
- ``source_record(model, folder)``: what the manifest's source record adds.

A task whose file has several methods or a loop (speech) adds hooks the build uses
instead of the defaults: ``reference(model, folder, seq_len)``, ``expected(wrapped,
reference)``, ``quantize_model(model, qmode, options)`` and ``verify_variant(pte,
expected, reference, mode, qembedding)``; its ``export`` returns one program per method.

Verification runs each reference input through the ``.pte`` (batch 1, as a device
runs it), picks the answer (:func:`answer`) and hands the stacked answers to the
task's ``judge``, with the quantized eager model's answers (``expected``) and the fp32
model's (``reference.outputs``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from hub_export.errors import VerificationError, first_line
from hub_export.pipeline.quantize import QEMBEDDINGS, QMode
from hub_export.pipeline.records import Verification
from hub_export.runtime.pte import PteModel
from hub_export.tasks import registry as tasks


@dataclass
class EncodedAndScored:
    """What a quantized eager encoder-decoder computes on its reference, per input: the encoder side's output
    (Whisper's audio encoding, a vision-language model's image embeddings) and the decoder's teacher-forced scores."""

    encoded: list[torch.Tensor]
    scores: list[torch.Tensor]  # [prompt + answer tokens, vocab]


@dataclass
class EncoderReference:
    """The inputs every variant of a run is checked on, and the fp32 eager model's answers to them."""

    items: list[str]  # what each input is, in words (a sentence, an image's description)
    inputs: list[tuple[torch.Tensor, ...]]  # the file's method's inputs, one call each
    outputs: torch.Tensor | None = None  # [N, ...]: fp32 eager's answers, filled by build_reference
    positions: list[int] | None = None  # the output row that answers each input (fill-mask: the masked token)
    targets: list[int] | None = None  # the right label of each input, when it is known (the masked word)
    notes: dict = field(default_factory=dict)  # task-specific facts (the mask token's id)


def stages(task: tasks.Task) -> ModuleType:
    """The module implementing ``task``'s encoder stages (see this module's docstring)."""
    if task.module is None:
        raise ValueError(f"{task.name} is not an encoder task")
    # A task's module is torch-heavy: imported when a run needs it, by name from the registry.
    return importlib.import_module(f"hub_export.tasks.{task.module}")


def answer(output: torch.Tensor, position: int | None) -> torch.Tensor:
    """The part of one call's ``output`` that answers it: row ``position`` of ``[1, seq, n]``, or ``[1, n]``'s row."""
    return output[0, position] if position is not None else output[0]


def expected_answers(task: tasks.Task, wrapped: nn.Module, reference):
    """What the file must reproduce: ``wrapped`` (the quantized eager model, wrapped) on ``reference``'s inputs."""
    module = stages(task)
    return module.expected(wrapped, reference) if hasattr(module, "expected") else eager_outputs(wrapped, reference)


def eager_outputs(wrapped: nn.Module, reference: EncoderReference) -> torch.Tensor:
    """``wrapped``'s answers to ``reference``'s inputs, ``[N, ...]`` in float32."""
    positions = reference.positions or [None] * len(reference.inputs)
    with torch.no_grad():
        return torch.stack(
            [answer(wrapped(*inputs), at) for inputs, at in zip(reference.inputs, positions, strict=True)]
        ).float()


def build_reference(task: tasks.Task, model: nn.Module, folder: Path, seq_len: int) -> EncoderReference:
    """The fp32 eager reference of a run: ``task``'s evaluation inputs and ``model``'s answers to them."""
    module = stages(task)
    if hasattr(module, "reference"):
        return module.reference(model, folder, seq_len)
    reference = module.eval_inputs(folder, model.config, seq_len)
    return replace(reference, outputs=eager_outputs(module.wrap(model, folder).eval(), reference))


def pte_outputs(model: PteModel, reference: EncoderReference) -> torch.Tensor:
    """The file's answers to ``reference``'s inputs, one call each (batch 1), ``[N, ...]`` in float32.

    Raises:
        VerificationError: the file fails to run an input.
    """
    positions = reference.positions or [None] * len(reference.inputs)
    return torch.stack(
        [answer(model.run(list(inputs)), at) for inputs, at in zip(reference.inputs, positions, strict=True)]
    ).float()


def verify_variant(
    task: tasks.Task,
    pte_path: str | Path,
    expected: torch.Tensor,
    reference: EncoderReference,
    mode: QMode,
    qembedding: str | None = None,
) -> Verification:
    """Run ``pte_path`` on the reference inputs and judge its answers as ``task`` does.

    A file that does not load or run fails with a "runtime error" and no figures beyond its limits.
    """
    module = stages(task)
    if hasattr(module, "verify_variant"):
        return module.verify_variant(pte_path, expected, reference, mode, qembedding)
    try:
        actual = pte_outputs(PteModel(pte_path), reference)
    except VerificationError as error:
        return Verification(False, failure=f"runtime error: {first_line(error)[:200]}")
    return stages(task).judge(actual, expected, reference, mode, qembedding)


def weight_bits(mode: QMode, qembedding: str | None) -> int:
    """The fewest bits of any weight in a variant: its linear layers' or its embedding table's."""
    return min(mode.weight_bits, QEMBEDDINGS.get(qembedding or "", 32))


# -- judging class scores (fill-mask's tokens, an image's labels) ----------------------------------

# Pass/fail of the runtime against the eager model with the same quantization: the text
# decoder's bounds (hub_export.pipeline.verify), over the judged rows. Near-ties within TIE_NATS of
# the runtime's top count as agreement (random-weight heads are full of them).
TOP_K = 5


def label_figures(actual: torch.Tensor, expected: torch.Tensor, tie_nats: float) -> dict[str, float]:
    """Mean KL(expected || actual), top-1 agreement (plain and within ties) and top-5 overlap over the rows."""
    actual_lp, expected_lp = torch.log_softmax(actual.float(), -1), torch.log_softmax(expected.float(), -1)
    kl = (expected_lp.exp() * (expected_lp - actual_lp)).sum(-1).clamp_min(0)
    top1 = actual_lp.argmax(-1) == expected_lp.argmax(-1)
    gap = actual_lp.max(-1).values - actual_lp.gather(-1, expected_lp.argmax(-1, keepdim=True)).squeeze(-1)
    k = min(TOP_K, actual.shape[-1])
    overlap = [
        len(set(a.tolist()) & set(e.tolist())) / k
        for a, e in zip(actual_lp.topk(k, -1).indices, expected_lp.topk(k, -1).indices, strict=True)
    ]
    return {
        "mean_kl": float(kl.mean()),
        "top1": top1.float().mean().item(),
        "top1_within_ties": (gap <= tie_nats).float().mean().item(),
        "top5_overlap": sum(overlap) / len(overlap),
    }


def score_limits(mode: QMode) -> dict[str, float]:
    """The bounds a variant's teacher-forced scores keep against the eager model with its quantization."""
    # The text decoder's bounds, one definition; pipeline.verify imports the decoder's wrapper, which an
    # encoder's export need not load.
    from hub_export.pipeline.verify import MAX_MEAN_KL, MIN_TOP1

    return {
        "max_kl_vs_eager_allowed": MAX_MEAN_KL[mode.tolerance],
        "min_top1_vs_eager_required": MIN_TOP1[mode.tolerance],
    }


def score_checks(figures: dict, limits: dict, over: str = "") -> list[tuple[bool, str]]:
    """(failed, why) of the :func:`score_limits` bounds on ``figures``' mean_kl_vs_eager and top1_vs_eager;
    ``over`` ends each reason (" over 64 sentences")."""
    kl, top1 = figures["mean_kl_vs_eager"], figures["top1_vs_eager"]
    most_kl, least_top1 = limits["max_kl_vs_eager_allowed"], limits["min_top1_vs_eager_required"]
    return [
        (kl > most_kl, f"mean KL from eager {kl:.3g} exceeds {most_kl:.3g}{over}"),
        (top1 < least_top1, f"top-1 agreement with eager {top1:.0%} is below {least_top1:.0%}{over}"),
    ]


def first_failure(checks: list[tuple[bool, str]]) -> str | None:
    """The reason of the first failed check, or None when all pass."""
    return next((why for failed, why in checks if failed), None)


def judge_labels(
    actual: torch.Tensor, expected: torch.Tensor, reference: EncoderReference, mode: QMode, noun: str
) -> Verification:
    """Judge class scores ``[N, classes]``: against quantized eager by KL and top-1 (pass/fail), against fp32 for
    the record (top-1, top-5 overlap, KL; and, when the right answers are known, how often each finds them)."""
    from hub_export.pipeline.verify import TIE_NATS  # as in score_limits

    kind = mode.tolerance
    limits = score_limits(mode)
    if not torch.isfinite(actual).all():
        return Verification(False, failure="the runtime produced non-finite scores", figures=limits)
    eager = label_figures(actual, expected, TIE_NATS[kind])
    fp32 = label_figures(actual, reference.outputs, TIE_NATS[kind])
    figures = {
        **limits,
        "inputs": float(actual.shape[0]),
        "mean_kl_vs_eager": eager["mean_kl"],
        "top1_vs_eager": eager["top1_within_ties"],
        "top1_vs_fp32": fp32["top1"],
        "top5_overlap_vs_fp32": fp32["top5_overlap"],
        "mean_kl_vs_fp32": fp32["mean_kl"],
    }
    if reference.targets is not None:
        targets = torch.tensor(reference.targets)
        figures["accuracy"] = (actual.argmax(-1) == targets).float().mean().item()
        figures["fp32_accuracy"] = (reference.outputs.argmax(-1) == targets).float().mean().item()
    failure = first_failure(score_checks(figures, limits, over=f" over {actual.shape[0]} {noun}"))
    return Verification(failure is None, positions=int(actual.shape[0]), failure=failure, figures=figures)
