"""The source's own model card: read and checked, and what it hands down to the exported model's card (license, language, base model)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hub_export.errors import InputError, opt
from hub_export.pipeline.manifest import Manifest

# The source card's keys a quantized copy must keep: its terms of use and its languages.
CARD_NAME = "README.md"

INHERITED_KEYS = ("license", "license_name", "license_link", "language")


# What the exporter may say about a local or GGUF source, which hub-export cannot know:
# kept in the manifest's source record, and passed again by the reproduce command.
DECLARED_FLAGS = {"base_model": "--base-model", "license": "--license", "model_name": "--model-name"}


# Hub license ids are lower-case words, digits, dots and dashes ("apache-2.0", "llama3.2", "other").
LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def parse_card_data(text: str) -> dict[str, Any]:
    """The YAML front matter of a model card's text, as a dict (empty when it has none).

    Example:
        >>> parse_card_data("---\\nlicense: mit\\nlanguage: [en]\\n---\\n# Model\\n")
        {'license': 'mit', 'language': ['en']}
    """
    from huggingface_hub import ModelCard

    try:
        data = ModelCard(text, ignore_metadata_errors=True).data.to_dict()
    except (ValueError, yaml.YAMLError):
        return {}
    return {k: v for k, v in data.items() if v is not None}


def read_source_card(path: str | Path) -> dict[str, Any]:
    """The card data a quantized copy inherits (license, language) from a source card.

    ``path`` is a ``README.md`` or a model folder holding one; a missing card gives ``{}``.

    Example:
        >>> read_source_card("my-model")  # my-model/README.md starts with "license: apache-2.0"
        {'license': 'apache-2.0', 'language': ['en']}
    """
    path = Path(path)
    if path.is_dir():
        path = path / CARD_NAME
    if not path.is_file():
        return {}
    return inherited(parse_card_data(path.read_text(encoding="utf-8", errors="replace")))


def inherited(card_data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Only the keys of ``card_data`` that a derived model keeps."""
    return {k: card_data[k] for k in INHERITED_KEYS if card_data and card_data.get(k) not in (None, "", [])}


def declared_source(
    base_model: str | None = None, license: str | None = None, model_name: str | None = None
) -> dict[str, str]:
    """Check what the exporter says about the model (``--base-model``, ``--license``, ``--model-name``).

    Returns the keys to add to the manifest's source record; those not given are left out,
    so an export without them records what it always did.

    Example:
        >>> declared_source("HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0")
        {'base_model': 'HuggingFaceTB/SmolLM2-135M-Instruct', 'license': 'apache-2.0'}
    """
    declared: dict[str, str] = {}
    if base_model is not None:
        declared["base_model"] = _checked_base_model(base_model.strip())
    if license is not None:
        value = license.strip().lower()
        if not LICENSE_ID.fullmatch(value):
            raise InputError(
                f"{opt('license')} {license!r} is not a Hub license id; use one like apache-2.0, mit or other",
                param="license",
            )
        declared["license"] = value
    if model_name is not None:
        name = " ".join(model_name.split())
        if not name or len(name) > 96:
            raise InputError(
                f"{opt('model_name')} must be a name of 1 to 96 characters on one line", param="model_name"
            )
        declared["model_name"] = name
    return declared


def _checked_base_model(repo_id: str) -> str:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
        valid = repo_id.count("/") == 1  # the Hub links a base model by ORG/NAME
    except HFValidationError:
        valid = False
    if not valid:
        raise InputError(
            f"{opt('base_model')} {repo_id!r} is not a Hub model id; use ORG/NAME, e.g. HuggingFaceTB/SmolLM2-135M",
            param="base_model",
        )
    return repo_id


def remember_source_card(folder: str | Path, source_card: str | Path) -> dict[str, Any]:
    """Read the inheritable keys of ``source_card`` and keep them in ``folder``'s manifest.

    Later renders (``hub-export card``, ``hub-export push --from``) then keep the license
    and language without needing the source card again.

    Example:
        >>> remember_source_card("out", "my-model/README.md")
        {'license': 'apache-2.0', 'language': ['en']}
    """
    if not Path(source_card).exists():
        raise InputError(f"source card {Path(source_card).name} not found")
    data = read_source_card(source_card)
    manifest = Manifest.read(Path(folder))
    manifest.source = {**manifest.source, "card_data": data}
    manifest.write(Path(folder))
    return data
