"""``hub-export card``: render an export folder's model card."""

from __future__ import annotations

from pathlib import Path

import typer

from hub_export.cli import common
from hub_export.hub.card import write_card
from hub_export.hub.source_card import remember_source_card


@common.app.command("card", epilog="Example:\n\n  hub-export card out/ --template my_card.md.j2")
def card_command(
    folder: Path = typer.Argument(..., help="An export folder (with manifest.json)."),
    template: Path | None = typer.Option(None, help="Jinja2 template for the card body."),
    source_card: Path | None = typer.Option(
        None, help="README.md of the source model: license/language to inherit (kept in the manifest)."
    ),
    repo_id: str | None = typer.Option(None, help="Repo the folder is published as (for the usage commands)."),
    endpoint: common.EndpointOption = None,
):
    """(Re-)render FOLDER/README.md from FOLDER/manifest.json."""
    data = remember_source_card(folder, source_card) if source_card else None
    path = write_card(folder, data, template, endpoint, repo_id=repo_id)
    common.out.print(f"Wrote {path}")
