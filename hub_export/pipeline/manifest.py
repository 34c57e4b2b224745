"""The manifest: the one record of an export that card, push, pull and the Space read.

``manifest.json`` lives next to the ``.pte`` files. It holds no token and no absolute
local path: it is published as is.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
from dataclasses import MISSING, dataclass, field, fields
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from hub_export.errors import InputError
from hub_export.options import KV_DTYPES, SLIDING_CACHES, ExportOptions
from hub_export.pipeline.quantize import INT4_SCALES, QEMBEDDINGS, QMODES
from hub_export.pipeline.records import Verification, count_or_none, is_int

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
# A variant's files are joined to the user's folder on pull: plain names only, never a path.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,190}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# An adapter or base named in a manifest (shown on cards): a Hub id, a folder name or a path, nothing markup.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9./_~][A-Za-z0-9._/~+-]{0,199}")
MAX_FILE_BYTES = 10**12  # 1 TB: far above any .pte, far below what breaks arithmetic
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
    verification: Verification
    export_seconds: float
    per_channel_fallback: list[str] = field(default_factory=list)
    # With --share-embeddings the weights live in a companion ``.ptd`` data file.
    data_file: str | None = None
    data_size_bytes: int | None = None
    data_sha256: str | None = None
    # How it was quantized beyond its qmode: {"int4_scales": "hqq", "mixed": the calibrated plan}.
    recipe: dict[str, Any] | None = None
    # The KV cache's layout and bytes (hub_export.tasks.text_generation.kv_cache.CacheLayout.to_dict, plus "sliding").
    kv_cache: dict[str, Any] | None = None
    # Measured while verifying: hub_export.runtime.pte.measure_memory's figures at full context.
    runtime_memory: dict[str, Any] | None = None
    # Where each method's work runs (hub_export.runtime.inspection.delegation_record): XNNPACK partitions and the operator
    # calls left outside them, so a slow file is diagnosable from its manifest alone.
    delegation: dict[str, Any] | None = None
    # What the exporter asked for beyond the qmode (ExportOptions.variant_settings): a default
    # context stays "default" here, so the same request can be recognised again.
    asked: dict[str, Any] | None = None
    # A --speculative file: rows forward_rows returns at most, and prompt lookup's decode speed-up over plain
    # decoding measured at export on shipped prompts (hub_export.tasks.text_generation.bench.bench_drafted).
    speculative: dict[str, Any] | None = None
    # A --lora-files program: the adapter it carries ({"id", "sha256", "base"}), over the base's data_file.
    adapter: dict[str, Any] | None = None

    def built_as(self, qmode: str, options: ExportOptions) -> bool:
        """Whether this variant is what ``options`` would build as ``qmode`` now, verified.

        Every option that decides a variant's bytes or figures is in :attr:`asked`; a
        variant from before it was recorded has none, and any doubt means rebuild.

        Example:
            >>> asked = ExportOptions(max_seq_len=256)
            >>> built = Variant("model-8da4w.pte", "8da4w", None, 32, 256, 1, "0" * 64, {},
            ...                 Verification(passed=True), 1.0, asked=asked.variant_settings())
            >>> built.built_as("8da4w", asked), built.built_as("8da4w", ExportOptions())
            (True, False)
        """
        return (
            self.qmode == qmode
            and self.verification.verified
            and self.asked is not None
            and self.asked == options.variant_settings()
        )

    @property
    def total_bytes(self) -> int:
        """What a user downloads for this variant: the ``.pte`` and its data file."""
        return self.size_bytes + (self.data_size_bytes or 0)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "verification": self.verification.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        """A variant from its (already schema-checked) JSON form."""
        return cls(**{**data, "verification": Verification.from_dict(data["verification"])})

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

        raise InputError(f"no variant {qmode!r} here; available: {known}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "source": self.source,
            "versions": self.versions,
            "variants": [variant.to_dict() for variant in self.variants],
            "command": self.command,
            "machine": self.machine,
        }

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> Manifest:
        """A manifest from its JSON form, validated first: repos are written by anyone.

        Raises :class:`~hub_export.errors.InputError` (one line) for anything that does not
        fit the schema, e.g. a variant file name that is a path; ``where`` names the file.
        """
        check_manifest(data, where)
        variants = [Variant.from_dict(v) for v in data["variants"]]
        return cls(
            source=data["source"],
            versions=data["versions"],
            variants=variants,
            command=data.get("command", ""),
            machine=data.get("machine", ""),
        )

    @classmethod
    def parse(cls, text: str | bytes, where: str = MANIFEST_NAME) -> Manifest:
        """A manifest from the text of a ``manifest.json``; ``where`` names it in errors."""

        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise InputError(f"{where} is not valid JSON; re-export or re-publish it with hub-export") from None
        return cls.from_dict(data, where)

    @classmethod
    def read(cls, folder: Path) -> Manifest:

        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            raise InputError(f"{Path(folder).name}/ has no {MANIFEST_NAME}; export into it with `hub-export export`")
        return cls.parse(path.read_bytes(), f"{Path(folder).name}/{MANIFEST_NAME}")

    def merge(self, other: Manifest) -> Manifest:
        """This manifest with ``other``'s variants added or replacing same-file ones."""
        by_file = {v.file: v for v in self.variants}
        by_file.update({v.file: v for v in other.variants})
        return Manifest(other.source, other.versions, list(by_file.values()), other.command, other.machine)


