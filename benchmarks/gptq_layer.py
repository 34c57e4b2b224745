"""Where one decoder layer's GPTQ time goes at real widths, and what its arithmetic saves over the plain one.

    python -m benchmarks.gptq_layer [--shapes 1.7b 4b] [--tokens 8192]

For each shape, one decoder layer of its real config (random weights) does what GPTQ does
to every layer of an export (``hub_export.pipeline.gptq.round_layerwise``): it runs the
calibration tokens in 512-token windows with the Hessian sums hooked onto its linears,
and rounds each group of linears that shares a Hessian. Timed apart, in the same run:

- the layer's forward pass alone, and the floor of its linears (their multiply-adds at the
  rate this machine multiplies a 4096-square float32 matrix);
- the Hessian sums as GPTQ takes them (the blocks on and above the diagonal) against the
  whole ``x.T @ x``, on the same inputs;
- GPTQ's update rows (the upper Cholesky factor of the inverse Hessian) as GPTQ takes them
  (one factorisation, one triangular inversion) against factorise, invert, factorise;
- each group's whole rounding (scales, update rows, columns).

Results: ``results/gptq-layer.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.report import write_results

WINDOW = 512


def _matmul_rate() -> float:
    """Float32 flops per second of one 4096-square matmul here, best of three."""
    import torch

    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(3))
    return 2 * 4096**3 / best


def _timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _layer(config):
    """Decoder layer 0 of ``config``'s causal LM with random weights, and its rotary embedding."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    layer = model.model.layers[0].to_empty(device="cpu").eval()
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            parameter.fill_(1.0) if "norm" in name else parameter.normal_(0, 0.02)
    return layer, type(model.model.rotary_emb)(config=config)


def _plain_factor(hessian):
    import torch

    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)


def measure(key: str, tokens: int) -> dict:
    import torch

    from benchmarks.scale import shapes
    from hub_export.pipeline import gptq

    name, make_config, _ = shapes()[key]
    config = make_config()
    config._attn_implementation = "sdpa"
    layer, rotary = _layer(config)
    windows = [torch.randn(1, WINDOW, config.hidden_size) for _ in range(tokens // WINDOW)]
    positions = torch.arange(WINDOW)[None]
    rope = rotary(windows[0], positions)
    run = lambda x: layer(x, position_embeddings=rope, attention_mask=None, position_ids=positions)  # noqa: E731
    linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    with torch.no_grad():
        forward = _timed(lambda: [run(x) for x in windows])
    sums, spent = gptq._HessianSums(linears), {"blocks": 0.0, "whole": 0.0}
    whole: dict[int, torch.Tensor] = {}
    add = gptq._GramSum.add

    def timed_add(gram, x):
        spent["blocks"] += _timed(lambda: add(gram, x))
        flat = x.detach().reshape(-1, x.shape[-1]).float()
        total = whole.setdefault(id(gram), torch.zeros(flat.shape[1], flat.shape[1]))
        spent["whole"] += _timed(lambda: total.addmm_(flat.T, flat))

    gptq._GramSum.add = timed_add
    try:
        with torch.no_grad(), sums.observing(layer):
            for x in windows:
                run(x)
    finally:
        gptq._GramSum.add = add
    groups = []
    for names in sums.sharing():
        hessian = sums.hessian(names[0])
        damped = hessian + gptq.DAMPING * hessian.diag().mean() * torch.eye(hessian.shape[0])
        weight = torch.cat([linears[n].weight for n in names])
        groups.append({
            "linears": [n.split(".")[-1] for n in names], "rows": weight.shape[0], "columns": weight.shape[1],
            "factor_s": round(_timed(lambda damped=damped: gptq._upper_inverse_cholesky(damped)), 2),
            "plain_factor_s": round(_timed(lambda damped=damped: _plain_factor(damped)), 2),
            "rounding_s": round(_timed(lambda w=weight, h=hessian: gptq.round_weight(w, h, 32)), 2),
        })  # fmt: skip
    multiply_adds = sum(m.in_features * m.out_features for m in linears.values()) * len(windows) * WINDOW
    return {
        "shape": name, "layers": config.num_hidden_layers, "tokens": len(windows) * WINDOW,
        "forward_s": round(forward, 2), "linears_floor_s": round(2 * multiply_adds / _matmul_rate(), 2),
        "hessian_blocks_s": round(spent["blocks"], 2), "hessian_whole_s": round(spent["whole"], 2),
        "groups": groups,
    }  # fmt: skip


def markdown(result: dict) -> str:
    lines = [
        "### GPTQ, one decoder layer at real widths: where the time goes",
        "",
        f"{result['machine']}; `{result['command']}`. Seconds for one layer; the last column multiplies the layer's "
        "forward, Hessian sums and rounding by the model's depth (GPTQ's calibration walk, without reading the "
        "layers from disk or the reference pass that shares it).",
        "",
        "| shape | tokens | forward (its linears' floor) | Hessian sums: blocks / whole | update rows: GPTQ's / plain "
        "| rounding, all groups | per layer | x depth |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        factor = sum(g["factor_s"] for g in row["groups"])
        plain = sum(g["plain_factor_s"] for g in row["groups"])
        rounding = sum(g["rounding_s"] for g in row["groups"])
        layer = row["forward_s"] + row["hessian_blocks_s"] + rounding
        lines.append(
            f"| {row['shape']} | {row['tokens']} | {row['forward_s']:.1f} s ({row['linears_floor_s']:.1f} s) "
            f"| {row['hessian_blocks_s']:.1f} s / {row['hessian_whole_s']:.1f} s | {factor:.1f} s / {plain:.1f} s "
            f"| {rounding:.1f} s | {layer:.1f} s | {layer * row['layers'] / 60:.1f} min ({row['layers']} layers) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:

    from hub_export.pipeline.manifest import machine_description

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["1.7b", "4b"], choices=["135m", "360m", "1.7b", "4b"])
    parser.add_argument("--tokens", type=int, default=8192, help="calibration tokens (GPTQ reads at most 8192 of text)")
    args = parser.parse_args(argv)
    rows = [measure(key, args.tokens) for key in args.shapes]
    command = "python -m benchmarks.gptq_layer " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"machine": machine_description(), "command": command.strip(), "rows": rows}
    write_results("gptq-layer", result, markdown(result))


if __name__ == "__main__":
    main()
