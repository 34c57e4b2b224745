"""The environment of a process that runs ``.pte`` files, set before torch loads.

ExecuTorch's LLM kernels library (``custom_sdpa``) finds BLAS's ``sgemm_`` in the MKL
inside torch, and MKL starts an OpenMP team inside each thread of ExecuTorch's own pool:
with two of each on two cores, a 60-token SmolLM2 prefill spends 48-71 ms in attention
instead of 6-8 (``python -m benchmarks.sdpa_threads``, ``docs/peer-notes.md``).
ExecuTorch's pool already uses every core, so MKL gets one thread. MKL reads this once,
when torch loads: a process that has loaded torch cannot change it, and an exporting
process would not want to (its eager matmuls halve in speed), so it is set in fresh
processes and in ``hub-export generate``.
"""

from __future__ import annotations

import os
import sys

PTE_PROCESS_ENV = {"MKL_NUM_THREADS": "1"}
# Set (to "avx2") in a measuring process's environment: XNNPACK runs the kernels of that older CPU
# (:func:`hub_export.patches.restrict_xnnpack_isa`). Used by ``hub-export bench --isa`` and the benchmarks.
XNNPACK_ISA_ENV = "HUB_EXPORT_XNNPACK_ISA"
XNNPACK_ISAS = ("avx2",)


def pte_process_env() -> dict[str, str]:
    """``os.environ`` plus :data:`PTE_PROCESS_ENV`: the environment to start a ``.pte``-running process with."""
    return {**os.environ, **PTE_PROCESS_ENV}


def prepare_pte_process() -> bool:
    """Give this process :data:`PTE_PROCESS_ENV` where the user has not set it; False once torch is loaded."""
    if "torch" in sys.modules:
        return False
    for name, value in PTE_PROCESS_ENV.items():
        os.environ.setdefault(name, value)
    return True


def apply_xnnpack_isa() -> str | None:
    """Restrict XNNPACK's kernels as :data:`XNNPACK_ISA_ENV` asks, in a fresh process before ExecuTorch loads;
    returns the instruction set in use when one was asked for."""
    isa = os.environ.get(XNNPACK_ISA_ENV) or None
    if isa:
        from hub_export.patches import restrict_xnnpack_isa  # torch and ctypes: loaded only when asked

        restrict_xnnpack_isa(isa)
    return isa
