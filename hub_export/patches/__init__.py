"""Every use of another library's private code, in one place.

Each patch below was measured and is tested; each names the upstream code it works
around or reaches into and the versions it was written against. On other versions it
is not applied: the export still works, only slower, with more memory or without a
feature (each says which), and says so once. After an upgrade of torch, ExecuTorch,
torchao, transformers or ray, this is the file to check (``tests/test_private_apis.py``
fails on a private name used anywhere else): rerun ``tests/test_lower.py`` with
``make test-all`` (same bytes with and without each skipped trace or pass) and the
benchmarks, then widen the versions below.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Patch:
    """A workaround for upstream code, applied only on the versions it was made for."""

    name: str
    package: str
    versions: tuple[str, ...]  # version prefixes the patch was written and tested against
    upstream: str  # the code it works around
    without: str  # what the user gets without it

    def applies(self) -> bool:
        """Whether the installed ``package`` is one this patch was made for; says so once when not."""
        installed = _version(self.package)
        if installed is not None and installed.startswith(self.versions):
            return True
        if self.name not in _announced:
            _announced.add(self.name)
            log.warning(
                "not applying the %s workaround: it was written for %s %s, this is %s (%s); %s",
                self.name,
                self.package,
                " or ".join(v + "x" if v.endswith(".") else v for v in self.versions),
                installed or "not installed",
                self.upstream,
                self.without,
            )
        return False


_announced: set[str] = set()


def guarded(name: str, package: str, versions: tuple[str, ...], upstream: str, without: str, otherwise: Any = None):
    """Make a generator a context manager that applies its patch only on the versions it was made for.

    Elsewhere the context manager yields ``otherwise`` and changes nothing, after saying so once.
    """
    patch = Patch(name, package, versions, upstream, without)

    def decorate(generator: Callable[..., Iterator]) -> Callable[..., contextlib.AbstractContextManager]:
        @contextlib.contextmanager
        @functools.wraps(generator)
        def applied_on_known_versions(*args, **kwargs):
            if not patch.applies():
                yield otherwise
                return
            yield from generator(*args, **kwargs)

        applied_on_known_versions.patch = patch
        return applied_on_known_versions

    return decorate


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# -- settings and hooks that upstream keeps private ----------------------------------------


EDGE_SETTINGS = Patch(
    "edge compile settings",
    "executorch",
    ("1.5.",),
    "EdgeCompileConfig's private fields _check_ir_validity and _skip_dim_order",
    "the stock EdgeCompileConfig is used: explicit dim order makes a different .pte (a tiny Llama's 8da4w: 128 bytes"
    " larger, same logits), and the edge IR check refuses non-core ATen ops left outside the delegate",
)


def edge_compile_config():
    """ExecuTorch's ``EdgeCompileConfig`` as every export was made and measured: the edge IR check off and dim order
    left implicit (the XNNPACK delegate takes contiguous tensors); the stock config on other versions."""
    from executorch.exir import EdgeCompileConfig

    if not EDGE_SETTINGS.applies():
        return EdgeCompileConfig()
    return EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True)


WEIGHT_ONLY_LINEARS = Patch(
    "weight-only linear partitioning",
    "executorch",
    ("1.5.",),
    "XNNPACK's internal LinearConfig.get_deps (executorch/backends/xnnpack/partition/config/gemm_configs.py)",
    "weight-only variants (4w, 8w) are lowered through a decomposition XNNPACK gets wrong and fail verification",
)


def xnnpack_partitioner_configs() -> list:
    """XNNPACK's partitioner configs, its linear config extended to claim float-activation, integer-weight linears.

    The stock config treats a dequantized weight as static quantization and then wants
    the activation dequantized too, so it rejects :mod:`hub_export.pipeline.weight_only`'s
    pattern and the graph falls back to a decomposition XNNPACK gets wrong. Claimed
    whole (dequantize + int weight + scales), it is serialized as an fp32-input,
    per-channel int8/int4 fully-connected node.
    """
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    if not WEIGHT_ONLY_LINEARS.applies():
        return list(ALL_PARTITIONER_CONFIGS)
    # Internal modules: imported only on the versions they were read on, where they are known to be there.
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, tag_as_implicit_q_dq
    from executorch.backends.xnnpack.utils.utils import get_input_node, is_param_node

    class WeightOnlyLinearConfig(LinearConfig):
        def get_deps(self, node, ep):
            weight = get_input_node(node, 1)
            if is_dequant(get_input_node(node, 0)) or not is_dequant(weight):
                return super().get_deps(node, ep)
            if len(node.all_input_nodes) > 2 or not all(is_param_node(ep, arg) for arg in weight.all_input_nodes):
                return False, []
            tag_as_implicit_q_dq(weight)
            return True, [weight, *weight.all_input_nodes]

    return [WeightOnlyLinearConfig if config is LinearConfig else config for config in ALL_PARTITIONER_CONFIGS]


RAY_ATTEMPTS = Patch(
    "Ray task attempt number",
    "ray",
    ("2.60.",),
    "ray._private.worker.global_worker.core_worker.get_current_task_attempt_number (ray.get_runtime_context() "
    "gives the task's id, not its attempt; ray.util.state.get_task asks the dashboard, which may not run)",
    "a variant build retried after its worker died is not counted as a retry in the progress and the batch summary",
)


PROGRAM_READER = Patch(
    "reading a .pte's program",
    "executorch",
    ("1.5.",),
    "executorch.exir._serialize._program._flatbuffer_to_program (the runtime's Python binding loads methods but "
    "does not list a program's delegates, operators or segments)",
    "hub-export inspect shows methods, inputs and metadata but not partitions, operators outside XNNPACK or sizes by part",
)


def read_program(path: Path, size: int):
    """The ``executorch.exir.schema.Program`` of the ``.pte`` at ``path`` from its first ``size`` bytes, its
    flatbuffer (:func:`hub_export.runtime.pte.program_size`; the weights' segments after it are left on disk: the
    program of a 1 GB file is about 140 KB, where deserializing the whole file held four times the file), or None
    where this ExecuTorch is not the one the reader was written for. Raises what the deserializer raises on
    malformed bytes."""
    if not PROGRAM_READER.applies():
        return None
    from executorch.exir._serialize._program import _flatbuffer_to_program

    with open(path, "rb") as file:
        return _flatbuffer_to_program(file.read(size))


XNNPACK_THREADS = Patch(
    "XNNPACK thread count",
    "executorch",
    ("1.5.",),
    "executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool and _threadpool_get_thread_count (the "
    "Python binding has no public way to size the threadpool XNNPACK's kernels run on)",
    "hub-export bench --threads is ignored: the file runs on as many threads as the machine has performance cores",
)


# Set once this process has loaded a program: XNNPACK keeps the threadpool it found then, so resizing the pool
# afterwards frees it under XNNPACK (a crash or a deadlock in the next run, not an error).
_POOL_TAKEN = False


def pool_taken() -> None:
    """Record that a program is loaded in this process: the threadpool's size is fixed from now on."""
    global _POOL_TAKEN
    _POOL_TAKEN = True


