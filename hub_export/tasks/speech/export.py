"""Speech recognition: a Whisper model as one ``.pte`` whose methods a device calls in turn.

- ``preprocessor``: 16 kHz mono samples ``[n]`` (n up to 30 s) -> log-mel features
  ``[1, mels, 3000]``, ExecuTorch's own ``WhisperAudioProcessor`` (what transformers'
  ``WhisperFeatureExtractor`` computes), so a device needs no Python;
- ``encoder``: features -> the cross-attention keys and values of every decoder layer,
  ``[2 * layers, 1500, d_model]`` (keys of layer i in row 2i, values in 2i+1). They are
  computed once per 30 s window instead of at every generated token;
- ``text_decoder``: token ids ``[1, n]``, the encoder's output and their cache positions
  ``[n]`` -> token scores ``[1, n, vocab]``, with a static self-attention cache inside.

``encoder`` and ``text_decoder`` take and return what ExecuTorch's ASR runner and
optimum-executorch's ``ExecuTorchModelForSpeechSeq2Seq`` pass between them (the decoder
takes whatever the encoder returned), with the constant methods they read
(``decoder_start_token_id``, ``get_max_seq_len``, ``get_eos_id``...).

Verification (:func:`verify_variant`) runs the shipped recordings (``data/speech``,
spoken by espeak-ng, with their sentences) through the file: the preprocessor against
transformers' feature extractor, the encoder's output against the eager model's, the
decoder's scores with teacher forcing on eager's transcript (KL and top-1, the text
decoder's bounds), and a greedy transcription whose word error rate against eager's
transcript and against the spoken sentence is the quality figure. The module implements
the encoder-task stages of :mod:`hub_export.tasks.encoders`, with hooks of its own for the
reference, the quantization and the verification.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError, VerificationError, first_line, opt
from hub_export.pipeline import quantize
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.tasks.encoders import EncodedAndScored, first_failure, label_figures, score_checks, score_limits
from hub_export.tasks.speech.decoding import (
    METHODS,
    SAMPLE_RATE,
    SpeechFile,
    corpus_wer,
    greedy_tokens,
    load_custom_ops,
    prompt_ids,
    read_audio,
)

WINDOW_SECONDS = 30
WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS
# The least cosine similarity of the encoder's output to eager's, by kind of file.
MIN_ENCODER_COSINE = {"fp32": 0.9999, "weight_only": 0.999, "dynamic": 0.99}
MAX_FEATURE_DIFF = 0.02  # log-mel features lie in about [-1, 1.5]; ExecuTorch's window differs by ~1e-4


# -- the modules the file's methods are ------------------------------------------------------------


class CrossAttentionEncoder(nn.Module):
    """``encoder``: log-mel features ``[1, mels, frames]`` -> every decoder layer's cross-attention keys and
    values, ``[2 * layers, positions, d_model]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.model.encoder
        self.projections = nn.ModuleList(
            nn.ModuleList([layer.encoder_attn.k_proj, layer.encoder_attn.v_proj])
            for layer in model.model.decoder.layers
        )

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_features=input_features).last_hidden_state[0]
        return torch.stack([projection(hidden) for pair in self.projections for projection in pair])


