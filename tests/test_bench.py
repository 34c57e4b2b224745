"""hub-export bench: prefill and decode speed of a text-generation file over fresh processes, EOS ignored."""

from __future__ import annotations

import json

from helpers import error_line, run_cli


def test_bench_reports_every_run_and_the_threads_it_asked_for(exported_multi, capsys) -> None:
    from hub_export.tasks.text_generation.bench import bench

    result = bench(exported_multi / "model-8da4w-emb8w.pte", prompt_tokens=16, gen_tokens=24, threads=1, repeat=2)
    assert len(result.runs) == 2 and all(run["threads"] == 1 for run in result.runs)
    assert result.median("decode_tokens_per_s") > 0 and result.median("prefill_tokens_per_s") > 0
    assert result.spread("peak_rss_bytes")[0] > 10e6  # a process that loaded torch and the file
    code, out, _ = run_cli(["bench", str(exported_multi), "--variant", "8da4w", "--prompt-tokens", "8",
                            "--gen-tokens", "8", "--repeat", "1", "--json"], capsys)  # fmt: skip
    shown = json.loads(out)
    assert code == 0 and shown["gen_tokens"] == 8 and len(shown["runs"]) == 1


def test_bench_refuses_more_tokens_than_the_context(exported_multi, capsys) -> None:
    code, _, err = run_cli(["bench", str(exported_multi), "--prompt-tokens", "60", "--gen-tokens", "10"], capsys)
    assert code == 2 and "must fit the file's context of 64 tokens" in error_line(err)


_KERNELS_PROBE = """
import ctypes, json, os, sys
from importlib.util import find_spec
from hub_export.runtime.process_env import apply_xnnpack_isa
isa = apply_xnnpack_isa()
import torch
from hub_export.runtime.pte import PteModel
logits = PteModel(sys.argv[1]).forward(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]), start_pos=0)
root = next(iter(find_spec("executorch").submodule_search_locations))
cpu = ctypes.CDLL(os.path.join(root, "lib", "libexecutorch_threadpool.so"), mode=os.RTLD_NOLOAD)  # the loaded one
features = (ctypes.c_uint8 * 64).in_dll(cpu, "cpuinfo_isa")
print(json.dumps({"isa": isa, "avx2": features[28], "avx512f": features[29], "logits": logits.flatten().tolist()}))
"""


def _probe_kernels(pte, isa: str | None) -> dict:
    import os
    import subprocess
    import sys

    from hub_export.runtime.process_env import XNNPACK_ISA_ENV

    env = {key: value for key, value in os.environ.items() if key != XNNPACK_ISA_ENV}
    done = subprocess.run([sys.executable, "-c", _KERNELS_PROBE, str(pte)], capture_output=True, text=True,
                          env={**env, **({XNNPACK_ISA_ENV: isa} if isa else {})}, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_isa_runs_xnnpack_on_avx2_kernels_with_the_same_logits(exported_multi, capsys) -> None:
    import pytest
    import torch

    if " avx2 " not in open("/proc/cpuinfo").read().replace("\n", " "):
        pytest.skip("this CPU has no AVX2")
    pte = exported_multi / "model-8da4w-emb8w.pte"
    native, older = _probe_kernels(pte, None), _probe_kernels(pte, "avx2")
    assert older["isa"] == "avx2" and older["avx2"] == 1 and older["avx512f"] == 0
    assert native["isa"] is None  # nothing hidden unless asked
    # Other kernels quantize activations their own way (VNNI's unsigned int8, AVX2's signed): on the real SmolLM2
    # 8da4w file the logits differ by 0.23 on average (their spread: 2.2), the same top token.
    older_logits, native_logits = torch.tensor(older["logits"]), torch.tensor(native["logits"])
    assert int(older_logits.argmax()) == int(native_logits.argmax())
    assert float((older_logits - native_logits).abs().mean()) < 0.2 * float(native_logits.std())
    code, out, _ = run_cli(["bench", str(pte), "--prompt-tokens", "8", "--gen-tokens", "8", "--repeat", "1",
                            "--isa", "avx2", "--json"], capsys)  # fmt: skip
    assert code == 0 and json.loads(out)["runs"][0]["isa"] == "avx2"


def test_bench_isa_refuses_what_it_cannot_do(exported_multi, capsys) -> None:
    import subprocess
    import sys

    code, _, err = run_cli(["bench", str(exported_multi), "--isa", "avx512", "--repeat", "1"], capsys)
    assert code == 2 and error_line(err) == "Error: unknown --isa 'avx512'; choose one of: avx2"
    late = ("import executorch.extension.pybindings.portable_lib\nfrom hub_export.patches import restrict_xnnpack_isa\n"
            "restrict_xnnpack_isa('avx2')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True)
    assert done.returncode != 0 and "must be set before ExecuTorch's runtime loads" in done.stderr
