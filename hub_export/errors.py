"""Errors a user can act on, carried as data.

Every failure the user should see is a :class:`HubExportError`: a ``reason`` (what went
wrong), a ``hint`` (what to do), and the data a front end needs to word them its own
way: ``param`` (the option at fault), ``repo_id``, a ``code`` naming the kind of
advice, and the process ``exit_code``. Options are named in the text with
:func:`opt`, so that the CLI says ``--max-seq-len`` where the Space says
'Max sequence length', without rewriting strings. ``str(error)`` is the CLI's one line.

Example:
    >>> error = InputError(f"{opt('max_seq_len')} must be at least 2 (got 1)", param="max_seq_len")
    >>> str(error)
    '--max-seq-len must be at least 2 (got 1)'
    >>> error.worded(lambda name: {"max_seq_len": "'Max sequence length'"}.get(name, name))
    "'Max sequence length' must be at least 2 (got 1)"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_MARK = "\ue000"  # a private-use character: never whitespace, never in a real message
_PLACEHOLDER = re.compile(f"{_MARK}([a-z0-9_]+){_MARK}")
# How the command line spells each option, filled by the modules that declare options
# (hub_export.options): this module imports nothing from the package, so any module can raise.
_SPELLINGS: dict[str, str] = {}

Namer = Callable[[str], str]


def opt(name: str) -> str:
    """A placeholder for option ``name`` (a parameter name, e.g. ``max_seq_len``) in an error's text."""
    return f"{_MARK}{name}{_MARK}"


def declare_spellings(spellings: Mapping[str, str]) -> None:
    """Record how the command line spells options (``{"qmodes": "--qmode"}``), for :func:`cli_name`."""
    _SPELLINGS.update(spellings)


def cli_name(name: str) -> str:
    """How the command line spells option ``name``: its declared flag, else ``--name-with-dashes``."""
    return _SPELLINGS.get(name) or "--" + name.replace("_", "-")


def _one_line(text: str | None) -> str | None:
    return " ".join(str(text).split()) if text else None


class HubExportError(Exception):
    """Base class: an actionable failure, with a process exit code.

    ``reason``: what went wrong; ``hint``: what to do (CLI words); ``param``: the option
    at fault; ``repo_id``: the repo concerned; ``code``: the kind of advice, for a front
    end that gives its own (see :meth:`worded`).
    """

    exit_code: int = 1

    def __init__(
        self,
        reason: str,
        *,
        hint: str | None = None,
        param: str | None = None,
        repo_id: str | None = None,
        code: str | None = None,
    ):
        self.reason = _one_line(reason) or ""
        self.hint = _one_line(hint)
        self.param = param
        self.repo_id = repo_id
        self.code = code
        super().__init__(self.worded())

    def worded(self, name: Namer = cli_name, hints: Mapping[str, str] | None = None) -> str:
        """The one line for a front end: its ``name`` for each option, its hint for this ``code`` if it has one."""
        hint = (hints or {}).get(self.code or "", self.hint)
        text = self.reason + (f"; {hint}" if hint else "")
        return _PLACEHOLDER.sub(lambda match: name(match[1]), text)

    def __reduce__(self):
        # Worker processes send errors back pickled; keep the data, not just the text.
        fields = dict(hint=self.hint, param=self.param, repo_id=self.repo_id, code=self.code)
        return _rebuild, (type(self), self.reason, fields)


def _rebuild(cls: type[HubExportError], reason: str, fields: dict) -> HubExportError:
    return cls(reason, **fields)


class InputError(HubExportError, ValueError):
    """Bad arguments or an unsupported source (exit code 2, like a usage error)."""

    exit_code = 2


class SourceError(HubExportError, OSError):
    """The source model cannot be fetched or read."""

    exit_code = 3


class ExportError(HubExportError, RuntimeError):
    """Building a variant failed for a reason outside the user's input."""

    exit_code = 1


class VerificationError(HubExportError, RuntimeError):
    """An exported program does not match the eager model."""

    exit_code = 4


class HubError(HubExportError, OSError):
    """A Hub request failed (permissions, unreachable endpoint, missing repo)."""

    exit_code = 5


class InternalError(HubExportError, RuntimeError):
    """A bug in hub-export itself, not in the user's input or file; ``log_file`` holds its traceback."""

    exit_code = 70  # EX_SOFTWARE: distinct from every failure of the user's input

    def __init__(self, reason: str, *, log_file: str | None = None, **fields):
        self.log_file = log_file
        super().__init__(reason, **fields)

    def __reduce__(self):
        rebuild, (cls, reason, fields) = super().__reduce__()
        return rebuild, (cls, reason, {**fields, "log_file": self.log_file})


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message ("" when it has none): a traceback's summary, never its body."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
