"""hub-export Space: export a Hugging Face causal LM to ExecuTorch, verify it, push it, try it.

A Gradio 6 page and its sign-in over the ``hub_export`` library: checking the form,
running jobs in threads with slots and folders, exporting and pushing, reading the repo
back, streaming a preview and wording failures all live in :mod:`hub_export.service`.
This file decides whose token a job uses (:class:`AuthPolicy`), lays out the page,
and turns the library's events into what the page shows.

Run ``python space/app.py`` (see ``space/README.md`` for the environment variables), or
``make space`` for an offline demo against the local Hub.
"""

import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from hub_export import service
from hub_export.errors import HubError
from hub_export.generate import GenerationResult
from hub_export.hub import target_repo
from hub_export.options import form_fields
from hub_export.pull import list_variants
from hub_export.redact import Redactor
from hub_export.service import BackgroundJob

# The page's layout, views and settings, in this folder (on sys.path for `python space/app.py` and on Spaces).
from settings import AuthPolicy, Settings, auth_policy, settings_from_env  # noqa: F401 - the app's public names
from wording import FIELD_LABELS, SPACE_HINTS, failure_message, field_label  # noqa: F401 - the app's public names
from layout import (  # noqa: E402, I001 - a sibling module, not a package
    API_NOTE, DONE, FAILED, INTRO, LAUNCH_OPTIONS, RUNNING, ExportView,
    access_row, bar, clock, default_name, default_prompt, export_queued, export_tab, fill_preview, preview_queued,
    preview_tab,
)

log = logging.getLogger("hub_export.space")
HERE = Path(__file__).parent

# -- the handlers ---------------------------------------------------------------------------


