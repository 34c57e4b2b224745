"""``hub-export generate``: stream text (or a text-to-text answer) from a ``.pte``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from hub_export.cli import common
from hub_export.tasks.text_generation.run import Sampling
from hub_export.tasks.text_generation.run import generate as run_generate


# Over 60 lines: one typer option a line.
@common.app.command(
    epilog='Examples:\n\n  hub-export generate out/ --variant 8da4w --prompt "Once upon a time" --max-new-tokens 64\n\n'
    '  hub-export generate smolvlm-out/ --image photo.jpg --prompt "What is in this picture?"'
)
def generate(
    target: str = typer.Argument(..., help="A .pte file, an export folder, or a Hub repo made by hub-export."),
    prompt: str = typer.Option(
        ..., "--prompt", "-p", help="Your message (with --chat) or the text to continue (--no-chat)."
    ),
    tokenizer: common.TokenizerOption = None,
    variant: common.VariantOption = None,
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
    draft: str | None = typer.Option(
        None,
        "--draft",
        help="Speculative decoding with a cheaper file of the same tokenizer: a variant of the same repo or folder "
        "(e.g. 8da4w) or a .pte path. The file needs --speculative at export; greedy output keeps the file's own choices.",
        show_default=False,
    ),
    lookup: bool = typer.Option(
        False,
        "--lookup",
        help="Speculative decoding from the prompt's own n-grams (no second file): faster when the answer copies "
        "its input (quote, correct, reformat); the file needs --speculative at export.",
    ),
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Stream text from an exported model and report prefill/decode tokens/s."""
    pte, tokenizer_dir = common.open_pte(target, variant, endpoint, token)
    if common.task_of_folder(Path(tokenizer_dir)) == "text2text-generation":
        from hub_export.tasks.text_to_text.run import (
            generate_text,  # torch and ExecuTorch: loaded when a file is run
        )

        started = time.perf_counter()
        typer.echo(generate_text(pte, tokenizer or tokenizer_dir, prompt, max_new_tokens=max_new_tokens))
        common.err.print(f"[dim]greedy answer in {time.perf_counter() - started:.2f} s ({pte.name})[/dim]")
        return
    draft = common.locate_draft(target, draft, endpoint, token)
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
        draft=draft,
        lookup=lookup,
        on_text=lambda piece: (sys.stdout.write(piece), sys.stdout.flush()),
    )
    sys.stdout.write("\n")
    common.err.print(
        f"[dim]prompt {result.prompt_tokens} tok, prefill {result.prefill_tokens_per_s:.1f} tok/s; "
        f"generated {result.generated_tokens} tok, decode {result.decode_tokens_per_s:.1f} tok/s; "
        f"stop: {result.stop_reason}{'; chat template' if result.chat else ''}[/dim]"
    )
    if result.speculation is not None:
        figures = result.speculation
        common.err.print(
            f"[dim]drafter {figures.drafter}: {figures.accepted} of {figures.proposed} proposed tokens accepted "
            f"({figures.acceptance:.0%}), {figures.tokens_per_call(result.generated_tokens):.2f} tokens per call[/dim]"
        )
