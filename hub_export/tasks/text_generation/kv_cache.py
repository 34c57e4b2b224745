"""The KV cache of an exported decoder: its layout per layer, its memory, its attention.

Three layouts, chosen per layer by :func:`plan_layers`:

- **linear**: one slot per position up to ``max_seq_len``, written with
  ``llama::update_cache`` and read by ``llama::custom_sdpa`` (or its int8 twin), which
  masks causally from ``start_pos`` inside the kernel;
- **ring**: a sliding-window layer keeps only its ``window`` most recent positions;
  slot ``(pos - sink) % ring + sink`` holds position ``pos``. Attention reads the ring
  *before* the chunk is written, plus the chunk's own keys, under one softmax, so a
  chunk of any length (a long prompt) is exact, and a ring of ``window`` slots suffices;
- **sink** (``--attention-sink SINK,WINDOW``): a ring behind ``SINK`` fixed slots for the
  first tokens (StreamingLLM). Generation goes on past the cache size; rope positions
  wrap inside the ring the way ExecuTorch's ``export_llm`` remaps them
  (:func:`sink_positions`), so relative distances hold within a wrap only.

Which position a ring slot holds is computed from ``start_pos`` (every earlier position
was written in order), not stored: a generation that starts again at position 0 sees an
empty cache without a reset.

Values are float32 or, with ``--kv-cache int8``, int8 with a float scale and int8 zero
point per token and head (``quantized_decomposed``'s per-token affine quantization);
linear layers then attend through ``llama::custom_quantized_sdpa`` without dequantizing
the cache.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import nn

from hub_export.tasks.archs import layer_windows

INT8_ROW_EXTRA_BYTES = 5  # a float32 scale and an int8 zero point per token and head

_state = threading.local()


@dataclass(frozen=True)
class LayerCache:
    """The cache of one attention layer.

    ``slots``: rows kept; ``ring``: rows are reused (else one per position);
    ``sink``: leading rows that keep the first positions forever; ``window``: a key is
    visible from a query less than ``window`` positions after it (None: all earlier keys).
    """

    slots: int
    ring: bool = False
    sink: int = 0
    window: int | None = None

    @property
    def ring_slots(self) -> int:
        return self.slots - self.sink


@dataclass(frozen=True)
class CacheLayout:
    """Every layer's cache plus what all layers share."""

    layers: tuple[LayerCache, ...]
    num_kv_heads: int
    head_dim: int
    max_seq_len: int  # positions a prefill chunk may reach (the cache size under an attention sink)
    dtype: str = "fp32"
    sink: int | None = None  # attention sink: rope positions wrap, generation is unbounded
    sink_window: int | None = None

    @property
    def unbounded(self) -> bool:
        """Generation may continue past ``max_seq_len`` (attention sink)."""
        return self.sink is not None

    def row_bytes(self) -> int:
        """Bytes of one cached position of one layer, keys and values."""
        per_head = self.head_dim * 4 if self.dtype == "fp32" else self.head_dim + INT8_ROW_EXTRA_BYTES
        return 2 * self.num_kv_heads * per_head

    def bytes_at_full_context(self) -> int:
        """What the cache holds when every slot is written."""
        return sum(layer.slots for layer in self.layers) * self.row_bytes()

    def bytes_per_token(self) -> int:
        """How much the cache grows per position of context (ring layers do not grow)."""
        return sum(1 for layer in self.layers if not layer.ring) * self.row_bytes()

    def to_dict(self) -> dict:
        """What the manifest records of this layout."""
        rings = [layer for layer in self.layers if layer.ring]
        return {
            "dtype": self.dtype,
            "layers": len(self.layers),
            "ring_layers": len(rings),
            "sliding_layers": sum(1 for layer in self.layers if layer.window is not None and not layer.sink),
            "ring_slots": sorted({layer.slots for layer in rings}),
            "attention_sink": [self.sink, self.sink_window] if self.sink is not None else None,
            "bytes_at_full_context": self.bytes_at_full_context(),
            "bytes_per_token": self.bytes_per_token(),
        }


