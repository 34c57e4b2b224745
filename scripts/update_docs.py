"""Regenerate the generated sections of the README and docs/ (the family table, the benchmark tables).

    python scripts/update_docs.py

A section is marked ``<!-- NAME: ... -->`` ... ``<!-- /NAME -->`` in any of those files; its
body comes from :data:`SECTIONS` (a ``benchmarks/results/*.md`` file) or, for ``archs-table``,
from ``hub-export archs --markdown``. The figures named in :data:`IMAGES` are copied from
``benchmarks/results/`` into ``docs/img/`` (the site can only serve files under ``docs/``).
``tests/test_docs.py`` checks that all of them match their sources.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# section name -> benchmarks/results/<name>.md
SECTIONS = {
    "bench-real": "smollm2-135m-instruct",
    "bench-table": "smollm2-135m-shaped",
    "bench-recipes": "quant-recipes",
    "bench-int4-rounding": "int4-rounding",
    "bench-cluster": "cluster-speedup",
    "bench-peer": "peer-8da4w",
    "bench-peer-8da8w": "peer-8da8w",
    "bench-peer-one-at-a-time": "peer-8da4w-one-at-a-time",
    "bench-peer-qwen3": "peer-qwen3-8da4w",
    "bench-peer-1-7b": "peer-smollm2-1.7b-8da4w-one-at-a-time",
    "thread-scaling": "thread-scaling",
    "bench-peer-avx2": "peer-8da4w-avx2",
    "thread-scaling-avx2": "thread-scaling-avx2",
    "decode-floor-avx2": "decode-floor-8da4w-avx2",
    "threadpool-calls-avx2": "threadpool-calls-avx2",
    "paired-floor-avx2": "paired-decode-floor-8da4w-avx2",
    "paired-floor": "paired-decode-floor-8da4w",
    "attention-variants-avx2": "attention-variants-10l-avx2",
    "group-size": "group-size",
    "bench-llamacpp-smollm2": "llamacpp-smollm2",
    "bench-llamacpp-gemma3": "llamacpp-gemma3",
    "bench-llamacpp-qwen-1-5b": "llamacpp-qwen2.5-coder-1.5b",
    "bench-llamacpp-qwen-1-5b-avx2": "llamacpp-qwen2.5-coder-1.5b-avx2",
    "decode-floor": "decode-floor-8da4w",
    "decode-floor-8da8w": "decode-floor-8da8w",
    "sdpa-threads": "sdpa-threads",
    "bench-kv": "kv-cache",
    "bench-embeddings": "minilm-embeddings",
    "bench-vlm": "vlm-smolvlm-shaped",
    "bench-scale": "scale",
    "gptq-layer": "gptq-layer",
    "bench-speculative": "speculative",
    "bench-speculative-8da4w": "speculative-8da4w",
    "speculative-rows": "speculative-rows",
    "speculative-rows-1-7b": "speculative-rows-1.7b",
    "speculative-rows-avx2": "speculative-rows-8da4w-avx2",
    "bench-real-weights": "real-weights",
    "bench-speculative-avx2": "speculative-8da4w-avx2",
    "bench-lora-files": "lora-files",
}
# docs/img/<name> <- benchmarks/results/<name>
IMAGES = ("quant-recipes.png", "scale.png")
MARK = re.compile(r"(<!-- ([a-z0-9-]+):[^\n]*-->\n)(.*?)(<!-- /\2 -->)", re.S)


def source_of(name: str) -> str:
    """What section ``name`` must hold."""
    if name == "archs-table":
        from hub_export.tasks.archs import markdown_table

        return markdown_table()
    return (ROOT / "benchmarks" / "results" / f"{SECTIONS[name]}.md").read_text()


def sections(text: str) -> dict[str, str]:
    """The generated sections of a page: name -> body."""
    return {match[2]: match[3] for match in MARK.finditer(text)}


def regenerate(text: str) -> str:
    return MARK.sub(lambda m: m[1] + source_of(m[2]).rstrip("\n") + "\n" + m[4], text)


def main() -> None:
    for page in PAGES:
        page.write_text(regenerate(page.read_text()))
    (ROOT / "docs" / "img").mkdir(exist_ok=True)
    for name in IMAGES:
        (ROOT / "docs" / "img" / name).write_bytes((ROOT / "benchmarks" / "results" / name).read_bytes())


if __name__ == "__main__":
    main()