class CachedDecoder(nn.Module):
    """``text_decoder``: (token ids ``[1, n]``, cross keys/values, cache positions ``[n]``) -> scores ``[1, n, vocab]``.

    Self-attention keys and values go into a static cache (ExecuTorch's ``update_cache``)
    and are read by its ``custom_sdpa``; cross-attention reads the encoder's output.
    """

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        load_custom_ops()
        config = model.config
        self.decoder, self.proj_out = model.model.decoder, model.proj_out
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.scaling = self.head_dim**-0.5
        self.max_seq_len = max_seq_len
        for i in range(config.decoder_layers):
            for kind in ("k", "v"):
                shape = (1, max_seq_len, self.heads, self.head_dim)
                self.register_buffer(f"{kind}_cache_{i}", torch.zeros(shape), persistent=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(1, -1, self.heads, self.head_dim)

    def _self_attention(self, i: int, layer: nn.Module, x: torch.Tensor, start_pos) -> torch.Tensor:
        attention = layer.self_attn
        k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
        torch.ops.llama.update_cache(self._heads(attention.k_proj(x)), k_cache, start_pos)
        torch.ops.llama.update_cache(self._heads(attention.v_proj(x)), v_cache, start_pos)
        query = self._heads(attention.q_proj(x))
        out = torch.ops.llama.custom_sdpa(query, k_cache, v_cache, start_pos, None, 0.0, True, self.scaling)
        return attention.out_proj(out.reshape(1, -1, self.heads * self.head_dim))

    def _cross_attention(self, i: int, layer: nn.Module, x: torch.Tensor, cross: torch.Tensor) -> torch.Tensor:
        attention = layer.encoder_attn
        query = self._heads(attention.q_proj(x)).transpose(1, 2)
        key, value = (self._heads(cross[2 * i + j].unsqueeze(0)).transpose(1, 2) for j in (0, 1))
        out = nn.functional.scaled_dot_product_attention(query, key, value, scale=self.scaling)
        return attention.out_proj(out.transpose(1, 2).reshape(1, -1, self.heads * self.head_dim))

    def forward(self, decoder_input_ids: torch.Tensor, encoder_output: torch.Tensor, cache_position: torch.Tensor):
        start_pos = cache_position[0].item()
        torch._check(start_pos >= 0)
        torch._check(start_pos < self.max_seq_len)
        decoder = self.decoder
        positions = nn.functional.embedding(cache_position, decoder.embed_positions.weight)
        x = decoder.embed_tokens(decoder_input_ids) + positions.unsqueeze(0)
        for i, layer in enumerate(decoder.layers):
            x = x + self._self_attention(i, layer, layer.self_attn_layer_norm(x), start_pos)
            x = x + self._cross_attention(i, layer, layer.encoder_attn_layer_norm(x), encoder_output)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return self.proj_out(decoder.layer_norm(x))


class Preprocessor(nn.Module):
    """``preprocessor``: samples ``[n]`` at 16 kHz (n up to 30 s) -> log-mel features ``[1, mels, 3000]``."""

    def __init__(self, mels: int):
        super().__init__()
        from executorch.extension.audio.mel_spectrogram import WhisperAudioProcessor

        self.processor = WhisperAudioProcessor(feature_size=mels)

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        return self.processor(waveform)


class SpeechModel(nn.Module):
    """The three methods of a speech file, as one module tree (quantized together, exported one by one)."""

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        self.config = model.config
        self.preprocessor = Preprocessor(model.config.num_mel_bins)
        self.encoder = CrossAttentionEncoder(model)
        self.text_decoder = CachedDecoder(model, max_seq_len)


def _layer_norm_4d(self, x: torch.Tensor) -> torch.Tensor:
    # XNNPACK delegates mean over the two innermost dims of a 4D tensor, not native_layer_norm:
    # the same arithmetic in that shape keeps every layer in one delegate.
    shape = x.shape
    rows = x.reshape(1, -1, 1, shape[-1])
    centered = rows - rows.mean(dim=(-2, -1), keepdim=True)
    variance = centered.pow(2).mean(dim=(-2, -1), keepdim=True)
    return (centered * torch.rsqrt(variance + self.eps)).reshape(shape) * self.weight + self.bias


@contextlib.contextmanager
def delegable_layer_norms(module: nn.Module):
    """While exporting, compute ``module``'s affine LayerNorms in the shape XNNPACK delegates (see ``_layer_norm_4d``);
    the eager model that verification compares against keeps its own."""
    patched = [
        m for m in module.modules() if isinstance(m, nn.LayerNorm) and m.weight is not None and m.bias is not None
    ]
    for norm in patched:
        norm.forward = _layer_norm_4d.__get__(norm)
    try:
        yield len(patched)
    finally:
        for norm in patched:
            del norm.forward


# -- the encoder-task stages (hub_export.tasks.encoders) ---------------------------------------------------


def seq_len(folder: Path, config: dict, requested: int | None) -> int:
    """The decoder's cache length: ``requested``, else the model's ``max_target_positions`` (448 for Whisper)."""
    limit = int(config.get("max_target_positions") or 448)
    if requested is not None and requested > limit:
        raise InputError(
            f"{opt('max_seq_len')} {requested} is above the decoder's limit of {limit} positions", param="max_seq_len"
        )
    return requested or limit


def wrap(model: nn.Module, folder: Path, max_seq_len: int = 448) -> SpeechModel:
    return SpeechModel(model, max_seq_len)


def export(wrapped: SpeechModel, max_seq_len: int) -> dict[str, torch.export.ExportedProgram]:
    """The three methods, each traced with its own inputs (the decoder's token count dynamic)."""
    config = wrapped.config
    frames = 2 * config.max_source_positions
    features = torch.zeros(1, config.num_mel_bins, frames)
    with torch.no_grad(), delegable_layer_norms(wrapped):
        cross = wrapped.encoder(features)
        samples = torch.export.Dim("samples", min=config.num_mel_bins * 10, max=WINDOW_SAMPLES)
        tokens = torch.export.Dim("tokens", min=1, max=max_seq_len)
        programs = {
            "preprocessor": torch.export.export(
                wrapped.preprocessor, (torch.zeros(SAMPLE_RATE),), dynamic_shapes=({0: samples},), strict=False
            ),
            "encoder": torch.export.export(wrapped.encoder, (features,), strict=False),
            "text_decoder": torch.export.export(
                wrapped.text_decoder,
                (torch.zeros(1, 2, dtype=torch.long), cross, torch.arange(2)),
                dynamic_shapes=({1: tokens}, None, {0: tokens}),
                strict=False,
            ),
        }
    for name, buffer in wrapped.text_decoder.named_buffers():
        if "_cache_" in name:
            buffer.zero_()
    return programs


def generation_settings(folder: Path) -> dict[str, Any]:
    """What a transcription loop needs from ``generation_config.json``: start token, prompt tokens, suppressed ids."""
    try:
        data = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))

    def ids(value) -> list[int]:
        return [int(v) for v in value if isinstance(v, int)] if isinstance(value, list) else []

    start = data.get("decoder_start_token_id", config.get("decoder_start_token_id"))
    eos = data.get("eos_token_id", config.get("eos_token_id"))
    return {
        "decoder_start_token_id": int(start),
        "eos_token_id": int(eos[0] if isinstance(eos, list) else eos),
        "no_timestamps_token_id": data.get("no_timestamps_token_id"),
        "is_multilingual": bool(data.get("is_multilingual", False)),
        "lang_to_id": {k: int(v) for k, v in (data.get("lang_to_id") or {}).items() if isinstance(v, int)},
        "task_to_id": {k: int(v) for k, v in (data.get("task_to_id") or {}).items() if isinstance(v, int)},
        "suppress_tokens": ids(data.get("suppress_tokens", config.get("suppress_tokens"))),
        "begin_suppress_tokens": ids(data.get("begin_suppress_tokens", config.get("begin_suppress_tokens"))),
    }


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    """The constant methods: what ExecuTorch's ASR runner and optimum-executorch read, and the audio settings."""
    config, settings = model.config, generation_settings(folder)
    return {
        "get_max_seq_len": max_seq_len,
        "get_vocab_size": int(config.vocab_size),
        "decoder_start_token_id": settings["decoder_start_token_id"],
        "get_bos_id": settings["decoder_start_token_id"],
        "get_eos_id": settings["eos_token_id"],
        "get_eos_ids": [settings["eos_token_id"]],
        "max_hidden_seq_length": int(config.max_source_positions),
        "get_max_batch_size": 1,
        "use_kv_cache": True,
        "get_sample_rate": SAMPLE_RATE,
        "get_num_mel_bins": int(config.num_mel_bins),
        "is_multilingual": settings["is_multilingual"],
    }


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    settings = generation_settings(folder)
    return {"methods": list(METHODS), "multilingual": settings["is_multilingual"], "sample_rate": SAMPLE_RATE}


