"""``hub-export fill-mask``: the words that fit each mask, from a ``.pte``."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.tasks.fill_mask.run import fill_mask as fill_masked


@common.app.command("fill-mask", epilog='Example:\n\n  hub-export fill-mask out/ "The capital of France is [MASK]."')
def fill_mask_command(
    target: str = typer.Argument(..., help="A fill-mask .pte, its export folder, or a Hub repo made by hub-export."),
    text: str = typer.Argument(
        ..., help="A text with one or more mask tokens ([MASK] or <mask>, as the model spells it)."
    ),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="Words to show for each mask."),
    variant: common.VariantOption = None,
    tokenizer: common.TokenizerOption = None,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Print the words a fill-mask file puts at each mask of a text, with their probabilities."""
    pte, tokenizer_dir = common.open_pte(target, variant, endpoint, token)
    result = fill_masked(pte, tokenizer or tokenizer_dir, text, top_k=top_k)
    table = Table(title=escape(f"{pte.name}: {text}"))
    for index in range(len(result.masks)):
        table.add_column(f"mask {index + 1}" if len(result.masks) > 1 else "word")
        table.add_column("p", justify="right")
    for row in range(top_k):
        cells = [
            cell for guesses in result.masks for cell in (escape(guesses[row].token), f"{guesses[row].probability:.3f}")
        ]
        table.add_row(*cells)
    common.out.print(table)
    common.err.print(f"[dim]{result.tokens} tokens, {result.seconds * 1000:.1f} ms[/dim]")
