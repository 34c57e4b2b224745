"""hub-export Space: export a Hugging Face causal LM to ExecuTorch, verify it, push it, try it.

A Gradio 6 front end over the ``hub_export`` library; every export, push, pull and
generation is a library call (``publish.push``, ``publish.list_variants``,
``publish.pull``, ``generate.generate``). What this file adds is what a web front end
needs and a CLI does not:

- whose token a job uses (:class:`AuthPolicy`, :meth:`Jobs.user_token`),
- live feedback: the library runs in a worker thread while the handler yields its
  progress messages, and a heartbeat every second, so a long stage never looks dead,
- one-line failures (a :class:`~hub_export.errors.HubExportError` message, or a generic
  line with a job id; never a traceback), with the Space ready for the next job,
- a private temp folder per job, removed afterwards whatever happened,
- a bounded queue with two lanes, each with its own concurrency limit: exports take
  minutes, previews seconds, so a preview never waits behind an export.

Run ``python space/app.py`` (see ``space/README.md`` for the environment variables), or
``make space`` for an offline demo against the local Hub.
"""

import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from hub_export import hub, publish
# quality_cell: the model card's own cell, so the Space's table and the card never disagree.
from hub_export.card import human_size, quality_cell
from hub_export.errors import HubError, HubExportError, InputError
from hub_export.redact import Redactor
from hub_export.generate import GenerationResult, Sampling, generate
from hub_export.manifest import Manifest, Variant, describe_quality, describe_verification
from hub_export.quantize import DEFAULT_GROUP_SIZE

log = logging.getLogger("hub_export.space")

QMODE_CHOICES = [
    ("fp32: no quantization (largest, exact)", "fp32"),
    ("8da4w: int8 activations, int4 weights (smallest, fastest)", "8da4w"),
    ("8da8w: int8 activations, int8 weights", "8da8w"),
    ("4w: float activations, int4 per-channel weights", "4w"),
    ("8w: float activations, int8 per-channel weights", "8w"),
]
EMBEDDING_CHOICES = [("none", "none"), ("4-bit", "4w"), ("8-bit", "8w")]
TABLE_HEADERS = [
    "file",
    "this job",
    "size",
    "max context",
    "verified",
    "verification",
    "perplexity (vs fp32)",
    "prefill tok/s",
    "decode tok/s",
]
MAX_NEW_TOKENS = 256
MAX_PROMPT_CHARS = 4000
# The Preview's prompt follows the chat checkbox while the user has not typed one:
# a question suits an instruction-tuned model, a story opening a base model.
CHAT_PROMPT, PLAIN_PROMPT = "What is the capital of France?", "Once upon a time"
HEARTBEAT_SECONDS = 1.0
# Words, not emoji: status lines are read by API clients and screen readers too.
RUNNING, DONE, FAILED, QUEUED = "**Running:**", "**Done:**", "**Failed:**", "**Queued:**"
# The library names options by their CLI flags; the Space names the form's fields and gives
# its own advice where the CLI's (a flag to pass) does not apply to a web form.
FIELD_LABELS = {
    "token": "your token",
    "source": "'Source model'",
    "revision": "'Revision'",
    "qmodes": "'Variants'",
    "qembedding": "'Embedding quantization'",
    "group_size": "'Group size'",
    "max_seq_len": "'Max sequence length'",
    "repo_id": "'Target repo'",
    "endpoint": "the Space's HF_ENDPOINT",
    "branch": "the revision",
    "max_new_tokens": "'Max new tokens'",
    "system": "'System message'",
    "temperature": "'Temperature'",
    "top_p": "'Top-p'",
    "top_k": "'Top-k'",
    "repetition_penalty": "'Repetition penalty'",
    "seed": "'Seed'",
}
SPACE_HINTS = {
    "login": "sign in again or paste a valid write token",
    "token_rejected": "sign in again or paste a valid write token",
    "read_only": "create a write token and use it here",
    "gated": "accept its conditions on the Hub, then retry with the token of an account that accepted them",
    "not_found": "check the id; for a private repo, use a token that can read it",
    "forbidden": "use a token with access to that repo, or choose a 'Target repo' in your own namespace",
    "other_source": "choose another 'Target repo'",
    "foreign_repo": "choose another 'Target repo'",
    "other_namespace": "choose a 'Target repo' in your own namespace",
    "no_chat_template": "untick 'Use the chat template' to send the prompt as is",
    "system_needs_chat": "tick 'Use the chat template', or clear the system message",
}


def field_label(name: str) -> str:
    """The form's name for a library option (``max_seq_len`` -> 'Max sequence length')."""
    return FIELD_LABELS.get(name, f"'{name.replace('_', ' ').capitalize()}'")


# -- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthPolicy:
    """Whose token a job may use.

    ``use_oauth``: the page shows "Sign in with Hugging Face" and jobs use the signed-in
    user's token. ``env_token_allowed``: a job without a user token may fall back to
    the server's ``HF_TOKEN`` (offline/local use only: on a public Space that would let
    every visitor act as the Space's owner).
    """

    use_oauth: bool
    env_token_allowed: bool
    description: str


