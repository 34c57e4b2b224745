"""The local hub, driven through the real ``huggingface_hub`` client.

Needs the ``local_hub`` fixture from ``hub_export.hub.localhub.pytest_plugin``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import httpx
import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from typer.testing import CliRunner

from hub_export.hub.localhub import LocalHubStore, add_user, serve_in_thread
from hub_export.hub.localhub.cli import app as hub_cli
from hub_export.hub.localhub.pytest_plugin import LocalHubFixture

README = """---
license: apache-2.0
library_name: executorch
tags:
- executorch
- text-generation
---
# Demo model
"""


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def repo_id(request: pytest.FixtureRequest) -> str:
    """A repo id under alice unique to the test, so tests can share one hub."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-").strip("-")
    return f"alice/{name[:80]}"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "model.pte").write_bytes(os.urandom(3 * 1024 * 1024))
    (folder / "README.md").write_text(README)
    (folder / "tokenizer" / "config.json").write_text('{"vocab_size": 32000}')
    return folder


def _commit_ndjson(hub: LocalHubFixture, repo_id: str, token: str, lines: list[dict]) -> httpx.Response:
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return httpx.post(
        f"{hub.endpoint}/api/models/{repo_id}/commit/main",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"},
    )


# -- repos, uploads, downloads ----------------------------------------------------


def test_create_repo_private_and_exist_ok(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    url = api.create_repo(repo_id, private=True)
    assert url.repo_id == repo_id and url.startswith(local_hub.endpoint)
    assert api.create_repo(repo_id, exist_ok=True).repo_id == repo_id
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo(repo_id)
    assert exc.value.response.status_code == 409
    info = api.model_info(repo_id)
    assert info.private is True and len(info.sha) == 40
    assert api.whoami()["name"] == "alice"


def test_upload_folder_and_download_byte_identical(
    local_hub: LocalHubFixture, repo_id: str, model_dir: Path, tmp_path: Path
) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id, private=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=model_dir, commit_message="Add model")

    info = api.model_info(repo_id)
    assert info.sha == commit.oid
    assert info.card_data.license == "apache-2.0" and "executorch" in info.tags
    siblings = {s.rfilename: s for s in info.siblings}
    assert siblings["model.pte"].lfs.sha256 == sha256_of(model_dir / "model.pte")
    assert siblings["model.pte"].size == 3 * 1024 * 1024 and siblings["README.md"].lfs is None
    assert sorted(api.list_repo_files(repo_id)) == [".gitattributes", "README.md", "model.pte", "tokenizer/config.json"]
    tree = {entry.path: entry for entry in api.list_repo_tree(repo_id, recursive=True)}
    assert tree["model.pte"].lfs.sha256 == sha256_of(model_dir / "model.pte")
    assert len(tree["tokenizer"].tree_id) == 40
    assert [e.path for e in api.list_repo_tree(repo_id, path_in_repo="tokenizer")] == ["tokenizer/config.json"]

    file = hf_hub_download(repo_id, "model.pte", endpoint=local_hub.endpoint, token=local_hub.alice_token)
    assert sha256_of(file) == sha256_of(model_dir / "model.pte")
    snapshot = Path(snapshot_download(repo_id, token=local_hub.alice_token, local_dir=tmp_path / "snap"))
    for name in ("model.pte", "README.md", "tokenizer/config.json"):
        assert sha256_of(snapshot / name) == sha256_of(model_dir / name)

    assert api.file_exists(repo_id, "model.pte") is True
    assert api.file_exists(repo_id, "missing.bin") is False


def test_noop_reupload_creates_no_commit(local_hub: LocalHubFixture, repo_id: str, model_dir: Path) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    first = api.upload_folder(repo_id=repo_id, folder_path=model_dir, commit_message="Add model")
    commits = api.list_repo_commits(repo_id)
    again = api.upload_folder(repo_id=repo_id, folder_path=model_dir, commit_message="Same again")
    assert again.oid == first.oid
    assert [c.commit_id for c in api.list_repo_commits(repo_id)] == [c.commit_id for c in commits]

    # Even when the client does not filter the unchanged file out, the server makes no commit.
    readme = {"path": "README.md", "content": base64.b64encode(README.encode()).decode(), "encoding": "base64"}
    lines = [{"key": "header", "value": {"summary": "noop"}}, {"key": "file", "value": readme}]
    response = _commit_ndjson(local_hub, repo_id, local_hub.alice_token, lines)
    assert response.status_code == 200 and response.json()["commitOid"] == first.oid
    assert len(api.list_repo_commits(repo_id)) == len(commits)


