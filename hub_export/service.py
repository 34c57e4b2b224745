"""Export as a service: what a web front end needs around the library calls.

The bundled Space (``space/app.py``) is a Gradio page and its sign-in over this module:

- **requests** checked from form values or HTTP API arguments (:func:`export_request`,
  :func:`preview_request`), before anything slow starts;
- **jobs** that run a library call in a thread, each in its own temporary folder and
  CPU slot, reporting events the page can show while it waits (:class:`BackgroundJob`);
- **the work itself**: export, push and read back what was published
  (:func:`publish_and_read_back`); pull a variant and stream text from it (:func:`preview`);
- **views** in the library's words: the variants table, the dropdown, the card as
  Markdown, one line per failure.

Example:
    >>> request = export_request("https://huggingface.co/HuggingFaceTB/SmolLM2-135M/tree/main",
    ...                          {"qmodes": ["8da4w"], "qembedding": "8w", "max_seq_len": 256}, "", False,
    ...                          endpoint="https://huggingface.co")
    >>> request.source, request.options.qmodes, request.repo_name
    ('HuggingFaceTB/SmolLM2-135M', ('8da4w',), 'SmolLM2-135M-ExecuTorch')
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_export.errors import HubExportError, InputError, Namer, cli_name, opt
from hub_export.hub.api import check_repo_id, default_repo_name, read_card
from hub_export.hub.card import task_of
from hub_export.hub.pull import list_variants, pull
from hub_export.hub.push import PushResult, push
from hub_export.media.files import open_regular
from hub_export.options import FORM_NONE, ExportOptions, form_fields, form_kind
from hub_export.pipeline.manifest import FILE_NAME, Manifest
from hub_export.progress import clock
from hub_export.redact import Redactor
from hub_export.tasks.fill_mask.run import FillMaskResult, fill_mask
from hub_export.tasks.image_classification.run import ClassifyResult, classify
from hub_export.tasks.sentence_embeddings.run import EmbedResult, embed
from hub_export.tasks.speech.run import TranscriptionResult, stream_transcribe
from hub_export.tasks.text_generation.run import GenerationResult, Sampling, stream_generate

log = logging.getLogger(__name__)

MAX_NEW_TOKENS = 256
MAX_PROMPT_CHARS = 4000
MAX_AUDIO_SECONDS = 300  # of a preview's recording: the Space's default (HUB_EXPORT_SPACE_MAX_AUDIO_SECONDS)
MAX_UPLOAD_BYTES = 50 << 20  # a preview's image or recording, checked before it is decoded


# -- requests -------------------------------------------------------------------------------


def number(value: Any, label: str, default: Any, *, whole: bool = False) -> Any:
    """A number from a form field or an API argument (blank: ``default``); its range is the library's to check."""
    if value in (None, ""):
        return default
    try:
        parsed = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{label} must be a {'whole ' if whole else ''}number (got {value!r})") from None
    if whole and parsed != int(parsed):  # torch takes whole numbers only for these
        raise InputError(f"{label} must be a whole number (got {value!r})")
    return int(parsed) if whole else parsed


def whole_number(value: Any, label: str) -> int | None:
    """A whole number from a form field or an API argument; blank or 0 means "default" (None)."""
    parsed = number(value, label, None, whole=True)
    if parsed is not None and parsed < 0:
        raise InputError(f"{label} must be a positive whole number (got {value!r})")
    return parsed or None


def source_id(text: str | None, endpoint: str, *, allow_local: bool) -> str:
    """The source a user typed: a repo id, a pasted model page URL (of a file or a branch too), or a folder.

    ``allow_local`` is False on a public service: a path would expose the server's disk.
    """
    source = (text or "").strip()
    for prefix in (endpoint.rstrip("/") + "/", "https://huggingface.co/"):
        if source.startswith(prefix):
            source = "/".join(source[len(prefix) :].strip("/").split("/")[:2])
    if not source:
        raise InputError("enter the source model's id, e.g. HuggingFaceTB/SmolLM2-135M")
    looks_local = source.startswith(("/", ".", "~")) or Path(source).expanduser().is_dir()
    if looks_local and not allow_local:
        raise InputError(f"{source!r} is not a Hub model id; enter one like HuggingFaceTB/SmolLM2-135M")
    return source


