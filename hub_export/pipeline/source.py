"""Source: resolve a Hub repo id or a local folder into files on disk, checked.

Only what the export needs is downloaded: config, generation config, safetensors
shards and tokenizer files. Everything that could make the export unsafe or
unfaithful is refused here, before any heavy work starts.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from hub_export.errors import InputError, SourceError, opt
from hub_export.hub.api import hub_errors, resolve_endpoint
from hub_export.pipeline import adapter as adapter_stage
from hub_export.pipeline import gguf_source
from hub_export.pipeline.manifest import sha256_file
from hub_export.tasks.registry import task_for

CONFIG_FILES = ["config.json", "generation_config.json"]
# sentence-transformers' description of an embedding model: which pooling, whether normalised,
# its sequence length. Read at export (the pooling goes into the .pte), not copied.
SENTENCE_FILES = [
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
]
WEIGHT_PATTERNS = ["*.safetensors", "model.safetensors.index.json"]
PICKLE_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
]
# How raw input becomes the model's input (an image's resize and normalisation, audio's
# features): a device reproduces it, so it travels with the files.
PROCESSOR_FILES = ["preprocessor_config.json", "processor_config.json"]
CARD_FILE = "README.md"


@dataclass
class Source:
    """A model ready to load: its folder and where it came from."""

    path: Path
    name: str  # repo id, or the folder's name for a local source
    revision: str | None  # resolved commit sha on the Hub, None for a folder
    is_local: bool
    config: dict = field(default_factory=dict)
    gguf: dict | None = None  # the GGUF the weights came from (file, sha256, quantization), if any
    adapter: dict | None = None  # the LoRA adapter merged into the base, and what the merge measured
    # For an adapter: the adapter and its base's own folder (what --lora-files quantizes without the adapter).
    lora: tuple[adapter_stage.Adapter, Path] | None = None

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "")


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch(name, pattern) for pattern in patterns)


def _model_info(repo_id: str, revision: str | None, token: str | None, endpoint: str | None):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    with hub_errors(repo_id, api.endpoint, "read", token, failure=SourceError, revision=revision):
        return api.model_info(repo_id, revision=revision)


def _download(repo_id, sha, files, token, endpoint, cache_dir) -> Path:
    from huggingface_hub import snapshot_download

    with hub_errors(repo_id, endpoint or resolve_endpoint(), "read", token, failure=SourceError):
        folder = snapshot_download(
            repo_id, revision=sha, allow_patterns=files, token=token, endpoint=endpoint, cache_dir=cache_dir
        )
    return Path(folder)


def _select_files(names: list[str], allow_pickle: bool, where: str) -> list[str]:
    if "config.json" not in names:
        raise SourceError(f"{where} has no config.json; is it a transformers model?")
    weights = [n for n in names if _matches(n, WEIGHT_PATTERNS)]
    if not any(n.endswith(".safetensors") for n in weights):
        pickles = [n for n in names if _matches(n, PICKLE_PATTERNS)]
        if not pickles:
            raise SourceError(f"{where} has no *.safetensors weights")
        if not allow_pickle:
            raise InputError(
                f"{where} only has pickle weights ({pickles[0]}), which can run code when loaded; "
                f"pass {opt('allow_pickle')} if you trust the source",
                param="allow_pickle",
            )
        weights = pickles
    wanted = [
        n
        for n in names
        if n in CONFIG_FILES or n in TOKENIZER_FILES or n in PROCESSOR_FILES or n in SENTENCE_FILES or n == CARD_FILE
    ]
    return wanted + weights


def _read_config(folder: Path, where: str) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SourceError(f"{where}/config.json is unreadable ({error.__class__.__name__})") from None


def check_safety(config: dict, where: str, trust_remote_code: bool) -> None:
    """Refuse remote code unless the user trusts it."""
    if config.get("auto_map") and not trust_remote_code:
        raise InputError(
            f"{where} needs custom (remote) code to load; pass {opt('trust_remote_code')} only if you trust its author",
            param="trust_remote_code",
        )


def check_companion(folder: Path, where: str, config: dict) -> None:
    """Refuse a source without the file a device needs to make its task's input: the tokenizer, or an image
    model's processor settings."""
    companion = task_for(config).companion
    if (folder / companion).is_file():
        return
    if companion == "tokenizer.json":
        raise SourceError(
            f"{where} has no tokenizer.json (a device tokenizes with it); add one, e.g. with "
            "AutoTokenizer.from_pretrained(...).save_pretrained(folder)"
        )
    raise SourceError(
        f"{where} has no {companion} (a device prepares its input as it says); add one, e.g. with "
        "AutoProcessor.from_pretrained(...).save_pretrained(folder)"
    )


