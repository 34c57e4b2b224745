"""Silence the frameworks' chatter, for the CLI and for the worker processes it starts.

Export and lowering emit hundreds of framework warnings that say nothing to a user.
"""

from __future__ import annotations

import logging
import os
import warnings


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
