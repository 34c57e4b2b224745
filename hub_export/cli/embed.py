"""``hub-export embed``: sentence vectors and their similarities from a ``.pte``."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.tasks.sentence_embeddings.run import embed as embed_texts


@common.app.command(
    epilog='Example:\n\n  hub-export embed out/ "A cat sat on the mat." "A kitten sat on the rug." "Stocks fell."'
)
def embed(
    target: str = typer.Argument(
        ..., help="A sentence-embedding .pte, its export folder, or a Hub repo made by hub-export."
    ),
    texts: list[str] = typer.Argument(..., help="The texts to embed (quote each one)."),
    variant: common.VariantOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print the vectors as a JSON list of lists, one per text."),
    tokenizer: common.TokenizerOption = None,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Embed texts with a sentence-embedding file and print their pairwise cosine similarities."""
    pte, tokenizer_dir = common.open_pte(target, variant, endpoint, token)
    result = embed_texts(pte, tokenizer or tokenizer_dir, texts)
    if as_json:
        typer.echo(json.dumps([[round(float(x), 7) for x in row] for row in result.vectors.tolist()]))
        return
    table = Table(title=f"cosine similarity ({pte.name}, {result.vectors.shape[1]} dimensions)")
    table.add_column("")
    for index in range(len(texts)):
        table.add_column(str(index + 1), justify="right")
    for index, text in enumerate(texts):
        shown = text if len(text) <= 48 else text[:45] + "..."
        table.add_row(
            f"{index + 1}. {escape(shown)}", *[f"{value:.3f}" for value in result.similarities[index].tolist()]
        )
    common.out.print(table)
    common.err.print(f"[dim]{len(texts)} texts, {sum(result.tokens)} tokens, {result.texts_per_s:.1f} texts/s[/dim]")
