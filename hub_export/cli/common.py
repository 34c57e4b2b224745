"""What the verbs share: the Typer app, the consoles, the export options as flags, finding a ``.pte``."""

from __future__ import annotations

import functools
import inspect
import time
import typing
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hub_export.errors import InputError
from hub_export.hub.card import human_size, task_of
from hub_export.hub.pull import pull
from hub_export.options import ExportOptions, option_fields
from hub_export.pipeline.manifest import Manifest
from hub_export.quiet import quiet_torch
from hub_export.runtime.process_env import prepare_pte_process

ENDPOINT_HELP = "Hub endpoint (default: HF_ENDPOINT or huggingface.co)."


TOKEN_HELP = "Hub token (default: HF_TOKEN or the saved login)."


VARIANT_HELP = "Variant (qmode or file name) in a folder or repo."


TOKENIZER_HELP = "Folder with tokenizer.json (default: next to the .pte)."


app = typer.Typer(
    help="Export Hugging Face models (causal LMs, sentence encoders) to verified ExecuTorch .pte files and publish them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


err = Console(stderr=True, highlight=False)


out = Console(highlight=False)


@contextmanager
def live_stages(title: str):
    """Yield a progress callback that logs timed stages under a live spinner."""
    started = time.perf_counter()
    with err.status(title) as status:

        def say(message: str) -> None:
            err.print(f"[dim]{time.perf_counter() - started:7.1f}s[/dim]  {escape(message)}", soft_wrap=True)
            step = f"[{message.done}/{message.total}] " if getattr(message, "total", 0) else ""
            status.update(f"{step}{escape(message)} ...")

        yield say


def variants_table(manifest) -> Table:
    table = Table(title=f"{manifest.source.get('id')}  ->  ExecuTorch")
    for column in ("variant", "size", "verification", "time"):
        table.add_column(column, justify="left" if column in ("variant", "verification") else "right")
    for v in manifest.variants:
        table.add_row(v.file, human_size(v.total_bytes), v.verification.line(), f"{v.export_seconds:.0f} s")
    return table


def _cli_type(spec) -> Any:
    """The type typer shows for an option field: repeated options are lists, optional ones Optional."""
    hint = typing.get_type_hints(ExportOptions)[spec.name]
    if typing.get_origin(hint) is tuple:
        return list[typing.get_args(hint)[0]]
    return hint


def _cli_option(spec) -> Any:
    default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
    # Without declared flags typer names the option itself, and a boolean gets its --no- twin.
    return typer.Option(
        default, *spec.metadata["flags"], help=spec.metadata["help"], show_default=spec.metadata["show_default"]
    )


def with_export_options(command: str, after: str):
    """Give a command one CLI option per :class:`~hub_export.options.ExportOptions` field it takes.

    The options go after parameter ``after`` in the help; the command receives them as
    one validated ``options`` object. Adding a field to ExportOptions adds the flag here.
    """

    def decorate(function: Callable) -> Callable:
        own = [p for p in inspect.signature(function).parameters.values() if p.name != "options"]
        specs = list(option_fields(command))
        added = [
            inspect.Parameter(
                spec.name, inspect.Parameter.KEYWORD_ONLY, default=_cli_option(spec), annotation=_cli_type(spec)
            )
            for spec in specs
        ]
        cut = next(index for index, p in enumerate(own) if p.name == after) + 1
        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[:cut]] + added
        parameters += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[cut:]]
        hints = typing.get_type_hints(function)

        @functools.wraps(function)
        def command_with_options(**values: Any) -> Any:
            chosen = {spec.name: values.pop(spec.name) for spec in specs}
            return function(options=ExportOptions(**chosen), **values)

        del command_with_options.__wrapped__  # typer must see the new signature, not the function's
        command_with_options.__signature__ = inspect.Signature(parameters)
        command_with_options.__annotations__ = {p.name: hints.get(p.name, p.annotation) for p in parameters}
        return command_with_options

    return decorate


RAY_HELP = "Run on a Ray cluster: the one at --ray-address, else RAY_ADDRESS, else a Ray started for this run."


RAY_ADDRESS_HELP = "Ray cluster to run on (host:6379, ray://host:10001, auto); implies --ray."


RETRIES_HELP = "How many times a variant whose worker died (killed, out of memory, node lost) is built again."


# The options most verbs share, declared once (typer reads the Annotated metadata).
VariantOption = Annotated[str | None, typer.Option(help=VARIANT_HELP)]
EndpointOption = Annotated[str | None, typer.Option(help=ENDPOINT_HELP)]
TokenOption = Annotated[str | None, typer.Option(help=TOKEN_HELP, show_default=False)]
TokenizerOption = Annotated[Path | None, typer.Option(help=TOKENIZER_HELP)]
RayOption = Annotated[bool, typer.Option("--ray", help=RAY_HELP)]
RayAddressOption = Annotated[str | None, typer.Option(envvar="RAY_ADDRESS", help=RAY_ADDRESS_HELP, show_default=False)]
RetriesOption = Annotated[int, typer.Option(help=RETRIES_HELP)]


def _resolve_pte(target: Path, variant: str | None) -> tuple[Path, Path]:
    """(pte file, tokenizer folder) for a .pte path or an export folder."""
    if target.is_file():
        return target, target.parent
    if target.is_dir():
        manifest = Manifest.read(target)
        chosen = manifest.variant(variant) if variant else manifest.variants[0]
        return target / chosen.file, target
    raise InputError(f"{target} is not a .pte file or an export folder")


def task_of_folder(folder: Path) -> str | None:
    """The task the manifest in ``folder`` records, if there is one to read."""
    try:
        return task_of(Manifest.read(folder)).name
    except (OSError, ValueError):
        return None


def locate_pte(target: str, variant: str | None, endpoint: str | None, token: str | None) -> tuple[Path, Path]:
    """(pte file, tokenizer folder) for a .pte, an export folder, or a Hub repo (pulled first)."""
    path = Path(target)
    if path.exists():
        return _resolve_pte(path, variant)
    return _resolve_pte(pull(target, variant=variant, endpoint=endpoint, token=token), variant)


def locate_draft(target: str, draft: str | None, endpoint: str | None, token: str | None) -> str | None:
    """``--draft``: a ``.pte`` path as given; a variant name beside a single ``.pte`` as given (the library looks
    beside the file); a variant of the folder or repo ``target`` names, located (and downloaded) like ``target``."""
    if draft is None or draft.endswith(".pte") or target.endswith(".pte"):
        return draft
    return str(locate_pte(target, draft, endpoint, token)[0])


def open_pte(target: str, variant: str | None, endpoint: str | None, token: str | None) -> tuple[Path, Path]:
    """Ready this process to run a ``.pte`` (ExecuTorch's threads, quiet frameworks) and find it: (the file, its
    folder)."""
    prepare_pte_process()
    quiet_torch()
    return locate_pte(target, variant, endpoint, token)
