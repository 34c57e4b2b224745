"""Push, ls, pull and generate against the local hub, all through the real huggingface_hub client.

Exports are the slow part (~30 s each), so two are made per session and shared: an
8da4w folder (exported directly) and an fp32 folder (exported by ``push`` itself, which
also covers the export path of a push). Every test pushes to its own repo.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, ModelCard, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError
from typer.testing import CliRunner

from hub_export.cli import app
from hub_export.errors import HubError, InputError, VerificationError
from hub_export.hub.api import hub_errors
from hub_export.hub.localhub.pytest_plugin import LocalHubFixture
from hub_export.hub.pull import list_variants, pull
from hub_export.hub.push import PushResult, push
from hub_export.models.tiny import build_tiny_model
from hub_export.pipeline.manifest import Manifest, sha256_file
from hub_export.pipeline.records import Verification

HUB_EXPORT = Path(sys.executable).parent / "hub-export"
EXPORTED_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


# -- shared exports ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def source_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama with a card saying ``license: apache-2.0``, ``language: [en]``."""
    return build_tiny_model(tmp_path_factory.mktemp("publish-src") / "tiny-llama")


@pytest.fixture(scope="session")
def export_8da4w(tmp_path_factory: pytest.TempPathFactory, source_model: Path) -> Path:
    """``source_model`` exported once: one 8da4w variant, 64-token context."""
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("publish-exports") / "tiny-8da4w"
    export(str(source_model), out, qmodes=["8da4w"], max_seq_len=64)
    return out


@pytest.fixture(scope="session")
def pushed_fp32(
    tmp_path_factory: pytest.TempPathFactory, source_model: Path, local_hub: LocalHubFixture
) -> tuple[PushResult, Path]:
    """``push`` of the source itself (export + publish), keeping its fp32 export folder."""
    out = tmp_path_factory.mktemp("publish-exports") / "tiny-fp32"
    result = push(
        str(source_model),
        "alice/tiny-exported-by-push",
        qmodes=["fp32"],
        max_seq_len=64,
        output_dir=out,
        token=local_hub.alice_token,
        endpoint=local_hub.endpoint,
    )
    return result, out


def _push(hub: LocalHubFixture, folder: Path, repo_id: str, source_model: Path | None = None, **options) -> PushResult:
    card = source_model / "README.md" if source_model else None
    return push(
        from_dir=folder, repo_id=repo_id, source_card=card, token=hub.alice_token, endpoint=hub.endpoint, **options
    )


def _generate_from_repo(hub: LocalHubFixture, repo_id: str, variant: str):
    """``hub-export generate REPO --variant V`` (8 tokens of raw continuation); asserts it succeeded.

    ``--no-chat``: through its chat template the random-weight model happens to emit only newlines.
    """
    result = CliRunner().invoke(
        app,
        ["generate", repo_id, "--variant", variant, "--prompt", "Once upon a time", "--max-new-tokens", "8",
         "--no-chat", "--endpoint", hub.endpoint],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result


def _run_card_snippet(repo_id: str) -> str:
    """Run the Python snippet of ``repo_id``'s model card as published; returns what it printed.

    The snippet must generate what the file generates: its new token ids are checked against
    the library's greedy generation from the same file and prompt.
    """
    snippet = re.search(r"```python\n(.*?)```", ModelCard.load(repo_id).text, re.S).group(1)
    printed = io.StringIO()
    names: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "model-card-snippet", "exec"), names)
    prompt_ids = names["tokenizer"].encode(names["prompt"], add_special_tokens=False).ids
    from hub_export.tasks.text_generation.run import stream_generate

    room = int(re.search(r"range\(min\(32, (\d+) - len\(ids\)\)\)", snippet).group(1)) - len(prompt_ids)
    library = [
        r.token
        for r in stream_generate(
            names["pte"], Path(names["pte"]).parent, "What is the capital of France?", max_new_tokens=min(32, room)
        )
    ]
    library = library[:-1] if library and library[-1] in names["eos"] else library
    assert names["ids"][: len(prompt_ids)] == prompt_ids and names["ids"][len(prompt_ids) :] == library
    return printed.getvalue()


