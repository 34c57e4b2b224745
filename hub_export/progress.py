"""Progress of a long job as a stream of structured events.

An export and a push report each stage as a :class:`ProgressEvent`: the message, the
stage it starts, the variant it concerns, and how many of the job's expected steps are
done. The CLI prints them as a timed stage log, the Space draws its progress bar from
``done``/``total``, worker processes send theirs to the parent, which counts them in the
same stream. An event is a ``str`` (its message), so a callback that only wants text
can treat it as one.

Example:
    >>> seen = []
    >>> tracker = Tracker(seen.append)
    >>> tracker.expect(2)
    >>> tracker("quantizing", stage="quantize", variant="model-8da4w.pte")
    >>> tracker("downloading config.json")  # a note: no step of its own
    >>> [(str(e), e.stage, e.done, e.total) for e in seen]
    [('quantizing', 'quantize', 1, 2), ('downloading config.json', 'note', 1, 2)]
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Stages that count as a step of the job; anything else is a note within the current step.
STEPS = ("resolve", "load", "reference", "calibrate", "quantize", "export", "lower", "verify", "check", "upload")


class ProgressEvent(str):
    """One progress message with its place in the job (``str(event)`` is the message)."""

    stage: str
    variant: str | None
    done: int
    total: int

    def __new__(cls, message: str, stage: str = "note", variant: str | None = None, done: int = 0, total: int = 0):
        event = super().__new__(cls, message)
        event.stage, event.variant, event.done, event.total = stage, variant, done, total
        return event

    def __reduce__(self):
        # Workers send events to the parent pickled.
        return ProgressEvent, (str(self), self.stage, self.variant, self.done, self.total)

    @property
    def fraction(self) -> float:
        """Share of the expected steps done, below 1 until the job says it has finished."""
        return min(self.done / self.total, 0.99) if self.total else 0.0


Callback = Callable[[str], None]


class Tracker:
    """Counts a job's steps and hands every message to ``callback`` as a :class:`ProgressEvent`.

    A job announces its steps with :meth:`expect` as it learns them (an export knows its
    variants, a push adds its own); each call with a stage of :data:`STEPS` is one step.
    """

    def __init__(self, callback: Callback | None = None):
        self.callback = callback
        self.done = 0
        self.total = 0

    def expect(self, steps: int) -> None:
        self.total += steps

    def __call__(self, message: str, stage: str = "note", variant: str | None = None) -> None:
        if stage in STEPS:
            self.done += 1
        if self.callback is not None:
            self.callback(ProgressEvent(message, stage, variant, self.done, max(self.total, self.done)))


def tracker(progress: Callback | Tracker | None, fallback: Callback) -> Tracker:
    """``progress`` as a :class:`Tracker`: itself when it is one (a push passing its own to the export)."""
    if isinstance(progress, Tracker):
        return progress
    return Tracker(progress or fallback)


def time_left(started: float, done: int, total: int) -> str:
    """ ", about 3 min left" after ``done`` of ``total`` equal steps begun at ``started`` (empty when finished)."""
    if done >= total or done <= 0:
        return ""
    seconds = (time.perf_counter() - started) / done * (total - done)
    shown = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return f", about {shown} left"


def clock(seconds: float) -> str:
    """``seconds`` as a clock reads: "4:05", or "1:02:03" from an hour on."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
