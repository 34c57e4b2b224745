"""The Hub's HTTP API, as much of it as ``huggingface_hub`` needs, over a :class:`LocalHubStore`.

Routes, fields and error headers follow what the real client reads (see
``shared/docs/hub-wire-contract.md``). Only models are exercised by the tests;
datasets and spaces go through the same code.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import re
import time
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode

import yaml
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import HubExportError
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
)

logger = logging.getLogger("hub_export.localhub")

KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
XET_MESSAGE = (
    "This local hub has no Xet storage service. Set HF_HUB_DISABLE_XET=1 in the environment (or"
    " huggingface_hub.constants.HF_HUB_DISABLE_XET = True) so huggingface_hub uses the LFS protocol."
)
UPLOAD_URL_TTL = 3600
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.S)
_SECRET_PARAM = re.compile(r"token|sig|secret|key|auth|pass|credential", re.I)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_WRITE_BUFFER = 4 * 1024 * 1024

router = APIRouter()


def create_app(root: str | Path) -> FastAPI:
    """A FastAPI app serving the hub stored under ``root``."""
    app = FastAPI(title="hub-export local hub", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = LocalHubStore(root)
    app.include_router(router)
    app.add_exception_handler(HubAPIError, _on_hub_error)  # type: ignore[arg-type]
    app.add_exception_handler(HubExportError, _on_input_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_middleware(RequestLog)
    return app


# -- errors and logging -----------------------------------------------------------


def error_response(status: int, message: str, code: str | None = None, **extra: Any) -> JSONResponse:
    """The Hub's error shape: ``{"error": msg}`` plus ``X-Error-Message`` (and ``X-Error-Code``)."""
    headers = {"X-Error-Message": " ".join(message.split()).encode("ascii", "replace").decode()}
    if code:
        headers["X-Error-Code"] = code
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _on_hub_error(_: Request, exc: HubAPIError) -> JSONResponse:
    response = error_response(exc.status, exc.message, exc.code)
    response.headers.update(exc.headers)
    return response


def _on_input_error(_: Request, exc: HubExportError) -> JSONResponse:
    return error_response(400, str(exc))


def _on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail))


def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(400, f"Invalid request: {exc.errors()}")


