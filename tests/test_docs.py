"""The README and docs/ match their sources: generated tables, headline figures, the docs site."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(ROOT / "scripts"))
from update_docs import IMAGES, PAGES, SECTIONS, regenerate, sections, source_of  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def test_every_generated_section_matches_its_source():
    found = {}
    for page in PAGES:
        for name, body in sections(page.read_text()).items():
            found[name] = page.name
            assert body.strip() == source_of(name).strip(), f"{page.name}: run python scripts/update_docs.py"
    assert set(found) == {"archs-table", *SECTIONS}, "a generated section is missing from README.md and docs/"
    for name in IMAGES:
        copy = ROOT / "docs" / "img" / name
        assert copy.read_bytes() == (RESULTS / name).read_bytes(), f"{copy}: run python scripts/update_docs.py"


def test_a_stale_section_is_seen():
    page = "<!-- archs-table: generated -->\n| old |\n<!-- /archs-table -->\n"
    assert sections(page)["archs-table"].strip() == "| old |"
    assert sections(regenerate(page))["archs-table"].strip() == source_of("archs-table").strip()


def test_archs_cli_prints_the_same_table():
    from hub_export.tasks.archs import markdown_table

    result = subprocess.run(
        [sys.executable, "-m", "hub_export.cli", "archs", "--markdown"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == markdown_table().strip()


def _numbers(text: str) -> set[str]:
    """The figures in ``text``: 220, 1.23x, 104.7 (digits inside names such as 8da4w do not count)."""
    return set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?x?(?![\w.])", text.replace(",", "")))


def test_every_headline_figure_is_in_its_data_file():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "benchmarks/results/" in line]
    assert len(rows) >= 3
    for _what, figure, machine, command, data in rows:
        source = RESULTS / re.search(r"\(benchmarks/results/([\w.-]+\.md)\)", data)[1]
        text = source.read_text()
        missing = _numbers(figure) - _numbers(text)
        assert not missing, f"README figures {sorted(missing)} are not in {source.name}"
        assert machine.removesuffix(" (vector ISA not recorded)") in text, f"{source.name} was measured elsewhere"
        command = command.strip("`")
        module = re.fullmatch(r"python -m benchmarks\.(\w+)( .*)?", command)[1]
        assert (ROOT / "benchmarks" / f"{module}.py").is_file(), command
        assert "`python -m" not in text or f"`{command}`" in text, f"{source.name} names another command"


def test_the_readme_speaks_to_users():
    readme = (ROOT / "README.md").read_text()
    for command in ("make demo", "make test", "python -m benchmarks.peer"):
        assert command in readme
    assert re.search(r"`make test` is the test command CI runs", readme)
    assert "make test " in (ROOT / ".ci" / "run").read_text()
    assert len(readme.splitlines()) < 250
    history = re.compile(
        r"\b(stops? \d+|issues? #?\d+|(this|one|earlier|previous|last|that) session"
        r"|(previous|earlier|old|last) machine|the old layout)\b",
        re.IGNORECASE,
    )
    texts = [
        ROOT / "README.md",
        ROOT / "mkdocs.yml",
        ROOT / "Makefile",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "scripts").glob("*"),
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


def test_the_docs_site_builds(tmp_path):
    """mkdocs --strict: every page in the nav, every link and anchor resolves (make docs, CI)."""
    pytest.importorskip("mkdocs")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("module", ["errors", "redact", "options", "progress", "service", "pipeline.manifest"])
def test_docstring_examples_of_the_pure_modules_run(module):
    """The examples in these modules' docstrings need no model and no network: they must stay true."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"hub_export.{module}"))
    assert result.attempted > 0 and result.failed == 0
