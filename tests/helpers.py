"""Helpers shared by the tests."""

from __future__ import annotations

import sys

from hub_export.cli import main


def error_line(err: str) -> str:
    """The single line the CLI prints for a failure."""
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    return lines[0]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run ``hub-export ARGS`` in-process through the real entry point."""
    argv = sys.argv
    sys.argv = ["hub-export", *args]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return code, captured.out, captured.err
