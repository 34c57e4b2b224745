"""Publish: push an export to the Hub in one commit, list a repo's variants, pull one back.

All Hub I/O goes through ``huggingface_hub``. Push checks everything it can before the
export starts (login, repo name, write access, that an existing repo is ours) so that a
mistake costs seconds, not an export; the export itself verifies every variant and
raises before anything is written to the Hub. Every Hub failure becomes a one-line
:class:`~hub_export.errors.HubError` or :class:`~hub_export.errors.InputError` that
says what to do, and the token never appears in a message, file or card.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import card as card_module
from .errors import HubError, InputError, VerificationError, opt
from .manifest import MANIFEST_NAME, Manifest, Variant, sha256_file
from .options import ExportOptions, options_with
from .progress import Callback, Tracker, tracker
from .quantize import QMODES
from .hub import LOGIN_HINT, hub_errors, not_logged_in, resolve_endpoint, resolve_token
from .source import CONFIG_FILES, TOKENIZER_FILES

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
REPO_SUFFIX = "-ExecuTorch"
CARD_NAME = card_module.CARD_NAME
COMPANION_FILES = tuple(CONFIG_FILES) + tuple(TOKENIZER_FILES)


@dataclass
class PushResult:
    """What a push did (or, in a dry run, would do).

    ``files`` are the paths in the commit (new or changed); ``sizes`` maps every file of
    the export to its size; ``commit_oid`` is None when nothing was committed.
    """

    repo_id: str
    url: str
    commit_oid: str | None
    files: list[str]
    variants: list[str]
    sizes: dict[str, int] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    pr_url: str | None = None
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def pushed(self) -> bool:
        return self.commit_oid is not None

    @property
    def summary(self) -> str:
        """One line for the user."""
        if self.dry_run:
            if not self.files:
                return f"dry run: nothing to push: {self.repo_id} already has these files"
            return f"dry run: would upload {len(self.files)} file(s) to {self.repo_id} in one commit; nothing was sent"
        if not self.pushed:
            return "nothing to push: the repo already has these files"
        where = self.pr_url or self.url
        return f"pushed {len(self.files)} file(s) to {where} in commit {self.commit_oid[:12]}"


# -- settings -----------------------------------------------------------------------


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


# -- remote state -------------------------------------------------------------------


@dataclass
class _Remote:
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


def _who(api, endpoint: str) -> dict:
    with hub_errors("your account", endpoint, "identify"):
        return api.whoami()


def _check_can_write(user: dict, namespace: str, endpoint: str) -> None:
    """Refuse early what the Hub would refuse after the export: read tokens, foreign namespaces."""
    name = user.get("name", "")
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError(f"your token for {endpoint} is read-only", param="token", code="read_only",
                       hint=f"create a write token and pass it with {opt('token')}")
    orgs = {org.get("name") for org in user.get("orgs") or [] if org.get("roleInOrg") != "read"}
    if namespace != name and namespace not in orgs:
        raise HubError(
            f"permission denied: {name} cannot write to {namespace}/ on {endpoint}", param="repo_id",
            hint=f"push to {name}/... or ask {namespace} for write access", code="other_namespace",
        )


def _read_remote_manifest(api, repo_id: str, revision: str) -> Manifest | None:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id, MANIFEST_NAME, revision=revision, endpoint=api.endpoint, token=api.token)
    try:
        return Manifest.parse(Path(path).read_bytes(), f"{repo_id}/{MANIFEST_NAME}")
    except InputError:
        return None


def _remote_state(api, repo_id: str, branch: str | None, endpoint: str) -> _Remote:
    from huggingface_hub.errors import RepositoryNotFoundError

    with hub_errors(repo_id, endpoint, "read", api.token):
        try:
            info = api.repo_info(repo_id)
        except RepositoryNotFoundError:
            return _Remote(False, False, None, {}, None)
        branch_exists = True
        if branch and branch != "main":
            branches = {b.name for b in api.list_repo_refs(repo_id).branches}
            branch_exists = branch in branches
        # A new branch starts from main, so main is what it would hold without this push.
        revision = branch if branch and branch_exists else "main"
        head = api.repo_info(repo_id, revision=revision).sha if revision != "main" else info.sha
        files = {f.path: f for f in api.list_repo_tree(repo_id, recursive=True, revision=head) if hasattr(f, "blob_id")}
        manifest = _read_remote_manifest(api, repo_id, head) if MANIFEST_NAME in files else None
    return _Remote(True, branch_exists, head, files, manifest, getattr(info, "private", None))


def _is_unchanged(content: Path | bytes, remote_file) -> bool:
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
    from huggingface_hub.utils.sha import git_hash  # the client's own formula for what it compares

    return remote_file.blob_id == git_hash(content)


# -- the local export -----------------------------------------------------------------


def _check_folder(folder: Path, manifest: Manifest) -> None:
    """Every variant present, intact and verified: only what passed verification is published."""
    if not manifest.variants:
        raise InputError(f"{folder.name}/{MANIFEST_NAME} lists no variant; export into it with `hub-export export`")
    for variant in manifest.variants:
        if not variant.verification.verified:
            raise VerificationError(
                f"{variant.file} was not verified (exported with --no-verify); export it again with verification "
                "before publishing"
            )
        for name, expected in variant.files():
            path = folder / name
            if not path.is_file():
                raise InputError(f"{folder.name}/ lacks {name}, listed in its manifest; export again")
            actual = sha256_file(path)
            if actual != expected:
                raise VerificationError(
                    f"{folder.name}/{name} has sha256 {actual}, but the manifest says {expected}; "
                    "the file changed after export: export again"
                )
    if not (folder / "tokenizer.json").is_file():
        raise InputError(f"{folder.name}/ has no tokenizer.json; the runners need it: export again")


def _source_card_data(
    source_card: str | Path | None, manifest: Manifest, folder: Path, source: str | None, token, endpoint: str
) -> dict[str, Any]:
    """The license/language to inherit, from the first that has it.

    An explicit card, what the manifest remembered, the local source folder's card,
    the Hub source's card (at the exported revision), then a card already in the folder.
    """
    if source_card is not None:
        path = Path(source_card)
        if not path.exists():
            raise InputError(f"{opt('source_card')} {path.name} not found", param="source_card")
        return card_module.read_source_card(path)
    if manifest.source.get("card_data"):
        return dict(manifest.source["card_data"])
    if source and Path(source).expanduser().is_dir():
        data = card_module.read_source_card(Path(source).expanduser())
        if data or not manifest.source.get("base_model"):
            return data
    if manifest.source.get("base_model"):
        data = _base_model_card(manifest.source["base_model"], token, endpoint)
        if data:
            return data
    if not manifest.source.get("local") and manifest.source.get("id"):
        try:
            return _hub_source_card(manifest.source["id"], manifest.source.get("revision"), token, endpoint)
        except HubError:
            if source is not None:
                raise
            # --from: the source may live on another Hub than the target; fall back to the folder.
    return card_module.read_source_card(folder)


def _base_model_card(repo_id: str, token, endpoint: str) -> dict[str, Any]:
    """The card data of the model named with ``--base-model``, or ``{}`` when it cannot be read.

    The exporter's own claim, looked up on the target's Hub: a base model that is not there
    (another Hub, offline) leaves the card without inherited terms rather than failing the push.
    """
    try:
        return _hub_source_card(repo_id, None, token, endpoint)
    except HubError as error:
        log.info("no card data from base model %s: %s", repo_id, error)
        return {}


def _hub_source_card(repo_id: str, revision: str | None, token, endpoint: str) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    with hub_errors(repo_id, endpoint, "read", token):
        try:
            path = hf_hub_download(repo_id, CARD_NAME, revision=revision, endpoint=endpoint, token=token)
        except EntryNotFoundError:
            return {}
    return card_module.read_source_card(path)


def _check_same_source(remote: Manifest, source_id: str | None) -> None:
    """One repo, one source model: variants of another model would share its tokenizer and card."""
    if remote.source.get("id") != source_id:
        raise InputError(
            f"the repo holds exports of {remote.source.get('id')!r}, not {source_id!r}", hint="push to another repo",
            param="repo_id", code="other_source",
        )


def _merge(remote: Manifest | None, local: Manifest) -> Manifest:
    """The manifest the repo will hold: remote variants kept, local ones added or replacing."""
    if remote is None:
        return local
    _check_same_source(remote, local.source.get("id"))
    merged = remote.merge(local)
    if "card_data" not in merged.source and remote.source.get("card_data"):
        merged.source = {**merged.source, "card_data": remote.source["card_data"]}
    # Each export adds the command that reproduces its variants.
    commands = [c for c in remote.command.splitlines() + local.command.splitlines() if c.strip()]
    merged.command = "\n".join(dict.fromkeys(commands))
    return merged


def _payload(folder: Path, local: Manifest, merged: Manifest, card_text: str) -> dict[str, Path | bytes]:
    """Path in repo -> content: this export's variants, the companion files, manifest and card."""
    files: dict[str, Path | bytes] = {name: folder / name for v in local.variants for name, _ in v.files()}
    for name in COMPANION_FILES:
        if (folder / name).is_file():
            files[name] = folder / name
    files[MANIFEST_NAME] = (json.dumps(merged.to_dict(), indent=2) + "\n").encode()
    files[CARD_NAME] = card_text.encode("utf-8")
    plot = card_module.frontier_png(merged)
    if plot is not None:
        files[card_module.FRONTIER_PLOT] = plot
    return files


