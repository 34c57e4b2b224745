"""Model cards in the local Hub: their YAML front matter parsed safely (no aliases, bounded sizes) into the card data and tags a repo's info reports."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml

from hub_export.hub.localhub.objects import Tree
from hub_export.hub.localhub.store import (
    LocalHubStore,
)

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.S)


# Model card metadata: the README is read up to 1 MiB, its YAML block up to 256 KiB (parsing is slow).
MAX_CARD_BYTES = 1024 * 1024


MAX_FRONT_MATTER = 256 * 1024


def _card_loader() -> type:
    """libyaml's safe loader when it caps nesting (0.2.5+: 1,000 levels); else PyYAML's, which recurses in Python."""
    try:
        from yaml import CSafeLoader, _yaml  # type: ignore[attr-defined]

        if tuple(_yaml.get_version()) >= (0, 2, 5):
            return CSafeLoader  # several times faster: parsing is what an anonymous caller can make us do
    except (ImportError, AttributeError):
        pass
    return yaml.SafeLoader


_CARD_LOADER = _card_loader()


def _refuse_aliases(root: yaml.Node) -> None:
    """Aliases make a few bytes stand for billions of values (or a cycle): refuse any node reached twice."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not accepted in model card metadata", node.start_mark
            )
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in node.value for item in pair)


def _load_yaml(text: str) -> Any:
    """Safe-load one YAML document: composed first (aliases stay shared nodes), checked, then built."""
    loader = _CARD_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_aliases(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_front_matter(text: str) -> dict[str, Any] | None:
    """The YAML metadata block of a model card, as JSON-safe data (None if absent).

    Raises :class:`yaml.YAMLError` for anything the Hub would not accept as metadata,
    including aliases, nesting deeper than the recursion limit and values JSON cannot hold.
    """
    match = _FRONT_MATTER.match(text)
    if not match:
        return None
    block = match.group(1)
    if len(block) > MAX_FRONT_MATTER:
        raise yaml.YAMLError(f"the metadata block is larger than {MAX_FRONT_MATTER // 1024} KiB")
    try:
        data = _load_yaml(block)
    except RecursionError as e:  # PyYAML's own loader on deep nesting
        raise yaml.YAMLError("the metadata block is nested too deeply") from e
    if data is None:
        return None
    if not isinstance(data, dict):
        raise yaml.YAMLError("the metadata block must be a mapping")
    try:
        return json.loads(json.dumps(data, default=str, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as e:  # date keys, .nan, .inf
        raise yaml.YAMLError(f"the metadata cannot be represented as JSON: {e}") from e


@functools.lru_cache(maxsize=256)
def _card_of_blob(path: Path) -> dict[str, Any] | None:
    """Card data of one README blob, parsed once: blobs are content-addressed, so the path is the content."""
    try:
        return parse_front_matter(path.read_bytes().decode("utf-8", "replace"))
    except (yaml.YAMLError, OSError):
        return None  # a committed card the Hub would have refused: no metadata, never a 500


def card_data(store: LocalHubStore, tree: Tree) -> dict[str, Any] | None:
    entry = tree.get("README.md")
    if entry is None or entry.size > MAX_CARD_BYTES:
        return None
    return _card_of_blob(store.blobs.path(entry.sha256))


def card_tags(card: dict[str, Any] | None) -> list[str]:
    if not card:
        return []
    tags = card.get("tags") or []
    tags = [tags] if isinstance(tags, str) else [str(t) for t in tags] if isinstance(tags, list) else []
    for key in ("library_name", "pipeline_tag"):
        if isinstance(card.get(key), str):
            tags.append(card[key])
    if isinstance(card.get("license"), str):
        tags.append(f"license:{card['license']}")
    return list(dict.fromkeys(tags))