def set_threads(threads: int | None) -> int | None:
    """Size the threadpool the ``.pte`` files of this process run on (None: leave it); returns the size in use, or
    None where this ExecuTorch cannot say.

    Raises:
        InputError: a different size is asked for after a file has run in this process.
    """
    if not XNNPACK_THREADS.applies():
        return None
    from executorch.extension.pybindings import portable_lib

    in_use = int(portable_lib._threadpool_get_thread_count())
    if threads is None or int(threads) == in_use:
        return in_use
    if _POOL_TAKEN:
        from hub_export.errors import InputError  # local: this file imports no sibling at load time

        raise InputError(
            f"this process already runs its files on {in_use} threads and ExecuTorch cannot resize its threadpool "
            f"once a file has run: pass threads={in_use}, or run in a new process "
            f"(`hub-export generate --threads {int(threads)}` starts one)",
            param="threads",
        )
    portable_lib._unsafe_reset_threadpool(int(threads))
    return int(portable_lib._threadpool_get_thread_count())


XNNPACK_ISA = Patch(
    "XNNPACK kernel choice",
    "executorch",
    ("1.5.",),
    "cpuinfo's cpuinfo_isa flags inside ExecuTorch's libexecutorch_threadpool.so, which XNNPACK reads once to pick its"
    " kernels (no public setting exists)",
    "hub-export bench --isa is refused: the file runs on the kernels for this CPU",
)