def test_upload_file_delete_file_and_history(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    api.upload_file(path_or_fileobj=b'{"a": 1}', path_in_repo="conf/config.json", repo_id=repo_id)
    assert api.file_exists(repo_id, "conf/config.json")
    api.delete_file("conf/config.json", repo_id, commit_message="Remove config")
    assert not api.file_exists(repo_id, "conf/config.json")
    titles = [c.title for c in api.list_repo_commits(repo_id)]
    assert titles[0] == "Remove config" and titles[-1] == "initial commit"
    assert all(len(c.commit_id) == 40 for c in api.list_repo_commits(repo_id))


def test_pull_request_and_branch(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    pr = api.upload_file(path_or_fileobj=b"pr", path_in_repo="pr.txt", repo_id=repo_id, create_pr=True)
    assert pr.pr_revision == "refs/pr/1"
    assert "pr.txt" in api.list_repo_files(repo_id, revision="refs/pr/1")
    assert "pr.txt" not in api.list_repo_files(repo_id)
    api.create_branch(repo_id, branch="dev")
    api.upload_file(path_or_fileobj=b"dev", path_in_repo="dev.txt", repo_id=repo_id, revision="dev")
    refs = api.list_repo_refs(repo_id, include_pull_requests=True)
    assert {b.name for b in refs.branches} == {"main", "dev"} and [p.ref for p in refs.pull_requests] == ["refs/pr/1"]
    path = hf_hub_download(repo_id, "pr.txt", revision="refs/pr/1", token=local_hub.alice_token)
    assert Path(path).read_bytes() == b"pr"


def test_resolve_headers_and_range(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    data = os.urandom(4096)
    commit = api.upload_file(path_or_fileobj=data, path_in_repo="weights.bin", repo_id=repo_id)
    url = f"{local_hub.endpoint}/{repo_id}/resolve/main/weights.bin"
    head = httpx.head(url)
    assert head.headers["X-Repo-Commit"] == commit.oid
    assert head.headers["ETag"].strip('"') == hashlib.sha256(data).hexdigest()
    assert head.headers["X-Linked-Size"] == "4096"
    part = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    missing = httpx.head(f"{local_hub.endpoint}/{repo_id}/resolve/main/nope.bin")
    assert missing.status_code == 404 and missing.headers["X-Error-Code"] == "EntryNotFound"


def test_dataset_repo_and_invalid_card_metadata(local_hub: LocalHubFixture) -> None:
    api = local_hub.api(local_hub.alice_token)
    dataset = {"repo_id": "acme/table", "repo_type": "dataset"}
    api.create_repo(**dataset)
    api.upload_file(path_or_fileobj=b"a,b\n1,2\n", path_in_repo="data/train.csv", **dataset)
    path = hf_hub_download(filename="data/train.csv", token=local_hub.alice_token, **dataset)
    assert Path(path).read_bytes() == b"a,b\n1,2\n"
    with pytest.raises(ValueError, match="Invalid metadata"):
        api.upload_file(path_or_fileobj=b"---\nlicense: [mit\n---\n", path_in_repo="README.md", **dataset)


# -- permissions ------------------------------------------------------------------


def test_permission_matrix(local_hub: LocalHubFixture, repo_id: str, tmp_path: Path) -> None:
    alice = local_hub.api(local_hub.alice_token)
    bob = local_hub.api(local_hub.bob_token)
    alice.create_repo(repo_id, private=True)
    alice.upload_file(path_or_fileobj=b"secret", path_in_repo="secret.txt", repo_id=repo_id)
    public_id = f"{repo_id}-public"
    alice.create_repo(public_id)

    with pytest.raises(RepositoryNotFoundError):
        bob.model_info(repo_id)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(repo_id, "secret.txt", token=False, cache_dir=tmp_path / "anon")
    with pytest.raises(RepositoryNotFoundError):
        local_hub.api().list_repo_files(repo_id)

    with pytest.raises(HfHubHTTPError) as exc:
        bob.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=public_id)
    assert exc.value.response.status_code == 403

    local_hub.api(local_hub.bob_token).create_repo("bob/own")  # bob writes his own namespace
    LocalHubStore(local_hub.root).add_org("rivals")
    with pytest.raises(HfHubHTTPError) as exc:
        alice.create_repo("rivals/model")
    assert exc.value.response.status_code == 403
    assert alice.create_repo(f"{local_hub.org}/{repo_id.split('/')[1]}").repo_id.startswith("acme/")

    readonly = local_hub.api(local_hub.alice_readonly_token)
    assert readonly.list_repo_files(repo_id)  # a read-only token still reads
    with pytest.raises(HfHubHTTPError) as exc:
        readonly.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo_id)
    assert exc.value.response.status_code == 403

    assert local_hub.api().list_repo_files(public_id) == [".gitattributes"]  # anonymous reads public


def test_gated_repo_needs_granted_access_to_download(local_hub: LocalHubFixture, repo_id: str, tmp_path: Path) -> None:
    from huggingface_hub.errors import GatedRepoError

    alice = local_hub.api(local_hub.alice_token)
    alice.create_repo(repo_id)
    alice.upload_file(path_or_fileobj=b"weights", path_in_repo="model.bin", repo_id=repo_id)
    alice.update_repo_settings(repo_id, gated="auto")
    assert local_hub.api(local_hub.bob_token).model_info(repo_id).gated == "auto"  # the page stays visible

    def download(token, folder):
        return hf_hub_download(
            repo_id, "model.bin", token=token, cache_dir=tmp_path / folder, endpoint=local_hub.endpoint
        )

    with pytest.raises(GatedRepoError) as exc:
        download(local_hub.bob_token, "bob")
    assert exc.value.response.status_code == 403 and "not in the authorized list" in str(exc.value)
    with pytest.raises(GatedRepoError) as exc:
        download(False, "anon")
    assert exc.value.response.status_code == 401
    assert Path(download(local_hub.alice_token, "alice")).read_bytes() == b"weights"  # the owner always may

    LocalHubStore(local_hub.root).grant_access(
        LocalHubStore(local_hub.root).find_repo("model", *repo_id.split("/")), "bob"
    )
    assert Path(download(local_hub.bob_token, "bob-granted")).read_bytes() == b"weights"
    alice.update_repo_settings(repo_id, gated=False)
    assert Path(download(False, "anon-ungated")).read_bytes() == b"weights"


def test_bad_token_is_401_and_invalid_name_is_400(local_hub: LocalHubFixture) -> None:
    with pytest.raises(HfHubHTTPError) as exc:
        local_hub.api("hf_" + "x" * 34).model_info("alice/anything")
    assert exc.value.response.status_code == 401 and not isinstance(exc.value, RepositoryNotFoundError)
    for name in ("bad--name", "-lead", "trail.", "a" * 97, "sp ace", "x..y"):
        response = httpx.post(
            f"{local_hub.endpoint}/api/repos/create",
            json={"name": name, "organization": "alice"},
            headers={"Authorization": f"Bearer {local_hub.alice_token}"},
        )
        assert response.status_code == 400, name
        assert "error" in response.json()


# -- integrity --------------------------------------------------------------------


def test_corrupted_lfs_upload_is_rejected(local_hub: LocalHubFixture, repo_id: str) -> None:
    local_hub.api(local_hub.alice_token).create_repo(repo_id)
    data = os.urandom(2048)
    oid = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {local_hub.alice_token}"}
    batch = httpx.post(
        f"{local_hub.endpoint}/{repo_id}.git/info/lfs/objects/batch",
        json={"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": len(data)}]},
        headers=auth,
    ).json()
    href = batch["objects"][0]["actions"]["upload"]["href"]

    assert 400 <= httpx.put(href, content=os.urandom(2048)).status_code < 500  # wrong bytes
    assert 400 <= httpx.put(href, content=data[:-1]).status_code < 500  # wrong size
    assert 400 <= httpx.put(href.replace("sig=", "sig=0"), content=data).status_code < 500  # forged URL
    assert not LocalHubStore(local_hub.root).blobs.has(oid)
    verify = batch["objects"][0]["actions"]["verify"]["href"]
    assert httpx.post(verify, json={"oid": oid, "size": len(data)}, headers=auth).status_code == 404

    assert httpx.put(href, content=data).status_code == 200
    assert LocalHubStore(local_hub.root).blobs.has(oid)