def _size(content: Path | bytes) -> int:
    return content.stat().st_size if isinstance(content, Path) else len(content)


def _commit_message(variants: Sequence[Variant]) -> str:
    listed = ", ".join(f"{v.file} ({v.qmode}{'+emb' + v.qembedding if v.qembedding else ''})" for v in variants)
    return f"Add ExecuTorch variants: {listed}"[:200]


def _commit_description(local: Manifest, merged: Manifest) -> str:
    lines = [f"Exported from {local.source.get('id')} with hub-export {local.versions.get('hub-export', '')}."]
    for v in local.variants:
        lines.append(f"- {v.file}: {v.verification.line()}; max context {v.max_seq_len}")
    lines.append(f"Variants in the repo after this commit: {', '.join(v.file for v in merged.variants)}.")
    return "\n".join(lines)


# -- push -----------------------------------------------------------------------------


def push(
    source: str | None = None,
    repo_id: str | None = None,
    options: ExportOptions | None = None,
    *,
    from_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
    branch: str | None = None,
    private: bool = False,
    create_pr: bool = False,
    dry_run: bool = False,
    exist_ok: bool = False,
    template: str | Path | None = None,
    source_card: str | Path | None = None,
    force: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    progress: Callback | Tracker | None = None,
    engine: Any = None,
    **option_values: Any,
) -> PushResult:
    """Export ``source`` (or take the export in ``from_dir``) and publish it in one commit.

    ``cache_dir`` is where a Hub source is downloaded (default: the Hugging Face cache).
    ``revision`` is the *source* revision to export; ``branch`` is the target branch
    (created from main when missing). ``repo_id`` defaults to
    ``{your user}/{source name}-ExecuTorch``. An existing repo keeps its other variants;
    card and manifest are updated. A repo not made by hub-export needs ``exist_ok``.
    ``base_model``, ``license`` and ``model_name`` say what a local or GGUF source is, for
    the card (see :func:`hub_export.export.export`); with ``from_dir`` they are added to its manifest.
    What to export is an :class:`~hub_export.options.ExportOptions`, whole or as keywords,
    as for :func:`hub_export.export.export`.

    Example:
        >>> result = push("HuggingFaceTB/SmolLM2-135M", qmodes=["8da4w"], max_seq_len=256)
        >>> result.repo_id, result.variants
        ('alice/SmolLM2-135M-ExecuTorch', ['model-8da4w.pte'])
        >>> push(from_dir="out", repo_id="alice/SmolLM2-135M-ExecuTorch").summary
        'nothing to push: the repo already has these files'
    """
    from huggingface_hub import HfApi

    from .export import export

    options = options_with(options, option_values)
    _check_push_arguments(source, from_dir, output_dir, template)
    say = tracker(progress, log.info)
    say.expect(2)  # checking the repo, uploading; the export adds its own steps
    endpoint = resolve_endpoint(endpoint)
    token = resolve_token(token)
    if token is None and not dry_run:
        raise not_logged_in(endpoint)
    folder = Path(from_dir) if from_dir is not None else None
    local = Manifest.read(folder) if folder is not None else None
    if local is not None:
        local.source = {**local.source, **card_module.declared_source(options.base_model, options.license,
                                                                       options.model_name)}
    source_name = local.source.get("id") if local else _source_name(source, options.gguf_file)

    api = HfApi(endpoint=endpoint, token=token if token else False)
    repo_id = _target_repo(api, repo_id, source_name or Path(source or ".").resolve().name, token, endpoint)
    if branch is not None:
        _check_branch(branch)
    say(f"checking {repo_id} on {endpoint}", "check")
    remote = _remote_state(api, repo_id, branch, endpoint)
    if remote.is_foreign and not exist_ok:
        raise InputError(
            f"{repo_id} already exists and was not made by hub-export (no {MANIFEST_NAME})", param="repo_id",
            hint=f"pass {opt('exist_ok')} to add the export to it", repo_id=repo_id, code="foreign_repo",
        )
    if remote.manifest is not None:
        _check_same_source(remote.manifest, source_name)  # before an export is wasted
        if from_dir is None and not force and not dry_run:
            built = _already_built(remote.manifest, source, options, token, endpoint)
            if built:
                say(f"{repo_id} already holds {', '.join(built)} built from the same source revision with the same "
                    "options and tool versions; not rebuilding (--force rebuilds)")
            if len(built) == len(options.qmodes):
                url = f"{endpoint.rstrip('/')}/{repo_id}"
                return PushResult(repo_id, url, None, [], [v.file for v in remote.manifest.variants], unchanged=built,
                                  notes=["rebuilt nothing: pass --force to export and push again"])
            if built:
                missing = [q for q, name in zip(options.qmodes, options.variant_files()) if name not in built]
                options = options_with(options, {"qmodes": tuple(missing)})

    with tempfile.TemporaryDirectory(prefix="hub-export-push-") as scratch:
        if folder is None:
            assert source is not None
            folder = Path(output_dir) if output_dir else Path(scratch) / "export"
            local = export(source, folder, options, token=token, endpoint=endpoint, cache_dir=cache_dir, progress=say,
                           engine=engine)
        assert local is not None
        _check_folder(folder, local)
        card_data = _source_card_data(source_card, local, folder, source, token, endpoint)
        if card_data:
            local.source = {**local.source, "card_data": card_data}
        if from_dir is None:
            # Our own export folder: keep it re-renderable (`hub-export card`, `push --from`) as published.
            local.write(folder)
            card_module.write_card(folder, None, template, endpoint, repo_id=repo_id)
        merged = _merge(remote.manifest, local)
        config = card_module.read_config(folder)
        card_text = card_module.render_card(merged, None, template, endpoint, repo_id=repo_id, config=config)
        payload = _payload(folder, local, merged, card_text)
        return _publish(api, repo_id, payload, remote, local, merged, branch, private, create_pr, dry_run, endpoint, say)


