"""What every benchmark ends with: a median-and-range summary, and its results written as JSON + Markdown."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def spread(values: list[float], digits: int = 1) -> dict:
    """Median, min and max of repeated measurements, rounded to ``digits`` decimals."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def write_results(name: str, result: dict, markdown: str | None = None) -> None:
    """Write ``results/NAME.json``, and ``NAME.md`` when given Markdown, which is also printed."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    if markdown is not None:
        (RESULTS / f"{name}.md").write_text(markdown)
        print(markdown)
