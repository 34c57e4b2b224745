"""Attention formulations for the exported decoder, measured before any reaches hub_export.

    python -m benchmarks.attention_variants                      # stock, one-delegate, bshd; 10 layers
    python -m benchmarks.attention_variants --variants stock bshd --layers 30

A SmolLM2-135M-shaped model cut to ``--layers`` layers (random weights, 8da4w + 8-bit
embeddings, max_seq_len 256) is exported once per variant, each in a fresh process that
swaps the formulation in for the export only:

- ``stock``: hub_export as it is (transformers' attention module, ``[B, H, S, D]`` tensors,
  ``llama::update_cache`` then ``llama::custom_sdpa``: one XNNPACK partition per layer);
- ``one-delegate``: the cache in ``[Hkv, L, 1, D]`` layout read *before* the chunk is
  written (as the ring layers do), scores by ``bmm`` over the whole cache plus the chunk
  under one softmax, the chunk written after: nothing outside XNNPACK sits between a
  layer's projections and its attention, so the forward lowers to 3 partitions;
- ``dispatch``: one file, two attentions: ``torch.cond`` on the chunk length runs
  ``custom_sdpa`` for a one-token decode step and the XNNPACK matmul attention of
  :func:`hub_export.kv_cache.masked_attention` for a prefill chunk (the runner calls one
  method for both). It does not lower on executorch 1.5.1: with ``start_pos`` as a branch
  operand ExecuTorch's pass replay fails ("did not preserve symbolic metadata"), and with the
  position as a tensor read inside each branch the replay finds unbacked symbols the branch
  does not return (``PendingUnbackedSymbolNotFound``). Kept to rerun on a newer stack;
  ``--export-one dispatch --layers 2`` shows the error in a minute;
- ``bshd``: the stock kernels, but the attention block keeps ``[B, S, H, D]`` from the
  projections through rotary embedding, the cache write and ``custom_sdpa`` (the layout
  those two operators take), so none of the transposes around them remain;
- ``stock-norm`` / ``stock-rotary``: hub_export without its XNNPACK-friendly RMSNorm
  (transformers' own, whose ``mean`` stays outside XNNPACK) / without its rotate-half
  product (the slice-and-concat, outside XNNPACK), as optimum-executorch exports them;
- ``split``: stock, but each layer's input passes through a ``select`` XNNPACK does not
  take, so a layer's partition ends after its MLP and a short one (norm, q/k/v, rotary)
  runs right before ``update_cache`` and ``custom_sdpa``, as in optimum-executorch's file;
- ``peer``: the same weights (saved once) exported by optimum-executorch
  (``benchmarks.peer``'s venv and flags): the bar, on the same small model.

Each file's logits are checked against the eager wrapper it was exported from (a 20-token
prefill, then one decode step), then the files are timed alternately, a fresh process per
round: a 60-token prefill (after one untimed) and the median of 63 decode steps.
Prints a table. An experiment, not a test.
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
VARIANTS = ("stock", "dispatch", "one-delegate", "bshd", "stock-norm", "stock-rotary", "split", "peer")
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != "dispatch")  # dispatch does not lower on executorch 1.5.1


def _one_delegate() -> None:
    import torch

    from hub_export import kv_cache

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

    from hub_export import kv_cache

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


def _bshd() -> None:
    import torch
    from transformers.models.llama import modeling_llama

    from hub_export import kv_cache

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        batch, seq, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, seq, -1, self.head_dim)
        cos, sin = (part.unsqueeze(2) for part in position_embeddings)
        q = q * cos + modeling_llama.rotate_half(q) * sin  # looked up at call time: the export's patch applies
        k = k * cos + modeling_llama.rotate_half(k) * sin
        kv, i, start_pos = kv_cache.current_cache(), self.layer_idx, kv_cache.current_start_pos()
        k_cache, v_cache = kv.values("k", i)[0], kv.values("v", i)[0]
        torch.ops.llama.update_cache(k, k_cache, start_pos)
        torch.ops.llama.update_cache(v, v_cache, start_pos)
        out = torch.ops.llama.custom_sdpa(q, k_cache, v_cache, start_pos, None, 0.0, True, self.scaling)
        return self.o_proj(out.reshape(batch, seq, -1)), None

    modeling_llama.LlamaAttention.forward = forward


def _split() -> None:
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaDecoderLayer.forward

    def forward(self, hidden_states, *args, **kwargs):
        return original(self, hidden_states.unsqueeze(0)[0], *args, **kwargs)  # select_copy: outside XNNPACK

    modeling_llama.LlamaDecoderLayer.forward = forward


def _without(patch_name: str) -> None:
    import contextlib

    from hub_export import wrap

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
    from hub_export import quantize
    from hub_export.lower import runner_metadata, to_pte
    from hub_export.runtime import PteModel
    from hub_export.wrap import ExportableDecoder, export_program

    if variant == "peer":
        return export_peer(layers)
    {
        "one-delegate": _one_delegate,
        "dispatch": _dispatch,
        "bshd": _bshd,
        "stock-norm": lambda: _without("delegable_norms"),
        "stock-rotary": lambda: _without("delegable_rotary"),
        "split": _split,
    }.get(variant, lambda: None)()
    config = smollm2_135m_config()
    model = _model(layers)
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
    parser.add_argument("--export-one", help=argparse.SUPPRESS)  # internal: the per-variant process
    args = parser.parse_args()
    if args.export_one:
        print(json.dumps(export_variant(args.export_one, args.layers)))
        return
    records = {}
    for variant in args.variants:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.attention_variants",
                "--export-one",
                variant,
                "--layers",
                str(args.layers),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        records[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    from benchmarks.decode_floor import measure

    timing = measure({name: (Path(record["pte"]), "file") for name, record in records.items()}, args.rounds)
    print(f"{args.layers} layers, SmolLM2-135M widths, 8da4w + 8-bit embeddings, {args.rounds} alternated rounds:\n")
    print(
        "| variant | export + lower (s) | max abs diff vs eager | prefill 60 (ms) | decode step (ms), median (range) |"
    )
    print("|---|---|---|---|---|")
    for name, record in records.items():
        t = timing[name]
        print(
            f"| {name} | {record['export_seconds']:.0f} | {record['max_abs_diff_vs_eager']:.3f} | "
            f"{t['prefill_ms']['median']:.1f} | {t['decode_ms']['median']:.2f} ({t['decode_ms']['min']:.2f}-{t['decode_ms']['max']:.2f}) |"
        )


if __name__ == "__main__":
    main()