def _already_built(remote: Manifest, source: str | None, options: ExportOptions, token, endpoint) -> list[str]:
    """The requested variant files that ``remote`` already holds built exactly as asked.

    Exactly: from the same source revision (a Hub commit, a GGUF's sha256 or a folder's
    contents), with the same options, by the same versions of hub-export, torch,
    executorch, torchao and transformers, and verified. Any doubt means rebuild.
    """
    from .manifest import package_versions
    from .source import peek_fingerprint

    if source is None or remote.versions != package_versions() or not remote.source.get("fingerprint"):
        return []
    declared = {key: remote.source.get(key) for key in ("base_model", "license", "model_name")}
    wanted_declared = card_module.declared_source(options.base_model, options.license, options.model_name)
    if {k: v for k, v in declared.items() if v is not None} != wanted_declared:
        return []  # the card would say something else
    by_file = {v.file: v for v in remote.variants}
    built = [name for qmode, name in zip(options.qmodes, options.variant_files())
             if name in by_file and _built_as_asked(by_file[name], qmode, options)]
    if not built:
        return []
    fingerprint = peek_fingerprint(source, options.gguf_file, options.revision, token, endpoint)
    return built if fingerprint and fingerprint == remote.source.get("fingerprint") else []


def _built_as_asked(variant: Variant, qmode: str, options: ExportOptions) -> bool:
    check = variant.verification
    scored = check.quality is not None and (check.quality.tokens or 0) > 0
    return (
        variant.qmode == qmode
        and check.verified
        and (options.max_seq_len is None or variant.max_seq_len == options.max_seq_len)
        and (not QMODES[qmode].grouped or variant.group_size == options.group_size)
        and bool(variant.data_file) == options.share_embeddings
        and scored == (options.quality_tokens > 0)
        and _same_recipe(variant, options)
        and _same_cache(variant, options)
    )


