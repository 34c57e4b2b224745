"""``hub-export bench``: prefill and decode speed of a text-generation ``.pte``."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.errors import InputError
from hub_export.runtime.process_env import XNNPACK_ISAS


@common.app.command(
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
    draft: str | None = typer.Option(
        None,
        "--draft",
        help="Measure speculative decoding with this draft (a variant of the same repo or folder, or a .pte) against "
        "the file alone, on the shipped prompt sets.",
        show_default=False,
    ),
    lookup: bool = typer.Option(
        False, "--lookup", help="Measure prompt-lookup decoding against the file alone, on the shipped prompt sets."
    ),
    variant: common.VariantOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print every run's figures as JSON."),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Measure prefill and decode tokens/s and peak memory of a .pte: median and range over fresh processes."""
    import dataclasses

    from hub_export.tasks.text_generation.bench import (
        bench as run_bench,  # the ExecuTorch runtime: loaded when a file is run
    )

    if isa is not None and isa not in XNNPACK_ISAS:  # before a repo is downloaded
        raise InputError(f"unknown --isa {isa!r}; choose one of: {', '.join(XNNPACK_ISAS)}")
    pte, folder = common.locate_pte(target, variant, endpoint, token)
    if draft is not None or lookup:
        _bench_drafted(target, pte, folder, draft, lookup, gen_tokens, repeat, threads, as_json, endpoint, token)
        return
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
    common.out.print(table)


def _bench_drafted(target, pte, folder, draft, lookup, gen_tokens, repeat, threads, as_json, endpoint, token) -> None:
    """``bench --draft/--lookup``: the file with each drafter against the file alone, prompt by prompt."""
    from hub_export.tasks.text_generation.bench import bench_drafted  # the ExecuTorch runtime: when a file is run

    decoders = {"lookup": {"lookup": True}} if lookup else {}
    if draft is not None:
        decoders["draft"] = {"draft": common.locate_draft(target, draft, endpoint, token)}
    result = bench_drafted(pte, folder, decoders, gen_tokens, repeat, threads)
    if as_json:
        typer.echo(json.dumps(result["table"]))
        return
    table = Table(title=escape(f"{pte.name}: speculative decoding, greedy, up to {gen_tokens} tokens per prompt, "
                                f"{repeat} runs"))  # fmt: skip
    for column in ("prompts", "decoder", "speed-up", "decode tok/s", "accepted", "tokens/call", "same text"):
        table.add_column(column, justify="right")
    for key, row in result["table"].items():
        kind, name = key.split("/")
        speedup = row["speedup"]
        accepted = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else "-"
        table.add_row(kind, escape(name), f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f})",
                      f"{row['decode_tokens_per_s']:.0f}", accepted, f"{row['tokens_per_call']:.2f}",
                      f"{row['same_text']} of {row['prompts']}")  # fmt: skip
    common.out.print(table)
