"""The Hub's HTTP API, as much of it as ``huggingface_hub`` needs, over a :class:`LocalHubStore`.

Routes, fields and error headers follow what the real client reads (see
``shared/docs/hub-wire-contract.md``). Only models are exercised by the tests;
datasets and spaces go through the same code.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hmac
import json
import logging
import re
import time
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

import yaml
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hub_export.errors import HubExportError
from hub_export.redact import redact_query

from .objects import Entry, Tree, UploadMismatch, folder_oid, folders
from .store import (
    AddFile,
    AddLfs,
    Caller,
    Commit,
    Delete,
    HubAPIError,
    LocalHubStore,
    Operation,
    Repo,
    entry_not_found,
    lfs_by_default,
    validate_path,
)

logger = logging.getLogger("hub_export.hub.localhub")

KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
XET_MESSAGE = (
    "This local hub has no Xet storage service. Set HF_HUB_DISABLE_XET=1 in the environment (or"
    " huggingface_hub.constants.HF_HUB_DISABLE_XET = True) so huggingface_hub uses the LFS protocol."
)
UPLOAD_URL_TTL = 3600
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.S)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_WRITE_BUFFER = 4 * 1024 * 1024
_HEADER_LIMIT = 1000  # characters of an error message echoed in X-Error-Message
# Request bodies read into memory (JSON, commit payloads with inline files under 10 MB each).
DEFAULT_MAX_BODY = 512 * 1024 * 1024
# One LFS object, streamed to disk: the Hub's own ceiling per file.
DEFAULT_MAX_LFS = 50 * 1000**3
# Model card metadata: the README is read up to 1 MiB, its YAML block up to 256 KiB (parsing is slow).
MAX_CARD_BYTES = 1024 * 1024
MAX_FRONT_MATTER = 256 * 1024
# Routes open to anonymous callers read at most this much, whatever --max-body-mb says.
MAX_ANONYMOUS_BODY = 8 * 1024 * 1024

router = APIRouter()


def create_app(root: str | Path, *, max_body: int = DEFAULT_MAX_BODY, max_lfs: int = DEFAULT_MAX_LFS) -> FastAPI:
    """A FastAPI app serving the hub stored under ``root``.

    ``max_body`` bounds request bodies read into memory, ``max_lfs`` each LFS object (streamed to disk).
    """
    app = FastAPI(title="hub-export local hub", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = LocalHubStore(root)
    app.state.max_lfs = max_lfs
    # Anyone may ask for YAML to be parsed: a few at a time, so such requests never take every worker thread.
    app.state.yaml_slots = asyncio.Semaphore(2)
    app.include_router(router)
    app.add_exception_handler(HubAPIError, _on_hub_error)  # type: ignore[arg-type]
    app.add_exception_handler(HubExportError, _on_input_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected_error)
    app.add_middleware(BodyLimit, max_body=max_body, max_lfs=max_lfs)
    app.add_middleware(RequestLog)
    return app


# -- errors and logging -----------------------------------------------------------


def header_safe(text: str) -> str:
    """Printable ASCII only, bounded: user input copied into a header must not end it (CR, LF) or break it (NUL)."""
    text = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return text[:_HEADER_LIMIT]


def error_response(status: int, message: str, code: str | None = None, **extra: Any) -> JSONResponse:
    """The Hub's error shape: ``{"error": msg}`` plus ``X-Error-Message`` (and ``X-Error-Code``)."""
    headers = {"X-Error-Message": header_safe(message)}
    if code:
        headers["X-Error-Code"] = header_safe(code)
    message = message.encode("utf-8", "replace").decode()  # a lone surrogate from the client cannot be encoded
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _on_hub_error(_: Request, exc: HubAPIError) -> JSONResponse:
    response = error_response(exc.status, exc.message, exc.code)
    response.headers.update({name: header_safe(value) for name, value in exc.headers.items()})
    return response


def _on_input_error(_: Request, exc: HubExportError) -> JSONResponse:
    return error_response(400, str(exc))


def _on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail))


def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(400, f"Invalid request: {exc.errors()}")


def _on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    """A bug still answers in the Hub's shape (the traceback goes to the server log)."""
    return error_response(500, f"Internal error of the local hub: {type(exc).__name__}")