def _same_cache(variant: Variant, options: ExportOptions) -> bool:
    """Whether ``variant``'s KV cache is the one ``options`` ask for.

    The sliding layout matters only for a model with sliding layers; a manifest from
    before these choices had an fp32 cache without a sink.
    """
    cache = variant.kv_cache or {"dtype": "fp32", "attention_sink": None}
    sink = list(options.sink()) if options.sink() else None
    sliding_ok = not cache.get("sliding_layers") or cache.get("sliding") == options.sliding_cache
    return cache.get("dtype") == options.kv_cache and cache.get("attention_sink") == sink and sliding_ok


def _same_recipe(variant: Variant, options: ExportOptions) -> bool:
    """Whether ``variant`` was quantized with the int4 scales and the mixed budget ``options`` ask for."""
    from .calibrate import MixedPlan, budget_label

    mode = QMODES[variant.qmode]
    recipe = variant.recipe or {}
    if mode.weight_bits == 4 and recipe.get("int4_scales") != options.int4_scales:
        return False
    if not mode.calibrated:
        return True
    plan = MixedPlan.from_dict(recipe.get("mixed"))
    if plan is None or plan.calibrated != options.calibration:
        return False
    return not options.calibration or plan.budget == budget_label(options)


def _check_push_arguments(source, from_dir, output_dir, template) -> None:
    """Argument mistakes, found before any request."""
    if (source is None) == (from_dir is None):
        raise InputError(f"give either a SOURCE to export or {opt('from_dir')} DIR with an export folder")
    if from_dir is not None and not Path(from_dir).is_dir():
        raise InputError(f"{opt('from_dir')} {Path(from_dir).name} is not a folder", param="from_dir")
    if output_dir is not None:
        if from_dir is not None:
            raise InputError(f"{opt('output')} keeps a new export; with {opt('from_dir')} the export folder already "
                             "exists", param="output")
        if Path(output_dir).exists() and any(Path(output_dir).iterdir()):
            raise InputError(f"{Path(output_dir).name} is not empty", hint=f"choose another {opt('output')}",
                             param="output")
    if template is not None and not Path(template).is_file():
        raise InputError(f"template {Path(template).name} not found",
                         hint=f"pass an existing file to {opt('template')}", param="template")


