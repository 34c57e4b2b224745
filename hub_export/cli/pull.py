"""``hub-export pull``: one variant of a repo, downloaded and checked."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from hub_export.cli import common
from hub_export.hub.pull import pull


@common.app.command(
    "pull", epilog="Example:\n\n  hub-export pull alice/SmolLM2-135M-ExecuTorch --variant 8da4w -o smollm2"
)
def pull_command(
    repo_id: str = typer.Argument(..., help="A Hub repo published by hub-export."),
    variant: str | None = typer.Option(None, help="Variant (qmode or file name); default: the first one."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Folder to download to (default: the HF cache)."),
    revision: str | None = typer.Option(None, help="Branch, tag or commit of the repo."),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Download one variant with its tokenizer and manifest, and check its sha256."""
    folder = pull(repo_id, variant=variant, output_dir=output, endpoint=endpoint, token=token, revision=revision)
    names = sorted(p.name for p in folder.iterdir() if p.is_file() or p.is_symlink())
    common.err.print(f"[dim]{escape(', '.join(names))}[/dim]")
    common.out.print(str(folder))