@dataclass(frozen=True)
class ExportRequest:
    """A checked export form: what to build, from what, into which repo."""

    source: str
    options: ExportOptions
    repo_name: str  # a name (the user's namespace) or namespace/name
    private: bool = False


def options_from_form(values: Mapping[str, Any]) -> ExportOptions:
    """The one :class:`ExportOptions` of an export form's values (or the same HTTP API arguments).

    ``values`` are keyed by option name (those of :func:`~hub_export.options.form_fields`);
    an option left out keeps its default. Each value is read by its option's kind
    (:func:`~hub_export.options.form_kind`), then the library checks them all, so the
    form refuses exactly what the CLI refuses, in the same words with the form's labels.
    A service never runs code from the models it converts: ``trust_remote_code`` stays off.

    Raises:
        InputError: a value the library refuses, naming the option (``param``).
    """
    chosen = {spec.name: _form_value(spec, values[spec.name]) for spec in form_fields() if spec.name in values}
    return ExportOptions(**chosen, trust_remote_code=False)


def shown_default(spec: dataclasses.Field) -> Any:
    """What a form shows for the default of option ``spec``; :func:`options_from_form` reads it back as the default.

    A number box cannot be blank, so a number option whose default is None ("the
    library decides") shows 0, and 0 reads back as None.
    """
    kind, default = form_kind(spec), spec.default
    if kind == "several":
        return list(default)
    if kind == "one":
        return FORM_NONE if default is None else default
    if kind in ("whole", "number"):
        return 0 if default is None else default
    if kind == "file":
        return None  # nothing uploaded
    return "" if default is None else default


def _form_value(spec: dataclasses.Field, value: Any) -> Any:
    """One form value as option ``spec`` takes it; blank means its default (see :func:`shown_default`)."""
    kind, default = form_kind(spec), spec.default
    if kind == "several":
        picked = tuple(dict.fromkeys(value or []))  # a double tick is one pick
        if not picked:
            raise InputError(f"pick at least one of {opt(spec.name)}", param=spec.name)
        return picked
    if kind in ("whole", "number"):
        parsed = number(value, opt(spec.name), default, whole=kind == "whole")
        return None if parsed == 0 and default is None else parsed
    if kind == "flag":
        return default if value is None else bool(value)
    if kind == "file":
        return _uploaded_file(spec, value)
    text = "" if value is None else str(value).strip()
    if kind == "one" and text == FORM_NONE and None in dict(spec.metadata["form"].choices).values():
        return None
    return text or default


def _uploaded_file(spec: dataclasses.Field, value: Any) -> str | None:
    """The path of a file the user uploaded for option ``spec``, or None when none was.

    The web framework hands the form a path in its upload folder, under the system's temporary folder; a path
    anywhere else (an API caller naming a server file) is refused, so a request cannot make the service read, or
    record the digest of, a file of the machine's own.
    """
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    path = Path(text).resolve()
    root = Path(tempfile.gettempdir()).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise InputError(f"{opt(spec.name)}: upload the file through the form", param=spec.name)
    if path.suffix.lower() not in spec.metadata["form"].upload:
        allowed = " or ".join(spec.metadata["form"].upload)
        raise InputError(f"{opt(spec.name)}: upload a {allowed} file (got {path.suffix or 'no suffix'})",
                         param=spec.name)  # fmt: skip
    return str(path)


def export_request(
    source: Any, options: Mapping[str, Any], repo_name: Any, private: Any, *, endpoint: str, allow_local: bool = False
) -> ExportRequest:
    """Check an export form (or the same API arguments) into an :class:`ExportRequest`.

    ``options``: the form's option values by name (see :func:`options_from_form`).
    """
    source = source_id(source, endpoint, allow_local=allow_local)
    options = options_from_form(options)
    name = str(repo_name or "").strip() or default_repo_name(source)
    return ExportRequest(source, options, name, bool(private))


@dataclass(frozen=True)
class PreviewRequest:
    """A checked preview form."""

    repo_id: str
    variant: str | None
    prompt: str
    max_new_tokens: int
    chat: bool | None  # None: the chat template when the model has one (what ``generate`` takes)
    system: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    image: str | None = None  # an uploaded image's path, for an image-classification repo
    audio: str | None = None  # an uploaded recording's path, for a speech-recognition repo
    max_audio_seconds: float = MAX_AUDIO_SECONDS  # of a recording, transcribed
    lookup: bool = False  # several tokens per step from the prompt's n-grams (a file with forward_rows)
    draft: str | None = None  # or from another variant of the repo: its file name, a path once pulled