# -- schema ---------------------------------------------------------------------------
#
# One check for every manifest read from a folder or a repo. A repo's manifest is input
# from whoever can write to it: its file names are joined to the user's folder on pull,
# its sizes and hashes decide what is kept, so nothing in it is trusted unchecked.

_REPAIR = "re-export the folder or re-publish the repo with hub-export"


def _bad(where: str, what: str, problem: str) -> Exception:

    return InputError(f"invalid {where}: {what} {problem}; {_REPAIR}")


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), "null" if value is None else type(value).__name__)


def _check_name(where: str, what: str, value: Any, suffix: str) -> None:
    """A plain file name in the folder: no path, no parent, no hidden file."""
    if not isinstance(value, str) or not FILE_NAME.fullmatch(value) or ".." in value or not value.endswith(suffix):
        shown = repr(value)[:80]
        raise _bad(where, what, f"is {shown}, not a plain file name ending in {suffix} (letters, digits, '._+-')")


def _check_size(where: str, what: str, value: Any) -> None:
    if not is_int(value) or not 0 <= value < MAX_FILE_BYTES:
        raise _bad(where, what, f"is {repr(value)[:40]}, not a byte count between 0 and 1 TB")


def _check_sha256(where: str, what: str, value: Any) -> None:
    if not isinstance(value, str) or not SHA256.fullmatch(value):
        raise _bad(where, what, f"is {repr(value)[:80]}, not a sha256 (64 lowercase hex digits)")


def _check_type(where: str, what: str, value: Any, kind: type, described: str) -> None:
    if not isinstance(value, kind):
        raise _bad(where, what, f"is {_json_kind(value)}, not {described}")