def _target_repo(api, repo_id: str | None, source_name: str, token: str | None, endpoint: str) -> str:
    """The checked target repo id: given, or ``{user}/{source}-ExecuTorch``; writable by the token."""
    user = _who(api, endpoint) if token else None
    if repo_id is None:
        if user is None:
            raise HubError("name the target repo or log in so that it defaults to your namespace", hint=LOGIN_HINT,
                           param="token", code="login")
        repo_id = f"{user['name']}/{default_repo_name(source_name)}"
    check_repo_id(repo_id)
    if user is not None:
        _check_can_write(user, repo_id.split("/")[0], endpoint)
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
    user = _who(HfApi(endpoint=endpoint, token=token), endpoint)
    return check_repo_id(f"{user['name']}/{name}")


def read_card(repo_id: str, revision: str | None, token: str | None, endpoint: str | None = None,
              local_dir: str | Path | None = None) -> str:
    """The text of a repo's model card (README.md) at ``revision``."""
    from huggingface_hub import hf_hub_download

    endpoint = resolve_endpoint(endpoint)
    with hub_errors(repo_id, endpoint, "read", token):
        path = hf_hub_download(repo_id, CARD_NAME, revision=revision, endpoint=endpoint, token=token,
                               local_dir=local_dir)
    return Path(path).read_text(encoding="utf-8")


