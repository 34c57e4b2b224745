"""Thin helpers over the ExecuTorch Python runtime and C++ LLM runner."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from .errors import VerificationError


def _load_kernels() -> None:
    # Registers quantized_decomposed::embedding_{byte,4bit} kernels with the runtime
    # (quantized embeddings) and the llama custom ops (custom_sdpa, update_cache).
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
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

    Example:
        >>> model = PteModel("model-8da4w.pte")
        >>> logits = model.forward(torch.tensor([[1, 2, 3]]), start_pos=0)
    """

    def __init__(self, path: str | Path, data_path: str | Path | None = None):
        _load_kernels()
        from executorch.runtime import Runtime

        self.path = Path(path)
        if data_path is None:
            data_path = data_file_of(self.path)
        try:
            with quiet_native_output():
                self.program = Runtime.get().load_program(
                    str(self.path), data_path=str(data_path) if data_path else None
                )
                self.method = self.program.load_method("forward")
        except (RuntimeError, ValueError) as error:
            raise VerificationError(f"{self.path.name} cannot be loaded by the ExecuTorch runtime ({error})") from None
        self.metadata = self._read_metadata()

    def _read_metadata(self) -> dict:
        values = {}
        for name in self.program.method_names:
            if name == "forward":
                continue
            with quiet_native_output():
                result = self.program.load_method(name).execute([])
            values[name] = [int(v) if not isinstance(v, bool) else v for v in result] if name.endswith("_ids") else result[0]
        return values

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Logits of the last position, ``[vocab]``."""
        positions = torch.arange(start_pos, start_pos + input_ids.shape[1], dtype=torch.long)
        with quiet_native_output():
            output = self.method.execute([input_ids, positions])[0]
        return output.reshape(-1, output.shape[-1])[-1]


def data_file_of(pte: Path) -> Path | None:
    """The ``.ptd`` data file exported next to ``pte`` (``--share-embeddings``), if any."""
    candidate = Path(pte).with_suffix(".ptd")
    return candidate if candidate.is_file() else None


def runner_generate(pte: Path, tokenizer_json: Path, prompt: str, max_new_tokens: int) -> dict:
    """Generate greedily with ExecuTorch's C++ ``TextLLMRunner``; returns its stats.

    Token text is not collected here: the runner hands tokens to Python as ``str`` and
    raises on a token that ends inside a UTF-8 character (see :mod:`hub_export.generate`).
    """
    stats: list[dict] = []
    with quiet_native_output():
        _load_kernels()
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

        data = data_file_of(pte)
        runner = TextLLMRunner(str(pte), str(tokenizer_json), str(data) if data else None)
        runner.generate(
            prompt,
            GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, echo=False),
            stats_callback=lambda s: stats.append(json.loads(s.to_json_string())),
        )
    return stats[-1] if stats else {}
