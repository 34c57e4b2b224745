"""The ``hub-export`` command line: thin over the library, one command per verb."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time
import typing
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .archs import FAMILIES, markdown_table
from .batch import fp32_weight_bytes, read_plan, run_batch, summary
from .bug_log import as_bug
from .card import human_size, memory_facts, remember_source_card, task_of, variant_facts, write_card
from .classify import classify as classify_image
from .embed import embed as embed_texts
from .engines import engine as make_engine
from .engines import variant_memory
from .errors import HubExportError, InputError, InternalError
from .export import export as run_export
from .fill_mask import fill_mask as fill_masked
from .generate import Sampling
from .generate import generate as run_generate
from .manifest import Manifest, Variant
from .options import ExportOptions, option_fields
from .process_env import XNNPACK_ISAS, prepare_pte_process
from .pull import list_variants, pull
from .push import push
from .quiet import quiet_libraries, quiet_torch
from .redact import Redactor
from .streaming import streams
from .tasks import TEXT_GENERATION
from .transcribe import transcribe as transcribe_audio

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
def _stages(title: str):
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


def _engine(ray: bool, ray_address: str | None, retries: int):
    return make_engine(ray, ray_address, retries)


@app.command(
    epilog=(
        "Examples:\n\n"
        "  hub-export export HuggingFaceTB/SmolLM2-135M -o smollm2 --qmode 8da4w --qembedding 8w --max-seq-len 256\n\n"
        "  hub-export export ./my-model -o out --qmode 8da4w --qmode fp32\n\n"
        "  hub-export export ./my-finetune -o out --base-model HuggingFaceTB/SmolLM2-135M-Instruct --license apache-2.0"
    )
)
@with_export_options("export", after="output")
def export(
    source: str = typer.Argument(..., help="Hub repo id (org/name) or a local model folder."),
    output: Path = typer.Option(
        ..., "-o", "--output", help="Folder to write the .pte files, tokenizer and manifest to."
    ),
    token: str | None = typer.Option(
        None, help="Hub token (default: HF_TOKEN or the saved login).", show_default=False
    ),
    endpoint: str | None = typer.Option(None, help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)."),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output folder."),
    ray: bool = typer.Option(False, "--ray", help=RAY_HELP),
    ray_address: str | None = typer.Option(None, envvar="RAY_ADDRESS", help=RAY_ADDRESS_HELP, show_default=False),
    retries: int = typer.Option(2, help=RETRIES_HELP),
    options: ExportOptions = None,
):
    """Export a model (a causal LM, a sentence encoder) to verified ExecuTorch .pte variants (one per --qmode)."""
    quiet_torch()
    started = time.perf_counter()
    with _engine(ray, ray_address, retries) as engine, _stages(f"exporting {source}") as say:
        manifest = run_export(
            source, output, options, token=token, endpoint=endpoint, overwrite=overwrite, progress=say, engine=engine
        )
    out.print(variants_table(manifest))
    out.print(f"Wrote {len(manifest.variants)} variant(s) to {output}/ in {time.perf_counter() - started:.0f} s")


def _resolve_pte(target: Path, variant: str | None) -> tuple[Path, Path]:
    """(pte file, tokenizer folder) for a .pte path or an export folder."""
    if target.is_file():
        return target, target.parent
    if target.is_dir():
        manifest = Manifest.read(target)
        chosen = manifest.variant(variant) if variant else manifest.variants[0]
        return target / chosen.file, target
    raise InputError(f"{target} is not a .pte file or an export folder")


def _task_of_folder(folder: Path) -> str | None:
    """The task the manifest in ``folder`` records, if there is one to read."""
    try:
        return task_of(Manifest.read(folder)).name
    except (OSError, ValueError):
        return None


def _locate_pte(target: str, variant: str | None, endpoint: str | None, token: str | None) -> tuple[Path, Path]:
    """(pte file, tokenizer folder) for a .pte, an export folder, or a Hub repo (pulled first)."""
    path = Path(target)
    if path.exists():
        return _resolve_pte(path, variant)
    return _resolve_pte(pull(target, variant=variant, endpoint=endpoint, token=token), variant)


# Over 60 lines: one typer option a line.
@app.command(
    epilog='Examples:\n\n  hub-export generate out/ --variant 8da4w --prompt "Once upon a time" --max-new-tokens 64\n\n'
    '  hub-export generate smolvlm-out/ --image photo.jpg --prompt "What is in this picture?"'
)
def generate(
    target: str = typer.Argument(..., help="A .pte file, an export folder, or a Hub repo made by hub-export."),
    prompt: str = typer.Option(
        ..., "--prompt", "-p", help="Your message (with --chat) or the text to continue (--no-chat)."
    ),
    tokenizer: Path | None = typer.Option(None, help=TOKENIZER_HELP),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    max_new_tokens: int = typer.Option(64, help="Tokens to generate at most."),
    chat: bool | None = typer.Option(
        None,
        "--chat/--no-chat",
        help="Send the prompt through the model's chat template (default: when it has one).",
        show_default=False,
    ),
    system: str | None = typer.Option(None, help="System message for the chat template."),
    image: list[Path] | None = typer.Option(
        None,
        "--image",
        "-i",
        help="An image for a vision-language file (PNG, JPEG, WebP); repeat for several, in order before the prompt.",
        show_default=False,
    ),
    threads: int | None = typer.Option(
        None, help="Threads the file runs on (default: ExecuTorch's, the performance cores).", show_default=False
    ),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="Go on past end-of-text tokens to --max-new-tokens (for timing)."
    ),
    temperature: float = typer.Option(0.0, help="Sampling temperature; 0 is greedy (the default)."),
    top_p: float = typer.Option(
        1.0, "--top-p", help="Nucleus sampling: keep the smallest set of tokens with this mass."
    ),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the k likeliest tokens; 0 is off."),
    repetition_penalty: float = typer.Option(1.0, help="Above 1 discourages repeating tokens (1.1-1.3 is typical)."),
    seed: int = typer.Option(0, help="Sampling seed."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Stream text from an exported model and report prefill/decode tokens/s."""
    prepare_pte_process()
    quiet_torch()
    pte, tokenizer_dir = _locate_pte(target, variant, endpoint, token)
    if _task_of_folder(Path(tokenizer_dir)) == "text2text-generation":
        from .text2text import generate_text  # torch and ExecuTorch: loaded when a file is run

        started = time.perf_counter()
        typer.echo(generate_text(pte, tokenizer or tokenizer_dir, prompt, max_new_tokens=max_new_tokens))
        err.print(f"[dim]greedy answer in {time.perf_counter() - started:.2f} s ({pte.name})[/dim]")
        return
    result = run_generate(
        pte,
        tokenizer or tokenizer_dir,
        prompt,
        max_new_tokens=max_new_tokens,
        sampling=Sampling(temperature, top_p, top_k, repetition_penalty, seed),
        chat=chat,
        system=system,
        images=image or None,
        threads=threads,
        ignore_eos=ignore_eos,
        on_text=lambda piece: (sys.stdout.write(piece), sys.stdout.flush()),
    )
    sys.stdout.write("\n")
    err.print(
        f"[dim]prompt {result.prompt_tokens} tok, prefill {result.prefill_tokens_per_s:.1f} tok/s; "
        f"generated {result.generated_tokens} tok, decode {result.decode_tokens_per_s:.1f} tok/s; "
        f"stop: {result.stop_reason}{'; chat template' if result.chat else ''}[/dim]"
    )


