"""Quantize: torchao weight (and activation) quantization as a small registry.

A *qmode* names how linear layers are quantized, a *qembedding* how the token
embedding is. Both are applied in place with ``torchao.quantization.quantize_`` on a
fresh copy of the fp32 model, so every variant starts from the unquantized weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hub_export.errors import InputError, opt

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

DEFAULT_GROUP_SIZE = 32


@dataclass(frozen=True)
class QMode:
    """One linear-layer quantization recipe."""

    name: str
    description: str
    weight_bits: int  # 32 means "not quantized"
    grouped: bool  # does --group-size apply?
    config: Callable[[object], object] | None  # granularity -> torchao config
    weight_only: bool = False  # float32 activations (see hub_export.pipeline.weight_only)
    # Export time relative to 8da4w, measured on the SmolLM2-shaped benchmark; the
    # worker pool starts the costliest variants first so the last one to finish is short.
    relative_cost: float = 1.0
    calibrated: bool = (
        False  # which layers stay int8 is measured on the calibration text (hub_export.pipeline.calibrate)
    )

    @property
    def tolerance(self) -> str:
        """The verification thresholds that apply (hub_export.pipeline.verify): ``fp32``, ``weight_only`` or ``dynamic``.

        fp32 and weight-only files run the same float math as eager; dynamically quantized
        activations are rounded by different int8 kernels in the runtime and in eager.
        """
        if self.weight_bits == 32:
            return "fp32"
        return "weight_only" if self.weight_only else "dynamic"


def _torchao():
    from torchao.quantization import (
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        PerAxis,
        PerGroup,
    )

    return Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, PerAxis, PerGroup


def _dtype(bits: int):
    import torch

    return getattr(torch, f"int{bits}")


def _is_linear(module) -> bool:
    from torch import nn

    return isinstance(module, nn.Linear)


def _kept(module, exclude: tuple) -> bool:
    return all(module is not other for other in exclude)


def _is_embedding(module) -> bool:
    from torch import nn

    return isinstance(module, nn.Embedding)


# How int4 weights are rounded, all to the same symmetric int4 format and kernels. "gptq":
# codes chosen on the calibration text so each layer's output error stays small
# (hub_export.pipeline.gptq); "hqq": torchao's HQQ scale search (scales that minimise the weights'
# own rounding error); "minmax": each group's largest magnitude maps to the int4 range.
# What each costs in perplexity on a real model: benchmarks/quant_recipes.py and its results.
INT4_SCALES = ("gptq", "hqq", "minmax")


def _scale_algorithm(bits: int, scales: str):
    from torchao.quantization.quantize_.workflows import (
        IntxChooseQParamsAlgorithm,
    )

    hqq = bits == 4 and scales == "hqq"
    return IntxChooseQParamsAlgorithm.HQQ_SCALE_ONLY if hqq else IntxChooseQParamsAlgorithm.AFFINE


def _linear_config(bits: int, weight_only: bool):
    """granularity, scales -> the torchao config of ``bits``-bit weights, with int8 dynamic activations or without."""

    def make(granularity, scales: str = "minmax"):
        dynamic_cls, weight_only_cls, _, _ = _torchao()
        common = dict(weight_dtype=_dtype(bits), intx_choose_qparams_algorithm=_scale_algorithm(bits, scales))
        if weight_only:
            return weight_only_cls(granularity=granularity, **common)
        return dynamic_cls(weight_granularity=granularity, **common)

    return make


def _dynamic_act(bits: int):
    return _linear_config(bits, weight_only=False)


def _weight_only(bits: int):
    return _linear_config(bits, weight_only=True)


def dynamic_activation_config(bits: int, group_size: int, scales: str = "minmax"):
    """The torchao config of int8 dynamic activations with int4 grouped (``bits=4``) or int8 per-channel weights:
    how 8da4w and 8da8w round a linear layer."""
    return _dynamic_act(bits)(_granularity(bits == 4, group_size), scales)


QMODES: dict[str, QMode] = {
    mode.name: mode
    for mode in (
        QMode("fp32", "no quantization (float32 weights)", 32, False, None, relative_cost=0.4),
        QMode("8da4w", "int8 dynamic activations, int4 grouped weights", 4, True, _dynamic_act(4)),
        QMode("8da8w", "int8 dynamic activations, int8 per-channel weights", 8, False, _dynamic_act(8)),
        QMode(
            "mixed",
            "int8 dynamic activations, int4 grouped weights, the most sensitive layers int8 (calibrated)",
            4,
            True,
            _dynamic_act(4),
            relative_cost=1.1,
            calibrated=True,
        ),
        QMode("4w", "float32 activations, int4 per-channel weights", 4, False, _weight_only(4), True, 0.5),
        QMode("8w", "float32 activations, int8 per-channel weights", 8, False, _weight_only(8), True, 0.5),
    )
}

QEMBEDDINGS: dict[str, int] = {"4w": 4, "8w": 8}


@dataclass(frozen=True)
class Recipe:
    """What a variant's quantization needs beyond its qmode: the int4 scale choice and the int8 layers.

    ``eight_bit`` (the ``mixed`` qmode) names linears kept int8 per channel with int8
    dynamic activations (8da8w's recipe); the rest get the qmode's.
    """

    scales: str = "gptq"
    eight_bit: frozenset[str] = frozenset()
    # hub_export.pipeline.gptq.Int4Rounding: the calibrated codes of the grouped int4 layers (made once per run)
    rounding: Any = field(default=None, compare=False, hash=False, repr=False)

    def scales_of(self, mode: QMode) -> str:
        """The int4 scales a variant of ``mode`` really gets: GPTQ's codes exist for grouped int4 layers with int8
        activations only, and only when calibrated; otherwise HQQ's search, the best uncalibrated choice."""
        if self.scales == "gptq" and (self.rounding is None or not mode.grouped or mode.weight_only):
            return "hqq"
        return self.scales


def _granularity(grouped: bool, group_size: int):
    _, _, PerAxis, PerGroup = _torchao()
    return PerGroup(group_size) if grouped else PerAxis(0)


def _everything(fqn: str) -> bool:
    return True


SLICE_BYTES = 128 << 20  # float32 bytes of a tall weight's rows quantized at once


def _quantize(model: nn.Module, config, filter_fn: Callable[[nn.Module, str], bool]) -> None:
    """torchao's ``quantize_`` on the modules ``filter_fn(module, fqn)`` picks, a weight taller than
    :data:`SLICE_BYTES` (an output head or an embedding table of 150k rows) a slice of rows at a time.

    torchao's rounding keeps float32 temporaries 2-3 times the weight it is given (2.8 GB over the 0.9 GB of
    Qwen's 151,936 x 1,536 head): the highest point of a streamed export. Every scheme here rounds each row on
    its own (per row, or per group within a row), so the slices joined are the whole weight's quantization.
    """
    from torchao.quantization import quantize_

    tall = {fqn for fqn, module in model.named_modules() if filter_fn(module, fqn) and _sliceable(module)}
    quantize_(model, config, filter_fn=lambda module, fqn: filter_fn(module, fqn) and fqn not in tall)
    for fqn in tall:
        _quantize_in_slices(model.get_submodule(fqn), config)


STORED_ROWS = "stored_rows"
"""The attribute of a module whose weight is still on disk (on the meta device): where its float32 rows are read
from (``rows[a:b]``, a :class:`~hub_export.pipeline.layerwise.StoredRows`); it is quantized from there."""


def _sliceable(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    if not (_is_linear(module) or _is_embedding(module)) or weight is None:
        return False
    return hasattr(module, STORED_ROWS) or weight.numel() * 4 > SLICE_BYTES


def _quantize_in_slices(module: nn.Module, config) -> None:
    """``module``'s weight quantized a slice of rows at a time, from its stored rows or its own, into one
    quantized weight allocated once (no second copy of its codes while they are joined)."""
    import torch

    stored = getattr(module, STORED_ROWS, None)
    source = module.weight.detach() if stored is None else stored
    total, width = source.shape
    step = max(1, SLICE_BYTES // (width * 4))
    joined = None
    for start in range(0, total, step):
        piece = _quantized_rows(module, source[start : start + step], config)  # a view, or rows read from disk
        joined = _rows_of(piece, total) if joined is None else joined
        for name in type(piece).tensor_data_names:
            getattr(joined, name)[start : start + step] = getattr(piece, name)
        del piece
    module.weight = torch.nn.Parameter(joined, requires_grad=False)
    if stored is not None:
        delattr(module, STORED_ROWS)


def _quantized_rows(module: nn.Module, rows, config):
    """``rows`` of ``module``'s weight quantized as ``config`` says, by torchao, as a weight of their own."""
    import torch
    from torchao.quantization import quantize_

    if _is_linear(module):
        piece = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
    else:
        piece = torch.nn.Embedding(rows.shape[0], rows.shape[1], device="meta")
    piece.weight = torch.nn.Parameter(rows, requires_grad=False)
    quantize_(piece, config, filter_fn=lambda candidate, fqn: candidate is piece)
    return piece.weight.detach()


def _rows_of(part, total: int):
    """An empty quantized weight of ``part``'s class with ``total`` rows: each tensor it holds (codes, scales, zero
    points) as tall as that, the attributes (block size, dtypes) ``part``'s."""
    import torch

    kind = type(part)
    data = [
        torch.empty((total, *getattr(part, name).shape[1:]), dtype=getattr(part, name).dtype)
        for name in kind.tensor_data_names
    ]
    return kind(*data, *(getattr(part, name) for name in kind.tensor_attribute_names))


def _ungroupable(model: nn.Module, group_size: int, exclude: tuple, only: Callable[[str], bool]) -> list[str]:
    """The linears whose input width ``group_size`` does not divide (they fall back to int8 per channel), warned of."""
    fallback = [
        name
        for name, module in model.named_modules()
        if _is_linear(module) and module.in_features % group_size and _kept(module, exclude) and only(name)
    ]
    if fallback:
        log.warning(
            "group size %d does not divide the input width of %d layer(s) (%s%s); "
            "quantizing those per channel with int8 weights (XNNPACK's int4 kernels need whole groups)",
            group_size,
            len(fallback),
            ", ".join(fallback[:3]),
            ", ..." if len(fallback) > 3 else "",
        )
    return fallback


def quantize_linears(
    model: nn.Module,
    qmode: str,
    group_size: int = DEFAULT_GROUP_SIZE,
    exclude: tuple = (),
    recipe: Recipe = Recipe(),
    only: Callable[[str], bool] = _everything,
) -> list[str]:
    """Quantize every ``nn.Linear`` of ``model`` but those in ``exclude``, in place; ``only(name)`` picks the modules
    to touch (a model quantized one decoder layer at a time).

    Layers whose input width ``group_size`` does not divide fall back to per-channel
    quantization (with a warning); their names are returned.
    """
    mode = QMODES[qmode]
    if mode.config is None:
        return []
    fallback = _ungroupable(model, group_size, exclude, only) if mode.grouped else []
    fallback_set = set(fallback)
    eight_bit = set(recipe.eight_bit) - fallback_set

    def grouped(module, fqn):
        return _is_linear(module) and fqn not in fallback_set | eight_bit and _kept(module, exclude) and only(fqn)

    def per_channel(module, fqn):
        return _is_linear(module) and fqn in fallback_set

    if eight_bit:
        _quantize(
            model,
            _dynamic_act(8)(_granularity(False, group_size)),
            filter_fn=lambda module, fqn: (
                _is_linear(module) and fqn in eight_bit and _kept(module, exclude) and only(fqn)
            ),
        )
    scales = recipe.scales_of(mode)
    # GPTQ's codes replace the rounding below: any scale choice serves to build the tensors they go into
    _quantize(model, mode.config(_granularity(mode.grouped, group_size), "minmax" if scales == "gptq" else scales),
              filter_fn=grouped)  # fmt: skip
    if scales == "gptq":
        from hub_export.pipeline.gptq import apply  # imports torch: this module must not (options import it)

        apply(model, recipe.rounding, only)
    if fallback:
        _quantize(model, _dynamic_act(8)(_granularity(False, group_size)), filter_fn=per_channel)
    if mode.weight_only:
        from hub_export.pipeline.weight_only import (
            convert_linears,  # imports torch: this module must not (options import it)
        )

        convert_linears(model, mode.weight_bits)
    return fallback


def quantize_embeddings(model: nn.Module, qembedding: str | None, only: Callable[[str], bool] = _everything) -> None:
    """Quantize the token embedding(s) weight-only, per row (``4w`` or ``8w``)."""
    if not qembedding:
        return
    config = _weight_only(QEMBEDDINGS[qembedding])(_granularity(False, DEFAULT_GROUP_SIZE))
    _quantize(model, config, filter_fn=lambda module, fqn: _is_embedding(module) and only(fqn))


def drop_padding_index(model: nn.Module) -> None:
    """Clear ``padding_idx`` on every embedding of ``model``.

    ``padding_idx`` only stops gradients to that row; the forward pass looks the row up
    like any other, so inference is unchanged. Left in place, torchao's quantized
    embedding lowers to an ``embedding`` call with a padding argument that ExecuTorch's
    quantized-embedding fusion does not match, and lowering ends with "Missing out
    variants: {'torchao::dequantize_affine'}". Real configs set ``pad_token_id`` all the
    time (SmolLM2: 2, every Gemma: 0).
    """
    for module in model.modules():
        if _is_embedding(module):
            module.padding_idx = None


# qmodes whose output projection can be the 8-bit embedding table's bytes (see quantize_model)
SHAREABLE_QMODES = ("8da4w", "8da8w", "8w")


def quantize_model(
    model: nn.Module,
    qmode: str,
    qembedding: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    share_embeddings: bool = False,
    recipe: Recipe = Recipe(),
    only: Callable[[str], bool] = _everything,
) -> list[str]:
    """Apply ``qembedding`` then ``qmode`` to ``model`` in place; returns per-channel fallbacks. ``only(name)``
    picks the modules to touch (a model quantized one decoder layer at a time).

    The embedding goes first so that, when input and output embeddings are tied, each
    one gets its own recipe instead of the second quantization seeing the first's
    already-quantized tensor.

    ``share_embeddings`` (tied embeddings, ``qembedding="8w"``, a qmode in
    :data:`SHAREABLE_QMODES`): the output projection is quantized int8 per row, the
    embedding table's recipe, so both hold the same bytes and a two-file export stores
    them once (8da4w's projection becomes 8da8w).
    """
    drop_padding_index(model)
    quantize_embeddings(model, qembedding, only)
    if not share_embeddings or QMODES[qmode].weight_bits == 8:  # 8-bit per-channel heads already match the table
        return quantize_linears(model, qmode, group_size, recipe=recipe, only=only)
    head = model.get_output_embeddings()
    _quantize(model, _dynamic_act(8)(_granularity(False, group_size)),
              filter_fn=lambda module, fqn: module is head and only(fqn))  # fmt: skip
    return quantize_linears(model, qmode, group_size, exclude=(head,), recipe=recipe, only=only)


def validate(qmodes: list[str], qembedding: str | None, group_size: int) -> None:
    """Raise :class:`~hub_export.errors.InputError` for an unknown mode or a bad group size."""

    for mode in qmodes:
        if mode not in QMODES:
            raise InputError(f"unknown {opt('qmodes')} {mode!r}; choose from {', '.join(QMODES)}")
    if len(set(qmodes)) != len(qmodes):
        raise InputError(f"each {opt('qmodes')} may be given once")
    if qembedding and qembedding not in QEMBEDDINGS:
        raise InputError(f"unknown {opt('qembedding')} {qembedding!r}; choose from {', '.join(QEMBEDDINGS)}")
    if group_size != DEFAULT_GROUP_SIZE and not any(QMODES[mode].grouped for mode in qmodes):
        grouped = ", ".join(name for name, mode in QMODES.items() if mode.grouped)
        log.warning("--group-size applies only to %s; the chosen qmodes are per-channel and ignore it", grouped)
    if group_size <= 0 or group_size % 32:
        raise InputError(
            f"{opt('group_size')} must be a positive multiple of 32 (got {group_size}), as XNNPACK's int4 kernels require; "
            "32 is typical",
            param="group_size",
        )
