"""Why tied embeddings are stored twice: the only stock kernel that could share them is slow.

A tied output projection could read the embedding's int8 table only through a kernel
outside the XNNPACK delegate (XNNPACK keeps its own packed copy of every weight it
runs). ExecuTorch's stock runtime has one: ``quantized_decomposed::mixed_linear``
(fp32 input, int8 weight, per-row scales), a scalar loop. This times it on
SmolLM2-135M's output projection (49152 x 576) for one decoded token:

    python -m benchmarks.shared_embedding_kernel

Compare with the whole 8da4w model's decode step in ``benchmarks/results/`` (1 / decode
tok/s), which includes the XNNPACK output projection.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

VOCAB, HIDDEN, REPEATS = 49152, 576, 10


def _register_eager_and_fake() -> None:
    # ExecuTorch declares the functional op (for its quant-fusion patterns) without an
    # implementation; export needs a fake one and the accuracy check an eager one.
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401  (the .out kernel, ahead of time)

    def eager(input, weight, scales, zero_points=None, dtype=None):
        return input @ (weight.float() * scales[:, None]).T

    torch.library.impl("quantized_decomposed::mixed_linear", "CompositeExplicitAutograd")(eager)
    torch.library.register_fake("quantized_decomposed::mixed_linear")(
        lambda input, weight, scales, zero_points=None, dtype=None: input.new_empty(input.shape[0], weight.shape[0])
    )


class SharedInt8Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randint(-127, 128, (VOCAB, HIDDEN), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(VOCAB) / 100)

    def forward(self, hidden):
        return torch.ops.quantized_decomposed.mixed_linear(hidden, self.weight, self.scales, None)


def main() -> None:
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    _register_eager_and_fake()
    head, hidden = SharedInt8Head(), torch.randn(1, HIDDEN)
    program = to_edge(
        torch.export.export(head, (hidden,)), compile_config=EdgeCompileConfig(_check_ir_validity=False)
    ).to_executorch()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "head.pte"
        path.write_bytes(program.buffer)
        module = _load_for_executorch(str(path))
        error = (module.forward((hidden,))[0] - head(hidden)).abs().max().item()
        start = time.perf_counter()
        for _ in range(REPEATS):
            module.forward((hidden,))
        milliseconds = (time.perf_counter() - start) / REPEATS * 1000
    print(f"mixed_linear {VOCAB}x{HIDDEN}, one token: {milliseconds:.2f} ms (max abs error vs eager {error:.1e})")


if __name__ == "__main__":
    main()
