"""GPTQ: int4 weights rounded to cancel each other's error on the calibration text, in 8da4w's own format.

Rounding each weight to its nearest int4 level (what ``hqq`` and ``minmax`` scales
feed) treats every error alike. GPTQ (Frantar et al., 2022) rounds a layer's input
columns one at a time and moves each rounding error onto the columns not yet rounded,
weighted by how the layer's inputs correlate on real text (the Hessian ``2 XᵀX`` of the
layer's input activations), so the layer's *output* stays close to fp32's. The result
is the same symmetric int4 grid, group size and scales that 8da4w stores: same file
size, same XNNPACK kernels, same speed; only the integer codes differ.

Details that matter, measured on SmolLM2-135M-Instruct (``benchmarks/quant_recipes.py``):

- each group's scale is searched (the shrink of its largest magnitude that minimises
  the Hessian-weighted rounding error) before its columns are rounded; GPTQ with plain
  min-max scales is worse than no GPTQ at all;
- columns are rounded most-activated first ("act order"), with the scales fixed from
  the original weights so the groups stay contiguous in the file;
- every layer's Hessian is taken on the fp32 model's activations ("one shot"): a layer's
  codes do not depend on which other layers are rounded, so the mixed qmode's int8
  layers can simply be left out, and rounding layer by layer on already-rounded inputs
  was measured no better;
- scales are rounded to bfloat16 first, as XNNPACK stores them, so the codes are chosen
  for the scales the file really has;
- a chat model is also calibrated on passages of the text in its chat template
  (:func:`hub_export.pipeline.calibrate.round_int4`): its special tokens drive activations plain
  text never does.

The calibration reads the text in windows through the fp32 model with hooks on the
linears. A model loaded whole keeps Hessians for a bounded set of layers at a time
(:data:`HESSIAN_BYTES`), the forward pass stopping after the last layer of the set;
a model read one decoder layer at a time (:func:`round_layerwise`) keeps the windows'
hidden states between layers, so each layer is read and run once and the cost grows
linearly with depth. Linears fed the same input (q/k/v, gate/up) share one Hessian.
Both give the same codes: every Hessian is taken on fp32 activations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

INT4_MIN, INT4_MAX = -8, 7
DAMPING = 0.03  # of the Hessian's mean diagonal; 0.003 to 0.1 all within 2% of each other on SmolLM2
SHRINKS = 21  # scale candidates per group: its largest magnitude times 1.0 down to 0.6
WINDOW = 512  # tokens per calibration forward pass
MAX_TOKENS = 8192  # calibration tokens read at most
HESSIAN_BYTES = 256 << 20  # Hessians held at once (float32)
SCALE_ROWS = 256  # rows whose scales are searched at once (their temporaries fit in cache)
GRAM_BLOCK = 1024  # input columns per block of a Hessian's sum
BLOCK = 128  # columns rounded before the rest of the matrix is updated (the lazy batch of the paper)
ROUND_BYTES = 128 << 20  # float32 bytes of weight rows rounded at once
SUB_BLOCK = 16  # columns within a lazy batch whose errors are carried into the rest of it at once


@dataclass
class Int4Rounding:
    """GPTQ's int4 codes and scales for some linears of a model, by module name, and how they were calibrated.

    Codes are stored two to a byte: the rounding travels pickled to every worker process.
    A rounding :meth:`spill`-ed to a file travels as that file's path instead, and each
    linear's codes are read from it only when that linear is quantized.
    """

    group_size: int
    packed: dict[str, torch.Tensor] = field(default_factory=dict)  # uint8 [rows, cols / 2]
    scales: dict[str, torch.Tensor] = field(default_factory=dict)  # float32 [rows, cols / group_size]
    text: str = ""
    tokens: int = 0
    seconds: float = 0.0
    layers: int = 0  # how many linears were rounded (kept when the codes are let go)
    file: Path | None = None  # where spill() put the codes
    spilled: frozenset[str] = frozenset()  # the linears whose codes are in ``file``

    def __contains__(self, name: str) -> bool:
        return name in self.packed or name in self.spilled

    def codes_and_scales(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``name``'s int4 codes as int8 in [-8, 7], shape [rows, cols], and its scales [rows, cols / group_size]."""
        import torch

        if name in self.packed:
            packed, scales = self.packed[name], self.scales[name]
        else:
            from safetensors import safe_open

            with safe_open(str(self.file), framework="pt") as stored:
                packed, scales = stored.get_tensor(f"packed.{name}"), stored.get_tensor(f"scales.{name}")
        low = (packed & 0xF).to(torch.int8) - 8
        high = (packed >> 4).to(torch.int8) - 8
        return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1), scales

    def weight(self, name: str) -> torch.Tensor:
        """``name``'s weight as the file stores it, back in float32."""
        codes, scales = self.codes_and_scales(name)
        return codes.float() * scales.repeat_interleave(self.group_size, dim=1)

    def add(self, name: str, codes: torch.Tensor, scales: torch.Tensor) -> None:
        import torch

        unsigned = (codes.to(torch.int8) + 8).view(torch.uint8)  # [0, 15] fits int8: no wider copy of a big head
        self.packed[name] = unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)
        self.scales[name] = scales.float().contiguous()

    def record(self) -> dict[str, Any]:
        """What the manifest says about the calibration (never the text itself)."""
        return {"text": self.text, "tokens": self.tokens, "seconds": round(self.seconds, 1), "layers": self._rounded()}

    def forget_codes(self) -> None:
        """Let the codes go once the last variant holds them (0.6 bytes per weight: 2.3 GB for a 4B model,
        which would otherwise sit through lowering); the record stays."""
        self.layers = self._rounded()
        self.packed.clear()
        self.scales.clear()
        self.spilled = frozenset()

    def _rounded(self) -> int:
        """How many linears were rounded, wherever their codes are now (here, in the file, or let go)."""
        return len(self.packed) or len(self.spilled) or self.layers

    def spill(self, path: Path) -> None:
        """Move the codes to a safetensors file at ``path``: a process that only hands the rounding to the
        processes that quantize no longer holds them, and each of those reads one linear's codes at a time."""
        from safetensors.torch import save_file

        tensors = {f"packed.{name}": packed for name, packed in self.packed.items()}
        tensors.update({f"scales.{name}": scales for name, scales in self.scales.items()})
        save_file(tensors, str(path))
        self.file, self.spilled = path, frozenset(self.packed)
        self.layers = self._rounded()
        self.packed.clear()
        self.scales.clear()