def sampling_from_form(temperature: Any, top_p: Any, top_k: Any, repetition_penalty: Any, seed: Any) -> Sampling:
    """Sampling fields as a :class:`~hub_export.tasks.text_generation.run.Sampling` (checked by :func:`preview_request`)."""
    default = Sampling()
    return Sampling(
        temperature=number(temperature, "Temperature", default.temperature),
        top_p=number(top_p, "Top-p", default.top_p),
        top_k=number(top_k, "Top-k", default.top_k, whole=True),
        repetition_penalty=number(repetition_penalty, "Repetition penalty", default.repetition_penalty),
        seed=number(seed, "Seed", default.seed, whole=True),
    )


def preview_request(
    repo_id: str | None,
    variant: str | None,
    prompt: str | None,
    max_new_tokens: Any,
    chat: Any,
    system: str | None = None,
    sampling: Sampling | None = None,
    image: str | None = None,
    audio: str | None = None,
    max_audio_seconds: float = MAX_AUDIO_SECONDS,
    lookup: Any = False,
) -> PreviewRequest:
    """Check a preview form (and API arguments) before anything is downloaded.

    ``chat`` ticked means "the template when the model has one", so the default works for
    base models too; unticked sends the prompt as typed. ``lookup``: how several tokens are proposed per step
    (:func:`drafter_choice`).
    """
    repo_id = (repo_id or "").strip()
    if not repo_id:
        raise InputError("enter the repo to try, e.g. alice/SmolLM2-135M-ExecuTorch")
    check_repo_id(repo_id)
    prompt = prompt or ""
    if not prompt.strip() and not image and not audio:
        raise InputError("type a prompt (or upload an image or a recording, for a repo that takes one)")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"the prompt is {len(prompt)} characters; keep it under {MAX_PROMPT_CHARS}")
    limit = whole_number(max_new_tokens, "Max new tokens") or 64
    if limit > MAX_NEW_TOKENS:
        raise InputError(f"Max new tokens is at most {MAX_NEW_TOKENS} here (got {limit})")
    sampling = sampling or Sampling()
    sampling.check()  # the library's rules and words; here, so a bad value fails before the download
    for upload, what in ((image, "image"), (audio, "audio")):
        if upload:
            _check_upload(upload, what)
    lookup, draft = drafter_choice(lookup)
    return PreviewRequest(repo_id, (variant or "").strip() or None, prompt, limit, None if chat else False,
                          (system or "").strip() or None, sampling, image or None, audio or None, max_audio_seconds,
                          lookup, draft)  # fmt: skip


def drafter_choice(value: Any) -> tuple[bool, str | None]:
    """The preview's "several tokens per step" field as (lookup, draft variant): off (False, "", "off"), prompt
    lookup (True, "lookup") or another variant of the repo drafting ("draft:FILE")."""
    if value is True or value == "lookup":
        return True, None
    if isinstance(value, str) and value.startswith("draft:") and FILE_NAME.fullmatch(value[6:]):
        return False, value[6:]
    if value in (False, None, "", "off"):
        return False, None
    raise InputError(f"several tokens per step is off, lookup or draft:FILE of the repo (got {str(value)[:40]!r})")


def _check_upload(path: str, what: str) -> None:
    """An uploaded file: a regular file of at most :data:`MAX_UPLOAD_BYTES` (its content is checked as it is read)."""
    with open_regular(path, what) as file:
        size = os.fstat(file.fileno()).st_size
    if size > MAX_UPLOAD_BYTES:
        raise InputError(f"the {what} is {size / 2**20:.0f} MB; upload at most {MAX_UPLOAD_BYTES >> 20} MB here")


# -- jobs -------------------------------------------------------------------------------------


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


