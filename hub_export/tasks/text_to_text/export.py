"""Text-to-text: a T5-class encoder-decoder as one ``.pte`` with the speech file's two model methods.

- ``encoder``: token ids ``[1, n]`` (n dynamic up to the file's ``max_hidden_seq_length``) ->
  every decoder layer's cross-attention keys and values, ``[2 * layers, n, inner_dim]``,
  computed once per input;
- ``text_decoder``: token ids ``[1, m]``, the encoder's output and cache positions ``[m]``
  -> token scores ``[1, m, vocab]``, with a static self-attention cache and T5's relative
  position bias over it.

These are the names, inputs and outputs optimum-executorch's seq2seq file has (its decoder
takes what its encoder returned). Verification feeds :data:`EVAL_PROMPTS` prompts built
from the evaluation sentences: the decoder's scores with teacher forcing on the fp32 eager
model's greedy output (KL and top-1 against quantized eager, the text decoder's bounds),
then a greedy generation through both methods, whose agreement with fp32's output is the
quality figure. The module implements the encoder-task stages of :mod:`hub_export.tasks.encoders`
with the same hooks as :mod:`hub_export.tasks.speech.export`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError, VerificationError, first_line
from hub_export.patches import delegable_norms
from hub_export.pipeline import quantize
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.tasks.encoders import first_failure, label_figures, score_checks, score_limits
from hub_export.tasks.sentence_embeddings.export import eval_sentences
from hub_export.tasks.speech.decoding import EncoderDecoderFile, load_custom_ops

EVAL_PROMPTS = 16
NEW_TOKENS = 24  # generated per prompt in verification
DEFAULT_SOURCE_LEN = 512
DEFAULT_TARGET_LEN = 128
METHODS = ("encoder", "text_decoder")


class CrossAttentionEncoder(nn.Module):
    """``encoder``: token ids ``[1, n]`` -> every decoder layer's cross-attention keys and values ``[2L, n, inner]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()
        self.projections = nn.ModuleList(
            nn.ModuleList([block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v])
            for block in model.get_decoder().block
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids).last_hidden_state[0]
        return torch.stack([projection(hidden) for pair in self.projections for projection in pair])