def auth_policy(env: Mapping[str, str]) -> AuthPolicy:
    """The policy for this process, from the Space's environment.

    OAuth is available when the Space sets ``hf_oauth: true`` (Spaces then define
    ``OAUTH_CLIENT_ID``); with it, the server's ``HF_TOKEN`` is never used.
    ``HUB_EXPORT_SPACE_OFFLINE=1`` asks for offline mode explicitly; off a Space
    (no ``SPACE_ID``) offline mode is implied. A Space without OAuth and without the
    explicit switch takes only tokens that visitors paste.
    """
    oauth = bool(env.get("SPACE_ID") and env.get("OAUTH_CLIENT_ID"))
    offline = env.get("HUB_EXPORT_SPACE_OFFLINE", "").strip().lower() in ("1", "true", "yes")
    if oauth:
        if offline:
            log.warning("HUB_EXPORT_SPACE_OFFLINE is ignored: OAuth is available, so only user tokens are used")
        return AuthPolicy(True, False, "OAuth: jobs use the signed-in user's token")
    if offline or not env.get("SPACE_ID"):
        return AuthPolicy(False, True, "offline: jobs use the pasted token, else the server's HF_TOKEN")
    return AuthPolicy(False, False, "no OAuth: jobs use the token each visitor pastes")


def default_work_root() -> Path:
    """Where job folders go unless ``HUB_EXPORT_SPACE_WORKDIR`` says otherwise."""
    return Path(tempfile.gettempdir()) / "hub-export-space"


@dataclass(frozen=True)
class Settings:
    """Everything the app reads from its environment, resolved once at start-up."""

    endpoint: str
    auth: AuthPolicy
    concurrency: int = 1  # exports at once
    # Previews at once, in a lane of their own: a preview takes seconds and must not
    # wait behind someone's export, which takes minutes.
    preview_concurrency: int = 1
    queue_size: int = 8
    work_root: Path = field(default_factory=default_work_root)
    env_token: str | None = field(default=None, repr=False)  # never printed

    @property
    def allow_local_sources(self) -> bool:
        """Local folders as sources: on a public (OAuth) Space they would expose the server's disk."""
        return not self.auth.use_oauth


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"{name}={raw!r}: expected a whole number of at least 1")
    return int(raw)


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """:class:`Settings` from ``env`` (default: ``os.environ``); a bad value stops start-up with one line."""
    env = os.environ if env is None else env
    auth = auth_policy(env)
    work_root = env.get("HUB_EXPORT_SPACE_WORKDIR", "").strip()
    env_token = (env.get("HF_TOKEN") or "").strip() or None
    return Settings(
        endpoint=hub.resolve_endpoint(env.get("HF_ENDPOINT") or None),
        auth=auth,
        concurrency=_positive_int(env, "HUB_EXPORT_SPACE_CONCURRENCY", 1),
        preview_concurrency=_positive_int(env, "HUB_EXPORT_SPACE_PREVIEW_CONCURRENCY", 1),
        queue_size=_positive_int(env, "HUB_EXPORT_SPACE_QUEUE", 8),
        work_root=Path(work_root).expanduser() if work_root else default_work_root(),
        env_token=env_token if auth.env_token_allowed else None,
    )


# -- secrets and messages ---------------------------------------------------------------


def failure_message(error: BaseException, job_id: str, redact: Redactor) -> str:
    """The one line a user sees for ``error``; unexpected errors are logged with their traceback."""
    if isinstance(error, HubExportError):
        return redact(error.worded(field_label, SPACE_HINTS))
    if isinstance(error, gr.Error):
        return redact(error.message)
    if isinstance(error, MemoryError):
        return "the job ran out of memory; pick fewer variants, a shorter max sequence length or a smaller model"
    # Server-side only, for whoever runs the Space; the user gets a line and an id to quote.
    log.error("job %s failed:\n%s", job_id, redact("".join(traceback.format_exception(error))))
    return (
        f"the job failed unexpectedly ({type(error).__name__}); retry, and if it fails again report job "
        f"{job_id} (the details are in the Space's logs)"
    )


# -- running a library call in a worker thread ----------------------------------------------


Emit = Callable[[tuple[str, Any]], None]
WAITING = "waiting for a running job to finish (jobs take turns on the CPU)"


@contextmanager
def job_folder(root: Path, kind: str) -> Iterator[Path]:
    """A fresh folder under ``root`` for one job, removed afterwards, success or not."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Background:
    """Runs ``work(folder, emit)`` in a thread, in its own job folder and CPU slot.

    ``emit((kind, value))`` events are read back by :meth:`events`, so the handler can
    yield UI updates while the library works, and heartbeats while it is silent.

    The thread owns everything the job holds: it takes a slot from ``slots`` and
    creates the job folder, and gives both back when the library call returns. A
    handler whose client went away is closed by Gradio (in its event loop) and must not
    block; the work goes on without it (torch cannot be interrupted), still holding
    its slot, so a new job waits for it instead of overloading the CPU.
    """

    _DONE = object()

    def __init__(self, work: Callable[[Path, Emit], Any], *, slots: threading.Semaphore, root: Path, kind: str):
        self._work = work
        self._slots = slots
        self._root = root
        self._kind = kind
        self._queue: queue.Queue = queue.Queue()
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"hub-export-{kind}", daemon=True)

    def _run(self) -> None:
        try:
            if not self._slots.acquire(blocking=False):
                self._queue.put(("wait", WAITING))
                self._slots.acquire()
            try:
                with job_folder(self._root, self._kind) as folder:
                    self.result = self._work(folder, self._queue.put)
            finally:
                self._slots.release()
        except BaseException as error:  # noqa: BLE001 - handed to the handler, which reports it
            self.error = error
        finally:
            self._queue.put(self._DONE)  # last: the folder is gone and the slot free by now

    def events(self, heartbeat: float = HEARTBEAT_SECONDS) -> Iterator[list[tuple[str, Any]]]:
        """Batches of events as they come, ``[]`` after ``heartbeat`` s of silence; ends with the work."""
        self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=heartbeat)
            except queue.Empty:
                yield []
                continue
            batch = []
            while item is not self._DONE:
                batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                yield batch
            if item is self._DONE:
                return

    def outcome(self) -> Any:
        """The work's result, once :meth:`events` has ended; re-raises its exception."""
        if self.error is not None:
            raise self.error
        return self.result


