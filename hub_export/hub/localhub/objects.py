"""Content-addressed blobs, trees and the git-like ids the Hub client checks.

A tree is a flat map ``path -> Entry``. Blobs live on disk once, named by their
sha256, whatever repository or commit refers to them.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def git_blob_oid(data: bytes) -> str:
    """Git's blob id (``git hash-object``): what the client compares for regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The LFS pointer file git would store in place of a large file."""
    return _LFS_POINTER.format(oid=sha256, size=size).encode()


@dataclass(frozen=True)
class Entry:
    """One file of a tree.

    ``oid`` is the git blob id of what git stores at that path: the content for a
    regular file, the LFS pointer text for an LFS file.
    """

    sha256: str
    size: int
    lfs: bool
    oid: str

    @classmethod
    def regular(cls, data: bytes) -> Entry:
        return cls(hashlib.sha256(data).hexdigest(), len(data), False, git_blob_oid(data))

    @classmethod
    def large(cls, sha256: str, size: int) -> Entry:
        return cls(sha256, size, True, git_blob_oid(lfs_pointer(sha256, size)))

    @property
    def etag(self) -> str:
        """The id the client caches a download under: git sha1, or sha256 for LFS."""
        return self.sha256 if self.lfs else self.oid

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))


Tree = dict[str, Entry]


def tree_to_json(tree: Tree) -> str:
    """Canonical serialization: sorted, compact, so equal trees hash equally."""
    rows = {path: [e.sha256, e.size, e.lfs, e.oid] for path, e in sorted(tree.items())}
    return json.dumps(rows, separators=(",", ":"))


def tree_from_json(text: str) -> Tree:
    return {path: Entry(sha, size, bool(lfs), oid) for path, (sha, size, lfs, oid) in json.loads(text).items()}


def tree_blobs(text: str) -> set[str]:
    """The sha256 of every blob a serialized tree refers to (cheaper than :func:`tree_from_json`)."""
    return {row[0] for row in json.loads(text).values()}


def tree_id(tree: Tree) -> str:
    return hashlib.sha1(tree_to_json(tree).encode()).hexdigest()


def folder_oid(tree: Tree, folder: str) -> str:
    """A stable 40-hex id for a folder, derived from the entries below it."""
    prefix = folder.rstrip("/") + "/"
    below = {p: e for p, e in tree.items() if p.startswith(prefix)}
    return tree_id(below)


def folders(tree: Tree) -> set[str]:
    """Every folder implied by the file paths of ``tree``."""
    found: set[str] = set()
    for path in tree:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found.add("/".join(parts[:i]))
    return found


def commit_oid(*, tree: str, parent: str | None, author: str, date: str, summary: str, description: str) -> str:
    """40-hex commit id over everything that makes the commit what it is."""
    header = f"tree {tree}\n" + (f"parent {parent}\n" if parent else "") + f"author {author} {date}\n"
    return hashlib.sha1(f"{header}\n{summary}\n\n{description}".encode()).hexdigest()


class UploadMismatch(Exception):
    """Uploaded bytes do not hash or size to what was announced."""


def private_dir(path: Path) -> None:
    """Create ``path`` (or tighten an existing one) readable by this user only: repos may be private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _make_private_dirs(*paths: Path) -> None:
    for path in paths:
        try:
            path.mkdir(mode=0o700)  # not parents=True: parents would get the default mode
        except FileExistsError:
            pass


@dataclass(frozen=True)
class SweepResult:
    count: int
    bytes: int


class BlobStore:
    """Blobs on disk under ``root/blobs/ab/cd/<sha256>``, written atomically, private to this user.

    A blob's mtime is refreshed whenever a request leans on it before committing it
    (an upload that finds it already stored, an LFS batch answering "skip"), so
    :meth:`sweep` can spare what may be in flight by age alone.
    """

    def __init__(self, root: Path):
        self.dir = root / "blobs"
        self.tmp = root / "tmp"
        private_dir(self.dir)
        private_dir(self.tmp)

    def path(self, sha256: str) -> Path:
        return self.dir / sha256[:2] / sha256[2:4] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data`` and return its sha256 (a no-op when already stored)."""
        writer = self.writer()
        writer.write(data)
        return writer.finish()

    def writer(self, *, max_size: int | None = None) -> BlobWriter:
        return BlobWriter(self, max_size)

    def touch(self, sha256: str) -> None:
        """Mark a stored blob as in use now, so a sweep leaves it alone for its grace period."""
        try:
            os.utime(self.path(sha256))
        except FileNotFoundError:
            pass

    def sweep_temp(self, cutoff: float) -> SweepResult:
        """Remove upload temp files last written before ``cutoff`` (a live upload keeps writing)."""
        return _remove_older(self.tmp.iterdir(), cutoff)

    def sweep(self, live: set[str], cutoff: float) -> tuple[SweepResult, list[str]]:
        """Remove blobs not in ``live`` and untouched since ``cutoff``; tighten old permissions on the way."""
        dead: list[Path] = []
        for path in self.dir.glob("*/*/*"):
            if path.name not in live:
                dead.append(path)
            elif path.stat().st_mode & 0o077:
                path.chmod(0o600)  # blobs written before files were made private
        for folder in [*self.dir.glob("*"), *self.dir.glob("*/*")]:
            if folder.is_dir() and folder.stat().st_mode & 0o077:
                folder.chmod(0o700)
        result = _remove_older(dead, cutoff)
        return result, [p.name for p in dead if not p.exists()]


def _remove_older(paths: Iterable[Path], cutoff: float) -> SweepResult:
    count = size = 0
    for path in paths:
        try:
            info = path.stat()
            if info.st_mtime < cutoff and path.is_file():
                path.unlink()
                count, size = count + 1, size + info.st_size
        except FileNotFoundError:
            pass  # removed meanwhile (a finished upload renamed its temp file)
    return SweepResult(count, size)


class BlobWriter:
    """Streams bytes to a temp file while hashing them; ``finish`` renames into place."""

    def __init__(self, store: BlobStore, max_size: int | None):
        self._store = store
        self._max_size = max_size
        self._hash = hashlib.sha256()
        self.size = 0
        self._tmp = store.tmp / f"upload-{secrets.token_hex(8)}"
        self._file = os.fdopen(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._max_size is not None and self.size > self._max_size:
            self.abort()
            raise UploadMismatch(f"upload is larger than the announced {self._max_size} bytes")
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self, sha256: str | None = None, size: int | None = None) -> str:
        """Check the announced ``sha256``/``size`` (when given), then publish the blob."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        actual = self._hash.hexdigest()
        if (sha256 is not None and actual != sha256) or (size is not None and self.size != size):
            self._tmp.unlink(missing_ok=True)
            raise UploadMismatch(
                f"upload does not match its announced oid/size: got sha256 {actual} and {self.size} bytes,"
                f" expected {sha256} and {size} bytes"
            )
        final = self._store.path(actual)
        try:
            os.utime(final)  # already stored: refresh its age, so gc spares it until it is committed
            self._tmp.unlink(missing_ok=True)
            return actual
        except FileNotFoundError:
            pass
        _make_private_dirs(final.parent.parent, final.parent)
        try:
            os.replace(self._tmp, final)
        except FileNotFoundError as e:
            raise UploadMismatch("the upload's temp file was removed (idle too long?): upload it again") from e
        return actual

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
