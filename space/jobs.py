"""The Space's handlers: what each button (and API endpoint) does, with whose token, in which slot.

:class:`Jobs` decides whose token a job uses (OAuth, a pasted token or, offline, the
server's ``HF_TOKEN``), runs the library's work in a background job and turns its events
into what the page shows. ``app.py`` wires these handlers to the page.
"""

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import gradio as gr
from layout import DONE, FAILED, RUNNING, ExportView, bar
from settings import Settings
from wording import failure_message

from hub_export import service
from hub_export.errors import HubError
from hub_export.hub import views
from hub_export.hub.api import target_repo
from hub_export.hub.pull import list_variants
from hub_export.pipeline.engines import RayEngine
from hub_export.progress import clock
from hub_export.redact import Redactor
from hub_export.service import BackgroundJob
from hub_export.tasks.fill_mask.run import FillMaskResult
from hub_export.tasks.image_classification.run import ClassifyResult
from hub_export.tasks.sentence_embeddings.run import EmbedResult
from hub_export.tasks.speech.run import TranscriptionResult
from hub_export.tasks.text_generation.run import GenerationResult

log = logging.getLogger("hub_export.space")


class Jobs:
    """The handlers behind the buttons and the API endpoints, bound to :class:`Settings`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # Slots held by the job threads, one lane per kind as in Gradio's queue: a job whose
        # page was closed keeps its slot until the library returns.
        self.lanes = {
            "export": threading.BoundedSemaphore(settings.concurrency),
            "preview": threading.BoundedSemaphore(settings.preview_concurrency),
        }
        self._engine = None
        self._engine_lock = threading.Lock()

    def engine(self):
        """Where exports run: the Ray cluster of ``HUB_EXPORT_RAY_ADDRESS`` (connected once), else this machine."""
        if self.settings.ray_address is None:
            return None
        with self._engine_lock:
            if self._engine is None:
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
            raise HubError(
                "sign in with Hugging Face (button at the top of the page) so the Space can push to your account"
            )
        extra = " or start the Space with HF_TOKEN set" if self.settings.auth.env_token_allowed else ""
        raise HubError(f"paste a Hugging Face write token in the token field{extra}")

    def redactor(self, *tokens: str | None) -> Redactor:
        # HF_TOKEN too when unused: a Space secret must not leak through an echoed error.
        return Redactor(self.settings.env_token, os.environ.get("HF_TOKEN"), *tokens)

    def export_request(
        self, source: Any, options: dict[str, Any], repo_name: Any = "", private: Any = False
    ) -> service.ExportRequest:
        return service.export_request(
            source,
            options,
            repo_name,
            private,
            endpoint=self.settings.endpoint,
            allow_local=self.settings.allow_local_sources,
        )

    def _background(self, work, kind: str) -> BackgroundJob:
        return BackgroundJob(work, slots=self.lanes[kind], root=self.settings.work_root, kind=kind)

    def export(
        self,
        source,
        options: dict[str, Any],
        repo_name,
        private,
        token,
        oauth_token: gr.OAuthToken | None = None,
        progress: gr.Progress = gr.Progress(),
    ) -> Iterator[tuple]:
        """Export ``source`` to ExecuTorch, verify it and push it; yields (status, log, link, table, card, repo id).

        ``options``: the form's export options by name (read by
        :func:`hub_export.service.options_from_form` into one :class:`~hub_export.ExportOptions`).
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
        except Exception as error:  # any failure is one line on the page
            message = failure_message(error, job_id, redact)
            log.info("export job %s failed: %s", job_id, message)
            view.status = f"{FAILED} {message}"
            view.log_lines.append(f"failed: {message}")
            yield view.outputs()
            raise gr.Error(message, print_exception=False) from None

    def _export(
        self,
        request: service.ExportRequest,
        token: str,
        job_id: str,
        view: ExportView,
        redact: Redactor,
        progress: gr.Progress,
    ) -> Iterator[tuple]:
        repo_id = target_repo(request.repo_name, token, self.settings.endpoint)
        started = time.monotonic()

        def say(message: str) -> None:
            view.log_lines.append(f"[{clock(time.monotonic() - started)}] {redact(message)}")

        say(f"job {job_id}: {request.source} → {repo_id} ({', '.join(request.options.qmodes)})")
        log.info("export job %s: %s -> %s %s", job_id, request.source, repo_id, request.options.qmodes)
        engine = self.engine()
        task = self._background(
            lambda folder, emit: service.publish_and_read_back(
                request, repo_id, token, self.settings.endpoint, folder, emit, engine=engine
            ),
            "export",
        )
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
            view.rows = views.variant_rows(published.manifest, result.files)
            view.card = views.card_markdown(published.card)
            for variant in published.manifest.variants:
                if variant.file in result.files:
                    say(f"{variant.file}: {variant.verification.line()}")
        if published.read_error:
            say(f"pushed, but reading it back failed: {failure_message(published.read_error, job_id, redact)}")
        view.status = f"{DONE} {redact(result.summary)} · {clock(time.monotonic() - started)}"
        log.info("export job %s done: %s", job_id, result.summary)
        yield view.outputs()

    def variants(
        self, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None
    ) -> tuple[gr.Dropdown, gr.Dropdown]:
        """The repo's variants for the Preview dropdown (first one selected), and its drafters (off selected)."""
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        if not (repo_id or "").strip():
            return gr.Dropdown(choices=[], value=None), gr.Dropdown(choices=views.drafter_choices(None), value="off")
        try:
            user = self.user_token(oauth_token, token, required=False)
            manifest = list_variants(repo_id.strip(), self.settings.endpoint, user or False)
        except Exception as error:  # any failure is one line on the page
            raise gr.Error(failure_message(error, "variants", redact), print_exception=False) from None
        choices = views.variant_choices(manifest)
        return gr.Dropdown(choices=choices, value=choices[0][1]), gr.Dropdown(
            choices=views.drafter_choices(manifest), value="off"
        )

    def preview(
        self,
        repo_id,
        variant,
        prompt,
        max_new_tokens,
        chat,
        system,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        seed,
        token,
        image=None,
        audio=None,
        lookup=False,
        oauth_token: gr.OAuthToken | None = None,
    ) -> Iterator[tuple[str, str]]:
        """Download one variant and try it as its task does (generated text, embedded lines, filled masks, an image's
        labels); yields (text, line)."""
        job_id = uuid.uuid4().hex[:8]
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        text = ""  # kept: a failure shows what was generated before it
        try:
            sampling = service.sampling_from_form(temperature, top_p, top_k, repetition_penalty, seed)
            request = service.preview_request(
                repo_id, variant, prompt, max_new_tokens, chat, system, sampling, image, audio,
                self.settings.max_audio_seconds, lookup,
            )  # fmt: skip
            user = self.user_token(oauth_token, token, required=False)
            redact.add(user)
            started = time.monotonic()
            stage = f"downloading {request.variant or 'the first variant'} from {request.repo_id}"
            task = self._background(
                lambda folder, emit: service.preview(request, user, self.settings.endpoint, folder, emit), "preview"
            )
            for events in task.events(every=0.1):
                for kind, value in events:
                    text, stage = (text + value, stage) if kind == "text" else (text, redact(value))
                yield text, f"{RUNNING} {stage}… {clock(time.monotonic() - started)}"
            yield text, _speed_line(task.outcome())
        except Exception as error:  # any failure is one line on the page
            message = failure_message(error, job_id, redact)
            yield text, f"{FAILED} {message}"
            raise gr.Error(message, print_exception=False) from None


