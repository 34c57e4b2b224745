"""The Hub's HTTP API, as much of it as ``huggingface_hub`` needs, over a :class:`LocalHubStore`.

Routes, fields and error headers follow what the real client reads (see
``shared/docs/hub-wire-contract.md``). Only models are exercised by the tests;
datasets and spaces go through the same code.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import yaml
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hub_export.errors import HubExportError
from hub_export.hub.localhub.cards import MAX_CARD_BYTES, parse_front_matter
from hub_export.hub.localhub.context import (
    base_url,
    caller_of,
    field_of,
    file_json,
    folder_json,
    open_repo,
    parse_json,
    repo_info_json,
    repo_type,
    required_field,
    rev_and_path,
    sign_url,
    store_of,
)
from hub_export.hub.localhub.objects import Tree, UploadMismatch, folders
from hub_export.hub.localhub.records import Caller, HubAPIError, Repo, entry_not_found
from hub_export.hub.localhub.responses import (
    BodyLimit,
    RequestLog,
    error_response,
    on_http_error,
    on_hub_error,
    on_input_error,
    on_unexpected_error,
    on_validation_error,
    too_large,
)
from hub_export.hub.localhub.storage import lfs_by_default
from hub_export.hub.localhub.store import LocalHubStore
from hub_export.hub.localhub.uploads import SHA256_HEX, parse_commit, preupload_item

logger = logging.getLogger("hub_export.hub.localhub")

XET_MESSAGE = (
    "This local hub has no Xet storage service. Set HF_HUB_DISABLE_XET=1 in the environment (or"
    " huggingface_hub.constants.HF_HUB_DISABLE_XET = True) so huggingface_hub uses the LFS protocol."
)
UPLOAD_URL_TTL = 3600
_WRITE_BUFFER = 4 * 1024 * 1024
# Request bodies read into memory (JSON, commit payloads with inline files under 10 MB each).
DEFAULT_MAX_BODY = 512 * 1024 * 1024
# One LFS object, streamed to disk: the Hub's own ceiling per file.
DEFAULT_MAX_LFS = 50 * 1000**3
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
    app.add_exception_handler(HubAPIError, on_hub_error)  # type: ignore[arg-type]
    app.add_exception_handler(HubExportError, on_input_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_unexpected_error)
    app.add_middleware(BodyLimit, max_body=max_body, max_lfs=max_lfs)
    app.add_middleware(RequestLog)
    return app


# -- errors and logging -----------------------------------------------------------


# -- helpers ----------------------------------------------------------------------


async def _writer(request: Request, kind: str, ns: str, name: str) -> Repo:
    """The repo if the caller may write it, checked before the body is read: no token, no upload."""
    return await run_in_threadpool(open_repo, request, kind, ns, name, write=True)


async def _authenticated(request: Request, what: str) -> Caller:
    """The caller behind a write token, checked before the body is read (401/403 otherwise)."""
    caller = await run_in_threadpool(caller_of, request)
    if caller is None:
        raise HubAPIError(401, f"You must be authenticated to {what}: pass a token.")
    if not caller.can_write:
        raise HubAPIError(403, f"Your token is read-only: it cannot {what}")
    return caller


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


# -- account and repo management --------------------------------------------------


@router.get("/api/whoami-v2")
def whoami(request: Request) -> dict[str, Any]:
    caller = caller_of(request)
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
    content = field_of(body, "content", str, "")
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
    name = required_field(body, "name", str)
    namespace = field_of(body, "organization", str) or caller.name
    private = field_of(body, "visibility", str) == "private" or field_of(body, "private", bool) is True
    repo_type = field_of(body, "type", str) or "model"

    def create() -> tuple[Repo, bool]:
        return store_of(request).create_repo(caller, repo_type, namespace, name, private=private)

    repo, created = await run_in_threadpool(create)
    url = f"{base_url(request)}/{repo.url_path}"
    if not created:
        return error_response(409, f"You already created this {repo.type} repo", url=url)
    return JSONResponse({"url": url, "name": repo.repo_id, "id": repo.repo_id})


@router.delete("/api/repos/delete")
async def delete_repo(request: Request) -> Response:
    caller = await _authenticated(request, "delete a repo")
    body = await _json(request)
    kind = f"{field_of(body, 'type', str) or 'model'}s"
    namespace = field_of(body, "organization", str) or caller.name
    name = required_field(body, "name", str)

    def delete() -> None:
        store_of(request).delete_repo(open_repo(request, kind, namespace, name, write=True))

    await run_in_threadpool(delete)
    return Response(status_code=200)


@router.put("/api/{kind}/{ns}/{name}/settings")
async def update_settings(request: Request, kind: str, ns: str, name: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    body = await _json(request)
    private = field_of(body, "private", bool)
    if field_of(body, "visibility", str) is not None:
        private = body["visibility"] == "private"
    gated = field_of(body, "gated", (str, bool))

    def update() -> dict[str, Any]:
        if private is not None:
            store_of(request).set_private(repo, private)
        if "gated" in body:
            store_of(request).set_gate(repo, gated or None)
        return {"private": repo.private if private is None else private, "gated": store_of(request).gate(repo) or False}

    return await run_in_threadpool(update)


# -- reading ----------------------------------------------------------------------


@router.get("/api/{kind}")
def list_repos(request: Request, kind: str, author: str | None = None, search: str | None = None) -> list[dict]:
    repos = store_of(request).list_repos(caller_of(request), repo_type(kind), author)
    found = [r for r in repos if not search or search.lower() in r.repo_id.lower()]
    return [{"id": r.repo_id, "author": r.namespace, "private": r.private, "createdAt": r.created_at} for r in found]


@router.get("/api/{kind}/{ns}/{name}")
def repo_info(request: Request, kind: str, ns: str, name: str) -> dict[str, Any]:
    repo = open_repo(request, kind, ns, name)
    store = store_of(request)
    return repo_info_json(store, repo, store.resolve(repo, "main"))


@router.get("/api/{kind}/{ns}/{name}/revision/{rev:path}")
def repo_info_at(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = open_repo(request, kind, ns, name)
    store = store_of(request)
    return repo_info_json(store, repo, store.resolve(repo, rev))


@router.get("/api/{kind}/{ns}/{name}/tree/{rest:path}")
def list_tree(request: Request, kind: str, ns: str, name: str, rest: str, recursive: str = "false") -> list[dict]:
    repo = open_repo(request, kind, ns, name)
    rev, path = rev_and_path(request, marker_index=5)
    store = store_of(request)
    commit = store.resolve(repo, rev)
    tree = store.tree(commit)
    return _list_tree(tree, path.strip("/"), recursive.lower() in ("1", "true", "yes"), commit.oid)


def _list_tree(tree: Tree, folder: str, recursive: bool, commit: str) -> list[dict[str, Any]]:
    all_folders = folders(tree)
    if folder and folder not in all_folders:
        if folder in tree:
            return [file_json(folder, tree[folder])]
        raise entry_not_found(f"Entry not found: {folder}", commit)
    prefix = f"{folder}/" if folder else ""

    def listed(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    dirs = [folder_json(d, tree) for d in sorted(all_folders) if listed(d)]
    return dirs + [file_json(p, e) for p, e in sorted(tree.items()) if listed(p)]


@router.post("/api/{kind}/{ns}/{name}/paths-info/{rev:path}")
async def paths_info(request: Request, kind: str, ns: str, name: str, rev: str) -> list[dict]:
    repo = await run_in_threadpool(open_repo, request, kind, ns, name)
    try:
        form = parse_qs((await _body(request, MAX_ANONYMOUS_BODY)).decode(), keep_blank_values=True)
    except UnicodeDecodeError as e:
        raise HubAPIError(400, f"Request body is not a UTF-8 form: {e}") from e

    def describe() -> list[dict[str, Any]]:
        store = store_of(request)
        tree = store.tree(store.resolve(repo, rev))
        all_folders = folders(tree)
        found = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in tree:
                found.append(file_json(path, tree[path]))
            elif path in all_folders:
                found.append(folder_json(path, tree))
        return found

    return await run_in_threadpool(describe)


@router.get("/api/{kind}/{ns}/{name}/commits/{rev:path}")
def list_commits(request: Request, kind: str, ns: str, name: str, rev: str) -> list[dict]:
    repo = open_repo(request, kind, ns, name)
    return [
        {"id": c.oid, "title": c.title, "message": c.message, "authors": [{"user": c.author}], "date": c.date}
        for c in store_of(request).history(repo, rev)
    ]


@router.get("/api/{kind}/{ns}/{name}/refs")
def list_refs(request: Request, kind: str, ns: str, name: str, include_prs: bool = False) -> dict[str, Any]:
    repo = open_repo(request, kind, ns, name)
    groups: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": [], "pullRequests": []}
    where = {"refs/heads/": "branches", "refs/tags/": "tags", "refs/pr/": "pullRequests"}
    for ref, target in store_of(request).refs(repo).items():
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
    start = field_of(await _json(request), "startingPoint", str) or "main"
    return await _create_ref(request, repo, f"refs/heads/{branch}", start)


@router.delete("/api/{kind}/{ns}/{name}/branch/{branch:path}")
def delete_branch(request: Request, kind: str, ns: str, name: str, branch: str) -> dict[str, Any]:
    return _delete_ref(request, kind, ns, name, f"refs/heads/{branch}")


@router.post("/api/{kind}/{ns}/{name}/tag/{rev:path}")
async def create_tag(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    tag = required_field(await _json(request), "tag", str)
    return await _create_ref(request, repo, f"refs/tags/{tag}", rev)


@router.delete("/api/{kind}/{ns}/{name}/tag/{tag:path}")
def delete_tag(request: Request, kind: str, ns: str, name: str, tag: str) -> dict[str, Any]:
    return _delete_ref(request, kind, ns, name, f"refs/tags/{tag}")


async def _create_ref(request: Request, repo, ref: str, start: str) -> dict[str, Any]:
    await run_in_threadpool(store_of(request).create_ref, repo, ref, start)
    return {}


def _delete_ref(request: Request, kind: str, ns: str, name: str, ref: str) -> dict[str, Any]:
    store_of(request).delete_ref(open_repo(request, kind, ns, name, write=True), ref)
    return {}


# -- uploads ----------------------------------------------------------------------


@router.post("/api/{kind}/{ns}/{name}/preupload/{rev:path}")
async def preupload(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)
    items = [preupload_item(item) for item in field_of(await _json(request), "files", list, [])]

    def plan() -> dict[str, Any]:
        store = store_of(request)
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


@router.post("/api/{kind}/{ns}/{name}/commit/{rev:path}")
async def commit(request: Request, kind: str, ns: str, name: str, rev: str, create_pr: str = "") -> dict[str, Any]:
    repo = await _writer(request, kind, ns, name)  # before the body: an anonymous upload is refused unread
    body = await request.body()

    def run() -> dict[str, Any]:
        caller = caller_of(request)
        store = store_of(request)
        header, operations = parse_commit(store, body)
        result = store.commit(
            repo,
            caller.name if caller else "",
            rev,
            operations,
            summary=field_of(header, "summary", str, ""),
            description=field_of(header, "description", str, ""),
            parent_commit=field_of(header, "parentCommit", str),
            create_pr=create_pr.lower() in ("1", "true"),
        )
        url = f"{base_url(request)}/{repo.url_path}"
        pr_url = f"{url}/discussions/{result.pr_num}" if result.pr_num is not None else None
        return {
            "success": True,
            "commitOid": result.oid,
            "commitUrl": f"{url}/commit/{result.oid}",
            "pullRequestUrl": pr_url,
        }

    return await run_in_threadpool(run)


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
        objects = field_of(body, "objects", list, [])
        if not all(isinstance(obj, dict) for obj in objects):
            raise HubAPIError(400, "Invalid request: each of 'objects' must be an object")
        answer = await run_in_threadpool(_lfs_batch, request, repo, objects)
        return JSONResponse(answer, media_type="application/vnd.git-lfs+json")

    @router.post(prefix + "/{ns}/{name}.git/info/lfs/objects/verify")
    async def lfs_verify(request: Request, ns: str, name: str) -> dict[str, Any]:
        repo = await _writer(request, kind, ns, name)
        body = await _json(request)
        oid, size = required_field(body, "oid", str), required_field(body, "size", int)
        if await run_in_threadpool(store_of(request).object_size, repo, oid) != size:
            raise HubAPIError(404, f"LFS object {oid} of size {size} is not stored")
        return {"message": "verified"}


def _lfs_batch(request: Request, repo: Repo, objects: list[dict[str, Any]]) -> dict[str, Any]:
    store = store_of(request)
    max_lfs = request.app.state.max_lfs
    base, expires = base_url(request), int(time.time()) + UPLOAD_URL_TTL
    answers = []
    for obj in objects:
        oid, size = str(obj.get("oid")), obj.get("size")
        if not SHA256_HEX.fullmatch(oid) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            error = {"code": 422, "message": "oid must be a sha256 hex digest and size a non-negative integer"}
            answers.append({"oid": oid[:64], "size": 0, "error": error})
        elif size > max_lfs:
            error = {"code": 422, "message": f"size {size} is larger than this hub's {max_lfs}-byte limit per file"}
            answers.append({"oid": oid, "size": 0, "error": error})
        elif store.object_size(repo, oid) == size:
            store.touch_object(oid)  # the client will commit it without uploading: keep gc off it
            answers.append({"oid": oid, "size": size})  # no actions: the client skips the upload
        else:
            query = urlencode({"size": size, "expires": expires, "sig": sign_url(store, repo, oid, size, expires)})
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
    store = store_of(request)
    params = request.query_params
    try:
        size, expires, sig = int(params["size"]), int(params["expires"]), params["sig"]
    except (KeyError, ValueError) as e:
        raise HubAPIError(403, "Invalid upload URL: request a new one through the LFS batch endpoint") from e
    repo = await run_in_threadpool(store.find_repo, repo_type, ns, name)
    expected = sign_url(store, repo, oid, size, expires).encode() if repo else b""
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
        repo = open_repo(request, kind, ns, name)
        rev, path = rev_and_path(request, marker_index)
        store = store_of(request)
        store.require_file_access(caller_of(request), repo)
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
