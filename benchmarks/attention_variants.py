"""Attention formulations for the exported decoder, measured before any reaches hub_export.

    python -m benchmarks.attention_variants                      # every variant but dispatch; 10 layers
    python -m benchmarks.attention_variants --variants stock bshd --layers 30

A SmolLM2-135M-shaped model cut to ``--layers`` layers (random weights, 8da4w + 8-bit
embeddings, max_seq_len 256) is exported once per variant, each in a fresh process that
swaps the formulation in for the export only:

- ``stock``: hub_export as it is (transformers' attention module and rotary embedding,
  ``[B, H, S, D]`` tensors, ``llama::update_cache`` then ``llama::custom_sdpa``; the slices of
  ``rotate_half`` stay outside XNNPACK: two partitions per layer);
- ``one-delegate``: the cache in ``[Hkv, L, 1, D]`` layout read *before* the chunk is
  written (as the ring layers do), scores by ``bmm`` over the whole cache plus the chunk
  under one softmax, the chunk written after: nothing outside XNNPACK sits between a
  layer's projections and its attention, so the forward lowers to 3 partitions;
- ``dispatch``: one file, two attentions: ``torch.cond`` on the chunk length runs
  ``custom_sdpa`` for a one-token decode step and the XNNPACK matmul attention of
  :func:`hub_export.tasks.text_generation.kv_cache.masked_attention` for a prefill chunk (the runner calls one
  method for both). It does not lower on executorch 1.5.1: with ``start_pos`` as a branch
  operand ExecuTorch's pass replay fails ("did not preserve symbolic metadata"), and with the
  position as a tensor read inside each branch the replay finds unbacked symbols the branch
  does not return (``PendingUnbackedSymbolNotFound``). Kept to rerun on a newer stack;
  ``--export-one dispatch --layers 2`` shows the error in a minute;
- ``bshd``: the stock kernels, but the attention block keeps ``[B, S, H, D]`` from the
  projections through rotary embedding, the cache write and ``custom_sdpa`` (the layout
  those two operators take), so none of the transposes around them remain;
- ``stock-norm``: hub_export without its XNNPACK-friendly RMSNorm (transformers' own, whose
  ``mean`` stays outside XNNPACK, as optimum-executorch exports it);
- ``rotary-gemm``: ``rotate_half`` as a 64x64 product with a signed permutation, which XNNPACK
  takes, instead of the stock slice-and-concat whose slices it refuses at a dynamic length
  (hub_export exported this way before: one partition per layer, but two more small fp32
  GEMMs, each waking the thread pool);
- ``fused``: k/v and gate/up as one GEMM each and rotary embedding without any GEMM, the halves
  taken by masks and 4-D means so that every layer stays one partition;
- ``halves``: each head's two rotary halves from GEMMs of their own, rotated without a slice
  (one partition per layer; Llama-specific);
- ``qkv`` / ``qkv-mlp``: q/k/v (and gate/up) as one GEMM each, the outputs sliced outside
  XNNPACK;
- ``split``: stock, but each layer's input passes through a ``select`` XNNPACK does not
  take, so a layer's partition ends after its MLP and a short one (norm, q/k/v, rotary)
  runs right before ``update_cache`` and ``custom_sdpa``, as in optimum-executorch's file;
- ``peer``: the same weights (saved once) exported by optimum-executorch
  (``benchmarks.peer``'s venv and flags): the bar, on the same small model.

Each file's logits are checked against the eager wrapper it was exported from (a 20-token
prefill, then one decode step), then the files are timed: a 60-token prefill (after one
untimed) in alternated fresh processes, and decode steps of all files interleaved in one
process (:mod:`benchmarks.paired_decode`), the ratio to the first variant per process.
Writes ``benchmarks/results/attention-variants-<layers>l[-avx2].{json,md}``. An experiment, not a
test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "attention"
MAX_SEQ_LEN = 256
VARIANTS = (
    "stock",
    "dispatch",
    "one-delegate",
    "bshd",
    "stock-norm",
    "rotary-gemm",
    "split",
    "fused",
    "halves",
    "qkv",
    "qkv-mlp",
    "peer",
)
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != "dispatch")  # dispatch does not lower on executorch 1.5.1


def _one_delegate() -> None:
    import torch

    from hub_export.tasks.text_generation import kv_cache

    def init(self, layout, dtype=torch.float32):
        torch.nn.Module.__init__(self)
        self.layout = layout
        for i, layer in enumerate(layout.layers):
            for kind in ("k", "v"):
                self.register_buffer(
                    f"{kind}_{i}",
                    torch.zeros(layout.num_kv_heads, layer.slots, 1, layout.head_dim, dtype=dtype),
                    persistent=False,
                )

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states  # written by attend(), after the cache was read

    def attend(module, query, key, value, scaling, sliding_window=None, softcap=None):
        cache, i = kv_cache.current_cache(), module.layer_idx
        _, heads, seq, dim = query.shape
        k_cache, v_cache = getattr(cache, f"k_{i}"), getattr(cache, f"v_{i}")
        kv_heads, length = k_cache.shape[0], k_cache.shape[1]
        groups = heads // kv_heads
        start_pos = kv_cache.current_start_pos()
        q = query.contiguous().view(kv_heads, groups * seq, dim) * scaling
        k_new, v_new = key.view(kv_heads, seq, dim), value.view(kv_heads, seq, dim)
        from_cache = torch.bmm(k_cache.view(kv_heads, length, dim), q.transpose(1, 2)).transpose(1, 2)
        from_chunk = torch.bmm(q, k_new.transpose(1, 2))
        cache_bias = torch.where(torch.arange(length).view(1, -1) < start_pos, 0.0, float("-inf"))
        causal = torch.where(torch.arange(seq).view(1, -1) <= torch.arange(seq).view(-1, 1), 0.0, float("-inf"))
        weights = torch.softmax(
            torch.cat([from_cache + cache_bias, from_chunk + causal.repeat(groups, 1)], dim=2), dim=2
        )
        out = torch.bmm(weights, torch.cat([v_cache.view(kv_heads, length, dim), v_new], dim=1))
        for kind, rows in (("k", k_new), ("v", v_new)):
            torch.ops.llama.update_cache(rows.unsqueeze(2), getattr(cache, f"{kind}_{i}"), start_pos)
        return out.view(1, heads, seq, dim).transpose(1, 2).contiguous()

    kv_cache.KVCache.__init__ = init
    kv_cache.KVCache.update = update
    kv_cache.attend = attend


def _dispatch() -> None:
    import torch

    from hub_export.tasks.text_generation import kv_cache

    stock = kv_cache.attend

    def attend(module, query, key, value, scaling, sliding_window=None, softcap=None):
        cache, i = kv_cache.current_cache(), module.layer_idx
        layer = cache.layout.layers[i]
        if layer.ring or layer.window or softcap or cache.layout.dtype != "fp32":
            return stock(module, query, key, value, scaling, sliding_window, softcap)
        start_pos = kv_cache.current_start_pos()

        # A SymInt operand does not survive ExecuTorch's pass replay of the branches: hand
        # the position over as a tensor and read it inside each branch.
        position = torch.scalar_tensor(start_pos, dtype=torch.long)

        def read(position):
            pos = position.item()
            torch._check(pos >= 0)
            torch._check(pos < MAX_SEQ_LEN)
            return pos

        def one_token(query, key, value, position):
            return torch.ops.llama.custom_sdpa(
                query.transpose(1, 2), key, value, read(position), None, 0.0, True, scaling
            )

        def chunk(query, key, value, position):
            return kv_cache.masked_attention(query, key, value, read(position), scaling)

        return torch.cond(query.shape[2] == 1, one_token, chunk, (query, key, value, position))

    kv_cache.attend = attend


def _cached_attention(module, q, k, v):
    """Write ``k``/``v`` (``[1, S, H, D]``) into the layer's cache, then ``custom_sdpa`` over it: ``[1, S, Hq, D]``."""
    import torch

    from hub_export.tasks.text_generation import kv_cache

    store, i, start_pos = kv_cache.current_cache(), module.layer_idx, kv_cache.current_start_pos()
    k_cache, v_cache = store.values("k", i)[0], store.values("v", i)[0]
    torch.ops.llama.update_cache(k, k_cache, start_pos)
    torch.ops.llama.update_cache(v, v_cache, start_pos)
    return torch.ops.llama.custom_sdpa(q, k_cache, v_cache, start_pos, None, 0.0, True, module.scaling)


