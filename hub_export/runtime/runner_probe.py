"""Generate greedily with ExecuTorch's C++ ``TextLLMRunner`` in a fresh process; write its stats (JSON).

    python hub_export/runtime/runner_probe.py MODEL.pte TOKENIZER.json MAX_NEW_TOKENS OUT.json [DATA.ptd] < PROMPT

Run as a script by :func:`hub_export.runtime.pte.runner_generate`, with the environment of
:data:`hub_export.runtime.process_env.PTE_PROCESS_ENV`, so that the runner's timings describe the file
and not the process that asked for them (its imports, its thread settings). Like
``memory_probe.py`` it imports no hub_export module, only ExecuTorch's runner and its
kernel libraries.
"""

import json
import os
import sys
from pathlib import Path


def main() -> None:
    pte, tokenizer, new_tokens, out = sys.argv[1:5]
    data = sys.argv[5] if len(sys.argv) > 5 else None
    prompt = sys.stdin.buffer.read().decode()
    if os.environ.get("HUB_EXPORT_XNNPACK_ISA"):  # a benchmark's AVX2 rounds: before ExecuTorch loads
        from hub_export.runtime.process_env import apply_xnnpack_isa

        apply_xnnpack_isa()
    # Registers custom_sdpa, update_cache and the quantized embedding kernels with the runtime.
    import executorch.extension.llm.custom_ops.custom_ops
    import executorch.kernels.quantized  # noqa: F401
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    stats: list[dict] = []
    runner = TextLLMRunner(pte, tokenizer, data)
    runner.generate(
        prompt,
        GenerationConfig(max_new_tokens=int(new_tokens), temperature=0.0, echo=False),
        stats_callback=lambda s: stats.append(json.loads(s.to_json_string())),
    )
    result = stats[-1] if stats else {}
    result["mkl_num_threads"] = os.environ.get("MKL_NUM_THREADS")  # the layout the rates were measured in
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
