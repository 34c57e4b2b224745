"""``hub-export push``: export (or take an export) and publish it to a Hub repo in one commit."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.hub.card import human_size
from hub_export.hub.push import push
from hub_export.options import ExportOptions
from hub_export.pipeline.engines import engine as make_engine
from hub_export.quiet import quiet_torch


def _files_table(result) -> Table:
    table = Table(title=f"{result.repo_id}: files")
    for column in ("file", "size", "status"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for path, size in result.sizes.items():
        table.add_row(path, human_size(size), "unchanged" if path in result.unchanged else "upload")
    return table


@common.app.command(
    "push",
    epilog=(
        "Examples:\n\n"
        "  hub-export push HuggingFaceTB/SmolLM2-135M --qmode 8da4w --max-seq-len 256\n\n"
        "  hub-export push --from out alice/SmolLM2-135M-ExecuTorch --dry-run\n\n"
        "--revision is the source revision to export; --branch is the target branch."
    ),
)
@common.with_export_options("push", after="output")
def push_command(
    source: str | None = typer.Argument(None, help="Hub repo id or local model folder to export (omit with --from)."),
    repo_id: str | None = typer.Argument(None, help="Target repo (default: YOU/SOURCE-NAME-ExecuTorch)."),
    from_dir: Path | None = typer.Option(None, "--from", help="Push this export folder instead of exporting."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Keep the export in this folder (default: a temp folder)."
    ),
    branch: str | None = typer.Option(None, help="Target branch to push to (created from main if missing)."),
    private: bool = typer.Option(False, help="Create the repo private (new repos only)."),
    create_pr: bool = typer.Option(False, help="Open a pull request instead of committing to the branch."),
    dry_run: bool = typer.Option(False, help="Show the files that would be uploaded; create and upload nothing."),
    exist_ok: bool = typer.Option(False, help="Allow pushing into an existing repo not made by hub-export."),
    template: Path | None = typer.Option(None, help="Jinja2 template for the model card body."),
    source_card: Path | None = typer.Option(None, help="README.md of the source (license/language to inherit)."),
    force: bool = typer.Option(
        False, "--force", help="Rebuild even if the repo holds these variants built the same way."
    ),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
    ray: common.RayOption = False,
    ray_address: common.RayAddressOption = None,
    retries: common.RetriesOption = 2,
    options: ExportOptions = None,
):
    """Export (or take --from an export folder), write the model card and publish it all in one commit."""
    if from_dir is not None and source is not None and repo_id is None:
        source, repo_id = None, source  # `push --from DIR REPO_ID`
    if source is not None:
        quiet_torch()
    with (
        make_engine(ray and source is not None, ray_address if source is not None else None, retries) as engine,
        common.live_stages(f"pushing {source or from_dir}") as say,
    ):
        result = push(
            source,
            repo_id,
            options,
            from_dir=from_dir,
            output_dir=output,
            branch=branch,
            private=private,
            create_pr=create_pr,
            dry_run=dry_run,
            exist_ok=exist_ok,
            template=template,
            source_card=source_card,
            force=force,
            token=token,
            endpoint=endpoint,
            progress=say,
            engine=engine,
        )
    if dry_run:
        common.out.print(_files_table(result))
    for note in result.notes:
        common.err.print(f"[yellow]Note:[/yellow] {escape(note)}")
    common.out.print(escape(result.summary))
    if result.pushed or not dry_run:
        common.out.print(f"variants in {result.repo_id}: {', '.join(result.variants)}")
