"""Push: an export, made now or taken from a folder, published to a Hub repo in one commit.

Push checks everything it can before the export starts (login, repo name, write access,
that an existing repo is ours, which variants it already holds built as asked) so that a
mistake costs seconds, not an export; the export itself verifies every variant and raises
before anything is written to the Hub. The card inherits the source's license and language.
Every Hub failure becomes a one-line :class:`~hub_export.errors.HubError` or
:class:`~hub_export.errors.InputError` that says what to do, and the token never appears
in a message, file or card.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_export.errors import HubError, InputError, VerificationError, opt
from hub_export.hub import card as card_module
from hub_export.hub import source_card as source_card_module
from hub_export.hub.api import (
    RemoteRepo,
    check_branch,
    hub_errors,
    is_unchanged,
    not_logged_in,
    remote_state,
    resolve_endpoint,
    resolve_token,
    target_repo_for,
)
from hub_export.options import ExportOptions, options_with
from hub_export.pipeline.export import export
from hub_export.pipeline.manifest import MANIFEST_NAME, Manifest, Variant, package_versions, sha256_file
from hub_export.pipeline.source import CONFIG_FILES, PROCESSOR_FILES, TOKENIZER_FILES, display_name, peek_fingerprint
from hub_export.progress import Callback, Tracker, tracker

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


CARD_NAME = card_module.CARD_NAME


COMPANION_FILES = tuple(CONFIG_FILES) + tuple(TOKENIZER_FILES) + tuple(PROCESSOR_FILES)


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


# Over 60 lines for its signature and docstring: the public entry point documents every argument and what it raises.
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
    the card (see :func:`hub_export.pipeline.export.export`); with ``from_dir`` they are added to its manifest.
    What to export is an :class:`~hub_export.options.ExportOptions`, whole or as keywords,
    as for :func:`hub_export.pipeline.export.export`.

    Example:
        >>> result = push("HuggingFaceTB/SmolLM2-135M", qmodes=["8da4w"], max_seq_len=256)
        >>> result.repo_id, result.variants
        ('alice/SmolLM2-135M-ExecuTorch', ['model-8da4w.pte'])
        >>> push(from_dir="out", repo_id="alice/SmolLM2-135M-ExecuTorch").summary
        'nothing to push: the repo already has these files'

    Raises:
        InputError: bad arguments, a repo not made by hub-export (without ``exist_ok``), one holding another model.
        HubError: not logged in, no write access, or a Hub request failed; nothing was committed.
        VerificationError: an export folder's file changed after export, or was not verified.
        SourceError, ExportError, InternalError: as for :func:`hub_export.pipeline.export.export`.
    """
    from huggingface_hub import HfApi

    options = options_with(options, option_values)
    _check_push_arguments(source, from_dir, output_dir, template)
    say = tracker(progress, log.info)
    say.expect(2)  # checking the repo, uploading; the export adds its own steps
    endpoint = resolve_endpoint(endpoint)
    token = resolve_token(token)
    if token is None and not dry_run:
        raise not_logged_in(endpoint)
    folder = Path(from_dir) if from_dir is not None else None
    local = _declared_folder(folder, options) if folder is not None else None
    source_name = local.source.get("id") if local else _source_name(source, options.gguf_file)

    api = HfApi(endpoint=endpoint, token=token if token else False)
    repo_id = target_repo_for(api, repo_id, source_name or Path(source or ".").resolve().name, token, endpoint)
    apart = options.lora_files or _adapters_apart(local)
    remote = _checked_remote(api, repo_id, branch, exist_ok, None if apart else source_name, endpoint, say)
    if remote.manifest is not None and from_dir is None and not force and not dry_run:
        built = _already_built(remote.manifest, source, options, token, endpoint)
        if len(built) == len(options.qmodes):
            return PushResult(
                repo_id,
                f"{endpoint.rstrip('/')}/{repo_id}",
                None,
                [],
                [v.file for v in remote.manifest.variants],
                unchanged=built,
                notes=["rebuilt nothing: pass --force to export and push again"],
            )
        options = _without_built(options, built, repo_id, say)

    with tempfile.TemporaryDirectory(prefix="hub-export-push-") as scratch:
        if folder is None:
            assert source is not None
            folder = Path(output_dir) if output_dir else Path(scratch) / "export"
            local = export(
                source,
                folder,
                options,
                token=token,
                endpoint=endpoint,
                cache_dir=cache_dir,
                progress=say,
                engine=engine,
            )
        assert local is not None
        _check_folder(folder, local)
        card_data = _source_card_data(source_card, local, folder, source, token, endpoint)
        payload, merged = _commit_payload(
            folder,
            local,
            card_data,
            remote,
            own_export=from_dir is None,
            template=template,
            endpoint=endpoint,
            repo_id=repo_id,
        )
        return _publish(
            api, repo_id, payload, remote, local, merged, branch, private, create_pr, dry_run, endpoint, say
        )


