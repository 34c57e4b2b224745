"""Wrap: make a transformers decoder exportable with an ExecuTorch-friendly KV cache.

The wrapped module has the signature the ExecuTorch LLM runner calls,
``forward(input_ids[1, seq], cache_position[seq]) -> logits[1, 1, vocab]``, and routes
attention and cache writes through :mod:`hub_export.tasks.text_generation.kv_cache`: full-attention layers use
ExecuTorch's fused custom ops (``llama::custom_sdpa`` and ``llama::update_cache``), which
keep the cache in ``[batch, seq, heads, head_dim]`` layout and mask causally from
``start_pos`` inside the kernel; sliding-window layers keep a ring buffer of their window.

Only the last position's logits are returned: the runner samples from the last row
anyway, and skipping the vocabulary projection for every other prompt token makes
prefill cheaper.

A file exported for speculative decoding also has ``forward_rows(input_ids[1, seq],
cache_position[seq], rows[k]) -> logits[1, k, vocab]``: the same model over the same
cache, returning the logits of the chunk positions listed in ``rows`` (at most
:data:`MAX_ROWS`). ``rows = [seq - 1]`` prefills like ``forward``; ``rows = arange(seq)``
scores a run of proposed tokens in one call (:mod:`hub_export.tasks.text_generation.speculative`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from hub_export.patches import delegable_norms
from hub_export.patches.lowering import forget_compiled_globals
from hub_export.tasks.text_generation import kv_cache
from hub_export.tasks.text_generation.kv_cache import CacheLayout, ForwardContext, KVCache, plan_layers

ATTENTION_NAME = "hub_export_custom_sdpa"
# Rows one forward_rows call returns: a draft of up to 15 tokens plus the token before it. The
# output buffer is planned for this many rows of logits, so it bounds the method's memory.
MAX_ROWS = 16


def rows_limit(max_seq_len: int) -> int:
    """Rows one ``forward_rows`` call of a file with ``max_seq_len`` cache positions returns at most."""
    return min(MAX_ROWS, max_seq_len - 1)


def _load_custom_ops() -> None:
    # Importing registers llama::custom_sdpa / llama::update_cache with torch, and the
    # out variants of the quantized_decomposed per-token ops an int8 cache lowers to.
    import executorch.extension.llm.custom_ops.custom_ops
    import executorch.kernels.quantized  # noqa: F401


def custom_sdpa_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None, **kwargs
):
    """transformers attention function over the wrapper's :class:`~hub_export.tasks.text_generation.kv_cache.KVCache`.

    ``key``/``value`` are what the cache's ``update`` returned for this layer; the
    layer's cache layout decides the kernel (see :func:`hub_export.tasks.text_generation.kv_cache.attend`).
    Returns ``[B, S, H, D]``, the layout transformers expects from attention.
    """
    layout = kv_cache.current_cache().layout
    layer = layout.layers[module.layer_idx]
    if sliding_window and not layout.unbounded and layer.window != sliding_window and layer.slots > sliding_window:
        raise RuntimeError(
            f"layer {module.layer_idx} slides over {sliding_window} positions but its cache "
            f"was planned for {layer.window}"
        )
    return kv_cache.attend(module, query, key, value, scaling, sliding_window, softcap), None


def register_attention() -> None:
    """Register :func:`custom_sdpa_attention` with transformers (idempotent)."""
    from transformers import AttentionInterface

    _load_custom_ops()
    AttentionInterface.register(ATTENTION_NAME, custom_sdpa_attention)


def set_attention(model: nn.Module, name: str) -> str:
    """Switch the attention implementation of ``model``; returns the previous one."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    model.config.get_text_config()._attn_implementation = name
    return previous


@contextlib.contextmanager
def eager_attention(model: nn.Module):
    """Run ``model`` with transformers' reference ("eager") attention, e.g. for a reference forward.

    The eager implementation is the plain math every other kernel is checked against,
    and the only one that supports every feature (soft-capping, sliding windows).
    """
    previous = set_attention(model, "eager")
    try:
        yield model
    finally:
        set_attention(model, previous)


HEAD_ROWS = 16384  # output-head rows an eager forward runs at once under sliced_head


