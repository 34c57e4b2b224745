"""Thin helpers over the ExecuTorch Python runtime and C++ LLM runner."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from hub_export.errors import InputError, VerificationError, first_line
from hub_export.patches import pool_taken
from hub_export.runtime.process_env import pte_process_env

# The method of a text file that returns the logits of chosen chunk positions (speculative decoding).
ROWS_METHOD = "forward_rows"

# What every ExecuTorch program starts with (executorch/exir/_serialize/_program.py and
# schema/program.fbs): a flatbuffer root offset (u32), the file identifier "ET" + two
# digits ("ET12" in executorch 1.5), then the extended header "eh00": its length (u32),
# program size, segment base offset and segment data size (u64 each, little-endian).
PTE_IDENTIFIER = re.compile(rb"ET[0-9]{2}")
PTD_IDENTIFIER = re.compile(rb"FT[0-9]{2}")  # a .ptd data file (extension/flat_tensor)
EXTENDED_HEADER_MAGIC = b"eh00"
EXTENDED_HEADER_MIN_LENGTH = 24
MIN_PTE_BYTES = 8 + 32  # root offset, identifier, a full extended header
PROBE_TIMEOUT_S = 120.0
REDO = "the file is damaged or not an ExecuTorch program: export it again, or pull it again and check its sha256"


def _load_kernels() -> None:
    # Registers quantized_decomposed::embedding_{byte,4bit} kernels with the runtime
    # (quantized embeddings) and the llama custom ops (custom_sdpa, update_cache).
    import executorch.extension.llm.custom_ops.custom_ops
    import executorch.kernels.quantized  # noqa: F401


@contextlib.contextmanager
def quiet_native_output():
    """Silence what native code writes to fds 1 and 2 (ExecuTorch logs, runner echo).

    Python-level ``sys.stdout`` is left alone, so callers can still print.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


class PteModel:
    """A loaded ``.pte``: its ``forward`` method and its constant methods.

    The file is checked before the native runtime loads it in this process (see
    :func:`check_loadable`): a malformed file raises VerificationError instead of
    aborting the process.

    Example:
        >>> model = PteModel("model-8da4w.pte")
        >>> logits = model.forward(torch.tensor([[1, 2, 3]]), start_pos=0)
    """

    def __init__(self, path: str | Path, data_path: str | Path | None = None, load: tuple[str, ...] | None = None):
        _load_kernels()
        self.path = Path(path)
        if data_path is None:
            data_path = data_file_of(self.path)
        check_loadable(self.path, data_path)
        self.program, self.methods, self.metadata = _open_program(self.path, data_path, load)

    @property
    def method(self):
        """The file's main method: ``forward``, or the first of several (a speech file's ``encoder``...)."""
        return self.methods["forward" if "forward" in self.methods else next(iter(self.methods))]

    def run(self, inputs: list[torch.Tensor], method: str | None = None) -> torch.Tensor:
        """The first output of ``method`` (default: :attr:`method`) on ``inputs``.

        Raises:
            VerificationError: the file has no such method, fails to run these inputs or returns no tensor.
        """
        if method is not None and method not in self.methods:
            raise VerificationError(f"{self.path.name} has no method {method!r} (it has {', '.join(self.methods)})")
        try:
            with quiet_native_output():
                outputs = (self.methods[method] if method else self.method).execute(inputs)
        except (RuntimeError, ValueError) as error:  # the binding's word for a failed method
            raise VerificationError(
                f"{self.path.name} failed in the ExecuTorch runtime ({first_line(error)})"
            ) from None
        if not outputs or not isinstance(outputs[0], torch.Tensor):
            raise VerificationError(f"{self.path.name} returned no tensor")
        return outputs[0]

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Logits of the last position, ``[vocab]``.

        Raises:
            VerificationError: the file fails to run these inputs or returns something that is not logits.
        """
        positions = torch.arange(start_pos, start_pos + input_ids.shape[1], dtype=torch.long)
        output = self.run([input_ids, positions])
        vocab = self.metadata.get("get_vocab_size")
        if output.dim() < 1 or (vocab and output.shape[-1] != int(vocab)):
            raise VerificationError(
                f"{self.path.name} returned {tuple(output.shape)}, not logits over its {vocab} tokens"
            )
        return output.reshape(-1, output.shape[-1])[-1]

    def forward_rows(self, input_ids: torch.Tensor, start_pos: int, rows: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(rows), vocab]`` of the chunk positions ``rows`` (a file exported with ``--speculative``).

        Example:
            >>> model.forward_rows(torch.tensor([[1, 2, 3]]), start_pos=0, rows=torch.arange(3)).shape
            torch.Size([3, 49152])
        """
        if ROWS_METHOD not in self.methods:
            raise InputError(
                f"{self.path.name} cannot score several tokens per call (it has no {ROWS_METHOD} method); "
                "export it again with --speculative"
            )
        positions = torch.arange(start_pos, start_pos + input_ids.shape[1], dtype=torch.long)
        output = self.run([input_ids, positions, rows], ROWS_METHOD)
        return output.reshape(-1, output.shape[-1])


