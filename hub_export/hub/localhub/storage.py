"""The local Hub's storage rules: its SQLite schema, which files go to LFS, how tokens are made and stored, how a revision is looked up among refs."""

from __future__ import annotations

import fnmatch
import hashlib
import secrets
import string

LFS_SIZE_THRESHOLD = 10 * 1024 * 1024


LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gguf *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy"
    " *.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pte *.pth *.rar *.safetensors *.tar *.tar.* *.tflite"
    " *.tgz *.wasm *.xz *.zip *.zst *tfevents*"
).split()


GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()


TOKEN_ALPHABET = string.ascii_letters


SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (name TEXT PRIMARY KEY, kind TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (org TEXT NOT NULL, user TEXT NOT NULL, role TEXT NOT NULL, PRIMARY KEY (org, user));
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, user TEXT NOT NULL, role TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS repos (
    id INTEGER PRIMARY KEY, type TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    private INTEGER NOT NULL, created_at TEXT NOT NULL, UNIQUE (type, namespace, name));
CREATE TABLE IF NOT EXISTS trees (id TEXT PRIMARY KEY, entries TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    repo INTEGER NOT NULL, oid TEXT NOT NULL, parent TEXT, tree TEXT NOT NULL, author TEXT NOT NULL,
    date TEXT NOT NULL, title TEXT NOT NULL, message TEXT NOT NULL, PRIMARY KEY (repo, oid));
CREATE TABLE IF NOT EXISTS refs (
    repo INTEGER NOT NULL, name TEXT NOT NULL, target TEXT NOT NULL, PRIMARY KEY (repo, name));
CREATE TABLE IF NOT EXISTS objects (sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS repo_objects (repo INTEGER NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY (repo, sha256));
CREATE TABLE IF NOT EXISTS gates (repo INTEGER PRIMARY KEY, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gate_access (repo INTEGER NOT NULL, user TEXT NOT NULL, PRIMARY KEY (repo, user));
"""


def lfs_by_default(path: str, size: int, sample: bytes) -> bool:
    """Whether the Hub would store this file through LFS: large, binary, or an LFS extension."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE_THRESHOLD or b"\0" in sample or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "hf_" + "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(34))


def ref_candidates(rev: str) -> list[str]:
    return [rev] if rev.startswith("refs/") else [f"refs/heads/{rev}", f"refs/tags/{rev}"]
