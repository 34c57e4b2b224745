"""Calibrate: measure how much each linear layer's int4 rounding hurts, and plan the ``mixed`` qmode.

A layer's *sensitivity* is the mean KL divergence of the model's next-token distribution
from fp32's, over the calibration text shipped with the package (``data/calib_en.txt``,
disjoint from the evaluation text the quality figures use), when that layer alone has
its weights rounded to int4 exactly as the variant will round them (same group size,
same scale choice). The plan then keeps layers int8 (8da8w's recipe), most damage
avoided per added byte first, until the budget is spent: a file size relative to plain
8da4w (``--max-size-ratio``, default 1.15), or a perplexity on the calibration text
relative to fp32's (``--max-ppl-ratio``).

Measuring takes one forward pass of the calibration text per linear layer; it runs once
per export run, in the parent process, however many variants use the plan.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.errors import InputError, opt
from hub_export.pipeline import quantize
from hub_export.pipeline.calibration_text import calibration_text_digest, read_calibration_text

if TYPE_CHECKING:
    import torch

    from hub_export.options import ExportOptions
    from hub_export.pipeline.gptq import Int4Rounding

CALIBRATION_TEXT = "calib_en.txt"
CALIBRATION_TOKENS = 128
SCALE_BYTES = 2  # per int4 group in XNNPACK's blockwise kernels (bf16 scales)


@dataclass
class MixedPlan:
    """Which linears of a ``mixed`` variant stay int8, and why (recorded in the manifest)."""

    eight_bit: list[str] = field(default_factory=list)
    linears: int = 0  # layers considered
    budget: str = ""  # "size 1.15x 8da4w" or "perplexity 1.25x fp32 (calibration text)"
    size_ratio: float | None = None  # estimated file size relative to plain 8da4w
    ppl_ratio: float | None = None  # fake-quantized perplexity on the calibration text / fp32's
    text: str = CALIBRATION_TEXT
    tokens: int = 0
    seconds: float = 0.0
    calibrated: bool = True

    @classmethod
    def from_dict(cls, data: Any) -> MixedPlan | None:
        """A plan read back from a (schema-checked) manifest; figures of the wrong type are dropped."""
        if not isinstance(data, dict):
            return None

        def number(key: str, kind: type) -> Any:
            value = data.get(key)
            return (
                value
                if isinstance(value, (int, float)) and not isinstance(value, bool) and kind(value) == value
                else None
            )

        return cls(
            eight_bit=list(data.get("eight_bit") or []),
            linears=number("linears", int) or 0,
            budget=str(data.get("budget") or ""),
            size_ratio=number("size_ratio", float),
            ppl_ratio=number("ppl_ratio", float),
            text=str(data.get("text") or CALIBRATION_TEXT),
            tokens=number("tokens", int) or 0,
            seconds=number("seconds", float) or 0.0,
            calibrated=data.get("calibrated") is not False,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("size_ratio", "ppl_ratio", "seconds"):
            if isinstance(data[key], float):
                data[key] = round(data[key], 4)
        return data

    def summary(self) -> str:
        """One line for the card and the CLI."""
        if not self.calibrated:
            return "no calibration (--no-calibration): every linear int4"
        kept = ", ".join(_short(name) for name in self.eight_bit[:4]) + (", ..." if len(self.eight_bit) > 4 else "")
        return (
            f"{len(self.eight_bit)} of {self.linears} linears int8 ({kept or 'none'}), the most sensitive per "
            f"byte on {self.tokens} tokens of {self.text}; budget {self.budget}"
        )


def _short(name: str) -> str:
    return name.removeprefix("model.").replace("layers.", "L").replace("self_attn.", "").replace("mlp.", "")


def budget_label(options: ExportOptions) -> str:
    """The budget a mixed variant was planned under, as its manifest records it."""
    cap = options.size_budget
    if options.max_ppl_ratio is None:
        return f"size {cap:.2f}x 8da4w"
    return f"perplexity {options.max_ppl_ratio:.2f}x fp32 on the calibration text" + (
        f", size at most {cap:.2f}x 8da4w" if cap is not None else ""
    )


def calibration_text(text_file: str | None = None) -> str:
    """The calibration text: the user's ``text_file`` (checked), or the shipped prose."""
    if text_file is None:
        return resources.files("hub_export").joinpath("data", CALIBRATION_TEXT).read_text(encoding="utf-8")
    return read_calibration_text(text_file)


