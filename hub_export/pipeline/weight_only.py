"""Weight-only linear layers in the form ExecuTorch's XNNPACK backend runs correctly.

Part of the quantize stage (kept apart so that :mod:`hub_export.pipeline.quantize` stays
importable without torch). torchao chooses the scales and rounds the weights; this
module only changes how the dequantization is written down, because on executorch
1.5.1 (measured on toy models):

- torchao's own weight-only pattern (``torchao.dequantize_affine`` feeding ``linear``)
  is not claimed by XNNPACK's linear config; after decomposition XNNPACK takes the
  weight without its scales and the logits come out ~1e3 too large.
- ExecuTorch serializes torchao's per-row int4 block as *blockwise* int4, for which
  XNNPACK has no float-activation kernel: the method fails to load.

``quantized_decomposed.dequantize_per_channel`` feeding a bias-free ``linear`` is
serialized as per-channel int8/int4 weights with float32 activations, which XNNPACK
runs with its ``f32_qc8w`` / ``f32_qc4w`` kernels, matching eager to ~1e-7. The bias
is added after the matmul because XNNPACK's serializer requires a bias to share the
input's quantization.
"""

from __future__ import annotations

# Registers torch.ops.quantized_decomposed.* (the ops ExecuTorch's quantizer emits), through its public package.
import executorch.exir  # noqa: F401
import torch
import torch.nn.functional as F
from torch import nn


class WeightOnlyLinear(nn.Module):
    """``y = x @ dequantize(qweight)^T + bias`` with per-output-channel scales."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bits: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = qweight.shape[1]
        self.out_features = qweight.shape[0]
        self.quant_min = -(2 ** (bits - 1))
        self.quant_max = 2 ** (bits - 1) - 1
        self.register_buffer("qweight", qweight.to(torch.int8))
        self.register_buffer("scale", scale.reshape(-1).to(torch.float32))
        self.register_buffer("zero_point", torch.zeros(self.out_features, dtype=torch.int64))
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.ops.quantized_decomposed.dequantize_per_channel(
            self.qweight, self.scale, self.zero_point, 0, self.quant_min, self.quant_max, torch.int8
        )
        out = F.linear(x, weight)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        bits = (self.quant_max + 1).bit_length()
        return f"in_features={self.in_features}, out_features={self.out_features}, int{bits} per channel"


def convert_linears(model: nn.Module, bits: int) -> int:
    """Replace every torchao weight-only ``nn.Linear`` of ``model`` with :class:`WeightOnlyLinear`.

    ``bits`` is the width torchao quantized to (its int4 values are stored one per int8).
    Only per-row, symmetric (zero-point 0) weights qualify; anything else is left as it
    is. Returns the number of layers converted.
    """
    from torchao.quantization import IntxUnpackedToInt8Tensor

    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if not (isinstance(child, nn.Linear) and isinstance(weight, IntxUnpackedToInt8Tensor)):
                continue
            if weight.activation_quantization is not None or tuple(weight.block_size) != (1, child.in_features):
                continue
            if bool(weight.zero_point.any()):
                continue
            setattr(parent, name, WeightOnlyLinear(weight.qdata, weight.scale, bits, child.bias))
            converted += 1
    return converted