def bar(fraction: float, width: int = 16) -> str:
    """A text progress bar: it lives in the status line, which stays readable when a job fails."""
    done = round(max(0.0, min(fraction, 1.0)) * width)
    return "▰" * done + "▱" * (width - done)


def clock(seconds: float) -> str:
    """``m:ss`` for a duration."""
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"


# -- views -------------------------------------------------------------------------------


@dataclass
class ExportView:
    """What the Export tab shows; :meth:`outputs` is the tuple the handler yields."""

    status: str = ""
    log_lines: list[str] = field(default_factory=list)
    link: str = ""
    rows: list[list[Any]] = field(default_factory=list)
    card: str = ""
    repo_id: str | None = None

    def outputs(self) -> tuple:
        table = pd.DataFrame(self.rows, columns=TABLE_HEADERS)
        return self.status, "\n".join(self.log_lines), self.link, table, self.card, self.repo_id


def variant_rows(manifest: Manifest, this_job: list[str]) -> list[list[Any]]:
    """One table row per variant in the repo: size, verification, quality and runner speed.

    The figures are worded by the library (a repo's manifest may come from another
    version, with figures missing): the same words as the CLI and the model card.
    """
    rows = []
    for variant in manifest.variants:
        check = variant.verification or {}
        verified = "yes" if check.get("passed") and not check.get("skipped") else "no"
        rows.append(
            [
                variant.file,
                "yes" if variant.file in this_job else "",
                human_size(variant.total_bytes),
                f"{variant.max_seq_len} tokens",
                verified,
                describe_verification(check),
                quality_cell(check.get("quality")),
                _figure(check.get("runner_prefill_tokens_per_s"), ".0f"),
                _figure(check.get("runner_decode_tokens_per_s"), ".0f"),
            ]
        )
    return rows


