"""Errors a user can act on.

Every failure the user should see is a :class:`HubExportError` whose message is one
line that says what went wrong and what to do. The CLI prints that line and exits
with the error's ``exit_code``; anything else is a bug and is reported as one.
"""

from __future__ import annotations


class HubExportError(Exception):
    """Base class: a one-line, actionable message and a process exit code."""

    exit_code: int = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class InputError(HubExportError):
    """Bad arguments or an unsupported source (exit code 2, like a usage error)."""

    exit_code = 2


class SourceError(HubExportError):
    """The source model cannot be fetched or read."""

    exit_code = 3


class ExportError(HubExportError):
    """Building a variant failed for a reason outside the user's input."""

    exit_code = 1


class VerificationError(HubExportError):
    """An exported program does not match the eager model."""

    exit_code = 4


class HubError(HubExportError):
    """A Hub request failed (permissions, unreachable endpoint, missing repo)."""

    exit_code = 5
