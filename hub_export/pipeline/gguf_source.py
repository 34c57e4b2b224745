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
_FORMAT_VERSION = 2  # bump when the conversion changes what it writes
# transformers' tensor processors that turn one GGUF tensor into one checkpoint tensor; the others (mixture-of-experts
# models) assemble several GGUF tensors into one, which needs the whole model, so those convert the way transformers
# loads them.
_ONE_TO_ONE = {"TensorProcessor", "LlamaTensorProcessor", "GPT2TensorProcessor", "BloomTensorProcessor",
               "NemotronTensorProcessor", "Gemma2TensorProcessor"}  # fmt: skip
SHARD_BYTES = 256 << 20  # safetensors serializes a shard in memory before writing it: a small one keeps that small


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


_LOAD_ERRORS = (ValueError, KeyError, RuntimeError, OSError, NotImplementedError)


def _cannot_load(name: str, error: Exception) -> SourceError:
    first = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
    return SourceError(f"transformers cannot load {name}: {first}")


def _convert(path: Path, out: Path) -> None:
    """``out``: the GGUF as a float32 safetensors folder, a tensor at a time where each GGUF tensor makes one
    checkpoint tensor (the model is never whole in memory), else through a whole model as transformers loads it."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Our stage log already says what happens; transformers' per-tensor bar would only add noise.
    hf_logging.disable_progress_bar()
    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        if not _convert_streaming(path, out):
            _convert_whole(path, out)
    except _LOAD_ERRORS as error:
        raise _cannot_load(name, error) from None
    tokenizer.save_pretrained(out)


def _convert_streaming(path: Path, out: Path) -> bool:
    """Dequantize, rename and write each GGUF tensor as transformers' loader does, in shards of
    :data:`SHARD_BYTES`; False (nothing written) for a model whose tensors do not map one to one."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # the metadata only
    reader = GGUFReader(str(path))
    architecture = _field_value(reader, "general.architecture")
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed.get("config", {}))
    if type(processor).__name__ not in _ONE_TO_ONE:
        return False
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # names only: no weight is allocated
    mapping = get_gguf_hf_weights_map(skeleton, processor)
    parsed["tensors"] = {}
    shards, shard, size = [], {}, 0
    for tensor in reader.tensors:
        result = processor.process(weights=_dequantized(tensor, dequantize), name=tensor.name,
                                   tensor_key_mapping=mapping, parsed_parameters=parsed)  # fmt: skip
        if result.name not in mapping:
            continue  # transformers skips it too (e.g. rope frequencies it recomputes)
        shard[mapping[result.name]] = torch.from_numpy(
            np.array(result.weights, dtype=np.float32)
        )  # a copy: F32 tensors are views of the mapped file
        size += shard[mapping[result.name]].nbytes
        if size >= SHARD_BYTES:
            shards.append(_write_shard(out, len(shards), shard))
            shard, size = {}, 0
    if parsed["tensors"]:
        raise NotImplementedError(f"its {architecture} tensors are assembled from several GGUF tensors")
    if shard or not shards:
        shards.append(_write_shard(out, len(shards), shard))
    _index(out, shards)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    config.architectures = [type(skeleton).__name__]
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    return True


def _dequantized(tensor, dequantize, rows: int = 4096):
    """``tensor`` in float32, dequantized ``rows`` rows at a time into one array: gguf's dequantizers make
    temporaries about twice their output's size, which for a whole vocabulary-sized table would set the peak."""
    import numpy as np

    data = tensor.data
    if data.ndim != 2 or data.shape[0] <= rows:
        return dequantize(data, tensor.tensor_type)
    first = dequantize(data[:rows], tensor.tensor_type)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    out[:rows] = first
    for start in range(rows, data.shape[0], rows):
        out[start : start + rows] = dequantize(data[start : start + rows], tensor.tensor_type)
    return out


def _write_shard(out: Path, index: int, tensors: dict) -> tuple[str, list[str], int]:
    from safetensors.torch import save_file

    name = f"model-{index + 1:05d}.safetensors"
    save_file(tensors, str(out / name), metadata={"format": "pt"})
    return name, list(tensors), sum(t.nbytes for t in tensors.values())


def _index(out: Path, shards: list[tuple[str, list[str], int]]) -> None:
    """Name the shards as transformers does (``model-0000N-of-0000M``) and write the index that maps each weight."""
    total, weight_map = len(shards), {}
    for index, (name, keys, _) in enumerate(shards):
        final = f"model-{index + 1:05d}-of-{total:05d}.safetensors"
        (out / name).rename(out / final)
        weight_map |= dict.fromkeys(keys, final)
    index = {"metadata": {"total_size": sum(size for *_, size in shards)}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _convert_whole(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # The weights are now plain float32: drop the GGUF quantizer so they save as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    del model