class Jobs:
    """The handlers behind the buttons and the API endpoints, bound to :class:`Settings`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # Slots held by the job threads, one lane per kind as in Gradio's queue: a job whose
        # page was closed keeps its slot until the library returns.
        self.lanes = {"export": threading.BoundedSemaphore(settings.concurrency),
                      "preview": threading.BoundedSemaphore(settings.preview_concurrency)}
        self._engine = None
        self._engine_lock = threading.Lock()

    def engine(self):
        """Where exports run: the Ray cluster of ``HUB_EXPORT_RAY_ADDRESS`` (connected once), else this machine."""
        if self.settings.ray_address is None:
            return None
        with self._engine_lock:
            if self._engine is None:
                from hub_export.engines import RayEngine

                self._engine = RayEngine(self.settings.ray_address)
            return self._engine

    def user_token(self, oauth_token: gr.OAuthToken | None, typed: str | None, *, required: bool) -> str | None:
        """The token a job acts with: OAuth, else the pasted one, else (offline only) ``HF_TOKEN``."""
        if oauth_token is not None and oauth_token.token:
            return oauth_token.token
        if typed and typed.strip():
            return typed.strip()
        if self.settings.auth.env_token_allowed and self.settings.env_token:
            return self.settings.env_token
        if not required:
            return None
        if self.settings.auth.use_oauth:
            raise HubError("sign in with Hugging Face (button at the top of the page) so the Space can push to "
                           "your account")
        extra = " or start the Space with HF_TOKEN set" if self.settings.auth.env_token_allowed else ""
        raise HubError(f"paste a Hugging Face write token in the token field{extra}")

    def redactor(self, *tokens: str | None) -> Redactor:
        # HF_TOKEN too when unused: a Space secret must not leak through an echoed error.
        return Redactor(self.settings.env_token, os.environ.get("HF_TOKEN"), *tokens)

    def export_request(self, source: Any, options: dict[str, Any], repo_name: Any = "",
                       private: Any = False) -> service.ExportRequest:
        return service.export_request(source, options, repo_name, private, endpoint=self.settings.endpoint,
                                      allow_local=self.settings.allow_local_sources)

    def _background(self, work, kind: str) -> BackgroundJob:
        return BackgroundJob(work, slots=self.lanes[kind], root=self.settings.work_root, kind=kind)

    def export(self, source, options: dict[str, Any], repo_name, private, token,
               oauth_token: gr.OAuthToken | None = None, progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:
        """Export ``source`` to ExecuTorch, verify it and push it; yields (status, log, link, table, card, repo id).

        ``options``: the form's export options by name (:func:`hub_export.service.options_from_form`).
        """
        job_id = uuid.uuid4().hex[:8]
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        view = ExportView(status=f"{RUNNING} starting…")
        try:
            request = self.export_request(source, options, repo_name, private)
            user = self.user_token(oauth_token, token, required=True)
            redact.add(user)
            yield view.outputs()
            yield from self._export(request, user, job_id, view, redact, progress)
        except Exception as error:  # noqa: BLE001 - every failure becomes one line
            message = failure_message(error, job_id, redact)
            log.info("export job %s failed: %s", job_id, message)
            view.status = f"{FAILED} {message}"
            view.log_lines.append(f"failed: {message}")
            yield view.outputs()
            raise gr.Error(message, print_exception=False) from None

    def _export(self, request: service.ExportRequest, token: str, job_id: str, view: ExportView,
                redact: Redactor, progress: gr.Progress) -> Iterator[tuple]:
        repo_id = target_repo(request.repo_name, token, self.settings.endpoint)
        started = time.monotonic()

        def say(message: str) -> None:
            view.log_lines.append(f"[{clock(time.monotonic() - started)}] {redact(message)}")

        say(f"job {job_id}: {request.source} → {repo_id} ({', '.join(request.options.qmodes)})")
        log.info("export job %s: %s -> %s %s", job_id, request.source, repo_id, request.options.qmodes)
        engine = self.engine()
        task = self._background(lambda folder, emit: service.publish_and_read_back(
            request, repo_id, token, self.settings.endpoint, folder, emit, engine=engine), "export")
        fraction, stage = 0.0, "starting"
        for events in task.events():
            for _, event in events:
                stage = redact(str(event))
                say(stage)
                fraction = getattr(event, "fraction", fraction)  # the library counts its own steps
            progress(fraction, desc=stage)  # API clients see it in the job's status
            view.status = f"{RUNNING} `{bar(fraction)}` {clock(time.monotonic() - started)} · {stage}"
            yield view.outputs()
        published: service.Published = task.outcome()
        result = published.result
        say(result.summary)
        for note in result.notes:
            say(f"note: {note}")
        view.repo_id = result.repo_id
        view.link = f"### Your model: [{result.repo_id}]({result.url})\nTry it in the **Preview** tab."
        if result.pr_url:
            view.link += f"\n\nPull request: [{result.pr_url}]({result.pr_url})"
        if published.manifest is not None:
            view.rows = service.variant_rows(published.manifest, result.files)
            view.card = service.card_markdown(published.card)
            for variant in published.manifest.variants:
                if variant.file in result.files:
                    say(f"{variant.file}: {variant.verification.line()}")
        if published.read_error:
            say(f"pushed, but reading it back failed: {failure_message(published.read_error, job_id, redact)}")
        view.status = f"{DONE} {redact(result.summary)} · {clock(time.monotonic() - started)}"
        log.info("export job %s done: %s", job_id, result.summary)
        yield view.outputs()

    def variants(self, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None) -> gr.Dropdown:
        """The repo's variants for the Preview dropdown (first one selected)."""
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        if not (repo_id or "").strip():
            return gr.Dropdown(choices=[], value=None)
        try:
            user = self.user_token(oauth_token, token, required=False)
            manifest = list_variants(repo_id.strip(), self.settings.endpoint, user or False)
        except Exception as error:  # noqa: BLE001
            raise gr.Error(failure_message(error, "variants", redact), print_exception=False) from None
        choices = service.variant_choices(manifest)
        return gr.Dropdown(choices=choices, value=choices[0][1])

    def preview(self, repo_id, variant, prompt, max_new_tokens, chat, system, temperature, top_p, top_k,
                repetition_penalty, seed, token, oauth_token: gr.OAuthToken | None = None) -> Iterator[tuple[str, str]]:
        """Download one variant and stream generated text; yields (text, speed line)."""
        job_id = uuid.uuid4().hex[:8]
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        text = ""  # kept: a failure shows what was generated before it
        try:
            sampling = service.sampling_from_form(temperature, top_p, top_k, repetition_penalty, seed)
            request = service.preview_request(repo_id, variant, prompt, max_new_tokens, chat, system, sampling)
            user = self.user_token(oauth_token, token, required=False)
            redact.add(user)
            started = time.monotonic()
            stage = f"downloading {request.variant or 'the first variant'} from {request.repo_id}"
            task = self._background(lambda folder, emit: service.preview(
                request, user, self.settings.endpoint, folder, emit), "preview")
            for events in task.events(every=0.1):
                for kind, value in events:
                    text, stage = (text + value, stage) if kind == "text" else (text, redact(value))
                yield text, f"{RUNNING} {stage}… {clock(time.monotonic() - started)}"
            yield text, _speed_line(task.outcome())
        except Exception as error:  # noqa: BLE001 - every failure becomes one line
            message = failure_message(error, job_id, redact)
            yield text, f"{FAILED} {message}"
            raise gr.Error(message, print_exception=False) from None


def _speed_line(result: GenerationResult) -> str:
    stops = {"eos": "end of text", "max_new_tokens": "max new tokens reached", "context_full": "context full"}
    return (
        f"{DONE} prefill **{result.prefill_tokens_per_s:.0f} tok/s** ({result.prompt_tokens} prompt tokens) · "
        f"decode **{result.decode_tokens_per_s:.0f} tok/s** ({result.generated_tokens} new tokens) · "
        f"stopped: {stops.get(result.stop_reason, result.stop_reason)} · "
        f"chat template: {'used' if result.chat else 'not used'}"  # ticked means "when the model has one"
    )