def _source_name(source: str | None, gguf_file: str | None = None) -> str:
    """The source id the export will record: the folder's name, a local GGUF's model name, or the repo id."""
    from .source import display_name

    return display_name(source, gguf_file)


def _check_branch(branch: str) -> None:
    if not branch or branch.startswith(("refs/", "/")) or any(c in branch for c in " ~^:?*[\\") or ".." in branch:
        raise InputError(f"invalid branch name {branch!r}; use a plain name like 'executorch'")


def _publish(
    api,
    repo_id: str,
    payload: dict[str, Path | bytes],
    remote: _Remote,
    local: Manifest,
    merged: Manifest,
    branch: str | None,
    private: bool,
    create_pr: bool,
    dry_run: bool,
    endpoint: str,
    say: Progress,
) -> PushResult:
    """Compare with the repo, then create repo/branch and commit what changed, in one commit."""
    from huggingface_hub import CommitOperationAdd

    changed = [p for p, content in payload.items() if not _is_unchanged(content, remote.files.get(p))]
    url = f"{endpoint}/{repo_id}" + (f"/tree/{branch}" if branch and branch != "main" else "")
    result = PushResult(
        repo_id=repo_id,
        url=url,
        commit_oid=None,
        files=changed,
        variants=[v.file for v in merged.variants],
        sizes={p: _size(c) for p, c in payload.items()},
        unchanged=[p for p in payload if p not in changed],
        dry_run=dry_run,
    )
    if private and remote.exists and remote.private is False:
        result.notes.append(f"{repo_id} already exists and is public; --private only applies to new repos")
    if dry_run:
        return result
    with hub_errors(repo_id, endpoint, "push to", api.token):
        if not remote.exists:
            say(f"creating {'private ' if private else ''}repo {repo_id}")
            api.create_repo(repo_id, private=private, exist_ok=True)
        if branch and branch != "main" and not remote.branch_exists:
            say(f"creating branch {branch}")
            api.create_branch(repo_id, branch=branch, revision=remote.head, exist_ok=True)
        if not changed:
            result.files = []
            return result
        say(f"uploading {len(changed)} file(s) in one commit", "upload")
        operations = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=_content(payload[p])) for p in changed]
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=_commit_message(local.variants),
            commit_description=_commit_description(local, merged),
            revision=branch,
            create_pr=create_pr,
            parent_commit=remote.head if remote.exists else None,
        )
    if info.oid == remote.head and not create_pr:
        result.files = []  # the Hub found nothing new: no commit was made
        return result
    result.commit_oid = info.oid
    result.pr_url = info.pr_url
    return result