def check_variant(where: str, index: int, data: Any) -> None:
    """One entry of ``variants``: known keys only, each well-formed."""

    what = f"variants[{index}]"
    _check_type(where, what, data, dict, "an object")
    known = {f.name: f for f in fields(Variant)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise _bad(where, what, f"has unknown key {unknown[0][:40]!r} (known: {', '.join(known)})")
    missing = [n for n, f in known.items() if n not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise _bad(where, what, f"lacks {missing[0]!r}")
    _check_name(where, f"{what}.file", data["file"], ".pte")
    if data["qmode"] not in QMODES:
        raise _bad(where, f"{what}.qmode", f"is {repr(data['qmode'])[:40]}, not one of {', '.join(QMODES)}")
    if data["qembedding"] is not None and data["qembedding"] not in QEMBEDDINGS:
        raise _bad(
            where,
            f"{what}.qembedding",
            f"is {repr(data['qembedding'])[:40]}, not null or one of {', '.join(QEMBEDDINGS)}",
        )
    for name in ("group_size", "max_seq_len"):
        value = data[name]
        if not (value is None and name == "group_size") and not (is_int(value) and 0 < value < 2**31):
            raise _bad(where, f"{what}.{name}", f"is {repr(value)[:40]}, not a positive integer")
    _check_size(where, f"{what}.size_bytes", data["size_bytes"])
    _check_sha256(where, f"{what}.sha256", data["sha256"])
    _check_type(where, f"{what}.metadata", data["metadata"], dict, "an object")
    _check_type(where, f"{what}.verification", data["verification"], dict, "an object")
    seconds = data["export_seconds"]
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
        raise _bad(where, f"{what}.export_seconds", f"is {repr(seconds)[:40]}, not a non-negative number")
    fallback = data.get("per_channel_fallback", [])
    if not isinstance(fallback, list) or not all(isinstance(name, str) for name in fallback):
        raise _bad(where, f"{what}.per_channel_fallback", "is not a list of layer names")
    _check_data_file(where, what, data)
    _check_recipe(where, f"{what}.recipe", data.get("recipe"))
    _check_memory(where, what, data)
    _check_asked(where, f"{what}.asked", data.get("asked"))
    _check_delegation(where, f"{what}.delegation", data.get("delegation"))
    _check_speculative(where, f"{what}.speculative", data.get("speculative"))
    _check_variant_adapter(where, f"{what}.adapter", data.get("adapter"))


def _check_variant_adapter(where: str, what: str, record: Any) -> None:
    """``id`` (a repo id or folder name), ``sha256`` and ``base`` (the same, or null) only."""
    if record is None:
        return
    _check_type(where, what, record, dict, "an object")
    if set(record) != {"id", "sha256", "base"}:
        raise _bad(where, what, "does not hold exactly id, sha256 and base")
    for name in ("id", "base"):
        value = record[name]
        if not (value is None and name == "base") and not (isinstance(value, str) and ADAPTER_NAME.fullmatch(value)):
            raise _bad(where, f"{what}.{name}", f"is {repr(value)[:40]}, not a repo id or folder name")
    _check_sha256(where, f"{what}.sha256", record["sha256"])


_SPECULATIVE_FIGURES = ("grounded_speedup", "chat_speedup", "grounded_acceptance", "chat_acceptance")


def _check_speculative(where: str, what: str, record: Any) -> None:
    """``max_rows``, ``new_tokens`` and ``prompts`` (counts) and the figures (finite numbers in 0-100) only."""
    if record is None:
        return
    _check_type(where, what, record, dict, "an object")
    unknown = sorted(set(record) - {"max_rows", "new_tokens", "prompts", *_SPECULATIVE_FIGURES})
    if unknown:
        raise _bad(where, what, f"has unknown key {unknown[0][:40]!r}")
    for name in ("max_rows", "new_tokens", "prompts"):
        if name in record and not (is_int(record[name]) and 0 < record[name] < 2**16):
            raise _bad(where, f"{what}.{name}", f"is {repr(record[name])[:40]}, not a count")
    for name in _SPECULATIVE_FIGURES:
        value = record.get(name)
        if value is not None and not (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and 0 <= value <= 100
        ):
            raise _bad(where, f"{what}.{name}", f"is {repr(value)[:40]}, not a figure")


def _check_delegation(where: str, what: str, record: Any) -> None:
    """Methods (at most 16) to ``{"partitions": count, "outside": {operator: count}}`` (at most 32 operators)."""
    if record is None:
        return
    _check_type(where, what, record, dict, "an object")
    if len(record) > 16:
        raise _bad(where, what, "lists more than 16 methods")
    for method, entry in record.items():
        name = f"{what}.{str(method)[:40]}"
        _check_type(where, name, entry, dict, "an object")
        outside = entry.get("outside", {})
        if set(entry) - {"partitions", "outside"} or count_or_none(entry.get("partitions")) is None:
            raise _bad(where, name, "is not {partitions, outside}")
        if not isinstance(outside, dict) or len(outside) > 32:
            raise _bad(where, f"{name}.outside", "is not a short object of operator counts")
        if not all(isinstance(op, str) and len(op) <= 80 and count_or_none(n) is not None for op, n in outside.items()):
            raise _bad(where, f"{name}.outside", "is not a short object of operator counts")


def _check_asked(where: str, what: str, asked: Any) -> None:
    """The options a variant was built with: names to JSON scalars or short lists of them, nothing nested."""
    if asked is None:
        return
    _check_type(where, what, asked, dict, "an object")
    scalar = (str, int, float, bool, type(None))
    for name, value in list(asked.items())[:65]:
        values = value if isinstance(value, list) else [value]
        if len(name) > 64 or len(asked) > 64 or len(values) > 64 or not all(isinstance(v, scalar) for v in values):
            raise _bad(where, f"{what}.{name[:40]}", "is not an option name with a plain value")


_KV_CACHE_COUNTS = ("layers", "ring_layers", "sliding_layers", "bytes_at_full_context", "bytes_per_token")
_RUNTIME_MEMORY_COUNTS = ("peak_rss_bytes", "context_tokens")


def _check_counts(where: str, what: str, record: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if name in record and not (is_int(record[name]) and 0 <= record[name] <= MAX_FILE_BYTES):
            raise _bad(where, f"{what}.{name}", f"is {repr(record[name])[:40]}, not a count")


def _check_memory(where: str, what: str, data: dict) -> None:
    """The KV cache layout and the measured memory: known keys, counts and short labels only (the card shows them)."""

    cache, memory = data.get("kv_cache"), data.get("runtime_memory")
    if cache is not None:
        _check_type(where, f"{what}.kv_cache", cache, dict, "an object")
        unknown = sorted(set(cache) - {*_KV_CACHE_COUNTS, "dtype", "sliding", "ring_slots", "attention_sink"})
        if unknown:
            raise _bad(where, f"{what}.kv_cache", f"has unknown key {unknown[0][:40]!r}")
        _check_counts(where, f"{what}.kv_cache", cache, _KV_CACHE_COUNTS)
        if cache.get("dtype", "fp32") not in KV_DTYPES or cache.get("sliding", "ring") not in SLIDING_CACHES:
            raise _bad(where, f"{what}.kv_cache", "has an unknown dtype or sliding layout")
        for name in ("ring_slots", "attention_sink"):
            value = cache.get(name)
            if value is not None and not (
                isinstance(value, list) and len(value) <= 8 and all(is_int(v) and 0 <= v < 2**31 for v in value)
            ):
                raise _bad(where, f"{what}.kv_cache.{name}", "is not a short list of counts")
    if memory is not None:
        _check_type(where, f"{what}.runtime_memory", memory, dict, "an object")
        unknown = sorted(set(memory) - {*_RUNTIME_MEMORY_COUNTS, "seconds"})
        if unknown:
            raise _bad(where, f"{what}.runtime_memory", f"has unknown key {unknown[0][:40]!r}")
        _check_counts(where, f"{what}.runtime_memory", memory, _RUNTIME_MEMORY_COUNTS)
        seconds = memory.get("seconds", 0)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
            raise _bad(where, f"{what}.runtime_memory.seconds", "is not a number")


_LAYER_NAME = re.compile(r"[A-Za-z0-9_.]{1,200}")


def _check_recipe(where: str, what: str, recipe: Any) -> None:
    """Layer names and short labels only: the card shows them."""

    if recipe is None:
        return
    _check_type(where, what, recipe, dict, "an object")
    known = {"int4_scales", "mixed", "gptq"}
    if set(recipe) - known:
        raise _bad(where, what, f"has unknown key {sorted(set(recipe) - known)[0][:40]!r}")
    if "int4_scales" in recipe and recipe["int4_scales"] not in INT4_SCALES:
        raise _bad(
            where, f"{what}.int4_scales", f"is {repr(recipe['int4_scales'])[:40]}, not one of {', '.join(INT4_SCALES)}"
        )
    gptq = recipe.get("gptq")
    if gptq is not None:
        _check_type(where, f"{what}.gptq", gptq, dict, "an object")
        _check_label(where, f"{what}.gptq.text", gptq.get("text", ""))
        for key in ("tokens", "layers", "seconds"):
            value = gptq.get(key, 0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e9:
                raise _bad(where, f"{what}.gptq.{key}", "is not a count")
    mixed = recipe.get("mixed")
    if mixed is None:
        return
    _check_type(where, f"{what}.mixed", mixed, dict, "an object")
    layers = mixed.get("eight_bit", [])
    if (
        not isinstance(layers, list)
        or len(layers) > 100_000
        or not all(isinstance(name, str) and _LAYER_NAME.fullmatch(name) for name in layers)
    ):
        raise _bad(where, f"{what}.mixed.eight_bit", "is not a list of layer names (letters, digits, '._')")
    for key in ("budget", "text"):
        _check_label(where, f"{what}.mixed.{key}", mixed.get(key, ""))


def _check_label(where: str, what: str, value: Any) -> None:
    """A short printable label without the characters Markdown or HTML would act on."""
    if not isinstance(value, str) or len(value) > 200 or not value.isprintable() or any(c in value for c in "<>[]`|"):
        raise _bad(where, what, "is not a short plain label")


def _check_data_file(where: str, what: str, data: dict[str, Any]) -> None:
    """The ``.ptd`` companion: all three fields, or none."""
    parts = [data.get(name) for name in ("data_file", "data_size_bytes", "data_sha256")]
    if all(part is None for part in parts):
        return
    if any(part is None for part in parts):
        raise _bad(where, what, "has some but not all of data_file, data_size_bytes, data_sha256")
    _check_name(where, f"{what}.data_file", data["data_file"], ".ptd")
    _check_size(where, f"{what}.data_size_bytes", data["data_size_bytes"])
    _check_sha256(where, f"{what}.data_sha256", data["data_sha256"])


def check_manifest(data: Any, where: str = MANIFEST_NAME) -> None:
    """Raise :class:`~hub_export.errors.InputError` unless ``data`` fits the manifest schema."""

    if not isinstance(data, dict):
        raise InputError(f"{where} holds {_json_kind(data)}, not a JSON object; {_REPAIR}")
    version = data.get("schema_version")
    if not is_int(version) or version != SCHEMA_VERSION:
        raise InputError(
            f"{where}: schema_version {repr(version)[:40]} is not {SCHEMA_VERSION}; upgrade hub-export or re-export"
        )
    known = {f.name for f in fields(Manifest)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise _bad(where, "the manifest", f"has unknown key {unknown[0][:40]!r} (known: {', '.join(sorted(known))})")
    for name in ("source", "versions", "variants"):
        if name not in data:
            raise _bad(where, "the manifest", f"lacks {name!r}")
    _check_type(where, "source", data["source"], dict, "an object")
    # What the exporter declared goes into the card's front matter and links: text only.
    for name in ("base_model", "license", "model_name"):
        if name in data["source"]:
            _check_type(where, f"source.{name}", data["source"][name], str, "a string")
    _check_type(where, "versions", data["versions"], dict, "an object")
    if not all(isinstance(value, str) for value in data["versions"].values()):
        raise _bad(where, "versions", "has a value that is not a version string")
    for name in ("command", "machine"):
        _check_type(where, name, data.get(name, ""), str, "a string")
    _check_type(where, "variants", data["variants"], list, "a list")
    for index, variant in enumerate(data["variants"]):
        check_variant(where, index, variant)


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


# The widest integer-dot-product ISA decides which XNNPACK kernels run (an AVX-512 VNNI core runs the
# 8da4w GEMMs about 3x faster than an AVX2 one here), so a speed figure names it; first match wins.
_VECTOR_LEVELS = (
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx512f", "AVX-512"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx2", "AVX2"),
    ("i8mm", "NEON i8mm"),
    ("asimddp", "NEON dotprod"),
    ("asimd", "NEON"),
)


def machine_description(cpuinfo: str | None = None) -> str:
    """A short, path-free description of this machine for the card's speed figures.

    Example: ``"AMD EPYC (AVX-512 VNNI), 2 cores, Linux x86_64"``.
    """
    import os

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}  # the first core's: every core repeats the same keys
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    cpu = fields.get("model name") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    level = next((name for flag, name in _VECTOR_LEVELS if flag in flags), None)
    cpu = f"{cpu} ({level})" if level else cpu
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


# -- verification records -------------------------------------------------------------
#
# What verification measured, as objects. Written by hub_export.pipeline.verify, read back from
# folders and repos; a repo's manifest is not ours, so reading keeps only figures of the
# right type and drops the rest. Every front end (CLI table, ``ls``, card, Space, commit
# messages) words them through the methods below.
