"""``hub-export export``: a model to verified ``.pte`` variants in a folder."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from hub_export.cli import common
from hub_export.options import ExportOptions
from hub_export.pipeline.engines import engine as make_engine
from hub_export.pipeline.export import export as run_export
from hub_export.quiet import quiet_torch


@common.app.command(
    epilog=(
        "Examples:\n\n"
        "  hub-export export HuggingFaceTB/SmolLM2-135M -o smollm2 --qmode 8da4w --qembedding 8w --max-seq-len 256\n\n"
        "  hub-export export ./my-model -o out --qmode 8da4w --qmode fp32\n\n"
        "  hub-export export ./my-finetune -o out --base-model HuggingFaceTB/SmolLM2-135M-Instruct --license apache-2.0"
    )
)
@common.with_export_options("export", after="output")
def export(
    source: str = typer.Argument(..., help="Hub repo id (org/name) or a local model folder."),
    output: Path = typer.Option(
        ..., "-o", "--output", help="Folder to write the .pte files, tokenizer and manifest to."
    ),
    token: str | None = typer.Option(
        None, help="Hub token (default: HF_TOKEN or the saved login).", show_default=False
    ),
    endpoint: str | None = typer.Option(None, help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)."),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output folder."),
    ray: common.RayOption = False,
    ray_address: common.RayAddressOption = None,
    retries: common.RetriesOption = 2,
    options: ExportOptions = None,
):
    """Export a model (a causal LM, a sentence encoder) to verified ExecuTorch .pte variants (one per --qmode)."""
    quiet_torch()
    started = time.perf_counter()
    with make_engine(ray, ray_address, retries) as engine, common.live_stages(f"exporting {source}") as say:
        manifest = run_export(
            source, output, options, token=token, endpoint=endpoint, overwrite=overwrite, progress=say, engine=engine
        )
    common.out.print(common.variants_table(manifest))
    common.out.print(f"Wrote {len(manifest.variants)} variant(s) to {output}/ in {time.perf_counter() - started:.0f} s")
