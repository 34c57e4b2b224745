"""The Space's settings: whose token a job may use, and what it reads from its environment.

Read once at start-up (:func:`settings_from_env`); a bad value stops the Space with one line.
"""

import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hub_export.hub.api import resolve_endpoint
from hub_export.service import MAX_AUDIO_SECONDS

log = logging.getLogger("hub_export.space")


@dataclass(frozen=True)
class AuthPolicy:
    """Whose token a job may use.

    ``use_oauth``: the page shows "Sign in with Hugging Face" and jobs use the signed-in
    user's token. ``env_token_allowed``: a job without a user token may fall back to the
    server's ``HF_TOKEN`` (offline use only: on a public Space every visitor would act as
    the Space's owner).
    """

    use_oauth: bool
    env_token_allowed: bool
    description: str


def auth_policy(env: Mapping[str, str]) -> AuthPolicy:
    """The policy from the Space's environment.

    OAuth is available when the Space sets ``hf_oauth: true`` (Spaces then define
    ``OAUTH_CLIENT_ID``); with it, the server's ``HF_TOKEN`` is never used.
    ``HUB_EXPORT_SPACE_OFFLINE=1`` asks for offline mode; off a Space (no ``SPACE_ID``)
    it is implied. A Space without OAuth and without the switch takes pasted tokens only.
    """
    oauth = bool(env.get("SPACE_ID") and env.get("OAUTH_CLIENT_ID"))
    offline = env.get("HUB_EXPORT_SPACE_OFFLINE", "").strip().lower() in ("1", "true", "yes")
    if oauth:
        if offline:
            log.warning("HUB_EXPORT_SPACE_OFFLINE is ignored: OAuth is available, so only user tokens are used")
        return AuthPolicy(True, False, "OAuth: jobs use the signed-in user's token")
    if offline or not env.get("SPACE_ID"):
        return AuthPolicy(False, True, "offline: jobs use the pasted token, else the server's HF_TOKEN")
    return AuthPolicy(False, False, "no OAuth: jobs use the token each visitor pastes")


@dataclass(frozen=True)
class Settings:
    """Everything the app reads from its environment, resolved once at start-up."""

    endpoint: str
    auth: AuthPolicy
    concurrency: int = 1  # exports at once
    preview_concurrency: int = 1  # previews at once, in a lane of their own: never behind an export
    queue_size: int = 8
    work_root: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "hub-export-space")
    env_token: str | None = field(default=None, repr=False)  # never printed
    ray_address: str | None = None  # exports run on this Ray cluster instead of this machine
    max_audio_seconds: int = MAX_AUDIO_SECONDS  # of a recording, transcribed by a preview

    @property
    def allow_local_sources(self) -> bool:
        """Local folders as sources: on a public (OAuth) Space they would expose the server's disk."""
        return not self.auth.use_oauth


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if raw and (not raw.isdigit() or int(raw) < 1):
        raise SystemExit(f"{name}={raw!r}: expected a whole number of at least 1")
    return int(raw) if raw else default


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """:class:`Settings` from ``env`` (default: ``os.environ``); a bad value stops start-up with one line."""
    env = os.environ if env is None else env
    auth = auth_policy(env)
    work_root = env.get("HUB_EXPORT_SPACE_WORKDIR", "").strip()
    env_token = (env.get("HF_TOKEN") or "").strip() or None
    return Settings(
        endpoint=resolve_endpoint(env.get("HF_ENDPOINT") or None),
        auth=auth,
        concurrency=_positive_int(env, "HUB_EXPORT_SPACE_CONCURRENCY", 1),
        preview_concurrency=_positive_int(env, "HUB_EXPORT_SPACE_PREVIEW_CONCURRENCY", 1),
        queue_size=_positive_int(env, "HUB_EXPORT_SPACE_QUEUE", 8),
        **({"work_root": Path(work_root).expanduser()} if work_root else {}),
        env_token=env_token if auth.env_token_allowed else None,
        ray_address=env.get("HUB_EXPORT_RAY_ADDRESS", "").strip() or None,
        max_audio_seconds=_positive_int(env, "HUB_EXPORT_SPACE_MAX_AUDIO_SECONDS", MAX_AUDIO_SECONDS),
    )
