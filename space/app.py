"""hub-export Space: export a Hugging Face causal LM to ExecuTorch, verify it, push it, try it.

A Gradio 6 page and its sign-in over the ``hub_export`` library: checking the form,
running jobs in threads with slots and folders, exporting and pushing, reading the repo
back, streaming a preview and wording failures all live in :mod:`hub_export.service`.
This file wires the page to its handlers; beside it, in this folder: ``layout.py`` (the
page; the export form is generated from :class:`hub_export.ExportOptions`), ``jobs.py``
(the handlers, and whose token a job uses), ``settings.py`` (the environment) and
``wording.py`` (the library's errors in the page's words).

Run ``python space/app.py`` (see ``space/README.md`` for the environment variables), or
``make space`` for an offline demo against the local Hub.
"""

import inspect
import logging
from collections.abc import Iterator
from typing import Any

import gradio as gr
import PIL.Image

# The Space's own modules, in this folder (on sys.path for `python space/app.py` and on Spaces); the app
# re-exports what tests and scripts use.
from jobs import Jobs
from layout import (
    API_NOTE,
    INTRO,
    LAUNCH_OPTIONS,
    access_row,
    default_name,
    default_prompt,
    export_queued,
    export_tab,
    fill_preview,
    preview_queued,
    preview_tab,
)
from settings import AuthPolicy, Settings, auth_policy, settings_from_env  # noqa: F401 - the app's public names
from wording import FIELD_LABELS, SPACE_HINTS, failure_message, field_label  # noqa: F401 - the app's public names

from hub_export.options import form_fields
from hub_export.redact import Redactor  # noqa: F401 - the app's public names

log = logging.getLogger("hub_export.space")

# The export options the form offers, as ExportOptions declares them (a new option needs no edit here).
OPTION_NAMES = [spec.name for spec in form_fields()]
# What the /export endpoint takes, in the order of the form's inputs: the source, each export option, then
# where to push; the API's parameters get these names (clients pass them by name: the options may grow).
EXPORT_PARAMETERS = inspect.Signature(
    [
        *(
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for name in ("source", *OPTION_NAMES, "repo_name", "private", "token")
        ),
        # Gradio fills these two by their annotation and default, as in a handler's own signature.
        inspect.Parameter(
            "oauth_token", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.OAuthToken | None
        ),
        inspect.Parameter(
            "progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress(), annotation=gr.Progress
        ),
    ]
)


def _options(values: dict[str, Any]) -> dict[str, Any]:
    """The export options among an endpoint's arguments, by name (what ``service.options_from_form`` reads)."""
    return {name: values[name] for name in OPTION_NAMES}


def export_endpoint(jobs: Jobs):
    """``jobs.export`` with one parameter per form option, so Gradio (and its API) sees each control."""

    def export(*args: Any, **kwargs: Any) -> Iterator[tuple]:
        given = EXPORT_PARAMETERS.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        yield from jobs.export(
            values["source"],
            _options(values),
            values["repo_name"],
            values["private"],
            values["token"],
            values["oauth_token"],
            values["progress"],
        )

    export.__signature__ = EXPORT_PARAMETERS
    return export


def check_export_form(jobs: Jobs):
    """The click's first step, outside the queue: the library's own checks (through the same
    :class:`~hub_export.ExportOptions` as the job), so a value it refuses is refused at once and never queued.

    Takes the source and the options, as the /export endpoint does; returns the Export outputs cleared.
    """

    def check(*args: Any) -> tuple:
        values = EXPORT_PARAMETERS.bind_partial(*args).arguments
        try:
            jobs.export_request(values["source"], _options(values))
        except Exception as error:  # any failure is the form's one line, in its words
            raise gr.Error(failure_message(error, "form", jobs.redactor()), print_exception=False) from None
        return export_queued()

    return check


def build_app(settings: Settings | None = None) -> gr.Blocks:
    """The Space's Blocks, with its queue configured; launch with ``.launch(**LAUNCH_OPTIONS)``."""
    settings = settings or settings_from_env()
    # Gradio opens an uploaded image to read its header, and Pillow's own bomb check would fail
    # there with a traceback; hub_export.media.images checks every image's pixels from its
    # header before decoding instead, with the same one-line message as the CLI.
    PIL.Image.MAX_IMAGE_PIXELS = None
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
        _wire_export(jobs, ex, pv, token)
        _wire_preview(jobs, pv, token)
    app.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency)
    return app


def _wire_export(jobs: Jobs, ex: dict[str, Any], pv: dict[str, Any], token: gr.Textbox) -> None:
    """The Export tab's events: check the form, then the queued job, then the Preview tab filled with its repo."""
    ex["source"].change(default_name, ex["source"], ex["repo_name"], api_visibility="private", queue=False)
    form = [ex["source"], *(ex["options"][name] for name in OPTION_NAMES)]  # in EXPORT_PARAMETERS' order
    export_outputs = [ex["status"], ex["log"], ex["link"], ex["table"], ex["card"], ex["pushed"]]
    # Feedback at once, outside the queue: a value the library refuses is refused there; otherwise the old
    # results go and the job shows as queued until a slot frees (the job's own first update replaces that line).
    ex["run"].click(check_export_form(jobs), form, export_outputs[:5], api_visibility="private", queue=False).success(
        export_endpoint(jobs),
        [*form, ex["repo_name"], ex["private"], token],
        export_outputs,
        api_name="export",
        concurrency_id="exports",
        concurrency_limit=jobs.settings.concurrency,
        # Queue position, estimate and timer in the log's corner, so a queued user sees they wait;
        # not the full overlay, which would cover the status line and its own bar.
        show_progress="minimal",
        show_progress_on=[ex["log"]],
    ).success(fill_preview, ex["pushed"], pv["repo"], api_visibility="private", queue=False).then(
        jobs.variants, [pv["repo"], token], [pv["variant"], pv["lookup"]], api_visibility="private"
    )


def _wire_preview(jobs: Jobs, pv: dict[str, Any], token: gr.Textbox) -> None:
    """The Preview tab's events: the repo's variants, the prompt that follows the chat box, the queued preview."""
    pv["refresh"].click(jobs.variants, [pv["repo"], token], [pv["variant"], pv["lookup"]], api_visibility="private")
    pv["repo"].submit(jobs.variants, [pv["repo"], token], [pv["variant"], pv["lookup"]], api_visibility="private")
    pv["chat"].change(default_prompt, [pv["chat"], pv["prompt"]], pv["prompt"], api_visibility="private", queue=False)
    preview_inputs = [
        pv["repo"], pv["variant"], pv["prompt"], pv["max_new_tokens"], pv["chat"], pv["system"],
        pv["temperature"], pv["top_p"], pv["top_k"], pv["repetition_penalty"], pv["seed"], token, pv["image"],
        pv["audio"], pv["lookup"],
    ]  # fmt: skip
    pv["run"].click(preview_queued, None, [pv["text"], pv["stats"]], api_visibility="private", queue=False).then(
        jobs.preview,
        preview_inputs,
        [pv["text"], pv["stats"]],
        api_name="preview",
        # A lane of its own (and its own worker slots, see Jobs.lanes): a preview takes
        # seconds and must not sit in the queue behind another user's export.
        concurrency_id="previews",
        concurrency_limit=jobs.settings.preview_concurrency,
        # The queue position and timer show in the text box's corner, so a queued user
        # sees they are waiting; the status line below stays readable.
        show_progress="minimal",
        show_progress_on=[pv["text"]],
    )


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