def quantize_model(model: nn.Module, qmode: str, options) -> list[str]:
    """``qmode`` for the decoder's linear layers (cross-attention projections included), ``options.qmode_encoder``
    (default: the same) for the audio encoder's, ``options.qembedding`` for the decoder's token table."""
    quantize.drop_padding_index(model)
    quantize.quantize_embeddings(model.model.decoder, options.qembedding)
    encoder = model.model.encoder
    fallback = quantize.quantize_linears(encoder, options.qmode_encoder or qmode, options.group_size)
    fallback += quantize.quantize_linears(model, qmode, options.group_size, exclude=tuple(encoder.modules()))
    return fallback


# -- audio and words ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    """A shipped recording and the sentence spoken in it."""

    name: str
    waveform: torch.Tensor  # [n] float32 at 16 kHz
    text: str


def eval_clips() -> list[Clip]:
    """The recordings verification transcribes (``hub_export/data/speech``, made by ``scripts/make_speech_clips.py``)."""
    folder = resources.files("hub_export").joinpath("data", "speech")
    records = json.loads(folder.joinpath("transcripts.json").read_text(encoding="utf-8"))
    return [Clip(r["file"], read_audio(Path(str(folder.joinpath(r["file"])))), r["text"]) for r in records]


# -- transcribing ---------------------------------------------------------------------------------------


# -- reference and verification -----------------------------------------------------------------------


@dataclass
class SpeechReference:
    """The recordings every variant transcribes, and what the fp32 eager model made of them."""

    clips: list[Clip]
    features: list[torch.Tensor]  # transformers' feature extractor's, [1, mels, 3000] each
    prompt: list[int]
    settings: dict
    tokens: list[list[int]]  # the fp32 eager model's greedy transcript of each clip
    texts: list[str]
    max_seq_len: int
    tokenizer_json: str  # the tokenizer itself, so a cluster node can read transcripts without the source folder

    def text(self, tokens: list[int]) -> str:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.tokenizer_json).decode(tokens, skip_special_tokens=True).strip()

    @property
    def inputs(self) -> list[Clip]:
        return self.clips


