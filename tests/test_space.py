"""The Space (space/app.py), served in-process against the local hub and driven over HTTP.

Exports cost ~30 s of CPU each, so the module makes two: one through the API (shared by
the API tests through the ``exported`` fixture) and one from a real headless browser.
Everything else (failures, preview, settings) reuses those or costs milliseconds.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks.ray_nodes import free_port
from hub_export import service
from hub_export.errors import HubError, HubExportError, InputError
from hub_export.hub import views
from hub_export.hub.pull import list_variants
from hub_export.options import ExportOptions, form_fields
from hub_export.pipeline.manifest import Manifest
from hub_export.tasks.text_generation.run import Sampling

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402

from hub_export.hub.localhub.pytest_plugin import LocalHubFixture  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = "alice/tiny-space-ExecuTorch"
BROWSER_REPO = "alice/tiny-space-browser-ExecuTorch"


def _load_space_app() -> ModuleType:
    """``space/app.py`` as a module (the Space folder is not a package: a Space runs ``app.py``)."""
    # As on a Space (and with `python space/app.py`), the Space's folder is on sys.path: app.py imports layout.py.
    if str(ROOT / "space") not in sys.path:
        sys.path.insert(0, str(ROOT / "space"))
    spec = importlib.util.spec_from_file_location("hub_export_space_app", ROOT / "space" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


space_app = _load_space_app()
layout = sys.modules["layout"]


@dataclass
class Space:
    url: str
    work_root: Path


@pytest.fixture(scope="module")
def space(local_hub: LocalHubFixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Space]:
    """The Space on a free port, offline-style (token field, no OAuth), HF_TOKEN fallback off."""
    work_root = tmp_path_factory.mktemp("space-jobs")
    settings = space_app.Settings(
        endpoint=local_hub.endpoint,
        auth=space_app.AuthPolicy(use_oauth=False, env_token_allowed=False, description="tests"),
        work_root=work_root,
    )
    blocks = space_app.build_app(settings)
    options = {**space_app.LAUNCH_OPTIONS, "server_name": "127.0.0.1", "server_port": free_port(), "quiet": True}
    blocks.launch(prevent_thread_lock=True, **options)
    try:
        yield Space(blocks.local_url, work_root)
    finally:
        blocks.close()


@pytest.fixture(scope="module")
def client(space: Space):
    return gradio_client.Client(space.url, verbose=False)


def _export_args(source: str, token: str, repo_name: str = REPO.split("/")[1]) -> dict:
    """The /export arguments, by name as the README asks: 8da4w at a 64-token context, the other options as shown."""
    options = {spec.name: service.shown_default(spec) for spec in form_fields()}
    options.update(qmodes=["8da4w"], max_seq_len=64)
    return {"source": source, **options, "repo_name": repo_name, "private": False, "token": token}


@dataclass
class Exported:
    final: tuple
    updates: list[tuple]


@pytest.fixture(scope="module")
def exported(client, tiny_model: Path, local_hub: LocalHubFixture) -> Exported:
    """One export job through the API: the tiny model folder, 8da4w, 64-token context."""
    job = client.submit(**_export_args(str(tiny_model), local_hub.alice_token), api_name="/export")
    final = job.result(timeout=600)
    return Exported(tuple(final), [tuple(update) for update in job.outputs()])


def _one_line(message: str) -> None:
    assert message and "\n" not in message.strip(), message
    assert "Traceback" not in message and 'File "' not in message, message


# -- API --------------------------------------------------------------------------------


def test_export_pushes_the_chosen_variant(exported: Exported, local_hub: LocalHubFixture, space: Space) -> None:
    status, log, link, table, card = exported.final[:5]
    assert status.startswith("**Done:**") and REPO in status, status
    assert f"[{REPO}]({local_hub.endpoint}/{REPO})" in link
    rows = table["data"]
    assert [row[0] for row in rows] == ["model-8da4w.pte"]
    row = dict(zip(table["headers"], rows[0], strict=False))
    assert row["verified"] == "yes" and row["this job"] == "yes"
    assert row["verification"].startswith("KL ") and row["verification"].endswith(" vs eager"), row
    assert re.fullmatch(r"[\d.]+ \([\d.]+x fp32\)", row["perplexity (vs fp32)"]), row  # the card's cell
    assert "model-8da4w.pte: verified KL " in log and "x fp32)" in log, log
    assert "for ExecuTorch" in card and "```yaml" in card  # rendered card, front matter as a block

    api = local_hub.api(local_hub.alice_token)
    files = set(api.list_repo_files(REPO))
    # The speeds are the C++ runner's at export, as the pushed manifest records them. Its clock
    # ticks in milliseconds: a phase of this toy model can finish within one tick, and then
    # the cell must say n/a rather than show an infinite or made-up rate.
    manifest = json.loads(Path(api.hf_hub_download(REPO, "manifest.json")).read_text())
    check = manifest["variants"][0]["verification"]
    assert check["runner_generated_tokens"] > 0, check
    for stage in ("prefill", "decode"):
        measured = check[f"runner_{stage}_tokens_per_s"]
        shown = f"{measured:.0f}" if measured and measured > 0 else "n/a"
        assert row[f"{stage} tok/s"] == shown, (row, check)
    assert {"model-8da4w.pte", "manifest.json", "README.md", "tokenizer.json"} <= files
    assert "model-fp32.pte" not in files and "model-8da8w.pte" not in files
    assert not list(space.work_root.iterdir()), "job folders must be removed"


def test_export_streams_stages_and_never_shows_the_token(exported: Exported, local_hub: LocalHubFixture) -> None:
    statuses = [update[0] for update in exported.updates]
    assert len(exported.updates) >= 5, statuses  # stages arrive live, not only at the end
    running = [status for status in statuses if status.startswith("**Running:**")]
    assert any("lowering" in status and "▰" in status for status in running), statuses
    log = exported.final[1]
    for stage in ("resolving", "quantizing", "lowering", "verifying", "uploading"):
        assert stage in log, log
    everything = repr(exported.updates) + repr(exported.final)
    assert local_hub.alice_token not in everything


def test_bad_model_id_is_one_line_and_the_next_job_works(
    client, exported: Exported, local_hub: LocalHubFixture, space: Space
) -> None:
    with pytest.raises(AppError) as failure:
        client.predict(**_export_args("nobody/no-such-model", local_hub.alice_token, ""), api_name="/export")
    message = str(failure.value)
    _one_line(message)
    assert "nobody/no-such-model" in message and "not found" in message, message
    assert local_hub.alice_token not in message

    text, stats = client.predict(
        repo_id=REPO,
        variant="model-8da4w.pte",
        prompt="Once upon a time",
        max_new_tokens=8,
        chat=False,
        api_name="/preview",
    )
    assert stats.startswith("**Done:**") and "tok/s" in stats, stats
    assert not list(space.work_root.iterdir())


def test_export_without_a_token_asks_to_sign_in(client, tiny_model: Path) -> None:
    with pytest.raises(AppError) as failure:
        client.predict(**_export_args(str(tiny_model), ""), api_name="/export")
    _one_line(str(failure.value))
    assert "paste a Hugging Face write token" in str(failure.value)


def test_preview_streams_text_with_speed(client, exported: Exported, local_hub: LocalHubFixture) -> None:
    # The API's defaults are the form's: the chat template (the tiny model has one), greedy.
    job = client.submit(
        repo_id=REPO, variant="8da4w", max_new_tokens=24, token=local_hub.alice_token, api_name="/preview"
    )
    text, stats = job.result(timeout=300)
    updates = job.outputs()
    assert len(updates) >= 2 and updates[0][1].startswith("**Running:**"), updates
    assert "prefill" in stats and "decode" in stats and "tok/s" in stats, stats
    assert "chat template: used" in stats, stats
    # What the preview shows is what the file generates: the library's greedy answer from the same repo, word for
    # word (random weights may well answer with blank lines, so compare rather than look for words).
    from hub_export import generate, pull

    folder = pull(REPO, variant="8da4w", endpoint=local_hub.endpoint, token=local_hub.alice_token)
    expected = generate(folder / "model-8da4w.pte", folder, "What is the capital of France?", max_new_tokens=24)
    assert text == expected.text and updates[-1][0] == text, (text, expected.text)


def test_preview_of_a_missing_repo_is_one_line(client) -> None:
    with pytest.raises(AppError) as failure:
        client.predict(repo_id="alice/not-there", prompt="Hi", max_new_tokens=4, api_name="/preview")
    _one_line(str(failure.value))
    assert "alice/not-there" in str(failure.value)


def _jobs(local_hub: LocalHubFixture, work_root: Path):
    """The Space's handlers, called directly (no HTTP): what the form would call them with."""
    auth = space_app.AuthPolicy(use_oauth=False, env_token_allowed=False, description="tests")
    return space_app.Jobs(space_app.Settings(endpoint=local_hub.endpoint, auth=auth, work_root=work_root))


