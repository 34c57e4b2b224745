"""``hub-export hub``: run the local Hub-compatible server and manage its accounts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hub_export.errors import HubExportError
from hub_export.hub.localhub.serving import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_MB,
    DEFAULT_MAX_LFS_GB,
    DEFAULT_PORT,
    default_root,
    serve,
)
from hub_export.hub.localhub.store import BLOB_MIN_AGE, LocalHubStore

app = typer.Typer(
    help="A local, persistent, Hugging Face Hub-compatible server (the offline default hub).",
    no_args_is_help=True,
    add_completion=False,
)

RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root", help="Where the hub keeps its data [default: $HUB_EXPORT_HUB_ROOT or ~/.cache/hub-export/localhub]."
    ),
]


def _fail(error: HubExportError) -> typer.Exit:
    typer.echo(f"Error: {error}", err=True)
    return typer.Exit(error.exit_code)


@app.command("serve")
def serve_command(
    root: RootOption = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = DEFAULT_PORT,
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help="Allow a non-loopback --host.")] = False,
    max_body_mb: Annotated[
        int, typer.Option("--max-body-mb", help="Largest request body read into memory (JSON, commits); 413 past it.")
    ] = DEFAULT_MAX_BODY_MB,
    max_lfs_gb: Annotated[
        int, typer.Option("--max-lfs-gb", help="Largest LFS file accepted (streamed to disk).")
    ] = DEFAULT_MAX_LFS_GB,
) -> None:
    """Serve the hub at ROOT until interrupted (Ctrl+C). Sweeps crash litter first (see `gc`)."""
    try:
        serve(
            root or default_root(),
            host,
            port,
            allow_remote=allow_remote,
            max_body_mb=max_body_mb,
            max_lfs_gb=max_lfs_gb,
        )
    except HubExportError as e:
        raise _fail(e) from None


@app.command("gc")
def gc_command(
    root: RootOption = None,
    min_age_hours: Annotated[
        float,
        typer.Option(
            "--min-age-hours",
            min=0,
            help="Spare blobs touched more recently than this: an upload may still be about to commit them.",
        ),
    ] = BLOB_MIN_AGE / 3600,
) -> None:
    """Remove upload temp files and blobs that no commit refers to (crash litter, deleted repos)."""
    try:
        result = LocalHubStore(root or default_root()).gc(min_age=min_age_hours * 3600)
    except HubExportError as e:
        raise _fail(e) from None
    typer.echo(str(result))


@app.command("add-user")
def add_user_command(
    name: Annotated[str, typer.Argument(help="User name (letters, digits, '.', '_', '-').")],
    org: Annotated[str | None, typer.Option("--org", help="Also create ORG and make the user a write member.")] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="Issue a read-only token.")] = False,
    root: RootOption = None,
) -> None:
    """Create a user (if new) and print a new token for it, alone on the last line."""
    hub_root = root or default_root()
    try:
        token = LocalHubStore(hub_root).add_user(name, org=org, read_only=read_only)
    except HubExportError as e:
        raise _fail(e) from None
    membership = f", write member of '{org}'" if org else ""
    typer.echo(f"User '{name}'{membership} in the local hub at {hub_root}.")
    typer.echo(f"New {'read-only' if read_only else 'write'} token (shown once; only its hash is stored):")
    typer.echo(token)