def reference(model: nn.Module, folder: Path, max_seq_len: int) -> SpeechReference:
    """Transcribe the shipped recordings with the fp32 eager model, through the loop the file will run."""
    from transformers import AutoFeatureExtractor

    extractor = AutoFeatureExtractor.from_pretrained(folder)
    clips = eval_clips()
    features = [
        extractor(clip.waveform.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features.float()
        for clip in clips
    ]
    settings = generation_settings(folder)
    prompt = prompt_ids(settings)
    wrapped = wrap(model, folder, max_seq_len).eval()
    with torch.no_grad():
        tokens = [
            greedy_tokens(wrapped.encoder, wrapped.text_decoder, f, prompt, settings, max_seq_len) for f in features
        ]
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    record = SpeechReference(clips, features, prompt, settings, tokens, [], max_seq_len, tokenizer_json)
    record.texts = [record.text(ids) for ids in tokens]
    return record


def expected(wrapped: SpeechModel, reference: SpeechReference) -> EncodedAndScored:
    """The quantized eager model's encoder outputs and teacher-forced scores on the reference transcripts."""
    outputs, scores = [], []
    with torch.no_grad():
        for features, tokens in zip(reference.features, reference.tokens, strict=True):
            cross = wrapped.encoder(features)
            ids = torch.tensor([reference.prompt + tokens], dtype=torch.long)
            outputs.append(cross)
            scores.append(wrapped.text_decoder(ids, cross, torch.arange(ids.shape[1]))[0])
    return EncodedAndScored(outputs, scores)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def verify_variant(
    pte_path: str | Path, expected: EncodedAndScored, reference: SpeechReference, mode: QMode, qembedding: str | None
) -> Verification:
    """Check each method of ``pte_path`` on the shipped recordings and measure its word error rate."""
    from hub_export.pipeline.verify import TIE_NATS  # the text decoder's bound, one definition

    kind = mode.tolerance
    limits = {
        "max_feature_diff_allowed": MAX_FEATURE_DIFF,
        "min_encoder_cosine_required": MIN_ENCODER_COSINE[kind],
        **score_limits(mode),
    }
    try:
        file = SpeechFile(pte_path)
        measured = _measure(file, expected, reference, TIE_NATS[kind])
    except (VerificationError, InputError) as error:
        return Verification(False, failure=f"runtime error: {first_line(error)[:200]}", figures=limits)
    texts = [reference.text(tokens) for tokens in measured.pop("transcripts")]
    sentences = [clip.text for clip in reference.clips]
    figures = {
        **limits,
        **measured,
        "wer": corpus_wer(texts, sentences),
        "fp32_wer": corpus_wer(reference.texts, sentences),
        "wer_vs_fp32": corpus_wer(texts, reference.texts),
    }
    checks = [
        (figures["max_feature_diff"] > MAX_FEATURE_DIFF, f"preprocessor features differ from transformers' by "
         f"{figures['max_feature_diff']:.3g} (allowed {MAX_FEATURE_DIFF})"),
        (figures["min_encoder_cosine"] < limits["min_encoder_cosine_required"], f"encoder output cosine to eager "
         f"{figures['min_encoder_cosine']:.4f} is below {limits['min_encoder_cosine_required']}"),
        *score_checks(figures, limits),
    ]  # fmt: skip
    failure = first_failure(checks)
    return Verification(failure is None, positions=int(figures["positions"]), failure=failure, figures=figures)


def _measure(file: SpeechFile, expected: EncodedAndScored, reference: SpeechReference, tie_nats: float) -> dict:
    """The file's figures on the reference: features, encoder, teacher-forced scores, transcripts."""
    feature_diff, cosines, rows, eager_rows, texts = 0.0, [], [], [], []
    folder_settings = reference.settings
    for index, clip in enumerate(reference.clips):
        features = file.features(clip.waveform)
        feature_diff = max(feature_diff, float((features - reference.features[index]).abs().max()))
        cross = file.encode(reference.features[index])
        cosines.append(_cosine(cross, expected.encoded[index]))
        ids = torch.tensor([reference.prompt + reference.tokens[index]], dtype=torch.long)
        rows.append(file.decode(ids, cross, torch.arange(ids.shape[1]))[0])
        eager_rows.append(expected.scores[index])
        tokens = greedy_tokens(file.encode, file.decode, features, reference.prompt, folder_settings, file.max_seq_len)
        texts.append(tokens)
    agreement = label_figures(torch.cat(rows), torch.cat(eager_rows), tie_nats)
    return {
        "clips": float(len(reference.clips)),
        "positions": float(sum(r.shape[0] for r in rows)),
        "max_feature_diff": feature_diff,
        "min_encoder_cosine": min(cosines),
        "mean_kl_vs_eager": agreement["mean_kl"],
        "top1_vs_eager": agreement["top1_within_ties"],
        "transcripts": texts,  # token ids: turned into WER figures by the caller
    }
