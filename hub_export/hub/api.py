"""Hub access shared by every stage: endpoint and token, one translator of Hub failures, and repos.

Reading a source, pushing, listing and pulling all go through ``huggingface_hub``, and
all of their failures go through :func:`hub_errors`: the same gated repo or missing
token gets the same advice whichever command met it. Errors carry a ``code`` (``login``,
``gated``, ``not_found``, ``token_rejected``, ``forbidden``, ``revision``, ``network``,
``conflict``) so that a front end can give its own advice; the token never appears in
a message. The second half names, checks and reads target repos: who the token belongs
to and whether it may write there, and what a repo holds before a push.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub_export.errors import HubError, HubExportError, InputError, opt
from hub_export.hub.card import CARD_NAME
from hub_export.pipeline.manifest import MANIFEST_NAME, Manifest, sha256_file
from hub_export.redact import redact

LOGIN_HINT = f"pass {opt('token')}, set HF_TOKEN or run `hf auth login`"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``HF_ENDPOINT`` (read by huggingface_hub), without a trailing slash."""
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def resolve_token(token: str | None = None) -> str | None:
    """``token``, else ``HF_TOKEN``, else the huggingface_hub login; None when not logged in."""
    from huggingface_hub import get_token

    return token or get_token()


def network_errors() -> tuple[type[BaseException], ...]:
    """Connection-level failures of whichever HTTP client huggingface_hub uses (httpx2 in 2.x)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name in ("httpx2", "httpx"):
        try:
            errors.append(__import__(module_name).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def not_logged_in(endpoint: str) -> HubError:
    return HubError(f"not logged in to {endpoint}", hint=LOGIN_HINT, param="token", code="login")


# What each refused request means, and what to do: (reason, hint, the option at fault, code, names the repo).
_HTTP_ADVICE = {
    401: ("the Hub at {endpoint} rejected the token (HTTP 401)", f"{LOGIN_HINT} with a valid token", "token",
          "token_rejected", False),
    403: ("permission denied: your token cannot {action} {repo_id} (HTTP 403)",
          "use a token with access to that repo, or push to your own namespace", "token", "forbidden", True),
    409: ("conflict while trying to {action} {repo_id} (HTTP 409: {detail})", "retry in a moment", None, "conflict",
          True),
    412: ("{repo_id} changed while pushing (HTTP 412)", "run the command again", None, "conflict", True),
}  # fmt: skip


def _http_failure(error, repo_id: str, endpoint: str, action: str, failure: type[HubExportError]) -> HubExportError:
    status = error.response.status_code if getattr(error, "response", None) is not None else None
    detail = " ".join((getattr(error, "server_message", None) or "").split())[:200]
    if status == 400:
        return InputError(
            f"the Hub refused to {action} {repo_id} (HTTP 400: {detail or 'bad request'})",
            hint="check the repo name",
            repo_id=repo_id,
        )
    if status in _HTTP_ADVICE:
        reason, hint, param, code, names_repo = _HTTP_ADVICE[status]
        words = dict(endpoint=endpoint, action=action, repo_id=repo_id, detail=detail)
        return failure(reason.format(**words), hint=hint, param=param, code=code,
                       repo_id=repo_id if names_repo else None)  # fmt: skip
    return failure(
        f"the Hub failed to {action} {repo_id} (HTTP {status or '?'}{': ' + detail if detail else ''})",
        hint="retry later",
        repo_id=repo_id,
    )


# Over 60 lines as a flat table: one except clause per failure huggingface_hub names, each with its advice.
@contextmanager
def hub_errors(
    repo_id: str,
    endpoint: str,
    action: str = "access",
    token: str | None = None,
    failure: type[HubExportError] = HubError,
    revision: str | None = None,
) -> Iterator[None]:
    """Turn huggingface_hub and network failures into one-line, actionable errors.

    ``failure`` is the error class for what the Hub refused or could not serve
    (:class:`~hub_export.errors.SourceError` while reading a source, exit code 3;
    :class:`~hub_export.errors.HubError` otherwise, exit code 5).

    Example:
        >>> with hub_errors("alice/repo", "https://huggingface.co", "push to", token):
        ...     api.create_commit(...)
    """
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        LocalTokenNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except HubExportError:
        raise
    except LocalTokenNotFoundError:
        raise not_logged_in(endpoint) from None
    except GatedRepoError:
        raise failure(
            f"{repo_id} is gated",
            repo_id=repo_id,
            param="token",
            code="gated",
            hint=f"accept its conditions on the Hub, then retry with the token ({opt('token')} or HF_TOKEN) of an "
            "account that accepted them",
        ) from None
    except RepositoryNotFoundError:
        raise failure(
            f"repo {repo_id} not found on {endpoint}, or your token cannot see it",
            repo_id=repo_id,
            code="not_found",
            hint=f"check the id; for a private repo use a token that can read it ({opt('token')} or HF_TOKEN)",
        ) from None
    except RevisionNotFoundError:
        asked = f"revision {revision!r}" if revision else "revision"
        raise failure(
            f"{asked} not found in {repo_id}",
            hint=f"check {opt('revision')} or {opt('branch')}",
            param="revision",
            repo_id=repo_id,
            code="revision",
        ) from None
    except LocalEntryNotFoundError:
        raise failure(
            f"cannot download from {endpoint} (unreachable, and not in the local cache)",
            hint=f"check the network or {opt('endpoint')}/HF_ENDPOINT",
            code="network",
        ) from None
    except EntryNotFoundError as error:
        raise failure(
            f"{repo_id} lacks a file hub-export needs ({redact(str(error).splitlines()[0], token)})", repo_id=repo_id
        ) from None
    except HfHubHTTPError as error:
        translated = _http_failure(error, repo_id, endpoint, action, failure)
        translated.reason = redact(translated.reason, token)
        raise type(translated)(
            translated.reason,
            hint=translated.hint,
            param=translated.param,
            repo_id=translated.repo_id,
            code=translated.code,
        ) from None
    except HFValidationError as error:
        raise InputError(redact(str(error).splitlines()[0], token)) from None
    except network_errors() as error:
        raise failure(
            f"cannot reach {endpoint} ({type(error).__name__})",
            hint=f"check the network or {opt('endpoint')}/HF_ENDPOINT",
            code="network",
        ) from None


# -- repos: names, access and state ----------------------------------------------------


REPO_SUFFIX = "-ExecuTorch"


def check_repo_id(repo_id: str, *, namespace_required: bool = True) -> str:
    """Validate ``repo_id`` locally, with huggingface_hub's validator, before any request.

    Example:
        >>> check_repo_id("alice/tiny-ExecuTorch")
        'alice/tiny-ExecuTorch'
        >>> check_repo_id("alice/bad--name")
        Traceback (most recent call last):
        hub_export.errors.InputError: invalid repo id 'alice/bad--name': ...
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        reason = str(error).split("\n")[0]
        raise InputError(f"invalid repo id {repo_id!r}: {reason}") from None
    if namespace_required and "/" not in repo_id:
        raise InputError(f"invalid repo id {repo_id!r}: use namespace/name, e.g. alice/{repo_id}")
    return repo_id