# Byte offsets in cpuinfo's ``struct cpuinfo_x86_isa`` on x86-64 (cpuinfo.h, as vendored by ExecuTorch 1.5): one
# bool per feature. The ones named in ``_ISA_CHECKS`` are compared with the kernel's /proc/cpuinfo flags before
# anything is written, so a different layout is refused instead of corrupting the struct.
_ISA_CHECKS = {"avx": 22, "fma": 24, "f16c": 27, "avx2": 28, "avx512f": 29, "avx512_vnni": 41}
# What an AVX2 CPU without AVX-512 or AVX-VNNI (AMD Zen 2/3, Intel before Ice Lake) lacks: avxvnni (23), the AVX-512
# family, AVX10, AMX and the VEX-encoded VNNI/convert extensions (29-55).
_ISA_OFF = {"avx2": (23, *range(29, 56))}


def restrict_xnnpack_isa(isa: str) -> None:
    """Make XNNPACK pick the kernels it would on an older x86 CPU (``"avx2"``: no AVX-512, no VNNI) in this process.

    For measuring what a file does on such a CPU from a newer one: the same kernels, on this machine's cores and
    caches (so not that machine's clock or memory). Call it before ExecuTorch's runtime loads: XNNPACK reads the
    flags once, when its library initialises.

    Raises:
        InputError: ``isa`` is not one this knows, this machine lacks it, or ExecuTorch's runtime already loaded.
        RuntimeError: this ExecuTorch's cpuinfo is not laid out as expected (nothing is written).
    """
    import ctypes
    import os
    import sys
    from importlib.util import find_spec

    from hub_export.errors import InputError  # local: this file imports no sibling at load time

    if isa not in _ISA_OFF:  # process_env.XNNPACK_ISAS names the same
        raise InputError(f"unknown --isa {isa!r}; choose one of: {', '.join(_ISA_OFF)}")
    if not XNNPACK_ISA.applies():
        raise InputError(f"--isa needs ExecuTorch {XNNPACK_ISA.versions[0]}x; this one cannot be told its CPU")
    if any(name.startswith("executorch.extension.pybindings._") for name in sys.modules):
        raise InputError("--isa must be set before ExecuTorch's runtime loads; use a fresh process")
    flags = set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        flags = next((set(line.split(":", 1)[1].split()) for line in cpuinfo if line.startswith("flags")), set())
    if isa not in flags:
        raise InputError(f"this CPU has no {isa}: XNNPACK cannot run {isa} kernels here")
    spec = find_spec("executorch")
    root = next(iter(spec.submodule_search_locations)) if spec and spec.submodule_search_locations else None
    if root is None:
        raise InputError("ExecuTorch is not installed")
    library = ctypes.CDLL(os.path.join(root, "lib", "libexecutorch_threadpool.so"), mode=ctypes.RTLD_GLOBAL)
    if not library.cpuinfo_initialize():
        raise RuntimeError("cpuinfo could not read this CPU")
    features = (ctypes.c_uint8 * 64).in_dll(library, "cpuinfo_isa")
    wrong = [name for name, offset in _ISA_CHECKS.items() if bool(features[offset]) != (name in flags)]
    if wrong:
        raise RuntimeError(f"cpuinfo's flags are not where expected ({', '.join(wrong)}); nothing changed")
    for offset in _ISA_OFF[isa]:
        features[offset] = 0


def ray_task_attempt() -> int | None:
    """Which run of the current Ray task this is (0 the first), or None where this Ray does not say."""
    if not RAY_ATTEMPTS.applies():
        return None
    import ray

    try:
        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except (AttributeError, TypeError, ValueError):
        return None


