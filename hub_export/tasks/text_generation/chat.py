"""Chat templates: the model's own, found where its tokenizer keeps it, rendered in a sandbox.

A template is the source repo's code (hostile): it runs in Jinja's immutable sandbox, and
whatever it raises becomes one line for the user.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hub_export.errors import InputError, opt


def _special_token(value) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def chat_template(tokenizer_dir: str | Path) -> str | None:
    """The model's chat template, from whichever file its tokenizer keeps it in (``None`` if it has none).

    Looks in ``chat_template.jinja``, ``chat_template.json`` and ``tokenizer_config.json``;
    a list of named templates yields the one named ``default``.
    """
    folder = Path(tokenizer_dir)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            template = json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template.strip():
            return template
    return None


def chat_prompt(tokenizer_dir: str | Path, prompt: str, system: str | None = None) -> str:
    """``prompt`` (and ``system``) rendered with the model's chat template, ready for generation."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return render_chat_messages(tokenizer_dir, messages)


def render_chat_messages(tokenizer_dir: str | Path, messages: list[dict]) -> str:
    """``messages`` (transformers' chat format; content may be a list of typed parts) rendered with the model's
    chat template in a sandbox, with the generation prompt.

    Raises:
        InputError: the model has no chat template, or the template refused the messages.
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = chat_template(tokenizer_dir)
    if template is None:
        raise InputError(
            "this model has no chat template",
            hint=f"pass {opt('no_chat')} to send the prompt as is",
            param="chat",
            code="no_chat_template",
        )
    try:
        config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: time.strftime(fmt))
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=_special_token(config.get("bos_token")),
            eos_token=_special_token(config.get("eos_token")),
        )
    except TemplateError as error:
        raise InputError(f"the model's chat template refused the prompt: {error}") from None