@app.command(
    epilog='Example:\n\n  hub-export embed out/ "A cat sat on the mat." "A kitten sat on the rug." "Stocks fell."'
)
def embed(
    target: str = typer.Argument(
        ..., help="A sentence-embedding .pte, its export folder, or a Hub repo made by hub-export."
    ),
    texts: list[str] = typer.Argument(..., help="The texts to embed (quote each one)."),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the vectors as a JSON list of lists, one per text."),
    tokenizer: Path | None = typer.Option(None, help=TOKENIZER_HELP),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Embed texts with a sentence-embedding file and print their pairwise cosine similarities."""
    prepare_pte_process()
    quiet_torch()
    pte, tokenizer_dir = _locate_pte(target, variant, endpoint, token)
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
    out.print(table)
    err.print(f"[dim]{len(texts)} texts, {sum(result.tokens)} tokens, {result.texts_per_s:.1f} texts/s[/dim]")


@app.command("fill-mask", epilog='Example:\n\n  hub-export fill-mask out/ "The capital of France is [MASK]."')
def fill_mask_command(
    target: str = typer.Argument(..., help="A fill-mask .pte, its export folder, or a Hub repo made by hub-export."),
    text: str = typer.Argument(
        ..., help="A text with one or more mask tokens ([MASK] or <mask>, as the model spells it)."
    ),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="Words to show for each mask."),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    tokenizer: Path | None = typer.Option(None, help=TOKENIZER_HELP),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Print the words a fill-mask file puts at each mask of a text, with their probabilities."""
    prepare_pte_process()
    quiet_torch()
    pte, tokenizer_dir = _locate_pte(target, variant, endpoint, token)
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
    out.print(table)
    err.print(f"[dim]{result.tokens} tokens, {result.seconds * 1000:.1f} ms[/dim]")


@app.command(epilog="Example:\n\n  hub-export classify out/ photo.jpg")
def classify(
    target: str = typer.Argument(
        ..., help="An image-classification .pte, its export folder, or a Hub repo made by hub-export."
    ),
    images: list[Path] = typer.Argument(..., help="Image files (PNG, JPEG, ...)."),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="Labels to show for each image."),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Print the most likely labels of each image, with their probabilities."""
    prepare_pte_process()
    quiet_torch()
    pte, folder = _locate_pte(target, variant, endpoint, token)
    for image in images:
        result = classify_image(pte, folder, image, top_k=top_k)
        table = Table(title=escape(f"{image.name} ({pte.name}, {result.seconds * 1000:.1f} ms)"))
        table.add_column("label")
        table.add_column("p", justify="right")
        for label in result.labels:
            table.add_row(escape(label.label), f"{label.probability:.3f}")
        out.print(table)


@app.command(epilog="Example:\n\n  hub-export transcribe out/ meeting.flac")
def transcribe(
    target: str = typer.Argument(..., help="A speech .pte, its export folder, or a Hub repo made by hub-export."),
    audio: list[Path] = typer.Argument(..., help="Audio files (wav, flac, ogg, mp3; any rate, mixed to mono)."),
    language: str | None = typer.Option(None, help="Spoken language, e.g. fr (multilingual models; default: en)."),
    translate: bool = typer.Option(False, "--translate", help="Translate into English (multilingual models)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Print timed segments: [start -> end] text."),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Print the text of each audio file, with the real-time factor."""
    prepare_pte_process()
    quiet_torch()
    pte, folder = _locate_pte(target, variant, endpoint, token)
    for path in audio:
        result = transcribe_audio(pte, folder, path, language=language, translate=translate, timestamps=timestamps)
        for segment in result.segments:
            typer.echo(f"[{segment.start:6.2f} -> {segment.end:6.2f}] {segment.text}")
        if not timestamps:
            typer.echo(result.text)
        err.print(
            f"[dim]{escape(path.name)}: {result.audio_seconds:.1f} s of audio in {result.seconds:.2f} s "
            f"(real-time factor {result.real_time_factor:.3f}, {pte.name})[/dim]"
        )


@app.command(
    epilog="Example:\n\n  hub-export bench out/ --variant 8da4w --prompt-tokens 128 --gen-tokens 128 --repeat 5"
)
def bench(
    target: str = typer.Argument(
        ..., help="A text-generation .pte, its export folder, or a Hub repo made by hub-export."
    ),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", min=1, help="Tokens of the prompt (prefill)."),
    gen_tokens: int = typer.Option(128, "--gen-tokens", min=1, help="Tokens generated after it (end of text ignored)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="Threads (default: the performance cores)."),
    repeat: int = typer.Option(3, "--repeat", min=1, max=50, help="Runs, each in a fresh process."),
    isa: str | None = typer.Option(
        None,
        "--isa",
        help="Run XNNPACK's kernels for an older x86 CPU on this one (avx2: no AVX-512, no VNNI), to see what a file "
        "does on such a laptop's code path.",
    ),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print every run's figures as JSON."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Measure prefill and decode tokens/s and peak memory of a .pte: median and range over fresh processes."""
    import dataclasses

    from .bench import bench as run_bench  # the ExecuTorch runtime: loaded when a file is run

    if isa is not None and isa not in XNNPACK_ISAS:  # before a repo is downloaded
        raise InputError(f"unknown --isa {isa!r}; choose one of: {', '.join(XNNPACK_ISAS)}")
    pte, _ = _locate_pte(target, variant, endpoint, token)
    result = run_bench(pte, prompt_tokens, gen_tokens, threads, repeat, isa=isa)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result)))
        return
    threads_used = result.runs[0].get("threads") or "default"
    kernels = f", XNNPACK's {isa} kernels" if isa else ""
    table = Table(title=escape(f"{pte.name}: {prompt_tokens} prompt + {gen_tokens} generated tokens, {threads_used} "
                                f"threads{kernels}, {repeat} runs"))  # fmt: skip
    for column in ("", "median", "min", "max"):
        table.add_column(column, justify="right")
    for name, label, scale in (("prefill_tokens_per_s", "prefill tok/s", 1), ("decode_tokens_per_s", "decode tok/s", 1),
                               ("peak_rss_bytes", "peak RSS MB", 1e6)):  # fmt: skip
        low, high = result.spread(name)
        table.add_row(label, f"{result.median(name) / scale:.1f}", f"{low / scale:.1f}", f"{high / scale:.1f}")
    out.print(table)