class BackgroundJob:
    """Runs ``work(folder, emit)`` in a thread, in its own job folder and CPU slot.

    ``emit((kind, value))`` events are read back by :meth:`events`, so a page handler can
    show the library's progress while it works, and a heartbeat while it is silent.

    The thread owns everything the job holds: it takes a slot from ``slots`` and
    creates the job folder, and gives both back when the library call returns. A
    handler whose client went away is closed (by Gradio, in its event loop) and must not
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
        except BaseException as error:  # handed to the handler, which reports it
            self.error = error
        finally:
            self._queue.put(self._DONE)  # last: the folder is gone and the slot free by now

    def events(self, heartbeat: float = 1.0, every: float = 0.0) -> Iterator[list[tuple[str, Any]]]:
        """Batches of events as they come, ``[]`` after ``heartbeat`` s of silence; ends with the work.

        ``every``: a batch at most that often (seconds). A page that redraws on every
        streamed token takes the interpreter from the generation it shows; ten redraws a
        second read the same and leave it alone.
        """
        import time

        self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=heartbeat)
            except queue.Empty:
                yield []
                continue
            batch, due = [], time.monotonic() + every
            while item is not self._DONE:
                batch.append(item)
                try:
                    wait = due - time.monotonic()
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
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


# -- the work ------------------------------------------------------------------------------------


@dataclass
class Published:
    """What an export job returns: the push, and the repo as it now is (table and card)."""

    result: PushResult
    manifest: Manifest | None
    card: str
    read_error: HubExportError | None = None


def publish_and_read_back(
    request: ExportRequest, repo_id: str, token: str, endpoint: str, folder: Path, emit: Emit, engine: Any = None
) -> Published:
    """Export and push ``request`` with downloads and the export inside ``folder``; then read back what was published.

    ``folder`` is the job's: removed afterwards, so a service's disk does not grow. With
    a Ray ``engine`` (:mod:`hub_export.pipeline.engines`) the model is loaded and built on the
    cluster's nodes, downloaded through their own Hub caches; this process only
    collects the files and pushes them.
    """
    on_cluster = engine is not None and engine.name != "local"
    result = push(
        request.source,
        repo_id,
        request.options,
        private=request.private,
        output_dir=folder / "export",
        cache_dir=None if on_cluster else folder / "downloads",
        token=token,
        endpoint=endpoint,
        progress=lambda event: emit(("stage", event)),
        engine=engine,
    )
    revision = result.commit_oid  # what this job published, even if the repo moved on since
    try:
        manifest = list_variants(result.repo_id, endpoint, token, revision=revision)
        card = read_card(result.repo_id, revision, token, endpoint, folder / "card")
    except HubExportError as error:  # the push is done: report, do not fail the job
        return Published(result, None, "", error)
    return Published(result, manifest, card)


def preview(
    request: PreviewRequest, token: str | None, endpoint: str, folder: Path, emit: Emit
) -> GenerationResult | EmbedResult | FillMaskResult | ClassifyResult | TranscriptionResult | str:
    """Pull the variant into ``folder`` and try it as its task does: emits ("stage", line) and ("text", piece).

    A text-generation file streams its answer to the prompt; a sentence-embedding file
    embeds the prompt's lines and shows how similar each pair is.
    """
    # token=False, not None: never fall back to a login stored on the server.
    files = pull(request.repo_id, request.variant, output_dir=folder, endpoint=endpoint, token=token or False)
    manifest = Manifest.read(files)
    chosen = manifest.variant(request.variant) if request.variant else manifest.variants[0]
    if request.draft is not None:  # the draft variant beside it, checked against the same manifest
        emit(("stage", f"downloading the draft {request.draft}"))
        drafts = pull(
            request.repo_id, request.draft, output_dir=folder / "draft", endpoint=endpoint, token=token or False
        )
        request = dataclasses.replace(request, draft=str(drafts / manifest.variant(request.draft).file))
    return _PREVIEWS[task_of(manifest).name](request, files, chosen.file, emit)


def _preview_embeddings(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> EmbedResult:
    """Embed each line of the prompt and show the cosine similarity of every pair."""
    texts = [line.strip() for line in request.prompt.splitlines() if line.strip()]
    if len(texts) < 2:
        raise InputError("this repo embeds sentences: type two or more, one per line, to compare them")
    emit(("stage", f"embedding {len(texts)} texts with {pte}"))
    result = embed(files / pte, files, texts)
    lines = [f"{index + 1}. {text}" for index, text in enumerate(texts)]
    lines += [f"cosine similarity {i + 1}-{j + 1}: {float(result.similarities[i, j]):.3f}"
              for i in range(len(texts)) for j in range(i + 1, len(texts))]  # fmt: skip
    emit(("text", "\n".join(lines)))
    return result


def _preview_fill_mask(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> FillMaskResult:
    """Show the words the file puts at each mask of the prompt."""
    emit(("stage", f"filling the masks with {pte}"))
    result = fill_mask(files / pte, files, request.prompt)
    lines = []
    for index, guesses in enumerate(result.masks):
        words = ", ".join(f"{guess.token} ({guess.probability:.2f})" for guess in guesses)
        lines.append(f"mask {index + 1}: {words}")
    emit(("text", "\n".join(lines)))
    return result


def _preview_classify(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> ClassifyResult:
    """Show the uploaded image's most likely labels."""
    if not request.image:
        raise InputError("this repo labels images: upload one")
    emit(("stage", f"labelling the image with {pte}"))
    result = classify(files / pte, files, request.image)
    emit(("text", "\n".join(f"{label.label}: {label.probability:.3f}" for label in result.labels)))
    return result