def _bshd() -> None:
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        batch, seq, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        cos, sin = (part.unsqueeze(2) for part in position_embeddings)
        q = q * cos + modeling_llama.rotate_half(q) * sin  # looked up at call time: a variant's swap applies
        k = k * cos + modeling_llama.rotate_half(k) * sin
        return self.o_proj(_cached_attention(self, q, k, v).reshape(batch, seq, -1)), None

    modeling_llama.LlamaAttention.forward = forward


def _split() -> None:
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaDecoderLayer.forward

    def forward(self, hidden_states, *args, **kwargs):
        return original(self, hidden_states.unsqueeze(0)[0], *args, **kwargs)  # select_copy: outside XNNPACK

    modeling_llama.LlamaDecoderLayer.forward = forward


def _linear(weight):
    """A bias-free ``nn.Linear`` holding ``weight`` (rows out, columns in)."""
    import torch

    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data.copy_(weight)
    return layer


def _fused():
    """Fewer thread-pool barriers: k/v and gate/up as one GEMM each, rotary without a GEMM.

    Every output row keeps its own weights and groups (quantization groups run along the
    input), only reordered: ``k_proj``/``v_proj`` rows interleaved into one ``kv_proj``,
    ``gate_proj``/``up_proj`` into one ``gate_up_proj``, and ``q``/``k`` rows of each head
    put in rotary pairs ``(i, i + D/2)``. XNNPACK refuses slices of tensors with a dynamic
    length, so each half is taken by a mask and a mean over the innermost pair (the 4-D
    mean XNNPACK takes), and rotary embedding is two pair-means against ``2(cos, -sin)``
    and ``2(sin, cos)``, exact in fp32 (a factor of 2, then a mean of two). Returns the
    model transform to run before quantization.
    """
    import torch
    from transformers.models.llama import modeling_llama

    def pair_mean(x: torch.Tensor, factors: torch.Tensor, width: int) -> torch.Tensor:
        # x * factors over (..., width, 2), then the mean of each innermost pair
        return (x * factors).view(1, -1, 1, 2).mean(dim=(2, 3), keepdim=True).view(1, -1, width)

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(dtype=torch.float)
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        first = (torch.stack((cos, -sin), dim=-1) * 2).unsqueeze(2)  # [1, S, 1, D/2, 2]
        second = (torch.stack((sin, cos), dim=-1) * 2).unsqueeze(2)
        return first, second

    def rotate(x: torch.Tensor, heads: int, dim: int, first, second) -> torch.Tensor:
        pairs = x.view(1, -1, heads, dim // 2, 2)
        low = pair_mean(pairs, first, heads * dim // 2).view(1, -1, heads, dim // 2)
        high = pair_mean(pairs, second, heads * dim // 2).view(1, -1, heads, dim // 2)
        return torch.cat((low, high), dim=-1)

    def take(x: torch.Tensor, which: int, width: int) -> torch.Tensor:
        mask = torch.tensor([2.0, 0.0] if which == 0 else [0.0, 2.0])
        return pair_mean(x.view(1, -1, width, 2), mask, width)

    def attention(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        heads, kv_heads, dim = self.config.num_attention_heads, self.config.num_key_value_heads, self.head_dim
        first, second = position_embeddings
        q = rotate(self.q_proj(hidden_states), heads, dim, first, second)
        kv = self.kv_proj(hidden_states)
        k = rotate(take(kv, 0, kv_heads * dim), kv_heads, dim, first, second)
        v = take(kv, 1, kv_heads * dim).view(1, -1, kv_heads, dim)
        return self.o_proj(_cached_attention(self, q, k, v).view(1, -1, heads * dim)), None

    def mlp(self, x):
        gate_up = self.gate_up_proj(x)
        gate, up = take(gate_up, 0, self.intermediate_size), take(gate_up, 1, self.intermediate_size)
        return self.down_proj(self.act_fn(gate) * up)

    modeling_llama.LlamaRotaryEmbedding.forward = rotary
    modeling_llama.LlamaAttention.forward = attention
    modeling_llama.LlamaMLP.forward = mlp

    def in_pairs(weight: torch.Tensor, dim: int) -> torch.Tensor:
        # each head's rows (i, i + D/2) next to each other
        heads = weight.shape[0] // dim
        return weight.view(heads, 2, dim // 2, -1).transpose(1, 2).reshape(weight.shape)

    def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack((a, b), dim=1).reshape(-1, a.shape[1])

    @torch.no_grad()
    def transform(model):
        for layer in model.model.layers:
            attn, ffn = layer.self_attn, layer.mlp
            dim = attn.head_dim
            attn.q_proj = _linear(in_pairs(attn.q_proj.weight, dim))
            attn.kv_proj = _linear(interleave(in_pairs(attn.k_proj.weight, dim), attn.v_proj.weight))
            del attn.k_proj, attn.v_proj
            ffn.gate_up_proj = _linear(interleave(ffn.gate_proj.weight, ffn.up_proj.weight))
            del ffn.gate_proj, ffn.up_proj
        return model

    return transform


def _halves():
    """Rotary embedding without ``rotate_half``: each head's two halves from GEMMs of their own.

    ``q_proj`` and ``k_proj`` become two linears each (the rows of every head's first and
    second half), so the rotation ``(lo cos - hi sin, hi cos + lo sin)`` needs neither a
    slice (refused by XNNPACK at a dynamic length) nor the rotate-half product; one
    partition per layer. Returns the model transform to run before quantization.
    """
    import torch
    from transformers.models.llama import modeling_llama

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(dtype=torch.float)
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        return cos.unsqueeze(2), sin.unsqueeze(2)  # [1, S, 1, D/2]

    def rotated(low_proj, high_proj, x, heads: int, half: int, cos, sin) -> torch.Tensor:
        low, high = low_proj(x).view(1, -1, heads, half), high_proj(x).view(1, -1, heads, half)
        return torch.cat((low * cos - high * sin, high * cos + low * sin), dim=-1)

    def attention(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        heads, kv_heads, dim = self.config.num_attention_heads, self.config.num_key_value_heads, self.head_dim
        cos, sin = position_embeddings
        q = rotated(self.q_low, self.q_high, hidden_states, heads, dim // 2, cos, sin)
        k = rotated(self.k_low, self.k_high, hidden_states, kv_heads, dim // 2, cos, sin)
        v = self.v_proj(hidden_states).view(1, -1, kv_heads, dim)
        return self.o_proj(_cached_attention(self, q, k, v).view(1, -1, heads * dim)), None

    modeling_llama.LlamaRotaryEmbedding.forward = rotary
    modeling_llama.LlamaAttention.forward = attention

    @torch.no_grad()
    def transform(model):
        for layer in model.model.layers:
            attn = layer.self_attn
            dim = attn.head_dim
            for name in ("q", "k"):
                weight = getattr(attn, f"{name}_proj").weight
                heads = weight.shape[0] // dim
                halves = weight.view(heads, 2, dim // 2, -1)
                setattr(attn, f"{name}_low", _linear(halves[:, 0].reshape(-1, weight.shape[1])))
                setattr(attn, f"{name}_high", _linear(halves[:, 1].reshape(-1, weight.shape[1])))
                delattr(attn, f"{name}_proj")
        return model

    return transform


def _shared_input(groups: tuple[tuple[str, ...], ...]):
    """Projections of one input as one GEMM each.

    Each group (``q/k/v``, ``gate/up``) becomes one linear over the rows of all (every row
    keeps its weights and quantization groups); the first projection called computes it, the
    others take their slice of that output. The slices stay outside XNNPACK, like the rotary
    slices. Returns the model transform to run before quantization.
    """
    import torch

    class Fused(torch.nn.Module):
        def __init__(self, linears):
            super().__init__()
            weight = torch.cat([linear.weight for linear in linears])
            self.linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            self.linear.weight.data.copy_(weight)
            self.sizes = [linear.out_features for linear in linears]
            self.seen, self.parts = None, None

        def part(self, x, index):
            if self.seen is not x:
                self.seen, self.parts = x, self.linear(x).split(self.sizes, dim=-1)
            return self.parts[index]

    class Part(torch.nn.Module):
        def __init__(self, fused, index):
            super().__init__()
            object.__setattr__(self, "fused", fused)  # owned by the parent module, not registered twice
            self.index = index

        def forward(self, x):
            return self.fused.part(x, self.index)

    @torch.no_grad()
    def transform(model):
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for names in groups:
                    if not all(hasattr(parent, name) for name in names):
                        continue
                    fused = Fused([getattr(parent, name) for name in names])
                    parent.fused_projections = fused
                    for index, name in enumerate(names):
                        setattr(parent, name, Part(fused, index))
        return model

    return transform


def _rotary_gemm():
    """``rotate_half`` as a product with a signed permutation (exact: one non-zero term per output), which
    XNNPACK takes, instead of the slice-and-concat it cannot take at a dynamic length. Returns the model
    transform that gives the model the permutation as a buffer (export sees a static parameter)."""
    import torch
    from transformers.models.llama import modeling_llama

    owner = {}

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        weight = getattr(owner["model"], f"rotate_half_weight_{x.shape[-1]}")
        flat = x.contiguous().view(-1, x.shape[-1])
        return torch.nn.functional.linear(flat, weight).view(x.shape)

    def transform(model):
        dim = model.config.head_dim
        half = dim // 2
        weight = torch.zeros(dim, dim)
        weight[:half, half:] = -torch.eye(half)
        weight[half:, :half] = torch.eye(half)
        model.register_buffer(f"rotate_half_weight_{dim}", weight, persistent=False)
        owner["model"] = model
        return model

    modeling_llama.rotate_half = rotate_half
    return transform


def _without(patch_name: str) -> None:
    import contextlib

    from hub_export.tasks.text_generation import export as wrap

    @contextlib.contextmanager
    def not_applied(*args, **kwargs):
        yield 0

    setattr(wrap, patch_name, not_applied)


def _model(layers: int):
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.models import smollm2_135m_config

    config = smollm2_135m_config()
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def export_peer(layers: int) -> dict:
    """The same weights through optimum-executorch's CLI (its own venv, ``benchmarks.peer``'s flags)."""
    import time

    from benchmarks.peer import MAX_SEQ_LEN as PEER_SEQ_LEN
    from benchmarks.peer import peer_command

    assert PEER_SEQ_LEN == MAX_SEQ_LEN
    source = WORK / f"source-{layers}l"
    if not (source / "config.json").is_file():
        _model(layers).save_pretrained(source)
    out = WORK / f"peer-{layers}l"
    if (out / "model.pte").is_file():  # the same weights and flags every time: export once
        return {
            "variant": "peer",
            "pte": str(out / "model.pte"),
            "export_seconds": float("nan"),
            "max_abs_diff_vs_eager": float("nan"),
        }
    started = time.perf_counter()
    subprocess.run(peer_command(source, "8da4w", out), check=True, capture_output=True)
    return {
        "variant": "peer",
        "pte": str(out / "model.pte"),
        "export_seconds": round(time.perf_counter() - started, 1),
        "max_abs_diff_vs_eager": float("nan"),
    }


def export_variant(variant: str, layers: int) -> dict:
    """In this process: swap ``variant`` in, export, lower, check against eager. Returns the record."""
    import time

    import torch

    from benchmarks.models import smollm2_135m_config
    from hub_export.pipeline import quantize
    from hub_export.pipeline.lower import runner_metadata, to_pte
    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.text_generation.export import ExportableDecoder, export_program

    if variant == "peer":
        return export_peer(layers)
    transform = {
        "one-delegate": _one_delegate,
        "dispatch": _dispatch,
        "bshd": _bshd,
        "stock-norm": lambda: _without("delegable_norms"),
        "rotary-gemm": _rotary_gemm,
        "split": _split,
        "fused": _fused,
        "halves": _halves,
        "qkv": lambda: _shared_input((("q_proj", "k_proj", "v_proj"),)),
        "qkv-mlp": lambda: _shared_input((("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))),
    }.get(variant, lambda: None)()
    config = smollm2_135m_config()
    model = _model(layers)
    if transform is not None:
        model = transform(model)
    quantize.quantize_model(model, "8da4w", "8w", 32)
    wrapped = ExportableDecoder(model, MAX_SEQ_LEN)
    prompt = torch.tensor([[(17 * i + 5) % 400 + 10 for i in range(20)]])
    with torch.no_grad():
        eager = [wrapped(prompt, torch.arange(20)), wrapped(torch.tensor([[7]]), torch.tensor([20]))]
    wrapped.cache.reset()
    started = time.perf_counter()
    program = export_program(wrapped)
    path = WORK / f"{variant}-{layers}l.pte"
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = runner_metadata(
        max_seq_len=MAX_SEQ_LEN, bos_id=1, eos_ids=[2], vocab_size=config.vocab_size, dynamic_shape=True
    )
    to_pte(program, metadata, path)
    seconds = time.perf_counter() - started
    pte = PteModel(path)
    exported = [pte.forward(prompt, 0), pte.forward(torch.tensor([[7]]), 20)]
    diff = max((a.reshape(-1) - b.reshape(-1)).abs().max().item() for a, b in zip(exported, eager, strict=False))
    return {"variant": variant, "pte": str(path), "export_seconds": round(seconds, 1), "max_abs_diff_vs_eager": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS))
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--isa", choices=["avx2"], help="Time every file on XNNPACK's kernels for this older CPU.")
    parser.add_argument("--export-one", help=argparse.SUPPRESS)  # internal: the per-variant process
    args = parser.parse_args()
    if args.export_one:
        print(json.dumps(export_variant(args.export_one, args.layers)))
        return
    from benchmarks import paired_decode
    from benchmarks.decode_floor import measure
    from benchmarks.report import machine_on_isa, write_results

    records = {}
    for variant in args.variants:
        command = [sys.executable, "-m", "benchmarks.attention_variants", "--export-one", variant]
        done = subprocess.run(
            [*command, "--layers", str(args.layers)], capture_output=True, text=True, check=True, cwd=ROOT
        )
        records[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    machine = machine_on_isa(args.isa)  # after the exports: they verify on this machine's own kernels
    timing = measure({name: (Path(record["pte"]), "file") for name, record in records.items()}, args.rounds)
    paired = paired_decode.measure([Path(record["pte"]) for record in records.values()], args.rounds)
    first = next(iter(records))
    command = (
        f"python -m benchmarks.attention_variants --variants {' '.join(args.variants)} --layers {args.layers} "
        f"--rounds {args.rounds}" + (f" --isa {args.isa}" if args.isa else "")
    )
    lines = [
        f"{args.layers} layers, SmolLM2-135M widths, random weights, 8da4w + 8-bit embeddings; prefill: "
        f"{args.rounds} alternated rounds of fresh processes; decode: {args.rounds} processes holding every "
        f"file, steps interleaved (`benchmarks.paired_decode`); {machine}; `{command}`:",
        "",
        "| variant | export + lower (s) | max abs diff vs eager | prefill 60 (ms) | decode step (ms), median (range) "
        f"| decode step vs {first} |",
        "|---|---|---|---|---|---|",
    ]
    for name, record in records.items():
        prefill, decode = timing[name]["prefill_ms"], paired[record["pte"]]
        step, ratio = decode["decode_ms"], decode["vs_first"]
        lines.append(
            f"| {name} | {record['export_seconds']:.0f} | {record['max_abs_diff_vs_eager']:.3f} | "
            f"{prefill['median']:.1f} | {step['median']:.2f} ({step['min']:.2f}-{step['max']:.2f}) | "
            f"{ratio['median']:.3f}x ({ratio['min']:.3f}-{ratio['max']:.3f}) |"
        )
    result = {"machine": machine, "command": command, "records": records, "prefill": timing, "decode": paired}
    name = f"attention-variants-{args.layers}l" + (f"-{args.isa}" if args.isa else "")
    write_results(name, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
