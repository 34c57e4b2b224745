"""Tracebacks of hub-export's own bugs, kept in a file the user is told about.

A failure of the user's input or file is a :class:`~hub_export.errors.HubExportError`
with one actionable line. Anything else is a bug in hub-export: the user still gets one
line, but it says so and names the file that holds the traceback (tokens redacted),
so it can be reported without rerunning.

Example:
    >>> try:
    ...     {}["missing"]
    ... except KeyError as error:
    ...     path = save_traceback(error, "an example")
    >>> "KeyError" in path.read_text()
    True
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from hub_export.errors import InternalError, first_line
from hub_export.pipeline.gguf_source import cache_root
from hub_export.redact import Redactor


def log_dir() -> Path:
    """Where tracebacks go: ``$HUB_EXPORT_LOG_DIR``, else ``logs`` under hub-export's cache."""
    if os.environ.get("HUB_EXPORT_LOG_DIR"):
        return Path(os.environ["HUB_EXPORT_LOG_DIR"])
    return cache_root().parent / "logs"  # beside the GGUF conversions, in hub-export's cache


def save_traceback(error: BaseException, doing: str, redact: Callable[[str], str] = Redactor()) -> Path:
    """Write ``error``'s traceback (redacted) to a new file in :func:`log_dir`; returns its path."""
    folder = log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"bug-{stamp}-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}.log"
    text = f"hub-export failed while {doing}:\n" + "".join(traceback.format_exception(error))
    path.write_text(redact(text))
    return path


def shown_path(path: Path) -> str:
    """``path`` as the user is told it: under the home folder as ``~/...``."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def as_bug(error: BaseException, doing: str, redact: Callable[[str], str] = Redactor()) -> InternalError:
    """An :class:`InternalError` for ``error``, a bug met while ``doing``; its traceback is saved first."""
    path = save_traceback(error, doing, redact)
    reason = f"hub-export failed while {doing} ({type(error).__name__}: {redact(first_line(error))[:200]})"
    return InternalError(
        reason, hint=f"this is a bug in hub-export; please report it with {shown_path(path)}", log_file=str(path)
    )
