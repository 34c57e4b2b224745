"""A small, persistent, Hugging Face Hub-compatible server: the offline default hub.

The real ``huggingface_hub`` client talks to it through ``HfApi(endpoint=...)`` or
``HF_ENDPOINT``, with ``HF_HUB_DISABLE_XET=1`` (there is no Xet service here)::

    from hub_export.hub.localhub import add_user, serve_in_thread

    token = add_user(root, "alice", org="acme")
    with serve_in_thread(root) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("alice/demo")
"""

from hub_export.hub.localhub.records import Caller, HubAPIError, Repo
from hub_export.hub.localhub.server import create_app
from hub_export.hub.localhub.serving import LocalHub, default_root, serve, serve_in_thread
from hub_export.hub.localhub.store import LocalHubStore, add_member, add_org, add_user

__all__ = [
    "Caller",
    "HubAPIError",
    "LocalHub",
    "LocalHubStore",
    "Repo",
    "add_member",
    "add_org",
    "add_user",
    "create_app",
    "default_root",
    "serve",
    "serve_in_thread",
]
