"""``hub-export classify``: an image's most likely labels, from a ``.pte``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.tasks.image_classification.run import classify as classify_image


@common.app.command(epilog="Example:\n\n  hub-export classify out/ photo.jpg")
def classify(
    target: str = typer.Argument(
        ..., help="An image-classification .pte, its export folder, or a Hub repo made by hub-export."
    ),
    images: list[Path] = typer.Argument(..., help="Image files (PNG, JPEG, ...)."),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="Labels to show for each image."),
    variant: common.VariantOption = None,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Print the most likely labels of each image, with their probabilities."""
    pte, folder = common.open_pte(target, variant, endpoint, token)
    for image in images:
        result = classify_image(pte, folder, image, top_k=top_k)
        table = Table(title=escape(f"{image.name} ({pte.name}, {result.seconds * 1000:.1f} ms)"))
        table.add_column("label")
        table.add_column("p", justify="right")
        for label in result.labels:
            table.add_row(escape(label.label), f"{label.probability:.3f}")
        common.out.print(table)