class CachedT5Decoder(nn.Module):
    """``text_decoder``: (ids ``[1, m]``, cross keys/values, cache positions ``[m]``) -> scores ``[1, m, vocab]``."""

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        config = model.config
        self.decoder, self.lm_head = model.get_decoder(), model.lm_head
        self.heads, self.head_dim = config.num_heads, config.d_kv
        self.max_seq_len = max_seq_len
        self.output_scale = config.d_model**-0.5 if getattr(config, "scale_decoder_outputs", False) else 1.0
        load_custom_ops()
        for i in range(config.num_decoder_layers):
            for kind in ("k", "v"):
                shape = (1, max_seq_len, self.heads, self.head_dim)  # the layout ExecuTorch's update_cache writes
                self.register_buffer(f"{kind}_cache_{i}", torch.zeros(shape), persistent=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(1, -1, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, decoder_input_ids: torch.Tensor, encoder_output: torch.Tensor, cache_position: torch.Tensor):
        start_pos = cache_position[0].item()
        torch._check(start_pos >= 0)
        torch._check(start_pos + decoder_input_ids.shape[1] <= self.max_seq_len)
        blocks = self.decoder.block
        first = blocks[0].layer[0].SelfAttention
        bias = first.compute_bias(decoder_input_ids.shape[1], self.max_seq_len, past_seen_tokens=start_pos)
        future = torch.arange(self.max_seq_len)[None, :] > cache_position[:, None]
        bias = bias.masked_fill(future, float("-inf"))
        x = self.decoder.embed_tokens(decoder_input_ids)
        for i, block in enumerate(blocks):
            x = x + self._self_attention(i, block.layer[0], x, cache_position, bias)
            x = x + self._cross_attention(i, block.layer[1], x, encoder_output)
            x = x + block.layer[2].DenseReluDense(block.layer[2].layer_norm(x))
        return self.lm_head(self.decoder.final_layer_norm(x) * self.output_scale)

    def _self_attention(self, i: int, layer: nn.Module, x, cache_position, bias) -> torch.Tensor:
        attention, h = layer.SelfAttention, layer.layer_norm(x)
        k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
        start_pos = cache_position[0].item()
        torch.ops.llama.update_cache(attention.k(h).view(1, -1, self.heads, self.head_dim), k_cache, start_pos)
        torch.ops.llama.update_cache(attention.v(h).view(1, -1, self.heads, self.head_dim), v_cache, start_pos)
        keys, values = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(self._heads(attention.q(h)), keys, values, bias, scale=1.0)
        return attention.o(out.transpose(1, 2).reshape(1, -1, self.heads * self.head_dim))

    def _cross_attention(self, i: int, layer: nn.Module, x, cross) -> torch.Tensor:
        attention, h = layer.EncDecAttention, layer.layer_norm(x)
        key, value = self._heads(cross[2 * i].unsqueeze(0)), self._heads(cross[2 * i + 1].unsqueeze(0))
        out = nn.functional.scaled_dot_product_attention(self._heads(attention.q(h)), key, value, scale=1.0)
        return attention.o(out.transpose(1, 2).reshape(1, -1, self.heads * self.head_dim))


class Text2TextModel(nn.Module):
    """The two methods of a text-to-text file, as one module tree."""

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        self.config = model.config
        self.encoder = CrossAttentionEncoder(model)
        self.text_decoder = CachedT5Decoder(model, max_seq_len)


# -- the encoder-task stages ----------------------------------------------------------------------------


def seq_len(folder: Path, config: dict, requested: int | None) -> int:
    """The decoder's cache length: ``requested`` or :data:`DEFAULT_TARGET_LEN`."""
    return requested or DEFAULT_TARGET_LEN


def wrap(model: nn.Module, folder: Path, max_seq_len: int = DEFAULT_TARGET_LEN) -> Text2TextModel:
    return Text2TextModel(model, max_seq_len)


def export(wrapped: Text2TextModel, max_seq_len: int) -> dict[str, torch.export.ExportedProgram]:
    """Both methods, the input's length and the decoder's token count dynamic."""
    source = torch.export.Dim("source", min=2, max=DEFAULT_SOURCE_LEN)
    tokens = torch.export.Dim("tokens", min=1, max=max_seq_len)
    example = torch.ones(1, 8, dtype=torch.long)
    with torch.no_grad(), delegable_norms(wrapped):
        cross = wrapped.encoder(example)
        programs = {
            "encoder": torch.export.export(wrapped.encoder, (example,), dynamic_shapes=({1: source},), strict=False),
            "text_decoder": torch.export.export(
                wrapped.text_decoder,
                (torch.zeros(1, 2, dtype=torch.long), cross, torch.arange(2)),
                dynamic_shapes=({1: tokens}, {1: source}, {0: tokens}),
                strict=False,
            ),
        }
    for name, buffer in wrapped.text_decoder.named_buffers():
        if "_cache_" in name:
            buffer.zero_()
    return programs


def _settings(config) -> dict[str, int]:
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.pad_token_id
    return {"decoder_start_token_id": int(start), "eos_token_id": int(config.eos_token_id)}


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    settings = _settings(model.config)
    return {
        "get_max_seq_len": max_seq_len,
        "get_vocab_size": int(model.config.vocab_size),
        "decoder_start_token_id": settings["decoder_start_token_id"],
        "get_eos_id": settings["eos_token_id"],
        "get_eos_ids": [settings["eos_token_id"]],
        "max_hidden_seq_length": DEFAULT_SOURCE_LEN,
        "get_max_batch_size": 1,
        "use_kv_cache": True,
    }


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    return {"methods": list(METHODS), "max_source_tokens": DEFAULT_SOURCE_LEN}


def quantize_model(model: nn.Module, qmode: str, options) -> list[str]:
    """``qmode`` for every linear layer (``options.qmode_encoder`` for the encoder's), ``qembedding`` for the table."""
    quantize.drop_padding_index(model)
    quantize.quantize_embeddings(model, options.qembedding)
    encoder = model.get_encoder()
    fallback = quantize.quantize_linears(encoder, options.qmode_encoder or qmode, options.group_size)
    fallback += quantize.quantize_linears(model, qmode, options.group_size, exclude=tuple(encoder.modules()))
    return fallback


# -- reference, generation, verification -----------------------------------------------------------------


def greedy(encode, decode, input_ids: torch.Tensor, settings: dict, new_tokens: int, max_seq_len: int) -> list[int]:
    """Greedy output tokens (EOS excluded) for ``input_ids``, through ``encode``/``decode`` (file or eager)."""
    cross, tokens = encode(input_ids), [settings["decoder_start_token_id"]]
    for position in range(min(new_tokens, max_seq_len - 1)):
        scores = decode(torch.tensor([tokens[-1:]]), cross, torch.tensor([position]))
        token = int(scores[0, -1].argmax())
        if token == settings["eos_token_id"]:
            break
        tokens.append(token)
    return tokens[1:]


@dataclass
class Text2TextReference:
    """The prompts every variant answers, and the fp32 eager model's greedy answers."""

    prompts: list[str]
    inputs: list[torch.Tensor]  # [1, n] token ids each
    outputs: list[list[int]]
    settings: dict
    max_seq_len: int


@dataclass
class Text2TextExpected:
    scores: list[torch.Tensor]  # the quantized eager model's teacher-forced scores, [answer + 1, vocab] each


def reference(model: nn.Module, folder: Path, max_seq_len: int) -> Text2TextReference:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompts = [f"summarize: {sentence}" for sentence in eval_sentences(EVAL_PROMPTS)]
    inputs = [torch.tensor([tokenizer.encode(p).ids[:DEFAULT_SOURCE_LEN]], dtype=torch.long) for p in prompts]
    settings = _settings(model.config)
    wrapped = wrap(model, folder, max_seq_len).eval()
    with torch.no_grad():
        outputs = [
            greedy(wrapped.encoder, wrapped.text_decoder, ids, settings, NEW_TOKENS, max_seq_len) for ids in inputs
        ]
    return Text2TextReference(prompts, inputs, outputs, settings, max_seq_len)


def _teacher_ids(reference: Text2TextReference, index: int) -> torch.Tensor:
    return torch.tensor([[reference.settings["decoder_start_token_id"], *reference.outputs[index]]], dtype=torch.long)


def expected(wrapped: Text2TextModel, reference: Text2TextReference) -> Text2TextExpected:
    scores = []
    with torch.no_grad():
        for index, ids in enumerate(reference.inputs):
            teacher = _teacher_ids(reference, index)
            cross = wrapped.encoder(ids)
            scores.append(wrapped.text_decoder(teacher, cross, torch.arange(teacher.shape[1]))[0])
    return Text2TextExpected(scores)


def verify_variant(
    pte_path: str | Path,
    expected: Text2TextExpected,
    reference: Text2TextReference,
    mode: QMode,
    qembedding: str | None,
) -> Verification:
    """Teacher-forced scores against quantized eager (pass/fail), greedy answers against fp32's (quality)."""
    from hub_export.pipeline.verify import TIE_NATS  # the text decoder's bound, one definition

    kind = mode.tolerance
    limits = score_limits(mode)
    try:
        file = EncoderDecoderFile(pte_path)
        rows, answers = [], []
        for index, ids in enumerate(reference.inputs):
            teacher, cross = _teacher_ids(reference, index), file.encode(ids)
            rows.append(file.decode(teacher, cross, torch.arange(teacher.shape[1]))[0])
            answers.append(greedy(file.encode, file.decode, ids, reference.settings, NEW_TOKENS, reference.max_seq_len))
    except (VerificationError, InputError) as error:
        return Verification(False, failure=f"runtime error: {first_line(error)[:200]}", figures=limits)
    agreement = label_figures(torch.cat(rows), torch.cat(expected.scores), TIE_NATS[kind])
    same = [answer == fp32 for answer, fp32 in zip(answers, reference.outputs, strict=True)]
    figures = {
        **limits,
        "prompts": float(len(answers)),
        "mean_kl_vs_eager": agreement["mean_kl"],
        "top1_vs_eager": agreement["top1_within_ties"],
        "same_answer_as_fp32": sum(same) / len(same),
    }
    failure = first_failure(score_checks(figures, limits))
    positions = int(sum(r.shape[0] for r in rows))
    return Verification(failure is None, positions=positions, failure=failure, figures=figures)