@contextlib.contextmanager
def sliced_head(model: nn.Module, rows: int | None = None, weight: Any = None):
    """Run ``model``'s output head :data:`HEAD_ROWS` of its rows at a time for the block, into one logits tensor.

    A torchao-quantized linear's eager forward dequantizes its whole weight to float32 first: over a 512-token
    window, Qwen's 151,936 x 1,536 int4 head took 1.77 GiB beyond the model, 0.29 GiB of it the logits. By
    slices, the same logits (bit for bit on an 8da4w head) took 0.45 GiB.

    ``weight``: where the rows come from in place of the head's own weight, whatever the head's size (rows a
    checkpoint reads on demand, :class:`~hub_export.pipeline.layerwise.StoredRows`, while the head is let go).
    """
    head, rows = model.get_output_embeddings(), rows or HEAD_ROWS
    if not isinstance(head, nn.Linear) or (weight is None and head.out_features <= rows):
        yield model
        return
    source = head.weight if weight is None else weight

    def forward(x: torch.Tensor) -> torch.Tensor:
        logits = x.new_empty(*x.shape[:-1], head.out_features)
        for start in range(0, head.out_features, rows):
            bias = None if head.bias is None else head.bias[start : start + rows]
            logits[..., start : start + rows] = nn.functional.linear(x, source[start : start + rows], bias)
        return logits

    head.forward = forward  # an instance attribute: the class's forward is back once it is deleted
    try:
        yield model
    finally:
        del head.forward


@contextlib.contextmanager
def sliced_embedding(model: nn.Module, rows: int = HEAD_ROWS):
    """Look tokens up in ``model``'s quantized input embedding table :data:`HEAD_ROWS` of its rows at a time for
    the block.

    A torchao-quantized embedding's eager lookup dequantizes its whole table to float32 first, with temporaries:
    at Phi-4-mini's 200,064 x 3,072 each lookup took 4.4 GiB beyond the model for a moment. By slices, only the
    rows of one slice are dequantized at once, and every row is the one the whole table gives.
    """
    table = model.get_input_embeddings()
    weight = getattr(table, "weight", None)
    if not isinstance(table, nn.Embedding) or type(weight) in (torch.Tensor, nn.Parameter) or len(weight) <= rows:
        yield model  # a float table is looked up row by row already
        return
    with _SlicedLookup(weight, rows):
        yield model


class _SlicedLookup(torch.overrides.TorchFunctionMode):
    """Every ``F.embedding`` on ``weight`` within the block, one slice of its rows at a time. A function mode rather
    than a new forward: families wrap the lookup in their own module (Gemma scales it)."""

    def __init__(self, weight: torch.Tensor, rows: int):
        super().__init__()
        self.weight, self.rows = weight, rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not nn.functional.embedding or len(args) < 2 or args[1] is not self.weight:
            return func(*args, **kwargs)
        if kwargs.get("max_norm") is not None:  # renormalises the rows it reads: the whole table's business
            return func(*args, **kwargs)
        ids = args[0].reshape(-1)
        found = None if len(ids) else func(ids, self.weight[:1])
        for start in range(0, len(self.weight), self.rows):
            inside = (ids >= start) & (ids < start + self.rows)
            if not bool(inside.any()):
                continue
            part = func(ids[inside] - start, self.weight[start : start + self.rows])
            if found is None:
                found = part.new_empty(len(ids), part.shape[-1])
            found[inside] = part
        return found.view(*args[0].shape, found.shape[-1])