def _preview_transcribe(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> TranscriptionResult:
    """Show the uploaded recording's text window by window, as each is decoded."""
    if not request.audio:
        raise InputError("this repo transcribes speech: upload a recording")
    emit(("stage", f"transcribing with {pte}"))
    windows = []
    for window in stream_transcribe(files / pte, files, request.audio, max_seconds=request.max_audio_seconds):
        windows.append(window)
        emit(("text", (" " if len(windows) > 1 and window.text else "") + window.text))
        emit(("stage", f"transcribing with {pte}: {clock(window.end)} of {clock(window.audio_seconds)}"))
    stopped = [f"the first {request.max_audio_seconds:g} s are transcribed here"] if windows[-1].stopped_early else []
    for note in [*windows[-1].notes, *stopped]:
        emit(("text", f"\n({note})"))
    return TranscriptionResult.from_windows(windows)


def _preview_text2text(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> str:
    """Show the file's greedy answer to the prompt."""
    from hub_export.tasks.text_to_text.run import generate_text  # torch and ExecuTorch: loaded when a file is run

    emit(("stage", f"answering with {pte}"))
    answer = generate_text(files / pte, files, request.prompt, max_new_tokens=request.max_new_tokens)
    emit(("text", answer))
    return answer


def _preview_vision_language(request: PreviewRequest, files: Path, pte: str, emit: Emit) -> GenerationResult:
    """Stream the file's answer to the prompt about the uploaded image (a plain question without one)."""
    if not request.prompt.strip():
        request = dataclasses.replace(request, prompt="What is in this picture?")
    return _preview_text(request, files, pte, emit, images=[request.image] if request.image else None)


def _preview_text(
    request: PreviewRequest, files: Path, pte: str, emit: Emit, images: list[str] | None = None
) -> GenerationResult:
    """Stream the file's answer to the prompt."""
    emit(("stage", f"generating with {pte}" + (" from the image" if images else "")))
    chosen_file = files / pte
    pieces, last = [], None
    for last in stream_generate(chosen_file, files, request.prompt, max_new_tokens=request.max_new_tokens,
                                sampling=request.sampling, chat=request.chat, system=request.system, images=images,
                                lookup=request.lookup, draft=request.draft):  # fmt: skip
        if last.text:
            pieces.append(last.text)
            emit(("text", last.text))
    return last.result("".join(pieces))


# How each task's files are tried in the preview.
_PREVIEWS = {
    "text-generation": _preview_text,
    "feature-extraction": _preview_embeddings,
    "fill-mask": _preview_fill_mask,
    "image-classification": _preview_classify,
    "automatic-speech-recognition": _preview_transcribe,
    "text2text-generation": _preview_text2text,
    "image-text-to-text": _preview_vision_language,
}


def failure_line(
    error: BaseException,
    job_id: str,
    redact: Redactor,
    name: Namer = cli_name,
    hints: Mapping[str, str] | None = None,
    logs: str = "the service's logs",
) -> str:
    """The one line a user sees for ``error``, worded with ``name`` and ``hints``; never a traceback.

    Unexpected errors are logged (redacted) with their traceback for whoever runs the
    service; the user gets a generic line and the job id to quote.
    """
    if isinstance(error, HubExportError):
        return redact(error.worded(name, hints))
    if isinstance(error, MemoryError):
        return "the job ran out of memory; pick fewer variants, a shorter max sequence length or a smaller model"
    log.error("job %s failed:\n%s", job_id, redact("".join(traceback.format_exception(error))))
    return (
        f"the job failed unexpectedly ({type(error).__name__}); retry, and if it fails again report job "
        f"{job_id} (the details are in {logs})"
    )
