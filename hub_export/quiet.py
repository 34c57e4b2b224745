"""Silence the frameworks' chatter, for the CLI and for the worker processes it starts.

Export and lowering emit hundreds of framework warnings that say nothing to a user.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


def quiet_libraries() -> None:
    """Ignore Python warnings and raise the frameworks' loggers to ERROR (before they are imported)."""
    warnings.filterwarnings("ignore")
    for name in ("torch", "torchao", "executorch", "transformers", "httpx", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def quiet_torch() -> None:
    """Quieten torch's and transformers' own log handlers, which torch installs at import."""
    import torch._logging
    import transformers.utils.logging as transformers_logging

    torch._logging.set_logs(all=logging.ERROR)
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


_STDERR_LOCK = threading.Lock()


@contextmanager
def native_stderr_to_log(logger: logging.Logger) -> Iterator[None]:
    """What C libraries write to file descriptor 2 inside the block (libmpg123's and libsndfile's warnings)
    goes to ``logger`` at DEBUG level instead of the user's terminal or the server's log.

    Python's own ``sys.stderr`` is flushed first and is redirected too while the block runs,
    so keep the block to the library call itself.
    """
    with _STDERR_LOCK, tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(captured.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            chatter = captured.read(4096).decode(errors="replace").strip()
            if chatter:
                logger.debug("%s", chatter)