@dataclass(frozen=True)
class _Reach:
    """How an adapter's base is fetched: the arguments of :func:`resolve` it passes on."""

    revision: str | None
    token: str | None
    endpoint: str | None
    cache_dir: str | os.PathLike | None
    trust_remote_code: bool
    precheck: object
    say: object


def resolve(
    source: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    cache_dir: str | os.PathLike | None = None,
    precheck=None,
    gguf_file: str | None = None,
    say=None,
    adapter: str | None = None,
    base_model: str | None = None,
) -> Source:
    """Resolve ``source`` (a local folder or a Hub repo id) into a checked :class:`Source`.

    A PEFT LoRA adapter (a folder or repo with ``adapter_config.json`` and no ``config.json``)
    is merged into its base (``base_model``, else the one its config names) and the merged
    folder is the source; ``adapter`` merges that adapter into ``source`` instead
    (:mod:`hub_export.pipeline.adapter`).

    ``precheck(config_dict)`` runs on the config before any weight is downloaded.
    ``gguf_file`` names a ``.gguf`` checkpoint in the folder or repo to read instead of
    safetensors; only that file is downloaded (see :mod:`hub_export.pipeline.gguf_source`). A
    path to a ``.gguf`` file works as ``source`` too.

    Example:
        >>> src = resolve("HuggingFaceTB/SmolLM2-135M", revision="main")
        >>> src.model_type
        'llama'
    """
    local = Path(source).expanduser()
    reach = _Reach(revision, token, endpoint, cache_dir, trust_remote_code, precheck, say)
    if adapter is not None or (local.is_dir() and adapter_stage.is_adapter_folder(local)):
        return _resolve_adapter(source, adapter, base_model, reach)
    if local.is_file() and local.suffix == ".gguf" and gguf_file in (None, local.name):
        local, gguf_file = local.parent, local.name
    if gguf_file is not None:
        return _resolve_gguf(source, local, gguf_file, revision, token, endpoint, cache_dir, precheck, say)
    if local.is_dir():
        where = local.name
        names = [p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()]
        _select_files(names, allow_pickle, where)
        config = _read_config(local, where)
        check_safety(config, where, trust_remote_code)
        check_companion(local, where, config)
        if precheck is not None:
            precheck(config)
        return Source(local.resolve(), where, None, True, config)
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise InputError(f"{source!r} is neither an existing folder nor a Hub repo id like org/name")

    return _resolve_hub(source, allow_pickle, base_model, reach)


def _resolve_hub(source: str, allow_pickle: bool, base_model: str | None, reach: _Reach) -> Source:
    """A Hub repo's model: its config checked first, then only the files an export needs downloaded (a repo that
    holds an adapter instead is merged into its base)."""
    token, endpoint, cache_dir = reach.token, reach.endpoint, reach.cache_dir
    info = _model_info(source, reach.revision, token, endpoint)
    names = [s.rfilename for s in info.siblings or []]
    if adapter_stage.ADAPTER_CONFIG in names and "config.json" not in names:
        return _resolve_adapter(source, None, base_model, reach)
    files = _select_files(names, allow_pickle, source)
    # Config first: refuse remote code and unsupported architectures before the weights.
    folder = _download(source, info.sha, ["config.json"], token, endpoint, cache_dir)
    config = _read_config(folder, source)
    check_safety(config, source, reach.trust_remote_code)
    if task_for(config).companion not in names:
        check_companion(folder, source, config)
    if reach.precheck is not None:
        reach.precheck(config)
    folder = _download(source, info.sha, files, token, endpoint, cache_dir)
    return Source(folder, source, info.sha, False, config)


