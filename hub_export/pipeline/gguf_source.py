"""GGUF sources: turn one ``.gguf`` checkpoint into a folder the rest of the pipeline reads.

transformers' GGUF loader dequantizes the weights to float32 and rebuilds the config,
the tokenizer and the chat template from the file's metadata. Doing that once and
saving the result as an ordinary safetensors folder (cached by the GGUF's sha256)
lets every later stage, worker processes included, memory-map the same checkpoint
instead of dequantizing it again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from hub_export.errors import InputError, SourceError, opt
from hub_export.pipeline.manifest import sha256_file

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
RECORD_NAME = "gguf_source.json"  # what the converted folder was made from
_FORMAT_VERSION = 1  # bump when the conversion changes what it writes


def check_file_name(name: str) -> str:
    """``name`` if it is a plain ``*.gguf`` file name (no folders: it is joined to a repo or folder)."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or not name.endswith(".gguf"):
        raise InputError(
            f"{opt('gguf_file')} must be the plain name of a .gguf file in the source (got {name!r})", param="gguf_file"
        )
    return name


def supported_architectures() -> list[str]:
    """GGUF architectures transformers can load (its own list, minus non-model entries)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in {"general", "tokenizer"})


def _field_value(reader, key: str):
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(part).decode("utf-8", errors="replace")
    return part.tolist()[0] if hasattr(part, "tolist") else part


def describe(path: Path) -> dict:
    """Architecture, name and quantization of a GGUF file, read from its header.

    Raises :class:`SourceError` for a file that is not a readable GGUF and
    :class:`InputError` for an architecture transformers cannot load.
    """
    with open(path, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise SourceError(f"{path.name} is not a GGUF file (wrong magic bytes); check the file name")
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
        architecture = _field_value(reader, "general.architecture")
        file_type = _field_value(reader, "general.file_type")
        name = _field_value(reader, "general.name")
    except Exception as error:  # the gguf reader fails in many ways on a damaged file
        raise SourceError(f"{path.name} is a damaged GGUF file ({type(error).__name__}); download it again") from None
    supported = supported_architectures()
    if architecture not in supported:
        raise InputError(
            f"{path.name} holds a {architecture!r} model, which transformers cannot read from GGUF; "
            f"supported: {', '.join(supported)}"
        )
    quantization = None
    if file_type is not None:
        try:
            quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
        except ValueError:
            quantization = f"file type {file_type}"
    return {"architecture": architecture, "quantization": quantization, "name": name}


def sha256_of(path: Path) -> str:

    return sha256_file(path)


def cache_root() -> Path:
    """Where converted GGUF checkpoints are kept (``$HUB_EXPORT_CACHE`` or under ``$HF_HOME``)."""
    if os.environ.get("HUB_EXPORT_CACHE"):
        return Path(os.environ["HUB_EXPORT_CACHE"]) / "gguf"
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return hf_home / "hub-export" / "gguf"


def converted_folder(path: Path, say=None) -> tuple[Path, dict]:
    """A safetensors folder (config, weights, tokenizer, chat template) made from GGUF ``path``.

    Returns the folder and a record of the GGUF (file name, sha256, architecture,
    quantization) for the manifest and the card. The folder is reused when the same
    GGUF bytes were converted before.
    """
    info = describe(path)
    digest = sha256_of(path)
    record = {"file": path.name, "sha256": digest, **info, "format": _FORMAT_VERSION}
    target = cache_root() / digest[:32]
    if (target / RECORD_NAME).is_file():
        try:
            if json.loads((target / RECORD_NAME).read_text()).get("format") == _FORMAT_VERSION:
                return target, _public(record)
        except (OSError, json.JSONDecodeError):
            pass
    if say:
        say(f"converting {path.name} ({info['quantization'] or 'GGUF'}) to float32 safetensors, once")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        _convert(path, staging)
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, _public(record)


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "format"}


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    # Our stage log already says what happens; transformers' per-tensor bar would only add noise.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, RuntimeError, OSError, NotImplementedError) as error:
        first = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise SourceError(f"transformers cannot load {name}: {first}") from None
    # The weights are now plain float32: drop the GGUF quantizer so they save as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
