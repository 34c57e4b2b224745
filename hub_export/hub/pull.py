"""Pull and ls: what a repo published by hub-export holds, and one variant of it downloaded and checked.

``list_variants`` reads only the manifest. ``pull`` downloads a variant with its
tokenizer and manifest and checks every file's sha256 against the manifest; a file that
does not match is removed (from the output folder and the Hub cache alike), and a failed
pull leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hub_export.errors import HubError, InputError, VerificationError, opt
from hub_export.hub.api import check_repo_id, hub_errors, resolve_endpoint
from hub_export.hub.push import COMPANION_FILES
from hub_export.pipeline.manifest import MANIFEST_NAME, Manifest, sha256_file


def list_variants(
    repo_id: str, endpoint: str | None = None, token: str | None = None, revision: str | None = None
) -> Manifest:
    """The manifest of a repo published by hub-export: its variants, sizes and verification.

    Example:
        >>> [(v.file, v.size_bytes) for v in list_variants("alice/tiny-ExecuTorch").variants]
        [('model-8da4w.pte', 235776)]

    Raises:
        InputError: ``repo_id`` is not a repo id, or the repo's manifest is not valid.
        HubError: the repo cannot be read (missing, private, gated, unreachable).
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

    Raises:
        InputError: no such variant, a bad repo id or manifest, or ``output_dir`` holds other files.
        HubError: the repo cannot be read.
        VerificationError: a downloaded file does not match the manifest's sha256 (it is removed).
    """
    check_repo_id(repo_id)
    endpoint = resolve_endpoint(endpoint)
    if output_dir is None:
        return _pull_into(repo_id, variant, None, endpoint, token, revision)
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"{opt('output')} {out.name} is a file, not a folder", hint="choose a folder to download to", param="output"
        )
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
