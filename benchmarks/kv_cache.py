"""What the KV cache choices cost and save: memory, decode speed, exactness past the window.

    python -m benchmarks.kv_cache            # make bench-kv

Two random-weight models with real widths and 6 layers (so exports take minutes; the
cache's share of a step is per layer, so the ratios hold for the full depth):

- SmolLM2-135M's shape (full attention everywhere): 8da4w with an fp32 and an int8 KV
  cache at ``max_seq_len`` 2048; decode speed at 256 and 2048 tokens of context;
- Gemma 3 270M's shape (5 sliding layers with a 512 window, 1 global layer): 8da4w with
  ``--sliding-cache ring`` and ``full`` (the exact mask over a full-length cache, before
  ring buffers), same contexts; and the fp32 ring file fed 2048 tokens (4x the window)
  against eager transformers, logits compared at every position.

Each file's runtime memory at full context is measured as the export measures it
(:func:`hub_export.runtime.pte.measure_memory`), and the cache bytes of the *full-depth* real
configs are computed from their layouts. Writes ``benchmarks/results/kv-cache.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.report import spread, write_results

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "kv-cache"
MAX_SEQ_LEN = 2048
CONTEXTS = (256, 2048)
DECODE_STEPS = 32
ROUNDS = 3
LAYERS = 6


def _model(name: str, config) -> Path:
    from hub_export.models.tiny import build_tiny_model

    folder = WORK / name
    if not (folder / "config.json").is_file():
        build_tiny_model(folder, config=config)
    return folder


def _export(model: Path, out: Path, **options) -> Path:
    from hub_export.pipeline.export import export

    if not (out / "manifest.json").is_file():
        started = time.perf_counter()
        export(str(model), out, verify=False, max_seq_len=MAX_SEQ_LEN, **options)
        print(f"  exported {out.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return next(out.glob("*.pte"))


def decode_speed(pte: Path, context: int) -> list[float]:
    """Decode tokens/s after ``context - DECODE_STEPS`` prefilled tokens, ROUNDS times (fresh load each)."""
    import torch

    from hub_export.runtime.pte import PteModel

    speeds = []
    for _ in range(ROUNDS):
        model = PteModel(pte)
        prefill = context - DECODE_STEPS
        model.forward(torch.arange(1, prefill + 1).view(1, -1) % 500 + 3, start_pos=0)
        started = time.perf_counter()
        for position in range(prefill, context):
            model.forward(torch.tensor([[position % 500 + 3]]), start_pos=position)
        speeds.append(DECODE_STEPS / (time.perf_counter() - started))
        del model
    return speeds


def exactness_past_window(model_dir: Path, pte: Path, tokens: int = MAX_SEQ_LEN) -> dict:
    """The fp32 ring file against eager transformers over ``tokens`` positions, teacher-forced."""
    import torch
    from transformers import AutoModelForCausalLM

    from hub_export.runtime.pte import PteModel

    torch.manual_seed(0)
    ids = torch.randint(3, 5000, (1, tokens))
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]
    pte_model = PteModel(pte)
    prefill = 64
    rows = [pte_model.forward(ids[:, :prefill], start_pos=0)]
    rows += [pte_model.forward(ids[:, p : p + 1], start_pos=p) for p in range(prefill, tokens)]
    worst, agree = 0.0, 0
    with torch.no_grad():
        for offset, row in enumerate(rows):
            expected = model.lm_head(hidden[prefill - 1 + offset])
            worst = max(worst, (row - expected).abs().max().item())
            agree += int(row.argmax() == expected.argmax())
    return {
        "positions": len(rows),
        "first_position": prefill - 1,
        "last_position": tokens - 1,
        "max_abs_logit_diff": worst,
        "top1_agreement": agree / len(rows),
    }


def full_depth_cache_bytes() -> list[dict]:
    """Cache bytes of the real configs at 8192 tokens, per layout."""
    from benchmarks.models import gemma3_270m_config, smollm2_135m_config
    from hub_export.tasks.text_generation.kv_cache import plan_layers

    rows = []
    for name, config in (("Gemma 3 270M", gemma3_270m_config()), ("SmolLM2-135M", smollm2_135m_config())):
        for sliding, dtype in (("full", "fp32"), ("ring", "fp32"), ("ring", "int8")):
            layout = plan_layers(config, 8192, sliding, dtype)
            rows.append(
                {
                    "model": name,
                    "sliding": sliding,
                    "dtype": dtype,
                    "max_seq_len": 8192,
                    "bytes": layout.bytes_at_full_context(),
                }
            )
    return rows


def run() -> dict:
    from benchmarks.models import gemma3_270m_config, smollm2_135m_config
    from hub_export.runtime.pte import measure_memory

    smollm = smollm2_135m_config()
    smollm.num_hidden_layers = LAYERS
    models = {"smollm2": _model("smollm2-6l", smollm), "gemma3": _model("gemma3-6l", gemma3_270m_config(LAYERS))}
    files = {
        ("smollm2", "kv fp32"): _export(models["smollm2"], WORK / "smollm2-fp32kv", qmodes=["8da4w"]),
        ("smollm2", "kv int8"): _export(models["smollm2"], WORK / "smollm2-int8kv", qmodes=["8da4w"], kv_cache="int8"),
        ("gemma3", "sliding full"): _export(
            models["gemma3"], WORK / "gemma3-full", qmodes=["8da4w"], sliding_cache="full"
        ),
        ("gemma3", "sliding ring"): _export(models["gemma3"], WORK / "gemma3-ring", qmodes=["8da4w"]),
    }
    rows = []
    for (model, cache), pte in files.items():
        manifest = json.loads((pte.parent / "manifest.json").read_text())
        layout = manifest["variants"][0]["kv_cache"]
        memory = measure_memory(pte)
        row = {
            "model": model,
            "cache": cache,
            "file_bytes": pte.stat().st_size,
            "kv_bytes": layout["bytes_at_full_context"],
            "peak_rss_bytes": memory and memory["peak_rss_bytes"],
        }
        for context in CONTEXTS:
            speeds = decode_speed(pte, context)
            row[f"decode_{context}"] = spread(speeds)
        print(f"  {model} {cache}: {row}", flush=True)
        rows.append(row)
    ring_fp32 = _export(models["gemma3"], WORK / "gemma3-ring-fp32", qmodes=["fp32"])
    exact = exactness_past_window(models["gemma3"], ring_fp32)
    print(f"  exactness: {exact}", flush=True)
    return {
        "layers": LAYERS,
        "max_seq_len": MAX_SEQ_LEN,
        "decode_steps": DECODE_STEPS,
        "rounds": ROUNDS,
        "rows": rows,
        "exactness": exact,
        "full_depth": full_depth_cache_bytes(),
    }


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f} MB"


def markdown(result: dict) -> str:
    from hub_export.pipeline.manifest import machine_description

    lines = [
        f"Random-weight models with real widths and {result['layers']} layers, 8da4w, `--max-seq-len "
        f"{result['max_seq_len']}`; decode tokens/s over {result['decode_steps']} steps after the context is "
        f"filled, median of {result['rounds']} fresh loads (range); memory: peak RSS growth of a process running the "
        f"file to full context. Machine: {machine_description()}. Command: `python -m benchmarks.kv_cache`.",
        "",
        "| model shape | cache | KV cache at 2048 | memory at full context | decode tok/s at 256 | decode tok/s at 2048 |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        cells = [
            f"{row[f'decode_{c}']['median']:.0f} ({row[f'decode_{c}']['min']:.0f}-{row[f'decode_{c}']['max']:.0f})"
            for c in CONTEXTS
        ]
        lines.append(
            f"| {row['model']} | {row['cache']} | {_mb(row['kv_bytes'])} | {_mb(row['peak_rss_bytes'])} | "
            f"{cells[0]} | {cells[1]} |"
        )
    exact = result["exactness"]
    lines += [
        "",
        f"Gemma 3 shape, fp32 weights, ring cache, teacher-forced over positions {exact['first_position']}-"
        f"{exact['last_position']} (4x the 512 window) against eager transformers: max abs logit difference "
        f"{exact['max_abs_logit_diff']:.2e}, top-1 agreement {exact['top1_agreement']:.1%}.",
        "",
        "KV cache of the full-depth configs at 8192 tokens (computed from the layouts):",
        "",
        "| model | sliding layers | values | bytes |",
        "|---|---|---|---|",
    ]
    for row in result["full_depth"]:
        lines.append(f"| {row['model']} | {row['sliding']} | {row['dtype']} | {_mb(row['bytes'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    result = run()
    write_results("kv-cache", result, markdown(result))


if __name__ == "__main__":
    main()
