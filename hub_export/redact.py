"""The one redactor: secrets never reach a log, a file, a card, an exception or a page.

Known secrets (the tokens a command or a job was given) are replaced wherever they
appear, and anything shaped like a Hub token is masked even when nobody said it was a
secret (a token pasted into the wrong field, one echoed by a server).

Example:
    >>> redact = Redactor("my-secret-value")
    >>> redact("token my-secret-value, and hf_abcdefghijklmnopqrstuv")
    'token ***, and hf_***'
    >>> redact_query("revision=main&token=hf_abcdefghijklmnopqrstuv")
    'revision=main&token=***'
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{16,}\b")
SECRET_PARAM = re.compile(r"token|sig|secret|key|auth|pass|credential", re.IGNORECASE)
_MIN_SECRET = 8  # very short strings would blank out ordinary words; real tokens are long


class Redactor:
    """Replaces every known secret, and anything shaped like a Hub token, with ``***``."""

    def __init__(self, *secrets: str | None):
        self._secrets: set[str] = set()
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= _MIN_SECRET:
            self._secrets.add(secret)

    def __call__(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return TOKEN_PATTERN.sub("hf_***", text)


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with ``secrets`` and anything token-shaped masked."""
    return Redactor(*secrets)(text)


def redact_query(query: str) -> str:
    """A query string with the values of token-like parameters (or token-like values) masked, for logs."""
    pairs = parse_qsl(query, keep_blank_values=True)
    safe = [(k, "***" if SECRET_PARAM.search(k) or v.startswith("hf_") else v) for k, v in pairs]
    return urlencode(safe, safe="*")