def _figure(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def card_markdown(text: str) -> str:
    """The card for display: its YAML front matter as a code block, then the Markdown body."""
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end != -1:
            front, body = text[4:end], text[end + 4 :].lstrip("\n")
            return f"```yaml\n{front}\n```\n\n{body}"
    return text


def variant_choices(manifest: Manifest) -> list[tuple[str, str]]:
    """Dropdown entries: label with size and context, value the file name (what ``pull`` takes)."""
    return [
        (f"{v.file} · {human_size(v.total_bytes)} · {v.max_seq_len} tokens", v.file) for v in manifest.variants
    ]


# -- the jobs ----------------------------------------------------------------------------


@dataclass
class ExportRequest:
    """The Export form, checked: what ``publish.push`` gets."""

    source: str
    revision: str | None
    qmodes: list[str]
    qembedding: str | None
    group_size: int
    max_seq_len: int | None
    repo_name: str
    private: bool

    @property
    def expected_steps(self) -> int:
        # push: checking, creating, uploading; export: resolving, loading, reference, then
        # quantizing, exporting, lowering, verifying per variant. Only drives the bar.
        return 6 + 4 * len(self.qmodes)


@dataclass
class Published:
    """What an export job returns from its worker: the push, and the repo as it now is."""

    result: publish.PushResult
    manifest: Manifest | None
    card: str
    read_error: str | None = None


def _whole(value: Any, label: str) -> int | None:
    """A whole number from a Number field or an API argument; blank or 0 means "default"."""
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{label} must be a whole number (got {value!r})") from None
    if number != int(number) or number < 0:
        raise InputError(f"{label} must be a positive whole number (got {value!r})")
    return int(number) or None


@dataclass(frozen=True)
class PreviewRequest:
    """The Preview form, checked."""

    repo_id: str
    variant: str | None
    prompt: str
    max_new_tokens: int
    chat: bool | None  # None: the chat template when the model has one (what ``generate`` takes)
    system: str | None = None
    sampling: Sampling = field(default_factory=Sampling)


def _number(value: Any, label: str, default: float, *, whole: bool = False) -> Any:
    """A number from a form field or an API argument (blank: ``default``); its range is ``Sampling.check``'s job."""
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{label} must be a number (got {value!r})") from None
    if not whole:
        return number
    if number != int(number):  # torch takes whole numbers only for these
        raise InputError(f"{label} must be a whole number (got {value!r})")
    return int(number)


def sampling_from_form(temperature: Any, top_p: Any, top_k: Any, repetition_penalty: Any, seed: Any) -> Sampling:
    """The Sampling fields as a :class:`Sampling` (unchecked: :func:`preview_request` checks it)."""
    default = Sampling()
    return Sampling(
        temperature=_number(temperature, "Temperature", default.temperature),
        top_p=_number(top_p, "Top-p", default.top_p),
        top_k=_number(top_k, "Top-k", default.top_k, whole=True),
        repetition_penalty=_number(repetition_penalty, "Repetition penalty", default.repetition_penalty),
        seed=_number(seed, "Seed", default.seed, whole=True),
    )


def preview_request(
    repo_id: str | None,
    variant: str | None,
    prompt: str | None,
    max_new_tokens: Any,
    chat: Any,
    system: str | None = None,
    sampling: Sampling | None = None,
) -> PreviewRequest:
    """Check the Preview form (and API arguments) before anything is downloaded."""
    repo_id = (repo_id or "").strip()
    if not repo_id:
        raise InputError("enter the repo to try, e.g. alice/SmolLM2-135M-ExecuTorch")
    publish.check_repo_id(repo_id)
    prompt = prompt or ""
    if not prompt.strip():
        raise InputError("type a prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"the prompt is {len(prompt)} characters; keep it under {MAX_PROMPT_CHARS}")
    limit = _whole(max_new_tokens, "Max new tokens") or 64
    if limit > MAX_NEW_TOKENS:
        raise InputError(f"Max new tokens is at most {MAX_NEW_TOKENS} here (got {limit})")
    sampling = sampling or Sampling()
    sampling.check()  # the library's rules and words; here, so a bad value fails before the download
    return PreviewRequest(
        repo_id,
        (variant or "").strip() or None,
        prompt,
        limit,
        # Ticked means "the template when the model has one", so the default works for base
        # models too; unticked sends the prompt as typed.
        None if chat else False,
        (system or "").strip() or None,
        sampling,
    )


class Jobs:
    """The handlers behind the buttons and the API endpoints, bound to :class:`Settings`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # Held by worker threads, not by Gradio's queue: a job whose page was closed keeps
        # its slot until the library returns, and the next job of its kind waits for it.
        # One lane per kind, as in Gradio's queue: a preview never waits for an export.
        self.lanes = {
            "export": threading.BoundedSemaphore(settings.concurrency),
            "preview": threading.BoundedSemaphore(settings.preview_concurrency),
        }

    # -- tokens and inputs

    def user_token(self, oauth_token: gr.OAuthToken | None, typed: str | None, *, required: bool) -> str | None:
        """The token a job acts with: OAuth, else the pasted one, else (offline only) ``HF_TOKEN``."""
        if oauth_token is not None and oauth_token.token:
            return oauth_token.token
        if typed and typed.strip():
            return typed.strip()
        if self.settings.auth.env_token_allowed and self.settings.env_token:
            return self.settings.env_token
        if required:
            raise HubError(self._sign_in_hint())
        return None

    def _sign_in_hint(self) -> str:
        if self.settings.auth.use_oauth:
            return "sign in with Hugging Face (button at the top of the page) so the Space can push to your account"
        extra = " or start the Space with HF_TOKEN set" if self.settings.auth.env_token_allowed else ""
        return f"paste a Hugging Face write token in the token field{extra}"

    def redactor(self, *tokens: str | None) -> Redactor:
        # HF_TOKEN too when unused: a Space secret must not leak through an echoed error.
        return Redactor(self.settings.env_token, os.environ.get("HF_TOKEN"), *tokens)

    def export_request(
        self, source, revision, variants, qembedding, group_size, max_seq_len, repo_name, private
    ) -> ExportRequest:
        """Check the form (and API arguments) before anything slow starts."""
        source = self._source(source)
        qmodes = list(dict.fromkeys(variants or []))
        if not qmodes:
            raise InputError("pick at least one variant to export")
        qembedding = None if qembedding in (None, "", "none") else str(qembedding)
        return ExportRequest(
            source=source,
            revision=(revision or "").strip() or None,
            qmodes=qmodes,
            qembedding=qembedding,
            group_size=_whole(group_size, "Group size") or DEFAULT_GROUP_SIZE,
            max_seq_len=_whole(max_seq_len, "Max sequence length"),
            repo_name=(repo_name or "").strip() or publish.default_repo_name(source),
            private=bool(private),
        )

    def _source(self, source: str | None) -> str:
        source = (source or "").strip()
        for prefix in (self.settings.endpoint + "/", "https://huggingface.co/"):
            if source.startswith(prefix):  # a pasted model page URL, maybe of a file or a branch
                source = "/".join(source[len(prefix) :].strip("/").split("/")[:2])
        if not source:
            raise InputError("enter the source model's id, e.g. HuggingFaceTB/SmolLM2-135M")
        looks_local = source.startswith(("/", ".", "~")) or Path(source).expanduser().is_dir()
        if looks_local and not self.settings.allow_local_sources:
            raise InputError(f"{source!r} is not a Hub model id; enter one like HuggingFaceTB/SmolLM2-135M")
        return source

    def target_repo(self, repo_name: str, token: str) -> str:
        """``namespace/name``: a bare name goes to the token owner's namespace."""
        if "/" in repo_name:
            return publish.check_repo_id(repo_name)
        from huggingface_hub import HfApi

        endpoint = self.settings.endpoint
        with hub.hub_errors("your account", endpoint, "identify", token):
            user = HfApi(endpoint=endpoint, token=token).whoami()
        return publish.check_repo_id(f"{user['name']}/{repo_name}")

    # -- Export

    def export(
        self,
        source: str,
        revision: str,
        variants: list[str],
        qembedding: str,
        group_size: float | None,
        max_seq_len: float | None,
        repo_name: str,
        private: bool,
        token: str,
        oauth_token: gr.OAuthToken | None = None,
        progress: gr.Progress = gr.Progress(),
    ) -> Iterator[tuple]:
        """Export ``source`` to ExecuTorch, verify it and push it; stream status and log.

        Yields (status, log, repo link, variants table, model card, repo id).
        """
        job_id = uuid.uuid4().hex[:8]
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        view = ExportView(status=f"{RUNNING} starting…")
        try:
            request = self.export_request(
                source, revision, variants, qembedding, group_size, max_seq_len, repo_name, private
            )
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

    def _export(
        self,
        request: ExportRequest,
        token: str,
        job_id: str,
        view: ExportView,
        redact: Redactor,
        progress: gr.Progress,
    ) -> Iterator[tuple]:
        repo_id = self.target_repo(request.repo_name, token)
        started = time.monotonic()
        say = _logger(view, started, redact)
        say(f"job {job_id}: {request.source} → {repo_id} ({', '.join(request.qmodes)})")
        log.info("export job %s: %s -> %s %s", job_id, request.source, repo_id, request.qmodes)
        progress(0, desc="starting")
        task = self._background(lambda folder, emit: self._publish(request, repo_id, token, folder, emit), "export")
        steps, stage = 0, "starting"
        for events in task.events():
            for kind, message in events:
                stage = redact(str(message))
                say(stage)
                steps += kind == "stage"
            fraction = min(steps / request.expected_steps, 0.99)
            progress(fraction, desc=stage)  # API clients see it in the job's status
            elapsed = clock(time.monotonic() - started)
            view.status = f"{RUNNING} `{bar(fraction)}` {elapsed} · {stage}"
            yield view.outputs()
        published: Published = task.outcome()
        self._show(view, published, say, redact)
        view.status = f"{DONE} {redact(published.result.summary)} · {clock(time.monotonic() - started)}"
        log.info("export job %s done: %s", job_id, published.result.summary)
        yield view.outputs()

    def _background(self, work: Callable[[Path, Emit], Any], kind: str) -> Background:
        """A worker for ``kind`` ("export" or "preview"), holding a slot of that kind's lane."""
        return Background(work, slots=self.lanes[kind], root=self.settings.work_root, kind=kind)

    def _publish(self, request: ExportRequest, repo_id: str, token: str, folder: Path, emit: Emit) -> Published:
        """In the worker: export and push, then read back what was published (table and card)."""
        result = publish.push(
            request.source,
            repo_id,
            qmodes=request.qmodes,
            qembedding=request.qembedding,
            group_size=request.group_size,
            max_seq_len=request.max_seq_len,
            revision=request.revision,
            trust_remote_code=False,  # never: a Space must not run code from the models it converts
            private=request.private,
            output_dir=folder / "export",
            cache_dir=folder / "downloads",  # removed with the job folder: the Space's disk does not grow
            token=token,
            endpoint=self.settings.endpoint,
            progress=lambda message: emit(("stage", message)),
        )
        revision = result.commit_oid  # what this job published, even if the repo moved on since
        try:
            manifest = publish.list_variants(result.repo_id, self.settings.endpoint, token, revision=revision)
            card = self._read_card(result.repo_id, revision, token, folder)
        except HubExportError as error:  # the push is done: report, do not fail the job
            return Published(result, None, "", str(error))
        return Published(result, manifest, card)

    def _read_card(self, repo_id: str, revision: str | None, token: str, folder: Path) -> str:
        from huggingface_hub import hf_hub_download

        endpoint = self.settings.endpoint
        with hub.hub_errors(repo_id, endpoint, "read", token):
            path = hf_hub_download(
                repo_id, publish.CARD_NAME, revision=revision, endpoint=endpoint, token=token, local_dir=folder / "card"
            )
        return Path(path).read_text(encoding="utf-8")

    @staticmethod
    def _show(view: ExportView, published: Published, say: Callable[[str], None], redact: Redactor) -> None:
        """Link, variants table and card, as published."""
        result = published.result
        say(result.summary)
        for note in result.notes:
            say(f"note: {note}")
        view.repo_id = result.repo_id
        view.link = f"### Your model: [{result.repo_id}]({result.url})\nTry it in the **Preview** tab."
        if result.pr_url:
            view.link += f"\n\nPull request: [{result.pr_url}]({result.pr_url})"
        if published.manifest is not None:
            view.rows = variant_rows(published.manifest, result.files)
            view.card = card_markdown(published.card)
            for variant in published.manifest.variants:
                if variant.file in result.files:
                    say(_verification_line(variant))
        if published.read_error:
            say(f"pushed, but reading it back failed: {redact(published.read_error)}")

    # -- Preview

    def variants(self, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None) -> gr.Dropdown:
        """The repo's variants for the Preview dropdown (first one selected)."""
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        repo_id = (repo_id or "").strip()
        if not repo_id:
            return gr.Dropdown(choices=[], value=None)
        try:
            user = self.user_token(oauth_token, token, required=False)
            manifest = publish.list_variants(repo_id, self.settings.endpoint, user or False)
        except Exception as error:  # noqa: BLE001
            raise gr.Error(failure_message(error, "variants", redact), print_exception=False) from None
        choices = variant_choices(manifest)
        return gr.Dropdown(choices=choices, value=choices[0][1])

    def preview(
        self,
        repo_id: str,
        variant: str | None,
        prompt: str,
        max_new_tokens: float,
        chat: bool,
        system: str,
        temperature: float,
        top_p: float,
        top_k: float,
        repetition_penalty: float,
        seed: float,
        token: str,
        oauth_token: gr.OAuthToken | None = None,
    ) -> Iterator[tuple[str, str]]:
        """Download one variant and stream generated text; yields (text, speed line)."""
        job_id = uuid.uuid4().hex[:8]
        redact = self.redactor(token, oauth_token.token if oauth_token else None)
        text = ""  # kept: a failure shows what was generated before it
        try:
            sampling = sampling_from_form(temperature, top_p, top_k, repetition_penalty, seed)
            request = preview_request(repo_id, variant, prompt, max_new_tokens, chat, system, sampling)
            user = self.user_token(oauth_token, token, required=False)
            redact.add(user)
            for text, status in self._preview(request, user, job_id, redact):
                yield text, status
        except Exception as error:  # noqa: BLE001 - every failure becomes one line
            message = failure_message(error, job_id, redact)
            yield text, f"{FAILED} {message}"
            raise gr.Error(message, print_exception=False) from None

    def _preview(
        self, request: PreviewRequest, token: str | None, job_id: str, redact: Redactor
    ) -> Iterator[tuple[str, str]]:
        started = time.monotonic()
        text, stage = "", f"downloading {request.variant or 'the first variant'} from {request.repo_id}"
        task = self._background(lambda folder, emit: self._generate(request, token, folder, emit), "preview")
        for events in task.events():
            for kind, value in events:
                if kind == "text":
                    text += value
                else:
                    stage = redact(value)
            yield text, f"{RUNNING} {stage}… {clock(time.monotonic() - started)}"
        yield text, _speed_line(task.outcome())

    def _generate(self, request: PreviewRequest, token: str | None, folder: Path, emit: Emit) -> GenerationResult:
        """Pull the variant into ``folder`` and generate; emits ("stage", line) and ("text", piece)."""
        # token=False, not None: never fall back to a login stored on the server.
        files = publish.pull(
            request.repo_id, request.variant, output_dir=folder, endpoint=self.settings.endpoint, token=token or False
        )
        manifest = Manifest.read(files)
        chosen = manifest.variant(request.variant) if request.variant else manifest.variants[0]
        emit(("stage", f"generating with {chosen.file}"))
        return generate(
            files / chosen.file,
            files,
            request.prompt,
            max_new_tokens=request.max_new_tokens,
            sampling=request.sampling,
            chat=request.chat,
            system=request.system,
            on_text=lambda piece: emit(("text", piece)),
        )


def _verification_line(variant: Variant) -> str:
    """``model-8da4w.pte: verified KL …, top-1 … vs eager; ppl … (…x fp32), …`` for the log."""
    check = variant.verification or {}
    quality = describe_quality(check)
    return f"{variant.file}: verified {describe_verification(check)}" + (f"; {quality}" if quality else "")


def _speed_line(result: GenerationResult) -> str:
    stops = {"eos": "end of text", "max_new_tokens": "max new tokens reached", "context_full": "context full"}
    return (
        f"{DONE} prefill **{result.prefill_tokens_per_s:.0f} tok/s** ({result.prompt_tokens} prompt tokens) · "
        f"decode **{result.decode_tokens_per_s:.0f} tok/s** ({result.generated_tokens} new tokens) · "
        f"stopped: {stops.get(result.stop_reason, result.stop_reason)} · "
        # The checkbox means "when the model has one": say whether it had.
        f"chat template: {'used' if result.chat else 'not used'}"
    )


def _logger(view: ExportView, started: float, redact: Redactor) -> Callable[[str], None]:
    def say(message: str) -> None:
        view.log_lines.append(f"[{clock(time.monotonic() - started)}] {redact(message)}")

    return say


# -- the page -----------------------------------------------------------------------------

INTRO = """\
# hub-export · Hugging Face → ExecuTorch

Export a causal language model to [ExecuTorch](https://github.com/pytorch/executorch) `.pte` files
for phones and laptops (XNNPACK), **verified** against the original model, and push them with a model card
to a repo in your account. Then try them in the **Preview** tab.
"""


def _access_row(settings: Settings) -> gr.Textbox:
    """Sign-in button (OAuth) or token field (offline); returns the token field (an API parameter either way)."""
    with gr.Row(equal_height=True):
        if settings.auth.use_oauth:
            gr.LoginButton(scale=0, min_width=260)
            gr.Markdown("Jobs act as **you**: the Space pushes to your account with your sign-in, never its own token.")
        # Visible text, not only a placeholder: a placeholder vanishes once typed in and is faint.
        info = "A write token, used for this job only; never stored or shown in the log."
        if settings.auth.env_token_allowed:
            info += " Blank: the server's HF_TOKEN."
        return gr.Textbox(
            "",
            label="Hugging Face token",
            type="password",
            placeholder="hf_…",
            visible=not settings.auth.use_oauth,
            info=info,
            scale=3,
        )


def _export_tab(settings: Settings) -> dict[str, Any]:
    ui: dict[str, Any] = {}
    with gr.Row():
        ui["source"] = gr.Textbox(
            label="Source model",
            placeholder="HuggingFaceTB/SmolLM2-135M"
            + (" or a local folder" if settings.allow_local_sources else ""),
            info="A transformers causal LM with safetensors weights; remote code is refused.",
            scale=3,
        )
        ui["revision"] = gr.Textbox("", label="Revision", placeholder="main", info="Branch, tag or commit.", scale=1)
    with gr.Row():
        ui["variants"] = gr.CheckboxGroup(
            QMODE_CHOICES,
            value=["8da4w"],
            label="Variants",
            info="One .pte file each; every one is verified.",
            elem_id="export-variants",
        )
        ui["qembedding"] = gr.Radio(
            EMBEDDING_CHOICES,
            value="none",
            label="Embedding quantization",
            info="Shrinks large vocabularies.",
            elem_id="export-embedding",
        )
    with gr.Row():
        ui["group_size"] = gr.Number(
            DEFAULT_GROUP_SIZE, label="Group size", precision=0, minimum=1, info="For int4 weights (8da4w)."
        )
        ui["max_seq_len"] = gr.Number(
            0,
            label="Max sequence length",
            precision=0,
            minimum=0,
            info="Prompt + generated tokens; 0: the model's limit, at most 2048.",
        )
    with gr.Row(equal_height=True):
        ui["repo_name"] = gr.Textbox(
            "",
            label="Target repo",
            placeholder="{source name}-ExecuTorch",
            info="A name in your namespace, or namespace/name (an org you can write to).",
            scale=3,
        )
        ui["private"] = gr.Checkbox(label="Private", value=False, scale=1)
    ui["run"] = gr.Button("Export & push", variant="primary")
    ui["status"] = gr.Markdown("Fill in the form and press **Export & push**.", label="Status", elem_id="export-status")
    ui["log"] = gr.Textbox(
        label="Log", lines=12, max_lines=12, autoscroll=True, interactive=False, buttons=["copy"], elem_id="export-log"
    )
    ui["link"] = gr.Markdown(label="Repo link", elem_id="export-link")
    ui["table"] = gr.Dataframe(
        headers=TABLE_HEADERS, label="Variants in the repo", interactive=False, wrap=True, elem_id="export-table"
    )
    with gr.Accordion("Model card", open=False):
        ui["card"] = gr.Markdown(label="Model card")
    ui["pushed"] = gr.State(None)
    return ui


def _preview_tab() -> dict[str, Any]:
    ui: dict[str, Any] = {}
    with gr.Row(equal_height=True):
        ui["repo"] = gr.Textbox(label="Repo", placeholder="alice/SmolLM2-135M-ExecuTorch", scale=3)
        ui["variant"] = gr.Dropdown(
            label="Variant", choices=[], value="", allow_custom_value=True, scale=2, info="Blank: the first one."
        )
        ui["refresh"] = gr.Button("↻ Variants", scale=0, min_width=120)
    ui["prompt"] = gr.Textbox(label="Prompt", value=CHAT_PROMPT, lines=3, max_length=MAX_PROMPT_CHARS)
    with gr.Row(equal_height=True):
        ui["chat"] = gr.Checkbox(
            label="Use the chat template",
            value=True,
            info="The model's own, when it has one: the prompt goes in as a user message.",
            scale=1,
        )
        ui["system"] = gr.Textbox(
            "", label="System message", placeholder="optional; needs the chat template", lines=1, scale=3
        )
    ui["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS, value=48, step=1, label="Max new tokens")
    ui.update(_sampling_controls())
    ui["run"] = gr.Button("Generate", variant="primary")
    ui["text"] = gr.Textbox(
        label="Generated text", lines=8, interactive=False, buttons=["copy"], elem_id="preview-text"
    )
    ui["stats"] = gr.Markdown(label="Status and speed", elem_id="preview-stats")
    return ui


def _sampling_controls() -> dict[str, Any]:
    """Sampling fields, greedy by default (the output then depends on the model only)."""
    default = Sampling()
    ui: dict[str, Any] = {}
    with gr.Accordion("Sampling", open=False):
        with gr.Row():
            ui["temperature"] = gr.Slider(
                0, 2, value=default.temperature, step=0.05, label="Temperature", info="0: greedy (the likeliest token)."
            )
            ui["top_p"] = gr.Slider(0.05, 1, value=default.top_p, step=0.05, label="Top-p", info="1: off.")
        with gr.Row():
            ui["top_k"] = gr.Number(default.top_k, label="Top-k", precision=0, minimum=0, info="0: off.")
            ui["repetition_penalty"] = gr.Slider(
                0.5, 2, value=default.repetition_penalty, step=0.05, label="Repetition penalty", info="1: off."
            )
            ui["seed"] = gr.Number(default.seed, label="Seed", precision=0, minimum=0, info="Same seed, same text.")
    return ui


# Accessible names Gradio leaves out, by elem_id: a checkbox or radio group is a fieldset
# without a legend, and an output textbox's label is taken by its Copy button.
ACCESSIBLE_NAMES = {
    "export-variants": "Variants",
    "export-embedding": "Embedding quantization",
    "export-log": "Log",
    "preview-text": "Generated text",
}
# Gradio renders output textboxes disabled: unnamed, skipped by Tab, and their text cannot be
# selected from the keyboard. Read-only keeps them uneditable but reachable. A mutation
# observer, because Gradio renders (and re-renders) the page after this script runs.
PAGE_SCRIPT = """<script>
(() => {
  const names = %s;
  const fix = () => {
    for (const [id, name] of Object.entries(names)) {
      const block = document.getElementById(id);
      const field = block && (block.matches("fieldset") ? block : block.querySelector("textarea, input"));
      if (!field) continue;
      if (field.getAttribute("aria-label") !== name) field.setAttribute("aria-label", name);
      if (field.disabled && field.tagName !== "FIELDSET") {
        field.disabled = false;
        field.readOnly = true;
      }
    }
  };
  new MutationObserver(fix).observe(document.documentElement, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["disabled"],
  });
})();
</script>""" % json.dumps(ACCESSIBLE_NAMES)
# Gradio prefixes these selectors with its own container (plain ones inside @media only with it).
PAGE_CSS = """
/* WCAG AA (4.5:1) for hints and placeholders: Gradio's greys give about 2.5:1 and 1.9:1. */
.gradio-container { --input-placeholder-color: #71717a; --block-info-text-color: #71717a; }
.dark .gradio-container { --input-placeholder-color: #bbbbc2; --block-info-text-color: #bbbbc2; }
/* Words wrap between words, never inside one (the table's headers broke as f/i/l/e). */
.gradio-container, .gradio-container * { word-break: normal; overflow-wrap: break-word; hyphens: manual; }
/* The variants table's cells wrap between words only, and the table scrolls in its own box. */
#export-table th *, #export-table td * { word-break: normal !important; overflow-wrap: normal !important; }
#export-table .table-wrap { overflow-x: auto; max-width: 100%; }
/* A phone: one column (Gradio keeps two fields side by side down to 160 px each), and table
   cells on one line each, scrolled, rather than columns a few letters wide. */
@media (max-width: 640px) {
  .row, .row > .form { flex-direction: column !important; flex-wrap: nowrap !important; }
  .row > *, .row > .form > * { width: 100% !important; min-width: 0 !important; }
  #export-table th, #export-table td, #export-table th *, #export-table td * { white-space: nowrap !important; }
}
"""


API_NOTE = """\
---
This Space is also an HTTP API (`/export`, `/preview`; see **Use via API** below and the README).
With OAuth, API callers pass their token as `Client(..., oauth_token="hf_...")`; otherwise as the `token` parameter.
"""


# Gradio's run history would keep every job's inputs, the token field included, in the
# browser (or a Hub bucket): off. The footer keeps the API docs link.
# (Gradio 6 takes the page's CSS and head at launch.)
LAUNCH_OPTIONS: dict[str, Any] = {
    "run_history": False,
    "footer_links": ["api", "gradio"],
    "css": PAGE_CSS,
    "head": PAGE_SCRIPT,
}


def build_app(settings: Settings | None = None) -> gr.Blocks:
    """The Space's Blocks, with its queue configured; launch with ``.launch(**LAUNCH_OPTIONS)``."""
    settings = settings or settings_from_env()
    jobs = Jobs(settings)
    # No analytics: the app should call no one but the Hub it works with.
    with gr.Blocks(title="hub-export: Hugging Face → ExecuTorch", analytics_enabled=False) as app:
        gr.Markdown(INTRO)
        token = _access_row(settings)
        with gr.Tabs():
            with gr.Tab("Export", id="export"):
                ex = _export_tab(settings)
            with gr.Tab("Preview", id="preview"):
                pv = _preview_tab()
        gr.Markdown(API_NOTE)

        ex["source"].change(_default_name, ex["source"], ex["repo_name"], api_visibility="private", queue=False)
        export_inputs = [
            ex["source"], ex["revision"], ex["variants"], ex["qembedding"], ex["group_size"],
            ex["max_seq_len"], ex["repo_name"], ex["private"], token,
        ]  # fmt: skip
        export_outputs = [ex["status"], ex["log"], ex["link"], ex["table"], ex["card"], ex["pushed"]]
        # Feedback at once, outside the queue: the old results go and the job shows as queued
        # until a slot frees (the job's own first update replaces that line).
        ex["run"].click(
            _export_queued, None, export_outputs[:5], api_visibility="private", queue=False
        ).then(
            jobs.export,
            export_inputs,
            export_outputs,
            api_name="export",
            concurrency_id="exports",
            concurrency_limit=settings.concurrency,
            # Gradio's overlay would cover the status line with an "Error" badge on failure;
            # the status line carries its own bar instead.
            show_progress="hidden",
        ).success(_fill_preview, ex["pushed"], pv["repo"], api_visibility="private", queue=False).then(
            jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private"
        )
        pv["refresh"].click(jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private")
        pv["repo"].submit(jobs.variants, [pv["repo"], token], pv["variant"], api_visibility="private")
        pv["chat"].change(
            _default_prompt, [pv["chat"], pv["prompt"]], pv["prompt"], api_visibility="private", queue=False
        )
        preview_inputs = [
            pv["repo"], pv["variant"], pv["prompt"], pv["max_new_tokens"], pv["chat"], pv["system"],
            pv["temperature"], pv["top_p"], pv["top_k"], pv["repetition_penalty"], pv["seed"], token,
        ]  # fmt: skip
        pv["run"].click(_preview_queued, None, [pv["text"], pv["stats"]], api_visibility="private", queue=False).then(
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


def _export_queued() -> tuple:
    """The Export outputs at the click: cleared, with a status saying the job is on its way."""
    return ExportView(status=f"{QUEUED} starting as soon as an export slot is free…").outputs()[:5]


def _preview_queued() -> tuple[str, str]:
    """The Preview outputs at the click: the old answer gone, and a sign that work started."""
    return "", f"{QUEUED} generating as soon as a preview slot is free…"


def _default_name(source: str) -> str | Any:
    """Prefill the target repo from the source (a repo id or a folder)."""
    source = (source or "").strip()
    return publish.default_repo_name(source) if source else gr.skip()


def _default_prompt(chat: bool, prompt: str) -> str | Any:
    """Swap the default prompt for the other one when chat is toggled; a typed prompt stays."""
    if prompt not in (CHAT_PROMPT, PLAIN_PROMPT):
        return gr.skip()
    return CHAT_PROMPT if chat else PLAIN_PROMPT


def _fill_preview(repo_id: str | None) -> str | Any:
    return repo_id if repo_id else gr.skip()


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