class LoadedMethods(Mapping):
    """A file's computing methods by name, each loaded by the runtime the first time it is asked for.

    Loading a method packs its weights for XNNPACK; two methods over the same weights (``forward`` and
    ``forward_rows``) would hold two packed copies, so a method nobody runs is never loaded.
    """

    def __init__(self, path: Path, program, names: list[str]):
        self._path, self._program, self._names, self._loaded = path, program, names, {}

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(name)
        return self.load(name)

    def load(self, name: str):
        """The method ``name``, loaded now if it was not yet (VerificationError if the runtime refuses it)."""
        if name not in self._loaded:
            try:
                with quiet_native_output():
                    self._loaded[name] = self._program.load_method(name)
            except (RuntimeError, ValueError) as error:
                raise VerificationError(
                    f"{self._path.name} cannot load its {name} method in the ExecuTorch runtime ({error})"
                ) from None
        return self._loaded[name]

    def __contains__(self, name) -> bool:
        return name in self._names  # without loading it

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _open_program(path: Path, data_path: str | Path | None, load: tuple[str, ...] | None = None):
    """(program, its methods by name, metadata) of a ``.pte``; load errors become VerificationError.

    A method without inputs is a constant (the metadata: ``get_max_seq_len``...); the
    others are what the file computes: ``forward``, or a speech file's ``encoder``...
    Those named in ``load`` (default: all but ``forward_rows``) are loaded now, the others when first run.
    """
    from executorch.runtime import Runtime

    pool_taken()
    try:
        with quiet_native_output():
            program = Runtime.get().load_program(str(path), data_path=str(data_path) if data_path else None)
            names = sorted(program.method_names)
            computing = [name for name in names if program.metadata(name).num_inputs() > 0]
            if not computing:
                raise VerificationError(f"{path.name} has no method that takes an input; {REDO}")
            methods = LoadedMethods(path, program, computing)
            for name in [name for name in computing if name != ROWS_METHOD] if load is None else load:
                methods.load(name)
        return program, methods, _read_metadata(program, [name for name in names if name not in methods])
    except (RuntimeError, ValueError) as error:
        raise VerificationError(f"{path.name} cannot be loaded by the ExecuTorch runtime ({error})") from None


def _read_metadata(program, names: list[str]) -> dict:
    values = {}
    for name in names:
        with quiet_native_output():
            result = program.load_method(name).execute([])
        values[name] = (
            [int(v) if not isinstance(v, bool) else v for v in result] if name.endswith("_ids") else result[0]
        )
    return values


# -- before the native runtime sees a file ---------------------------------------------
#
# The ExecuTorch runtime trusts its input more than a downloaded file deserves: on some
# malformed files it aborts the whole process (SIGABRT, exit 134, no message). One cause
# seen: it logs bytes of the file (a foreign identifier, an operator name), the Python
# binding cannot decode them as UTF-8 and terminates. So a file is checked twice: its
# header here in Python (cheap), then a load in a forked child, where a crash is a message.


_checked: set[tuple] = set()  # files (by identity and mtime) that passed: the runner reuses PteModel's check


def check_loadable(pte: str | Path, data_path: str | Path | None = None) -> None:
    """Raise VerificationError (one line) unless ``pte`` (and its ``.ptd``) load without crashing."""
    check_pte_header(pte)
    if data_path:
        check_ptd_header(data_path)
    key = tuple(_identity(Path(p)) for p in (pte, data_path) if p)
    if key in _checked:
        return
    probe_load(Path(pte), data_path)
    _checked.add(key)


