"""Generate greedily with ExecuTorch's ``MultimodalRunner`` in a fresh process; write its stats (JSON).

    python hub_export/tasks/vision_language/runner_probe.py MODEL.pte TOKENIZER.json MAX_NEW_TOKENS PARTS.json OUT.json

``PARTS.json`` lists the prompt in order: ``{"tokens": [ids]}`` or ``{"image": "FILE", "size": S}``,
where FILE holds an image's RGB bytes in ``[3, S, S]`` order. The runner prints the tokens it
generates to standard output as raw bytes (a token may end inside a UTF-8 character, which the
Python binding's per-token callback cannot pass on), so the caller reads the answer there. Run
as a script by :func:`hub_export.tasks.vision_language.export.runner_generate`, with the environment of
:data:`hub_export.runtime.process_env.PTE_PROCESS_ENV`, like ``runner_probe.py``; it imports no
hub_export module.
"""

import json
import sys
from pathlib import Path


def main() -> None:
    pte, tokenizer, new_tokens, parts_file, out = sys.argv[1:6]
    # Registers custom_sdpa, update_cache and the quantized embedding kernels with the runtime.
    import executorch.extension.llm.custom_ops.custom_ops
    import executorch.kernels.quantized  # noqa: F401
    import torch
    from executorch.extension.llm.runner import (
        GenerationConfig,
        MultimodalRunner,
        make_image_input,
        make_token_input,
    )

    inputs = []
    for part in json.loads(Path(parts_file).read_text()):
        if "tokens" in part:
            inputs.append(make_token_input([int(t) for t in part["tokens"]]))
        else:
            size = int(part["size"])
            pixels = bytearray(Path(part["image"]).read_bytes())
            inputs.append(make_image_input(torch.frombuffer(pixels, dtype=torch.uint8).view(3, size, size)))
    stats: list[dict] = []
    baseline = _status("VmRSS")  # before the file loads: what the imports hold
    runner = MultimodalRunner(pte, tokenizer)
    runner.generate(
        inputs,
        GenerationConfig(max_new_tokens=int(new_tokens), temperature=0.0, echo=False),
        stats_callback=lambda s: stats.append(json.loads(s.to_json_string())),
    )
    sys.stdout.flush()
    result = stats[-1] if stats else {}
    # The process's peak resident memory (it ran only this file), and what it held before loading it.
    result["peak_rss_kib"], result["baseline_rss_kib"] = _status("VmHWM"), baseline
    Path(out).write_text(json.dumps(result))


def _status(field: str) -> int:
    """A memory figure of this process in KiB, from /proc/self/status."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


if __name__ == "__main__":
    main()