def head_shape(config) -> tuple[int, int]:
    """(kv heads, head dim) of a transformers text config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return getattr(config, "num_key_value_heads", None) or heads, head_dim


def sliding_layers(config) -> list[int | None]:
    """Each layer's sliding window, or None for full attention (:func:`hub_export.tasks.archs.layer_windows`)."""

    keys = ("num_hidden_layers", "sliding_window", "layer_types", "use_sliding_window")
    return layer_windows({key: getattr(config, key) for key in keys if hasattr(config, key)})


def plan_layers(
    config, max_seq_len: int, sliding: str = "ring", dtype: str = "fp32", sink: tuple[int, int] | None = None
) -> CacheLayout:
    """The cache layout of a model at ``max_seq_len`` positions (the cache size under a sink)."""
    kv_heads, head_dim = head_shape(config)
    layers = []
    for window in sliding_layers(config):
        if sink is not None and (window is None or window > sink[1]):
            layers.append(LayerCache(slots=sink[0] + sink[1], ring=True, sink=sink[0], window=sink[1]))
        elif window is not None and (sink is not None or (sliding == "ring" and window < max_seq_len)):
            layers.append(LayerCache(slots=window, ring=True, window=window))
        else:
            # A sliding layer under --sliding-cache full keeps every position and masks.
            layers.append(LayerCache(slots=max_seq_len, window=window if window and window < max_seq_len else None))
    return CacheLayout(
        tuple(layers), kv_heads, head_dim, max_seq_len, dtype, sink[0] if sink else None, sink[1] if sink else None
    )


def sink_positions(positions: torch.Tensor, sink: int, ring: int) -> torch.Tensor:
    """Rope positions under an attention sink: the first ``sink`` kept, the rest wrapped into the ring."""
    return torch.where(positions < sink, positions, sink + torch.remainder(positions - sink, ring))


# -- the cache module ----------------------------------------------------------------


def current_start_pos():
    start_pos = getattr(_state, "start_pos", None)
    if start_pos is None:
        raise RuntimeError("the exported attention ran outside of an ExportableDecoder forward")
    return start_pos


class ForwardContext:
    """Hands ``start_pos`` and the cache to the attention function for the length of one forward.

    transformers calls the attention function without the cache object, so both travel
    through a thread-local.
    """

    def __init__(self, cache: KVCache, start_pos):
        self.cache, self.start_pos = cache, start_pos

    def __enter__(self):
        self.previous = (getattr(_state, "cache", None), getattr(_state, "start_pos", None))
        _state.cache, _state.start_pos = self.cache, self.start_pos
        return self

    def __exit__(self, *exc):
        _state.cache, _state.start_pos = self.previous


def current_cache() -> KVCache:
    cache = getattr(_state, "cache", None)
    if cache is None:
        raise RuntimeError("the exported attention ran outside of an ExportableDecoder forward")
    return cache


def _quantize_rows(x: torch.Tensor):
    """Per-token (and head) asymmetric int8: ``x`` ``[1, S, H, D]`` -> (int8, scale [1,S,H,1], zero point int8)."""
    scale, zero_point = torch.ops.quantized_decomposed.choose_qparams_per_token_asymmetric.default(x, torch.int8)
    q = torch.ops.quantized_decomposed.quantize_per_token(x, scale, zero_point, -128, 127, torch.int8)
    return q, scale.to(torch.float32), zero_point.to(torch.int8)