def _content(content: Path | bytes) -> str | bytes:
    return str(content) if isinstance(content, Path) else content


# -- ls and pull ----------------------------------------------------------------------


def list_variants(
    repo_id: str, endpoint: str | None = None, token: str | None = None, revision: str | None = None
) -> Manifest:
    """The manifest of a repo published by hub-export: its variants, sizes and verification.

    Example:
        >>> [(v.file, v.size_bytes) for v in list_variants("alice/tiny-ExecuTorch").variants]
        [('model-8da4w.pte', 235776)]
    """
    check_repo_id(repo_id)
    endpoint = resolve_endpoint(endpoint)
    with hub_errors(repo_id, endpoint, "read", token):
        path = _download_manifest(repo_id, revision, None, endpoint, token)
    return _parse_manifest(path, repo_id)


def _download_manifest(repo_id: str, revision: str | None, local_dir: str | None, endpoint: str, token) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        path = hf_hub_download(
            repo_id, MANIFEST_NAME, revision=revision, local_dir=local_dir, endpoint=endpoint, token=token
        )
    except EntryNotFoundError as error:
        if isinstance(error, LocalEntryNotFoundError):
            raise  # a network failure, not a missing file
        raise InputError(f"{repo_id} has no {MANIFEST_NAME}: it was not published by hub-export") from None
    return Path(path)


def _parse_manifest(path: Path, repo_id: str) -> Manifest:
    """The repo's manifest, validated (file names, qmodes, sizes, hashes) before anything uses it."""
    manifest = Manifest.parse(path.read_bytes(), f"{repo_id}/{MANIFEST_NAME}")
    if not manifest.variants:
        raise InputError(f"{repo_id} lists no variant in its {MANIFEST_NAME}")
    return manifest


def pull(
    repo_id: str,
    variant: str | None = None,
    output_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    revision: str | None = None,
) -> Path:
    """Download one variant, its tokenizer and the manifest; check the ``.pte``'s sha256.

    Files go to ``output_dir`` or to the huggingface_hub cache; the returned folder holds
    the ``.pte``, ``tokenizer.json`` and ``manifest.json``. ``variant`` is a qmode or a
    file name (default: the first variant). A file whose sha256 differs from the manifest
    is removed and raises :class:`~hub_export.errors.VerificationError`.

    Example:
        >>> folder = pull("alice/tiny-ExecuTorch", variant="8da4w", output_dir="tiny")
        >>> sorted(p.name for p in folder.glob("*.json"))[:2]
        ['config.json', 'generation_config.json']
    """
    check_repo_id(repo_id)
    endpoint = resolve_endpoint(endpoint)
    if output_dir is None:
        return _pull_into(repo_id, variant, None, endpoint, token, revision)
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{opt('output')} {out.name} is a file, not a folder", hint="choose a folder to download to",
                         param="output")
    with _undo_on_failure(out):
        return _pull_into(repo_id, variant, str(out), endpoint, token, revision)


@contextmanager
def _undo_on_failure(out: Path) -> Iterator[None]:
    """On failure, remove what a pull added to ``out``: a failed pull leaves no half download.

    Only entries that were not there before are removed (top level, and the download
    metadata huggingface_hub keeps in ``.cache/huggingface/download``); a folder the pull
    created is removed whole.
    """
    metadata = out / ".cache" / "huggingface" / "download"
    existed = out.is_dir()
    before = set(os.listdir(out)) if existed else set()
    metadata_before = set(os.listdir(metadata)) if metadata.is_dir() else None
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
            raise
        for name in set(os.listdir(out)) - before if out.is_dir() else ():
            _remove_inside(out, name)
        if metadata_before is not None and metadata.is_dir():
            for name in set(os.listdir(metadata)) - metadata_before:
                _remove_inside(metadata, name)
        raise