def _identity(path: Path) -> tuple:
    stat = path.stat()
    return (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def check_pte_header(path: str | Path) -> None:
    """The flatbuffer identifier and extended header of a ``.pte``, checked in Python."""
    _checked_head(Path(path))


def _checked_head(path: Path) -> bytes:
    """The first bytes of ``path`` once :func:`check_pte_header`'s checks pass."""
    head, size = _head(path)
    if size < MIN_PTE_BYTES:
        raise VerificationError(f"{path.name} is only {size} bytes, too short for an ExecuTorch program; {REDO}")
    if not PTE_IDENTIFIER.fullmatch(head[4:8]):
        raise VerificationError(f"{path.name} lacks the ExecuTorch file identifier (ET + 2 digits); {REDO}")
    if head[8:12] != EXTENDED_HEADER_MAGIC:
        raise VerificationError(f"{path.name} lacks the ExecuTorch extended header (eh00); {REDO}")
    problem = _extended_header_problem(head, size)
    if problem:
        raise VerificationError(f"{path.name} has a broken ExecuTorch header ({problem}); {REDO}")
    return head


def program_size(path: str | Path) -> int:
    """The bytes of ``path``'s program: its flatbuffer, which the weights' segments follow.

    Example:
        >>> program_size("model.pte") < Path("model.pte").stat().st_size
        True

    Raises:
        VerificationError: the header is not an ExecuTorch program's (one line).
    """
    return int.from_bytes(_checked_head(Path(path))[16:24], "little")


def _extended_header_problem(head: bytes, size: int) -> str | None:
    """What is wrong with the extended header's figures, or None: every offset within the file."""
    root = int.from_bytes(head[0:4], "little")
    length = int.from_bytes(head[12:16], "little")
    program_size = int.from_bytes(head[16:24], "little")
    segment_base = int.from_bytes(head[24:32], "little")
    segment_size = int.from_bytes(head[32:40], "little") if length > EXTENDED_HEADER_MIN_LENGTH else 0
    if length < EXTENDED_HEADER_MIN_LENGTH:
        return f"header length {length}"
    if not 8 + length <= program_size <= size:
        return f"program size {program_size} of a {size}-byte file"
    if not 8 + length <= root < program_size:
        return f"root offset {root}"
    if segment_base and not program_size <= segment_base <= size:
        return f"segment offset {segment_base} of a {size}-byte file"
    if segment_size and (not segment_base or segment_base + segment_size > size):
        return f"{segment_size} bytes of segments past the end of the file"
    return None


def check_ptd_header(path: str | Path) -> None:
    """The flatbuffer identifier of a ``.ptd`` data file (``FT`` + 2 digits)."""
    path = Path(path)
    head, size = _head(path)
    if size < MIN_PTE_BYTES or not PTD_IDENTIFIER.fullmatch(head[4:8]):
        raise VerificationError(f"{path.name} is not an ExecuTorch data file (.ptd); {REDO}")


def _head(path: Path) -> tuple[bytes, int]:
    if not path.is_file():
        raise InputError(f"{path.name} not found; pass an existing .pte file or export folder")
    with open(path, "rb") as handle:
        return handle.read(64), os.fstat(handle.fileno()).st_size


def probe_load(pte: Path, data_path: str | Path | None) -> None:
    """Load ``pte`` in a forked child first, so that a native crash is an error here.

    The child loads the program, its ``forward`` and its constant methods as
    :class:`PteModel` does and exits; a crash (a signal) or a load error becomes
    VerificationError. Where ``fork`` is missing this is skipped. A child that does not
    finish in PROBE_TIMEOUT_S (e.g. a lock held by another thread at fork time) is killed
    and the load goes ahead here as before: the probe only ever adds safety.
    """
    if not hasattr(os, "fork"):
        return
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "fork() in a multi-threaded process": the child only loads and exits
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    if pid == 0:
        _probe_child(pte, data_path, read_end, write_end)
    os.close(write_end)
    status = _wait(pid, PROBE_TIMEOUT_S)
    with os.fdopen(read_end, "rb") as reader:
        message = reader.read().decode("utf-8", "replace").strip()
    if status is None:
        return
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise VerificationError(f"{pte.name} crashes the ExecuTorch runtime ({name}) when loaded; {REDO}")
    if os.WEXITSTATUS(status) != 0:
        raise VerificationError(message or f"{pte.name} cannot be loaded by the ExecuTorch runtime; {REDO}")


def _probe_child(pte: Path, data_path, read_end: int, write_end: int) -> None:
    """In the forked child: load quietly, report an error on the pipe, never return."""
    code = 0
    try:
        os.close(read_end)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        _open_program(pte, data_path)
    except BaseException as error:
        message = (
            str(error)
            if isinstance(error, VerificationError)
            else (f"{pte.name} cannot be loaded by the ExecuTorch runtime ({type(error).__name__}: {error})")
        )
        os.write(write_end, " ".join(message.split())[:1000].encode("utf-8", "replace"))
        code = 3
    finally:
        os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's wait status, or None after killing it at ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def data_file_of(pte: Path) -> Path | None:
    """The ``.ptd`` data file exported next to ``pte``, if any: ``X.ptd`` beside ``X.pte`` (``--share-embeddings``),
    else the base's weights an adapter's ``lora-NAME-Q.pte`` runs over, ``base-Q.ptd`` (``--lora-files``): the
    longest ``Q`` (a qmode, maybe with its embedding part) that has such a file."""
    pte = Path(pte)
    candidates = [pte.with_suffix(".ptd")]
    if pte.stem.startswith("lora-"):
        words = pte.stem.split("-")
        candidates += [pte.with_name("base-" + "-".join(words[start:]) + ".ptd") for start in range(2, len(words))]
    return next((candidate for candidate in candidates if candidate.is_file()), None)


RUNNER_PROBE = Path(__file__).with_name("runner_probe.py")
RUNNER_TIMEOUT_S = 900.0


def runner_generate(pte: Path, tokenizer_json: Path, prompt: str, max_new_tokens: int) -> dict:
    """Generate greedily with ExecuTorch's C++ ``TextLLMRunner``; returns its stats.

    The runner works in a fresh process (``hub_export/runtime/runner_probe.py``, with
    :data:`hub_export.runtime.process_env.PTE_PROCESS_ENV`), so its prefill and decode rates are
    the file's own, whatever this process has imported or set. Token text is not
    collected here: the runner hands tokens to Python as ``str`` and raises on a token
    that ends inside a UTF-8 character (see :mod:`hub_export.generate`).

    Raises:
        VerificationError: ``pte`` (or its ``.ptd``) is not a loadable ExecuTorch file, or the
            runner failed on it; the message is the runner's last line of output.
    """
    pte = Path(pte)
    data = data_file_of(pte)
    _load_kernels()  # the load check runs this process's kernel registry
    check_loadable(pte, data)
    with tempfile.TemporaryDirectory(prefix="hub-export-runner-") as scratch:
        out = Path(scratch) / "stats.json"
        command = [sys.executable, str(RUNNER_PROBE), str(pte), str(tokenizer_json), str(int(max_new_tokens)), str(out)]
        try:
            # stdout: the runner prints the tokens it generates, bytes that need not be UTF-8
            done = subprocess.run(
                [*command, *([str(data)] if data else [])],
                input=prompt.encode(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=pte_process_env(),
                timeout=RUNNER_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise VerificationError(f"the runner did not finish within {RUNNER_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
            raise VerificationError(lines[-1].strip() if lines else f"the runner exited with status {done.returncode}")
        return json.loads(out.read_text())


# -- memory ------------------------------------------------------------------------------

MEMORY_PROBE_TIMEOUT_S = 900.0
MEMORY_PROBE = Path(__file__).with_name("memory_probe.py")


class MemoryProbe:
    """A fresh process that measures a ``.pte``'s memory at full context (``hub_export/runtime/memory_probe.py``).

    Started before the file exists, it imports torch and the ExecuTorch runtime (about
    3 s) on a core that lowering leaves idle, then waits for :meth:`measure`. It
    measures once. Use it as a context manager, so that an export that fails stops it.

    Example:
        >>> with MemoryProbe() as probe:
        ...     ...  # build model.pte
        ...     probe.measure("model.pte")["peak_rss_bytes"] > 0
        True
    """

    def __init__(self) -> None:
        self.process = None
        if Path("/proc/self/clear_refs").exists():
            self.process = subprocess.Popen(
                [sys.executable, str(MEMORY_PROBE), "-"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=pte_process_env(),
            )

    def measure(self, pte: str | Path, extra_tokens: int = 0) -> dict | None:
        """The peak RSS growth while running ``pte`` to full context (plus ``extra_tokens``), or None."""
        if self.process is None:
            return None
        data = data_file_of(Path(pte))
        request = "\t".join([str(pte), str(int(extra_tokens)), str(data or "")]) + "\n"
        try:
            out, _ = self.process.communicate(request, timeout=MEMORY_PROBE_TIMEOUT_S)
            return json.loads(out.strip().splitlines()[-1]) if self.process.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> MemoryProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure_memory(pte: str | Path, extra_tokens: int = 0) -> dict | None:
    """What running ``pte`` to full context costs in resident memory, measured in a fresh process.

    The probe (``hub_export/runtime/memory_probe.py``) resets its peak RSS after importing the
    runtime, loads the program, prefills ``get_max_seq_len - 1`` tokens and decodes up to
    the last position (plus ``extra_tokens`` past it, for a file that generates past its
    cache), and reports the peak's growth: the weights the runtime holds, its planned
    activations and the whole KV cache. None where it cannot be measured (not Linux, the
    probe failed); the export goes on without the figure.
    """
    with MemoryProbe() as probe:
        return probe.measure(pte, extra_tokens)
