"""``hub-export transcribe``: an audio file's text, from a speech ``.pte``, printed window by window."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape

from hub_export.cli import common
from hub_export.progress import clock, time_left
from hub_export.tasks.speech.run import stream_transcribe


@common.app.command(
    epilog="Example:\n\n  hub-export transcribe out/ meeting.flac\n\n  hub-export transcribe out/ lecture.mp3 --max-seconds 600"
)
def transcribe(
    target: str = typer.Argument(..., help="A speech .pte, its export folder, or a Hub repo made by hub-export."),
    audio: list[Path] = typer.Argument(..., help="Audio files (wav, flac, ogg, mp3; any rate, mixed to mono)."),
    language: str | None = typer.Option(None, help="Spoken language, e.g. fr (multilingual models; default: en)."),
    translate: bool = typer.Option(False, "--translate", help="Translate into English (multilingual models)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Print timed segments: [start -> end] text."),
    max_seconds: float | None = typer.Option(
        None, "--max-seconds", help="Read at most this many seconds of each recording (default: all of it)."
    ),
    variant: common.VariantOption = None,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Print the text of each audio file as each 30 s window is decoded, with the real-time factor."""
    pte, folder = common.open_pte(target, variant, endpoint, token)
    for path in audio:
        started, work, window = time.perf_counter(), 0.0, None
        with common.err.status(f"{escape(path.name)}: reading") as status:
            for window in stream_transcribe(pte, folder, path, language, translate, timestamps, max_seconds):
                for segment in window.segments:
                    typer.echo(f"[{segment.start:6.2f} -> {segment.end:6.2f}] {segment.text}")
                if not timestamps and window.text:
                    typer.echo(window.text)
                work += window.seconds
                left = time_left(started, round(window.end), round(window.audio_seconds))
                status.update(f"{escape(path.name)}: {clock(window.end)} of {clock(window.audio_seconds)}{left}")
        for note in window.notes:
            common.err.print(f"[yellow]{escape(note)}[/yellow]")
        if window.stopped_early:
            common.err.print(f"[yellow]{escape(path.name)}: stopped after --max-seconds {max_seconds:g}[/yellow]")
        common.err.print(
            f"[dim]{escape(path.name)}: {window.end:.1f} s of audio in {work:.2f} s "
            f"(real-time factor {work / window.end if window.end else 0:.3f}, {pte.name})[/dim]"
        )
