"""What the local Hub stores, as values: callers, repos, commits and their operations, names and paths checked, and the errors its API answers with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from hub_export.errors import InputError
from hub_export.hub.localhub.objects import (
    Entry,
    SweepResult,
)

REPO_TYPES = ("model", "dataset", "space")


URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}


DEFAULT_BRANCH = "main"


_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


# Control characters break logs and headers; lone surrogates cannot be stored as UTF-8.
_BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


# Path segments the Hub serves under a namespace, so no account may take them.
_RESERVED = {"api", "datasets", "spaces", "models", "buckets", "docs", "settings", "new", "organizations", "lfs"}


@dataclass(frozen=True)
class Caller:
    """The account behind a token, its token's role, and its org roles."""

    name: str
    can_write: bool
    orgs: dict[str, str]


@dataclass(frozen=True)
class Repo:
    id: int
    type: str
    namespace: str
    name: str
    private: bool
    created_at: str

    @property
    def repo_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def url_path(self) -> str:
        """Path of the repo page relative to the endpoint, e.g. ``datasets/acme/data``."""
        return URL_PREFIXES[self.type] + self.repo_id


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    tree: str
    author: str
    date: str
    title: str
    message: str


@dataclass(frozen=True)
class AddFile:
    """Add content already stored in the blob store as a regular (non-LFS) file."""

    path: str
    entry: Entry


@dataclass(frozen=True)
class AddLfs:
    """Point a path at an LFS object uploaded to this repository beforehand."""

    path: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class Delete:
    path: str
    folder: bool = False


@dataclass(frozen=True)
class CommitResult:
    oid: str
    pr_num: int | None
    created: bool


@dataclass(frozen=True)
class GcResult:
    temp: SweepResult
    blobs: SweepResult

    def __str__(self) -> str:
        freed = (self.temp.bytes + self.blobs.bytes) / 1024**2
        return (
            f"Removed {self.temp.count} temp file(s) and {self.blobs.count} unreferenced blob(s),"
            f" {freed:.1f} MiB freed."
        )


class HubAPIError(Exception):
    """A failure answered the way the Hub answers it: status, ``X-Error-Code`` and ``{"error": msg}``."""

    def __init__(self, status: int, message: str, code: str | None = None, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def repo_not_found() -> HubAPIError:
    return HubAPIError(404, "Repository not found", "RepoNotFound")


def revision_not_found(rev: str) -> HubAPIError:
    return HubAPIError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


def entry_not_found(message: str, commit: str | None = None) -> HubAPIError:
    headers = {"X-Repo-Commit": commit} if commit else None
    return HubAPIError(404, message, "EntryNotFound", headers=headers)


def now_iso() -> str:
    """UTC time the way the Hub writes it: ``2024-01-02T03:04:05.678Z``."""
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def validate_name(name: str, what: str = "repo name") -> str:
    """Enforce the Hub's naming rules; raise :class:`InputError` (answered as 400) otherwise."""
    problem = None
    if not name or not _NAME_RE.fullmatch(name):
        problem = "use only letters, digits, '.', '_' and '-'"
    elif name[0] in ".-" or name[-1] in ".-":
        problem = "it cannot start or end with '.' or '-'"
    elif "--" in name or ".." in name:
        problem = "it cannot contain '--' or '..'"
    elif len(name) > 96:
        problem = "it is longer than 96 characters"
    elif name.endswith(".git") or name.lower() in _RESERVED:
        problem = "this name is reserved"
    if problem:
        raise InputError(f"Invalid {what} '{name}': {problem}.")
    return name


def validate_path(path: str) -> str:
    """A path inside a repository: relative, no empty, '.', '..' or '.git' segments."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..", ".git") for p in parts) or "\\" in path or _BAD_PATH_CHARS.search(path):
        raise InputError(f"Invalid path in repository: '{path}'.")
    return path
