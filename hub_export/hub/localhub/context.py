"""What a route of the local Hub reads from its request: the store, the caller, the repo, the revision and path, a JSON body; and the JSON a repo's files and info are described in."""

from __future__ import annotations

import hmac
import json
from hashlib import sha256
from typing import Any
from urllib.parse import unquote

from fastapi import Request

from hub_export.hub.localhub.cards import card_data, card_tags
from hub_export.hub.localhub.objects import Entry, Tree, folder_oid
from hub_export.hub.localhub.records import Caller, Commit, HubAPIError, Repo
from hub_export.hub.localhub.store import LocalHubStore

KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}


def store_of(request: Request) -> LocalHubStore:
    return request.app.state.store


def caller_of(request: Request) -> Caller | None:
    """The authenticated caller, None when anonymous; 401 on a token we do not know."""
    if "caller" in request.scope:
        return request.scope["caller"]
    header = request.headers.get("authorization")
    caller = None
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            caller = store_of(request).authenticate(token.strip())
        if caller is None:
            # This exact message keeps the client from mistaking the 401 for RepoNotFound.
            raise HubAPIError(401, "Invalid credentials in Authorization header")
    request.scope["caller"] = caller
    return caller


def repo_type(kind: str) -> str:
    if kind not in KINDS:
        raise HubAPIError(404, "Not Found")
    return KINDS[kind]


def open_repo(request: Request, kind: str, ns: str, name: str, *, write: bool = False) -> Repo:
    return store_of(request).open_repo(caller_of(request), repo_type(kind), ns, name, write=write)


def base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def raw_segments(request: Request) -> list[str]:
    """URL path segments still quoted: uvicorn unquotes ``refs%2Fpr%2F1`` into ``refs/pr/1``."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return raw.decode("latin-1").split("/")


def rev_and_path(request: Request, marker_index: int) -> tuple[str, str]:
    """Revision and file path that follow the segment at ``marker_index`` (e.g. ``resolve``)."""
    segments = raw_segments(request)
    rest = segments[marker_index + 1 :]
    if not rest or not rest[0]:
        raise HubAPIError(400, "Missing revision in URL")
    return unquote(rest[0]), unquote("/".join(rest[1:]))


def parse_json(data: bytes, what: str = "Request body") -> Any:
    """Client JSON, or 400 (never a 500): bad syntax or UTF-8, nesting past the recursion limit, lone surrogates."""
    try:
        value = json.loads(data)
        json.dumps(value, ensure_ascii=False).encode()  # "\ud800" parses but can be neither stored nor echoed
    except RecursionError as e:
        raise HubAPIError(400, f"{what} is nested too deeply") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError and UnicodeEncodeError alike
        raise HubAPIError(400, f"{what} is not valid JSON: {e}") from e
    return value


JSON_TYPES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


def field_of(data: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """``data[key]`` checked to be of JSON type ``kind``; ``default`` when absent or null; 400 otherwise."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int too
        expected = " or ".join(JSON_TYPES[k] for k in kinds)
        raise HubAPIError(400, f"Invalid request: '{key}' must be {expected}, not {type(value).__name__}")
    return value


def required_field(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = field_of(data, key, kind)
    if value is None:
        raise HubAPIError(400, f"Invalid request: '{key}' is required")
    return value


def file_json(path: str, entry: Entry) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
    if entry.lfs:
        data["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    return data


def folder_json(path: str, tree: Tree) -> dict[str, Any]:
    return {"type": "directory", "oid": folder_oid(tree, path), "size": 0, "path": path}


def repo_info_json(store: LocalHubStore, repo: Repo, commit: Commit) -> dict[str, Any]:
    tree = store.tree(commit)
    card = card_data(store, tree)
    siblings = []
    for path, entry in sorted(tree.items()):
        sibling: dict[str, Any] = {"rfilename": path, "size": entry.size, "blobId": entry.oid}
        if entry.lfs:
            sibling["lfs"] = {"size": entry.size, "sha256": entry.sha256, "pointerSize": entry.pointer_size}
        siblings.append(sibling)
    info: dict[str, Any] = {
        "_id": f"{repo.type}-{repo.id}",
        "id": repo.repo_id,
        "author": repo.namespace,
        "sha": commit.oid,
        "private": repo.private,
        "disabled": False,
        "gated": store.gate(repo) or False,
        "downloads": 0,
        "likes": 0,
        "tags": card_tags(card),
        "cardData": card,
        "siblings": siblings,
        "lastModified": commit.date,
        "createdAt": repo.created_at,
        "usedStorage": sum(e.size for e in tree.values()),
    }
    if repo.type == "model":
        info["modelId"] = repo.repo_id
        for key in ("library_name", "pipeline_tag"):
            if card and isinstance(card.get(key), str):
                info[key] = card[key]
    return info


def sign_url(store: LocalHubStore, repo: Repo, oid: str, size: int, expires: int) -> str:
    # created_at too: a URL for a deleted repo must not work for a new one that got its id and name.
    message = f"{repo.id}:{repo.created_at}:{repo.type}/{repo.repo_id}:{oid}:{size}:{expires}".encode()
    return hmac.new(store.secret, message, sha256).hexdigest()
