"""The local hub against hostile and unlucky clients (the server side).

Each test replays an attack or fault from the issue: YAML bombs, oversized or anonymous
bodies, malformed JSON of every shape, a deleted repo's gate passing on, look-alike
names, crash litter, world-readable files. The last test fuzzes a server process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from typer.testing import CliRunner

from hub_export.errors import InputError
from hub_export.hub.localhub import LocalHubStore, serve_in_thread
from hub_export.hub.localhub.cli import app as hub_cli
from hub_export.hub.localhub.objects import Entry
from hub_export.hub.localhub.records import AddFile

MAX_BODY_MB = 1
MIB = 1024 * 1024


class Hub:
    """A hub of our own with a 1 MiB body limit; alice (org acme) and bob."""

    def __init__(self, root: Path, endpoint: str, alice: str, bob: str):
        self.root, self.endpoint, self.alice, self.bob = root, endpoint, alice, bob
        self.store = LocalHubStore(root)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.alice}"}

    def create(self, name: str, token: str | None = None, **fields) -> httpx.Response:
        return httpx.post(f"{self.endpoint}/api/repos/create", json={"name": name, **fields}, headers=self.auth(token))

    def commit(self, repo_id: str, lines: list, token: str | None = None) -> httpx.Response:
        body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        return self.commit_raw(repo_id, body, token)

    def commit_raw(self, repo_id: str, body: bytes, token: str | None = None) -> httpx.Response:
        headers = {**self.auth(token), "Content-Type": "application/x-ndjson"}
        return httpx.post(f"{self.endpoint}/api/models/{repo_id}/commit/main", content=body, headers=headers)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hardened-hub")
    store = LocalHubStore(root)
    alice, bob = store.add_user("alice", org="acme"), store.add_user("bob")
    with serve_in_thread(root, max_body_mb=MAX_BODY_MB) as server:
        yield Hub(root, server.endpoint, alice, bob)


def _header(summary: str = "test") -> dict:
    return {"key": "header", "value": {"summary": summary}}


def _file(path: str, content: bytes) -> dict:
    return {"key": "file", "value": {"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"}}


def _assert_hub_error(response: httpx.Response, status: int | None = None) -> None:
    """A 4xx in the Hub's error shape: ``{"error": ...}`` and ``X-Error-Message``."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if status is not None:
        assert response.status_code == status, response.text[:300]
    assert isinstance(response.json()["error"], str)
    assert "X-Error-Message" in response.headers


def _raw_http(endpoint: str, head: bytes, chunks: list[bytes] = (), timeout: float = 10) -> tuple[int, bytes]:
    """Send a request head (and body chunks) over a socket; return the status and the response."""
    url = urlparse(endpoint)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in chunks:
            sock.sendall(chunk)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _response_length(data):
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    return int(data.split(b" ", 2)[1]), data