def _remove_inside(folder: Path, name: str) -> None:
    """Remove ``folder/name`` (a file, link or folder), never anything outside ``folder``."""
    path = _inside(folder, name)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _inside(folder: Path, name: str) -> Path:
    """``folder / name`` after checking it is an entry of ``folder`` itself.

    The manifest schema already allows plain names only; this is the second lock on
    the door before anything is removed. A symlinked entry (the HF cache) is fine: its
    own location is checked, not its target's.
    """
    path = Path(folder) / name
    if name in ("", ".", "..") or path.parent.resolve() != Path(folder).resolve():
        raise InputError(f"refusing to touch {name!r}: it is not a plain file name inside {Path(folder).name}/")
    return path


def _pull_into(
    repo_id: str, variant: str | None, local_dir: str | None, endpoint: str, token: str | None, revision: str | None
) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    with hub_errors(repo_id, endpoint, "read", token):
        # Pin one commit so that the manifest and the files it describes agree.
        commit = HfApi(endpoint=endpoint, token=token).repo_info(repo_id, revision=revision).sha
        manifest = _parse_manifest(_download_manifest(repo_id, commit, local_dir, endpoint, token), repo_id)
        chosen = manifest.variant(variant) if variant else manifest.variants[0]
        try:
            folder = snapshot_download(
                repo_id,
                revision=commit,
                allow_patterns=[*(name for name, _ in chosen.files()), MANIFEST_NAME, *COMPANION_FILES],
                local_dir=local_dir,
                endpoint=endpoint,
                token=token,
            )
        except OSError as error:
            if "Consistency check failed" not in str(error):
                raise
            raise VerificationError(
                f"{chosen.file} from {repo_id} arrived with the wrong size; the repo or the download is corrupt: retry"
            ) from None
    folder = Path(folder)
    for name, expected in chosen.files():
        _check_download(_inside(folder, name), expected, repo_id, folder)
    return folder


def _check_download(path: Path, expected_sha256: str, repo_id: str, folder: Path) -> None:
    """Compare a downloaded variant file with the manifest; remove it (and its cache blob) on mismatch."""
    if not path.is_file():
        raise HubError(f"{repo_id} lists {path.name} in its manifest but the file is missing from the repo")
    actual = sha256_file(path)
    if actual == expected_sha256:
        return
    _remove_download(path, folder)
    raise VerificationError(
        f"sha256 mismatch for {path.name} from {repo_id}: got {actual}, the manifest says {expected_sha256}; "
        "the file was removed: the repo content is corrupt or was altered, do not use it"
    )


def _remove_download(path: Path, folder: Path) -> None:
    """Remove a bad download: ``path`` (an entry of ``folder``) and what vouches for it.

    In the cache the snapshot entry links to a blob named by its hash: drop both, or the
    next pull would trust the bad blob; the link is followed only into that repo's
    ``blobs/``. In a local_dir, drop the download metadata too.
    """
    path = _inside(folder, path.name)
    target = path.resolve() if path.is_symlink() else None
    path.unlink(missing_ok=True)
    if target is not None and _is_cache_blob(target, folder):
        target.unlink(missing_ok=True)
    metadata = folder / ".cache" / "huggingface" / "download"
    if metadata.is_dir():
        _inside(metadata, f"{path.name}.metadata").unlink(missing_ok=True)


def _is_cache_blob(target: Path, snapshot: Path) -> bool:
    """Whether ``target`` is a blob of the cache repo that holds ``snapshot`` (``REPO/snapshots/COMMIT``)."""
    blobs = snapshot.resolve().parent.parent / "blobs"
    return snapshot.resolve().parent.name == "snapshots" and target.parent == blobs

