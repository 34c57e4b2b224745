"""``hub-export archs``: the model families that export, and how."""

from __future__ import annotations

import typer
from rich.table import Table

from hub_export.cli import common
from hub_export.tasks.archs import FAMILIES, markdown_table


@common.app.command()
def archs(markdown: bool = typer.Option(False, help="Print the Markdown table used in the README.")):
    """Show the supported model families."""
    if markdown:
        typer.echo(markdown_table())
        return
    table = Table(title="Supported model families, by task")
    for column in ("task", "family", "model types", "cache", "status", "notes"):
        table.add_column(column)
    for family in FAMILIES:
        table.add_row(
            family.task, family.name, ", ".join(family.model_types), family.cache, family.status, family.notes
        )
    common.out.print(table)