def default_repo_name(source_name: str) -> str:
    """The repo name for an export of ``source_name`` (a repo id or a folder name).

    Example:
        >>> default_repo_name("HuggingFaceTB/SmolLM2-135M")
        'SmolLM2-135M-ExecuTorch'
    """
    return source_name.rstrip("/").split("/")[-1] + REPO_SUFFIX


@dataclass
class RemoteRepo:
    """A target repo as it is before the push."""

    exists: bool
    branch_exists: bool
    head: str | None  # commit the comparison was made against
    files: dict[str, Any]  # path -> RepoFile
    manifest: Manifest | None
    private: bool | None = None

    @property
    def is_foreign(self) -> bool:
        """Content not made by hub-export (an empty repo, e.g. a fresh one, is not)."""
        return self.exists and self.manifest is None and bool(set(self.files) - {".gitattributes"})


def whoami(api, endpoint: str) -> dict:
    with hub_errors("your account", endpoint, "identify"):
        return api.whoami()


def check_can_write(user: dict, namespace: str, endpoint: str) -> None:
    """Refuse early what the Hub would refuse after the export: read tokens, foreign namespaces."""
    name = user.get("name", "")
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError(
            f"your token for {endpoint} is read-only",
            param="token",
            code="read_only",
            hint=f"create a write token and pass it with {opt('token')}",
        )
    orgs = {org.get("name") for org in user.get("orgs") or [] if org.get("roleInOrg") != "read"}
    if namespace != name and namespace not in orgs:
        raise HubError(
            f"permission denied: {name} cannot write to {namespace}/ on {endpoint}",
            param="repo_id",
            hint=f"push to {name}/... or ask {namespace} for write access",
            code="other_namespace",
        )


