"""Run a ``.pte`` to full context in a fresh process and print its peak memory (JSON).

    python hub_export/runtime/memory_probe.py MODEL.pte EXTRA_TOKENS [DATA.ptd]
    python hub_export/runtime/memory_probe.py -      # imports first, then reads "MODEL.pte EXTRA [DATA.ptd]" from stdin

Run as a script, not imported: the process must not have loaded anything but torch and
the ExecuTorch runtime, so that its resident memory is what an app running the file
would hold (an exporting process keeps freed heap and XNNPACK's packed weights, which
hide the file's real cost). It imports no hub_export module, only ExecuTorch's binding
and its kernel libraries, to start in about as long as ``import torch`` takes.
"""

import importlib.util
import json
import sys
import time
from pathlib import Path


def rss_kib() -> dict:
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0])
    return values


def main() -> None:
    # Imports first: started early ("-"), the probe is ready by the time the file is.
    import torch
    from executorch.runtime import Runtime

    root = Path(importlib.util.find_spec("executorch").submodule_search_locations[0])
    for library in (
        *root.glob("extension/llm/custom_ops/*custom_ops_aot_lib.*"),
        *root.glob("kernels/quantized/*quantized_ops_aot_lib.*"),
    ):
        torch.ops.load_library(str(library))
    request = sys.stdin.readline().split("\t") if sys.argv[1] == "-" else sys.argv[1:]
    if not request or not request[0].strip():
        return  # the exporter no longer needs a measurement
    pte, extra = request[0].strip(), int(request[1])
    data = request[2].strip() if len(request) > 2 and request[2].strip() else None
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    before = rss_kib()["VmRSS"]
    program = Runtime.get().load_program(pte, data_path=data)
    length = int(program.load_method("get_max_seq_len").execute([])[0])
    vocab = int(program.load_method("get_vocab_size").execute([])[0])
    forward = program.load_method("forward")
    started = time.perf_counter()
    tokens = torch.arange(1, length, dtype=torch.long).remainder(vocab).view(1, -1)
    forward.execute([tokens, torch.arange(0, length - 1, dtype=torch.long)])
    for position in range(length - 1, length + extra):
        forward.execute([torch.tensor([[position % vocab]]), torch.tensor([position])])
    seconds = time.perf_counter() - started
    peak = rss_kib()["VmHWM"]
    print(
        json.dumps(
            {
                "peak_rss_bytes": max(0, peak - before) * 1024,
                "context_tokens": length + extra,
                "seconds": round(seconds, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