def test_commit_naming_unuploaded_lfs_object_is_rejected(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    ghost = {"path": "ghost.pte", "algo": "sha256", "oid": "ab" * 32, "size": 123}
    lines = [{"key": "header", "value": {"summary": "ghost"}}, {"key": "lfsFile", "value": ghost}]
    response = _commit_ndjson(local_hub, repo_id, local_hub.alice_token, lines)
    assert 400 <= response.status_code < 500
    assert "never uploaded" in response.json()["error"]
    assert api.list_repo_files(repo_id) == [".gitattributes"]


def test_stale_parent_commit_is_412(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    parent = api.model_info(repo_id).sha
    api.upload_file(path_or_fileobj=b"1", path_in_repo="one.txt", repo_id=repo_id, parent_commit=parent)
    with pytest.raises(HfHubHTTPError) as exc:
        api.upload_file(path_or_fileobj=b"2", path_in_repo="two.txt", repo_id=repo_id, parent_commit=parent)
    assert exc.value.response.status_code == 412


def test_concurrent_commits_lose_nothing(local_hub: LocalHubFixture, repo_id: str) -> None:
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    errors: list[BaseException] = []

    def push(i: int) -> None:
        try:
            local_hub.api(local_hub.alice_token).create_commit(
                repo_id,
                operations=[CommitOperationAdd(f"file-{i}.txt", f"content {i}".encode())],
                commit_message=f"add {i}",
            )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {f"file-{i}.txt" for i in range(8)} <= set(api.list_repo_files(repo_id))
    assert len(api.list_repo_commits(repo_id)) == 9


def test_state_survives_restart(tmp_path: Path, hf_isolated_env: Path) -> None:
    root = tmp_path / "hub"
    token = add_user(root, "carol")
    with serve_in_thread(root) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("carol/keep", private=True)
        commit = api.upload_file(path_or_fileobj=b"x" * 1000 + b"\0", path_in_repo="w.bin", repo_id="carol/keep")
    with serve_in_thread(root) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        assert api.model_info("carol/keep").sha == commit.oid
        path = hf_hub_download("carol/keep", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
        assert Path(path).read_bytes() == b"x" * 1000 + b"\0"


# -- surface ----------------------------------------------------------------------


def test_xet_routes_explain_how_to_disable_xet(local_hub: LocalHubFixture) -> None:
    for route in ("xet-write-token", "xet-read-token"):
        response = httpx.get(f"{local_hub.endpoint}/api/models/alice/x/{route}/main")
        assert response.status_code == 501
        assert "HF_HUB_DISABLE_XET=1" in response.json()["error"]
        assert "HF_HUB_DISABLE_XET=1" in response.headers["X-Error-Message"]


def test_request_log_never_contains_tokens(
    local_hub: LocalHubFixture, repo_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hub_export.hub.localhub")
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    api.upload_file(path_or_fileobj=os.urandom(2000) + b"\0", path_in_repo="w.bin", repo_id=repo_id)
    httpx.get(f"{local_hub.endpoint}/api/models?token={local_hub.bob_token}")
    text = caplog.text
    assert "PUT /api/lfs-upload/" in text and "sig=***" in text
    assert local_hub.alice_token not in text and local_hub.bob_token not in text


def test_add_user_cli_prints_token_last(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(hub_cli, ["add-user", "dave", "--org", "labs", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("hf_") and len(token) == 37
    caller = LocalHubStore(tmp_path).authenticate(token)
    assert caller is not None and caller.name == "dave" and caller.orgs == {"labs": "write"}
    again = runner.invoke(hub_cli, ["add-user", "dave", "--read-only", "--root", str(tmp_path)])
    second = again.stdout.strip().splitlines()[-1]
    assert second != token and LocalHubStore(tmp_path).authenticate(second).can_write is False
    assert LocalHubStore(tmp_path).authenticate(token) is not None
    assert token not in (tmp_path / "hub.sqlite").read_bytes().decode("latin-1")


def test_serve_refuses_remote_host_without_flag(tmp_path: Path) -> None:
    result = CliRunner().invoke(hub_cli, ["serve", "--host", "0.0.0.0", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output and len(result.output.strip().splitlines()) == 1
