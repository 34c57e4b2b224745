"""Pytest fixture ``local_hub``: a fresh local hub with users ``alice`` (org ``acme``) and ``bob``.

Enable it in the root ``conftest.py`` with
``pytest_plugins = ["hub_export.hub.localhub.pytest_plugin"]`` (or ``-p hub_export.hub.localhub.pytest_plugin``).

For the whole session, ``huggingface_hub`` is pointed at the local hub, uses LFS
instead of Xet (``HF_HUB_DISABLE_XET``), and gets its own ``HF_HOME``: tests never
touch the user's cache, never send a stored login token, never reach huggingface.co.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants

from hub_export.hub.localhub.serving import LocalHub, serve_in_thread
from hub_export.hub.localhub.store import LocalHubStore

_TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_OIDC_ID_TOKEN")


@dataclass
class LocalHubFixture:
    """What ``local_hub`` yields: the endpoint, the root, tokens, and an ``api(token)`` helper."""

    hub: LocalHub
    endpoint: str
    root: Path
    alice_token: str
    bob_token: str
    alice_readonly_token: str
    org: str = "acme"

    def api(self, token: str | None = None) -> HfApi:
        """An ``HfApi`` on the local hub; ``token=None`` is anonymous (never a stored token)."""
        return HfApi(endpoint=self.endpoint, token=token if token is not None else False)


@pytest.fixture(scope="session")
def hf_isolated_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``huggingface_hub`` at a private ``HF_HOME`` with Xet disabled; yields that home."""
    home = tmp_path_factory.mktemp("hf_home")
    settings = {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_XET_CACHE": str(home / "xet"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for name in _TOKEN_VARIABLES:
            mp.delenv(name, raising=False)
        for name in ("HF_HOME", "HF_HUB_CACHE", "HF_ASSETS_CACHE", "HF_TOKEN_PATH", "HF_XET_CACHE"):
            mp.setenv(name, settings[name])
        mp.setenv("HF_HUB_DISABLE_XET", "1")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.setenv("HF_HUB_OFFLINE", "0")
        # The client reads most settings from module constants computed at import time.
        for name, value in settings.items():
            mp.setattr(constants, name, value, raising=False)
        mp.setattr(constants, "HUGGINGFACE_HUB_CACHE", settings["HF_HUB_CACHE"], raising=False)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
        mp.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
        mp.setattr(constants, "HF_HUB_OFFLINE", False, raising=False)
        yield home


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory: pytest.TempPathFactory, hf_isolated_env: Path) -> Iterator[LocalHubFixture]:
    """A local hub on a free port and a fresh root, shared by the session.

    ``alice`` is a write member of ``acme``; ``bob`` is on his own; ``alice_readonly_token``
    is a read-only token of alice. Tests share the hub: use distinct repo names.
    """
    root = tmp_path_factory.mktemp("localhub")
    store = LocalHubStore(root)
    alice = store.add_user("alice", org="acme")
    bob = store.add_user("bob")
    alice_readonly = store.add_user("alice", read_only=True)
    with serve_in_thread(root) as hub, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hub.endpoint)
        mp.setattr(constants, "ENDPOINT", hub.endpoint)
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        yield LocalHubFixture(hub, hub.endpoint, root, alice, bob, alice_readonly)