class ExportableDecoder(nn.Module):
    """A causal LM plus static KV cache with the ExecuTorch LLM runner's signature.

    Example:
        >>> wrapped = ExportableDecoder(model, max_seq_len=128)
        >>> logits = wrapped(torch.tensor([[1, 2, 3]]), torch.arange(3))
        >>> logits.shape  # last position only
        torch.Size([1, 1, 32000])
    """

    def __init__(self, model: nn.Module, max_seq_len: int, layout: CacheLayout | None = None):
        super().__init__()
        register_attention()
        set_attention(model, ATTENTION_NAME)
        text_config = model.config.get_text_config()
        self.model = model
        self.layout = layout or plan_layers(text_config, max_seq_len)
        self.max_seq_len = self.layout.max_seq_len
        self.cache = KVCache(self.layout, dtype=model.dtype)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.logits(input_ids, cache_position, 1)

    def logits(self, input_ids: torch.Tensor, cache_position: torch.Tensor, keep) -> torch.Tensor:
        """Logits of the chunk after writing it to the cache: the last ``keep`` positions (an int), or the
        positions a 1-D index tensor lists (transformers' ``logits_to_keep``)."""
        start_pos = cache_position[0].item()
        torch._check(start_pos >= 0)
        positions = cache_position
        if self.layout.unbounded:
            # Attention sink: generation goes on forever; rope positions wrap inside the cache.
            positions = kv_cache.sink_positions(cache_position, self.layout.sink, self.layout.sink_window)
        else:
            torch._check(start_pos < self.max_seq_len)
        with ForwardContext(self.cache, start_pos):
            out = self.model(
                input_ids=input_ids,
                position_ids=positions.unsqueeze(0),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        return out.logits


class RowsDecoder(nn.Module):
    """``forward_rows``: the logits of chosen chunk positions, over the same model and cache as ``forward``.

    The model and the cache are registered under the names :class:`ExportableDecoder` gives them, so
    both methods of a file address the same cache buffers (``share_mutable_buffers``) and the same
    weights (stored once: XNNPACK keys its weights by content).
    """

    def __init__(self, decoder: ExportableDecoder):
        super().__init__()
        self.model = decoder.model
        self.cache = decoder.cache
        self.decoder = [decoder]  # a list: not a submodule, so no second name for the same weights

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder[0].logits(input_ids, cache_position, rows)


def needs_strict_tracing(layout: CacheLayout) -> bool:
    """Whether a cache layout must be exported through TorchDynamo (see :func:`export_program`)."""
    return layout.unbounded or any(layer.ring or layer.sink or layer.window for layer in layout.layers)


def export_program(wrapped: ExportableDecoder) -> torch.export.ExportedProgram:
    """``torch.export`` the wrapper with a dynamic sequence length (parallel prefill).

    A model whose every layer keeps a full cache is traced non-strict: its Python runs as
    it is, with fake tensors, instead of through TorchDynamo's bytecode tracing, which
    took about 3x longer on 8 SmolLM2 layers for the same graph (the same ``.pte`` bytes:
    ``tests/test_lower.py``). Ring, windowed and sink caches index their slots with
    ``min`` over the sequence length, which non-strict tracing turns into guards it
    cannot prove for every length; those go through TorchDynamo.
    """
    max_prefill = wrapped.max_seq_len - 1
    example_len = min(2, max_prefill)
    example = (torch.zeros((1, example_len), dtype=torch.long), torch.arange(example_len))
    dynamic = None
    if max_prefill > 1:  # a one-token prefill is a static graph
        seq = torch.export.Dim("seq", min=1, max=max_prefill)
        dynamic = ({1: seq}, {0: seq})
    with torch.no_grad(), delegable_norms(wrapped.model), forget_compiled_globals():
        program = torch.export.export(
            wrapped, example, dynamic_shapes=dynamic, strict=needs_strict_tracing(wrapped.layout)
        )
    wrapped.cache.reset()
    return program


def export_rows_program(wrapped: ExportableDecoder) -> torch.export.ExportedProgram:
    """``torch.export`` :class:`RowsDecoder` over ``wrapped``: dynamic chunk length and number of rows."""
    max_prefill = wrapped.max_seq_len - 1
    if max_prefill < 2:
        raise ValueError("a file for speculative decoding needs a cache of at least 3 positions")
    example = (torch.zeros((1, 2), dtype=torch.long), torch.arange(2), torch.arange(2))
    seq = torch.export.Dim("seq", min=1, max=max_prefill)
    rows = torch.export.Dim("rows", min=1, max=rows_limit(wrapped.max_seq_len))
    with torch.no_grad(), delegable_norms(wrapped.model), forget_compiled_globals():
        program = torch.export.export(
            RowsDecoder(wrapped), example, dynamic_shapes=({1: seq}, {0: seq}, {0: rows}),
            strict=needs_strict_tracing(wrapped.layout),
        )  # fmt: skip
    wrapped.cache.reset()
    return program
