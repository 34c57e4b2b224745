"""The manifest: the one record of an export that card, push, pull and the Space read.

``manifest.json`` lives next to the ``.pte`` files. It holds no token and no absolute
local path: it is published as is.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
VERSIONED_PACKAGES = ("torch", "executorch", "torchao", "transformers", "hub-export")


@dataclass
class Variant:
    """One exported ``.pte`` file."""

    file: str
    qmode: str
    qembedding: str | None
    group_size: int | None
    max_seq_len: int
    size_bytes: int
    sha256: str
    metadata: dict[str, Any]
    verification: dict[str, Any]
    export_seconds: float
    per_channel_fallback: list[str] = field(default_factory=list)
    # With --share-embeddings the weights live in a companion ``.ptd`` data file.
    data_file: str | None = None
    data_size_bytes: int | None = None
    data_sha256: str | None = None

    @property
    def total_bytes(self) -> int:
        """What a user downloads for this variant: the ``.pte`` and its data file."""
        return self.size_bytes + (self.data_size_bytes or 0)

    def files(self) -> list[tuple[str, str]]:
        """``(file name, sha256)`` of every file of this variant."""
        pairs = [(self.file, self.sha256)]
        if self.data_file:
            pairs.append((self.data_file, self.data_sha256 or ""))
        return pairs


@dataclass
class Manifest:
    """Everything known about one export folder."""

    source: dict[str, Any]
    versions: dict[str, str]
    variants: list[Variant]
    command: str = ""
    machine: str = ""
    schema_version: int = SCHEMA_VERSION

    def variant(self, qmode: str) -> Variant:
        for variant in self.variants:
            if variant.qmode == qmode or variant.file == qmode:
                return variant
        known = ", ".join(v.qmode for v in self.variants) or "none"
        from .errors import InputError

        raise InputError(f"no variant {qmode!r} here; available: {known}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data = {"schema_version": data.pop("schema_version"), **data}
        return data

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        from .errors import InputError

        if data.get("schema_version") != SCHEMA_VERSION:
            raise InputError(
                f"manifest schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}; "
                "upgrade hub-export or re-export"
            )
        variants = [Variant(**v) for v in data.get("variants", [])]
        return cls(
            source=data["source"],
            versions=data["versions"],
            variants=variants,
            command=data.get("command", ""),
            machine=data.get("machine", ""),
        )

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        from .errors import InputError

        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            raise InputError(f"{Path(folder).name}/ has no {MANIFEST_NAME}; export into it with `hub-export export`")
        return cls.from_dict(json.loads(path.read_text()))

    def merge(self, other: "Manifest") -> "Manifest":
        """This manifest with ``other``'s variants added or replacing same-file ones."""
        by_file = {v.file: v for v in self.variants}
        by_file.update({v.file: v for v in other.variants})
        return Manifest(other.source, other.versions, list(by_file.values()), other.command, other.machine)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def machine_description() -> str:
    """A short, path-free description of this machine for the card's speed figures."""
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"
