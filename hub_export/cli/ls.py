"""``hub-export ls``: what a published repo holds, per variant."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.hub.card import task_of, variant_facts
from hub_export.hub.pull import list_variants


@common.app.command("ls", epilog="Example:\n\n  hub-export ls alice/SmolLM2-135M-ExecuTorch")
def ls_command(
    repo_id: str = typer.Argument(..., help="A Hub repo published by hub-export."),
    revision: str | None = typer.Option(None, help="Branch, tag or commit of the repo."),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """List the variants of a published repo: size, context, verification, speed."""
    manifest = list_variants(repo_id, endpoint=endpoint, token=token, revision=revision)
    table = Table(title=escape(f"{repo_id}  (from {manifest.source.get('id')})"))
    table.add_column("file", no_wrap=True)
    for column in ("size", "ctx", "memory"):  # memory: at full context
        table.add_column(column, justify="right", no_wrap=True)
    task = task_of(manifest)
    table.add_column("perplexity" if task.quality_legend is None else "quality vs fp32", min_width=8)
    table.add_column("verified vs eager", min_width=11)
    table.add_column("tok/s", justify="right", no_wrap=True)
    for variant in manifest.variants:
        facts = variant_facts(variant)
        decode = facts["decode_tps"]
        table.add_row(
            variant.file,
            facts["size"],
            escape(facts["context"].removesuffix(" tokens")),
            escape(facts["memory"].split(" (")[0]),
            escape(facts["quality"]),
            escape(facts["verification"].removesuffix(" vs eager")),
            "-" if decode == "n/a" else decode,
        )
    common.out.print(table)
    for variant in manifest.variants:
        facts = variant_facts(variant)
        if facts["adapter_files"]:
            common.out.print(f"{escape(variant.file)}: {escape(facts['adapter_files'])}")
        if facts["lookup"]:
            common.out.print(
                f"[dim]{escape(variant.file)}: several tokens per step with --lookup: {escape(facts['lookup'])}[/dim]"
            )
    qualities = [v.verification.quality for v in manifest.variants if v.verification.quality is not None]
    if qualities:
        common.out.print(
            f"[dim]perplexity: on {qualities[0].tokens} tokens of English text, through the .pte; "
            "in brackets, its ratio to the fp32 model's[/dim]"
        )
    if task.quality_legend is not None:
        common.out.print(f"[dim]quality vs fp32: {task.quality_legend}. ctx: most tokens a text may have[/dim]")
        return
    common.out.print(
        "[dim]ctx: tokens the cache holds; memory: resident memory of a process running the file to full "
        "context, measured at export (~: an estimate)[/dim]"
    )
    if manifest.machine:
        common.out.print(
            f"[dim]tok/s: decode speed of the ExecuTorch runner at export, on {escape(manifest.machine)}[/dim]"
        )