def _dequantize_rows(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    # The kernels take int64 zero points and float64 scales (with int8 zero points the
    # subtraction overflows).
    return torch.ops.quantized_decomposed.dequantize_per_token(
        q, scale.to(torch.float64), zero_point.to(torch.int64), -128, 127, torch.int8, torch.float32
    )


class KVCache(nn.Module):
    """Per-layer key/value buffers in ``[1, slots, kv_heads, head_dim]`` layout (ExecuTorch's cache ops' layout).

    Implements ``update``, the one method transformers attention layers call on a cache;
    :func:`attend` does the rest from the attention function.
    """

    def __init__(self, layout: CacheLayout, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.layout = layout
        int8 = layout.dtype == "int8"
        for i, layer in enumerate(layout.layers):
            shape = (1, layer.slots, layout.num_kv_heads, layout.head_dim)
            for kind in ("k", "v"):
                self.register_buffer(
                    f"{kind}_{i}", torch.zeros(shape, dtype=torch.int8 if int8 else dtype), persistent=False
                )
                if int8:
                    self.register_buffer(f"{kind}_scale_{i}", torch.ones(shape[:3] + (1,)), persistent=False)
                    self.register_buffer(
                        f"{kind}_zero_{i}", torch.zeros(shape[:3] + (1,), dtype=torch.int8), persistent=False
                    )

    def values(self, kind: str, i: int) -> tuple[torch.Tensor, ...]:
        """The buffers of ``kind`` (k or v) of layer ``i``: (values,) or (int8 values, scales, zero points)."""
        if self.layout.dtype == "int8":
            return getattr(self, f"{kind}_{i}"), getattr(self, f"{kind}_scale_{i}"), getattr(self, f"{kind}_zero_{i}")
        return (getattr(self, f"{kind}_{i}"),)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # transformers hands [B, H, S, D]; the cache ops expect [B, S, H, D].
        layer = self.layout.layers[layer_idx]
        if layer.ring:
            return key_states, value_states  # written by attend(), after the ring was read
        start_pos = current_start_pos()
        for kind, states in (("k", key_states), ("v", value_states)):
            rows = states.transpose(1, 2)
            buffers = self.values(kind, layer_idx)
            parts = _quantize_rows(rows) if len(buffers) == 3 else (rows,)
            for part, buffer in zip(parts, buffers, strict=False):
                torch.ops.llama.update_cache(part, buffer, start_pos)
        return self.values("k", layer_idx)[0], self.values("v", layer_idx)[0]

    def reset(self) -> None:
        for name, buffer in self.named_buffers():
            buffer.fill_(1.0 if "_scale_" in name else 0)


def attend(module, query, key, value, scaling, sliding_window=None, softcap=None) -> torch.Tensor:
    """Attention of layer ``module.layer_idx`` over its cache; ``query`` ``[1, H, S, D]`` -> ``[1, S, H, D]``."""
    cache = current_cache()
    layer_idx = module.layer_idx
    layer = cache.layout.layers[layer_idx]
    start_pos = current_start_pos()
    if layer.ring:
        return _ring_attention(cache, layer_idx, layer, query, key, value, start_pos, scaling, softcap)
    if softcap or layer.window:
        k_cache, v_cache = (_full(cache, kind, layer_idx) for kind in ("k", "v"))
        return masked_attention(query, k_cache, v_cache, start_pos, scaling, layer.window, softcap)
    if cache.layout.dtype == "int8":
        q, q_scale, q_zero = _quantize_rows(query.transpose(1, 2))
        (k, k_scale, k_zero), (v, v_scale, v_zero) = cache.values("k", layer_idx), cache.values("v", layer_idx)
        return torch.ops.llama.custom_quantized_sdpa(
            q, k, v, start_pos, None, 0.0, True, scaling, q_zero, q_scale, k_zero, k_scale, v_zero, v_scale
        )
    return torch.ops.llama.custom_sdpa(query.transpose(1, 2), key, value, start_pos, None, 0.0, True, scaling)


def _full(cache: KVCache, kind: str, i: int) -> torch.Tensor:
    buffers = cache.values(kind, i)
    return _dequantize_rows(*buffers) if len(buffers) == 3 else buffers[0]


def masked_attention(query, k_cache, v_cache, start_pos, scaling, sliding_window=None, softcap=None):
    """Exact attention over a linear cache with an explicit position mask.

    Query ``[1, H, S, D]``, caches ``[1, L, Hkv, D]``. Key ``k`` is visible from query
    position ``q`` when ``k <= q`` and, with a window ``W``, ``k > q - W`` (the rule
    transformers uses).
    """
    length = k_cache.shape[1]
    q_pos = (torch.arange(query.shape[2]) + start_pos).view(-1, 1)
    k_pos = torch.arange(length).view(1, length)
    visible = k_pos <= q_pos
    if sliding_window:
        visible = visible & (k_pos > q_pos - sliding_window)
    return _grouped_attention(query, [(k_cache, v_cache, visible)], scaling, softcap)


def slot_positions(layer: LayerCache, start_pos) -> torch.Tensor:
    """The position each slot of a ring layer holds before position ``start_pos`` is written (-1: empty)."""
    slots = torch.arange(layer.slots)
    ring = slots - layer.sink
    last = start_pos - 1 - layer.sink - ring  # how far the newest position of this slot's residue class lies
    in_ring = torch.where(
        last >= 0, layer.sink + ring + torch.div(last, layer.ring_slots, rounding_mode="floor") * layer.ring_slots, -1
    )
    in_sink = torch.where(slots < start_pos, slots, -1)
    return torch.where(slots < layer.sink, in_sink, in_ring)


def _visible(layer: LayerCache, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    visible = (k_pos >= 0) & (k_pos <= q_pos)
    if layer.window is not None:
        near = q_pos - k_pos < layer.window
        visible = visible & ((k_pos < layer.sink) | near) if layer.sink else visible & near
    return visible


def _ring_attention(cache: KVCache, i: int, layer: LayerCache, query, key, value, start_pos, scaling, softcap):
    """Attention over the ring as it was before this chunk plus the chunk itself, then the chunk written."""
    seq = query.shape[2]
    q_pos = (torch.arange(seq) + start_pos).view(-1, 1)
    chunk_pos = (torch.arange(seq) + start_pos).view(1, -1)
    new_k, new_v = key.transpose(1, 2), value.transpose(1, 2)  # [1, S, Hkv, D]
    int8 = cache.layout.dtype == "int8"
    if int8:  # the chunk is seen as the cache will hold it, so chunking does not change the result
        quantized = {"k": _quantize_rows(new_k), "v": _quantize_rows(new_v)}
        new_k, new_v = (_dequantize_rows(*quantized[kind]) for kind in ("k", "v"))
    parts = [
        (
            _full(cache, "k", i),
            _full(cache, "v", i),
            _visible(layer, q_pos, slot_positions(layer, start_pos).view(1, -1)),
        ),
        (new_k, new_v, _visible(layer, q_pos, chunk_pos)),
    ]
    output = _grouped_attention(query, parts, scaling, softcap)
    # Write after reading. A chunk longer than the ring writes one slot twice; the op
    # writes in order, so the later position stays, as it must.
    indices = torch.where(
        chunk_pos < layer.sink, chunk_pos, layer.sink + torch.remainder(chunk_pos - layer.sink, layer.ring_slots)
    )
    for kind, rows in (("k", key.transpose(1, 2)), ("v", value.transpose(1, 2))):
        parts_to_write = quantized[kind] if int8 else (rows,)
        for part, buffer in zip(parts_to_write, cache.values(kind, i), strict=False):
            torch.ops.llama.update_cache_with_indices(part, buffer, 0, indices)
    return output


def _grouped_attention(query, parts, scaling, softcap):
    """Softmax attention of ``query`` ``[1, H, S, D]`` over key/value blocks ``[1, L, Hkv, D]`` with
    boolean visibility ``[S, L]`` each, under one softmax.

    Grouped-query attention without ``repeat_kv``: each KV head's query group is folded
    into rows, and the mask is broadcast over the group rather than repeated (a long
    prefill's scores are the largest tensors of the whole program).
    """
    _, heads, seq, dim = query.shape
    kv_heads = parts[0][0].shape[2]
    groups = heads // kv_heads
    q = query.contiguous().view(1, kv_heads, groups * seq, dim)
    scale = scaling if scaling is not None else dim**-0.5
    scores = []
    for k, _, _ in parts:
        score = torch.matmul(q, k.transpose(1, 2).transpose(2, 3)) * scale
        if softcap:
            score = torch.tanh(score / softcap) * softcap
        scores.append(score)
    score = scores[0] if len(scores) == 1 else torch.cat(scores, -1)
    bias = torch.where(torch.cat([visible for *_, visible in parts], -1), 0.0, float("-inf"))
    score = score.view(1, kv_heads, groups, seq, -1) + bias
    weights = torch.softmax(score, dim=-1).view(1, kv_heads, groups * seq, -1)
    output, offset = None, 0
    for k, v, _ in parts:
        length = k.shape[1]
        block = torch.matmul(weights[..., offset : offset + length], v.transpose(1, 2))
        output = block if output is None else output + block
        offset += length
    return output.reshape(1, heads, seq, dim).transpose(1, 2).contiguous()