OPTION_NAMES = [spec.name for spec in form_fields()]
# What the /export endpoint takes, in order: the source, every option the form offers (as ExportOptions declares
# them), then where to push; API clients may name them too.
EXPORT_PARAMETERS = inspect.Signature([
    *(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
      for name in ("source", *OPTION_NAMES, "repo_name", "private", "token")),
    inspect.Parameter("oauth_token", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                      annotation=gr.OAuthToken | None),
    inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress(),
                      annotation=gr.Progress),
])


def export_endpoint(jobs: Jobs):
    """``jobs.export`` with one parameter per form option, so Gradio (and its API) sees each control."""

    def export(*args: Any, **kwargs: Any) -> Iterator[tuple]:
        given = EXPORT_PARAMETERS.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        yield from jobs.export(values["source"], {name: values[name] for name in OPTION_NAMES}, values["repo_name"],
                               values["private"], values["token"], values["oauth_token"], values["progress"])

    export.__signature__ = EXPORT_PARAMETERS
    return export


def check_export_form(jobs: Jobs):
    """The form's first step, outside the queue: the library's own checks, so a bad value never waits for a slot."""

    def check(*args: Any) -> tuple:
        values = EXPORT_PARAMETERS.bind_partial(*args).arguments
        try:
            jobs.export_request(values["source"], {name: values[name] for name in OPTION_NAMES})
        except Exception as error:  # noqa: BLE001 - shown as the form's one line
            raise gr.Error(failure_message(error, "form", jobs.redactor()), print_exception=False) from None
        return export_queued()

    return check


def build_app(settings: Settings | None = None) -> gr.Blocks:
    """The Space's Blocks, with its queue configured; launch with ``.launch(**LAUNCH_OPTIONS)``."""
    settings = settings or settings_from_env()
    jobs = Jobs(settings)
    # No analytics: the app should call no one but the Hub it works with.
    with gr.Blocks(title="hub-export: Hugging Face → ExecuTorch", analytics_enabled=False) as app:
        gr.Markdown(INTRO)
        token = access_row(settings.auth.use_oauth, settings.auth.env_token_allowed)
        with gr.Tabs():
            with gr.Tab("Export", id="export"):
                ex = export_tab(settings.allow_local_sources)
            with gr.Tab("Preview", id="preview"):
                pv = preview_tab()
        gr.Markdown(API_NOTE)

        ex["source"].change(default_name, ex["source"], ex["repo_name"], api_visibility="private", queue=False)
        export_inputs = [ex["source"], *ex["options"].values(), ex["repo_name"], ex["private"], token]
        export_outputs = [ex["status"], ex["log"], ex["link"], ex["table"], ex["card"], ex["pushed"]]
        # Feedback at once, outside the queue: the old results go and the job shows as queued
        # until a slot frees (the job's own first update replaces that line).
        ex["run"].click(
            check_export_form(jobs), export_inputs[:-3], export_outputs[:5], api_visibility="private", queue=False
        ).success(
            export_endpoint(jobs),
            export_inputs,
            export_outputs,
            api_name="export",
            concurrency_id="exports",
            concurrency_limit=settings.concurrency,
            # Queue position, estimate and timer in the log's corner, so a queued user sees they wait;
            # not the full overlay, which would cover the status line and its own bar.
            show_progress="minimal",
            show_progress_on=[ex["log"]],
        ).success(fill_preview, ex["pushed"], pv["repo"], api_visibility="private", queue=False).then(
            jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private"
        )
        pv["refresh"].click(jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private")
        pv["repo"].submit(jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private")
        pv["chat"].change(
            default_prompt, [pv["chat"], pv["prompt"]], pv["prompt"], api_visibility="private", queue=False
        )
        preview_inputs = [
            pv["repo"], pv["variant"], pv["prompt"], pv["max_new_tokens"], pv["chat"], pv["system"],
            pv["temperature"], pv["top_p"], pv["top_k"], pv["repetition_penalty"], pv["seed"], token,
        ]  # fmt: skip
        pv["run"].click(preview_queued, None, [pv["text"], pv["stats"]], api_visibility="private", queue=False).then(
            jobs.preview,
            preview_inputs,
            [pv["text"], pv["stats"]],
            api_name="preview",
            # A lane of its own (and its own worker slots, see Jobs.lanes): a preview takes
            # seconds and must not sit in the queue behind another user's export.
            concurrency_id="previews",
            concurrency_limit=settings.preview_concurrency,
            # The queue position and timer show in the text box's corner, so a queued user
            # sees they are waiting; the status line below stays readable.
            show_progress="minimal",
            show_progress_on=[pv["text"]],
        )
    app.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency)
    return app


def main() -> None:
    """``python space/app.py``: serve with the settings from the environment."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):  # one line per Hub request would drown the job lines
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = settings_from_env()
    log.info("hub-export Space: %s; endpoint %s; concurrency %d, queue %d",
             settings.auth.description, settings.endpoint, settings.concurrency, settings.queue_size)  # fmt: skip
    # GRADIO_SERVER_NAME / GRADIO_SERVER_PORT are read by launch() itself.
    build_app(settings).launch(**LAUNCH_OPTIONS)


if __name__ == "__main__":
    main()
