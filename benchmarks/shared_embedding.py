"""Tied embeddings stored once: the two ways ExecuTorch 1.5.1 could do it, measured.

    python -m benchmarks.shared_embedding

1. **One file, a stock kernel.** A tied output projection could read the embedding's
   int8 table only through a kernel outside the XNNPACK delegate (XNNPACK keeps its own
   copy of every weight it runs). The stock runtime has one,
   ``quantized_decomposed::mixed_linear`` (fp32 input, int8 weight, per-row scales), a
   scalar loop; this times it on SmolLM2-135M's output projection (49152 x 576) for one
   token. Compare with a whole 8da4w decode step in ``benchmarks/results/`` (1 / decode
   tok/s).
2. **Two files** (what ``--share-embeddings`` writes). With every weight stored
   outside the program, in a ``.ptd`` data file (program constants and XNNPACK's
   weights alike), ExecuTorch's named-data store keeps byte-identical buffers once; an
   8-bit embedding table and an output projection quantized int8 per row are the same
   bytes. This exports a 1-layer SmolLM2-shaped 8da8w model both ways and compares
   sizes, logits and ``TextLLMRunner`` output.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
VOCAB, HIDDEN, REPEATS = 49152, 576, 10


def _register_eager_and_fake() -> None:
    # ExecuTorch declares the functional op (for its quant-fusion patterns) without an
    # implementation; export needs a fake one and the accuracy check an eager one.
    import executorch.exir.passes._quant_patterns_and_replacements
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


def stock_kernel_milliseconds() -> None:
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


def two_file_layout(scratch: Path) -> None:
    from executorch.runtime import Runtime
    from transformers import LlamaForCausalLM

    from benchmarks.models import build_smollm2_shaped, smollm2_135m_config
    from hub_export.pipeline import lower, quantize
    from hub_export.runtime.pte import _load_kernels
    from hub_export.tasks.text_generation.export import ExportableDecoder, export_program

    config = smollm2_135m_config()
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    quantize.quantize_model(model, "8da8w", "8w", 32, share_embeddings=True)
    metadata = lower.runner_metadata(
        max_seq_len=64, bos_id=1, eos_ids=[2], vocab_size=config.vocab_size, dynamic_shape=True
    )

    single = scratch / "single.pte"
    lower.to_pte(export_program(ExportableDecoder(model, 64)), metadata, single)

    pte, ptd = scratch / "model.pte", scratch / "model.ptd"
    lower.to_pte(export_program(ExportableDecoder(model, 64)), metadata, pte, ptd)  # what --share-embeddings writes

    _load_kernels()
    ids, positions = torch.tensor([[1, 5, 9, 200]]), torch.arange(4)
    two = Runtime.get().load_program(str(pte), data_path=str(ptd)).load_method("forward").execute([ids, positions])[0]
    one = Runtime.get().load_program(str(single)).load_method("forward").execute([ids, positions])[0]
    tokenizer = build_smollm2_shaped(ROOT / "work" / "model") / "tokenizer.json"
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    texts = []
    for args in ((str(single), str(tokenizer)), (str(pte), str(tokenizer), str(ptd))):
        pieces: list[str] = []
        TextLLMRunner(*args).generate(
            "Once upon a time",
            GenerationConfig(max_new_tokens=8, temperature=0.0, echo=False),
            token_callback=pieces.append,
        )
        texts.append("".join(pieces))
    mb = lambda path: path.stat().st_size / 1e6  # noqa: E731
    print(
        f"1-layer SmolLM2-shaped 8da8w, 8-bit tied embeddings: one file {mb(single):.2f} MB; "
        f"two files {mb(pte):.2f} MB .pte + {mb(ptd):.2f} MB .ptd = {mb(pte) + mb(ptd):.2f} MB; "
        f"max |logit difference| {(two - one).abs().max().item():.1e}; "
        f"TextLLMRunner text identical: {texts[0] == texts[1]}"
    )


def main() -> None:
    stock_kernel_milliseconds()
    with tempfile.TemporaryDirectory() as scratch:
        two_file_layout(Path(scratch))


if __name__ == "__main__":
    main()