def _declared_folder(folder: Path, options: ExportOptions) -> Manifest:
    """The manifest of an export folder given with ``from_dir``, with what the exporter declares now added."""
    local = Manifest.read(folder)
    local.source = {
        **local.source,
        **source_card_module.declared_source(options.base_model, options.license, options.model_name),
    }
    return local


def _without_built(options: ExportOptions, built: list[str], repo_id: str, say: Progress) -> ExportOptions:
    """``options`` less the variants the repo already holds built as asked (``built``), said to the user."""
    if built:
        say(
            f"{repo_id} already holds {', '.join(built)} built from the same source revision with the same "
            "options and tool versions; not rebuilding (--force rebuilds)"
        )
    missing = [q for q, name in zip(options.qmodes, options.variant_files(), strict=False) if name not in built]
    return options_with(options, {"qmodes": tuple(missing)})


def _checked_remote(
    api, repo_id: str, branch: str | None, exist_ok: bool, source_name: str | None, endpoint: str, say: Progress
) -> RemoteRepo:
    """The target repo as it is, refused early when it is not ours or holds another model."""
    if branch is not None:
        check_branch(branch)
    say(f"checking {repo_id} on {endpoint}", "check")
    remote = remote_state(api, repo_id, branch, endpoint)
    if remote.is_foreign and not exist_ok:
        raise InputError(
            f"{repo_id} already exists and was not made by hub-export (no {MANIFEST_NAME})",
            param="repo_id",
            hint=f"pass {opt('exist_ok')} to add the export to it",
            repo_id=repo_id,
            code="foreign_repo",
        )
    if remote.manifest is not None and not (source_name is None and _adapters_apart(remote.manifest)):
        check_same_source(remote.manifest, source_name)  # before an export is wasted (an adapter's base: after it)
    return remote


def _commit_payload(
    folder: Path,
    local: Manifest,
    card_data: dict[str, Any],
    remote: RemoteRepo,
    *,
    own_export: bool,
    template,
    endpoint: str,
    repo_id: str,
) -> tuple[dict[str, Path | bytes], Manifest]:
    """(what the commit holds, the manifest the repo will hold): the variants, companions, manifest and card."""
    if card_data:
        local.source = {**local.source, "card_data": card_data}
    if own_export:
        # Our own export folder: keep it re-renderable (`hub-export card`, `push --from`) as published.
        local.write(folder)
        card_module.write_card(folder, None, template, endpoint, repo_id=repo_id)
    merged = _merge(remote.manifest, local)
    config = card_module.read_config(folder)
    card_text = card_module.render_card(merged, None, template, endpoint, repo_id=repo_id, config=config)
    return _payload(folder, local, merged, card_text), merged


def _check_push_arguments(source, from_dir, output_dir, template) -> None:
    """Argument mistakes, found before any request."""
    if (source is None) == (from_dir is None):
        raise InputError(f"give either a SOURCE to export or {opt('from_dir')} DIR with an export folder")
    if from_dir is not None and not Path(from_dir).is_dir():
        raise InputError(f"{opt('from_dir')} {Path(from_dir).name} is not a folder", param="from_dir")
    if output_dir is not None:
        if from_dir is not None:
            raise InputError(
                f"{opt('output')} keeps a new export; with {opt('from_dir')} the export folder already exists",
                param="output",
            )
        if Path(output_dir).exists() and any(Path(output_dir).iterdir()):
            raise InputError(
                f"{Path(output_dir).name} is not empty", hint=f"choose another {opt('output')}", param="output"
            )
    if template is not None and not Path(template).is_file():
        raise InputError(
            f"template {Path(template).name} not found",
            hint=f"pass an existing file to {opt('template')}",
            param="template",
        )