def too_large(limit: int, hint: str = " (hub serve --max-body-mb)") -> HubAPIError:
    return HubAPIError(413, f"Request body larger than {limit} bytes, the most this hub accepts here{hint}")


class BodyLimit:
    """Bound request bodies: 413 from Content-Length before reading, else once the stream passes the limit.

    LFS object uploads stream to disk and get their own, larger limit.
    """

    def __init__(self, app: ASGIApp, max_body: int, max_lfs: int):
        self.app = app
        self.max_body = max_body
        self.max_lfs = max_lfs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_lfs if scope["path"].startswith("/api/lfs-upload/") else self.max_body
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:  # h11 has already refused malformed lengths
            error = too_large(limit)
            await error_response(error.status, error.message)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise too_large(limit)  # raised inside the handler's read: answered by _on_hub_error
            return message

        await self.app(scope, counted, send)


class RequestLog:
    """One log line per request: method, path (secrets redacted), status, milliseconds."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            query = scope.get("query_string", b"").decode("latin-1")
            path = scope["path"] + (f"?{redact_query(query)}" if query else "")
            elapsed = (time.perf_counter() - start) * 1000
            logger.info("%s %s %d %.1fms", scope["method"], path, status, elapsed)


# -- helpers ----------------------------------------------------------------------


def _store(request: Request) -> LocalHubStore:
    return request.app.state.store


def _caller(request: Request) -> Caller | None:
    """The authenticated caller, None when anonymous; 401 on a token we do not know."""
    if "caller" in request.scope:
        return request.scope["caller"]
    header = request.headers.get("authorization")
    caller = None
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            caller = _store(request).authenticate(token.strip())
        if caller is None:
            # This exact message keeps the client from mistaking the 401 for RepoNotFound.
            raise HubAPIError(401, "Invalid credentials in Authorization header")
    request.scope["caller"] = caller
    return caller


def _repo_type(kind: str) -> str:
    if kind not in KINDS:
        raise HubAPIError(404, "Not Found")
    return KINDS[kind]


def _open(request: Request, kind: str, ns: str, name: str, *, write: bool = False) -> Repo:
    return _store(request).open_repo(_caller(request), _repo_type(kind), ns, name, write=write)


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _raw_segments(request: Request) -> list[str]:
    """URL path segments still quoted: uvicorn unquotes ``refs%2Fpr%2F1`` into ``refs/pr/1``."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return raw.decode("latin-1").split("/")


def _rev_and_path(request: Request, marker_index: int) -> tuple[str, str]:
    """Revision and file path that follow the segment at ``marker_index`` (e.g. ``resolve``)."""
    segments = _raw_segments(request)
    rest = segments[marker_index + 1 :]
    if not rest or not rest[0]:
        raise HubAPIError(400, "Missing revision in URL")
    return unquote(rest[0]), unquote("/".join(rest[1:]))


async def _writer(request: Request, kind: str, ns: str, name: str) -> Repo:
    """The repo if the caller may write it, checked before the body is read: no token, no upload."""
    return await run_in_threadpool(_open, request, kind, ns, name, write=True)


async def _authenticated(request: Request, what: str) -> Caller:
    """The caller behind a write token, checked before the body is read (401/403 otherwise)."""
    caller = await run_in_threadpool(_caller, request)
    if caller is None:
        raise HubAPIError(401, f"You must be authenticated to {what}: pass a token.")
    if not caller.can_write:
        raise HubAPIError(403, f"Your token is read-only: it cannot {what}")
    return caller


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


async def _body(request: Request, limit: int | None = None) -> bytes:
    """The request body; with ``limit`` (tighter than the app-wide one), a 413 instead of reading past it."""
    if limit is None:
        return await request.body()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit, "")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit, "")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json(request: Request, limit: int | None = None) -> dict[str, Any]:
    body = parse_json(await _body(request, limit) or b"{}")
    if not isinstance(body, dict):
        raise HubAPIError(400, "Request body must be a JSON object")
    return body


