"""The README's generated sections match their sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _section(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"<!-- {name}:")
    start = text.index("\n", start) + 1
    return text[start : text.index(f"<!-- /{name} -->")].strip()


def test_readme_archs_table_is_generated_from_the_registry():
    from hub_export.archs import markdown_table

    assert _section("archs-table") == markdown_table().strip()


def test_archs_cli_prints_the_same_table():
    from hub_export.archs import markdown_table

    result = subprocess.run(
        [sys.executable, "-m", "hub_export.cli", "archs", "--markdown"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == markdown_table().strip()


def test_readme_benchmark_tables_match_the_results_files():
    sys.path.insert(0, str(ROOT / "scripts"))
    from update_readme import BENCH_SECTIONS

    for section, name in BENCH_SECTIONS:
        results = ROOT / "benchmarks" / "results" / f"{name}.md"
        assert results.is_file(), "run `make bench` and `python scripts/update_readme.py`"
        assert _section(section) == results.read_text().strip()


def test_readme_quotes_the_benchmark_command_and_set_up_commands():
    text = (ROOT / "README.md").read_text()
    for command in ("make demo", "make test", "python -m benchmarks.bench_export"):
        assert command in text


@pytest.mark.parametrize("module", ["errors", "redact", "options", "progress", "service", "manifest"])
def test_docstring_examples_of_the_pure_modules_run(module):
    """The examples in these modules' docstrings need no model and no network: they must stay true."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"hub_export.{module}"))
    assert result.attempted > 0 and result.failed == 0
