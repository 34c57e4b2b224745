"""Wrap: make a transformers decoder exportable with a static KV cache.

The wrapped module has the signature the ExecuTorch LLM runner calls,
``forward(input_ids[1, seq], cache_position[seq]) -> logits[1, 1, vocab]``, and routes
attention and cache writes through ExecuTorch's fused custom ops
(``llama::custom_sdpa`` and ``llama::update_cache``), which keep the cache in
``[batch, seq, heads, head_dim]`` layout and do causal masking from ``start_pos``
inside the kernel: no mask tensor, no whole-cache copies or transposes, no GQA
``repeat_kv``.

Only the last position's logits are returned: the runner samples from the last row
anyway, and skipping the vocabulary projection for every other prompt token makes
prefill cheaper.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch
from torch import nn

from .patches import delegable_norms, delegable_rotary, forget_compiled_globals

ATTENTION_NAME = "hub_export_custom_sdpa"

_state = threading.local()


def _load_custom_ops() -> None:
    # Importing registers llama::custom_sdpa / llama::update_cache with torch.
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


@dataclass(frozen=True)
class CacheSpec:
    """Shape of the KV cache for one model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int


def cache_spec(config, max_seq_len: int) -> CacheSpec:
    """Derive the cache shape from a transformers text config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return CacheSpec(config.num_hidden_layers, kv_heads, head_dim, max_seq_len)


def _current_start_pos():
    start_pos = getattr(_state, "start_pos", None)
    if start_pos is None:
        raise RuntimeError("custom_sdpa attention used outside of an ExportableDecoder forward")
    return start_pos


@contextlib.contextmanager
def _start_pos(value):
    # The attention function is called by transformers without the cache object, so
    # the position is handed over through a thread-local for the length of a forward.
    previous = getattr(_state, "start_pos", None)
    _state.start_pos = value
    try:
        yield
    finally:
        _state.start_pos = previous


class StaticKVCache(nn.Module):
    """Per-layer key/value buffers in ``[1, max_seq_len, kv_heads, head_dim]`` layout.

    Implements the one method transformers attention layers call on a cache,
    ``update``; the writes go through ``llama::update_cache`` so they lower to an
    in-place update in ExecuTorch instead of a full-cache copy.
    """

    def __init__(self, spec: CacheSpec, dtype: torch.dtype = torch.float32):
        super().__init__()
        shape = (1, spec.max_seq_len, spec.num_kv_heads, spec.head_dim)
        for i in range(spec.num_layers):
            self.register_buffer(f"k_{i}", torch.zeros(shape, dtype=dtype), persistent=False)
            self.register_buffer(f"v_{i}", torch.zeros(shape, dtype=dtype), persistent=False)
        self.num_layers = spec.num_layers

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        start_pos = _current_start_pos()
        k_cache = getattr(self, f"k_{layer_idx}")
        v_cache = getattr(self, f"v_{layer_idx}")
        # transformers hands [B, H, S, D]; the cache ops expect [B, S, H, D].
        torch.ops.llama.update_cache(key_states.transpose(1, 2), k_cache, start_pos)
        torch.ops.llama.update_cache(value_states.transpose(1, 2), v_cache, start_pos)
        return k_cache, v_cache

    def reset(self) -> None:
        for buffer in self.buffers():
            buffer.zero_()


def custom_sdpa_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None, **kwargs
):
    """transformers attention function backed by ``llama::custom_sdpa``.

    ``key``/``value`` are the full cache buffers returned by :class:`StaticKVCache`;
    the kernel reads positions ``[0, start_pos + seq)`` and applies the causal mask.
    Layers with a sliding window (that the cache can outgrow) or logit soft-capping,
    which the fused kernel cannot express, take :func:`masked_attention` instead.
    Returns ``[B, S, H, D]``, the layout transformers expects from attention.
    """
    start_pos = _current_start_pos()
    if softcap or (sliding_window and sliding_window < key.shape[1]):
        return masked_attention(query, key, value, start_pos, scaling, sliding_window, softcap), None
    output = torch.ops.llama.custom_sdpa(
        query.transpose(1, 2), key, value, start_pos, None, 0.0, True, scaling
    )
    return output, None


def masked_attention(query, k_cache, v_cache, start_pos, scaling, sliding_window=None, softcap=None):
    """Exact attention over the whole static cache with an explicit position mask.

    Query ``[1, H, S, D]``, caches ``[1, L, Hkv, D]``. Key ``k`` is visible from query
    position ``q`` when ``k <= q`` and, with a window ``W``, ``k > q - W`` (the rule
    transformers uses). The cache keeps every position, so decoding past the window
    stays exact; the cost is attention over ``max_seq_len`` slots on these layers.
    """
    _, heads, seq, dim = query.shape
    length, kv_heads = k_cache.shape[1], k_cache.shape[2]
    groups = heads // kv_heads
    # Grouped-query attention without repeat_kv: fold each KV head's query group into rows.
    q = query.contiguous().view(1, kv_heads, groups * seq, dim)
    k = k_cache.transpose(1, 2)
    v = v_cache.transpose(1, 2)
    scores = torch.matmul(q, k.transpose(2, 3)) * (scaling if scaling is not None else dim**-0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    q_pos = (torch.arange(seq) + start_pos).view(seq, 1)
    k_pos = torch.arange(length).view(1, length)
    visible = k_pos <= q_pos
    if sliding_window:
        visible = visible & (k_pos > q_pos - sliding_window)
    bias = torch.where(visible, 0.0, float("-inf")).repeat(groups, 1)
    weights = torch.softmax(scores + bias, dim=-1)
    output = torch.matmul(weights, v).reshape(1, heads, seq, dim)
    return output.transpose(1, 2).contiguous()


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


class ExportableDecoder(nn.Module):
    """A causal LM plus static KV cache with the ExecuTorch LLM runner's signature.

    Example:
        >>> wrapped = ExportableDecoder(model, max_seq_len=128)
        >>> logits = wrapped(torch.tensor([[1, 2, 3]]), torch.arange(3))
        >>> logits.shape  # last position only
        torch.Size([1, 1, 32000])
    """

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        register_attention()
        set_attention(model, ATTENTION_NAME)
        text_config = model.config.get_text_config()
        self.model = model
        self.max_seq_len = max_seq_len
        spec = cache_spec(text_config, max_seq_len)
        self.cache = StaticKVCache(spec, dtype=model.dtype)
        for dim in rotary_dims(text_config, spec.head_dim):
            self.register_buffer(f"rotate_half_weight_{dim}", rotate_half_weight(dim), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        start_pos = cache_position[0].item()
        torch._check(start_pos >= 0)
        torch._check(start_pos < self.max_seq_len)
        with _start_pos(start_pos):
            out = self.model(
                input_ids=input_ids,
                position_ids=cache_position.unsqueeze(0),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits


# RMSNorm classes that compute ``weight * x * rsqrt(mean(x^2) + eps)`` in fp32, the
# Llama formula. Gemma's ``(1 + weight)`` variant is deliberately absent.
def rotary_dims(config, head_dim: int) -> set[int]:
    """Widths ``rotate_half`` may see: the head, or its rotary part (partial rotary)."""
    rope = getattr(config, "rope_parameters", None) or {}
    factors = [
        getattr(config, "partial_rotary_factor", None),
        rope.get("partial_rotary_factor") if isinstance(rope, dict) else None,
        getattr(config, "rotary_pct", None),
    ]
    dims = {head_dim}
    dims.update(int(head_dim * f) for f in factors if f)
    return {d for d in dims if d > 0 and d % 2 == 0}


def rotate_half_weight(dim: int) -> torch.Tensor:
    """``W`` with ``linear(x, W) == cat(-x[..., d/2:], x[..., :d/2])``: a signed permutation."""
    half = dim // 2
    weight = torch.zeros(dim, dim)
    weight[:half, half:] = -torch.eye(half)
    weight[half:, :half] = torch.eye(half)
    return weight


def export_program(wrapped: ExportableDecoder) -> torch.export.ExportedProgram:
    """``torch.export`` the wrapper with a dynamic sequence length (parallel prefill).

    Strict export: non-strict breaks ``run_decompositions`` inside ExecuTorch's lowering.
    """
    max_prefill = wrapped.max_seq_len - 1
    example_len = min(2, max_prefill)
    example = (torch.zeros((1, example_len), dtype=torch.long), torch.arange(example_len))
    dynamic = None
    if max_prefill > 1:  # a one-token prefill is a static graph
        seq = torch.export.Dim("seq", min=1, max=max_prefill)
        dynamic = ({1: seq}, {0: seq})
    with torch.no_grad(), delegable_norms(wrapped.model), delegable_rotary(wrapped), forget_compiled_globals():
        program = torch.export.export(wrapped, example, dynamic_shapes=dynamic, strict=True)
    wrapped.cache.reset()
    return program