def calibration_text_ids(tokenizer_json: Path, text_file: str | None = None) -> list[int]:
    """Every token id of the calibration text: the user's ``text_file``, or the shipped prose."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).encode(calibration_text(text_file)).ids


def calibration_ids(tokenizer_json: Path, tokens: int, text_file: str | None = None) -> tuple[torch.Tensor, int]:
    """The first ``tokens`` token ids of the calibration text (the user's ``text_file``, or the shipped prose), and
    how many tokens the whole text has.

    Raises:
        InputError: the user's text has fewer than ``tokens`` tokens.
    """
    import torch

    ids = calibration_text_ids(tokenizer_json, text_file)
    if len(ids) < tokens:
        raise InputError(f"{opt('calibration_text')}: the text is {len(ids)} tokens; the calibration reads {tokens}",
                         param="calibration_text")  # fmt: skip
    return torch.tensor([ids[:tokens]]), len(ids)


def text_label(text_file: str | None, total_tokens: int) -> str:
    """How the plan names its calibration text: the shipped file's name, or the user's text by its sha256."""
    if text_file is None:
        return CALIBRATION_TEXT
    return f"your calibration text (sha256 {calibration_text_digest(text_file)}, {total_tokens} tokens)"


def _linears(model: torch.nn.Module, group_size: int) -> dict[str, torch.nn.Module]:
    """The linears a mixed variant quantizes int4 (those a group divides; others fall back to int8 anyway)."""
    import torch

    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module.in_features % group_size == 0
    }


def _rounded_weight(linear: torch.nn.Module, bits: int, group_size: int, scales: str) -> torch.Tensor:
    """``linear``'s weight as the variant stores it (int4 grouped or int8 per channel), back in float."""
    from torchao.quantization import quantize_

    probe = copy.deepcopy(linear)
    config = quantize.dynamic_activation_config(bits, group_size, scales)
    quantize_(probe, config)
    return probe.weight.dequantize().float()


class _Swapper:
    """Puts rounded weights into a model's linears and takes them out again (tied heads included)."""

    def __init__(self, linears: dict[str, torch.nn.Module]):
        self.linears = linears
        self.original = {name: module.weight for name, module in linears.items()}

    def set(self, weights: dict[str, torch.Tensor]) -> None:
        import torch

        for name, module in self.linears.items():
            # A new Parameter, not a write into the old one: a tied head shares it with the embedding.
            module.weight = (
                torch.nn.Parameter(weights[name], requires_grad=False) if name in weights else self.original[name]
            )

    def restore(self) -> None:
        self.set({})


def _logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    import torch

    with torch.no_grad():
        return torch.log_softmax(model(ids).logits[0].float(), -1)


def _kl(reference: torch.Tensor, logprobs: torch.Tensor) -> float:
    return float((reference.exp() * (reference - logprobs)).sum(-1).mean())


def _perplexity(logprobs: torch.Tensor, ids: torch.Tensor) -> float:
    targets = ids[0, 1:].view(-1, 1)
    return math.exp(-float(logprobs[:-1].gather(-1, targets).mean()))


def _bytes(linear: torch.nn.Module, bits: int, group_size: int) -> float:
    rows, cols = linear.out_features, linear.in_features
    if bits == 4:
        return rows * cols / 2 + rows * (cols / group_size) * SCALE_BYTES
    return rows * cols + rows * 4


def plain_size(model: torch.nn.Module, linears: dict[str, torch.nn.Module], options: ExportOptions) -> float:
    """Estimated bytes of the plain 8da4w file: int4 linears, the embedding as ``--qembedding`` stores it, float rest."""
    import torch

    in_linears = {id(module.weight) for module in linears.values()}
    total = sum(_bytes(module, 4, options.group_size) for module in linears.values())
    per_param = {None: 4.0, "8w": 1.0, "4w": 0.5}[options.qembedding]
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            total += module.weight.numel() * per_param + (module.num_embeddings * 4 if options.qembedding else 0)
    seen = set(in_linears) | {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel() * 4
    return total


def plan_mixed(
    model: torch.nn.Module,
    tokenizer_json: Path,
    options: ExportOptions,
    say: Callable[[str], None] = lambda message: None,
    tokens: int = CALIBRATION_TOKENS,
    rounding: Int4Rounding | None = None,
) -> MixedPlan:
    """Measure every linear's sensitivity on the calibration text and choose the int8 ones within the budget.

    ``model``: the fp32 model, left as found. ``rounding``: GPTQ's codes, when the variants use them (a layer is
    measured as the variant rounds it)."""
    if not options.calibration:
        return MixedPlan(calibrated=False)
    started = time.perf_counter()
    ids, total = calibration_ids(tokenizer_json, tokens, options.calibration_text)
    linears = _linears(model, options.group_size)
    swapper = _Swapper(linears)
    reference = _logprobs(model, ids)
    rounded: dict[int, dict] = {4: _rounded_weights(linears, 4, options, rounding)}
    int4 = rounded[4]
    try:
        sensitivity = _sensitivities(model, ids, reference, int4, swapper, say)
        extra = {
            name: _bytes(m, 8, options.group_size) - _bytes(m, 4, options.group_size) for name, m in linears.items()
        }
        plain = plain_size(model, linears, options)
        fitting = _within_size(
            sorted(linears, key=lambda name: -sensitivity[name] / extra[name]), extra, plain, options
        )
        budget = budget_label(options)
        fp32_perplexity = _perplexity(reference, ids)  # the fp32 pass above: not run again per plan tried

        def ratio_of(eight: set[str]) -> float:
            """Perplexity on the calibration text with the linears rounded as ``eight`` says, over fp32's."""
            swapper.set({name: rounded[8 if name in eight else 4][name] for name in rounded[4]})
            ratio = _perplexity(_logprobs(model, ids), ids) / fp32_perplexity
            swapper.restore()
            return ratio

        if options.max_ppl_ratio is None:
            chosen = fitting
        else:
            rounded[8] = _rounded_weights(linears, 8, options)
            chosen = _fewest_for_perplexity(ratio_of, fitting, options.max_ppl_ratio)
        rounded.setdefault(8, _rounded_weights({name: linears[name] for name in chosen}, 8, options))
        ppl_ratio = ratio_of(set(chosen))
    finally:
        swapper.restore()
    added = sum(extra[name] for name in chosen)
    return MixedPlan(
        eight_bit=sorted(chosen, key=list(linears).index),
        linears=len(linears),
        budget=budget,
        size_ratio=1.0 + added / plain,
        ppl_ratio=ppl_ratio,
        text=text_label(options.calibration_text, total),
        tokens=int(ids.shape[1]),
        seconds=time.perf_counter() - started,
    )


def _rounded_weights(linears: dict, bits: int, options: ExportOptions, rounding: Int4Rounding | None = None) -> dict:
    """Each of ``linears``' weights as a ``bits``-bit variant stores it, back in float, by name."""
    scales = options.recipe(rounding=rounding).scales_of(quantize.QMODES["mixed"])
    return {
        name: rounding.weight(name)
        if bits == 4 and scales == "gptq" and name in rounding
        else _rounded_weight(module, bits, options.group_size, "hqq" if scales == "gptq" else scales)
        for name, module in linears.items()
    }


def _sensitivities(model, ids, reference, int4: dict, swapper: _Swapper, say: Callable[[str], None]) -> dict:
    """Each linear's KL divergence from fp32 on the calibration ids when it alone is rounded to int4."""
    sensitivity = {}
    for index, name in enumerate(int4):
        if index % 25 == 0:
            say(f"calibrating: layer {index + 1} of {len(int4)} ({_short(name)})")
        swapper.set({name: int4[name]})
        sensitivity[name] = _kl(reference, _logprobs(model, ids))
    swapper.restore()
    return sensitivity


def _within_size(order: list[str], extra: dict[str, int], plain: int, options: ExportOptions) -> list[str]:
    """The linears kept int8, most damage avoided per added byte first, while the file stays within the size cap."""
    cap = options.size_budget
    room = (cap - 1.0) * plain if cap is not None else math.inf
    fitting, used = [], 0.0
    for name in order:
        if used + extra[name] <= room:
            fitting.append(name)
            used += extra[name]
    return fitting


def _fewest_for_perplexity(ratio_of: Callable[[set[str]], float], order: list[str], target: float) -> list[str]:
    """The shortest prefix of ``order`` whose perplexity ratio meets ``--max-ppl-ratio`` (the whole list if none does)."""
    low, high = 0, len(order)
    if ratio_of(set(order)) > target:
        return order  # out of reach within the size cap: keep all that fit
    while low < high:  # the ratio falls, give or take noise, as layers are kept int8
        middle = (low + high) // 2
        if ratio_of(set(order[:middle])) <= target:
            high = middle
        else:
            low = middle + 1
    return order[:low]


def round_int4(
    model: torch.nn.Module,
    tokenizer_json: Path,
    options: ExportOptions,
    say: Callable[[str], None] = lambda m: None,
    max_seq_len: int | None = None,
) -> Int4Rounding:
    """GPTQ's int4 codes for every linear a grouped int4 variant rounds (:mod:`hub_export.pipeline.gptq`), calibrated on the
    whole calibration text (up to :data:`hub_export.pipeline.gptq.MAX_TOKENS` tokens) in windows no longer than the file's
    context (``max_seq_len``: the positions its activations will come from). ``model`` is the fp32 model."""
    from hub_export.pipeline import gptq  # imports torch: this module is imported by the option checks, which must not

    text = _gptq_text(model, tokenizer_json, options, max_seq_len)
    linears = {
        name: module for name, module in _linears(model, options.group_size).items() if text.wanted(name, module)
    }
    return gptq.round_linears(model, linears, text.tokens(), options.group_size, say)


def round_int4_layerwise(
    layerwise,
    tokenizer_json: Path,
    options: ExportOptions,
    say: Callable[[str], None] = lambda m: None,
    max_seq_len: int | None = None,
    passes: list = (),
) -> Int4Rounding:
    """:func:`round_int4` for a :class:`~hub_export.pipeline.layerwise.LayerwiseModel`, each decoder layer read once;
    ``passes`` (the verification reference) go through the layers in the same reading."""
    from hub_export.pipeline import gptq  # imports torch: this module is imported by the option checks, which must not

    text = _gptq_text(layerwise.model, tokenizer_json, options, max_seq_len)
    return gptq.round_layerwise(layerwise, text.wanted, text.tokens(), options.group_size, say, passes)


@dataclass
class _GptqText:
    """What GPTQ calibrates on, and which linears it rounds."""

    ids: list[int]
    chats: list[list[int]]
    label: str
    window: int
    wanted: Callable[[str, Any], bool]

    def tokens(self):
        """As :func:`hub_export.pipeline.gptq.round_linears` takes them."""
        from hub_export.pipeline.gptq import CalibrationTokens  # imports torch, as every caller of this already did

        return CalibrationTokens(self.ids, self.label, self.window, self.chats)


def _gptq_text(model, tokenizer_json: Path, options: ExportOptions, max_seq_len: int | None) -> _GptqText:
    from tokenizers import Tokenizer

    from hub_export.pipeline import gptq  # imports torch: this module is imported by the option checks, which must not

    vocabulary = model.get_input_embeddings().num_embeddings
    text = calibration_text(options.calibration_text)  # read once, for the plain windows and the chat passages
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    # A tokenizer may know more tokens than the model has rows (small test models do); GPTQ only needs activations.
    ids = [i for i in tokenizer.encode(text).ids if i < vocabulary]
    # The output projection is stored int8 as the embedding table under --share-embeddings: never int4.
    head = model.get_output_embeddings() if options.share_embeddings else None

    def wanted(name: str, module) -> bool:
        return module.in_features % options.group_size == 0 and module is not head

    total = min(len(ids), gptq.MAX_TOKENS)
    chats = [[i for i in chat if i < vocabulary] for chat in _conversations(tokenizer, tokenizer_json.parent, text)]
    window = min(gptq.WINDOW, max_seq_len or gptq.WINDOW)
    return _GptqText(ids, chats, text_label(options.calibration_text, total), window, wanted)


CHAT_PASSAGES = 32  # passages of the calibration text also calibrated as chat turns


def _conversations(tokenizer, tokenizer_dir: Path, text: str) -> list[list[int]]:
    """Passages of the calibration text as chat exchanges in the model's own template (its first sentence asked,
    the rest answered), tokenized: a chat model runs behind its template's special tokens, and GPTQ must see
    the activations they bring (calibrated on plain text only, SmolLM2's file answered "What is the capital
    of France?" with nonsense though its perplexity was better). None when the model has no chat template."""
    from hub_export.tasks.text_generation.chat import (  # imports jinja2: only an export that calibrates needs it
        chat_template,
        render_chat_messages,
    )

    if chat_template(tokenizer_dir) is None:
        return []
    conversations = []
    for passage in [p.strip() for p in text.split("\n\n") if len(p.split()) > 20][:CHAT_PASSAGES]:
        ask, _, answer = passage.partition(". ")
        try:
            prompt = render_chat_messages(tokenizer_dir, [{"role": "user", "content": ask + "."}])
        except InputError:  # a template that refuses a plain user turn: calibrate on the text alone
            return []
        conversations.append(tokenizer.encode(prompt + answer, add_special_tokens=False).ids)
    return conversations