def _commits(hub: LocalHubFixture, repo_id: str, revision: str | None = None) -> list:
    return hub.api(hub.alice_token).list_repo_commits(repo_id, revision=revision)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _hub_export(hub: LocalHubFixture, *args: str) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it (errors go through ``main``)."""
    env = {**os.environ, "COLUMNS": "400"}  # rich wraps at the terminal width; keep each message on one line
    return subprocess.run(
        [str(HUB_EXPORT), *args, "--endpoint", hub.endpoint], capture_output=True, text=True, env=env, timeout=120
    )


# -- push -------------------------------------------------------------------------------


def test_push_round_trip_in_one_commit(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path, tmp_path: Path
) -> None:
    repo_id = "alice/tiny-round-trip"
    result = _push(local_hub, export_8da4w, repo_id, source_model)

    assert result.pushed and result.repo_id == repo_id and result.variants == ["model-8da4w.pte"]
    assert result.url == f"{local_hub.endpoint}/{repo_id}"
    commits = _commits(local_hub, repo_id)
    assert len(commits) == 2  # the Hub's initial commit, then exactly one with every file
    assert commits[0].commit_id == result.commit_oid
    assert commits[0].title == "Add ExecuTorch variants: model-8da4w.pte (8da4w)"
    api = local_hub.api(local_hub.alice_token)
    expected = EXPORTED_FILES | {"model-8da4w.pte", "manifest.json", "README.md"}
    assert set(api.list_repo_files(repo_id)) == expected | {".gitattributes"}
    assert set(result.files) == expected

    data = ModelCard.load(repo_id).data.to_dict()
    assert data["license"] == "apache-2.0" and data["language"] == ["en"]  # inherited from the source card
    assert data["library_name"] == "executorch" and "8da4w" in data["tags"]
    assert "base_model" not in data  # the source is a local folder

    folder = pull(repo_id, output_dir=tmp_path / "pulled", endpoint=local_hub.endpoint)
    assert folder == tmp_path / "pulled"
    assert sha256_file(folder / "model-8da4w.pte") == sha256_file(export_8da4w / "model-8da4w.pte")
    assert {p.name for p in folder.iterdir() if p.is_file()} == EXPORTED_FILES | {"model-8da4w.pte", "manifest.json"}
    local = Manifest.read(export_8da4w)
    assert Manifest.read(folder).variants == local.variants


def test_repush_of_identical_files_makes_no_commit(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path
) -> None:
    repo_id = "alice/tiny-idempotent"
    _push(local_hub, export_8da4w, repo_id, source_model)
    before = len(_commits(local_hub, repo_id))

    again = _push(local_hub, export_8da4w, repo_id, source_model)
    code, output = _cli(
        "push", "--from", str(export_8da4w), repo_id, "--source-card", str(source_model / "README.md"),
        "--token", local_hub.alice_token, "--endpoint", local_hub.endpoint,
    )  # fmt: skip

    assert not again.pushed and again.files == [] and again.commit_oid is None
    assert again.summary == "nothing to push: the repo already has these files"
    assert code == 0 and "nothing to push: the repo already has these files" in output
    assert len(_commits(local_hub, repo_id)) == before


def test_push_of_a_source_exports_it_and_inherits_its_card(
    local_hub: LocalHubFixture, pushed_fp32: tuple[PushResult, Path]
) -> None:
    result, folder = pushed_fp32
    assert result.pushed and result.variants == ["model-fp32.pte"]
    manifest = list_variants(result.repo_id, endpoint=local_hub.endpoint)
    assert manifest.command == "hub-export export tiny-llama --qmode fp32 --max-seq-len 64"
    assert manifest.variants[0].verification.passed is True
    # No --source-card: license and language come from the source folder's README, and stay in the manifest.
    assert manifest.source["card_data"] == {"license": "apache-2.0", "language": ["en"]}
    assert ModelCard.load(result.repo_id).data.license == "apache-2.0"
    assert (folder / "README.md").is_file() and Manifest.read(folder).source["card_data"]["license"] == "apache-2.0"


def test_repush_of_an_unchanged_source_rebuilds_nothing(
    local_hub: LocalHubFixture, pushed_fp32: tuple[PushResult, Path], source_model: Path, tmp_path: Path, monkeypatch
) -> None:
    """A scheduled re-run of the same push: same source contents, options and tool versions -> no export, no commit."""
    import importlib
    import shutil

    export_module = importlib.import_module("hub_export.hub.push")  # push calls the export stage through this name
    result, _ = pushed_fp32
    before = len(_commits(local_hub, result.repo_id))

    def must_not_export(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(export_module, "export", must_not_export)
    hub = dict(token=local_hub.alice_token, endpoint=local_hub.endpoint)
    again = push(str(source_model), result.repo_id, qmodes=["fp32"], max_seq_len=64, **hub)
    assert not again.pushed and again.unchanged == ["model-fp32.pte"] and "--force" in again.notes[0]
    assert len(_commits(local_hub, result.repo_id)) == before
    # Anything different rebuilds: another option, --force, or a changed source file. The default context is the
    # model's (512 positions here), not "whatever the repo holds"; 1,024 scored tokens are not 2,048.
    for options in (
        dict(max_seq_len=32),
        dict(max_seq_len=64, force=True),
        dict(max_seq_len=64, quality_tokens=0),
        dict(),
        dict(max_seq_len=64, quality_tokens=1024),
    ):
        with pytest.raises(AssertionError, match="rebuilt"):
            push(str(source_model), result.repo_id, qmodes=["fp32"], **options, **hub)
    changed = shutil.copytree(source_model, tmp_path / "tiny-llama")
    (changed / "README.md").write_text((changed / "README.md").read_text() + "\nFine-tuned further.\n")
    with pytest.raises(AssertionError, match="rebuilt"):
        push(str(changed), result.repo_id, qmodes=["fp32"], max_seq_len=64, **hub)
    # Asking for one more variant builds that one only (a rerun batch plan that grew).
    built: list = []

    def record(source, folder, options, **kwargs):
        built.append(options.qmodes)
        raise AssertionError("rebuilt")

    monkeypatch.setattr(export_module, "export", record)
    with pytest.raises(AssertionError, match="rebuilt"):
        push(str(source_model), result.repo_id, qmodes=["8da4w", "fp32"], max_seq_len=64, **hub)
    assert built == [("8da4w",)]


def test_adding_a_variant_keeps_the_others(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path, pushed_fp32: tuple[PushResult, Path]
) -> None:
    repo_id = "alice/tiny-two-variants"
    _push(local_hub, export_8da4w, repo_id, source_model)
    before = len(_commits(local_hub, repo_id))

    result = _push(local_hub, pushed_fp32[1], repo_id)

    assert result.pushed and result.variants == ["model-8da4w.pte", "model-fp32.pte"]
    assert len(_commits(local_hub, repo_id)) == before + 1
    assert "model-8da4w.pte" not in result.files  # untouched, not uploaded again
    manifest = list_variants(repo_id, endpoint=local_hub.endpoint)
    assert [(v.file, v.qmode) for v in manifest.variants] == [("model-8da4w.pte", "8da4w"), ("model-fp32.pte", "fp32")]
    assert manifest.command.splitlines() == [
        "hub-export export tiny-llama --qmode 8da4w --max-seq-len 64",
        "hub-export export tiny-llama --qmode fp32 --max-seq-len 64",
    ]
    card = ModelCard.load(repo_id)
    assert "| `model-8da4w.pte` |" in card.text and "| `model-fp32.pte` |" in card.text
    assert card.data.tags == ["executorch", "xnnpack", "8da4w", "fp32", "llama", "hub-export"]
    assert card.data.license == "apache-2.0"
    files = set(local_hub.api(local_hub.alice_token).list_repo_files(repo_id))
    assert {"model-8da4w.pte", "model-fp32.pte"} <= files


def test_push_of_a_hub_source_links_to_it_and_inherits_its_card(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path, tmp_path: Path
) -> None:
    api = local_hub.api(local_hub.alice_token)
    source_id = "acme/tiny-llama"
    api.create_repo(source_id)
    card = "---\nlicense: mit\nlanguage:\n- en\n- de\n---\n# Tiny Llama on the Hub\n"
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id=source_id)
    revision = api.model_info(source_id).sha
    # The same export, recorded as made from the Hub repo (its files and hashes are unchanged).
    folder = shutil.copytree(export_8da4w, tmp_path / "from-hub")
    manifest = Manifest.read(folder)
    manifest.source = {**manifest.source, "id": source_id, "local": False, "revision": revision}
    manifest.write(folder)

    result = _push(local_hub, folder, "alice/tiny-from-hub")

    data = ModelCard.load(result.repo_id).data.to_dict()
    assert data["base_model"] == source_id and data["base_model_relation"] == "quantized"
    assert data["license"] == "mit" and data["language"] == ["en", "de"]  # from the source's card on the Hub
    assert f"({local_hub.endpoint}/{source_id})" in ModelCard.load(result.repo_id).text


def test_private_repo_is_invisible_to_others(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path
) -> None:
    repo_id = "alice/tiny-private"
    _push(local_hub, export_8da4w, repo_id, source_model, private=True)

    assert local_hub.api(local_hub.alice_token).model_info(repo_id).private is True
    for token in (local_hub.bob_token, None):
        with pytest.raises(RepositoryNotFoundError):
            local_hub.api(token).model_info(repo_id)
    with pytest.raises(HubError, match="not found"):
        list_variants(repo_id, endpoint=local_hub.endpoint, token=local_hub.bob_token)


def test_dry_run_uploads_and_creates_nothing(local_hub: LocalHubFixture, export_8da4w: Path) -> None:
    repo_id = "alice/tiny-dry-run"
    result = _push(local_hub, export_8da4w, repo_id, dry_run=True)
    code, output = _cli(
        "push", "--from", str(export_8da4w), repo_id, "--dry-run",
        "--token", local_hub.alice_token, "--endpoint", local_hub.endpoint,
    )  # fmt: skip

    assert result.dry_run and not result.pushed
    assert "model-8da4w.pte" in result.files and result.sizes["model-8da4w.pte"] > 100_000
    assert code == 0 and "model-8da4w.pte" in output and "would upload" in output
    assert not local_hub.api(local_hub.alice_token).repo_exists(repo_id)


def test_branch_and_pull_request(local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path) -> None:
    repo_id = "alice/tiny-branches"
    on_branch = _push(local_hub, export_8da4w, repo_id, source_model, branch="executorch")
    api = local_hub.api(local_hub.alice_token)

    assert on_branch.pushed and on_branch.url.endswith("/tree/executorch")
    assert "model-8da4w.pte" in api.list_repo_files(repo_id, revision="executorch")
    assert len(_commits(local_hub, repo_id, "main")) == 1  # main keeps only the initial commit

    as_pr = _push(local_hub, export_8da4w, repo_id, source_model, create_pr=True)
    assert as_pr.pr_url and as_pr.pr_url.startswith(f"{local_hub.endpoint}/{repo_id}/discussions/")
    assert len(_commits(local_hub, repo_id, "main")) == 1


def test_existing_repo_not_made_by_hub_export_needs_exist_ok(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path
) -> None:
    repo_id = "alice/tiny-foreign"
    api = local_hub.api(local_hub.alice_token)
    api.create_repo(repo_id)
    api.upload_file(path_or_fileobj=b"# Someone else's repo\n", path_in_repo="README.md", repo_id=repo_id)

    with pytest.raises(InputError, match="--exist-ok"):
        _push(local_hub, export_8da4w, repo_id, source_model)
    result = _push(local_hub, export_8da4w, repo_id, source_model, exist_ok=True)
    assert result.pushed and ModelCard.load(repo_id).data.library_name == "executorch"


def test_nothing_is_pushed_from_a_folder_that_fails_verification(
    local_hub: LocalHubFixture, export_8da4w: Path, tmp_path: Path
) -> None:
    altered = shutil.copytree(export_8da4w, tmp_path / "altered")
    data = bytearray((altered / "model-8da4w.pte").read_bytes())
    data[-1] ^= 0xFF
    (altered / "model-8da4w.pte").write_bytes(bytes(data))
    unverified = shutil.copytree(export_8da4w, tmp_path / "unverified")
    manifest = Manifest.read(unverified)
    manifest.variants[0].verification = Verification.skipped_record()
    manifest.write(unverified)

    with pytest.raises(VerificationError, match="sha256"):
        _push(local_hub, altered, "alice/tiny-altered")
    with pytest.raises(VerificationError, match="not verified"):
        _push(local_hub, unverified, "alice/tiny-unverified")
    api = local_hub.api(local_hub.alice_token)
    assert not api.repo_exists("alice/tiny-altered") and not api.repo_exists("alice/tiny-unverified")


# -- errors -----------------------------------------------------------------------------


def test_permission_errors_exit_non_zero_with_one_line(local_hub: LocalHubFixture, export_8da4w: Path) -> None:
    bob = _hub_export(
        local_hub, "push", "--from", str(export_8da4w), "alice/tiny-by-bob", "--token", local_hub.bob_token
    )
    readonly = _hub_export(
        local_hub,
        "push",
        "--from",
        str(export_8da4w),
        "alice/tiny-by-readonly",
        "--token",
        local_hub.alice_readonly_token,
    )

    assert bob.returncode == HubError.exit_code
    assert bob.stderr.strip().splitlines() == [
        f"Error: permission denied: bob cannot write to alice/ on {local_hub.endpoint}; push to bob/... or ask alice "
        "for write access"
    ]
    assert readonly.returncode == HubError.exit_code and "read-only" in readonly.stderr
    for run, token in ((bob, local_hub.bob_token), (readonly, local_hub.alice_readonly_token)):
        assert token not in run.stdout + run.stderr
    assert not local_hub.api(local_hub.alice_token).repo_exists("alice/tiny-by-bob")


def test_server_side_403_is_a_clear_error(local_hub: LocalHubFixture) -> None:
    # What the Hub answers when the local checks cannot know (e.g. fine-grained tokens).
    repo_id = "alice/tiny-403"
    local_hub.api(local_hub.alice_token).create_repo(repo_id)
    bob_api = local_hub.api(local_hub.bob_token)
    with pytest.raises(HubError, match=r"permission denied: .*alice/tiny-403 \(HTTP 403\)") as caught:
        with hub_errors(repo_id, local_hub.endpoint, "push to", local_hub.bob_token):
            bob_api.create_commit(repo_id, [CommitOperationAdd("x.txt", b"x")], commit_message="x")
    assert local_hub.bob_token not in str(caught.value)


def test_bad_name_unreachable_endpoint_and_no_login(
    local_hub: LocalHubFixture, export_8da4w: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match="invalid repo id 'alice/bad--name'"):
        _push(local_hub, export_8da4w, "alice/bad--name")
    with pytest.raises(InputError, match=r"HTTP 400"):  # valid for the client, refused by the server
        _push(local_hub, export_8da4w, "alice/new")
    with pytest.raises(HubError, match="cannot reach http://127.0.0.1:9"):
        push(from_dir=export_8da4w, repo_id="alice/x", token=local_hub.alice_token, endpoint="http://127.0.0.1:9")
    with pytest.raises(HubError, match="not logged in"):
        push(from_dir=export_8da4w, repo_id="alice/x", endpoint=local_hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", local_hub.bob_token)  # HF_TOKEN is honoured when --token is absent
    with pytest.raises(HubError, match="bob cannot write"):
        push(from_dir=export_8da4w, repo_id="alice/x", endpoint=local_hub.endpoint)


# -- pull, ls, generate -----------------------------------------------------------------


def test_pull_checks_sha256_against_the_manifest(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path, tmp_path: Path, hf_isolated_env: Path
) -> None:
    repo_id = "alice/tiny-tampered"
    _push(local_hub, export_8da4w, repo_id, source_model)
    expected = Manifest.read(export_8da4w).variants[0].sha256
    blob = local_hub.root / "blobs" / expected[:2] / expected[2:4] / expected
    original = blob.read_bytes()
    # Same size, other bytes: only a content hash can tell.
    tampered = bytes(b ^ 0x5A for b in original)
    actual = hashlib.sha256(tampered).hexdigest()
    out = tmp_path / "pulled"
    try:
        blob.chmod(0o644)
        blob.write_bytes(tampered)
        with pytest.raises(VerificationError) as caught:
            pull(repo_id, variant="8da4w", output_dir=out, endpoint=local_hub.endpoint)
        with pytest.raises(VerificationError, match="sha256 mismatch"):
            pull(repo_id, variant="model-8da4w.pte", endpoint=local_hub.endpoint)  # into the HF cache
    finally:
        blob.write_bytes(original)  # blobs are shared by content: other repos hold this file too
    message = str(caught.value)
    assert "sha256 mismatch for model-8da4w.pte" in message and expected in message and actual in message
    assert "\n" not in message
    assert not (out / "model-8da4w.pte").exists()  # the bad file is not left behind
    cached = list((hf_isolated_env / "hub" / "models--alice--tiny-tampered").rglob("*"))
    assert not [p for p in cached if p.name in ("model-8da4w.pte", expected)]  # neither the link nor the blob
    assert sha256_file(pull(repo_id, output_dir=out, endpoint=local_hub.endpoint) / "model-8da4w.pte") == expected


def test_ls_generate_and_the_card_snippet_from_a_repo(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path
) -> None:
    repo_id = "alice/tiny-generate"
    _push(local_hub, export_8da4w, repo_id, source_model)

    code, listing = _cli("ls", repo_id, "--endpoint", local_hub.endpoint)
    assert code == 0 and "model-8da4w.pte" in listing and "KL " in listing and "perplexity" in listing
    assert " MB " in listing and "memory" in listing  # the memory at full context, measured at export

    result = _generate_from_repo(local_hub, repo_id, "8da4w")
    assert result.stdout.strip()  # the generated text
    assert re.search(r"prefill [\d.]+ tok/s; generated \d+ tok, decode [\d.]+ tok/s", result.stderr)

    # The card's Python snippet is runnable as published.
    # a chat model: the snippet renders the question through the chat template and decodes it with the answer
    assert "What is the capital of France?\nassistant" in _run_card_snippet(repo_id)


def test_shared_embeddings_variant_round_trips_with_its_data_file(
    local_hub: LocalHubFixture, exported_shared: Path, tmp_path: Path
) -> None:
    repo_id = "alice/tiny-shared"
    variant = Manifest.read(exported_shared).variants[0]
    result = _push(local_hub, exported_shared, repo_id)
    assert result.pushed
    files = set(local_hub.api(local_hub.alice_token).list_repo_files(repo_id))
    assert {variant.file, variant.data_file} <= files

    folder = pull(repo_id, variant="8da8w", output_dir=tmp_path / "pulled", endpoint=local_hub.endpoint)
    for name, digest in variant.files():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest

    generated = _generate_from_repo(local_hub, repo_id, "8da8w")
    assert re.search(r"generated \d+ tok", generated.stderr)

    # The card names the data file and its Python snippet runs as published.
    assert variant.data_file in ModelCard.load(repo_id).text
    # a chat model: the snippet renders the question through the chat template and decodes it with the answer
    assert "What is the capital of France?\nassistant" in _run_card_snippet(repo_id)


def test_the_token_appears_nowhere(
    local_hub: LocalHubFixture, export_8da4w: Path, source_model: Path, tmp_path: Path, hf_isolated_env: Path
) -> None:
    token = local_hub.alice_token
    repo_id = "alice/tiny-no-token"
    outputs = [
        _cli("push", "--from", str(export_8da4w), repo_id, "--source-card", str(source_model / "README.md"),
             "--token", token, "--endpoint", local_hub.endpoint)[1],
        _cli("ls", repo_id, "--token", token, "--endpoint", local_hub.endpoint)[1],
        _cli("pull", repo_id, "-o", str(tmp_path / "pulled"), "--token", token, "--endpoint", local_hub.endpoint)[1],
        _hub_export(local_hub, "push", "--from", str(export_8da4w), "acme/../x", "--token", token).stderr,
    ]  # fmt: skip
    assert "pushed" in outputs[0] and "model-8da4w.pte" in outputs[1] and "pulled" in outputs[2]
    snapshot = snapshot_download(repo_id, local_dir=tmp_path / "repo", token=token)

    leaks = [text for text in outputs if token in text]
    for folder in (Path(snapshot), tmp_path / "pulled", export_8da4w, hf_isolated_env):
        leaks += [str(p) for p in folder.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == []
    assert (Path(snapshot) / "README.md").is_file() and (Path(snapshot) / "manifest.json").is_file()
