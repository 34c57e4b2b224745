"""Memory budget: an export's peak resident memory, estimated from the model's config before any work.

An export that cannot fit is refused before it downloads or loads anything, with the
estimate and what to do, instead of being killed an hour in. The coefficients are
measured peaks (``python -m benchmarks.scale``; the peak of the export's whole process
tree against the model's fp32 weight bytes):

- a text model read one decoder layer at a time (:mod:`hub_export.pipeline.streaming`)
  peaks either in GPTQ's walk over the layers (the outer parts, the codes so far, one
  layer's Hessians) or while a worker process quantizes and lowers one variant: its
  quantized weights (one byte per int4 weight before packing, with their scales), what
  lowering copies of them (the XNNPACK blobs, then the program's buffer), beside a parent
  that holds only the reference (GPTQ's codes wait on disk); its peak follows the
  variant's stored bits;
- a model loaded whole (the ``mixed`` qmode, every other task) holds its fp32
  weights, a quantized copy and lowering's copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hub_export.errors import InputError, opt
from hub_export.pipeline import quantize

if TYPE_CHECKING:
    from hub_export.options import ExportOptions

GIB = 1 << 30
# torch, transformers and ExecuTorch imported, the tokenizer, the reference and GPTQ's Hessians of one layer.
FRAMEWORK_BYTES = int(1.5 * GIB)
# Peak of one variant built layer by layer, per fp32 weight byte, by the bits its linears store. 8da4w measured,
# the frameworks above taken off (benchmarks/results/scale.md): 0.29 for the Llama 3.2 1B shape, 0.38 for Gemma 3
# 1B, 0.41 for the SmolLM2-1.7B shape, 0.31 for the Qwen3-4B shape; 0.46 for the real Qwen2.5-Coder-1.5B with its
# untied head, on older code (benchmarks/results/real-weights.md): 0.6 keeps a margin over the highest. 8-bit adds
# the bytes its larger blob and file take, fp32 holds the weights themselves twice: estimates, not measured at size.
STREAMED_PEAK_PER_FP32_BYTE = {4: 0.6, 8: 1.1, 32: 2.2}
# Peak of one variant of a model loaded whole, per fp32 weight byte (measured: 2.83x, in hub_export.pipeline.workers).
WHOLE_PEAK_PER_FP32_BYTE = 3.0


def fp32_weight_bytes(config: dict, trust_remote_code: bool = False) -> int | None:
    """The fp32 bytes of the causal LM ``config`` describes (tied weights once), from a model built on the meta
    device: nothing is allocated or downloaded. None when the config cannot be built here."""
    try:
        import transformers
        from accelerate import init_empty_weights

        settings = {key: value for key, value in config.items() if key != "model_type"}
        built = transformers.AutoConfig.for_model(config["model_type"], **settings)
        with init_empty_weights():
            model = transformers.AutoModelForCausalLM.from_config(built, trust_remote_code=trust_remote_code)
        model.tie_weights()
        return sum(p.numel() for p in model.parameters()) * 4
    except Exception:  # an exotic or remote-code config: no estimate rather than a refusal
        return None


def variant_peak(weight_bytes: int, qmode: str, streamed: bool) -> int:
    """Peak resident bytes of one variant's build, frameworks included."""
    if not streamed:
        return FRAMEWORK_BYTES + int(WHOLE_PEAK_PER_FP32_BYTE * weight_bytes)
    return FRAMEWORK_BYTES + int(STREAMED_PEAK_PER_FP32_BYTE[quantize.QMODES[qmode].weight_bits] * weight_bytes)


def run_peak(weight_bytes: int, options: ExportOptions, streamed: bool) -> int:
    """Peak of a run that builds its variants one at a time (as it does whenever two would not fit)."""
    return max(variant_peak(weight_bytes, mode, streamed) for mode in options.qmodes)


def check_fits(weight_bytes: int | None, options: ExportOptions, streamed: bool, available: int | None) -> None:
    """Refuse, in one line with the estimate, an export whose peak exceeds ``available`` bytes.

    Raises:
        InputError: the estimated peak does not fit.
    """
    if weight_bytes is None or available is None:
        return
    need = run_peak(weight_bytes, options, streamed)
    if need <= available:
        return
    worst = max(options.qmodes, key=lambda mode: variant_peak(weight_bytes, mode, streamed))
    how = "read one layer at a time" if streamed else "loaded whole"
    fix = f"drop {opt('qmodes')} {worst}, " if len(options.qmodes) > 1 else ""
    if not streamed and any(quantize.QMODES[mode].calibrated for mode in options.qmodes):
        fix += f"drop {opt('qmodes')} mixed (it loads the model whole), "
    raise InputError(
        f"this export needs about {need / GIB:.1f} GiB of memory at its peak ({weight_bytes / GIB:.1f} GiB of fp32 "
        f"weights, {how}, {worst} the largest variant) and this machine has {available / GIB:.1f} GiB available: "
        f"{fix}export a smaller model, or use a machine with more memory",
        param="qmodes",
    )
