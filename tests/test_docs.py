"""The README's generated sections match their sources."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(ROOT / "scripts"))
from update_docs import PAGES, SECTIONS, regenerate, sections, source_of  # noqa: E402


def test_every_generated_section_matches_its_source():
    found = {}
    for page in PAGES:
        for name, body in sections(page.read_text()).items():
            found[name] = page.name
            assert body.strip() == source_of(name).strip(), f"{page.name}: run python scripts/update_docs.py"
    assert set(found) == {"archs-table", *SECTIONS}, "a generated section is missing from README.md and docs/"


def test_a_stale_section_is_seen():
    page = "<!-- archs-table: generated -->\n| old |\n<!-- /archs-table -->\n"
    assert sections(page)["archs-table"].strip() == "| old |"
    assert sections(regenerate(page))["archs-table"].strip() == source_of("archs-table").strip()


def test_archs_cli_prints_the_same_table():
    from hub_export.archs import markdown_table

    result = subprocess.run(
        [sys.executable, "-m", "hub_export.cli", "archs", "--markdown"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == markdown_table().strip()


def test_the_readme_speaks_to_users():
    readme = (ROOT / "README.md").read_text()
    for command in ("make demo", "make test", "python -m benchmarks.peer"):
        assert command in readme
    assert len(readme.splitlines()) < 250
    history = re.compile(r"\b(stops? \d+|issues? #?\d+|(this|one|earlier|previous|last) session)\b", re.IGNORECASE)
    texts = [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "hub_export").rglob("*.py"),
        *(ROOT / "space").glob("*"),
        *(ROOT / "tests").glob("*.py"),
        *(ROOT / "benchmarks").rglob("*.md"),
    ]
    found = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for path in texts
        if path.is_file() and path != Path(__file__)
        for match in history.finditer(path.read_text(errors="replace"))
    ]
    assert found == []


@pytest.mark.parametrize("module", ["errors", "redact", "options", "progress", "service", "manifest"])
def test_docstring_examples_of_the_pure_modules_run(module):
    """The examples in these modules' docstrings need no model and no network: they must stay true."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"hub_export.{module}"))
    assert result.attempted > 0 and result.failed == 0