def _source_name(source: str | None, gguf_file: str | None = None) -> str:
    """The source id the export will record: the folder's name, a local GGUF's model name, or the repo id."""
    return display_name(source, gguf_file)


def _already_built(remote: Manifest, source: str | None, options: ExportOptions, token, endpoint) -> list[str]:
    """The requested variant files that ``remote`` already holds built exactly as asked.

    Exactly: from the same source revision (a Hub commit, a GGUF's sha256 or a folder's
    contents), with the same options, by the same versions of hub-export, torch,
    executorch, torchao and transformers, and verified. Any doubt means rebuild.
    """
    if (
        source is None
        or options.adapter
        or remote.versions != package_versions()
        or not remote.source.get("fingerprint")
    ):
        return []
    declared = {key: remote.source.get(key) for key in ("base_model", "license", "model_name")}
    wanted_declared = source_card_module.declared_source(options.base_model, options.license, options.model_name)
    if {k: v for k, v in declared.items() if v is not None} != wanted_declared:
        return []  # the card would say something else
    by_file = {v.file: v for v in remote.variants}
    built = [
        name
        for qmode, name in zip(options.qmodes, options.variant_files(), strict=False)
        if name in by_file and by_file[name].built_as(qmode, options)
    ]
    if not built:
        return []
    fingerprint = peek_fingerprint(source, options.gguf_file, options.revision, token, endpoint)
    return built if fingerprint and fingerprint == remote.source.get("fingerprint") else []


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
    companion = card_module.task_of(manifest).companion
    if not (folder / companion).is_file():
        raise InputError(f"{folder.name}/ has no {companion}; a device needs it beside the file: export again")


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
        return source_card_module.read_source_card(path)
    if manifest.source.get("card_data"):
        return dict(manifest.source["card_data"])
    if source and Path(source).expanduser().is_dir():
        data = source_card_module.read_source_card(Path(source).expanduser())
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
    return source_card_module.read_source_card(folder)


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
    return source_card_module.read_source_card(path)


def _adapters_apart(manifest: Manifest | None) -> bool:
    """Whether ``manifest`` is of adapter files kept apart from their base (``--lora-files``)."""
    adapter = manifest.source.get("adapter") if manifest is not None else None
    return isinstance(adapter, dict) and adapter.get("separate_files") is True


def _check_same_base(remote: Manifest, local: Manifest) -> None:
    """Adapters kept apart share a repo when they run over the same base files, byte for byte."""
    theirs, ours = remote.source["adapter"], local.source["adapter"]
    if (theirs.get("base"), theirs.get("base_revision")) != (ours.get("base"), ours.get("base_revision")):
        raise InputError(
            f"the repo holds adapters of {theirs.get('base')!r}, not of {ours.get('base')!r}",
            hint="push to another repo", param="repo_id", code="other_source",
        )  # fmt: skip
    held = {v.data_file: v.data_sha256 for v in remote.variants if v.data_file}
    for variant in local.variants:
        if variant.data_file in held and held[variant.data_file] != variant.data_sha256:
            raise InputError(
                f"this export's {variant.data_file} differs from the one the repo's adapters run over (another base "
                "revision, or other options)",
                hint="export with the options the repo's files were made with, or push to another repo",
                param="repo_id", code="other_source",
            )  # fmt: skip


def check_same_source(remote: Manifest, source_id: str | None) -> None:
    """One repo, one source model: variants of another model would share its tokenizer and card."""
    if remote.source.get("id") != source_id:
        raise InputError(
            f"the repo holds exports of {remote.source.get('id')!r}, not {source_id!r}",
            hint="push to another repo",
            param="repo_id",
            code="other_source",
        )


def _merge(remote: Manifest | None, local: Manifest) -> Manifest:
    """The manifest the repo will hold: remote variants kept, local ones added or replacing."""
    if remote is None:
        return local
    if _adapters_apart(remote) and _adapters_apart(local):
        _check_same_base(remote, local)  # several adapters of one base: each brings its own program files
    else:
        check_same_source(remote, local.source.get("id"))
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


def _publish(
    api,
    repo_id: str,
    payload: dict[str, Path | bytes],
    remote: RemoteRepo,
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

    changed = [p for p, content in payload.items() if not is_unchanged(content, remote.files.get(p))]
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