def _speed_line(
    result: GenerationResult | EmbedResult | FillMaskResult | ClassifyResult | TranscriptionResult | str,
) -> str:
    if isinstance(result, str):  # a text-to-text answer
        return f"{DONE} answered"
    if isinstance(result, FillMaskResult):
        return f"{DONE} {len(result.masks)} masks in {result.tokens} tokens · **{result.seconds * 1000:.0f} ms**"
    if isinstance(result, TranscriptionResult):
        return (f"{DONE} {result.audio_seconds:.1f} s of audio in {result.seconds:.2f} s · real-time factor "
                f"**{result.real_time_factor:.3f}**")  # fmt: skip
    if isinstance(result, ClassifyResult):
        return f"{DONE} labelled in **{result.seconds * 1000:.0f} ms**"
    if isinstance(result, EmbedResult):
        tokens = sum(result.tokens)
        return f"{DONE} embedded {len(result.tokens)} texts ({tokens} tokens) · **{result.texts_per_s:.0f} texts/s**"
    stops = {"eos": "end of text", "max_new_tokens": "max new tokens reached", "context_full": "context full"}
    figures = result.speculation
    drafter = "prompt lookup" if figures and figures.drafter == "lookup" else f"draft {figures and figures.drafter}"
    drafted = (
        f" · {drafter}: {figures.accepted} of {figures.proposed} proposals kept, "
        f"{figures.tokens_per_call(result.generated_tokens):.2f} tokens per call"
        if figures
        else ""
    )
    return (
        f"{DONE} prefill **{result.prefill_tokens_per_s:.0f} tok/s** ({result.prompt_tokens} prompt tokens) · "
        f"decode **{result.decode_tokens_per_s:.0f} tok/s** ({result.generated_tokens} new tokens) · "
        f"stopped: {stops.get(result.stop_reason, result.stop_reason)} · "
        f"chat template: {'used' if result.chat else 'not used'}{drafted}"  # ticked means "when the model has one"
    )