def read_remote_manifest(api, repo_id: str, revision: str) -> Manifest | None:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id, MANIFEST_NAME, revision=revision, endpoint=api.endpoint, token=api.token)
    try:
        return Manifest.parse(Path(path).read_bytes(), f"{repo_id}/{MANIFEST_NAME}")
    except InputError:
        return None


def remote_state(api, repo_id: str, branch: str | None, endpoint: str) -> RemoteRepo:
    from huggingface_hub.errors import RepositoryNotFoundError

    with hub_errors(repo_id, endpoint, "read", api.token):
        try:
            info = api.repo_info(repo_id)
        except RepositoryNotFoundError:
            return RemoteRepo(False, False, None, {}, None)
        branch_exists = True
        if branch and branch != "main":
            branches = {b.name for b in api.list_repo_refs(repo_id).branches}
            branch_exists = branch in branches
        # A new branch starts from main, so main is what it would hold without this push.
        revision = branch if branch and branch_exists else "main"
        head = api.repo_info(repo_id, revision=revision).sha if revision != "main" else info.sha
        files = {f.path: f for f in api.list_repo_tree(repo_id, recursive=True, revision=head) if hasattr(f, "blob_id")}
        manifest = read_remote_manifest(api, repo_id, head) if MANIFEST_NAME in files else None
    return RemoteRepo(True, branch_exists, head, files, manifest, getattr(info, "private", None))


def is_unchanged(content: Path | bytes, remote_file) -> bool:
    """Whether ``content`` equals the remote file: sha256 for LFS files, git blob id otherwise."""
    if remote_file is None:
        return False
    if isinstance(content, Path):
        size = content.stat().st_size
        if remote_file.size != size:
            return False
        if remote_file.lfs is not None:
            return remote_file.lfs.sha256 == sha256_file(content)
        content = content.read_bytes()
    if remote_file.size != len(content):
        return False
    if remote_file.lfs is not None:
        return remote_file.lfs.sha256 == hashlib.sha256(content).hexdigest()
    return remote_file.blob_id == git_blob_id(content)


def git_blob_id(content: bytes) -> str:
    """The id git gives a file's content (what the Hub reports as a small file's ``blob_id``).

    Example:
        >>> git_blob_id(b"hello\n")
        'ce013625030ba8dba906f756967f9e9ca394464a'
    """
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def target_repo_for(api, repo_id: str | None, source_name: str, token: str | None, endpoint: str) -> str:
    """The checked target repo id: given, or ``{user}/{source}-ExecuTorch``; writable by the token."""
    user = whoami(api, endpoint) if token else None
    if repo_id is None:
        if user is None:
            raise HubError(
                "name the target repo or log in so that it defaults to your namespace",
                hint=LOGIN_HINT,
                param="token",
                code="login",
            )
        repo_id = f"{user['name']}/{default_repo_name(source_name)}"
    check_repo_id(repo_id)
    if user is not None:
        check_can_write(user, repo_id.split("/")[0], endpoint)
    return repo_id


def target_repo(name: str, token: str | None, endpoint: str | None = None) -> str:
    """``namespace/name`` for a repo name: a bare name goes to the token owner's namespace.

    Example:
        >>> target_repo("SmolLM2-135M-ExecuTorch", token)
        'alice/SmolLM2-135M-ExecuTorch'
    """
    if "/" in name:
        return check_repo_id(name)
    from huggingface_hub import HfApi

    endpoint = resolve_endpoint(endpoint)
    if not token:
        raise not_logged_in(endpoint)
    user = whoami(HfApi(endpoint=endpoint, token=token), endpoint)
    return check_repo_id(f"{user['name']}/{name}")


def read_card(
    repo_id: str,
    revision: str | None,
    token: str | None,
    endpoint: str | None = None,
    local_dir: str | Path | None = None,
) -> str:
    """The text of a repo's model card (README.md) at ``revision``."""
    from huggingface_hub import hf_hub_download

    endpoint = resolve_endpoint(endpoint)
    with hub_errors(repo_id, endpoint, "read", token):
        path = hf_hub_download(
            repo_id, CARD_NAME, revision=revision, endpoint=endpoint, token=token, local_dir=local_dir
        )
    return Path(path).read_text(encoding="utf-8")


def check_branch(branch: str) -> None:
    if not branch or branch.startswith(("refs/", "/")) or any(c in branch for c in " ~^:?*[\\") or ".." in branch:
        raise InputError(f"invalid branch name {branch!r}; use a plain name like 'executorch'")