# -- glibc: hand freed memory back to the OS ---------------------------------------------


def release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS (keeps peak RSS down); glibc only."""
    import gc

    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Hand the heap's free pages back to the OS; glibc only. A loop that frees what it allocates in pieces small
    enough for the heap keeps them resident otherwise: the runtime's thousands of steps in verification grew the
    export's process by 0.9 GB at Llama 3.2 1B's widths."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_MMAP_THRESHOLD: list[int] = []  # the threshold map_large_allocations set, if it did


@contextlib.contextmanager
def heap_allocations(threshold: int = 64 << 20):
    """Let glibc serve allocations up to ``threshold`` bytes from its heap for the block, then map them again.

    GPTQ's column loop allocates a few-MB temporary per column; each one mapped and
    unmapped (what :func:`map_large_allocations` asks for) made rounding 1.9x slower.
    The heap is trimmed after, so the block's peak is all it keeps. A no-op unless
    :func:`map_large_allocations` ran."""
    if not _MMAP_THRESHOLD:
        yield
        return
    _mallopt_threshold(threshold)
    try:
        yield
    finally:
        _mallopt_threshold(_MMAP_THRESHOLD[-1])
        release_memory()


def _mallopt_threshold(threshold: int) -> bool:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # -3 = M_MMAP_THRESHOLD
        return True
    except (OSError, AttributeError):
        return False


def map_large_allocations(threshold: int = 1 << 20) -> None:
    """Have glibc give every allocation above ``threshold`` bytes its own memory map.

    By default glibc raises its mmap threshold to the size of each block freed (up to
    32 MiB), after which tensor temporaries come from the heap, where freed memory stays
    resident. A fixed threshold returns them to the OS as soon as they are freed, which
    makes the quantization peak lower and steadier from run to run. A no-op where the C
    library is not glibc.
    """
    if _mallopt_threshold(threshold):
        _MMAP_THRESHOLD.append(threshold)


# -- transformers: XNNPACK-friendly norms (export only) ------------------------------------


LLAMA_STYLE_RMSNORMS = frozenset(
    [
        *(
            f"{prefix}RMSNorm"
            for prefix in ("Llama", "Qwen2", "Qwen3", "Mistral", "Phi3", "SmolLM3", "Olmo2", "Granite", "Starcoder2")
        ),
        "T5LayerNorm",  # T5's norm is an RMSNorm by another name (no mean, no bias)
    ]
)


def _rmsnorm_4d(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # XNNPACK only delegates mean over the two innermost dims of a 4D tensor; a norm it
    # cannot take splits every layer into several delegates with runtime hops between.
    input_dtype = hidden_states.dtype
    shape = hidden_states.shape
    x = hidden_states.to(torch.float32).reshape(1, -1, 1, shape[-1])
    variance = x.pow(2).mean(dim=(-2, -1), keepdim=True)
    x = x * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * x.reshape(shape).to(input_dtype)


@guarded(
    "rmsnorm-4d",
    "transformers",
    ("5.",),
    upstream="the forward of Llama-style RMSNorm modules (variance_epsilon)",
    without="norms stay outside XNNPACK and split every layer's delegate (slower decode)",
    otherwise=0,
)
def delegable_norms(model: torch.nn.Module):
    """Temporarily route Llama-style RMSNorms through an XNNPACK-friendly formulation.

    Same arithmetic, different shapes; scoped to the export so the eager model used as
    the verification reference keeps its own code.
    """
    patched = []
    for module in model.modules():
        if type(module).__name__ in LLAMA_STYLE_RMSNORMS and hasattr(module, "variance_epsilon"):
            module.forward = _rmsnorm_4d.__get__(module)
            patched.append(module)
    try:
        yield len(patched)
    finally:
        for module in patched:
            del module.forward


# -- torch and ExecuTorch: lowering speed and memory ---------------------------------------


# -- executorch: decompose once -----------------------------------------------------------


# -- executorch: skip idle ATen-to-Edge passes ----------------------------------------------