_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|F16|F32|BF16)$", re.IGNORECASE)


def _gguf_model_name(file_name: str) -> str:
    """``SmolLM2-135M-Instruct`` for ``SmolLM2-135M-Instruct.Q4_1.gguf``."""
    stem = file_name.removesuffix(".gguf")
    return _QUANT_SUFFIX.sub("", stem) or stem


def _folder_digest(folder: Path) -> str:
    """sha256 over the names and contents of a model folder's files (hidden files aside)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(
        p for p in folder.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(folder).parts)
    ):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def fingerprint(src: Source) -> str:
    """What identifies the exact weights an export read: a Hub commit, a GGUF's sha256 or a folder's contents
    (for a merged adapter, the merged folder's: the adapter's bytes and its base's)."""
    if src.adapter:
        return f"files:{_folder_digest(src.path)}"
    if not src.is_local:
        return f"hub:{src.name}@{src.revision}" + (f":{src.gguf['file']}" if src.gguf else "")
    if src.gguf:
        return f"gguf:{src.gguf['sha256']}"
    return f"files:{_folder_digest(src.path)}"


def peek_fingerprint(
    source: str, gguf_file: str | None, revision: str | None, token: str | None, endpoint: str | None
) -> str | None:
    """:func:`fingerprint` of ``source`` without downloading or converting it (``None`` if it cannot tell: an
    adapter's depends on its base, known only once resolved)."""

    local = Path(source).expanduser()
    if local.is_dir() and adapter_stage.is_adapter_folder(local):
        return None
    if local.is_file() and local.suffix == ".gguf":
        return f"gguf:{sha256_file(local)}"
    if local.is_dir():
        if gguf_file:
            path = local / gguf_file
            return f"gguf:{sha256_file(path)}" if path.is_file() else None
        return f"files:{_folder_digest(local)}"
    try:
        info = _model_info(source, revision, token, endpoint)
    except SourceError:
        return None
    if adapter_stage.ADAPTER_CONFIG in {s.rfilename for s in info.siblings or []}:
        return None
    return f"hub:{source}@{info.sha}" + (f":{gguf_file}" if gguf_file else "")


def display_name(source: str | None, gguf_file: str | None = None) -> str:
    """The id an export of ``source`` records: the repo id, the folder's name, or a local GGUF's model name."""
    path = Path(source or "").expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_model_name(path.name)
    if path.is_dir():
        return _gguf_model_name(gguf_file) if gguf_file else path.name
    return source or ""


def _resolve_gguf(source, local: Path, gguf_file, revision, token, endpoint, cache_dir, precheck, say) -> Source:
    gguf_source.check_file_name(gguf_file)
    if local.is_dir():
        path = local / gguf_file
        if not path.is_file():
            present = sorted(p.name for p in local.glob("*.gguf"))
            raise InputError(
                f"{local.name}/ has no {gguf_file}; "
                + (f"GGUF files there: {', '.join(present)}" if present else "it holds no .gguf file")
            )
        name, sha, is_local = _gguf_model_name(gguf_file), None, True
    else:
        if source.startswith((".", "/", "~")) or source.count("/") != 1:
            raise InputError(f"{source!r} is neither an existing folder nor a Hub repo id like org/name")
        info = _model_info(source, revision, token, endpoint)
        names = [s.rfilename for s in info.siblings or []]
        if gguf_file not in names:
            present = sorted(n for n in names if n.endswith(".gguf"))
            raise SourceError(
                f"{source} has no {gguf_file}; "
                + (f"GGUF files there: {', '.join(present[:8])}" if present else "it holds no .gguf file")
            )
        path = _download(source, info.sha, [gguf_file], token, endpoint, cache_dir) / gguf_file
        name, sha, is_local = source, info.sha, False
    folder, record = gguf_source.converted_folder(path, say)
    config = _read_config(folder, name)
    check_companion(folder, name, config)
    if precheck is not None:
        precheck(config)
    return Source(folder, name, sha, is_local, config, gguf=record)


def is_adapter(source: str, revision: str | None = None, token: str | None = None, endpoint: str | None = None) -> bool:
    """Whether ``source`` (a folder or Hub id) is a PEFT adapter rather than a model."""
    return _is_adapter(source, Path(source).expanduser(), revision, token, endpoint)


def _is_adapter(source: str, local: Path, revision, token, endpoint) -> bool:
    if local.is_dir():
        return adapter_stage.is_adapter_folder(local)
    if local.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        return False
    names = {s.rfilename for s in _model_info(source, revision, token, endpoint).siblings or []}
    return adapter_stage.ADAPTER_CONFIG in names and "config.json" not in names


def _fetch_adapter(source: str, revision, token, endpoint, cache_dir) -> adapter_stage.Adapter:
    local = Path(source).expanduser()
    if local.is_dir():
        if not (local / adapter_stage.ADAPTER_CONFIG).is_file():
            raise InputError(f"{local.name} has no {adapter_stage.ADAPTER_CONFIG}; is it a PEFT adapter?")
        return adapter_stage.read_adapter(local.resolve(), local.name)
    if local.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise InputError(f"adapter {source!r} is neither an existing folder nor a Hub repo id like org/name")
    info = _model_info(source, revision, token, endpoint)
    names = [s.rfilename for s in info.siblings or []]
    if adapter_stage.ADAPTER_CONFIG not in names:
        raise SourceError(f"{source} has no {adapter_stage.ADAPTER_CONFIG}; is it a PEFT adapter?")
    wanted = [adapter_stage.ADAPTER_CONFIG, adapter_stage.ADAPTER_WEIGHTS, CARD_FILE, *TOKENIZER_FILES]
    folder = _download(source, info.sha, [n for n in names if n in wanted], token, endpoint, cache_dir)
    return adapter_stage.read_adapter(folder, source, info.sha)


def _resolve_adapter(source: str, adapter: str | None, base_model: str | None, reach: _Reach) -> Source:
    """An adapter (``source``, or ``adapter`` beside a base ``source``) merged into its base, as a local Source."""
    revision, token, endpoint, cache_dir = reach.revision, reach.token, reach.endpoint, reach.cache_dir
    if adapter is not None:  # the base is the source; the revision is the base's
        lora, base = _fetch_adapter(adapter, None, token, endpoint, cache_dir), source
    else:
        lora = _fetch_adapter(source, revision, token, endpoint, cache_dir)
        base, revision = base_model or lora.base, None
        if not base:
            raise InputError(f"{lora.name} does not name its base model; pass it: hub-export export BASE "
                             f"{opt('adapter')} {source}")  # fmt: skip
        looks_local = base.startswith((".", "/", "~")) or base.count("/") != 1 or Path(base).expanduser().exists()
        if lora.revision is not None and looks_local:  # a repo must not reach into this machine's disk
            raise InputError(f"{lora.name} names a base on a disk ({base!r}), not on the Hub; pass "
                             f"{opt('base_model')} ORG/NAME")  # fmt: skip
        if not Path(base).expanduser().is_dir() and looks_local:
            raise InputError(f"{lora.name}'s base {base!r} is not here; pass the base: hub-export export BASE "
                             f"{opt('adapter')} {source}")  # fmt: skip
    base_src = resolve(base, revision=revision, token=token, endpoint=endpoint,
                       trust_remote_code=reach.trust_remote_code, allow_pickle=False, cache_dir=cache_dir,
                       precheck=reach.precheck, say=reach.say)  # fmt: skip
    if base_src.adapter is not None or base_src.gguf is not None:
        raise InputError(f"the base of {lora.name} must be a safetensors model; {base_src.name} is not")
    adapter_stage.check_against_base(lora, base_src.path, base_src.name)
    base_key = base_src.revision or _folder_digest(base_src.path)
    cache = gguf_source.cache_root().parent / "adapters"
    folder, measured = adapter_stage.merged_folder(lora, base_src.path, base_key, cache, TOKENIZER_FILES, reach.say)
    record = {**lora.record(), "base": base_src.name, "base_revision": base_src.revision,
              "base_local": base_src.is_local, "merge": measured}  # fmt: skip
    return Source(folder, lora.name, lora.revision, lora.revision is None, _read_config(folder, lora.name),
                  adapter=record, lora=(lora, base_src.path))  # fmt: skip
