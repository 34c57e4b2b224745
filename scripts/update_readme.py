"""Regenerate the README's generated sections (architecture table, benchmark table).

    python scripts/update_readme.py
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# README section -> benchmarks/results/<name>.md
BENCH_SECTIONS = (
    ("bench-real", "smollm2-135m-instruct"),
    ("bench-table", "smollm2-135m-shaped"),
    ("bench-recipes", "quant-recipes"),
    ("bench-cluster", "cluster-speedup"),
    ("bench-peer", "peer-8da4w"),
    ("bench-peer-8da8w", "peer-8da8w"),
    ("bench-peer-one-at-a-time", "peer-8da4w-one-at-a-time"),
    ("bench-peer-qwen3", "peer-qwen3-8da4w"),
    ("thread-scaling", "thread-scaling"),
    ("decode-floor", "decode-floor-8da4w"),
    ("decode-floor-8da8w", "decode-floor-8da8w"),
    ("sdpa-threads", "sdpa-threads"),
    ("bench-kv", "kv-cache"),
)


def replace_section(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:[^\n]*-->\n).*?(<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README has no {name} section")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def main() -> None:
    from hub_export.archs import markdown_table

    readme = ROOT / "README.md"
    text = replace_section(readme.read_text(), "archs-table", markdown_table())
    for section, name in BENCH_SECTIONS:
        bench = ROOT / "benchmarks" / "results" / f"{name}.md"
        if bench.is_file():
            text = replace_section(text, section, bench.read_text())
    readme.write_text(text)


if __name__ == "__main__":
    main()
