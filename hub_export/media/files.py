"""Open only regular files: a FIFO, socket, device or directory passed as a file is refused before it is read.

Opening a FIFO for reading blocks until a writer comes, so the file is opened non-blocking
and checked with ``fstat`` on the open descriptor (no window between check and open).

Example:
    >>> with open_regular("meeting.flac", "audio") as file:
    ...     header = file.read(4)
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from hub_export.errors import InputError

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """``path`` opened for binary reading, when it is a regular file (symlinks followed).

    ``what`` names the expected content in the error ("audio", "image").

    Raises:
        InputError: the path is missing, unreadable, or not a regular file.
    """
    path = Path(path)
    try:
        # stat first: opening a socket fails and a device may act on open; the fstat below closes the race.
        _check_kind(path, os.stat(path).st_mode, what)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"no file at {path}; give the path of an {what} file") from None
    except PermissionError:
        raise InputError(f"cannot read {path.name}: permission denied") from None
    except OSError as error:
        raise InputError(f"cannot open {path} ({error.strerror or type(error).__name__})") from None
    try:
        _check_kind(path, os.fstat(fd).st_mode, what)
    except InputError:
        os.close(fd)
        raise
    # Reads of a regular file never block; clear the flag so libraries see an ordinary file.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "rb")


def _check_kind(path: Path, mode: int, what: str) -> None:
    kind = stat.S_IFMT(mode)
    if kind != stat.S_IFREG:
        raise InputError(f"{path} is {_KINDS.get(kind, 'not a regular file')}, not a file; give an {what} file")
