"""The console entry point: the verbs mounted, one-line errors, exit codes from the error type."""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from hub_export.bug_log import as_bug
from hub_export.cli import (  # noqa: F401  (each registers its verb on the app)
    archs,
    batch,
    bench,
    card,
    classify,
    embed,
    export,
    fill_mask,
    generate,
    inspect,
    ls,
    pull,
    push,
    transcribe,
)
from hub_export.cli.common import app, err
from hub_export.errors import HubExportError, InputError, InternalError
from hub_export.quiet import quiet_libraries
from hub_export.redact import Redactor

HUB_EXTRA_MISSING = "the local Hub server is an optional part: pip install 'hub-export[hub]' (fastapi, uvicorn)"


def mount_hub(target: typer.Typer) -> None:
    """Add ``hub``: the local Hub server's commands, or, without the extra, one that says how to install them."""
    try:
        from hub_export.hub.localhub.cli import (
            app as server_app,  # needs the optional `hub` extra: imported only if present
        )
    except ImportError as error:
        if (error.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette"):
            raise

        @target.command(
            "hub",
            help=f"Run the local Hub server: {HUB_EXTRA_MISSING}.",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )
        def needs_the_extra(context: typer.Context) -> None:
            raise InputError(HUB_EXTRA_MISSING)

        return
    target.add_typer(server_app, name="hub", help="Run and administer the local Hub-compatible server (the hub extra).")


def _mount_subcommands() -> None:
    mount_hub(app)


def _is_usage_error(error: Exception) -> bool:
    """A click error (bad option, missing argument), from click or the copy typer vendors."""
    import click

    vendored = isinstance(error, typer.TyperException) and callable(getattr(error, "show", None))
    return isinstance(error, click.ClickException) or vendored


def main() -> None:
    """Console entry point: one-line errors, exit codes from the error type."""
    quiet_libraries()
    _mount_subcommands()
    try:
        # Without standalone mode click returns, rather than raises, the code of an Exit.
        code = app(standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code:
            if code == 130:  # typer turns Ctrl-C into this code without a word
                err.print("Interrupted.")
            sys.exit(code)
    except InternalError as error:
        err.print(f"[bold red]Internal error:[/bold red] {escape(str(error))}", soft_wrap=True)
        sys.exit(error.exit_code)
    except HubExportError as error:
        err.print(f"[bold red]Error:[/bold red] {escape(str(error))}", soft_wrap=True)
        sys.exit(error.exit_code)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("Interrupted.")
        sys.exit(130)
    except Exception as error:  # click usage errors and real bugs
        if _is_usage_error(error):
            error.show()  # click's "Usage: ... Error: No such option: --x (Possible options: ...)"
            sys.exit(error.exit_code)
        if os.environ.get("HUB_EXPORT_DEBUG"):
            raise
        bug = as_bug(error, "running " + " ".join(["hub-export", *sys.argv[1:2]]), _secrets_of_this_run())
        err.print(f"[bold red]Internal error:[/bold red] {escape(str(bug))}", soft_wrap=True)
        sys.exit(bug.exit_code)


def _secrets_of_this_run() -> Redactor:
    """A redactor for the tokens this command was given (``--token VALUE``, ``--token=VALUE``, ``HF_TOKEN``)."""
    args = sys.argv[1:]
    given = [value for flag, value in zip(args, args[1:], strict=False) if flag == "--token"]
    given += [arg.split("=", 1)[1] for arg in args if arg.startswith("--token=")]
    return Redactor(os.environ.get("HF_TOKEN"), *given)


if __name__ == "__main__":
    main()
