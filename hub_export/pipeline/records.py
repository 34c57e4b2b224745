"""What verification found, as the manifest records it: the figures, the quality against fp32, and how a card or a table words them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hub_export.tasks.registry import TASKS


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def count_or_none(value: Any) -> int | None:
    return value if is_int(value) and value >= 0 else None


def _rounded(value: Any) -> Any:
    """Four significant digits; None for what JSON cannot hold (NaN, infinities)."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else None
    return value


def _figure(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


@dataclass
class Quality:
    """A variant's quality on the shipped evaluation text, through the ``.pte``, against fp32 eager."""

    text: str | None = None  # the evaluation text's file name
    tokens: int | None = None  # predictions scored
    perplexity: float | None = None
    fp32_perplexity: float | None = None
    ratio: float | None = None  # perplexity / fp32_perplexity
    top1: float | None = None  # next-token agreement with fp32
    kl: float | None = None  # mean KL from fp32

    @classmethod
    def from_dict(cls, data: Any) -> Quality | None:
        if not isinstance(data, dict):
            return None
        return cls(
            text=data["text"] if isinstance(data.get("text"), str) else None,
            tokens=count_or_none(data.get("tokens")),
            **{name: _finite(data.get(name)) for name in ("perplexity", "fp32_perplexity", "ratio", "top1", "kl")},
        )

    def to_dict(self) -> dict[str, Any]:
        return {name: _rounded(value) for name, value in asdict(self).items()}

    def cell(self) -> str:
        """``35.3 (1.71x fp32)``: perplexity and its ratio to fp32's (the card's and the tables' cell)."""
        if self.perplexity is None or self.ratio is None:
            return "n/a"
        return f"{self.perplexity:.1f} ({self.ratio:.2f}x fp32)"

    def summary(self) -> str | None:
        """``ppl 33.7 (1.50x fp32), top-1 60%, KL 0.47``, or None without the figures."""
        if self.perplexity is None or self.ratio is None:
            return None
        text = f"ppl {self.perplexity:.1f} ({self.ratio:.2f}x fp32)"
        text += f", top-1 {self.top1:.0%}" if self.top1 is not None else ""
        return text + (f", KL {self.kl:.2f}" if self.kl is not None else "")


def _fields(template: str) -> int:
    return template.count("{")


def _figures(data: Any) -> dict[str, float] | None:
    """A task's figures from JSON: names of at most 64 characters to finite numbers; anything else dropped."""
    if not isinstance(data, dict):
        return None
    kept = {
        name: _finite(value) for name, value in list(data.items())[:32] if isinstance(name, str) and len(name) <= 64
    }
    return {name: value for name, value in kept.items() if value is not None}


_VERIFICATION_FLOATS = (
    "mean_kl_vs_eager",
    "top1_agreement",
    "top1_within_ties",
    "max_kl",
    "min_top1",
    "max_abs_diff",
    "relative_l2",
    "quant_max_abs_diff_vs_fp32",
    "quant_relative_l2_vs_fp32",
    "quant_top1_vs_fp32",
    "runner_prefill_tokens_per_s",
    "runner_decode_tokens_per_s",
)


@dataclass
class Verification:
    """What verifying one ``.pte`` found: the judge's figures against eager, the runner's speed, the quality.

    Example:
        >>> Verification(passed=True, mean_kl_vs_eager=0.024, top1_agreement=0.88).summary()
        'KL 0.024, top-1 88% vs eager'
        >>> Verification.skipped_record().summary()
        'not verified'
    """

    passed: bool = False
    skipped: bool = False  # exported with --no-verify
    positions: int | None = None  # runtime positions compared with eager (prompt + evaluation text)
    mean_kl_vs_eager: float | None = None
    top1_agreement: float | None = None  # exact argmax agreement
    top1_within_ties: float | None = None  # what the judge uses: near-ties count as agreement
    max_kl: float | None = None
    min_top1: float | None = None
    max_abs_diff: float | None = None  # over the prompt sequence
    relative_l2: float | None = None
    quant_max_abs_diff_vs_fp32: float | None = None
    quant_relative_l2_vs_fp32: float | None = None
    quant_top1_vs_fp32: float | None = None
    runner_generated_tokens: int | None = None
    runner_prefill_tokens_per_s: float | None = None
    runner_decode_tokens_per_s: float | None = None
    runner_threads: int | None = None  # the threadpool the runner's rates were measured on
    failure: str | None = None
    quality: Quality | None = None
    # The same figures on a second shipped text of another register (technical documentation), so a recipe
    # tuned to one kind of text shows what it costs on another.
    second_quality: Quality | None = None
    # Figures of a task other than text generation, by name (sentence embeddings: the cosine
    # similarities to eager's and fp32's vectors and the nearest-neighbour agreement).
    figures: dict[str, float] | None = None
    # A --speculative file: forward_rows scoring a chunk in one call against forward one token at a time.
    rows: dict[str, float] | None = None

    @classmethod
    def skipped_record(cls) -> Verification:
        return cls(skipped=True)

    @classmethod
    def from_dict(cls, data: Any) -> Verification:
        """The record from its JSON form; figures of the wrong type (a hostile repo) are dropped."""
        if not isinstance(data, dict):
            return cls()
        if data.get("skipped") is True:
            return cls.skipped_record()
        return cls(
            passed=data.get("passed") is True,
            positions=count_or_none(data.get("positions")),
            runner_generated_tokens=count_or_none(data.get("runner_generated_tokens")),
            runner_threads=count_or_none(data.get("runner_threads")),
            failure=data["failure"][:300] if isinstance(data.get("failure"), str) else None,
            quality=Quality.from_dict(data.get("quality")),
            second_quality=Quality.from_dict(data.get("second_quality")),
            figures=_figures(data.get("figures")),
            rows=_figures(data.get("rows")),
            **{name: _finite(data.get(name)) for name in _VERIFICATION_FLOATS},
        )

    def to_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": True}
        data = {
            name: _rounded(value)
            for name, value in asdict(self).items()
            if name not in ("skipped", "quality", "second_quality", "figures", "rows")
        }
        if self.rows is not None:
            data["rows"] = {name: float(f"{value:.3g}") for name, value in self.rows.items() if math.isfinite(value)}
        data["quality"] = self.quality.to_dict() if self.quality is not None else None
        if self.second_quality is not None:
            data["second_quality"] = self.second_quality.to_dict()
        if self.figures is not None:
            # six digits: a cosine of 0.99994 must not read as 1
            data["figures"] = {
                name: float(f"{value:.6g}") for name, value in self.figures.items() if math.isfinite(value)
            }
        return data

    @property
    def verified(self) -> bool:
        """Checked and passed: what may be published."""
        return self.passed and not self.skipped

    def summary(self) -> str:
        """``KL 0.024, top-1 88% vs eager``, tolerant of missing figures."""
        if self.skipped:
            return "not verified"
        worded = self.task_words("summary")
        if worded is not None:
            return worded
        kl, top1 = self.mean_kl_vs_eager, self.top1_agreement
        parts = ([f"KL {kl:.2g}"] if kl is not None else []) + ([f"top-1 {top1:.0%}"] if top1 is not None else [])
        if not parts and self.max_abs_diff is not None:  # a manifest from before the KL judge
            parts = [f"diff {self.max_abs_diff:.2g}"]
        return (", ".join(parts) + " vs eager") if parts else "unknown (the manifest lacks its figures)"

    def quality_cell(self) -> str:
        """The card's quality cell: perplexity against fp32's, or an encoder task's figure against fp32's."""
        worded = self.task_words("quality")
        if worded is not None:
            return worded
        return self.quality.cell() if self.quality is not None else "n/a"

    def task_words(self, which: str) -> str | None:
        """The figures of an encoder task's verification in that task's words (see ``Task.words``); None for a
        text decoder's, which carry no figures. The task whose wording names the most figures is tried first: a
        vision-language file's figures include every one a text-to-text file's wording names."""
        for task in sorted(TASKS.values(), key=lambda t: -_fields((t.summary_format or "") + (t.quality_format or ""))):
            worded = task.words(self.figures, which)
            if worded is not None:
                return worded
        return None

    def line(self) -> str:
        """``verified KL …, top-1 … vs eager; ppl … (…x fp32), …``: one line for logs, tables and commits."""
        if self.skipped:
            return "skipped (--no-verify)"
        quality = self.quality.summary() if self.quality is not None else None
        if quality is not None and self.second_quality is not None and self.second_quality.ratio is not None:
            quality += f"; on technical text {self.second_quality.ratio:.2f}x fp32"
        if quality is None and self.task_words("quality") is not None:
            quality = self.quality_cell()
            quality += "" if "fp32" in quality else " vs fp32"
        return f"verified {self.summary()}" + (f"; {quality}" if quality else "")

    def speed(self, stage: str) -> float | None:
        """The runner's measured ``prefill`` or ``decode`` tokens/s at export, if it measured one."""
        value = self.runner_prefill_tokens_per_s if stage == "prefill" else self.runner_decode_tokens_per_s
        return value if value is not None and value > 0 else None
