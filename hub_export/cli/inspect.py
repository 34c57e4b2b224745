"""``hub-export inspect``: what is inside a ``.pte`` without running it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.hub.card import human_size, memory_facts
from hub_export.pipeline.manifest import Manifest, Variant
from hub_export.quiet import quiet_torch


@common.app.command("inspect", epilog="Example:\n\n  hub-export inspect out/ --variant 8da4w")
def inspect_command(
    target: str = typer.Argument(..., help="A .pte file, an export folder, or a Hub repo made by hub-export."),
    variant: common.VariantOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print everything as one JSON object."),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Show what is inside a .pte without running it: methods, inputs, XNNPACK partitions, operators outside them,
    metadata, size by part, and the manifest's verification."""
    import dataclasses

    from hub_export.runtime.inspection import (  # ExecuTorch: loaded when a file is inspected
        delegation_line,
        inspect_pte,
    )

    quiet_torch()
    pte, folder = common.locate_pte(target, variant, endpoint, token)
    summary = inspect_pte(pte)
    recorded = _manifest_variant(Path(folder), pte.name)
    checked = recorded.verification.line() if recorded else None
    cache = memory_facts(recorded) if recorded and recorded.kv_cache else None
    if as_json:
        extra = {"verification": checked, "kv_cache": recorded.kv_cache if recorded else None,
                 "delegation_at_export": recorded.delegation if recorded else None}  # fmt: skip
        typer.echo(json.dumps({**dataclasses.asdict(summary), **extra}, default=str))
        return
    common.out.print(f"[bold]{escape(summary.file)}[/bold]  {human_size(summary.size_bytes)}  " + ", ".join(
        f"{part} {human_size(size)}" for part, size in summary.size_by_part.items()))  # fmt: skip
    table = Table(title="methods")
    for column in ("method", "inputs", "XNNPACK partitions", "operators outside XNNPACK (calls)"):
        table.add_column(column)
    for method in summary.methods:
        outside = ", ".join(f"{name.split('::')[-1]} {count}" for name, count in list(method.outside.items())[:8])
        table.add_row(method.name, escape(", ".join(method.inputs)), str(method.partitions), escape(outside or "-"))
    common.out.print(table)
    common.out.print(
        "metadata: " + escape(", ".join(f"{name}={value}" for name, value in sorted(summary.metadata.items())))
    )
    if cache:
        common.out.print(escape(f"KV cache: {cache['kv_cache']}; context {cache['context']}; memory at full context "
                         f"{cache['memory']}"))  # fmt: skip
    if checked:
        common.out.print(escape(f"manifest: {checked}"))
    if recorded and recorded.delegation:
        common.out.print(escape(f"delegation recorded at export: {delegation_line(recorded.delegation)}"))


def _manifest_variant(folder: Path, file: str) -> Variant | None:
    """The manifest's record of ``file``, when the folder has a manifest that lists it."""
    try:
        manifest = Manifest.read(folder)
    except (OSError, ValueError):
        return None
    return next((v for v in manifest.variants if v.file == file), None)