def _group_scales(weight: torch.Tensor, importance: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per (row, group): the bf16 scale, among shrinks of the largest magnitude, with the least importance-weighted
    rounding error. ``importance``: the Hessian's diagonal (how strongly each input column is driven).

    Searched :data:`SCALE_ROWS` rows at a time with in-place temporaries, which keeps them in cache: 9x faster
    than the whole matrix at once on an 8192 x 2048 weight, with the same result bit for bit."""
    import torch

    rows, cols = weight.shape
    groups = cols // group_size
    weights = importance.reshape(1, groups, group_size)
    shrinks = torch.linspace(1.0, 0.6, SHRINKS)
    chosen = torch.empty(rows, groups)
    for start in range(0, rows, SCALE_ROWS):
        grouped = weight[start : start + SCALE_ROWS].reshape(-1, groups, group_size)
        largest = grouped.abs().amax(-1, keepdim=True).clamp(min=1e-12)
        work = torch.empty_like(grouped)
        best_scale, best_error = None, None
        for shrink in shrinks:
            # torchao's symmetric int4 scale is amax / 7.5; bf16 as XNNPACK stores it
            scale = (largest * shrink / 7.5).to(torch.bfloat16).float().clamp(min=1e-12)
            torch.div(grouped, scale, out=work)
            work.round_().clamp_(INT4_MIN, INT4_MAX).mul_(scale).sub_(grouped).square_().mul_(weights)
            error = work.sum(-1, keepdim=True)  # the importance-weighted squared rounding error per group
            if best_error is None:
                best_scale, best_error = scale, error
            else:
                better = error < best_error
                best_scale = torch.where(better, scale, best_scale)
                best_error = torch.where(better, error, best_error)
        chosen[start : start + SCALE_ROWS] = best_scale.squeeze(-1)
    return chosen


def round_weight(weight: torch.Tensor, hessian: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ-round ``weight`` [rows, cols] given its input Hessian [cols, cols]: (int8 codes in [-8, 7], scales
    [rows, cols / group_size]) with ``codes * scales`` (scales repeated per group) the stored weight.

    Example:
        >>> import torch
        >>> x = torch.randn(256, 64)
        >>> codes, scales = round_weight(torch.randn(16, 64), 2 * x.T @ x / 256, 32)
        >>> codes.shape, scales.shape, int(codes.min()) >= -8, int(codes.max()) <= 7
        (torch.Size([16, 64]), torch.Size([16, 2]), True, True)
    """
    import torch

    cols = weight.shape[1]
    importance = hessian.detach().float().diagonal().clone()
    importance[importance == 0] = 1.0  # inputs never driven on the text: their weights cannot matter there
    order = torch.argsort(importance, descending=True)
    # A down projection's Hessian is cols² floats (320 MB at 8,960 inputs); the caller's goes once it is permuted
    # (when the caller handed it over, as a layer's rounding does) and the permuted one once it is factorised.
    reversed_hessian = _reversed_damped(hessian.detach().float(), order, importance)
    del hessian
    lower_inverse = _inverse_cholesky_factor(reversed_hessian)
    del reversed_hessian
    inverse = _reversed(lower_inverse)
    del lower_inverse
    # Rows are rounded independently of each other given the Hessian, so a tall weight (an output head of 150k
    # rows, read from the checkpoint on demand once let go) is rounded a slice of rows at a time: its temporaries
    # stay a few hundred MB, and only a slice of its float32 rows is ever held.
    step, rows = max(1, ROUND_BYTES // (4 * cols)), weight.shape[0]
    codes, scales = torch.empty(rows, cols, dtype=torch.int8), torch.empty(rows, cols // group_size)
    for row in range(0, rows, step):
        codes[row : row + step], scales[row : row + step] = _round_rows(
            weight[row : row + step].detach(), importance, order, inverse, group_size
        )
    return codes, scales


def _reversed_damped(hessian: torch.Tensor, order: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
    """``hessian``'s rows and columns in ``order``, then reversed (one gather: a new matrix), its diagonal the
    ``importance`` (a dead input's 1) plus GPTQ's damping, a fraction of their mean (no cols x cols identity)."""
    backwards = order.flip(0)
    reversed_hessian = hessian[backwards[:, None], backwards[None, :]]
    reversed_hessian.diagonal().copy_(importance[backwards]).add_(DAMPING * importance.mean())
    return reversed_hessian


def _round_rows(
    weight: torch.Tensor, importance: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ-round some rows of a weight: :func:`round_weight` after the Hessian is factorised."""
    import torch

    cols = weight.shape[1]
    weight = weight.float()
    scales = _group_scales(weight, importance, group_size)
    # Columns are rounded one after another, so the work runs on the transpose: each column a contiguous row.
    # The same arithmetic in the same order as on the weight itself (same codes), 2-3x faster on large layers.
    weight = weight[:, order].T.contiguous()  # a copy: the caller's weight is left as it is
    column_scale = scales.repeat_interleave(group_size, dim=1)[:, order].T.contiguous()
    codes = torch.zeros_like(weight)
    for start in range(0, cols, BLOCK):
        end = min(start + BLOCK, cols)
        # the batch's own rows are rounded in place: nothing reads them again
        errors = _round_block(weight[start:end], column_scale[start:end], inverse[start:end, start:end],
                              codes[start:end])  # fmt: skip
        weight[end:].addmm_(inverse[start:end, end:].T, errors, alpha=-1)  # in place: no temporary of the rest
    return codes.T[:, torch.argsort(order)].to(torch.int8), scales


def _round_block(block: torch.Tensor, scale: torch.Tensor, inverse: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Round one lazy batch's columns (rows of ``block``, the weight's transpose) in order into ``codes``, each
    column's error carried into the columns after it; returns the scaled errors for the rest of the matrix.

    The carrying is blocked again, :data:`SUB_BLOCK` columns at a time: within a sub-block, rank-1 updates in
    place; past it, one matrix product of the sub-block's errors. Most of the carrying becomes a matrix product
    instead of a memory-bound outer product per column (the same sums, in another order)."""
    import torch

    errors = torch.empty_like(block)
    width = block.shape[0]
    for sub in range(0, width, SUB_BLOCK):
        sub_end = min(sub + SUB_BLOCK, width)
        for i in range(sub, sub_end):
            torch.div(block[i], scale[i], out=codes[i]).round_().clamp_(INT4_MIN, INT4_MAX)
            torch.addcmul(block[i], codes[i], scale[i], value=-1, out=errors[i]).div_(inverse[i, i])
            block[i + 1 : sub_end].addr_(inverse[i, i + 1 : sub_end], errors[i], alpha=-1)
        block[sub_end:].addmm_(inverse[sub:sub_end, sub_end:].T, errors[sub:sub_end], alpha=-1)
    return errors


def _upper_inverse_cholesky(hessian: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor ``U`` of ``hessian``'s inverse (``H⁻¹ = UᵀU``: GPTQ's update rows), with more
    damping if needed.

    Taken as the inverse of the lower Cholesky factor of ``hessian`` with its rows and columns reversed, one
    factorisation and one triangular inversion (LAPACK ``trtri``), instead of factorising, inverting and
    factorising again: half the work (5.2 s against 9.5 s on an 8192-wide Hessian, 2 cores AVX2), the same
    rows to within 1e-6 of their largest entry (``python -m benchmarks.gptq_layer`` times both)."""
    # With J the reversal, J H J = L Lᵀ gives H = (J L J)(J L J)ᵀ and so H⁻¹ = UᵀU with U = J L⁻¹ J.
    return _reversed(_inverse_cholesky_factor(hessian.flip(0, 1)))


def _inverse_cholesky_factor(hessian: torch.Tensor) -> torch.Tensor:
    """``L⁻¹`` for ``hessian = L Lᵀ`` (column-major, as LAPACK leaves it), more damping added to ``hessian``'s
    diagonal in place while it is too near singular to factorise."""
    import numpy as np
    import torch
    from scipy.linalg import lapack

    extra = hessian.diag().mean() * 1e-2
    for _ in range(6):
        lower, failed = torch.linalg.cholesky_ex(hessian)
        if not int(failed):
            # torch leaves L column-major, as LAPACK wants it: inverted in its own memory
            inverse, info = lapack.strtri(lower.numpy(), lower=1, overwrite_c=1)
            if info == 0 and np.isfinite(inverse).all():
                return torch.from_numpy(inverse)
        hessian.diagonal().add_(extra)  # near-singular on a short text: damp more
        extra *= 10
    raise RuntimeError("GPTQ: the calibration Hessian stayed singular after damping")


def _reversed(matrix: torch.Tensor) -> torch.Tensor:
    """``J A J`` (rows and columns reversed) as a new row-major matrix, made a band of rows at a time from any
    layout of ``matrix`` (``flip`` would keep a column-major layout, and making that contiguous copies it again)."""
    import torch

    size = matrix.shape[0]
    result = torch.empty(matrix.shape, dtype=matrix.dtype)
    for row in range(0, size, GRAM_BLOCK):
        end = min(row + GRAM_BLOCK, size)
        result[row:end] = matrix[size - end : size - row].flip(0, 1)
    return result


def heap_allocations():
    """:func:`hub_export.patches.heap_allocations` (imported when used: patches imports torch)."""
    from hub_export.patches import heap_allocations as allocations  # patches imports torch: loaded when GPTQ runs

    return allocations()


class _StopForward(Exception):
    """Raised by the last hooked layer of a set: the rest of the forward pass is not needed."""


def _hessian_sets(linears: dict[str, torch.nn.Module]) -> list[list[str]]:
    """``linears`` (in forward order) cut into consecutive sets whose Hessians fit :data:`HESSIAN_BYTES`."""
    sets: list[list[str]] = [[]]
    used = 0
    for name, module in linears.items():
        size = module.in_features**2 * 4
        if sets[-1] and used + size > HESSIAN_BYTES:
            sets.append([])
            used = 0
        sets[-1].append(name)
        used += size
    return sets


def _hessians(model: torch.nn.Module, linears: dict[str, torch.nn.Module], names: list[str], windows: list):
    """The input Hessian ``2 XᵀX / n`` of each of ``names`` over the calibration ``windows`` (fp32 model)."""
    import torch

    sums = {name: _GramSum(linears[name].in_features) for name in names}
    last = names[-1]

    def hook(name: str):
        def collect(module, inputs):
            sums[name].add(inputs[0])
            if name == last:
                raise _StopForward

        return collect

    handles = [linears[name].register_forward_pre_hook(hook(name)) for name in names]
    try:
        with torch.no_grad():
            for window in windows:
                try:
                    model(input_ids=window)
                except _StopForward:
                    pass
    finally:
        for handle in handles:
            handle.remove()
    return {name: sums[name].hessian() for name in names}


class _GramSum:
    """``Σ xᵀx`` over the rows of every input added, and their count.

    Only the blocks on and above the diagonal are multiplied, :data:`GRAM_BLOCK` columns at a time (the sum is
    symmetric): on an 8192-wide input (a down projection's), 8 windows of 512 tokens take 2.1 s against 5.1 s
    for the whole ``x.T @ x``, 2 cores AVX2, the smaller products also staying in cache."""

    def __init__(self, width: int):
        import torch

        self.total = torch.zeros(width, width)  # its blocks on and above the diagonal hold the sum
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1]).float()
        width = flat.shape[1]
        for row in range(0, width, GRAM_BLOCK):
            rows = flat[:, row : row + GRAM_BLOCK].T
            for column in range(row, width, GRAM_BLOCK):
                self.total[row : row + GRAM_BLOCK, column : column + GRAM_BLOCK].addmm_(
                    rows, flat[:, column : column + GRAM_BLOCK]
                )
        self.count += flat.shape[0]

    def hessian(self) -> torch.Tensor:
        """``2 XᵀX / n``, both triangles, made in place of the sum, which it hands over (call it once): at 8,960
        inputs a whole-matrix ``triu`` and its transpose would be two more 320 MB temporaries."""
        total, self.total = self.total, None
        width = total.shape[0]
        for row in range(0, width, GRAM_BLOCK):
            end = min(row + GRAM_BLOCK, width)
            diagonal = total[row:end, row:end]
            diagonal.copy_(diagonal.triu() + diagonal.triu(1).T)
            for column in range(end, width, GRAM_BLOCK):
                total[column : column + GRAM_BLOCK, row:end] = total[row:end, column : column + GRAM_BLOCK].T
        return total.mul_(2 / max(self.count, 1))


class _HessianSums:
    """Input Hessians of some linears of one decoder layer, gathered by forward pre-hooks while the layer runs.

    Linears fed the very same tensor in one call (q/k/v, gate/up) share one sum: it is computed once.
    """

    def __init__(self, linears: dict[str, torch.nn.Module]):
        self.linears = linears
        self.sums: dict[str, _GramSum] = {}
        self.owner: dict[str, str] = {}  # linear -> the linear whose sum it shares
        # id -> (first linear, the tensor): the tensor is held so its id cannot be reused within the call
        self._seen: dict[int, tuple[str, torch.Tensor]] = {}

    def add(self, name: str, x: torch.Tensor) -> None:
        first, _ = self._seen.setdefault(id(x), (name, x))
        self.owner.setdefault(name, first)
        if first != name:  # this input was already counted for another linear of this call
            return
        if name not in self.sums:
            self.sums[name] = _GramSum(x.shape[-1])
        self.sums[name].add(x)

    @contextlib.contextmanager
    def observing(self, layer: torch.nn.Module):
        """Hooks on the linears (and on ``layer``, to start each call afresh) for the duration of the block."""

        def collect(name: str):
            return lambda module, inputs: self.add(name, inputs[0])

        handles = [layer.register_forward_pre_hook(lambda module, args: self._seen.clear())]
        handles += [module.register_forward_pre_hook(collect(name)) for name, module in self.linears.items()]
        try:
            yield
        finally:
            self._seen.clear()
            for handle in handles:
                handle.remove()

    def hessian(self, name: str) -> torch.Tensor:
        import torch

        owner = self.owner.get(name, name)
        if owner not in self.sums:  # never run on the text: every input column is dead
            width = self.linears[name].in_features
            return torch.zeros(width, width)
        return self.sums.pop(owner).hessian()  # handed over: the caller's reference is the last one

    def sharing(self) -> list[list[str]]:
        """The linears in groups that share one Hessian, in forward order."""
        groups: dict[str, list[str]] = {}
        for name in self.linears:
            groups.setdefault(self.owner.get(name, name), []).append(name)
        return list(groups.values())


def _calibration_windows(ids: list[int], window: int, conversations) -> list:
    import torch

    ids = ids[:MAX_TOKENS]
    windows = [torch.tensor([ids[i : i + window]]) for i in range(0, len(ids), window) if len(ids[i : i + window]) > 1]
    return windows + [torch.tensor([chat[:window]]) for chat in conversations if len(chat) > 1]


def _round_shared(gathered: _HessianSums, rounding: Int4Rounding, group_size: int) -> None:
    """Round every linear of one layer into ``rounding``; linears sharing a Hessian are rounded as one matrix
    (GPTQ treats rows alike: the same codes, the preparation done once)."""
    import torch

    for names in gathered.sharing():
        weights = [gathered.linears[name].weight for name in names]
        codes, scales = round_weight(torch.cat(weights), gathered.hessian(names[0]), group_size)
        rows = [weight.shape[0] for weight in weights]
        for name, part, part_scales in zip(names, codes.split(rows), scales.split(rows), strict=True):
            rounding.add(name, part, part_scales)


@dataclass
class CalibrationTokens:
    """What GPTQ calibrates on: the text's token ``ids``, cut into ``window``-token windows, and ``conversations``
    (token lists fed from position 0 as they are: the text's passages in the model's chat template); ``text``
    names the text for the manifest."""

    ids: list[int]
    text: str
    window: int = WINDOW
    conversations: list[list[int]] = field(default_factory=list)

    def windows(self) -> list[torch.Tensor]:
        return _calibration_windows(self.ids, self.window, self.conversations)


def round_layerwise(
    layerwise,
    wanted: Callable[[str, torch.nn.Module], bool],
    tokens: CalibrationTokens,
    group_size: int,
    say: Callable[[str], None] = lambda message: None,
    passes: list = (),
) -> Int4Rounding:
    """GPTQ-round the linears ``wanted(name, module)`` picks in a :class:`~hub_export.pipeline.layerwise.LayerwiseModel`,
    reading each decoder layer from the checkpoint once: the calibration windows' hidden states go from layer to
    layer in fp32, each layer's Hessians are gathered as they pass and its linears rounded before the next layer
    is read. ``passes``: other :class:`~hub_export.pipeline.layerwise.LayerPass` es walked in the same reading (the
    verification reference). The output head, if wanted, is rounded last on the final norm's outputs."""
    import torch

    started = time.perf_counter()
    calibration = layerwise.start(tokens.windows())
    rounding = Int4Rounding(group_size, text=tokens.text, tokens=sum(int(w.shape[1]) for w in calibration.windows))
    sums: dict[int, _HessianSums] = {}

    def linears_of(index: int, layer) -> dict[str, torch.nn.Module]:
        prefix = layerwise.layer_prefix(index)
        found = {prefix + name: m for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        return {name: m for name, m in found.items() if wanted(name, m)}

    def observe(index: int, layer):
        sums[index] = _HessianSums(linears_of(index, layer))
        return sums[index].observing(layer)

    def round_layer(index: int, layer) -> None:
        gathered = sums.pop(index)
        with heap_allocations():
            _round_shared(gathered, rounding, group_size)

    calibration.observe = observe
    layerwise.release_tables()  # every pass has started: the layers are all the walk reads
    layerwise.walk([calibration, *passes], round_layer, say, "GPTQ")
    head = layerwise.model.get_output_embeddings()
    name = _head_name(layerwise.model, head) if head is not None else None
    if name is not None and wanted(name, head):
        say("GPTQ: the output projection")
        head_sums = _HessianSums({name: head})
        for index in range(len(calibration.windows)):
            head_sums.add(name, layerwise.head_inputs(calibration, index, head))  # the head itself is not run
        with heap_allocations():
            codes, scales = round_weight(layerwise.head_rows(), head_sums.hessian(name), group_size)
        rounding.add(name, codes, scales)
    rounding.seconds = time.perf_counter() - started
    return rounding


def _head_name(model: torch.nn.Module, head: torch.nn.Module) -> str:
    return next(name for name, module in model.named_modules() if module is head)


def round_linears(
    model: torch.nn.Module,
    linears: dict[str, torch.nn.Module],
    tokens: CalibrationTokens,
    group_size: int,
    say: Callable[[str], None] = lambda message: None,
) -> Int4Rounding:
    """GPTQ-round ``linears`` (name -> module of ``model``, in forward order) on the calibration ``tokens``.
    ``model`` is the fp32 model; it is left as it was found."""

    started = time.perf_counter()
    windows = tokens.windows()
    rounding = Int4Rounding(group_size, text=tokens.text, tokens=sum(int(w.shape[1]) for w in windows))
    sets = _hessian_sets(linears)
    done = 0
    for names in sets:
        hessians = _hessians(model, linears, names, windows)
        with heap_allocations():
            for name in names:
                codes, scales = round_weight(linears[name].weight, hessians.pop(name), group_size)
                rounding.add(name, codes, scales)
                done += 1
        say(f"GPTQ: {done} of {len(linears)} linears rounded")
    rounding.seconds = time.perf_counter() - started
    return rounding


def apply(model: torch.nn.Module, rounding: Int4Rounding, only: Callable[[str], bool] = lambda name: True) -> int:
    """Put ``rounding``'s codes and scales into ``model``'s int4-quantized linears (torchao's ``IntxUnpackedToInt8Tensor``
    weights, as 8da4w's quantization left them) that ``only(name)`` picks; returns how many were replaced.

    Raises:
        RuntimeError: a layer's quantized weight is not the grouped int4 tensor the codes were made for.
    """
    import torch

    replaced = 0
    for name, module in model.named_modules():
        if name not in rounding or not isinstance(module, torch.nn.Linear) or not only(name):
            continue
        weight = module.weight
        if getattr(weight, "target_dtype", None) != torch.int4:
            continue  # kept int8 in this variant (mixed's plan, a per-channel fallback, a shared head)
        codes, scales = rounding.codes_and_scales(name)
        if tuple(weight.block_size) != (1, rounding.group_size) or weight.qdata.shape != codes.shape:
            raise RuntimeError(f"GPTQ codes of {name} were made for group size {rounding.group_size}, not "
                               f"{weight.block_size[1]}")  # fmt: skip
        weight.qdata.copy_(codes)
        weight.scale.copy_(scales.to(weight.scale.dtype))
        weight.zero_point.zero_()
        replaced += 1
    return replaced