def redact_query(query: str) -> str:
    """Drop the values of anything token-like from a query string before it is logged."""
    pairs = parse_qsl(query, keep_blank_values=True)
    safe = [(k, "***" if _SECRET_PARAM.search(k) or v.startswith("hf_") else v) for k, v in pairs]
    return urlencode(safe, safe="*")


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


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as e:
        raise HubAPIError(400, f"Request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise HubAPIError(400, "Request body must be a JSON object")
    return body


def parse_front_matter(text: str) -> dict[str, Any] | None:
    """The YAML metadata block of a model card, as JSON-safe data (None if absent)."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return None
    data = yaml.safe_load(match.group(1))
    if data is None:
        return None
    if not isinstance(data, dict):
        raise yaml.YAMLError("the metadata block must be a mapping")
    return json.loads(json.dumps(data, default=str))


def _card_data(store: LocalHubStore, tree: Tree) -> dict[str, Any] | None:
    entry = tree.get("README.md")
    if entry is None or entry.size > 1024 * 1024:
        return None
    try:
        return parse_front_matter(store.read_blob(entry).decode("utf-8", "replace"))
    except yaml.YAMLError:
        return None


def _tags(card: dict[str, Any] | None) -> list[str]:
    if not card:
        return []
    tags = card.get("tags") or []
    tags = [tags] if isinstance(tags, str) else [str(t) for t in tags]
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
    message = f"{repo.id}:{repo.type}/{repo.repo_id}:{oid}:{size}:{expires}".encode()
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
    body = await _json(request)
    try:
        parse_front_matter(str(body.get("content", "")))
    except yaml.YAMLError as e:
        message = f"Invalid YAML metadata in README.md: {' '.join(str(e).split())}"
        return JSONResponse({"errors": [{"message": message}], "warnings": []}, status_code=400)
    return JSONResponse({"errors": [], "warnings": []})


@router.post("/api/repos/create")
async def create_repo(request: Request) -> JSONResponse:
    body = await _json(request)

    def create() -> tuple[Repo, bool]:
        caller = _caller(request)
        namespace = body.get("organization") or (caller.name if caller else None)
        if caller is None or namespace is None:
            raise HubAPIError(401, "You must be authenticated to create a repo: pass a token.")
        private = body.get("visibility") == "private" or body.get("private") is True
        repo_type = body.get("type") or "model"
        return _store(request).create_repo(caller, repo_type, namespace, str(body.get("name", "")), private=private)

    repo, created = await run_in_threadpool(create)
    url = f"{_base(request)}/{repo.url_path}"
    if not created:
        return error_response(409, f"You already created this {repo.type} repo", url=url)
    return JSONResponse({"url": url, "name": repo.repo_id, "id": repo.repo_id})


@router.delete("/api/repos/delete")
async def delete_repo(request: Request) -> Response:
    body = await _json(request)
    kind = f"{body.get('type') or 'model'}s"

    def delete() -> None:
        caller = _caller(request)
        namespace = body.get("organization") or (caller.name if caller else "")
        repo = _open(request, kind, namespace, str(body.get("name", "")), write=True)
        _store(request).delete_repo(repo)

    await run_in_threadpool(delete)
    return Response(status_code=200)


@router.put("/api/{kind}/{ns}/{name}/settings")
async def update_settings(request: Request, kind: str, ns: str, name: str) -> dict[str, Any]:
    body = await _json(request)

    def update() -> dict[str, Any]:
        repo = _open(request, kind, ns, name, write=True)
        private = body.get("private")
        if "visibility" in body:
            private = body["visibility"] == "private"
        if isinstance(private, bool):
            _store(request).set_private(repo, private)
        if "gated" in body:
            _store(request).set_gate(repo, body["gated"] or None)
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
    form = parse_qs((await request.body()).decode(), keep_blank_values=True)

    def describe() -> list[dict[str, Any]]:
        repo = _open(request, kind, ns, name)
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


async def _create_ref(request: Request, kind: str, ns: str, name: str, ref: str, starting_point: str) -> dict[str, Any]:
    def create() -> None:
        repo = _open(request, kind, ns, name, write=True)
        _store(request).create_ref(repo, ref, starting_point)

    await run_in_threadpool(create)
    return {}


@router.post("/api/{kind}/{ns}/{name}/branch/{branch:path}")
async def create_branch(request: Request, kind: str, ns: str, name: str, branch: str) -> dict[str, Any]:
    body = await _json(request)
    return await _create_ref(request, kind, ns, name, f"refs/heads/{branch}", body.get("startingPoint") or "main")


@router.delete("/api/{kind}/{ns}/{name}/branch/{branch:path}")
def delete_branch(request: Request, kind: str, ns: str, name: str, branch: str) -> dict[str, Any]:
    _store(request).delete_ref(_open(request, kind, ns, name, write=True), f"refs/heads/{branch}")
    return {}


@router.post("/api/{kind}/{ns}/{name}/tag/{rev:path}")
async def create_tag(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    body = await _json(request)
    return await _create_ref(request, kind, ns, name, f"refs/tags/{body.get('tag', '')}", rev)


@router.delete("/api/{kind}/{ns}/{name}/tag/{tag:path}")
def delete_tag(request: Request, kind: str, ns: str, name: str, tag: str) -> dict[str, Any]:
    _store(request).delete_ref(_open(request, kind, ns, name, write=True), f"refs/tags/{tag}")
    return {}


# -- uploads ----------------------------------------------------------------------


@router.post("/api/{kind}/{ns}/{name}/preupload/{rev:path}")
async def preupload(request: Request, kind: str, ns: str, name: str, rev: str) -> dict[str, Any]:
    body = await _json(request)

    def plan() -> dict[str, Any]:
        repo = _open(request, kind, ns, name, write=True)
        store = _store(request)
        tree = store.tree(store.resolve(repo, rev))
        files = []
        for item in body.get("files", []):
            path, size = str(item["path"]), int(item.get("size", 0))
            sample = base64.b64decode(item.get("sample", ""))
            answer = {"path": path, "uploadMode": "lfs" if lfs_by_default(path, size, sample) else "regular"}
            answer["shouldIgnore"] = False
            if path in tree:
                answer["oid"] = tree[path].etag  # equal to the client's local oid => file skipped
            files.append(answer)
        return {"files": files, "commitOid": None}

    return await run_in_threadpool(plan)


@router.post("/api/{kind}/{ns}/{name}/commit/{rev:path}")
async def commit(request: Request, kind: str, ns: str, name: str, rev: str, create_pr: str = "") -> dict[str, Any]:
    body = await request.body()

    def run() -> dict[str, Any]:
        caller = _caller(request)
        repo = _open(request, kind, ns, name, write=True)
        store = _store(request)
        header, operations = _parse_commit(store, body)
        result = store.commit(
            repo,
            caller.name if caller else "",
            rev,
            operations,
            summary=str(header.get("summary") or ""),
            description=str(header.get("description") or ""),
            parent_commit=header.get("parentCommit"),
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
    for line in body.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                content = value["content"]
                data = base64.b64decode(content) if value.get("encoding") == "base64" else content.encode()
                store.blobs.put(data)
                operations.append(AddFile(value["path"], Entry.regular(data)))
            elif key == "lfsFile":
                oid = str(value["oid"])
                if value.get("algo", "sha256") != "sha256" or not _SHA256.fullmatch(oid):
                    raise HubAPIError(400, f"Invalid LFS oid for '{value['path']}': expected a sha256")
                operations.append(AddLfs(value["path"], oid, value.get("size")))
            elif key in ("deletedFile", "deletedFolder"):
                operations.append(Delete(value["path"], folder=key == "deletedFolder"))
            else:
                raise HubAPIError(400, f"Unsupported commit operation '{key}'")
        except (ValueError, KeyError, TypeError) as e:
            raise HubAPIError(400, f"Malformed commit payload line: {e}") from e
    if not header.get("summary"):
        raise HubAPIError(400, "A commit needs a summary (the commit message)")
    return header, operations


@router.get("/api/{kind}/{ns}/{name}/xet-write-token/{rev:path}")
@router.get("/api/{kind}/{ns}/{name}/xet-read-token/{rev:path}")
def xet_token(kind: str, ns: str, name: str, rev: str) -> JSONResponse:
    return error_response(501, XET_MESSAGE)


def _lfs_routes(prefix: str) -> None:
    """Register the LFS batch and verify endpoints under one repo-type URL prefix."""

    @router.post(prefix + "/{ns}/{name}.git/info/lfs/objects/batch")
    async def lfs_batch(request: Request, ns: str, name: str) -> JSONResponse:
        body = await _json(request)
        kind = prefix.strip("/") or "models"
        answer = await run_in_threadpool(_lfs_batch, request, kind, ns, name, body)
        return JSONResponse(answer, media_type="application/vnd.git-lfs+json")

    @router.post(prefix + "/{ns}/{name}.git/info/lfs/objects/verify")
    async def lfs_verify(request: Request, ns: str, name: str) -> dict[str, Any]:
        body = await _json(request)

        def verify() -> dict[str, Any]:
            repo = _open(request, prefix.strip("/") or "models", ns, name, write=True)
            if _store(request).object_size(repo, str(body.get("oid"))) != body.get("size"):
                raise HubAPIError(404, f"LFS object {body.get('oid')} of size {body.get('size')} is not stored")
            return {"message": "verified"}

        return await run_in_threadpool(verify)


def _lfs_batch(request: Request, kind: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("operation") != "upload":
        raise HubAPIError(400, "This local hub only supports LFS uploads; download files through /resolve/")
    repo = _open(request, kind, ns, name, write=True)
    store = _store(request)
    base, expires = _base(request), int(time.time()) + UPLOAD_URL_TTL
    objects = []
    for obj in body.get("objects", []):
        oid, size = str(obj.get("oid")), obj.get("size")
        if not _SHA256.fullmatch(oid) or not isinstance(size, int) or size < 0:
            error = {"code": 422, "message": "oid must be a sha256 hex digest and size a non-negative integer"}
            objects.append({"oid": oid, "size": size if isinstance(size, int) else 0, "error": error})
        elif store.object_size(repo, oid) == size:
            objects.append({"oid": oid, "size": size})  # no actions: the client skips the upload
        else:
            query = urlencode({"size": size, "expires": expires, "sig": _sign(store, repo, oid, size, expires)})
            upload = f"{base}/api/lfs-upload/{repo.type}/{repo.repo_id}/{oid}?{query}"
            verify = f"{base}/{repo.url_path}.git/info/lfs/objects/verify"
            actions = {"upload": {"href": upload, "expires_in": UPLOAD_URL_TTL}, "verify": {"href": verify}}
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": actions})
    return {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}


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
    if repo is None or expires < time.time() or not hmac.compare_digest(sig, _sign(store, repo, oid, size, expires)):
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