_JSON_TYPES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """``data[key]`` checked to be of JSON type ``kind``; ``default`` when absent or null; 400 otherwise."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int too
        expected = " or ".join(_JSON_TYPES[k] for k in kinds)
        raise HubAPIError(400, f"Invalid request: '{key}' must be {expected}, not {type(value).__name__}")
    return value


def _required(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = _field(data, key, kind)
    if value is None:
        raise HubAPIError(400, f"Invalid request: '{key}' is required")
    return value


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


def _card_data(store: LocalHubStore, tree: Tree) -> dict[str, Any] | None:
    entry = tree.get("README.md")
    if entry is None or entry.size > MAX_CARD_BYTES:
        return None
    return _card_of_blob(store.blobs.path(entry.sha256))


def _tags(card: dict[str, Any] | None) -> list[str]:
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


def _file_json(path: str, entry: Entry) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
    if entry.lfs:
        data["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    return data


def _folder_json(path: str, tree: Tree) -> dict[str, Any]:
    return {"type": "directory", "oid": folder_oid(tree, path), "size": 0, "path": path}


def _repo_info(store: LocalHubStore, repo: Repo, commit: Commit) -> dict[str, Any]:
    tree = store.tree(commit)
    card = _card_data(store, tree)
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
        "tags": _tags(card),
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


def _sign(store: LocalHubStore, repo: Repo, oid: str, size: int, expires: int) -> str:
    # created_at too: a URL for a deleted repo must not work for a new one that got its id and name.
    message = f"{repo.id}:{repo.created_at}:{repo.type}/{repo.repo_id}:{oid}:{size}:{expires}".encode()
    return hmac.new(store.secret, message, sha256).hexdigest()


# -- account and repo management --------------------------------------------------


@router.get("/api/whoami-v2")
def whoami(request: Request) -> dict[str, Any]:
    caller = _caller(request)
    if caller is None:
        raise HubAPIError(401, "Authentication required: pass a token (Authorization: Bearer hf_...)")
    orgs = [{"type": "org", "name": o, "fullname": o, "roleInOrg": r} for o, r in sorted(caller.orgs.items())]
    role = "write" if caller.can_write else "read"
    return {
        "type": "user",
        "id": caller.name,
        "name": caller.name,
        "fullname": caller.name,
        "email": None,
        "emailVerified": False,
        "isPro": False,
        "orgs": orgs,
        "auth": {"type": "access_token", "accessToken": {"displayName": "local", "role": role}},
    }


@router.post("/api/validate-yaml")
async def validate_yaml(request: Request) -> JSONResponse:
    body = await _json(request, MAX_ANONYMOUS_BODY)  # open to anyone: never read much
    content = _field(body, "content", str, "")
    if len(content) > MAX_CARD_BYTES:
        raise HubAPIError(413, f"README.md is larger than {MAX_CARD_BYTES // 1024} KiB")
    try:
        # A thread: parsing even a bounded block takes a while, and the event loop serves everyone.
        async with request.app.state.yaml_slots:
            await run_in_threadpool(parse_front_matter, content)
    except yaml.YAMLError as e:
        message = f"Invalid YAML metadata in README.md: {' '.join(str(e).split())}"
        return JSONResponse({"errors": [{"message": message}], "warnings": []}, status_code=400)
    return JSONResponse({"errors": [], "warnings": []})


@router.post("/api/repos/create")
async def create_repo(request: Request) -> JSONResponse:
    caller = await _authenticated(request, "create a repo")
    body = await _json(request)
    name = _required(body, "name", str)
    namespace = _field(body, "organization", str) or caller.name
    private = _field(body, "visibility", str) == "private" or _field(body, "private", bool) is True
    repo_type = _field(body, "type", str) or "model"

    def create() -> tuple[Repo, bool]:
        return _store(request).create_repo(caller, repo_type, namespace, name, private=private)

    repo, created = await run_in_threadpool(create)
    url = f"{_base(request)}/{repo.url_path}"
    if not created:
        return error_response(409, f"You already created this {repo.type} repo", url=url)
    return JSONResponse({"url": url, "name": repo.repo_id, "id": repo.repo_id})


@router.delete("/api/repos/delete")
async def delete_repo(request: Request) -> Response:
    caller = await _authenticated(request, "delete a repo")
    body = await _json(request)
    kind = f"{_field(body, 'type', str) or 'model'}s"
    namespace = _field(body, "organization", str) or caller.name
    name = _required(body, "name", str)

    def delete() -> None:
        _store(request).delete_repo(_open(request, kind, namespace, name, write=True))

    await run_in_threadpool(delete)
    return Response(status_code=200)


@router.put("/api/{kind}/{ns}/{name}/settings")
async def update_settings(request: Request, kind: str, ns: str, name: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    body = await _json(request)
    private = _field(body, "private", bool)
    if _field(body, "visibility", str) is not None:
        private = body["visibility"] == "private"
    gated = _field(body, "gated", (str, bool))

    def update() -> dict[str, Any]:
        if private is not None:
            _store(request).set_private(repo, private)
        if "gated" in body:
            _store(request).set_gate(repo, gated or None)
        return {"private": repo.private if private is None else private, "gated": _store(request).gate(repo) or False}

    return await run_in_threadpool(update)


# -- reading ----------------------------------------------------------------------


@router.get("/api/{kind}")
def list_repos(request: Request, kind: str, author: str | None = None, search: str | None = None) -> list[dict]:
    repos = _store(request).list_repos(_caller(request), _repo_type(kind), author)
    found = [r for r in repos if not search or search.lower() in r.repo_id.lower()]
    return [{"id": r.repo_id, "author": r.namespace, "private": r.private, "createdAt": r.created_at} for r in found]


@router.get("/api/{kind}/{ns}/{name}")
def repo_info(request: Request, kind: str, ns: str, name: str) -> dict[str, Any]:
    repo = _open(request, kind, ns, name)
    store = _store(request)
    return _repo_info(store, repo, store.resolve(repo, "main"))


@router.get("/api/{kind}/{ns}/{name}/revision/{rev:path}")
def repo_info_at(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = _open(request, kind, ns, name)
    store = _store(request)
    return _repo_info(store, repo, store.resolve(repo, rev))


@router.get("/api/{kind}/{ns}/{name}/tree/{rest:path}")
def list_tree(request: Request, kind: str, ns: str, name: str, rest: str, recursive: str = "false") -> list[dict]:
    repo = _open(request, kind, ns, name)
    rev, path = _rev_and_path(request, marker_index=5)
    store = _store(request)
    commit = store.resolve(repo, rev)
    tree = store.tree(commit)
    return _list_tree(tree, path.strip("/"), recursive.lower() in ("1", "true", "yes"), commit.oid)


def _list_tree(tree: Tree, folder: str, recursive: bool, commit: str) -> list[dict[str, Any]]:
    all_folders = folders(tree)
    if folder and folder not in all_folders:
        if folder in tree:
            return [_file_json(folder, tree[folder])]
        raise entry_not_found(f"Entry not found: {folder}", commit)
    prefix = f"{folder}/" if folder else ""

    def listed(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    dirs = [_folder_json(d, tree) for d in sorted(all_folders) if listed(d)]
    return dirs + [_file_json(p, e) for p, e in sorted(tree.items()) if listed(p)]


@router.post("/api/{kind}/{ns}/{name}/paths-info/{rev:path}")
async def paths_info(request: Request, kind: str, ns: str, name: str, rev: str) -> list[dict]:
    repo = await run_in_threadpool(_open, request, kind, ns, name)
    try:
        form = parse_qs((await _body(request, MAX_ANONYMOUS_BODY)).decode(), keep_blank_values=True)
    except UnicodeDecodeError as e:
        raise HubAPIError(400, f"Request body is not a UTF-8 form: {e}") from e

    def describe() -> list[dict[str, Any]]:
        store = _store(request)
        tree = store.tree(store.resolve(repo, rev))
        all_folders = folders(tree)
        found = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in tree:
                found.append(_file_json(path, tree[path]))
            elif path in all_folders:
                found.append(_folder_json(path, tree))
        return found

    return await run_in_threadpool(describe)


@router.get("/api/{kind}/{ns}/{name}/commits/{rev:path}")
def list_commits(request: Request, kind: str, ns: str, name: str, rev: str) -> list[dict]:
    repo = _open(request, kind, ns, name)
    return [
        {"id": c.oid, "title": c.title, "message": c.message, "authors": [{"user": c.author}], "date": c.date}
        for c in _store(request).history(repo, rev)
    ]


@router.get("/api/{kind}/{ns}/{name}/refs")
def list_refs(request: Request, kind: str, ns: str, name: str, include_prs: bool = False) -> dict[str, Any]:
    repo = _open(request, kind, ns, name)
    groups: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": [], "pullRequests": []}
    where = {"refs/heads/": "branches", "refs/tags/": "tags", "refs/pr/": "pullRequests"}
    for ref, target in _store(request).refs(repo).items():
        for prefix, group in where.items():
            if ref.startswith(prefix):
                groups[group].append({"name": ref[len(prefix) :], "ref": ref, "targetCommit": target})
    if not include_prs:
        del groups["pullRequests"]
    return groups


# -- branches and tags ------------------------------------------------------------


@router.post("/api/{kind}/{ns}/{name}/branch/{branch:path}")
async def create_branch(request: Request, kind: str, ns: str, name: str, branch: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    start = _field(await _json(request), "startingPoint", str) or "main"
    return await _create_ref(request, repo, f"refs/heads/{branch}", start)


@router.delete("/api/{kind}/{ns}/{name}/branch/{branch:path}")
def delete_branch(request: Request, kind: str, ns: str, name: str, branch: str) -> dict[str, Any]:
    return _delete_ref(request, kind, ns, name, f"refs/heads/{branch}")


@router.post("/api/{kind}/{ns}/{name}/tag/{rev:path}")
async def create_tag(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    tag = _required(await _json(request), "tag", str)
    return await _create_ref(request, repo, f"refs/tags/{tag}", rev)


@router.delete("/api/{kind}/{ns}/{name}/tag/{tag:path}")
def delete_tag(request: Request, kind: str, ns: str, name: str, tag: str) -> dict[str, Any]:
    return _delete_ref(request, kind, ns, name, f"refs/tags/{tag}")


async def _create_ref(request: Request, repo, ref: str, start: str) -> dict[str, Any]:
    await run_in_threadpool(_store(request).create_ref, repo, ref, start)
    return {}


def _delete_ref(request: Request, kind: str, ns: str, name: str, ref: str) -> dict[str, Any]:
    _store(request).delete_ref(_open(request, kind, ns, name, write=True), ref)
    return {}


# -- uploads ----------------------------------------------------------------------


@router.post("/api/{kind}/{ns}/{name}/preupload/{rev:path}")
async def preupload(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    items = [_preupload_item(item) for item in _field(await _json(request), "files", list, [])]

    def plan() -> dict[str, Any]:
        store = _store(request)
        tree = store.tree(store.resolve(repo, rev))
        files = []
        for path, size, sample in items:
            answer = {"path": path, "uploadMode": "lfs" if lfs_by_default(path, size, sample) else "regular"}
            answer["shouldIgnore"] = False
            if path in tree:
                answer["oid"] = tree[path].etag  # equal to the client's local oid => file skipped
            files.append(answer)
        return {"files": files, "commitOid": None}

    return await run_in_threadpool(plan)


def _preupload_item(item: Any) -> tuple[str, int, bytes]:
    """``(path, size, sample)`` of one file the client is about to upload."""
    if not isinstance(item, dict):
        raise HubAPIError(400, "Invalid request: each of 'files' must be an object")
    try:
        sample = base64.b64decode(_field(item, "sample", str, ""), validate=True)
    except binascii.Error as e:
        raise HubAPIError(400, f"Invalid request: 'sample' is not base64: {e}") from e
    return _required(item, "path", str), _field(item, "size", int, 0), sample


@router.post("/api/{kind}/{ns}/{name}/commit/{rev:path}")
async def commit(request: Request, kind: str, ns: str, name: str, rev: str, create_pr: str = "") -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)  # before the body: an anonymous upload is refused unread
    body = await request.body()

    def run() -> dict[str, Any]:
        caller = _caller(request)
        store = _store(request)
        header, operations = _parse_commit(store, body)
        result = store.commit(
            repo,
            caller.name if caller else "",
            rev,
            operations,
            summary=_field(header, "summary", str, ""),
            description=_field(header, "description", str, ""),
            parent_commit=_field(header, "parentCommit", str),
            create_pr=create_pr.lower() in ("1", "true"),
        )
        url = f"{_base(request)}/{repo.url_path}"
        pr_url = f"{url}/discussions/{result.pr_num}" if result.pr_num is not None else None
        return {
            "success": True,
            "commitOid": result.oid,
            "commitUrl": f"{url}/commit/{result.oid}",
            "pullRequestUrl": pr_url,
        }

    return await run_in_threadpool(run)


def _parse_commit(store: LocalHubStore, body: bytes) -> tuple[dict[str, Any], list[Operation]]:
    """Decode the ndjson commit payload; inline file contents go to the blob store right away."""
    header: dict[str, Any] = {}
    operations: list[Operation] = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        item = parse_json(line, f"Commit payload line {number}")
        if not isinstance(item, dict) or not isinstance(item.get("value"), dict):
            raise HubAPIError(400, f'Malformed commit payload line {number}: expected {{"key": ..., "value": {{...}}}}')
        if item.get("key") == "header":
            header = item["value"]
        else:
            operations.append(_operation(store, item.get("key"), item["value"]))
    if not _field(header, "summary", str):
        raise HubAPIError(400, "A commit needs a summary (the commit message)")
    return header, operations


def _operation(store: LocalHubStore, key: Any, value: dict[str, Any]) -> Operation:
    """One operation of a commit payload, its fields checked before anything is stored."""
    path = _required(value, "path", str)
    if key == "file":
        validate_path(path)
        content = _field(value, "content", str, "")
        try:
            data = base64.b64decode(content, validate=True) if value.get("encoding") == "base64" else content.encode()
        except binascii.Error as e:
            raise HubAPIError(400, f"Invalid content for '{path}': {e}") from e
        store.blobs.put(data)
        return AddFile(path, Entry.regular(data))
    if key == "lfsFile":
        oid = _field(value, "oid", str, "")
        if _field(value, "algo", str, "sha256") != "sha256" or not _SHA256.fullmatch(oid):
            raise HubAPIError(400, f"Invalid LFS oid for '{path}': expected a sha256")
        return AddLfs(validate_path(path), oid, _field(value, "size", int))
    if key in ("deletedFile", "deletedFolder"):
        return Delete(path, folder=key == "deletedFolder")
    raise HubAPIError(400, f"Unsupported commit operation '{key}'")


@router.get("/api/{kind}/{ns}/{name}/xet-write-token/{rev:path}")
@router.get("/api/{kind}/{ns}/{name}/xet-read-token/{rev:path}")
def xet_token(kind: str, ns: str, name: str, rev: str) -> JSONResponse:
    return error_response(501, XET_MESSAGE)


def _lfs_routes(prefix: str) -> None:
    """Register the LFS batch and verify endpoints under one repo-type URL prefix."""

    kind = prefix.strip("/") or "models"

    @router.post(prefix + "/{ns}/{name}.git/info/lfs/objects/batch")
    async def lfs_batch(request: Request, ns: str, name: str) -> JSONResponse:
        repo = await _writer(request, kind, ns, name)
        body = await _json(request)
        if body.get("operation") != "upload":
            raise HubAPIError(400, "This local hub only supports LFS uploads; download files through /resolve/")
        objects = _field(body, "objects", list, [])
        if not all(isinstance(obj, dict) for obj in objects):
            raise HubAPIError(400, "Invalid request: each of 'objects' must be an object")
        answer = await run_in_threadpool(_lfs_batch, request, repo, objects)
        return JSONResponse(answer, media_type="application/vnd.git-lfs+json")

    @router.post(prefix + "/{ns}/{name}.git/info/lfs/objects/verify")
    async def lfs_verify(request: Request, ns: str, name: str) -> dict[str, Any]:
        repo = await _writer(request, kind, ns, name)
        body = await _json(request)
        oid, size = _required(body, "oid", str), _required(body, "size", int)
        if await run_in_threadpool(_store(request).object_size, repo, oid) != size:
            raise HubAPIError(404, f"LFS object {oid} of size {size} is not stored")
        return {"message": "verified"}


def _lfs_batch(request: Request, repo: Repo, objects: list[dict[str, Any]]) -> dict[str, Any]:
    store = _store(request)
    max_lfs = request.app.state.max_lfs
    base, expires = _base(request), int(time.time()) + UPLOAD_URL_TTL
    answers = []
    for obj in objects:
        oid, size = str(obj.get("oid")), obj.get("size")
        if not _SHA256.fullmatch(oid) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            error = {"code": 422, "message": "oid must be a sha256 hex digest and size a non-negative integer"}
            answers.append({"oid": oid[:64], "size": 0, "error": error})
        elif size > max_lfs:
            error = {"code": 422, "message": f"size {size} is larger than this hub's {max_lfs}-byte limit per file"}
            answers.append({"oid": oid, "size": 0, "error": error})
        elif store.object_size(repo, oid) == size:
            store.touch_object(oid)  # the client will commit it without uploading: keep gc off it
            answers.append({"oid": oid, "size": size})  # no actions: the client skips the upload
        else:
            query = urlencode({"size": size, "expires": expires, "sig": _sign(store, repo, oid, size, expires)})
            upload = f"{base}/api/lfs-upload/{repo.type}/{repo.repo_id}/{oid}?{query}"
            verify = f"{base}/{repo.url_path}.git/info/lfs/objects/verify"
            actions = {"upload": {"href": upload, "expires_in": UPLOAD_URL_TTL}, "verify": {"href": verify}}
            answers.append({"oid": oid, "size": size, "authenticated": True, "actions": actions})
    return {"transfer": "basic", "objects": answers, "hash_algo": "sha256"}


for _prefix in ("", "/datasets", "/spaces"):
    _lfs_routes(_prefix)


@router.put("/api/lfs-upload/{repo_type}/{ns}/{name}/{oid}")
async def lfs_upload(request: Request, repo_type: str, ns: str, name: str, oid: str) -> Response:
    """Receive one LFS object. No auth header comes here: the signed URL is the credential."""
    store = _store(request)
    params = request.query_params
    try:
        size, expires, sig = int(params["size"]), int(params["expires"]), params["sig"]
    except (KeyError, ValueError) as e:
        raise HubAPIError(403, "Invalid upload URL: request a new one through the LFS batch endpoint") from e
    repo = await run_in_threadpool(store.find_repo, repo_type, ns, name)
    expected = _sign(store, repo, oid, size, expires).encode() if repo else b""
    if repo is None or expires < time.time() or not hmac.compare_digest(sig.encode(), expected):
        raise HubAPIError(403, "Invalid or expired upload URL: request a new one through the LFS batch endpoint")
    writer = await run_in_threadpool(store.blobs.writer, max_size=size)
    try:
        buffer = bytearray()
        async for chunk in request.stream():
            buffer += chunk
            if len(buffer) >= _WRITE_BUFFER:
                await run_in_threadpool(writer.write, bytes(buffer))
                buffer.clear()
        await run_in_threadpool(writer.write, bytes(buffer))
        await run_in_threadpool(writer.finish, oid, size)
    except UploadMismatch as e:
        raise HubAPIError(400, f"Rejected LFS upload {oid}: {e}") from e
    finally:
        writer.abort()  # no-op once finished
    await run_in_threadpool(store.add_object, repo, oid, size)
    return Response(status_code=200)


# -- downloads --------------------------------------------------------------------


def _resolve_routes(prefix: str, kind: str) -> None:
    marker_index = prefix.count("/") + 3  # "", [prefix], ns, name, "resolve"

    @router.api_route(prefix + "/{ns}/{name}/resolve/{rest:path}", methods=["GET", "HEAD"])
    def resolve_file(request: Request, ns: str, name: str, rest: str) -> Response:
        repo = _open(request, kind, ns, name)
        rev, path = _rev_and_path(request, marker_index)
        store = _store(request)
        store.require_file_access(_caller(request), repo)
        commit = store.resolve(repo, rev)
        entry = store.tree(commit).get(path)
        if entry is None:
            raise entry_not_found(f"Entry not found: {path}", commit.oid)
        headers = {
            "ETag": f'"{entry.etag}"',
            "X-Repo-Commit": commit.oid,
            "X-Linked-Etag": f'"{entry.etag}"',
            "X-Linked-Size": str(entry.size),
        }
        # FileResponse answers HEAD without a body and honours Range (206/416).
        return FileResponse(store.blobs.path(entry.sha256), headers=headers, media_type="application/octet-stream")


for _prefix, _kind in (("", "models"), ("/datasets", "datasets"), ("/spaces", "spaces")):
    _resolve_routes(_prefix, _kind)
