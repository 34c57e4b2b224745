"""What every benchmark ends with: a median-and-range summary, and its results written as JSON + Markdown."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine_on_isa(isa: str | None) -> str:
    """This machine's description; with ``isa``, also has every fresh round process this one starts run XNNPACK's
    kernels for that older CPU (``HUB_EXPORT_XNNPACK_ISA``), and says so in the description."""
    import os

    from hub_export.pipeline.manifest import machine_description
    from hub_export.runtime.process_env import XNNPACK_ISA_ENV

    if not isa:
        return machine_description()
    os.environ[XNNPACK_ISA_ENV] = isa  # read by each fresh round process
    return machine_description() + f"; XNNPACK on its {isa.upper()} kernels"


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


def provenance(rows: list[dict], label: str) -> list[str]:
    """Where and how ``rows`` were measured, for a results page: one line when they share a machine and a command,
    else one line per row (named by its ``label`` key). Each row carries its own ``machine`` and ``command``, so
    merging a new run into older results keeps what each figure came from."""
    if len({(row["machine"], row["command"]) for row in rows}) == 1:
        return [f"Machine: {rows[0]['machine']}. Command: `{rows[0]['command']}`."]
    lines = ["Each row was measured on its own run:", ""]
    lines += [f"- {row[label]}: {row['machine']}; `{row['command']}`." for row in rows]
    return [*lines, ""]
