"""``hub-export transcribe``: an audio file's text, from a speech ``.pte``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from hub_export.cli import common
from hub_export.tasks.speech.run import transcribe as transcribe_audio


@common.app.command(epilog="Example:\n\n  hub-export transcribe out/ meeting.flac")
def transcribe(
    target: str = typer.Argument(..., help="A speech .pte, its export folder, or a Hub repo made by hub-export."),
    audio: list[Path] = typer.Argument(..., help="Audio files (wav, flac, ogg, mp3; any rate, mixed to mono)."),
    language: str | None = typer.Option(None, help="Spoken language, e.g. fr (multilingual models; default: en)."),
    translate: bool = typer.Option(False, "--translate", help="Translate into English (multilingual models)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Print timed segments: [start -> end] text."),
    variant: common.VariantOption = None,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Print the text of each audio file, with the real-time factor."""
    pte, folder = common.open_pte(target, variant, endpoint, token)
    for path in audio:
        result = transcribe_audio(pte, folder, path, language=language, translate=translate, timestamps=timestamps)
        for segment in result.segments:
            typer.echo(f"[{segment.start:6.2f} -> {segment.end:6.2f}] {segment.text}")
        if not timestamps:
            typer.echo(result.text)
        common.err.print(
            f"[dim]{escape(path.name)}: {result.audio_seconds:.1f} s of audio in {result.seconds:.2f} s "
            f"(real-time factor {result.real_time_factor:.3f}, {pte.name})[/dim]"
        )