def _response_length(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(data) + 1  # no length: read to the end


# -- 2. YAML: no bombs, no stalls, no 500s -----------------------------------------------------------

LAUGHS = (
    "a: &a ["
    + ",".join(['"lol"'] * 9)
    + "]\n"
    + "".join(f"{b}: &{b} [" + ",".join([f"*{a}"] * 9) + "]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=False))
)


def _validate(hub: Hub, content) -> httpx.Response:
    return httpx.post(f"{hub.endpoint}/api/validate-yaml", json={"content": content, "repoType": "model"}, timeout=30)


def _front(yaml_text: str) -> str:
    return f"---\n{yaml_text}---\n# card\n"


@pytest.mark.parametrize(
    "yaml_text",
    [
        "".join(LAUGHS.splitlines(keepends=True)[:6]),  # 9^6 strings once expanded
        LAUGHS,  # the issue's attack in 342 bytes: 9^9 strings, 21 s and 2.9 GB before the fix
        "a: &a [*a]\n",  # recursive alias
        "a: " + "[" * 5000 + "]" * 5000 + "\n",  # deeper than any parser should recurse
        "2020-01-01: date key\n",  # not JSON-compatible
        "x: .nan\n",
    ],
    ids=["laughs-6", "laughs-9", "recursive", "deep", "date-key", "nan"],
)
def test_validate_yaml_refuses_bombs_quickly(hub: Hub, yaml_text: str) -> None:
    start = time.monotonic()
    response = _validate(hub, _front(yaml_text))
    assert response.status_code == 400, response.text[:300]
    assert response.json()["errors"] and time.monotonic() - start < 10
    assert _validate(hub, _front("license: mit\n")).json() == {"errors": [], "warnings": []}


def test_yaml_is_parsed_off_the_event_loop(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow parse (stood in for by a sleep) must not hold up other requests."""
    import hub_export.hub.localhub.server as server

    monkeypatch.setattr(server, "parse_front_matter", lambda text: time.sleep(2))
    slow = threading.Thread(target=_validate, args=(hub, "---\na: 1\n---\n"))
    slow.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert httpx.get(f"{hub.endpoint}/api/models", timeout=10).status_code == 200
    assert time.monotonic() - start < 1 and slow.is_alive()
    slow.join()


def test_validate_yaml_malformed_bodies_are_4xx(hub: Hub) -> None:
    _assert_hub_error(httpx.post(f"{hub.endpoint}/api/validate-yaml", content=b"[" * 100_000), 400)
    _assert_hub_error(httpx.post(f"{hub.endpoint}/api/validate-yaml", json={"content": ["a"]}), 400)
    big = _front("a: " + "x" * (MIB + 10) + "\n")
    assert _validate(hub, big).status_code == 413


@pytest.mark.parametrize(
    "yaml_text",
    [LAUGHS, "a: &a [*a]\n", "2020-01-01: x\n", "x: .nan\n", "tags: 5\n", "- a list\n"],
    ids=["laughs-9", "recursive", "date-key", "nan", "tags-int", "list"],
)
def test_bad_committed_card_never_breaks_repo_info(hub: Hub, yaml_text: str) -> None:
    name = "card-" + hashlib.sha1(yaml_text.encode()).hexdigest()[:10]
    hub.create(name)
    assert hub.commit(f"alice/{name}", [_header(), _file("README.md", _front(yaml_text).encode())]).status_code == 200
    start = time.monotonic()
    response = httpx.get(f"{hub.endpoint}/api/models/alice/{name}", timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert time.monotonic() - start < 10
    assert response.json()["cardData"] in (None, {}) or yaml_text == "tags: 5\n"


# -- 2. bounded bodies, auth before bodies ---------------------------------------------------------


def test_declared_oversized_body_is_413_before_it_is_sent(hub: Hub) -> None:
    length = 300 * MIB
    head = (
        f"POST /api/models/alice/x/commit/main HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {hub.alice}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()
    status, data = _raw_http(hub.endpoint, head)  # no body sent: the server must answer without it
    assert status == 413 and b'"error"' in data


def test_streamed_oversized_body_is_413(hub: Hub) -> None:
    hub.create("streamed")
    head = (
        f"POST /api/models/alice/streamed/commit/main HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {hub.alice}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"x" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (MAX_BODY_MB * 16 + 1) + [b"0\r\n\r\n"]
    status, data = _raw_http(hub.endpoint, head, chunks)
    assert status == 413 and b'"error"' in data


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/models/alice/x/commit/main"),
        ("POST", "/api/repos/create"),
        ("POST", "/api/models/alice/x/preupload/main"),
        ("POST", "/alice/x.git/info/lfs/objects/batch"),
        ("PUT", "/api/models/alice/x/settings"),
        ("POST", "/api/models/alice/x/branch/b"),
        ("POST", "/api/models/alice/x/tag/main"),
        ("DELETE", "/api/repos/delete"),
        ("POST", "/alice/x.git/info/lfs/objects/verify"),
    ],
)
def test_anonymous_write_is_401_before_the_body_is_read(hub: Hub, method: str, path: str) -> None:
    hub.create("x")
    head = f"{method} {path} HTTP/1.1\r\nHost: h\r\nContent-Length: {MIB - 1}\r\nConnection: close\r\n\r\n".encode()
    status, data = _raw_http(hub.endpoint, head, timeout=5)  # a server waiting for the body times out here
    assert status == 401 and b'"error"' in data


@pytest.mark.parametrize("path", ["/api/validate-yaml", "/api/models/alice/open/paths-info/main"])
def test_routes_open_to_anyone_read_little_whatever_the_limit(tmp_path: Path, path: str) -> None:
    token = LocalHubStore(tmp_path).add_user("alice")
    with serve_in_thread(tmp_path) as server:  # the default limit: hundreds of MiB
        auth = {"Authorization": f"Bearer {token}"}
        httpx.post(f"{server.endpoint}/api/repos/create", json={"name": "open"}, headers=auth)
        head = f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Length: {64 * MIB}\r\nConnection: close\r\n\r\n"
        status, data = _raw_http(server.endpoint, head.encode(), timeout=5)
    assert status == 413 and b'"error"' in data


def test_serve_has_a_max_body_option() -> None:
    result = CliRunner().invoke(hub_cli, ["serve", "--help"])
    assert "--max-body-mb" in result.output


# -- 3. a deleted repo's gate and grants die with it -----------------------------------------------


def test_deleted_repos_gate_and_grants_do_not_pass_on(hub: Hub) -> None:
    assert hub.create("gated-then-gone").status_code == 200
    settings = f"{hub.endpoint}/api/models/alice/gated-then-gone/settings"
    assert httpx.put(settings, json={"gated": "manual"}, headers=hub.auth()).status_code == 200
    old = hub.store.find_repo("model", "alice", "gated-then-gone")
    hub.store.grant_access(old, "bob")
    response = httpx.request(
        "DELETE", f"{hub.endpoint}/api/repos/delete", json={"name": "gated-then-gone"}, headers=hub.auth()
    )
    assert response.status_code == 200
    assert hub.create("fresh-public", token=hub.bob).status_code == 200
    new = hub.store.find_repo("model", "bob", "fresh-public")
    assert new.id == old.id  # SQLite reuses the highest row id: the case the issue saw
    assert httpx.get(f"{hub.endpoint}/api/models/bob/fresh-public").json()["gated"] is False
    assert hub.store.gate(new) is None


# -- 7. malformed requests: a 4xx in the Hub's shape, never a 500 or a dropped connection ------------

DEEP = b"[" * 100_000 + b"]" * 100_000


def _lines(*items) -> bytes:
    return b"".join((item if isinstance(item, bytes) else json.dumps(item).encode()) + b"\n" for item in items)


COMMIT_BODIES = {
    "deep-json": DEEP,
    "list-line": _lines(_header(), [1, 2]),
    "string-line": _lines(_header(), "file"),
    "number-line": _lines(_header(), 5),
    "header-list": _lines({"key": "header", "value": [1]}),
    "summary-dict": _lines({"key": "header", "value": {"summary": {"a": 1}}}),
    "parent-list": _lines({"key": "header", "value": {"summary": "s", "parentCommit": ["x"]}}),
    "file-value-list": _lines(_header(), {"key": "file", "value": [1]}),
    "path-int": _lines(_header(), {"key": "file", "value": {"path": 5, "content": "x"}}),
    "path-list": _lines(_header(), {"key": "deletedFile", "value": {"path": ["a"]}}),
    "folder-path-none": _lines(_header(), {"key": "deletedFolder", "value": {"path": None}}),
    "content-int": _lines(_header(), {"key": "file", "value": {"path": "a", "content": 5}}),
    "lfs-path-int": _lines(_header(), {"key": "lfsFile", "value": {"path": 1, "algo": "sha256", "oid": "a" * 64}}),
    "lfs-size-str": _lines(
        _header(), {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": "a" * 64, "size": "abc"}}
    ),
    "surrogate-path": _lines(_header(), b'{"key": "file", "value": {"path": "\\ud800", "content": "x"}}'),
    "surrogate-summary": _lines(b'{"key": "header", "value": {"summary": "\\udfff"}}'),
    "nul-path": _lines(_header(), {"key": "file", "value": {"path": "a\0b", "content": "x"}}),
    "newline-path": _lines(_header(), {"key": "file", "value": {"path": "a\nb", "content": "x"}}),
    "not-utf8": b"\xff\xfe\xfa\n",
}


@pytest.mark.parametrize("case", COMMIT_BODIES)
def test_malformed_commit_payloads_are_4xx(hub: Hub, case: str) -> None:
    hub.create("malformed")
    _assert_hub_error(hub.commit_raw("alice/malformed", COMMIT_BODIES[case]))
    assert httpx.get(f"{hub.endpoint}/api/models/alice/malformed").status_code == 200


PRE = "/api/models/alice/malformed/preupload/main"
LFS = "/alice/malformed.git/info/lfs/objects"
JSON_REQUESTS = {
    "create-deep": ("POST", "/api/repos/create", DEEP),
    "create-org-list": ("POST", "/api/repos/create", {"name": "n", "organization": ["acme"]}),
    "create-name-dict": ("POST", "/api/repos/create", {"name": {"a": 1}}),
    "create-type-list": ("POST", "/api/repos/create", {"name": "n", "type": ["model"]}),
    "create-surrogate": ("POST", "/api/repos/create", b'{"name": "\\ud800"}'),
    "delete-org-list": ("DELETE", "/api/repos/delete", {"name": "malformed", "organization": ["alice"]}),
    "delete-name-int": ("DELETE", "/api/repos/delete", {"name": 5}),
    "preupload-size-str": ("POST", PRE, {"files": [{"path": "a", "size": "abc"}]}),
    "preupload-files-int": ("POST", PRE, {"files": 5}),
    "preupload-item-str": ("POST", PRE, {"files": ["a"]}),
    "preupload-path-list": ("POST", PRE, {"files": [{"path": [1], "size": 1}]}),
    "preupload-sample-int": ("POST", PRE, {"files": [{"path": "a", "size": 1, "sample": 5}]}),
    "preupload-sample-bad": ("POST", PRE, {"files": [{"path": "a", "size": 1, "sample": "!!"}]}),
    "batch-objects-int-items": ("POST", f"{LFS}/batch", {"operation": "upload", "objects": [1]}),
    "batch-objects-int": ("POST", f"{LFS}/batch", {"operation": "upload", "objects": 1}),
    "verify-empty": ("POST", f"{LFS}/verify", {}),
    "verify-size-str": ("POST", f"{LFS}/verify", {"oid": "a" * 64, "size": "1"}),
    "branch-start-list": ("POST", "/api/models/alice/malformed/branch/b1", {"startingPoint": ["main"]}),
    "branch-start-nul": ("POST", "/api/models/alice/malformed/branch/b2", {"startingPoint": "ma\0in"}),
    "tag-list": ("POST", "/api/models/alice/malformed/tag/main", {"tag": ["v1"]}),
    "settings-gated-list": ("PUT", "/api/models/alice/malformed/settings", {"gated": ["auto"]}),
    "settings-deep": ("PUT", "/api/models/alice/malformed/settings", DEEP),
    "paths-info-not-utf8": ("POST", "/api/models/alice/malformed/paths-info/main", b"paths=\xff\xfe"),
    "revision-nul": ("GET", "/api/models/alice/malformed/revision/ma%00in", None),
    "tree-nul": ("GET", "/api/models/alice/malformed/tree/main/a%00b", None),
    "resolve-nul": ("GET", "/alice/malformed/resolve/ma%00in/x", None),
    "commits-newline": ("GET", "/api/models/alice/malformed/commits/a%0D%0AX-Evil:%201", None),
}


@pytest.mark.parametrize("case", JSON_REQUESTS)
def test_malformed_requests_are_4xx_in_the_hubs_shape(hub: Hub, case: str) -> None:
    hub.create("malformed")
    method, path, body = JSON_REQUESTS[case]
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = httpx.request(method, hub.endpoint + path, content=content, headers=hub.auth())
    _assert_hub_error(response)
    assert "X-Evil" not in response.headers


def test_lfs_sizes_beyond_the_limit_are_refused(hub: Hub) -> None:
    hub.create("huge-lfs")
    batch = {"operation": "upload", "objects": [{"oid": "a" * 64, "size": 10**23}, {"oid": "b" * 64, "size": True}]}
    response = httpx.post(f"{hub.endpoint}/alice/huge-lfs.git/info/lfs/objects/batch", json=batch, headers=hub.auth())
    assert response.status_code == 200
    for obj in response.json()["objects"]:
        assert "error" in obj and "actions" not in obj


# -- 8. names compare case-insensitively -------------------------------------------------------------


def test_look_alike_accounts_are_refused(hub: Hub) -> None:
    with pytest.raises(InputError, match="alice"):
        hub.store.add_user("Alice")
    with pytest.raises(InputError, match="acme"):
        hub.store.add_org("ACME")
    assert hub.store.issue_token("ALICE")  # the same account, whatever the case
    hub.store.add_member("Acme", "BOB", "read")
    assert hub.store.authenticate(hub.bob).orgs == {"acme": "read"}


def test_repo_names_compare_case_insensitively(hub: Hub) -> None:
    assert hub.create("pub").status_code == 200
    assert hub.create("PUB").status_code == 409
    assert hub.create("Pub", organization="ALICE").status_code == 409
    info = httpx.get(f"{hub.endpoint}/api/models/ALICE/PUB")
    assert info.status_code == 200 and info.json()["id"] == "alice/pub"
    assert hub.commit("Alice/Pub", [_header(), _file("a.txt", b"a")]).status_code == 200
    assert httpx.get(f"{hub.endpoint}/alice/PUB/resolve/main/a.txt").content == b"a"
    assert [r["id"] for r in httpx.get(f"{hub.endpoint}/api/models?author=ALICE&search=pub").json()] == ["alice/pub"]


# -- 9. files private to the server's user -----------------------------------------------------------


def test_stored_files_are_private(hub: Hub) -> None:
    hub.create("private-files")
    assert hub.commit("alice/private-files", [_header(), _file("w.txt", b"secret weights")]).status_code == 200
    assert stat.S_IMODE(hub.root.stat().st_mode) & 0o077 == 0
    for path in hub.root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


# -- 6. garbage collection ---------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_gc_removes_litter_and_keeps_live_data(tmp_path: Path) -> None:
    store = LocalHubStore(tmp_path)
    store.add_user("carol")
    caller = store.authenticate(store.issue_token("carol"))
    repo, _ = store.create_repo(caller, "model", "carol", "keep")
    gone, _ = store.create_repo(caller, "model", "carol", "gone")
    live, dead = b"live bytes", b"bytes of a deleted repo"
    for target, data in ((repo, live), (gone, dead)):
        store.blobs.put(data)
        store.commit(target, "carol", "main", [AddFile("f.bin", Entry.regular(data))], summary="add")
    store.delete_repo(gone)
    orphan, fresh = store.blobs.put(b"a commit cut off"), store.blobs.put(b"an upload in flight")
    stale_tmp, fresh_tmp = store.blobs.tmp / "upload-dead", store.blobs.tmp / "upload-live"
    stale_tmp.write_bytes(b"x" * 1000)
    fresh_tmp.write_bytes(b"y")
    old = _sha(dead)
    for path in (store.blobs.path(orphan), store.blobs.path(old), stale_tmp, store.blobs.path(_sha(live))):
        _age(path, 7200)

    result = CliRunner().invoke(hub_cli, ["gc", "--root", str(tmp_path), "--min-age-hours", "1"])
    assert result.exit_code == 0, result.output
    assert "Removed 1 temp file" in result.output and "2 unreferenced blob" in result.output
    assert not stale_tmp.exists() and fresh_tmp.exists()
    assert not store.blobs.has(orphan) and not store.blobs.has(old)
    assert store.blobs.has(fresh)  # younger than the grace period: maybe a commit in flight
    assert store.read_blob(store.tree(store.resolve(repo, "main"))["f.bin"]) == live


def test_server_start_sweeps_litter(tmp_path: Path) -> None:
    store = LocalHubStore(tmp_path)
    litter = store.blobs.tmp / "upload-crashed"
    litter.write_bytes(b"z" * 100)
    orphan = store.blobs.put(b"cut off by a crash")
    _age(litter, 2 * 86400)
    _age(store.blobs.path(orphan), 2 * 86400)
    with serve_in_thread(tmp_path):
        assert not litter.exists() and not store.blobs.has(orphan)


def test_lfs_batch_protects_an_already_stored_object_from_gc(hub: Hub) -> None:
    """The batch answers "already stored, skip the upload": gc must then leave the object alone."""
    hub.create("lfs-reuse")
    data = os.urandom(4096)
    oid = hashlib.sha256(data).hexdigest()
    url = f"{hub.endpoint}/alice/lfs-reuse.git/info/lfs/objects/batch"
    batch = {"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]}
    href = httpx.post(url, json=batch, headers=hub.auth()).json()["objects"][0]["actions"]["upload"]["href"]
    assert httpx.put(href, content=data).status_code == 200
    _age(hub.store.blobs.path(oid), 7200)  # uploaded long ago, never committed
    assert "actions" not in httpx.post(url, json=batch, headers=hub.auth()).json()["objects"][0]
    hub.store.gc(min_age=3600)
    lfs = {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": len(data)}}
    assert hub.commit("alice/lfs-reuse", [_header(), lfs]).status_code == 200


# -- fuzz: random and structured malformed requests against a server process ----------------------

EVIL_VALUES = [
    None, True, -1, 0, 10**30, 1.5e308, "", "\0", "a\0b", "\ud800", "../..", "/abs", "x" * 5000, "é" * 50,
    [], [1], [[[]]], {}, {"a": None}, "refs/heads/main", "a" * 64, "%00", "\r\nX-Evil: 1",
]  # fmt: skip


ODD_REPO_IDS = ["ALICE/FUZZED", "alice/%00", "a%0a/b", "x/" + "y" * 300, "alice/.."]
ODD_AUTH = [{}, {"Authorization": "Bearer hf_nope"}, {"Authorization": "Basic \x7f"}]


def _fuzz_routes(repo: str) -> list[tuple[str, str, dict | None]]:
    """(method, path, a valid JSON body to mutate) for every route the server has."""
    ns, name = repo.split("/")
    api = f"/api/models/{repo}"
    sha = "ab" * 32
    return [
        ("POST", "/api/validate-yaml", {"content": "---\nlicense: mit\n---\n", "repoType": "model"}),
        ("POST", "/api/repos/create", {"name": "fz", "organization": ns, "private": False, "type": "model"}),
        ("DELETE", "/api/repos/delete", {"name": "nonexistent", "organization": ns, "type": "model"}),
        ("PUT", f"{api}/settings", {"private": False, "gated": False}),
        ("GET", f"{api}", None),
        ("GET", f"{api}/revision/main", None),
        ("GET", f"{api}/tree/main?recursive=true", None),
        ("GET", f"{api}/commits/main", None),
        ("GET", f"{api}/refs?include_prs=1", None),
        ("POST", f"{api}/paths-info/main", None),
        ("POST", f"{api}/branch/fz", {"startingPoint": "main"}),
        ("DELETE", f"{api}/branch/fz", None),
        ("POST", f"{api}/tag/main", {"tag": "fz", "message": "m"}),
        ("POST", f"{api}/preupload/main", {"files": [{"path": "a.bin", "size": 3, "sample": "YWJj"}]}),
        ("POST", f"/{repo}.git/info/lfs/objects/batch", {"operation": "upload", "objects": [{"oid": sha, "size": 3}]}),
        ("POST", f"/{repo}.git/info/lfs/objects/verify", {"oid": sha, "size": 3}),
        ("PUT", f"/api/lfs-upload/model/{repo}/{sha}?size=3&expires=9999999999&sig=00", None),
        ("GET", f"/{repo}/resolve/main/README.md", None),
        ("GET", "/api/models?author=" + ns, None),
        ("GET", "/api/whoami-v2", None),
        ("POST", f"{api}/commit/main", None),
        ("GET", f"/api/models/{name}/{ns}/xet-read-token/main", None),
    ]


def _mutate(rng: random.Random, value, depth: int = 0):
    """``value`` with one random part replaced by something hostile."""
    if isinstance(value, dict) and value and depth < 4 and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: _mutate(rng, value[key], depth + 1)}
    if isinstance(value, list) and value and depth < 4 and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return value[:i] + [_mutate(rng, value[i], depth + 1)] + value[i + 1 :]
    return rng.choice(EVIL_VALUES)


def _fuzz_body(rng: random.Random, method: str, path: str, valid: dict | None) -> bytes:
    roll = rng.random()
    if "/commit/" in path:
        lines = [_header(), _file("f.txt", b"fuzz"), {"key": "deletedFile", "value": {"path": "nope"}}]
        i = rng.randrange(len(lines))
        lines[i] = _mutate(rng, lines[i])
        return b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    if "/paths-info/" in path:
        return rng.choice([b"paths=README.md&expand=true", b"paths=%00", b"\xff\xfe", os.urandom(64)])
    if roll < 0.1:
        return os.urandom(rng.randrange(1, 2048))
    if roll < 0.15:
        return b"[" * rng.randrange(1000, 200_000)
    if roll < 0.2:
        return b"{" + b'"a":' * 50 + b"x" * rng.randrange(MIB, 2 * MIB)  # past the 1 MiB limit
    if roll < 0.25:
        return json.dumps(valid)[: rng.randrange(1, 20)].encode() if valid else b"{"
    if roll < 0.3 and "validate-yaml" in path:
        return json.dumps({"content": _front(rng.choice([LAUGHS, "a: &a [*a]\n", "[" * 3000, "x: .inf\n"]))}).encode()
    return json.dumps(_mutate(rng, valid if valid is not None else {"a": 1})).encode()


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """``hub serve`` in its own process (so its memory can be measured): endpoint, pid, alice's token."""
    token = LocalHubStore(tmp_path).add_user("alice", org="acme")
    serve = ["serve", "--root", str(tmp_path), "--port", "0", "--max-body-mb", str(MAX_BODY_MB)]
    command = [sys.executable, "-m", "hub_export.hub.localhub", *serve]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("Local hub at "), line
        yield line.split()[3], proc.pid, token
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_fuzz_server_survives_malformed_requests(hub_process: tuple[str, int, str]) -> None:
    """A few hundred seeded requests, valid ones mutated: no 5xx, no dropped connection, memory flat."""
    endpoint, pid, token = hub_process
    rng = random.Random(17)
    repo = "alice/fuzzed"
    with httpx.Client(base_url=endpoint, timeout=20) as client:
        auth = {"Authorization": f"Bearer {token}"}
        assert client.post("/api/repos/create", json={"name": "fuzzed"}, headers=auth).status_code == 200
        client.get("/api/whoami-v2", headers=auth)
        baseline = _rss_kb(pid)
        routes = _fuzz_routes(repo)
        failures, sent, deadline = [], 0, time.monotonic() + 25
        while sent < 300 and time.monotonic() < deadline:
            method, path, valid = rng.choice(routes)
            if rng.random() < 0.2:
                path = path.replace(repo, rng.choice(ODD_REPO_IDS))
            headers = rng.choice([auth, auth, auth, *ODD_AUTH])
            body = _fuzz_body(rng, method, path, valid) if method in ("POST", "PUT", "DELETE") else None
            sent += 1
            try:
                response = client.request(method, path, content=body, headers=headers)
            except httpx.HTTPError as e:
                failures.append(f"{method} {path}: {type(e).__name__} {e}")
                continue
            if response.status_code >= 500 and response.status_code != 501:  # 501: the Xet routes, by design
                failures.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
        assert not failures, "\n".join(failures[:20])
        assert client.get("/api/whoami-v2", headers=auth).status_code == 200
        assert client.get(f"/api/models/{repo}").status_code == 200
    assert sent >= 100
    assert _rss_kb(pid) - baseline < 100 * 1024, "the server's memory grew by more than 100 MB"