# Form order: repo, variant, prompt, max new tokens, chat, system,
# temperature, top-p, top-k, repetition penalty, seed, token.
GREEDY = (0.0, 1.0, 0, 1.0, 0)


def test_preview_passes_chat_system_and_sampling_to_generate(
    exported: Exported, exported_multi: Path, local_hub: LocalHubFixture, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from hub_export import push

    calls: list[dict] = []
    real_generate = service.stream_generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(service, "stream_generate", spy)
    jobs, token = _jobs(local_hub, tmp_path), local_hub.alice_token

    sampled = list(jobs.preview(REPO, "8da4w", "Hi", 6, True, " Be brief. ", 0.7, 0.9, 5, 1.1, 3, token))
    assert calls[-1]["chat"] is None  # ticked: the template when the model has one (the tiny model has)
    assert calls[-1]["system"] == "Be brief."
    assert calls[-1]["sampling"] == Sampling(temperature=0.7, top_p=0.9, top_k=5, repetition_penalty=1.1, seed=3)
    assert isinstance(calls[-1]["sampling"].top_k, int) and isinstance(calls[-1]["sampling"].seed, int)
    assert "chat template: used" in sampled[-1][1], sampled[-1]

    plain = list(jobs.preview(REPO, "8da4w", "Once upon a time", 6, False, "", *GREEDY, token))
    assert calls[-1]["chat"] is False and calls[-1]["system"] is None
    assert calls[-1]["sampling"] == Sampling()  # greedy
    assert "chat template: not used" in plain[-1][1], plain[-1]
    assert calls[-1]["lookup"] is False

    # Prompt lookup on a file exported without forward_rows: the library's refusal, one line.
    with pytest.raises(space_app.gr.Error) as failure:
        list(jobs.preview(REPO, "8da4w", "Once upon a time", 6, False, "", *GREEDY, token, None, None, True))
    assert calls[-1]["lookup"] is True
    _one_line(failure.value.message)
    assert "export it with `hub-export export --speculative`" in failure.value.message, failure.value.message

    # Another variant of the repo as the draft: pulled beside the chosen one and handed to the library, whose refusal
    # (no forward_rows in these files) comes back as one line; the dropdown offers it.
    pair, draft = "alice/tiny-space-pair-ExecuTorch", "model-fp32-emb8w.pte"
    push(from_dir=str(exported_multi), repo_id=pair, token=token, endpoint=local_hub.endpoint)
    offered = views.drafter_choices(list_variants(pair, local_hub.endpoint))
    assert ("draft with", f"draft:{draft}") in [(label[:10], value) for label, value in offered]
    with pytest.raises(space_app.gr.Error) as failure:
        list(
            jobs.preview(pair, "8da4w", "Once upon a time", 6, False, "", *GREEDY, token, None, None, f"draft:{draft}")
        )
    assert calls[-1]["lookup"] is False and Path(calls[-1]["draft"]).name == draft
    _one_line(failure.value.message)
    assert "--speculative" in failure.value.message, failure.value.message

    # A system message without the template: the library's refusal, in the Space's words.
    with pytest.raises(space_app.gr.Error) as failure:
        list(jobs.preview(REPO, "8da4w", "Hi", 6, False, "Be brief.", *GREEDY, token))
    _one_line(failure.value.message)
    assert "'System message'" in failure.value.message and "--" not in failure.value.message
    assert not list(tmp_path.iterdir()), "job folders must be removed"


def test_bad_sampling_is_one_line_before_any_download(tmp_path: Path, local_hub: LocalHubFixture) -> None:
    jobs = _jobs(local_hub, tmp_path)
    updates: list = []
    with pytest.raises(space_app.gr.Error) as failure:
        for update in jobs.preview("alice/not-there", "", "Hi", 4, True, "", 0.0, 1.5, 0, 1.0, 0, ""):
            updates.append(update)
    message = failure.value.message
    _one_line(message)
    assert message.startswith("'Top-p' must be in (0, 1]"), message  # Sampling.check's words, not "not found"
    assert updates == [("", f"**Failed:** {message}")]
    with pytest.raises(space_app.gr.Error, match="Top-k must be a whole number"):
        list(jobs.preview("alice/not-there", "", "Hi", 4, True, "", 0.0, 1.0, 2.5, 1.0, 0, ""))


def test_previews_have_their_own_lane(tmp_path: Path) -> None:
    """A preview neither queues behind an export in Gradio nor waits for the export's worker slot."""
    settings = space_app.Settings(
        endpoint="http://127.0.0.1:9", auth=space_app.AuthPolicy(False, False, "tests"), work_root=tmp_path
    )
    blocks = space_app.build_app(settings)
    fns = {fn.api_name: fn for fn in blocks.fns.values()}
    export, preview = fns["export"], fns["preview"]
    assert preview.concurrency_id != export.concurrency_id
    assert preview.concurrency_limit == settings.preview_concurrency == 1
    for job in (preview, export):
        assert job.show_progress != "hidden", "a queued job must show its place in the queue"

    jobs, release = space_app.Jobs(settings), threading.Event()
    running = jobs._background(lambda folder, emit: release.wait(10) and "exported", "export")
    export_events = running.events()
    next(export_events)  # the export holds its slot now (a heartbeat: it emits nothing)
    safety = threading.Timer(5, release.set)  # without a lane of its own, the preview would wait for this
    safety.start()
    try:
        preview_task = jobs._background(lambda folder, emit: "previewed", "preview")
        seen = [event for batch in preview_task.events() for event in batch]
        assert not release.is_set(), "the preview waited for the export"
        assert ("wait", service.WAITING) not in seen and preview_task.outcome() == "previewed"
    finally:
        release.set()
        safety.cancel()
        for _ in export_events:
            pass
    assert running.outcome() == "exported"


def test_chat_toggle_swaps_only_the_default_prompt() -> None:
    assert space_app.default_prompt(False, layout.CHAT_PROMPT) == layout.PLAIN_PROMPT
    assert space_app.default_prompt(True, layout.PLAIN_PROMPT) == layout.CHAT_PROMPT
    typed = space_app.default_prompt(False, "Tell me a story")
    assert typed is not None and typed != "Tell me a story"  # gr.skip(): a typed prompt stays


# -- settings ---------------------------------------------------------------------------


def test_oauth_space_never_uses_the_space_token() -> None:
    env = {"SPACE_ID": "hub-export/converter", "OAUTH_CLIENT_ID": "x", "HF_TOKEN": "hf_" + "s" * 34}
    settings = space_app.settings_from_env(env)
    assert settings.auth.use_oauth and not settings.auth.env_token_allowed
    assert settings.env_token is None and not settings.allow_local_sources
    jobs = space_app.Jobs(settings)
    with pytest.raises(HubError, match="sign in with Hugging Face"):
        jobs.user_token(None, "", required=True)
    with pytest.raises(InputError, match="not a Hub model id"):
        jobs.export_request("/etc", {"qmodes": ["8da4w"]})
    # (Building the OAuth page needs gradio[oauth] and a real Space: Gradio attaches its routes then.)


def test_token_precedence_and_env_settings() -> None:
    env = {
        "HF_TOKEN": "hf_" + "e" * 34,
        "HUB_EXPORT_SPACE_CONCURRENCY": "2",
        "HUB_EXPORT_SPACE_PREVIEW_CONCURRENCY": "4",
        "HUB_EXPORT_SPACE_QUEUE": "3",
    }
    settings = space_app.settings_from_env(env)  # off a Space: offline mode, HF_TOKEN allowed
    jobs = space_app.Jobs(settings)
    oauth = space_app.gr.OAuthToken(token="hf_" + "o" * 34, scope="", expires_at=0)
    assert jobs.user_token(oauth, "hf_typed_token_1234", required=True) == oauth.token
    assert jobs.user_token(None, " hf_typed_token_1234 ", required=True) == "hf_typed_token_1234"
    assert jobs.user_token(None, "", required=True) == env["HF_TOKEN"]
    on_space = space_app.settings_from_env({**env, "SPACE_ID": "a/b"})  # a Space without OAuth: pasted only
    assert on_space.env_token is None
    assert settings.concurrency == 2 and settings.preview_concurrency == 4 and settings.queue_size == 3
    assert space_app.build_app(settings)._queue.max_size == 3
    with pytest.raises(SystemExit, match="HUB_EXPORT_SPACE_QUEUE"):
        space_app.settings_from_env({"HUB_EXPORT_SPACE_QUEUE": "0"})


def test_a_group_size_the_library_refuses_is_refused_before_a_job_is_queued(tmp_path: Path) -> None:
    """Group size 48, not a multiple of 32: the click's first step, outside the queue, refuses it with the library's
    own message in the form's words, and the queued export runs only after that step succeeds."""
    settings = space_app.Settings(
        endpoint="http://127.0.0.1:9", auth=space_app.AuthPolicy(False, True, "tests"), work_root=tmp_path
    )
    blocks = space_app.build_app(settings)
    export = next(fn for fn in blocks.fns.values() if fn.api_name == "export")
    check = blocks.fns[export.trigger_after]  # what the button does first
    assert check.queue is False and export.trigger_only_on_success, "a refused form must never reach the queue"
    form = {component.label: component.value for component in check.inputs}  # as the page shows it
    form["Source model"] = "acme/Model"
    form["Group size"] = 48
    with pytest.raises(space_app.gr.Error) as refused:
        check.fn(*form.values())
    with pytest.raises(InputError) as library:
        ExportOptions(group_size=48)
    assert refused.value.message == library.value.worded(space_app.field_label)
    assert refused.value.message.startswith("'Group size' must be a positive multiple of 32 (got 48)")
    assert not any(settings.work_root.iterdir()), "no job started"
    form["Group size"] = 64
    assert check.fn(*form.values())[0].startswith(layout.QUEUED)  # a form the library takes goes on to the queue


def test_library_messages_are_worded_for_the_form(local_hub, tmp_path) -> None:
    """The library's CLI advice ("pass --token", "push to another repo") in the Space's words, from real failures."""
    import importlib

    push_module = importlib.import_module("hub_export.hub.push")  # hub_export.push is the function
    from hub_export.pipeline.export import export
    from hub_export.tasks.text_generation.run import Sampling

    failures = []
    with pytest.raises(InputError) as other_source:
        push_module.check_same_source(Manifest(source={"id": "acme/a"}, versions={}, variants=[]), "acme/b")
    failures.append(other_source.value)
    private = "alice/space-wording-private"
    local_hub.api(local_hub.alice_token).create_repo(private, private=True)
    for token in ("hf_" + "x" * 30, local_hub.bob_token):  # a rejected token; one that cannot see the private repo
        with pytest.raises(HubExportError) as hub_failure:
            export(private, tmp_path / "never", endpoint=local_hub.endpoint, token=token)
        failures.append(hub_failure.value)
    with pytest.raises(HubExportError) as read_only:
        push_module.push(private, "alice/x", endpoint=local_hub.endpoint, token=local_hub.alice_readonly_token)
    failures.append(read_only.value)
    with pytest.raises(HubExportError) as bad_option:
        Sampling(temperature=-1).check()
    failures.append(bad_option.value)
    worded = [space_app.failure_message(error, "job", space_app.Redactor()) for error in failures]
    for line, error in zip(worded, failures, strict=False):
        assert "--" not in line and "pass your token" not in line and "another repo" not in line, line
        # the Space rewords every one, and the error keeps the CLI's own wording for the CLI
        assert line != str(error) and str(error) == error.worded(), (line, str(error))
    assert worded[0].endswith("choose another 'Target repo'"), worded[0]
    assert worded[1].endswith("sign in again or paste a valid write token"), worded[1]
    assert worded[2].endswith("for a private repo, use a token that can read it"), worded[2]
    assert worded[3].endswith("create a write token and use it here"), worded[3]
    assert worded[4].startswith("'Temperature' must be"), worded[4]


def test_token_hint_is_visible_text_not_a_placeholder(tmp_path: Path) -> None:
    settings = space_app.Settings(
        endpoint="http://127.0.0.1:9", auth=space_app.AuthPolicy(False, True, "tests"), work_root=tmp_path
    )
    blocks = space_app.build_app(settings)
    field = next(c for c in blocks.blocks.values() if getattr(c, "label", None) == "Hugging Face token")
    assert "Blank: the server's HF_TOKEN" in field.info
    assert "HF_TOKEN" not in (field.placeholder or "")


def test_every_click_gives_feedback_at_once(tmp_path: Path) -> None:
    """Before the queue: the button's first step, outside the queue, clears the old output and says so."""
    settings = space_app.Settings(
        endpoint="http://127.0.0.1:9", auth=space_app.AuthPolicy(False, False, "tests"), work_root=tmp_path
    )
    blocks = space_app.build_app(settings)
    checks_the_form = "check_export_form.<locals>.check"
    for first, job in (("preview_queued", "preview"), (checks_the_form, "export")):
        step = next(fn for fn in blocks.fns.values() if getattr(fn.fn, "__qualname__", "") == first)
        assert step.queue is False, "feedback must not wait in the queue"
        then = next(fn for fn in blocks.fns.values() if fn.api_name == job)
        assert then.trigger_after == step._id, f"/{job} runs after the feedback step"
    export = next(fn for fn in blocks.fns.values() if fn.api_name == "export")
    assert export.trigger_only_on_success, "a form the library refuses never reaches the queue"
    text, stats = space_app.preview_queued()
    assert text == "" and stats.startswith(layout.QUEUED)
    status, log, link, table, card = space_app.export_queued()
    assert status.startswith(layout.QUEUED) and (log, link, card) == ("", "", "") and table.empty


def test_redaction_and_wording() -> None:
    from hub_export.errors import InputError, opt

    redact = space_app.Redactor("secret-token-value")
    line = redact("token secret-token-value and hf_abcdefghijklmnopqrstuvwxyz12 leaked")
    assert line == "token *** and hf_*** leaked"
    error = InputError(f"{opt('max_seq_len')} 5000 is above the model's limit", param="max_seq_len")
    assert space_app.failure_message(error, "job1", redact) == "'Max sequence length' 5000 is above the model's limit"
    assert str(error) == "--max-seq-len 5000 is above the model's limit"  # the CLI's words, from the same error


def test_unexpected_errors_are_one_generic_line(caplog: pytest.LogCaptureFixture) -> None:
    token = "hf_" + "u" * 34
    error = RuntimeError(f"boom in /srv/secret/path with {token}")
    message = space_app.failure_message(error, "job42", space_app.Redactor())
    _one_line(message)
    assert "RuntimeError" in message and "job42" in message and "boom" not in message
    assert "boom" in caplog.text and token not in caplog.text  # the details go to the Space's logs, redacted


# -- browser ----------------------------------------------------------------------------


@pytest.fixture
def artifacts() -> Path:
    folder = ROOT / "test-artifacts"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.mark.extended
def test_browser_export_shows_the_repo_link(
    space: Space, tiny_model: Path, local_hub: LocalHubFixture, artifacts: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: install Debian's chromium package to run the browser test")
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(space.url)
            page.get_by_label("Source model").fill(str(tiny_model))
            repo_field = page.get_by_label("Target repo")
            expect(repo_field).to_have_value("tiny-llama-ExecuTorch")  # prefilled from the source
            repo_field.fill(BROWSER_REPO.split("/")[1])
            page.get_by_label("Hugging Face token").fill(local_hub.alice_token)
            expect(page.get_by_label("8da4w", exact=False)).to_be_checked()  # the default variant, alone
            expect(page.get_by_label("fp32", exact=False)).not_to_be_checked()
            expect(page.get_by_label("8da8w", exact=False)).not_to_be_checked()
            page.get_by_label("Max sequence length").fill("64")
            page.get_by_role("button", name="Export & push").click()

            link = page.locator("#export-link a", has_text=BROWSER_REPO)
            expect(link).to_be_visible(timeout=300_000)
            expect(page.locator("#export-status")).to_contain_text("pushed")
            page.screenshot(path=str(artifacts / "space-export.png"), full_page=True)
            assert local_hub.alice_token not in page.content()

            page.get_by_role("tab", name="Export").focus()
            # On a phone, with the variants table filled: one column, the table scrolls in its own box.
            page.set_viewport_size({"width": PHONE_WIDTH, "height": 900})
            _assert_fits(page)
            page.screenshot(path=str(artifacts / "space-export-400px.png"), full_page=True)
            page.set_viewport_size({"width": 1280, "height": 1400})

            page.get_by_role("tab", name="Preview").click()  # prefilled with the repo just pushed
            expect(page.get_by_label("Repo", exact=True)).to_have_value(BROWSER_REPO)
        finally:
            browser.close()
    assert "model-8da4w.pte" in local_hub.api(local_hub.alice_token).list_repo_files(BROWSER_REPO)


PHONE_WIDTH = 400


def _assert_fits(page) -> None:
    """Nothing wider than the window: the page never scrolls sideways."""
    page.wait_for_timeout(300)  # Gradio lays the table out again after a resize
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page overflows sideways: scrollWidth {widths[0]} > {widths[1]}"


# WCAG contrast ratio of an element's text (or its ::placeholder) against the first opaque
# background behind it.
CONTRAST_JS = """(el, pseudo) => {
  const rgb = (text) => text.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => {
    const [r, g, b] = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let back = el, fill = "rgba(0, 0, 0, 0)";
  while (back && (fill = getComputedStyle(back).backgroundColor).startsWith("rgba(0, 0, 0, 0")) back = back.parentElement;
  const [a, b] = [lum(rgb(getComputedStyle(el, pseudo).color)), lum(rgb(fill))];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def test_browser_page_is_accessible_and_fits_a_phone(space: Space, artifacts: Path) -> None:
    """Names in the accessibility tree, readable contrast, and a 400 px page that never scrolls sideways."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: install Debian's chromium package to run the browser test")
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": PHONE_WIDTH, "height": 900})
            page.set_default_timeout(20_000)  # bounded: a missing element fails in seconds, not minutes
            page.goto(space.url)
            expect(page.get_by_label("Source model")).to_be_visible()

            # Outputs and groups have names; the outputs are read-only but reachable by keyboard.
            for role, name in (("group", "Variants"), ("group", "Embedding quantization"), ("textbox", "Log")):
                expect(page.get_by_role(role, name=name, exact=True)).to_be_visible()
            log = page.get_by_role("textbox", name="Log", exact=True)
            expect(log).to_be_enabled()
            expect(log).not_to_be_editable()
            log.focus()
            assert log.evaluate("el => document.activeElement === el"), "the Log cannot take keyboard focus"
            tree = page.locator("body").aria_snapshot()
            assert 'textbox "Log"' in tree and "textbox [disabled]" not in tree, tree

            # WCAG AA: placeholders and field hints at 4.5:1 or more against what is behind them.
            placeholder = page.get_by_label("Revision").evaluate(CONTRAST_JS, "::placeholder")
            hint = page.get_by_text("Branch, tag or commit.").evaluate(CONTRAST_JS, None)
            assert placeholder >= 4.5 and hint >= 4.5, (placeholder, hint)

            _assert_fits(page)
            page.screenshot(path=str(artifacts / "space-400px-export-tab.png"), full_page=True)

            page.get_by_role("tab", name="Preview").click()
            text = page.get_by_role("textbox", name="Generated text", exact=True)
            expect(text).to_be_visible()
            expect(text).to_be_enabled()
            _assert_fits(page)
            page.screenshot(path=str(artifacts / "space-400px-preview-tab.png"), full_page=True)
        finally:
            browser.close()


SPEECH_REPO = "alice/tiny-whisper-space"
VIT_REPO = "alice/tiny-vit-space"


@pytest.fixture(scope="module")
def media_repos(exported_whisper: Path, exported_vit: Path, local_hub: LocalHubFixture) -> None:
    from hub_export import push

    for folder, repo_id in ((exported_whisper, SPEECH_REPO), (exported_vit, VIT_REPO)):
        push(from_dir=str(folder), repo_id=repo_id, token=local_hub.alice_token, endpoint=local_hub.endpoint)


def test_browser_speech_preview_transcribes_a_recording(
    space: Space, media_repos, spoken: Path, local_hub: LocalHubFixture, artifacts: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: install Debian's chromium package to run the browser test")
    from playwright.sync_api import expect, sync_playwright

    from hub_export import pull, transcribe

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(space.url)
            page.get_by_role("tab", name="Preview").click()
            page.get_by_label("Repo", exact=True).fill(SPEECH_REPO)
            variant = page.get_by_role("combobox", name="Variant")
            variant.fill("8da8w")
            variant.press("Enter")
            page.locator("#preview-audio input[type=file]").set_input_files(str(spoken))
            page.get_by_label("Hugging Face token").fill(local_hub.alice_token)
            page.get_by_role("button", name="Generate").click()
            expect(page.locator("#preview-stats")).to_contain_text("real-time factor", timeout=300_000)
            shown = page.locator("#preview-text textarea").input_value()
            page.screenshot(path=str(artifacts / "space-speech-preview.png"), full_page=True)
        finally:
            browser.close()
    folder = pull(SPEECH_REPO, variant="8da8w", endpoint=local_hub.endpoint, token=local_hub.alice_token)
    assert shown == transcribe(folder / "model-8da8w-emb8w.pte", folder, spoken).text and shown


def test_hostile_uploads_are_one_line_with_no_traceback_in_the_log(
    client, media_repos, local_hub: LocalHubFixture, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gradio_client import handle_file
    from hostile_media import audio_corpus, image_corpus

    images = image_corpus(tmp_path / "images")
    recordings = audio_corpus(tmp_path / "audio")
    cases = [
        (VIT_REPO, "image", images[what])
        for what in ("PNG bomb", "GIF bomb", "animated GIF", "truncated PNG", "SVG", "179-megapixel 16-bit PNG")
    ]
    cases += [(SPEECH_REPO, "audio", recordings[what]) for what in ("1 Hz", "all NaN", "FLAC claiming 2^36 samples",
                                                                    "garbage mp3")]  # fmt: skip
    for repo_id, field, path in cases:
        with pytest.raises(AppError) as failure:
            client.predict(repo_id=repo_id, prompt="", max_new_tokens=4, token=local_hub.alice_token,
                           api_name="/preview", **{field: handle_file(str(path))})  # fmt: skip
        _one_line(str(failure.value))
        assert path.name in str(failure.value), (path.name, str(failure.value))
    assert "Traceback" not in caplog.text