@app.command("inspect", epilog="Example:\n\n  hub-export inspect out/ --variant 8da4w")
def inspect_command(
    target: str = typer.Argument(..., help="A .pte file, an export folder, or a Hub repo made by hub-export."),
    variant: str | None = typer.Option(None, help=VARIANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print everything as one JSON object."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Show what is inside a .pte without running it: methods, inputs, XNNPACK partitions, operators outside them,
    metadata, size by part, and the manifest's verification."""
    import dataclasses

    from .inspection import delegation_line, inspect_pte  # ExecuTorch: loaded when a file is inspected

    quiet_torch()
    pte, folder = _locate_pte(target, variant, endpoint, token)
    summary = inspect_pte(pte)
    recorded = _manifest_variant(Path(folder), pte.name)
    checked = recorded.verification.line() if recorded else None
    cache = memory_facts(recorded) if recorded and recorded.kv_cache else None
    if as_json:
        extra = {"verification": checked, "kv_cache": recorded.kv_cache if recorded else None,
                 "delegation_at_export": recorded.delegation if recorded else None}  # fmt: skip
        typer.echo(json.dumps({**dataclasses.asdict(summary), **extra}, default=str))
        return
    out.print(f"[bold]{escape(summary.file)}[/bold]  {human_size(summary.size_bytes)}  " + ", ".join(
        f"{part} {human_size(size)}" for part, size in summary.size_by_part.items()))  # fmt: skip
    table = Table(title="methods")
    for column in ("method", "inputs", "XNNPACK partitions", "operators outside XNNPACK (calls)"):
        table.add_column(column)
    for method in summary.methods:
        outside = ", ".join(f"{name.split('::')[-1]} {count}" for name, count in list(method.outside.items())[:8])
        table.add_row(method.name, escape(", ".join(method.inputs)), str(method.partitions), escape(outside or "-"))
    out.print(table)
    out.print("metadata: " + escape(", ".join(f"{name}={value}" for name, value in sorted(summary.metadata.items()))))
    if cache:
        out.print(escape(f"KV cache: {cache['kv_cache']}; context {cache['context']}; memory at full context "
                         f"{cache['memory']}"))  # fmt: skip
    if checked:
        out.print(escape(f"manifest: {checked}"))
    if recorded and recorded.delegation:
        out.print(escape(f"delegation recorded at export: {delegation_line(recorded.delegation)}"))


def _manifest_variant(folder: Path, file: str) -> Variant | None:
    """The manifest's record of ``file``, when the folder has a manifest that lists it."""
    try:
        manifest = Manifest.read(folder)
    except (OSError, ValueError):
        return None
    return next((v for v in manifest.variants if v.file == file), None)


@app.command()
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
    out.print(table)


# -- publishing: push, ls, pull, card ---------------------------------------------------


def _files_table(result) -> Table:
    table = Table(title=f"{result.repo_id}: files")
    for column in ("file", "size", "status"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for path, size in result.sizes.items():
        table.add_row(path, human_size(size), "unchanged" if path in result.unchanged else "upload")
    return table


@app.command(
    "push",
    epilog=(
        "Examples:\n\n"
        "  hub-export push HuggingFaceTB/SmolLM2-135M --qmode 8da4w --max-seq-len 256\n\n"
        "  hub-export push --from out alice/SmolLM2-135M-ExecuTorch --dry-run\n\n"
        "--revision is the source revision to export; --branch is the target branch."
    ),
)
@with_export_options("push", after="output")
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
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
    ray: bool = typer.Option(False, "--ray", help=RAY_HELP),
    ray_address: str | None = typer.Option(None, envvar="RAY_ADDRESS", help=RAY_ADDRESS_HELP, show_default=False),
    retries: int = typer.Option(2, help=RETRIES_HELP),
    options: ExportOptions = None,
):
    """Export (or take --from an export folder), write the model card and publish it all in one commit."""
    if from_dir is not None and source is not None and repo_id is None:
        source, repo_id = None, source  # `push --from DIR REPO_ID`
    if source is not None:
        quiet_torch()
    with (
        _engine(ray and source is not None, ray_address if source is not None else None, retries) as engine,
        _stages(f"pushing {source or from_dir}") as say,
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
        out.print(_files_table(result))
    for note in result.notes:
        err.print(f"[yellow]Note:[/yellow] {escape(note)}")
    out.print(escape(result.summary))
    if result.pushed or not dry_run:
        out.print(f"variants in {result.repo_id}: {', '.join(result.variants)}")


def _jobs_table(states) -> Table:
    table = Table(title="batch")
    for column in ("repo", "variants", "state", "time", "detail"):
        table.add_column(
            column,
            justify="right" if column == "time" else "left",
            no_wrap=True,
            overflow="ellipsis",
            ratio=3 if column == "detail" else None,
        )
    colours = {"pushed": "green", "up to date": "green", "failed": "red", "cancelled": "yellow"}
    for state in states:
        colour = colours.get(state.state, "cyan")
        detail = state.error or state.detail
        if state.result is not None and state.result.commit_oid:
            detail = f"commit {state.result.commit_oid[:10]}"
        table.add_row(
            escape(state.job.repo_id),
            ", ".join(state.job.options.qmodes),
            f"[{colour}]{state.state}[/{colour}]",
            f"{state.seconds:.0f} s" if state.started else "",
            escape(detail),
        )
    return table


def _plan_table(jobs, engine_name: str, token: str | None, endpoint: str | None) -> Table:
    table = Table(title=f"plan: {len(jobs)} job(s), on {engine_name}")
    for column in ("repo", "source", "variants", "fp32 weights", "memory per variant"):
        table.add_column(
            column, justify="right" if "memory" in column or "weights" in column else "left", overflow="fold"
        )
    for job in jobs:
        weights = fp32_weight_bytes(job, token, endpoint)
        table.add_row(
            escape(job.repo_id),
            escape(job.source),
            escape(", ".join(job.options.qmodes)),
            human_size(weights) if weights else "unknown",
            human_size(variant_memory(weights, job.options.qmodes, streams(job.options, TEXT_GENERATION)))
            if weights
            else "unknown",
        )
    return table


@app.command(
    "batch",
    epilog=(
        "Example plan (keys are the export options' names):\n\n"
        "  defaults: {qmodes: [8da4w], max_seq_len: 256, qembedding: 8w}\n\n"
        "  jobs:\n\n"
        "    - {source: HuggingFaceTB/SmolLM2-135M, repo: me/SmolLM2-135M-ExecuTorch, qmodes: [8da4w, 8da8w]}\n\n"
        "Examples:\n\n"
        "  hub-export batch catalogue.yaml --dry-run\n\n"
        "  hub-export batch catalogue.yaml --ray-address 10.0.0.5:6379"
    ),
)
def batch_command(
    plan: Path = typer.Argument(..., help="YAML plan: defaults and a list of jobs (source, repo, options)."),
    dry_run: bool = typer.Option(False, help="Print the plan with each job's estimated memory; build nothing."),
    ray: bool = typer.Option(False, "--ray", help=RAY_HELP),
    ray_address: str | None = typer.Option(None, envvar="RAY_ADDRESS", help=RAY_ADDRESS_HELP, show_default=False),
    retries: int = typer.Option(2, help=RETRIES_HELP),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Export and push a catalogue: every job of PLAN, each repo in one commit, with a live table."""
    from rich.live import Live

    jobs = read_plan(plan)
    if dry_run:
        out.print(_plan_table(jobs, "Ray" if ray or ray_address else "this machine", token, endpoint))
        return
    quiet_torch()
    with _engine(ray, ray_address, retries) as engine:
        where = engine.describe() if hasattr(engine, "describe") else "this machine"
        err.print(f"[dim]{len(jobs)} job(s) on {escape(where)}[/dim]")
        started = time.perf_counter()
        with Live(_jobs_table([]), console=err, refresh_per_second=2, transient=False) as live:

            def log_line(state, line: str) -> None:  # printed above the live table
                live.console.print(
                    f"[dim]{time.perf_counter() - started:7.1f}s[/dim]  {escape(state.job.repo_id)}: {escape(line)}",
                    soft_wrap=True,
                )

            states = run_batch(
                jobs,
                engine=engine,
                token=token,
                endpoint=endpoint,
                on_event=log_line,
                on_change=lambda current: live.update(_jobs_table(current)),
            )
            live.update(_jobs_table(states))
    for state in states:
        if state.error:
            err.print(f"[bold red]{escape(state.job.repo_id)}:[/bold red] {escape(state.error)}", soft_wrap=True)
    out.print(summary(states))
    if any(state.state == "failed" for state in states):
        raise typer.Exit(1)


@app.command("ls", epilog="Example:\n\n  hub-export ls alice/SmolLM2-135M-ExecuTorch")
def ls_command(
    repo_id: str = typer.Argument(..., help="A Hub repo published by hub-export."),
    revision: str | None = typer.Option(None, help="Branch, tag or commit of the repo."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """List the variants of a published repo: size, context, verification, speed."""
    manifest = list_variants(repo_id, endpoint=endpoint, token=token, revision=revision)
    table = Table(title=escape(f"{repo_id}  (from {manifest.source.get('id')})"))
    table.add_column("file", no_wrap=True)
    for column in ("size", "ctx", "memory"):  # memory: at full context
        table.add_column(column, justify="right", no_wrap=True)
    task = task_of(manifest)
    table.add_column("perplexity" if task.quality_legend is None else "quality vs fp32", min_width=8)
    table.add_column("verified vs eager", min_width=11)
    table.add_column("tok/s", justify="right", no_wrap=True)
    for variant in manifest.variants:
        facts = variant_facts(variant)
        decode = facts["decode_tps"]
        table.add_row(
            variant.file,
            facts["size"],
            escape(facts["context"].removesuffix(" tokens")),
            escape(facts["memory"].split(" (")[0]),
            escape(facts["quality"]),
            escape(facts["verification"].removesuffix(" vs eager")),
            "-" if decode == "n/a" else decode,
        )
    out.print(table)
    qualities = [v.verification.quality for v in manifest.variants if v.verification.quality is not None]
    if qualities:
        out.print(
            f"[dim]perplexity: on {qualities[0].tokens} tokens of English text, through the .pte; "
            "in brackets, its ratio to the fp32 model's[/dim]"
        )
    if task.quality_legend is not None:
        out.print(f"[dim]quality vs fp32: {task.quality_legend}. ctx: most tokens a text may have[/dim]")
        return
    out.print(
        "[dim]ctx: tokens the cache holds; memory: resident memory of a process running the file to full "
        "context, measured at export (~: an estimate)[/dim]"
    )
    if manifest.machine:
        out.print(f"[dim]tok/s: decode speed of the ExecuTorch runner at export, on {escape(manifest.machine)}[/dim]")


@app.command("pull", epilog="Example:\n\n  hub-export pull alice/SmolLM2-135M-ExecuTorch --variant 8da4w -o smollm2")
def pull_command(
    repo_id: str = typer.Argument(..., help="A Hub repo published by hub-export."),
    variant: str | None = typer.Option(None, help="Variant (qmode or file name); default: the first one."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Folder to download to (default: the HF cache)."),
    revision: str | None = typer.Option(None, help="Branch, tag or commit of the repo."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
    token: str | None = typer.Option(None, help=TOKEN_HELP, show_default=False),
):
    """Download one variant with its tokenizer and manifest, and check its sha256."""
    folder = pull(repo_id, variant=variant, output_dir=output, endpoint=endpoint, token=token, revision=revision)
    names = sorted(p.name for p in folder.iterdir() if p.is_file() or p.is_symlink())
    err.print(f"[dim]{escape(', '.join(names))}[/dim]")
    out.print(str(folder))


@app.command("card", epilog="Example:\n\n  hub-export card out/ --template my_card.md.j2")
def card_command(
    folder: Path = typer.Argument(..., help="An export folder (with manifest.json)."),
    template: Path | None = typer.Option(None, help="Jinja2 template for the card body."),
    source_card: Path | None = typer.Option(
        None, help="README.md of the source model: license/language to inherit (kept in the manifest)."
    ),
    repo_id: str | None = typer.Option(None, help="Repo the folder is published as (for the usage commands)."),
    endpoint: str | None = typer.Option(None, help=ENDPOINT_HELP),
):
    """(Re-)render FOLDER/README.md from FOLDER/manifest.json."""
    data = remember_source_card(folder, source_card) if source_card else None
    path = write_card(folder, data, template, endpoint, repo_id=repo_id)
    out.print(f"Wrote {path}")


HUB_EXTRA_MISSING = "the local Hub server is an optional part: pip install 'hub-export[hub]' (fastapi, uvicorn)"


def mount_hub(target: typer.Typer) -> None:
    """Add ``hub``: the local Hub server's commands, or, without the extra, one that says how to install them."""
    try:
        from .localhub.cli import app as server_app  # needs the optional `hub` extra: imported only if present
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
